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
- when what was asked for cannot be known (an unknown name, a malformed one, a patch folder that
  does not exist, a patch broken before it said what it targets), any package may be its target:
  the Gate then also stops the first import of every top-level package outside the standard
  library that is not imported yet, except importpatch's own and pip's (and what their code
  imports), so that ``importpatch doctor`` and ``pip`` still run;
- a target module that does not exist in its installed package (``finder.PatchFinder`` looks at
  the first import of the package) stops that import, and every later one, the same way;
- at a late activation, where the caller is the program's own code or vLLM's: an explicit
  ``importpatch.enable()``, or vLLM's general-plugin hook (``python -S``, a Ray worker whose
  variables arrived after it started) raise ``StrictError`` right there.
"""

from __future__ import annotations

import sys

from importpatch.errors import PatchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from importlib.machinery import ModuleSpec
    from typing import Any


class StrictError(PatchError):
    """Strict mode stopped the program: ``problems`` are the warnings it would have printed."""

    def __init__(self, problems: list[str], where: str, module: str | None = None) -> None:
        from importpatch import config

        text = "; ".join(problems)
        msg = f"importpatch: {text} ({config.STRICT} is on: stopped at {where})"
        ImportError.__init__(self, msg, name=module)
        self.patch, self.module, self.what, self.file = "", module or "", text, None
        self.version, self.recorded, self.problems = "", True, problems


# Top-level packages the Gate never stops when the targets are unknown: the tools that say what is
# wrong and fix it (importpatch doctor, pip), and what site imports around start-up.
EXEMPT = frozenset({"importpatch", "pip", "sitecustomize", "usercustomize", "_virtualenv"})


class Gate:
    """First on ``sys.meta_path``: the import of a package in ``tops`` raises StrictError; with
    ``anything``, so does the first import of any package outside the standard library."""

    def __init__(self, tops: Iterable[str], problems: list[str], anything: bool = False) -> None:
        self.tops = frozenset(tops)
        self.problems = problems
        self.anything = anything

    def __repr__(self) -> str:
        return f"<importpatch.strict.Gate {sorted(self.tops)}{' +any' if self.anything else ''}>"

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top not in self.tops and not (self.anything and _unknown_target(top)):
            return None
        if not _is_import():
            return None
        raise StrictError(self.problems, f"the import of {fullname}", fullname)

    def invalidate_caches(self) -> None:
        pass


def _is_import() -> bool:
    """Whether the running ``find_spec`` call is part of an import (``import x``,
    ``importlib.import_module``, runpy's ``python -m``) rather than a probe
    (``importlib.util.find_spec`` called by a library to see what is installed)."""
    # here <- Gate.find_spec <- importlib._bootstrap._find_spec <- caller
    return is_import_at(sys._getframe(3))


def is_import_at(frame: Any) -> bool:
    """``_is_import`` given the frame that called ``importlib._bootstrap._find_spec``."""
    if frame.f_globals.get("__name__") != "importlib.util":
        return True  # importlib._bootstrap._find_and_load_unlocked: import, import_module
    prober = frame.f_back
    # runpy looks the module up with importlib.util.find_spec and then runs it: an import.
    return prober is not None and prober.f_globals.get("__name__") == "runpy"


def _unknown_target(top: str) -> bool:
    """Whether ``top`` may be the target of a patch nobody can name: outside the standard
    library, not imported yet, not exempt, and not imported by an exempt package's code."""
    if top in sys.modules or top in EXEMPT or top.startswith(("__editable__", "_sysconfigdata")):
        return False  # (sysconfig's data module is named after the platform)
    if top in getattr(sys, "stdlib_module_names", ()) or top in sys.builtin_module_names:
        return False
    frame: Any = sys._getframe(2)  # here <- Gate.find_spec <- ...
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("importlib"):
        frame = frame.f_back  # importlib._bootstrap, importlib.import_module / util
    importer = str(frame.f_globals.get("__name__", "")) if frame is not None else ""
    return importer.partition(".")[0] not in EXEMPT


def install(tops: Iterable[str], problems: list[str], anything: bool = False) -> Gate:
    """Put a Gate first on ``sys.meta_path`` (replacing an earlier one)."""
    uninstall()
    gate = Gate(tops, problems, anything)
    sys.meta_path.insert(0, gate)
    return gate


def block(tops: Iterable[str], problems: list[str]) -> Gate:
    """Add ``tops`` and ``problems`` to the installed Gate (or install one)."""
    gate = next((f for f in sys.meta_path if isinstance(f, Gate)), None)
    if gate is None:
        return install(tops, problems)
    gate.tops = gate.tops | frozenset(tops)
    gate.problems = [*gate.problems, *(p for p in problems if p not in gate.problems)]
    return gate


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Gate)]


def targeted_tops(entries: Iterable[Any]) -> set[str]:
    """The top-level packages of every module a known patch targets."""
    return {m.partition(".")[0] for e in entries for group in e.modules or () for m in group}
