"""Patch folders as packages: how patch files share code.

Every patch folder (``IMPORTPATCH_PATH``, and the built-in ``patches/``) is a package of its own,
``importpatch._declared.<folder name>_<crc32 of its absolute path>``; its patch files are executed
as modules of it. So a patch file imports the folder's *helpers* relatively::

    from ._common import banned_ids       # _common.py in the same folder
    from ._lib.parsing import parse       # _lib/__init__.py, _lib/parsing.py

A helper is a file or a folder whose name starts with one ``_`` (not ``__``): discovery does not
treat it as a patch. It is imported like any module (once per process), but from its source
(never a ``.pyc``: one written within a second of an edit would run the old code). A patch file
cannot be imported as a helper (its declarations would run a second time).

Invariants:
- Helpers are found by ``HelperFinder``, last on ``sys.meta_path`` (a folder package's
  ``__path__`` is empty, so the path finder never looks there and nothing else is slowed down).
  Importing ``importpatch._declared`` (unpickling an object of a helper in another process)
  installs it, and folder packages of the folders in this process's ``IMPORTPATCH_PATH`` are made
  on demand: a helper's import name is the same in every process with the same variables.
- Every helper file and folder is part of the catalog index's signature (``helper_files``): an
  edit of a helper that a declaration uses refreshes the index. The bytecode cache key of an AST
  transform from a patch folder holds the content of the folder's helpers (``helpers_digest``):
  a changed helper compiles the module afresh.
"""

from __future__ import annotations

import os
import sys
import zlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import CodeType, ModuleType
    from typing import Any

ROOT = "importpatch._declared"


def is_helper(name: str) -> bool:
    """A helper's file or folder name: one leading underscore (``__pycache__``, ``__init__.py``
    and hidden files are neither patches nor helpers)."""
    return name.startswith("_") and not name.startswith("__")


def package_name(folder: str) -> str:
    """The import name of patch folder ``folder`` (an absolute path)."""
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in os.path.basename(folder))
    crc = zlib.crc32(folder.encode("utf-8", "surrogateescape"))
    return f"{ROOT}.{base or 'folder'}_{crc:08x}"


_packages: dict[str, str] = {}  # package name -> folder


def package(folder: str) -> ModuleType:
    """The package module of ``folder`` (made and put in ``sys.modules`` the first time)."""
    name = package_name(folder)
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__patch_folder__", None) == folder:
        return module
    import importlib.machinery
    import types

    install()
    _packages[name] = folder
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = []  # see the module docstring: HelperFinder finds them
    module = types.ModuleType(name, f"the patch folder {folder}")
    module.__spec__, module.__package__, module.__path__ = spec, name, []
    module.__patch_folder__ = folder  # type: ignore[attr-defined]
    sys.modules[name] = module
    return module


def helper_files(folder: str) -> list[str]:
    """The helper files and folders of ``folder``, recursively, sorted (for the index)."""
    out: list[str] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        if not is_helper(name):
            continue
        path = os.path.join(folder, name)
        out.append(path)
        if os.path.isdir(path):
            for base, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                out.extend(os.path.join(base, d) for d in dirs)
                out.extend(os.path.join(base, f) for f in sorted(files)
                           if not f.endswith((".pyc", ".pyo")))
    return out


_digests: dict[str, bytes] = {}


def helpers_digest(folder: str) -> bytes:
    """The paths and content of ``folder``'s helper files (once per process), for cache keys."""
    if folder not in _digests:
        parts = []
        for path in helper_files(folder):
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:  # a folder
                data = b"\0dir"
            rel = os.path.relpath(path, folder).encode("utf-8", "surrogateescape")
            parts.append(len(rel).to_bytes(4, "little") + rel + len(data).to_bytes(8, "little")
                         + data)
        _digests[folder] = b"".join(parts)
    return _digests[folder]


def folder_of(patch_source: str) -> str | None:
    """The patch folder of a patch declared in file ``patch_source`` (None for others)."""
    if not patch_source.endswith(".py") or not os.path.isabs(patch_source):
        return None
    folder = os.path.dirname(patch_source)
    return folder if package_name(folder) in _packages else None


class HelperFinder:
    """Finds helpers of patch folders; see the module docstring."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if not fullname.startswith(ROOT + "."):
            return None
        parts = fullname[len(ROOT) + 1:].split(".")
        pkg = f"{ROOT}.{parts[0]}"
        folder = _packages.get(pkg) or _from_config(pkg)
        if folder is None:
            return None
        if len(parts) == 1:
            package(folder)
            return sys.modules[pkg].__spec__
        if not is_helper(parts[1]) and os.path.isfile(os.path.join(folder, parts[1] + ".py")):
            raise ImportError(
                f"{fullname}: {parts[1]!r} in {folder} is a patch file, not a helper: patch files "
                "cannot import each other; put shared code in a module whose name starts with "
                "'_' and import that", name=fullname)
        if not is_helper(parts[1]):
            return None
        base = os.path.join(folder, *parts[1:])
        import importlib.machinery

        for file, is_pkg in ((base + ".py", False), (os.path.join(base, "__init__.py"), True)):
            if os.path.isfile(file):
                loader: Any = _HelperLoader(fullname, file)  # duck-typed: no importlib.abc
                spec = importlib.machinery.ModuleSpec(
                    fullname, loader, origin=file, is_package=is_pkg)
                spec.has_location = True
                if is_pkg:
                    spec.submodule_search_locations = []
                return spec
        return None

    def invalidate_caches(self) -> None:
        pass


def _from_config(pkg: str) -> str | None:
    """A folder package asked for before any of its files ran here (unpickling): the folders of
    this process's toggles."""
    from importpatch import config

    for _, folder in config.patch_folders(config.read()):
        if package_name(folder) == pkg:
            package(folder)
            return folder
    return None


class _HelperLoader:
    """Executes a helper from its source; never reads or writes a ``.pyc``."""

    def __init__(self, name: str, path: str) -> None:
        self.name, self.path = name, path

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(self.get_code(self.name), module.__dict__)

    def get_code(self, fullname: str) -> CodeType:
        from importpatch.safefiles import read_regular

        code: CodeType = compile(read_regular(self.path), self.path, "exec", dont_inherit=True)
        return code

    def get_source(self, fullname: str) -> str:
        from importpatch.safefiles import decode_source

        with open(self.path, "rb") as f:
            return decode_source(f.read())

    def get_filename(self, fullname: str) -> str:
        return self.path

    def is_package(self, fullname: str) -> bool:
        return os.path.basename(self.path) == "__init__.py"


def install() -> None:
    """Put the HelperFinder last on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, HelperFinder) for f in sys.meta_path):
        sys.meta_path.append(HelperFinder())
