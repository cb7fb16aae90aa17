#!/usr/bin/env bash
# Run the GPU tests (tests marked `gpu`: vLLM's real Triton attention kernel compiled for the GPU,
# with and without the example kernel diff) on a machine that has CUDA, torch and Triton but no
# vLLM and no network. Two steps:
#
#   bash scripts/eval/gpu_check.sh prepare   # here (PyPI reachable): fills .gpu-carry/ (git-ignored)
#   bash scripts/eval/gpu_check.sh run       # there, from the checkout root, with .gpu-carry/ carried
#
# `prepare` downloads vLLM's CUDA wheel (vllm==$GPU_VLLM_VERSION, --no-deps, cached in
# $GPU_CACHE), packs its Python sources with scripts/eval/gpu_vllm_shell.py (every .py file of the
# package, its metadata, a stand-in for the one compiled extension reached at module level), and
# puts into .gpu-carry/wheels the project wheel and the wheels of what the tests need for
# CPython $GPU_PY_VERSION on x86_64 Linux: numpy, regex (vLLM), packaging, wrapt (importpatch),
# pytest. About 25 MB in all. No compiled part of vLLM is carried: it is built for the torch vLLM
# pins, and the Triton kernels under test need none of it.
#
# `run` makes a venv that sees the machine's torch and Triton (a .pth naming their site-packages),
# pip-installs the carried wheels offline (the project wheel puts importpatch's .pth hook into the
# venv, so spawned children are patched), unpacks vLLM's sources next to it, checks that the
# kernel module imports with real Triton on CUDA, runs `importpatch check` of the example diff,
# then pytest on tests/test_gpu_triton_attention.py (-m gpu). Everything is logged to
# $OUT/gpu_check.log (OUT defaults to ./gpu-check-out); pytest's junit XML and the probes'
# measurements (JSON) land there too. The base Python is $PYTHON or the first of python3,
# python, ... that imports torch and triton; its version must be $GPU_PY_VERSION (the wheels').
# Exit status: pytest's (or the first failing step's).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CARRY="$ROOT/.gpu-carry"
GPU_VLLM_VERSION="${GPU_VLLM_VERSION:-0.32.0}"
GPU_PY_VERSION="${GPU_PY_VERSION:-3.12}"
GPU_CACHE="${GPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/importpatch-gpu-check}"

prepare() {
    set -e
    local py="${PYTHON:-python3}" abi="cp${GPU_PY_VERSION/./}"
    mkdir -p "$GPU_CACHE"
    rm -rf "$CARRY" && mkdir -p "$CARRY/wheels"
    local wheel
    wheel="$(ls "$GPU_CACHE"/vllm-"$GPU_VLLM_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$wheel" ]; then
        echo "downloading vllm==$GPU_VLLM_VERSION (CUDA wheel, ~330 MB, kept in $GPU_CACHE)"
        "$py" -m pip download -q --no-deps "vllm==$GPU_VLLM_VERSION" -d "$GPU_CACHE"
        wheel="$(ls "$GPU_CACHE"/vllm-"$GPU_VLLM_VERSION"-*.whl | head -n1)"
    fi
    "$py" "$ROOT/scripts/eval/gpu_vllm_shell.py" "$wheel" "$CARRY/vllm-shell.tar.gz" \
        > "$CARRY/vllm-shell.json"
    cat "$CARRY/vllm-shell.json"
    "$py" -m pip download -q --only-binary=:all: --python-version "$GPU_PY_VERSION" \
        --implementation cp --abi "$abi" --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any \
        -d "$CARRY/wheels" numpy regex "packaging>=23" "wrapt>=1.16" pytest
    "$py" -m pip wheel -q --no-deps -w "$CARRY/wheels" "$ROOT"
    echo "$GPU_VLLM_VERSION" > "$CARRY/vllm-version"
    du -sh "$CARRY"
    ls "$CARRY/wheels"
}

