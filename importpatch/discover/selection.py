"""Patch selection: which of the enabled patches apply to a module being patched, in this process.

- ``declared(entry)``: an index entry's declaration, loaded, with its version requirement judged
  (the one implementation the loader, late activation and ``importpatch check`` share);
- ``load_patches(entries, module)``: the patches whose requirement holds, once each (a skip is a
  ``skipped`` event), and the declarations that failed to load;
- ``applicable_ops(patches, module)``: their operations that target ``module``: the first of an
  operation's candidate module paths that exists wins (``module_exists``: found, not imported);
- ``handled`` / ``mark_handled``: the patches already applied, skipped or failed per module
  object, so a later ``enable()`` never applies one again in place.

Which patches are on at all (the toggles: ``IMPORTPATCH_ENABLE``, defaults) is ``config``'s
``Toggles.decide_entry``; ``_boot`` installs the finder for them.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import ModuleType
    from typing import Any

    from importpatch.discover.catalog import Entry
    from importpatch.discover.declare import Op, Patch


def module_exists(name: str) -> bool:
    """Whether module ``name`` exists, without importing it: imported, or a file or package
    folder under an already-imported ancestor package."""
    if name in sys.modules:
        return True
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        parent = sys.modules.get(".".join(parts[:i]))
        if parent is None:
            continue
        return file_under(getattr(parent, "__path__", ()) or (), parts[i:]) is not None
    from importlib.machinery import PathFinder

    return PathFinder.find_spec(name) is not None if len(parts) == 1 else False


def file_under(bases: Iterable[str], rest: list[str]) -> str | None:
    """The file of the module ``rest`` (its dotted name's parts) below the first of the package
    folders ``bases`` that has it: ``rest.py`` or ``rest/__init__.py``."""
    for base in bases:
        stem = os.path.join(base, *rest)
        for file in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(file):
                return file
    return None


def applicable_ops(patches: list[Any], fullname: str) -> list[Op]:
    """Operations of ``patches`` that target ``fullname``: it is one of the op's candidate
    module paths, and no earlier candidate exists (the first that exists wins)."""
    ops = []
    for patch in patches:
        for op in patch.ops:
            if fullname in op.modules:
                idx = op.modules.index(fullname)
                if not any(module_exists(m) for m in op.modules[:idx]):
                    ops.append(op)
    return ops


class Declared:
    """A patch entry's declaration, loaded, with its version requirement judged."""

    __slots__ = ("entry", "patch", "error", "ok", "why")

    def __init__(self, entry: Entry, patch: Patch | None, error: str, ok: bool, why: str) -> None:
        self.entry, self.patch, self.error, self.ok, self.why = entry, patch, error, ok, why


def declared(entry: Entry, version_of: Callable[[str], str | None] | None = None,
             where: str | None = None) -> Declared:
    """Load ``entry``'s declaration (executing its file the first time) and judge its version
    requirement, with ``version_of`` (default: what is installed; ``where`` names what it reads
    otherwise). The one implementation the loader, late activation and ``importpatch check``
    share; it records nothing."""
    from importpatch.discover.catalog import load_patch
    from importpatch.versions import check, distribution_version

    try:
        patch = load_patch(entry)
    except Exception as exc:
        return Declared(entry, None, f"{type(exc).__name__}: {exc}", False, "")
    ok, why = check(patch.requires, version_of or distribution_version, where)
    return Declared(entry, patch, "", ok, why)


def load_patches(entries: list[Entry], module: str) -> tuple[list[Patch], list[Declared]]:
    """Patches of ``entries`` whose requirement holds (a skip is recorded as an event), once each
    (two entries may name one Patch object), and the declarations that failed to load."""
    from importpatch import events

    patches: list[Patch] = []
    broken: list[Declared] = []
    for entry in entries:
        d = declared(entry)
        if d.patch is None:
            broken.append(d)
        elif any(p is d.patch for p in patches):
            continue
        elif not d.ok:
            events.record("skipped", d.patch.name, module, "version", d.why)
        else:
            patches.append(d.patch)
    return patches, broken


# Patches already handled (applied, skipped or failed) per module object: a later enable() must
# not apply them again in place (a second wrap would stack on the first).
_handled: dict[str, tuple[ModuleType, set[str]]] = {}


def handled(module: ModuleType) -> set[str]:
    entry = _handled.get(module.__name__)
    return entry[1] if entry is not None and entry[0] is module else set()


def mark_handled(module: ModuleType, patches: Iterable[str]) -> None:
    _handled[module.__name__] = (module, handled(module) | set(patches))
