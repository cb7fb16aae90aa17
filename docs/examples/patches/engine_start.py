import os

from importpatch import Patch

patch = Patch("my-engine-start", doc="say when the EngineCore process starts its loop")

@patch.replace("vllm.v1.engine.core:EngineCoreProc.run_engine_core", original=True)
def run_engine_core(original, *args, **kwargs):        # a staticmethod: no self
    print("EngineCore starts in process", os.getpid(), flush=True)
    return original(*args, **kwargs)
