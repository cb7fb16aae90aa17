"""Discovery: which patches exist, from three sources, behind an index that makes startup cheap.

Sources, in this order (a later patch with the same name is an error reported by `check`/`list`):
1. built-in: the project's ``patches/`` folder, shipped in the wheel as
   ``importpatch/_builtin_patches``;
2. folders named in ``IMPORTPATCH_PATH``;
3. packages of patches: entry points of the group ``importpatch.patches`` (value: a module that
   makes ``Patch`` objects when imported, e.g. ``acme_patches = "acme_vllm_patches.patches"``, or
   a function that makes them when called, ``"pkg:register_patches"``; the ``VLLMPatch`` classes
   of importpatch.compat that the package defines count as patches too).
A folder holds ``*.py`` declaration files (names starting with ``_`` are skipped) and
``*.diff`` / ``*.patch`` files with a metadata header.

Finding targets means executing declarations (and scanning entry points costs 40-60 ms in a vLLM
environment), so the result is kept in an index: ``<cache>/catalog/<id>.marshal``, valid while the
stat signature of its inputs (each folder, each declaration file, each site-packages folder for the
entry points) is unchanged. Startup then costs a few ``stat`` calls and one ``marshal.loads``;
a declaration file is executed again only when a module it targets is imported.
A declaration that fails to load becomes an entry with ``error`` set; its likely target modules are
guessed from its text so the failure surfaces when such a module is imported.
"""

from __future__ import annotations

import marshal
import os
import sys
import zlib

from . import config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .declare import Patch

GROUP = "importpatch.patches"
INDEX_FORMAT = 3
_FIELDS = (
    "name", "origin", "source", "file", "requires", "default", "on_error", "modules", "targets",
    "kinds", "doc", "error",
)


class Entry:
    """What the index knows of one patch, without executing it."""

    __slots__ = (*_FIELDS, "_patch")
    # The fields, for type checkers (set from _FIELDS by __init__).
    name: str
    origin: str
    source: str
    file: str | None
    requires: tuple[str, ...]
    default: bool
    on_error: str
    modules: tuple[tuple[str, ...], ...]
    targets: tuple[str, ...]
    kinds: tuple[str, ...]
    doc: str
    error: str | None

    def __init__(self, **fields: Any) -> None:
        for name in _FIELDS:
            setattr(self, name, fields.get(name))
        self._patch: Patch | None = fields.get("_patch")

    def as_tuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in _FIELDS)

    @classmethod
    def from_tuple(cls, values: tuple[Any, ...]) -> Entry:
        return cls(**dict(zip(_FIELDS, values, strict=True)))

    @classmethod
    def from_patch(cls, patch: Patch, origin: str, source: str, file: str | None) -> Entry:
        return cls(
            name=patch.name, origin=origin, source=source, file=file, requires=patch.requires,
            default=patch.default, on_error=patch.on_error, modules=tuple(patch.modules),
            targets=tuple(op.target for op in patch.ops), kinds=tuple(patch.kinds),
            doc=patch.doc, error=None, _patch=patch,
        )

    def __repr__(self) -> str:
        return f"<Entry {self.name} from {self.source}{' (broken)' if self.error else ''}>"


def builtin_folder() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    shipped, checkout = "_builtin_patches", os.path.join(os.path.dirname(here), "patches")
    for candidate in (os.path.join(here, shipped), checkout):
        if os.path.isdir(candidate):
            return candidate
    return None


def _folders(toggles: config.Toggles) -> list[tuple[str, str]]:
    out = []
    builtin = builtin_folder()
    if builtin:
        out.append(("builtin", builtin))
    out.extend(("folder", os.path.abspath(p)) for p in toggles.path if os.path.isdir(p))
    return out


def _site_dirs() -> list[str]:
    # Where distributions (and so entry points) live; the script folder and cwd that later
    # processes put first on sys.path are left out so every process shares one index.
    ends = ("site-packages", "dist-packages")
    return [p for p in sys.path if p.endswith(ends) and os.path.isdir(p)]


