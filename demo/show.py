"""The demo: the same prompts through real vLLM with patches off and on, side by side.

Run by ``demo/run.sh`` with the demo venv's Python. The application (``demo/generate.py``) is
the same both times; only environment variables differ. Prints:
1. the generated text per prompt, off | on;
2. the order in which the scheduler took the waiting requests (priorities 3, 1, 2);
3. ``importpatch status``: which process (EngineCore, Worker) applied which patch, with pids.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATCHES = "vllm-ban-token-ids,vllm-priority-scheduler,vllm-sched-step-trace,vllm-sampler-nan-guard"
BANNED = "147"


def run(workdir: Path, label: str, enable: str | None) -> tuple[dict, Path]:
    out = workdir / label
    shutil.rmtree(out, ignore_errors=True)
    (out / "tmp").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTPATCH_")}
    env.update({
        "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"), "TMPDIR": str(out / "tmp"),
        "IMPORTPATCH_EVENTS_DIR": str(out / "events"),
        "IMPORTPATCH_SCHED_TRACE_FILE": str(out / "trace.jsonl"),
        "IMPORTPATCH_BANNED_TOKEN_IDS": BANNED,
    })
    if enable:
        env["IMPORTPATCH_ENABLE"] = enable
    else:
        env["IMPORTPATCH_ENABLE"] = "vllm-sched-step-trace"  # observe vanilla scheduling only
    print(f"== vLLM with patches {'ON: ' + enable if enable else 'OFF'} ...", flush=True)
    proc = subprocess.run(
        [sys.executable, str(HERE / "generate.py"), "--model", str(workdir / "model"),
         "--blocker", "--priorities", "3,1,2", "--max-num-seqs", "1"],
        env=env, capture_output=True, text=True,
    )
    (out / "vllm.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"vLLM failed; see {out / 'vllm.log'}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT: "))
    return json.loads(line[8:]), out


def scheduled_order(trace: Path) -> list[str]:
    order: list[str] = []
    for line in trace.read_text().splitlines():
        for req in json.loads(line)["req_ids"]:
            key = req.split("-")[0]
            if key not in order:
                order.append(key)
    return order


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, required=True)
    args = ap.parse_args()
    workdir = args.workdir.resolve()
    sys.path.insert(0, str(HERE))
    from generate import PROMPTS
    from tiny_model import build_tiny_llama

    build_tiny_llama(workdir / "model")
    off, off_dir = run(workdir, "off", None)
    on, on_dir = run(workdir, "on", PATCHES)

    width = 32
    print("\n" + f"{'prompt':<{width}} | {'patches OFF':<{width}} | {'patches ON':<{width}}")
    print("-" * (3 * width + 6))
    for prompt, a, b in zip(PROMPTS, off["texts"], on["texts"], strict=True):
        rows = [textwrap.wrap(x, width) or [""] for x in (prompt, a.strip(), b.strip())]
        for i in range(max(map(len, rows))):
            cells = [r[i] if i < len(r) else "" for r in rows]
            print(" | ".join(f"{c:<{width}}" for c in cells))
        print("-" * (3 * width + 6))
    print(f"token ids OFF: {off['tokens']}")
    print(f"token ids ON:  {on['tokens']}   (token {BANNED} banned in the Worker)")
    print("\nscheduling order (priorities 0:3, 1:1, 2:2; lower runs first):")
    print(f"  OFF: {' -> '.join(scheduled_order(off_dir / 'trace.jsonl'))}")
    print(f"  ON:  {' -> '.join(scheduled_order(on_dir / 'trace.jsonl'))}")
    print(f"\nwhere the patches applied (driver pid {on['pid']}):", flush=True)
    subprocess.run(
        [sys.executable, "-m", "importpatch", "status", "--events-dir", str(on_dir / "events")],
        check=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
