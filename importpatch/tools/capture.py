"""Edits made in site-packages, turned into a diff patch: ``importpatch capture DIST``.

Projects edit installed files in place (a monkeypatch dies under spawn; a text replacement in
``site-packages/vllm/...`` does not). ``capture`` finds those edits and writes them as a diff patch
that the import hook applies in every process, the way ``patch-package`` does for npm:

1. The distribution's RECORD (pip and uv write ``path,sha256=<urlsafe b64>,size`` per file) names
   every installed file and its hash at install time. A file whose bytes hash otherwise is
   *edited*, one that is gone is *deleted*, a file under the distribution's package folders that
   no RECORD of that folder names is *added*.
2. The pristine text of each edited module comes from the release artifact of exactly that
   version: ``--from WHEEL|SDIST|DIR|NAME==VERSION``, else ``DIST==VERSION`` from the release
   cache (``importpatch.tools.releases``: downloaded once, then offline). Its bytes must hash to the
   RECORD's sha256, so the diff holds the user's change and nothing else.
3. The diff is written through ``authoring``'s work session and ``save`` (one writer of diff
   headers): ``orig/`` holds the pristine files, ``edit/`` the installed ones, and ``save`` writes
   ``NAME.diff`` with ``Name``, ``Base: DIST==VERSION`` and ``Requires`` (the minor series) where
   ``save`` writes (``--out``, else the first ``IMPORTPATCH_PATH`` folder). The work session stays,
   so ``importpatch edit --name NAME`` amends the patch later.
4. ``--restore`` puts the pristine bytes of the captured files back (each checked against RECORD
   again), so the environment matches its RECORD and the change now lands through the hook.

Only edited ``.py`` files are carried (the hook patches module source). Edited non-Python files,
added and deleted files are reported as not carried and are never restored or removed: nothing the
diff does not hold is thrown away.

Invariants: every check (distribution, RECORD, encodings, pristine hashes, the diff applying back
to exactly the edited text, the output path, the work folder) runs before anything is written, so
a refused capture changes nothing; the written diff, applied to the pristine text by the same code
the hook uses, gives the edited text byte for byte.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import TYPE_CHECKING, Any

from importpatch.rewrite import diffs
from importpatch.tools import authoring, packages
from importpatch.tools.packages import (
    Row,
    UsageError,
    file_sha256,
    find_dist,
    inside,
    record_rows,
    sha256,
    site_of,
)

if TYPE_CHECKING:
    from importlib import metadata

EDITED, ADDED, DELETED = "edited", "added", "deleted"


@dataclasses.dataclass
class Change:
    path: str  # relative to the site folder, as RECORD writes it
    how: str  # edited | added | deleted
    carried: bool  # in the diff
    why: str = ""  # why it is not carried


@dataclasses.dataclass
class CaptureResult:
    dist: str
    version: str
    site: str  # the folder the distribution is installed in
    source: str  # where the pristine files came from
    name: str
    out: str
    base: str | None
    requires: list[str]
    work: str  # the work session folder (``edit --name NAME`` amends it)
    changes: list[Change]
    restored: list[str]

    @property
    def not_carried(self) -> list[Change]:
        return [c for c in self.changes if not c.carried]

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["files"] = [c.path for c in self.changes if c.carried]
        out["not_carried"] = [dataclasses.asdict(c) for c in self.not_carried]
        return out


@dataclasses.dataclass
class Scan:
    dist: str
    version: str
    site: str
    edited: list[tuple[str, str]]  # (relative path, RECORD sha256)
    deleted: list[str]
    added: list[str]


def scan(dist: metadata.Distribution) -> Scan:
    """Files of ``dist`` that differ from its RECORD (the ones inside its site folder)."""
    site = site_of(dist)
    rows = record_rows(dist)
    edited: list[tuple[str, str]] = []
    deleted: list[str] = []
    known = set()
    for rel, digest, size in rows:
        known.add(os.path.normpath(os.path.join(site, rel)))
        if digest is None or not inside(rel) or rel.endswith((".pyc", ".pyo")):
            continue  # RECORD itself, byte-compiled files, scripts outside the site folder
        path = os.path.join(site, *rel.split("/"))
        try:
            if (size is not None and os.stat(path).st_size != size) or file_sha256(path) != digest:
                edited.append((rel, digest))
        except FileNotFoundError:
            deleted.append(rel)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc}", "check its permissions") from None
    name = dist.metadata["Name"]
    if not name:
        raise UsageError(f"the distribution in {site} has no METADATA with a Name",
                         "reinstall it")
    return Scan(name, str(dist.version), site, edited, deleted, _added(site, rows, known))


def _added(site: str, rows: list[Row], known: set[str]) -> list[str]:
    """Files in the distribution's package folders that no distribution of ``site`` installed
    (a namespace folder may hold other distributions' files: those are theirs, not added)."""
    tops = sorted({rel.split("/", 1)[0] for rel, _, _ in rows
                   if "/" in rel and inside(rel) and not rel.split("/", 1)[0].endswith(
                       (".dist-info", ".egg-info", ".data"))})
    found: list[str] = []
    for top in tops:
        folder = os.path.join(site, top)
        for here, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for f in sorted(files):
                path = os.path.normpath(os.path.join(here, f))
                if path not in known and not f.endswith((".pyc", ".pyo")):
                    found.append(os.path.relpath(path, site).replace(os.sep, "/"))
    if not found:
        return []
    others: set[str] = set()  # other distributions' files there (namespace packages)
    for entry in os.listdir(site):
        if entry.endswith(".dist-info"):
            try:
                with open(os.path.join(site, entry, "RECORD"), encoding="utf-8") as record:
                    others.update(line.split(",", 1)[0] for line in record)
            except OSError:
                continue
    return [rel for rel in found if rel not in others]


# -- capture -------------------------------------------------------------------------------------


def summarize(changes: list[Change], shown: int = 5) -> str:
    """``edited a/x.json; added a/y.py`` (the first ``shown``), then how many more."""
    text = "; ".join(f"{c.how} {c.path}" for c in changes[:shown])
    return text + (f"; and {len(changes) - shown} more" if len(changes) > shown else "")


def module_of(rel: str) -> str:
    """``vllm/v1/core/kv_cache_utils.py`` -> ``vllm.v1.core.kv_cache_utils``."""
    stem = rel[: -len(".py")]
    if stem.endswith("/__init__"):
        stem = stem[: -len("/__init__")]
    return stem.replace("/", ".")


def _is_module(rel: str) -> bool:
    return rel.endswith(".py") and all(p.isidentifier() for p in module_of(rel).split("."))


def _decode(data: bytes, path: str) -> str:
    from importpatch.safefiles import decode_source

    try:
        return decode_source(data)
    except (UnicodeDecodeError, SyntaxError) as exc:
        detail = (f"byte 0x{data[exc.start]:02x} at offset {exc.start}"
                  if isinstance(exc, UnicodeDecodeError) else str(exc))
        raise UsageError(
            f"{path} is not UTF-8 text (nor in an encoding it declares): {detail}; "
            "a diff patch is UTF-8", "re-encode the edited file as UTF-8 and capture again"
        ) from None


def open_pristine(where: str | None, dist: str, version: str) -> packages.Source:
    """``--from`` (a path or NAME==VERSION), else the release ``dist==version`` from the cache."""
    return packages.open_source(where or f"{dist}=={version}", option="--from")


def capture(
    dist_name: str,
    name: str,
    *,
    source: str | None = None,
    out: str | None = None,
    work: str | None = None,
    requires: str | None = None,
    summary: str | None = None,
    restore: bool = False,
) -> CaptureResult:
    authoring.check_name(name)
    dist = find_dist(dist_name)
    found = scan(dist)
    label = f"{found.dist} {found.version}"
    changes: list[Change] = []
    for rel in found.deleted:
        changes.append(Change(rel, DELETED, False, "a diff patch cannot delete a file"))
    for rel in found.added:
        changes.append(Change(rel, ADDED, False, "a diff patch cannot add a file"))
    edited = [(rel, digest) for rel, digest in found.edited if _is_module(rel)]
    for rel, _ in found.edited:
        if not _is_module(rel):
            changes.append(Change(rel, EDITED, False,
                                  "not a Python module: the hook patches module source only"))
    if not edited:
        raise UsageError(
            f"nothing to capture: no Python module of {label} in {found.site} differs from its "
            "RECORD" + (f" (not carried: {summarize(changes)})" if changes else ""),
            "edit an installed .py file of it first" if not changes else
            "only edits of installed .py files become a diff patch")
    edits: list[tuple[str, str, str]] = []  # (rel, RECORD sha256, edited text)
    for rel, digest in edited:
        path = os.path.join(found.site, *rel.split("/"))
        with open(path, "rb") as f:
            edits.append((rel, digest, _decode(f.read(), path)))

    # Every check that can refuse runs before the first write; the cheap ones before a download.
    tops = {rel.split("/", 1)[0].removesuffix(".py") for rel, _, _ in edits}
    package = tops.pop() if len(tops) == 1 else found.dist
    base = f"{found.dist}=={found.version}"
    if requires is not None:
        authoring._check_requires(requires)
    target = authoring.output_path(name, out, None)
    folder = authoring.session_folder(name, work)
    old = authoring.Session.load(folder)
    if old is not None and old.unsaved():
        raise UsageError(f"work folder {folder} holds unsaved edits ({', '.join(old.unsaved())})",
                         f"'importpatch save {name}' them, or remove the folder")
    if old is None and os.path.isdir(folder) and os.listdir(folder):
        raise UsageError(f"{folder} exists and is not a work session",
                         "choose another --name or --work, or remove that folder")
    pristine = open_pristine(source, found.dist, found.version)
    modules: list[tuple[str, str, str, bytes]] = []  # (rel, pristine text, edited, its bytes)
    for rel, digest, text in edits:
        file = pristine.find(module_of(rel))
        if file is None or packages.module_path(module_of(rel), file) != rel:
            raise UsageError(f"{rel} is not in {pristine.label}",
                             f"--from must be {base}, the installed release")
        orig = pristine.data(file)
        if sha256(orig) != digest:
            raise UsageError(
                f"{rel} of {pristine.label} is not the file {label} installed (its sha256 "
                "differs from the RECORD)", f"--from must be exactly {base}, the installed release")
        orig_text = pristine.text(file)
        _check_round_trip(rel, orig_text, text)
        modules.append((rel, orig_text, text, orig))
        changes.append(Change(rel, EDITED, True))
    changes.sort(key=lambda c: (not c.carried, c.path))

    if old is not None:
        shutil.rmtree(folder)
    session = authoring.Session(name, folder, base=base, package=package,
                                source=pristine.label, note=f"capture of {label}")
    session.header = _header(session, requires, summary, found, changes)
    for rel, old_text, new_text, _ in modules:
        authoring.write_text(session.path(authoring.ORIG, rel), old_text)
        authoring.write_text(session.path(authoring.EDIT, rel), new_text)
        session.files[rel] = module_of(rel)
    session.write()
    try:
        saved = authoring.save(name, work, target, requires, None)
    except UsageError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    restored = [_restore(found, rel, orig) for rel, _, _, orig in modules] if restore else []
    return CaptureResult(found.dist, found.version, found.site, pristine.label, name, saved.out,
                         saved.base, saved.requires, folder, changes, restored)


def _check_round_trip(rel: str, old: str, new: str) -> None:
    """The diff of ``old`` -> ``new``, applied by the hook's own code, gives ``new``."""
    text = diffs.make_diff(old, new, rel)
    [fp] = diffs.parse(text).files
    if diffs.apply(old, fp) != new:  # pragma: no cover - make_diff and apply disagree: a bug
        raise UsageError(f"the diff of {rel} does not give back the edited file",
                         "this is a bug in importpatch; please report it")


def _header(session: authoring.Session, requires: str | None, summary: str | None,
            found: Scan, changes: list[Change]) -> str:
    series = requires or authoring.minor_series(session.package or found.dist, found.version)
    text = authoring.new_header(
        session.name, session.base, series,
        summary or f"edits of {found.dist} {found.version} captured from site-packages")
    text = text.replace("made with `importpatch edit` / `importpatch save`",
                        "captured from site-packages with `importpatch capture`")
    left = [c for c in changes if not c.carried]
    if left:
        lines = "".join(f"  {c.how} {c.path} ({c.why})\n" for c in left[:20])
        if len(left) > 20:
            lines += f"  ... and {len(left) - 20} more\n"
        text = text.rstrip("\n") + f"\nNot carried (left as they are in site-packages):\n{lines}\n"
    return text


def _restore(found: Scan, rel: str, data: bytes) -> str:
    """Write the pristine bytes over the installed file (atomically, its mode kept)."""
    from importpatch.safefiles import replace_file

    path = os.path.join(found.site, *rel.split("/"))
    try:
        replace_file(path, data, mode=os.stat(path).st_mode & 0o7777)
    except OSError as exc:
        raise UsageError(f"restoring {path} failed: {exc} (the diff is written)",
                         f"reinstall {found.dist}=={found.version}, or fix the permissions and "
                         "run capture --restore again with --out to another file") from None
    return rel
