"""Per-step cost of each shipped serving patch, measured in-process: what it adds to a step.

The end-to-end figure is ``bench/serving_load.py`` (the real server under load); on a shared
2-core machine its noise is a few percent, larger than what the patches cost. This script measures
the patches' own code per engine step, with the objects they touch each step:

- ``vllm-ban-token-ids``: the wrapper around ``Sampler.apply_logits_processors`` on a float32
  logits tensor of 16 rows (the vocabulary of the tiny model, 1,000, and Llama 3's, 128,256);
- ``vllm-sampler-nan-guard``: the lines the diff adds to ``Sampler.forward`` (taken from the
  ``.diff`` file), on the same tensors;
- ``vllm-sched-step-trace``: the wrapper around ``Scheduler.schedule`` writing its JSON line for a
  step of 16 requests (request ids as vLLM's OpenAI server makes them) to a file in ``--work``;
- ``vllm-priority-scheduler``: the wrapper with vLLM's ``FCFSRequestQueue`` holding 0 and 16
  waiting requests in arrival order.

Each wrapper is called through ``wrapt.FunctionWrapper``, as importpatch installs it, around a
function that returns the step's result; the figure is (time with the patch - time without) per
call, medians of interleaved rounds: CPU time of the calling thread (what the step waits for),
CPU time of the whole process (a patch's own threads included: the step trace writes from one,
and each timed batch ends with its ``flush()``), and wall time of the calling thread. The scheduler
and its output are stand-ins (``SimpleNamespace`` with the attributes the patches read); tensors,
the request queue, the file and wrapt are the real ones. ``--baseline REV`` also measures the
patches as they were at a git revision of this checkout, side by side.

    python bench/serving_patch_costs.py [--baseline main] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import types
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = {
    "vllm-ban-token-ids": "vllm_ban_token_ids.py",
    "vllm-sampler-nan-guard": "vllm-sampler-nan-guard.diff",
    "vllm-sched-step-trace": "vllm_sched_step_trace.py",
    "vllm-priority-scheduler": "vllm_priority_scheduler.py",
}
BATCH = 16


def patch_sources(rev: str | None) -> dict[str, str]:
    """The patch files' text, from the checkout or from a git revision of it."""
    out = {}
    for name, file in FILES.items():
        if rev is None:
            out[name] = (ROOT / "patches" / file).read_text(encoding="utf-8")
        else:
            out[name] = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{rev}:patches/{file}"],
                capture_output=True, text=True, check=True,
            ).stdout
    return out


def load_module(name: str, source: str) -> types.ModuleType:
    """Execute a patch file as a plain module (its decorators only declare; nothing lands)."""
    module = types.ModuleType(name.replace("-", "_"))
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def nan_guard_from_diff(diff: str) -> Callable[..., object]:
    """The statements the diff adds to Sampler.forward, as ``guard(logits, torch) -> logits``."""
    added = [line[1:] for line in diff.splitlines()
             if line.startswith("+") and not line.startswith("+++")]
    body = textwrap.indent(textwrap.dedent("\n".join(added)), "    ")
    namespace: dict[str, object] = {}
    exec(f"def guard(logits, torch):\n{body}\n    return logits\n", namespace)
    return namespace["guard"]  # type: ignore[return-value]


Case = tuple[Callable[[], object], Callable[[], object], Callable[[], object] | None]


def step_cases(sources: dict[str, str], work: Path) -> dict[str, Case]:
    """case name -> (step without the patch, step with it, what completes the patch's work)."""
    import torch
    import wrapt
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue, SchedulingPolicy

    os.environ["IMPORTPATCH_BANNED_TOKEN_IDS"] = "147,2,99999"  # one outside the vocabulary
    trace_file = work / f"trace-{uuid.uuid4().hex}.jsonl"
    os.environ["IMPORTPATCH_SCHED_TRACE_FILE"] = str(trace_file)
    cases = {}
    ban = load_module("vllm-ban-token-ids", sources["vllm-ban-token-ids"])
    guard = nan_guard_from_diff(sources["vllm-sampler-nan-guard"])
    for vocab in (1000, 128256):
        logits = torch.randn(BATCH, vocab)

        def processors(logits: torch.Tensor = logits) -> torch.Tensor:
            return logits

        cases[f"ban-token-ids, vocab {vocab}"] = (
            processors, wrapt.FunctionWrapper(processors, ban.ban_tokens), None)
        cases[f"nan-guard, vocab {vocab}"] = (
            processors, lambda logits=logits: guard(processors(logits), torch), None)

    req_ids = [f"cmpl-{uuid.uuid4().hex}-0" for _ in range(BATCH)]
    output = types.SimpleNamespace(
        total_num_scheduled_tokens=BATCH, num_scheduled_tokens=dict.fromkeys(req_ids, 1))
    trace = load_module("vllm-sched-step-trace", sources["vllm-sched-step-trace"])
    scheduler = types.SimpleNamespace(current_step=0, running=list(range(BATCH)),
                                      waiting=FCFSRequestQueue())

    def schedule(self: object = None) -> object:
        return output

    # The patch may write from a thread of its own: its flush() ends each timed batch.
    cases["sched-step-trace, 16 requests"] = (
        schedule, wrapt.FunctionWrapper(schedule, trace.trace_step).__get__(scheduler),
        getattr(trace, "flush", None))

    priority = load_module("vllm-priority-scheduler", sources["vllm-priority-scheduler"])
    for waiting in (0, BATCH):
        queue = FCFSRequestQueue()
        for i in range(waiting):
            queue.add_request(types.SimpleNamespace(priority=0, arrival_time=1000.0 + i))
        fake = type("Scheduler", (), {
            "order_waiting_by_priority": priority.order_waiting_by_priority,
            "schedule": wrapt.FunctionWrapper(lambda self: output,
                                              priority.schedule_with_priority),
        })()
        fake.policy = SchedulingPolicy.FCFS
        fake.waiting, fake.kv_holding_waiting = queue, FCFSRequestQueue()
        cases[f"priority-scheduler, {waiting} waiting"] = (schedule, fake.schedule, None)
    return cases


def per_call(fn: Callable[[], object], calls: int,
             complete: Callable[[], object] | None = None) -> tuple[float, float, float]:
    """Per call: (CPU seconds of the calling thread, of the whole process, wall seconds of the
    calling thread); ``complete`` ends the batch (its time counts for the process only)."""
    t0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    t1, w1 = time.thread_time(), time.perf_counter()
    if complete is not None:
        complete()
    return (t1 - t0) / calls, (time.process_time() - p0) / calls, (w1 - w0) / calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="also measure the patches of this git revision")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--work", help="folder for the trace file (default: a temp dir)")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="importpatch-costs-"))
    work.mkdir(parents=True, exist_ok=True)
    versions = {"now": patch_sources(None)}
    if args.baseline:
        versions[args.baseline] = patch_sources(args.baseline)
    cases = {label: step_cases(src, work) for label, src in versions.items()}
    names = list(cases["now"])
    samples: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {}
    for rnd in range(args.rounds + 1):  # round 0 warms up (caches, first-call allocations)
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            for label in versions:
                bare, patched, complete = cases[label][name]
                for side, fn, done in (("bare", bare, None), ("patched", patched, complete)):
                    value = per_call(fn, args.calls, done)
                    if rnd:
                        samples.setdefault((label, name, side), []).append(value)
    header = "| per engine step | " + " | ".join(
        f"{label}: thread CPU / process CPU / wall" for label in versions) + " |"
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds of {args.calls} calls; "
          f"added time per call (patched - bare), medians.\n")
    print(header)
    print("|---|" + "---|" * len(versions))
    for name in names:
        cells = []
        for label in versions:
            def med(side: str, i: int, label: str = label, name: str = name) -> float:
                return statistics.median(v[i] for v in samples[(label, name, side)])
            thread, process, wall = ((med("patched", i) - med("bare", i)) * 1e6
                                     for i in range(3))
            cells.append(f"{thread:.1f} / {process:.1f} / {wall:.1f} µs")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for trace_file in work.glob("trace-*.jsonl"):
        trace_file.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
