"""Carry a source-diff patch to another release: ``importpatch rebase NAME --to WHEEL|SDIST|DIR``.

Per file of the diff, with *base* the file of the release the diff was made against (its
``Base:`` header, or ``--base``), *ours* = base + the diff, *theirs* = the target release's file,
a 3-way merge of (base, ours, theirs) with ``merge3`` (Breezy's implementation of the classic
merge3 algorithm, on PyPI): regions only we changed take ours, regions only upstream changed take
theirs, regions both changed alike are *already upstream* (never duplicated), regions both
changed differently, or changes that touch, are conflicts. This is what ``git apply --3way``
does (git 2.32+: the 3-way merge first, a plain apply only when the base is unknown), and
``scripts/eval/rebase_corpus.py`` measures the agreement on vLLM's history. A clean result is then
checked (``_verified``): it stands where it is ``git merge-file``'s text or shown right line by
line (the change present once, nothing upstream removed added back); else it is the target
unchanged (the change already there, re-indented), git's merge when that one is right, or a
conflict (issue 37: a change upstream already has, re-indented, must not be made twice).
Lines are aligned by ``Matcher`` (difflib without its "popular line" heuristic,
insertions slid down as git's xdiff slides them).

A clean rebase writes the rebased diff (``Base:`` the target release; the rest of the header
kept, ``Requires`` decided by ``requires_after``). A conflict writes the merged files, with
diff3-style markers, into the work folder in ``importpatch edit``'s layout (``orig/`` = the target
release's files), so that after resolving them by hand ``importpatch save NAME`` writes the diff.

``merge3`` is imported here only, and this module only by the command line: nothing of it is on
the start-up or import-hook path. It is GPL-2.0-or-later, so it is not in the base install but in
the ``rebase`` extra: without it ``rebase`` refuses before reading anything (``require_merge3``;
the command exits 3 with the install command).
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import os
from collections.abc import Sequence
from typing import Any

from importpatch.discover import declare
from importpatch.rewrite import diffs
from importpatch.tools import authoring, packages, releases

APPLIED, MERGED, UPSTREAM, CONFLICT = "applied", "merged", "upstream", "conflict"
CLEAN = "clean"


# What installs the 3-way merge: the extra, so that the version range stays the project's.
MERGE3_EXTRA = "importpatch-hook[rebase]"


class MissingDependency(Exception):
    """A command needs an optional dependency that is not installed; ``install`` installs it."""

    def __init__(self, message: str, install: str) -> None:
        super().__init__(message)
        self.install = install


def require_merge3(command: str = "rebase") -> None:
    """Raise ``MissingDependency`` when ``merge3`` cannot be imported (the ``rebase`` extra is
    not installed) for ``importpatch COMMAND`` (``rebase``, ``from-git``): a found spec is not
    enough, a broken install fails here too."""
    try:
        import merge3  # noqa: F401
    except ImportError as exc:
        import shlex
        import sys

        install = f"{shlex.quote(sys.executable)} -m pip install {shlex.quote(MERGE3_EXTRA)}"
        raise MissingDependency(
            f"'importpatch {command}' needs merge3 for its 3-way merge, and it cannot be imported "
            f"here ({exc}); merge3 is GPL-2.0-or-later, so it is an extra, not in the base "
            "install", install) from None


class NotApplicable(Exception):
    """The diff does not apply to the base it names: the base is wrong, not the rebase."""


# -- Lines -----------------------------------------------------------------------------------


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split on '\\n' only, as the diff engine splits them."""
    return diffs._split_keepends(text)


class Matcher:
    """The line alignment merge3 runs on: difflib's, then each run of only inserted or only
    deleted lines slid down as far as equal lines let it (before the next change).

    An insertion between repeated lines (blank lines, a closing bracket) can be placed at
    several equal places; git's xdiff puts it at the lowest. Two diffs against one base that
    insert the same block must put it at the same place, or the merge sees two insertions and
    makes the change twice.

    Measured on 2,379 rebases of vLLM's history (scripts/eval/rebase_corpus.py): this alignment
    gives git's verdict in all but one (a conflict where git merges) and git's output wherever both
    merge. A greedy shortest-edit-script (Myers) alignment, tried instead, was 5x faster but
    disagreed with git 9 times (3 clean where git conflicts): git's xdiff finds a different one
    of the shortest scripts (middle snakes, discarded unmatched lines, change compaction).
    """

    def __init__(self, isjunk: Any, a: Sequence[str], b: Sequence[str]) -> None:
        self.a, self.b = a, b

    def get_matching_blocks(self) -> list[tuple[int, int, int]]:
        a, b = self.a, self.b
        # The common head and tail first: difflib's cost grows with the lines it compares, and
        # a patched file and its base differ in a few places only.
        head = 0
        limit = min(len(a), len(b))
        while head < limit and a[head] == b[head]:
            head += 1
        tail = 0
        while tail < limit - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
            tail += 1
        inner = difflib.SequenceMatcher(
            None, a[head:len(a) - tail], b[head:len(b) - tail], autojunk=False
        ).get_opcodes()
        ops = [("equal", 0, head, 0, head)] if head else []
        ops += [(tag, i1 + head, i2 + head, j1 + head, j2 + head) for tag, i1, i2, j1, j2 in inner]
        if tail:
            ops.append(("equal", len(a) - tail, len(a), len(b) - tail, len(b)))
        blocks: list[tuple[int, int, int]] = []
        carry = 0  # lines the previous run slid past, taken from the front of this equal run
        for k, (tag, i1, i2, j1, j2) in enumerate(ops):
            if tag == "equal":
                if i2 - i1 > carry:
                    blocks.append((i1 + carry, j1 + carry, i2 - i1 - carry))
                carry = 0
                continue
            nxt = ops[k + 1] if k + 1 < len(ops) else None
            if tag in ("insert", "delete") and nxt is not None and nxt[0] == "equal":
                seq, start, end = (b, j1, j2) if tag == "insert" else (a, i1, i2)
                room = nxt[2] - nxt[1]
                while carry < room and seq[start + carry] == seq[end + carry]:
                    carry += 1
                if carry:  # the lines it slid past now match before it
                    blocks.append((i1, j1, carry))
        blocks.append((len(a), len(b), 0))
        return blocks


