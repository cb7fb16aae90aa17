import importpatch
from importpatch import Patch

patch = Patch("my-kv-specs", doc="print the KV cache specs the engine sizes its cache for")

@patch.wrap("vllm.v1.core.kv_cache_utils:get_kv_cache_configs")
def log_specs(wrapped, instance, args, kwargs):
    bound = importpatch.bind(wrapped, args, kwargs)
    print("KV cache specs", bound.arguments["kv_cache_specs"], flush=True)  # however passed
    return wrapped(*bound.args, **bound.kwargs)
