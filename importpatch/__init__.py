"""importpatch: patch Python packages (vLLM first) as their modules are imported, in every process.

Importing this package is cheap: the public names below load their modules on first use.

(PYTEST_DONT_REWRITE: pytest marks the packages of its plugins' distributions for assertion
rewriting, and the ``.pth`` start-up may have imported this one before pytest started.)
"""

from __future__ import annotations

from importpatch._version import __version__ as __version__

__all__ = [
    "Patch", "PatchError", "DeclarationError", "enable", "disable", "applied", "bind",
]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from importpatch.discover.declare import DeclarationError, Patch
    from importpatch.errors import PatchError
    from importpatch.install.objects import bind

_LAZY = {
    "Patch": "discover.declare", "DeclarationError": "discover.declare", "PatchError": "errors",
    "applied": "events", "bind": "install.objects",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'importpatch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"importpatch.{module}"), name)
    globals()[name] = value
    return value


def enable(*names: str, environ: dict[str, str] | None = None) -> int:
    """Turn patching on now, in this process: patches named here (or by the environment, when
    none are named) plus patches made with ``Patch(...)`` in this process. Targets imported later
    are patched as they load; targets already imported are patched in place, and the copies
    other modules' source proves (``from x import y``, ...) are re-bound (see ``late``). Returns
    the number of enabled patches."""
    from importpatch import _boot

    return _boot.enable(*names, environ=environ)


def disable() -> None:
    """Stop patching modules imported from now on (already patched modules stay patched)."""
    from importpatch.load.finder import uninstall

    uninstall()