def _stat(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
        return st.st_mtime_ns, st.st_size
    except OSError:
        return (-1, -1)


def _signature(folders: list[tuple[str, str]], files: list[str]) -> tuple[Any, ...]:
    return (
        tuple(_stat(f)[0] for _, f in folders),
        tuple(_stat(f) for f in files),
        tuple((p, _stat(p)[0]) for p in _site_dirs()),
    )


def _index_path(root: str, folders: list[tuple[str, str]]) -> str:
    ident = repr((INDEX_FORMAT, sys.version_info[:2], folders, _site_dirs())).encode()
    name = f"{zlib.crc32(ident):08x}{zlib.adler32(ident):08x}.marshal"
    return os.path.join(root, "catalog", name)


def load(toggles: config.Toggles) -> list[Entry]:
    """All discovered patches (enabled or not), from the index when it is still valid."""
    from . import bytecache

    folders = _folders(toggles)
    root = bytecache.usable_root()
    path = _index_path(root, folders) if root else None
    if path is not None:
        try:
            with open(path, "rb") as f:
                fmt, ident, files, signature, rows = marshal.load(f)
            if (
                fmt == INDEX_FORMAT
                and ident == repr(folders)
                and signature == _signature(folders, list(files))
            ):
                return [Entry.from_tuple(r) for r in rows]
        except (OSError, EOFError, ValueError, TypeError):
            pass
    entries, files = scan(folders)
    if path is not None:
        payload = (INDEX_FORMAT, repr(folders), tuple(files), _signature(folders, files),
                   tuple(e.as_tuple() for e in entries))
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                marshal.dump(payload, f)
            os.replace(tmp, path)
        except (OSError, ValueError):
            pass
    return entries


def scan(folders: list[tuple[str, str]]) -> tuple[list[Entry], list[str]]:
    """Execute every declaration (the slow path). Returns entries and the files they came from."""
    entries: list[Entry] = []
    files: list[str] = []
    for origin, folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for fname in names:
            if fname.startswith((".", "_")) or not fname.endswith((".py", ".diff", ".patch")):
                continue
            file = os.path.join(folder, fname)
            files.append(file)
            entries.extend(_entries_of_file(origin, file))
    entries.extend(_entry_point_entries(files))
    return entries, files


_loaded_files: dict[str, list[Patch]] = {}


def _load_file(file: str) -> list[Patch]:
    """Execute one declaration file (once per process) and return the Patch objects it made."""
    if file in _loaded_files:
        return _loaded_files[file]
    from .declare import collecting, patch_from_diff_file

    if file.endswith((".diff", ".patch")):
        with collecting():  # a discovered patch must not join the registry enable() turns on
            patches = [patch_from_diff_file(file)]
    else:
        import importlib.util

        stem = os.path.splitext(os.path.basename(file))[0]
        modname = f"importpatch._declared.{stem}_{zlib.crc32(file.encode()):08x}"
        spec = importlib.util.spec_from_file_location(modname, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        with collecting() as found:
            try:
                # Not exec_module: its .pyc (mtime in whole seconds) would run stale code after a
                # same-size edit within a second, and the bytecode cache would key the new text.
                with open(file, "rb") as f:
                    exec(compile(f.read(), file, "exec", dont_inherit=True), module.__dict__)
            except BaseException:
                sys.modules.pop(modname, None)
                raise
        patches = found
        for p in patches:
            p.source = file
    _loaded_files[file] = patches
    return patches


def _entries_of_file(origin: str, file: str) -> list[Entry]:
    try:
        patches = _load_file(file)
    except Exception as exc:  # reported when a module it targets is imported
        stem = os.path.splitext(os.path.basename(file))[0]
        return [Entry(
            name=stem, origin=origin, source=file, file=file, requires=(), default=False,
            on_error="fail", modules=tuple((m,) for m in guess_modules(file)), targets=(),
            kinds=(), doc="", error=f"{type(exc).__name__}: {exc}",
        )]
    return [Entry.from_patch(p, origin, file, file) for p in patches]


def _entry_point_entries(files: list[str]) -> list[Entry]:
    from importlib import metadata

    entries: list[Entry] = []
    try:
        eps = metadata.entry_points(group=GROUP)
    except Exception:
        return entries
    for ep in sorted(eps, key=lambda e: e.name):
        source = f"entry point {ep.name} = {ep.value}"
        try:
            found = _declarations(ep.value)
            mod_file = getattr(sys.modules.get(ep.module), "__file__", None)
            if mod_file:
                files.append(mod_file)
        except Exception as exc:
            entries.append(Entry(
                name=ep.name, origin="entry-point", source=source, file=None, requires=(),
                default=False, on_error="fail", modules=(), targets=(), kinds=(), doc="",
                error=f"{type(exc).__name__}: {exc}",
            ))
            continue
        for p in found:
            p.source, p.origin = source, "entry-point"
            entries.append(Entry.from_patch(p, "entry-point", source, None))
            _ep_patches[p.name] = p
    return entries


_ep_patches: dict[str, Patch] = {}


def _declarations(value: str) -> list[Patch]:
    """The Patch objects an entry point value ``module`` or ``module:function`` declares: made while
    the module is imported or the function runs (the function is called: importpatch.compat users
    name their ``register_patches``), else (imported before) the module's Patch globals; plus the
    ``VLLMPatch`` classes of the same top-level package when importpatch.compat is in use."""
    import importlib

    from .declare import Patch, collecting

    module, _, attr = (part.strip() for part in value.partition(":"))
    with collecting() as found:
        obj: Any = importlib.import_module(module)
        if attr:
            for part in attr.split("."):
                obj = getattr(obj, part)
            obj()
    if not found:  # already imported elsewhere: pick up its Patch objects
        found = [v for v in vars(sys.modules[module]).values() if isinstance(v, Patch)]
    compat = sys.modules.get("importpatch.compat")
    if compat is not None:
        found += [p for p in compat.declared_in(module) if all(p is not f for f in found)]
    return found


def _load_entry_point_module(entry: Entry) -> None:
    """Load the declarations of an indexed entry point (``source`` is "entry point NAME = VALUE")
    without listing entry points again: that costs 40-60 ms in a vLLM environment, and the index
    exists so that no process after the first pays it."""
    value = str(entry.source).partition(" = ")[2].strip()
    if not value:
        _entry_point_entries([])
        return
    for p in _declarations(value):
        p.source, p.origin = entry.source, "entry-point"
        _ep_patches[p.name] = p


def load_patch(entry: Entry) -> Patch:
    """The Patch object behind an index entry (executes its declaration the first time)."""
    if entry._patch is not None:
        return entry._patch
    if entry.error:
        raise RuntimeError(entry.error)
    if entry.file:
        patches = _load_file(entry.file)
    else:
        if entry.name not in _ep_patches:
            _load_entry_point_module(entry)
        patches = [_ep_patches[entry.name]] if entry.name in _ep_patches else []
    for p in patches:
        if p.name == entry.name:
            entry._patch = p
            return p
    raise RuntimeError(f"{entry.source} no longer declares a patch named {entry.name!r}")


def guess_modules(file: str) -> list[str]:
    """Target modules named in a declaration that failed to load: '+++ b/x/y.py' lines of a diff,
    'pkg.mod:Name' strings of a .py file."""
    import re

    try:
        with open(file, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    mods: list[str] = []
    for m in re.finditer(r"^(?:\+\+\+|---) (?:[ab]/)?(\S+)\.py\s*$", text, re.M):
        mods.append(m.group(1).replace("/", ".").removesuffix(".__init__"))
    for m in re.finditer(r"""["']([A-Za-z_][\w.|]*):[A-Za-z_][\w.]*["']""", text):
        mods.extend(m.group(1).split("|"))
    return list(dict.fromkeys(mods))