# -- One file ----------------------------------------------------------------------------------


@dataclasses.dataclass
class HunkFate:
    index: int
    header: str
    status: str  # applied | merged | upstream | conflict
    line: int | None = None  # 1-based line of the rebased file where the change starts
    moved: int | None = None  # lines it moved relative to the base (None: not placed)
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Conflict:
    start: int  # 1-based line of the '<<<<<<<' marker in the merged file
    end: int  # 1-based line of the '>>>>>>>' marker
    hunks: list[int]  # the diff's hunks (1-based) involved
    detail: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class FileMerge:
    how: str  # merged (clean) | conflict
    text: str  # the rebased file (with conflict markers when how == conflict)
    hunks: list[HunkFate]
    conflicts: list[Conflict]
    settled: int = 0  # conflict regions settled by ``reindented`` (beyond git's merge)
    checked: str = ""  # how a clean result was checked (``_verified``)

    @property
    def clean(self) -> bool:
        return self.how != CONFLICT


@dataclasses.dataclass(frozen=True)
class Labels:
    target: str = "target"
    base: str = "base"
    patch: str = "patch"


def _hunk_header(h: diffs.Hunk) -> str:
    return h.header.split("@@")[1].strip() if h.header.count("@@") >= 2 else h.header


def merge_file(
    base: str, theirs: str, fp: diffs.FilePatch, labels: Labels = Labels()
) -> FileMerge:
    """Rebase one file's patch ``fp`` (made on ``base``) onto ``theirs``; see the module doc."""
    try:
        ours = diffs.apply(base, fp)
    except diffs.HunkMismatch as exc:
        raise NotApplicable(str(exc)) from None
    merged = _three_way(base, ours, theirs, fp, labels)
    if not merged.clean:
        return merged
    return _verified(base, ours, theirs, fp, labels, merged)


@dataclasses.dataclass
class _Span:
    """A hunk as merge regions see it: its new side in ours, its old side in base (0-based)."""

    index: int
    hunk: diffs.Hunk
    ours_start: int
    ours_end: int
    base_start: int
    base_end: int


def _spans(base_lines: list[str], ours_lines: list[str], fp: diffs.FilePatch) -> list[_Span]:
    spans = []
    shift = 0  # ours minus base line numbers, from earlier hunks
    keys = [line.rstrip("\n").removesuffix("\r") for line in ours_lines]
    for i, h in enumerate(fp.hunks, 1):
        new = [text for tag, text in h.lines if tag != "-"]
        stated = (h.new_start - 1 if h.new_len else h.new_start)
        start = _locate(keys, new, stated)
        spans.append(_Span(i, h, start, start + len(new), start - shift,
                           start - shift + h.old_len))
        shift += h.new_len - h.old_len
    return spans


def _locate(keys: list[str], want: list[str], stated: int) -> int:
    """Where ``want`` sits in ``keys`` (lines without their endings), nearest ``stated``."""
    n = len(want)
    for d in range(len(keys) + 1):
        for p in (stated - d, stated + d) if d else (stated,):
            if 0 <= p <= len(keys) - n and keys[p:p + n] == want:
                return p
    return max(0, min(stated, len(keys)))