# The first Python that imports torch and Triton: $PYTHON, else the usual names.
base_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3 python /usr/bin/python3 /usr/local/bin/python3 \
            /opt/conda/bin/python; do
        [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import torch, triton' >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

run() {
    local out="${OUT:-$ROOT/gpu-check-out}" py started=$SECONDS
    mkdir -p "$out"
    exec > >(tee "$out/gpu_check.log") 2>&1
    py="$(base_python)" || { echo "no Python here imports both torch and triton"; return 2; }
    local work
    work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
    echo "== gpu_check run: $(date -u +%FT%TZ), checkout $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo no git)), work $work"
    if [ ! -f "$CARRY/vllm-shell.tar.gz" ]; then
        echo "no $CARRY/vllm-shell.tar.gz: run 'bash scripts/eval/gpu_check.sh prepare' first"
        return 2
    fi
    nvidia-smi -L 2>&1 | head -n 4
    "$py" - <<'PY' || { echo "the base Python lacks torch or Triton"; return 2; }
import sys, torch, triton
print(f"base: Python {sys.version.split()[0]} ({sys.executable}), torch {torch.__version__} "
      f"(CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}), triton {triton.__version__}")
PY
    # A venv that sees the base interpreter's packages through a .pth (works whether the base is
    # a system Python or itself a venv, where --system-site-packages would skip it).
    local venv="$work/venv"
    "$py" -m venv "$venv" 2>/dev/null || "$py" -m venv --without-pip "$venv" || return 2
    local site
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$py" - > "$site/00-gpu-check-base.pth" <<'PY'
import os, site, sys, torch, triton
dirs = [os.path.dirname(os.path.dirname(m.__file__)) for m in (torch, triton)]
dirs += site.getsitepackages() + [site.getusersitepackages()]
print("\n".join(dict.fromkeys(d for d in dirs if os.path.isdir(d))))
PY
    # Offline install: the venv's pip, else the base pip aimed at the venv, else into its folder.
    local wanted=(importpatch-hook numpy regex pytest) links=(--no-index --find-links "$CARRY/wheels")
    "$venv/bin/python" -m pip install -q "${links[@]}" "${wanted[@]}" 2>/dev/null \
        || "$py" -m pip --python "$venv/bin/python" install -q "${links[@]}" "${wanted[@]}" \
        || "$py" -m pip install -q "${links[@]}" --target "$site" "${wanted[@]}" \
        || { echo "offline install failed"; return 2; }
    # vLLM's Python sources, importable from the venv (a .pth, so spawned children see them too).
    mkdir -p "$work/vllm-shell"
    tar -xzf "$CARRY/vllm-shell.tar.gz" -C "$work/vllm-shell"
    echo "$work/vllm-shell" > "$site/10-gpu-check-vllm.pth"
    cp "$CARRY/vllm-shell.json" "$out/" 2>/dev/null
    export IMPORTPATCH_CACHE_DIR="$work/importpatch-cache" VLLM_CACHE_ROOT="$work/vllm-cache" \
        TRITON_CACHE_DIR="$work/triton-cache" HF_HUB_OFFLINE=1
    unset TRITON_INTERPRET
    echo "== import check"
    "$venv/bin/python" - <<'PY'
import importlib.metadata, time
t0 = time.perf_counter()
import torch, vllm
from vllm.platforms import current_platform
from vllm.triton_utils import HAS_TRITON
import vllm.v1.attention.ops.triton_unified_attention as tua
print(f"vllm {vllm.__version__} (metadata {importlib.metadata.version('vllm')}) from {vllm.__file__}")
print(f"platform {type(current_platform).__name__}, HAS_TRITON {HAS_TRITON}, "
      f"kernel {type(tua.kernel_unified_attention).__name__}, {time.perf_counter() - t0:.1f} s")
PY
    echo "== importpatch check example-vllm-triton-attention-temperature"
    "$venv/bin/python" -m importpatch check example-vllm-triton-attention-temperature
    echo "== pytest"
    cd "$ROOT" || return 2
    GPU_CHECK_OUT="$out" "$venv/bin/python" -m pytest tests/test_gpu_triton_attention.py -m gpu \
        -v -s -ra -p no:cacheprovider --junitxml="$out/junit.xml"
    local status=$?
    echo "== pytest exit status $status after $((SECONDS - started)) s"
    return $status
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: bash scripts/eval/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac
