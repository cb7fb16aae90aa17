"""acme-scheduler-log: an example of your own patch, shipped in the image (IMPORTPATCH_PATH).

What:   logs the length of the scheduler's waiting queue each time a request is added (logger
        ``acme``), in the EngineCore process, where vLLM's scheduler lives.
How:    a wrap of ``Scheduler.add_request``, landed when the EngineCore imports the scheduler.
Checked against: vLLM 0.32.0.
"""

import logging

from importpatch import Patch

patch = Patch(
    "acme-scheduler-log",
    requires="vllm>=0.10,<0.40",
    doc="log the waiting queue length whenever the scheduler adds a request",
)


@patch.wrap("vllm.v1.core.sched.scheduler:Scheduler.add_request")
def log_waiting(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    logging.getLogger("acme").info("waiting requests: %d", len(instance.waiting))
    return result