def _three_way(
    base: str, ours: str, theirs: str, fp: diffs.FilePatch, labels: Labels,
    settle: bool = True,
) -> FileMerge:
    import merge3

    base_lines, ours_lines, their_lines = split_lines(base), split_lines(ours), split_lines(theirs)
    spans = _spans(base_lines, ours_lines, fp)
    m = merge3.Merge3(base_lines, ours_lines, their_lines,
                      sequence_matcher=Matcher)
    out: list[str] = []
    conflicts: list[Conflict] = []
    # Markers end lines as the target file mostly does (CRLF files get CRLF markers, like git's).
    crlf = sum(line.endswith("\r\n") for line in their_lines)
    eol = "\r\n" if crlf * 2 > len(their_lines) else "\n"
    # Per hunk: the kinds of its regions, and where its first own region landed.
    kinds: dict[int, list[str]] = {s.index: [] for s in spans}
    landed: dict[int, tuple[int, int]] = {}  # hunk -> (output line, moved)
    upstream_near: dict[int, list[int]] = {s.index: [] for s in spans}
    n_settled = 0
    # Positions in base, ours and theirs at the end of the last sync region (lines all three
    # share); 'moved' is theirs minus base there, which is exact for the change that follows.
    found = m.find_sync_regions()
    m.find_sync_regions = lambda: found  # type: ignore[method-assign]  # computed once
    syncs = iter(s for s in found if s[1] > s[0])
    iz = ia = ib = 0
    for merge_region in m.merge_regions():
        region: tuple[Any, ...] = merge_region  # a tagged tuple of 3 or 7 items
        what = region[0]
        if what == "unchanged":
            _, z1, z2 = region
            out.extend(base_lines[z1:z2])
            _z1, iz, _a1, ia, _b1, ib = next(syncs)
            assert _z1 == z1 and iz == z2
            continue
        if what == "b":
            _, b1, b2 = region
            # An upstream-only change right after the sync region ending at base line iz: it
            # counts for a hunk whose old side (its context included) reaches that line.
            owners = [s for s in spans if s.base_start <= iz <= s.base_end]
            for s in owners:
                upstream_near[s.index].append(len(out) + 1)
            out.extend(their_lines[b1:b2])
            continue
        if what in ("a", "same"):
            _, a1, a2 = region
            owners = _owners(spans, a1, a2)
            for s in owners:
                kinds[s.index].append(UPSTREAM if what == "same" else APPLIED)
                landed.setdefault(s.index, (len(out) + 1, ib - iz))
            out.extend(ours_lines[a1:a2])
            continue
        assert what == "conflict"
        _, z1, z2, a1, a2, b1, b2 = region
        owners = _owners(spans, a1, a2)
        settled = (reindented(base_lines[z1:z2], ours_lines[a1:a2], their_lines[b1:b2])
                   if settle else None)
        if settled is not None:
            n_settled += 1  # upstream only re-indented and inserted lines there
            for s in owners:
                kinds[s.index].append(APPLIED)
                landed.setdefault(s.index, (len(out) + 1, ib - iz))
                upstream_near[s.index].append(len(out) + 1)
            out.extend(settled)
            continue
        for s in owners:
            kinds[s.index].append(CONFLICT)
        start = len(out) + 1
        _block(out, f"<<<<<<< {labels.target}", their_lines[b1:b2], eol)
        _block(out, f"||||||| {labels.base}", base_lines[z1:z2], eol)
        _block(out, "=======", ours_lines[a1:a2], eol)
        out.append(f">>>>>>> {labels.patch}{eol}")
        which = [s.index for s in owners]
        conflicts.append(Conflict(
            start, len(out), which,
            f"{labels.target} lines {b1 + 1}-{b2} and hunk "
            f"#{', #'.join(map(str, which)) or '?'} change base lines {z1 + 1}-{z2} differently",
        ))
    fates = []
    for s in spans:
        seen = kinds[s.index]
        line, moved = landed.get(s.index, (None, _offset_at(found, s.base_start)))
        if CONFLICT in seen:
            fate = HunkFate(s.index, _hunk_header(s.hunk), CONFLICT, detail="conflicts with "
                            "upstream changes")
        elif seen and all(k == UPSTREAM for k in seen):
            fate = HunkFate(s.index, _hunk_header(s.hunk), UPSTREAM, line, moved,
                            "already upstream: the target release makes the same change")
        elif upstream_near[s.index] or UPSTREAM in seen:
            what_near = ("partly already upstream" if UPSTREAM in seen else
                         "merged with upstream changes at line(s) "
                         + ", ".join(map(str, upstream_near[s.index][:5])))
            fate = HunkFate(s.index, _hunk_header(s.hunk), MERGED, line, moved, what_near)
        elif seen:
            fate = HunkFate(s.index, _hunk_header(s.hunk), APPLIED, line, moved,
                            "merged, context unchanged")
        else:
            fate = _unowned(s, moved, "".join(their_lines), "".join(out))
        fates.append(fate)
    text = "".join(out)
    unsettled = conflicts or any(f.status == CONFLICT for f in fates)
    return FileMerge(CONFLICT if unsettled else MERGED, text, fates, conflicts, n_settled)


# -- Checking a clean result -------------------------------------------------------------------
#
# merge3's regions and ``reindented`` can read a change the target already has (re-indented
# by upstream: a ``try:`` or ``if`` put around it) as upstream lines next to an edit still to
# make, and write the change a second time, nested in upstream's copy: valid Python, so nothing
# after the merge would catch it (issue 37). So a clean result stands only where it is the
# text git's own 3-way merge gives, or where it is shown right line by line (``unproven``).


