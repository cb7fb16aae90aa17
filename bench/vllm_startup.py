"""vLLM ``LLM()`` start to first token, three patches enabled / none, measured side by side.

Each sample is a fresh ``python demo/generate.py --max-tokens 1`` process (real vLLM, default
multiprocess mode: main, EngineCore and Worker interpreters, all with the hook) timed from
``Popen`` to the ``RESULT`` line, so interpreter start, the ``.pth`` line, the catalog index, the
patched imports (bytecode cache warm after the first round) and vLLM's own start are all in it.
Runs alternate: none, patched, patched, none, ... ; the first pair is a warm-up and is dropped.

    python bench/vllm_startup.py [--python /path/to/vllm-env/python] [--reps 3]

Goal (issue 4): patched / none <= 1.02.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THREE = "vllm-ban-token-ids,vllm-priority-scheduler,vllm-sched-step-trace"


def sample(python: str, model: str, work: Path, enable: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTPATCH_")}
    env.update({
        "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"), "TMPDIR": str(work / "tmp"),
        "IMPORTPATCH_CACHE_DIR": str(work / "importpatch-cache"),
    })
    if enable:
        env["IMPORTPATCH_ENABLE"] = enable
    start = time.perf_counter()
    proc = subprocess.Popen(
        [python, str(ROOT / "demo" / "generate.py"), "--model", model, "--max-tokens", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    elapsed = None
    for line in proc.stdout:
        if line.startswith("RESULT: "):
            elapsed = time.perf_counter() - start
    if proc.wait() != 0 or elapsed is None:
        sys.exit(f"generate.py failed (enable={enable})")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=os.environ.get("VLLM_PYTHON", sys.executable))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="importpatch-vllm-bench-"))
    (work / "tmp").mkdir()
    build = subprocess.run(
        [args.python, str(ROOT / "demo" / "tiny_model.py"), str(work / "model")],
        capture_output=True, text=True, check=True,
    )
    model = build.stdout.strip().splitlines()[-1]
    times: dict[str, list[float]] = {"none": [], "three": []}
    order = ["none", "three", "three", "none"]
    for rnd in range(args.reps + 1):
        for label in order if rnd % 2 == 0 else order[::-1]:
            t = sample(args.python, model, work, THREE if label == "three" else None)
            print(f"round {rnd} {label}: {t:.2f} s", file=sys.stderr, flush=True)
            if rnd:  # round 0 warms the caches (vLLM's and ours)
                times[label].append(t)
    none, three = statistics.median(times["none"]), statistics.median(times["three"])
    print("| figure | none | 3 patches | ratio | goal |")
    print("|---|---|---|---|---|")
    print(f"| vLLM `LLM()` start to first token ({len(times['none'])} samples each) "
          f"| {none:.2f} s | {three:.2f} s | {three / none:.3f} | <= 1.02 |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
