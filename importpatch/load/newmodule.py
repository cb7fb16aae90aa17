"""Modules a patch adds: a diff's new file (``--- /dev/null``) for a module that does not exist.

``PatchFinder.find_spec`` asks ``spec_for`` when no other finder knows a module an enabled patch
targets: if one of those patches adds it (its declaration, loaded on this path only, has a new
file for it), the spec is that of a source file with empty text under the parent package's
folder (``AbsentSource``), and the ``PatchLoader`` builds it as any patched module: the diffs, in
patch-name order, turn the empty text into the module (a new file's diff first, later edits of
it on top), with the same events, failures, bytecode cache and published source. A module that
exists is loaded from its file: there a new file's diff is already applied (the same text) or
fails (other text), as any diff that does not fit. Loaded only on that path.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from typing import Any

    from importpatch.discover.catalog import Entry


class AbsentSource:
    """The source loader of a module a patch adds: its file is where it would be, its text is
    empty (the patch's new file gives all of it)."""

    def __init__(self, fullname: str, origin: str, package: bool) -> None:
        self.name, self.path, self.package = fullname, origin, package

    def get_data(self, path: str) -> bytes:
        if path == self.path:
            return b""
        with open(path, "rb") as f:
            return f.read()

    def get_filename(self, fullname: str | None = None) -> str:
        return self.path

    def is_package(self, fullname: str | None = None) -> bool:
        return self.package

    def create_module(self, spec: ModuleSpec) -> None:
        return None


def adds(entries: list[Entry], fullname: str) -> str | None:
    """The path (in its diff) of the new file an enabled patch of ``entries`` adds as module
    ``fullname``, "" when a declaration does not load (its failure is then the import's), or
    None when none adds it."""
    from importpatch.discover.declare import DIFF
    from importpatch.discover.selection import declared

    found: str | None = None
    for entry in entries:
        d = declared(entry)
        if d.patch is None:
            found = found or ""
            continue
        if not d.ok:
            continue
        for op in d.patch.ops:
            fp = op.file_patch
            if op.kind == DIFF and fp is not None and fp.created and fullname in op.modules:
                return fp.path
    return found


def spec_for(fullname: str, path: Any, entries: list[Entry]) -> ModuleSpec | None:
    """The spec of module ``fullname`` that an enabled patch adds (None: none adds it). Only a
    module under an existing package: ``path`` is its folders."""
    parent, _, last = fullname.rpartition(".")
    if not parent or not path:
        return None
    rel = adds(entries, fullname)
    if rel is None:
        return None
    from importlib.machinery import ModuleSpec

    package = rel.endswith("/__init__.py")
    folder = list(path)[0]
    origin = os.path.join(folder, last, "__init__.py") if package else os.path.join(
        folder, last + ".py")
    loader: Any = AbsentSource(fullname, origin, package)  # duck-typed (no importlib.abc)
    spec = ModuleSpec(fullname, loader, origin=origin, is_package=package)
    spec.has_location = True
    if package:
        spec.submodule_search_locations = [os.path.dirname(origin)]
    return spec