def git_merge(base: str, ours: str, theirs: str, labels: Labels) -> tuple[bool, str] | None:
    """``git merge-file --diff3`` of the same three texts, with the same labels: (clean, the
    merged text, with git's markers when not clean); None when git is not installed or fails.
    It is the 3-way merge ``git apply --3way`` and ``git cherry-pick`` run on a file."""
    import shutil
    import subprocess
    import tempfile

    git = shutil.which("git")
    if git is None:
        return None
    with tempfile.TemporaryDirectory(prefix="importpatch-merge-") as folder:
        paths = []
        for name, text in (("target", theirs), ("base", base), ("patch", ours)):
            path = os.path.join(folder, name)
            with open(path, "wb") as f:
                f.write(text.encode("utf-8", "surrogateescape"))
            paths.append(path)
        try:
            done = subprocess.run(
                [git, "merge-file", "-p", "--diff3", "-L", labels.target, "-L", labels.base,
                 "-L", labels.patch, *paths],
                capture_output=True, env={**os.environ, "LC_ALL": "C"}, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
    if not 0 <= done.returncode <= 127:  # <0: killed; 255: git's own error
        return None
    return done.returncode == 0, done.stdout.decode("utf-8", "surrogateescape")


def _counts(text: str) -> collections.Counter[str]:
    # Lines without their indentation: upstream's re-indent of a line is not a change of it.
    return collections.Counter(line.strip() for line in split_lines(text))


def unproven(base: str, ours: str, theirs: str, result: str) -> str:
    """"" when ``result`` is the target with the patch's edit made once: per line (without its
    indentation), as many copies as the target has, plus the patch's change of that count,
    where upstream did not make the same change already (then once, not twice); so the change
    is present exactly once and nothing upstream removed is added back. Else what is wrong."""
    cb, co, ct, cr = (_counts(t) for t in (base, ours, theirs, result))
    for line in sorted(set(cb) | set(co) | set(ct) | set(cr), key=lambda x: (not x, x)):
        d_ours, d_theirs = co[line] - cb[line], ct[line] - cb[line]
        both = d_ours * d_theirs > 0  # the same change made on both sides: made once
        want = cb[line] + (max(d_ours, d_theirs, key=abs) if both else d_ours + d_theirs)
        if cr[line] == want:
            continue
        shown = repr(line) if line else "a blank line"
        if cr[line] > want and d_theirs < 0:
            return f"it adds back {shown}, which upstream removed"
        if cr[line] > want and both:
            return (f"it has {shown} {cr[line]} times: the target already has the change, "
                    "and the merge makes it again")
        return (f"it has {shown} {cr[line]} time(s), where the target with the patch's change "
                f"made once has it {want} time(s)")
    return ""


def _both_added(base: str, ours: str, theirs: str) -> bool:
    """Whether upstream added a (non-blank) line the patch adds too: then the target may have
    the change already, and a merge can make it a second time."""
    cb, co, ct = (_counts(t) for t in (base, ours, theirs))
    return any(line and co[line] > cb[line] and ct[line] > cb[line] for line in co)


def already_upstream(base: str, ours: str, theirs: str, fp: diffs.FilePatch) -> bool:
    """Whether the target reads as the patch's new side, re-indented: the target has every
    change of line counts the patch makes (``unproven`` of the target itself is ""), and each
    run of lines a hunk adds is in the target, in order (indentation and blank lines aside)."""
    if ours == base or unproven(base, ours, theirs, theirs):
        return False
    keys = [x.strip() for x in split_lines(theirs) if x.strip()]
    for run in _runs_all(fp, "+"):
        want = [x.strip() for x in run if x.strip()]
        if want and not any(keys[p:p + len(want)] == want
                            for p in range(len(keys) - len(want) + 1)):
            return False
    return True


def _runs_all(fp: diffs.FilePatch, tag: str) -> list[list[str]]:
    return [run for h in fp.hunks for run in _runs(h, tag)]


def _verified(base: str, ours: str, theirs: str, fp: diffs.FilePatch, labels: Labels,
              merged: FileMerge) -> FileMerge:
    """``merged`` (clean) kept where git's merge gives the same text, or where ``unproven``
    finds nothing wrong with it (without git: where a region was settled by ``reindented`` or
    upstream added a line the patch adds; merge3's own regions can make the second copy too).
    Else: the target unchanged when it already has the change
    (re-indented); git's clean merge when that one is right; else a conflict with both sides."""
    git = git_merge(base, ours, theirs, labels)
    if git is not None and git[0] and git[1] == merged.text:
        merged.checked = "the same as git merge-file's"
        return merged
    if git is None and not merged.settled and not _both_added(base, ours, theirs):
        # Without git, and nothing settled beyond merge3 (whose alignment is git's, Matcher)
        # nor any line of the patch's already added upstream (what a second copy is made of):
        # merge3's result stands, as it did, rather than a line count that real merges can
        # legitimately miss (a bracket both sides moved).
        return merged
    why = unproven(base, ours, theirs, merged.text)
    if not why:
        merged.checked = ("git merge-file conflicts; the change is there once and nothing "
                          "upstream removed is back" if git is not None and not git[0] else
                          "the change is there once and nothing upstream removed is back")
        return merged
    if already_upstream(base, ours, theirs, fp):
        fates = [HunkFate(s.index, _hunk_header(h), UPSTREAM, None, None,
                          "already upstream: the target release has its change, re-indented "
                          "(the merge changes nothing for it)")
                 for s, h in ((s, s.hunk) for s in _spans(split_lines(base), split_lines(ours),
                                                          fp))]
        return FileMerge(MERGED, theirs, fates, [], checked="already in the target")
    if git is not None and git[0] and not unproven(base, ours, theirs, git[1]):
        fates = [HunkFate(i, _hunk_header(h), MERGED, None, None,
                          f"merged as git merge-file merges it (importpatch's own merge was "
                          f"wrong: {why})") for i, h in enumerate(fp.hunks, 1)]
        return FileMerge(MERGED, git[1], fates, [], checked="git merge-file's")
    detail = (f"the 3-way merge reads clean but is wrong ({why}): resolve by hand")
    plain = _three_way(base, ours, theirs, fp, labels, settle=False)
    if not plain.clean:
        for f in plain.hunks:
            if f.status == CONFLICT:
                f.detail = detail
        return plain
    if git is not None and not git[0]:
        text = git[1]
    else:  # both merges clean and both wrong: the whole file, both sides
        eol = "\r\n" if theirs.count("\r\n") * 2 > theirs.count("\n") else "\n"
        out: list[str] = []
        _block(out, f"<<<<<<< {labels.target}", split_lines(theirs), eol)
        _block(out, f"||||||| {labels.base}", split_lines(base), eol)
        _block(out, "=======", split_lines(ours), eol)
        out.append(f">>>>>>> {labels.patch}{eol}")
        text = "".join(out)
    which = list(range(1, len(fp.hunks) + 1))
    conflicts = []
    start = 0
    for n, line in enumerate(split_lines(text), 1):
        if line.startswith("<<<<<<< "):
            start = n
        elif line.startswith(">>>>>>> ") and start:
            conflicts.append(Conflict(start, n, which, detail))
            start = 0
    fates = [HunkFate(i, _hunk_header(h), CONFLICT, detail=detail)
             for i, h in enumerate(fp.hunks, 1)]
    return FileMerge(CONFLICT, text, fates, conflicts)


def reindented(base: list[str], ours: list[str], theirs: list[str]) -> list[str] | None:
    """A conflict region settled when upstream's side only re-indents base lines and inserts
    new ones (a ``with`` or ``if`` put around them, the vllm-gaudi case of issue 28) and the
    patch's edits fall between upstream's insertions: the patch's edits applied to upstream's
    lines, each line it adds indented as upstream re-indented the line it replaces. None when
    that is not so (a real conflict)."""
    def key(line: str) -> str:
        return line.strip()

    def indent(line: str) -> str:
        return line[:len(line) - len(line.lstrip(" \t"))]

    theirs_ops = difflib.SequenceMatcher(None, [key(x) for x in base],
                                         [key(x) for x in theirs], autojunk=False).get_opcodes()
    if any(tag not in ("equal", "insert") for tag, *_ in theirs_ops):
        return None
    theirs_of: dict[int, str] = {}  # base line -> upstream's (re-indented) line
    inserted: dict[int, list[str]] = {}  # before base line -> upstream's new lines
    for tag, i1, i2, j1, j2 in theirs_ops:
        if tag == "equal":
            theirs_of.update((i1 + k, theirs[j1 + k]) for k in range(i2 - i1))
        else:
            inserted[i1] = theirs[j1:j2]
    if all(theirs_of[i] == base[i] for i in theirs_of):
        return None  # no re-indentation: an ordinary conflict
    ours_ops = difflib.SequenceMatcher(None, base, ours, autojunk=False).get_opcodes()
    out: list[str] = []
    for tag, i1, i2, j1, j2 in ours_ops:
        if tag != "equal" and (any(i1 < p < i2 for p in inserted) or (
                tag == "insert" and i1 in inserted)):
            return None  # the patch changes lines upstream put new lines between
        for i in range(i1, i2 if tag == "equal" else i1):
            out += inserted.get(i, [])
            out.append(theirs_of[i])
        if tag == "equal":
            continue
        out += inserted.get(i1, []) if i1 < i2 else []
        if tag == "replace" and any(
                key(base[i]) == key(line) and theirs_of.get(i, base[i]) != base[i]
                for i in range(i1, i2) for line in ours[j1:j2] if key(line)):
            # The patch itself moves these lines into a block of its own (an `if` around
            # them) and upstream re-indented them into another: nesting one in the other is
            # a guess at a conflict (issue 37), git conflicts too.
            return None
        near = i1 if i1 < len(base) else i1 - 1
        if near < 0 or near not in theirs_of:
            if j2 > j1:
                return None
            continue
        old, new = indent(base[near]), indent(theirs_of[near])
        for line in ours[j1:j2]:
            if not line.strip():
                out.append(line)
            elif line.startswith(old) and (new.startswith(old) or old.startswith(new)):
                out.append(new + line[len(old):])
            else:
                return None
    out += inserted.get(len(base), [])
    return out


def _unowned(s: _Span, moved: int, theirs: str, merged: str) -> HunkFate:
    """The fate of a hunk that owns no region of the merge (merge3 yields no region for the same
    deletion on both sides; with repeated lines the alignment may give a hunk's change to a
    neighbour's region). Never "applied" when the result is the target unchanged, nor when the
    target has its new side and not its old one (upstream); applied when the result reads as its
    new side; else its change is lost, which only a person can settle: a conflict."""
    header = _hunk_header(s.hunk)
    stated = s.base_start + moved
    reverse = s.hunk.reversed()

    def fits(hunk: diffs.Hunk, text: str) -> int:
        if not hunk.old_lines:
            return -1
        return diffs._Source(text).place(hunk, stated, 0, diffs.DEFAULT_MAX_OFFSET, False)

    new_in_theirs = fits(reverse, theirs)
    if merged == theirs or (new_in_theirs >= 0 and fits(s.hunk, theirs) < 0):
        at = new_in_theirs if new_in_theirs >= 0 else None
        return HunkFate(s.index, header, UPSTREAM, None if at is None else at + 1, moved,
                        "already upstream: the target release already reads as its new side "
                        "(the merge changes nothing for it)")
    if all(tag != "+" for tag, _ in s.hunk.lines) and fits(s.hunk, theirs) < 0 and not any(
            _near(run, theirs, stated) for run in _runs(s.hunk, "-")):
        return HunkFate(s.index, header, UPSTREAM, None, moved,
                        "already upstream: the target release does not have the lines it "
                        "removes")
    at = fits(reverse, merged)
    if at >= 0 or not reverse.old_lines:
        return HunkFate(s.index, header, APPLIED, at + 1 if at >= 0 else None, moved,
                        "merged, context unchanged (its change aligned with a neighbouring "
                        "hunk's)")
    return HunkFate(s.index, header, CONFLICT, detail="the merge did not carry its change and "
                    "the target does not have it: resolve by hand")


def _runs(hunk: diffs.Hunk, tag: str) -> list[list[str]]:
    """The runs of consecutive ``tag`` lines of a hunk."""
    runs: list[list[str]] = []
    previous = ""
    for t, text in hunk.lines:
        if t == tag:
            if previous != tag:
                runs.append([])
            runs[-1].append(text)
        previous = t
    return runs


def _near(run: list[str], text: str, line: int) -> bool:
    """Whether the lines ``run`` occur in ``text`` within the diff window of 0-based ``line``."""
    keys = diffs._Source(text).keys
    lo = max(0, line - diffs.DEFAULT_MAX_OFFSET)
    hi = min(len(keys) - len(run), line + diffs.DEFAULT_MAX_OFFSET)
    return any(keys[p:p + len(run)] == run for p in range(lo, hi + 1))


def _offset_at(syncs: Sequence[tuple[int, ...]], base_line: int) -> int:
    """Theirs minus base at ``base_line``, read from the sync regions (lines all three share): a
    hunk that owns no merge region of its own (with repeated lines, the alignment may put its
    change in a neighbour's region, e.g. a deletion at the end read as an insertion at the top)
    still gets how far its place moved."""
    moved = 0
    for z1, _z2, _a1, _a2, b1, _b2 in syncs:
        if z1 > base_line:
            break
        moved = b1 - z1
    return moved


def _owners(spans: list[_Span], a1: int, a2: int) -> list[_Span]:
    """Hunks whose new side (in ours) overlaps ours[a1:a2] (a point when a1 == a2)."""
    if a1 == a2:
        return [s for s in spans if s.ours_start <= a1 <= s.ours_end][:1]
    return [s for s in spans if s.ours_start < a2 and a1 < s.ours_end]


def _block(out: list[str], marker: str, lines: Sequence[str], eol: str) -> None:
    if out and not out[-1].endswith("\n"):
        out[-1] += eol  # a side's last line without newline: markers stay on lines of their own
    out.append(marker + eol)
    out.extend(lines)
    if out and not out[-1].endswith("\n"):
        out[-1] += eol


# -- Sources -------------------------------------------------------------------------------------


_opened: dict[str, packages.Source] = {}  # one reading of each wheel per process (several patches)


def open_release(where: str, option: str = "--to") -> packages.Source:
    """``installed``, a ``NAME==VERSION`` release (the installed files when that release is the
    one installed here, else the wheel, downloaded and cached), or a path."""
    if where not in _opened:
        if where == "installed":
            _opened[where] = packages.InstalledSource()
        else:
            _opened[where] = packages.open_source(where, option=option)
    return _opened[where]


def release_label(source: packages.Source, top: str) -> str:
    found = authoring.release_of(source, top)
    return f"{found[0]}=={found[1]}" if found else source.label


# -- The whole patch ---------------------------------------------------------------------------


@dataclasses.dataclass
class FileReport:
    module: str
    path: str  # repository path in the target
    how: str  # applied | merged | conflict | missing
    hunks: list[HunkFate]
    conflicts: list[Conflict]
    work_file: str | None = None  # the merged file with markers (conflict only)
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Report:
    patch: str
    base: str  # release (or label) of the base
    target: str
    files: list[FileReport]
    out: str | None = None  # where the rebased diff was written (clean), else None
    work: str | None = None  # the work folder holding conflicts
    requires_before: list[str] = dataclasses.field(default_factory=list)
    requires_after: list[str] = dataclasses.field(default_factory=list)
    requires_why: str = ""
    diff: str = ""  # the rebased diff text (clean only)

    @property
    def status(self) -> str:
        return CLEAN if all(f.how in (APPLIED, MERGED) for f in self.files) else CONFLICT

    @property
    def exit_status(self) -> int:
        return 0 if self.status == CLEAN else 1

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["files"] = [f.to_json() for f in self.files]
        out["status"] = self.status
        out["exit_status"] = self.exit_status
        return out


def rebase(
    name: str,
    to: str,
    base: str | None = None,
    *,
    work: str | None = None,
    out: str | None = None,
    dry_run: bool = False,
    force: bool = False,
) -> Report:
    require_merge3()
    patch = authoring.find_patch(name)
    if patch is None:
        raise packages.UsageError(f"unknown patch name: {name}", "see 'importpatch list'")
    ops = authoring.diff_ops(patch)
    if base is None and not patch.base:
        raise packages.UsageError(
            f"patch {name} has no 'Base:' header: the release its diff was made against is "
            "unknown", "pass --base WHEEL|SDIST|DIR|NAME==VERSION (that release)")
    base_source = open_release(base or str(patch.base), "--base")
    target = open_release(to)
    top = ops[0].modules[0].partition(".")[0]
    base_label = patch.base if base is None and patch.base else release_label(base_source, top)
    target_release = authoring.release_of(target, top)
    target_label = release_label(target, top)
    labels = Labels(target_label, f"{base_label} (base)", f"{name} (your change)")

    files: list[FileReport] = []
    texts: list[tuple[str, str, str, str]] = []  # (repo path, module, theirs, merged)
    bases: dict[str, str] = {}
    new_files: set[str] = set()  # modules the patch adds that the target does not have
    for op in ops:
        assert op.file_patch is not None
        fp = op.file_patch
        found_base = _find(base_source, op.modules)
        found_target = _find(target, op.modules)
        if fp.created:
            # A module the patch adds: merged from empty text, onto the target's module of that
            # name if it has one (the same text: already upstream; other text: a conflict).
            module, rel = op.modules[0], fp.path
            theirs = ""
            if found_target is not None:
                module, file = found_target
                rel, theirs = packages.module_path(module, file), target.text(file)
            else:
                new_files.add(rel)
            merged = merge_file("", theirs, fp, labels)
            files.append(FileReport(module, rel, merged.how, merged.hunks, merged.conflicts,
                                    detail="a new module" if found_target is None else
                                    "a new module; the target has one of that name"))
            texts.append((rel, module, theirs, merged.text))
            continue
        if found_base is None:
            raise packages.UsageError(
                f"{fp.path} is not in the base {base_label} ({base_source.label})",
                "--base must be the release the diff was made against")
        if found_target is None:
            files.append(FileReport(op.modules[0], fp.path, "missing", [], [],
                                    detail=f"no module {' / '.join(op.modules)} in "
                                           f"{target.label}"))
            continue
        module, file = found_target
        rel = packages.module_path(module, file)
        theirs = target.text(file)
        base_text = base_source.text(found_base[1])
        try:
            merged = merge_file(base_text, theirs, fp, labels)
        except NotApplicable as exc:
            raise packages.UsageError(
                f"the diff of {name} does not apply to its base {base_label}: {exc}",
                "is the Base: header (or --base) the release the diff was made on?") from None
        if packages.module_path(*found_base) == rel:
            # The base release has the file at the path the rebased diff names; a module that
            # moved (found through candidates) is not found there by that diff.
            bases[rel] = base_text
        # Clean where git conflicts (a region only re-indented upstream): said, to review.
        note = merged.checked if merged.checked.startswith("git merge-file conflicts") else ""
        files.append(FileReport(module, rel, merged.how, merged.hunks, merged.conflicts,
                                detail=note))
        texts.append((rel, module, theirs, merged.text))

    report = Report(name, base_label, target_label, files,
                    requires_before=list(patch.requires))
    preamble = authoring.patch_preamble(patch)
    new_base = f"{target_release[0]}=={target_release[1]}" if target_release else None
    if report.status == CLEAN:
        body = "".join(diffs.make_diff(None if rel in new_files else theirs, merged, rel)
                       for rel, _, theirs, merged in texts)
        requires, why = requires_after(patch, top, base_label, new_base, body, bases)
        report.requires_after, report.requires_why = requires, why
        header = authoring.set_header(preamble or authoring.new_header(name, None, None, ""),
                                      "Base", new_base)
        header = authoring.set_header(header, "Requires", "; ".join(requires) or None)
        header = header if header.endswith("\n\n") or not header else header.rstrip("\n") + "\n\n"
        report.diff = header + body
        if not body:
            report.diff = ""
        if not dry_run and body:
            own = authoring.own_diff_file(patch)
            if why.startswith("narrowed"):
                # The deployed file still serves releases the rebased diff does not apply to:
                # never replaced unless --out says so.
                own = None
            target_path = out or own or os.path.join(
                authoring.session_folder(name, work), f"{name}.diff")
            deployed = authoring.own_diff_file(patch)
            if not out and deployed and own is None:
                report.requires_why += (f"; so written to the work folder, not over {deployed} "
                                        "(--out FILE to choose)")
            if out and os.path.isdir(out):
                target_path = os.path.join(out, f"{name}.diff")
            authoring.write_or_explain(target_path, report.diff)
            report.out = target_path
        return report
    # Conflict (or a module missing in the target): leave the merge in the work folder.
    if dry_run:
        return report
    folder = authoring.session_folder(name, work)
    old = authoring.Session.load(folder)
    if old is not None and old.unsaved() and not force:
        raise packages.UsageError(
            f"work folder {folder} holds unsaved edits ({', '.join(old.unsaved())})",
            f"'importpatch save {name}' them first, or pass --force to replace them")
    if old is not None:
        import shutil

        shutil.rmtree(folder)
    session = authoring.Session(
        name, folder, base=new_base, package=top, source=target.label, header=preamble,
        patch_file=authoring.own_diff_file(patch),
        note=f"rebase of {name} from {base_label} to {target_label}",
    )
    session.missing = {f.path: f.detail for f in files if f.how == "missing"}
    by_rel = {f.path: f for f in files}
    for rel, module, theirs, merged_text in texts:
        authoring.write_text(session.path(authoring.ORIG, rel), theirs)
        authoring.write_text(session.path(authoring.EDIT, rel), merged_text)
        session.files[rel] = module
        by_rel[rel].work_file = session.path(authoring.EDIT, rel)
    session.write()
    report.work = folder
    return report


def _find(source: packages.Source, modules: Sequence[str]) -> tuple[str, str] | None:
    for module in modules:
        file = source.find(module)
        if file is not None:
            return module, file
    return None


def requires_after(
    patch: declare.Patch, top: str, base_label: str, new_base: str | None, body: str,
    bases: dict[str, str],
) -> tuple[list[str], str]:
    """``Requires`` of the rebased diff, and why. One file per patch, the requirement telling
    the truth: the rebased diff is tried on the base release too. If it still applies there and
    the old ``Requires`` admits the target, the old one is kept; if it applies there, the old
    range is extended to the target's minor series (widened: never narrower than the old one, so
    no release the diff was good for is dropped, whichever way the rebase goes); otherwise it
    covers the target's series only, and the reason starts with "narrowed" (``rebase`` then
    writes it beside the old file, which still serves the old releases, unless told where)."""
    from packaging.version import Version

    new_spec = releases.parse_spec(new_base) if new_base else None
    old_spec = releases.parse_spec(base_label)
    if new_spec is None:
        return list(patch.requires), "target version unknown: Requires kept"
    new_version = new_spec[1]
    applies_to_base = True
    for fp in diffs.parse(body).files:
        try:
            diffs.apply(bases[fp.path], fp)
        except (KeyError, diffs.HunkMismatch):
            applies_to_base = False
    ours = [r for r in patch.requires if authoring.names_package(r, top)]
    if applies_to_base and ours and authoring.admits(ours, top, new_version):
        return list(patch.requires), ("kept: it admits the target and the rebased diff still "
                                      "applies to the base")
    target_series = authoring.minor_series(top, new_version)
    if applies_to_base and old_spec is not None:
        lo, hi = sorted((old_spec[1], new_version), key=Version)
        low_bound = authoring.minor_series(top, lo).split(",")[0]
        high_bound = authoring.minor_series(top, hi).split(",")[1]
        joined = f"{low_bound},{high_bound}"
        if len(ours) == 1:
            extended = _extend(ours[0], joined)
            if extended is not None:
                others = [r for r in patch.requires if r not in ours]
                return [extended, *others], (
                    f"widened: the rebased diff applies to both {base_label} and {new_base}; "
                    f"{ours[0]} extended to admit {new_base}")
        return [joined], ("widened: the rebased diff applies to both "
                          f"{base_label} and {new_base}")
    dropped = f"{'; '.join(patch.requires)}" if patch.requires else base_label
    return [target_series], (f"narrowed to the target's series: the rebased diff does not apply "
                             f"to {base_label} (the old diff still serves {dropped}: keep its "
                             "file for those releases)")


def _extend(requirement: str, joined: str) -> str | None:
    """``requirement`` (one package, ``>=``/``>``/``<``/``<=`` bounds only) with its range
    stretched to cover ``joined`` (``pkg>=A,<B``); None when it has other clauses (``!=``,
    ``==``, ``~=``: a union of those is no PEP 440 specifier)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    old, add = Requirement(requirement), Requirement(joined)
    if old.marker is not None or old.extras or any(
            s.operator not in (">=", ">", "<", "<=") for s in old.specifier):
        return None
    lows = [s for s in old.specifier if s.operator in (">=", ">")]
    highs = [s for s in old.specifier if s.operator in ("<", "<=")]
    (add_low,) = [s for s in add.specifier if s.operator == ">="]
    (add_high,) = [s for s in add.specifier if s.operator == "<"]
    clauses = []
    if lows:  # no lower bound stays none
        low = max(lows, key=lambda s: Version(s.version))
        clauses.append(str(add_low) if Version(add_low.version) < Version(low.version) or (
            low.operator == ">" and Version(add_low.version) == Version(low.version)) else str(low))
    if highs:
        high = min(highs, key=lambda s: Version(s.version))
        clauses.append(str(add_high) if Version(add_high.version) > Version(high.version) or (
            high.operator == "<=" and Version(add_high.version) == Version(high.version))
            else str(high))
    return old.name + ",".join(clauses)
