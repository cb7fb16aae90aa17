"""Strict mode (``IMPORTPATCH_STRICT=1``): a problem with the chosen patches stops the program.

Without it, an unknown name in ``IMPORTPATCH_ENABLE``, a malformed one, a patch folder that does
not exist, or a broken patch that is enabled (or may be on by default) is a warning, and the
program runs without that patch. With it, the same problems stop the program with the same
message, at the first point where that is safe:

- never at interpreter start: the ``.pth`` runs in every Python process of the environment (pip,
  the ``importpatch`` command that shows what is wrong), and must never raise;
- at the first import of a top-level package that a known patch targets (``import vllm``), before
  any of its code runs: ``Gate``, first on ``sys.meta_path``, raises ``StrictError`` (a
  ``PatchError``, so an ``ImportError``) from every such import, so nothing of the package loads
  in that process, patched or not. A process that never imports such a package is not stopped. A
  look-up that is not an import (``importlib.util.find_spec("vllm")``, how libraries probe what is
  installed) is answered as usual;
- at a late activation, where the caller is the program's own code or vLLM's: an explicit
  ``importpatch.enable()``, or vLLM's general-plugin hook (``python -S``, a Ray worker whose
  variables arrived after it started) raise ``StrictError`` right there.
"""

from __future__ import annotations

import sys

from .errors import PatchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from importlib.machinery import ModuleSpec
    from typing import Any


class StrictError(PatchError):
    """Strict mode stopped the program: ``problems`` are the warnings it would have printed."""

    def __init__(self, problems: list[str], where: str, module: str | None = None) -> None:
        from . import config

        text = "; ".join(problems)
        msg = f"importpatch: {text} ({config.STRICT} is on: stopped at {where})"
        ImportError.__init__(self, msg, name=module)
        self.patch, self.module, self.what, self.file = "", module or "", text, None
        self.version, self.recorded, self.problems = "", True, problems


class Gate:
    """First on ``sys.meta_path``: the import of a package in ``tops`` raises StrictError."""

    def __init__(self, tops: Iterable[str], problems: list[str]) -> None:
        self.tops = frozenset(tops)
        self.problems = problems

    def __repr__(self) -> str:
        return f"<importpatch.strict.Gate {sorted(self.tops)}>"

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top not in self.tops or not _is_import():
            return None
        raise StrictError(self.problems, f"the import of {fullname}", fullname)

    def invalidate_caches(self) -> None:
        pass


def _is_import() -> bool:
    """Whether the running ``find_spec`` call is part of an import (``import x``,
    ``importlib.import_module``, runpy's ``python -m``) rather than a probe
    (``importlib.util.find_spec`` called by a library to see what is installed)."""
    frame = sys._getframe(3)  # here <- Gate.find_spec <- importlib._bootstrap._find_spec <- caller
    if frame.f_globals.get("__name__") != "importlib.util":
        return True  # importlib._bootstrap._find_and_load_unlocked: import, import_module
    prober = frame.f_back
    # runpy looks the module up with importlib.util.find_spec and then runs it: an import.
    return prober is not None and prober.f_globals.get("__name__") == "runpy"


def install(tops: Iterable[str], problems: list[str]) -> Gate:
    """Put a Gate first on ``sys.meta_path`` (replacing an earlier one)."""
    uninstall()
    gate = Gate(tops, problems)
    sys.meta_path.insert(0, gate)
    return gate


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Gate)]


def targeted_tops(entries: Iterable[Any]) -> set[str]:
    """The top-level packages of every module a known patch targets."""
    return {m.partition(".")[0] for e in entries for group in e.modules or () for m in group}
