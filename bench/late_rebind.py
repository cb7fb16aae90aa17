"""Cost of late activation's copy finder in a real vLLM process (~1,000 modules loaded).

Run in an environment with vLLM (``tox -e vllm`` has one):
    python bench/late_rebind.py
For a function (a target vLLM copies by name) and for a plain ``False`` constant (an identical
object held by many modules), it prints how many modules were loaded, how many held the object
(candidates), how many were parsed (their source mentions a copied name), how many copies were
re-bound, and the wall time, median of 5 runs with the source caches cold and warm.
"""

from __future__ import annotations

import statistics
import sys
import time


def main() -> None:
    import vllm.v1.engine.core  # noqa: F401  (the EngineCore's imports: a realistic process)
    import vllm.v1.sample.sampler  # noqa: F401
    from vllm.v1.core import kv_cache_utils

    from importpatch.install import late

    cases = [
        ("function", "vllm.v1.core.kv_cache_utils", "resolve_kv_cache_block_sizes",
         kv_cache_utils.resolve_kv_cache_block_sizes),
        ("False constant", "vllm.v1.core.kv_cache_utils", "_FAKE_FLAG", False),
    ]
    kv_cache_utils._FAKE_FLAG = False  # type: ignore[attr-defined]
    print(f"python {sys.version.split()[0]}, {len(sys.modules)} modules loaded")
    for label, module, name, original in cases:
        for warm in (False, True):
            times = []
            for _ in range(5):
                if not warm:
                    late._texts.clear()
                    late._trees.clear()
                    late._raw_texts.clear()
                marker = object()
                start = time.perf_counter()
                sites = late.rebind_copies(module, name, original, marker)
                times.append(time.perf_counter() - start)
                for where, _ in sites:  # put the originals back for the next run
                    mod, _, qual = where.partition(":")
                    owner = sys.modules[mod]
                    *path, attr = qual.split(".")
                    for part in path:
                        owner = getattr(owner, part)
                    setattr(owner, attr, original)
            s = late.last_stats
            ms = statistics.median(times) * 1e3
            print(f"{label:15} {'warm' if warm else 'cold'}: {ms:7.1f} ms"
                  f"  candidates {s['candidates']:4}  parsed {s['parsed']:3}  "
                  f"re-bound {len(sites)}")


if __name__ == "__main__":
    main()
