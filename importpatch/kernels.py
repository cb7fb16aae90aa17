"""Triton kernels in a patched module must be compiled from the patched text (see publish.py)."""

from __future__ import annotations

from types import ModuleType

from .errors import PatchError


def check_kernels(module: ModuleType, patched_text: str, patches: list[str]) -> None:
    """Fail closed when a ``@triton.jit`` kernel of ``module`` does not carry patched source:
    Triton compiles (and its interpreter runs) ``.src``, not the Python code object."""
    for name, value in list(vars(module).items()):
        src = getattr(value, "src", None)
        fn = getattr(value, "fn", None)
        if not isinstance(src, str) or fn is None or not type(value).__module__.startswith("triton"):
            continue
        if getattr(fn, "__module__", None) != module.__name__:
            continue  # a kernel imported from elsewhere
        body = src.strip()
        if body and body not in patched_text:
            raise PatchError(
                ",".join(patches), module.__name__,
                f"Triton kernel {name!r} carries source that is not the patched text "
                "(Triton would compile the unpatched kernel)",
                file=getattr(module, "__file__", None),
            )
