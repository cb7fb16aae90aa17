from vllm.logger import init_logger

from importpatch import Patch

logger = init_logger(__name__)          # vllm.importpatch.fp32_head
patch = Patch("fp32-head", doc="says in each process that imports the sampler that it is on")


@patch.after_import("vllm.v1.sample.sampler")
def announce(mod):
    logger.warning("fp32 lm_head ENABLED")
