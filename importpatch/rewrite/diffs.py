"""Parse unified diffs (as ``git diff`` writes them) and apply them to source text.

The diffs are made in a checkout of a target package and applied, in memory, to
the text of the installed module, so this module is deliberately strict: a hunk
either fits exactly (every context and removed line equal) where ``git apply``
would put it, at or near its stated position, or applying fails with an
explanation of every failing hunk (see "applying" below).  There is no fuzz.

The diff text is parsed by ``importpatch.discover.diffparse`` (declaring a diff patch parses it,
so a malformed one fails at declaration); its names are re-exported here, and both keep its line
model (split on ``"\\n"`` only, a line's one trailing ``"\\r"`` is its ending, the final newline
tracked apart). This module places and applies the parsed hunks, and writes diffs (``make_diff``).
"""

from __future__ import annotations

import difflib

from importpatch.discover.diffparse import (
    DEFAULT_MAX_OFFSET,
    DiffError,
    FilePatch,
    Hunk,
    ModeChange,
    ParsedDiff,
    module_name,
    old_range_start,
    parse,
    require_context,
)

__all__ = [
    "DEFAULT_MAX_OFFSET",
    "DiffError",
    "FilePatch",
    "Hunk",
    "HunkMismatch",
    "ModeChange",
    "ParsedDiff",
    "apply",
    "make_diff",
    "module_name",
    "parse",
    "require_context",
]


# Kinds of HunkMismatch, from the most to the least telling.
ALREADY_APPLIED = "already-applied"  # the hunk's new side is where its old side was expected
ANCHORED = "anchored"  # the old side fits exactly, but not at the file's start/end it is bound to
BEYOND_WINDOW = "beyond-window"  # the old side fits exactly, farther than max_offset lines away
MISMATCH = "mismatch"  # a line of the old side differs, and it fits nowhere in the window
NEWLINE = "newline"  # the lines are there; the final newline (or its absence) is not
NO_PLACE = "no-place"  # a hunk without old-side lines (an insertion) has no valid place
ORDER = "order"  # the old side is there, but before the previous hunk's place

# Below this share of equal telling old-side lines (those with a letter or digit), the
# best-aligned place in the source is not offered as the hunk's "closest fit". Chosen on vLLM's
# history (scripts/eval/diff_corpus.py --floor: 1,490 failing hunks of two samples): at 0.2 about
# 84% of the places offered are where the hunk's code went (61-65% with no floor) and 92-93% of the
# right places are still offered; higher floors buy little precision for much recall.
NEAREST_FLOOR = 0.2
# How many failing hunks one message names (``check`` lists all of them).
MESSAGE_HUNKS = 5


class HunkMismatch(Exception):
    """A hunk's context/removed lines are not in the source (within the offset bound).

    ``apply`` raises the first failing hunk's HunkMismatch, with every other failing hunk of the
    file in ``others`` (each placed as GNU patch would, after skipping the failed ones), so its
    message names them all.

    Attributes: ``path``, ``hunk_index`` (1-based), ``header`` (the ``@@`` line), ``kind`` (one
    of the kinds above), ``expected`` (first mismatching expected line; ``"<end of file>"`` when
    the diff says the file ends there; ``""`` for a blank line or, with kind ``no-place``, for a
    hunk with no old-side lines), ``line`` (1-based source line where it was expected: at the
    hunk's anchor, else at its stated position adjusted by earlier hunks' offsets), ``actual``
    (that source line, None past EOF), ``nearest`` (1-based source line where the hunk's old side
    fits best by count of equal lines; None if that is below ``NEAREST_FLOOR``),
    ``nearest_score`` (fraction of the old-side lines with a letter or digit that are equal
    there, 0..1, also when below the floor; see _telling),
    ``fit`` (for ``anchored``/``beyond-window``: the line where the old side fits exactly; for
    ``already-applied``: where the new side is), ``reason`` (extra explanation, may be empty),
    ``max_offset``, ``others`` and ``hunk_count`` (hunks in the file).
    """

    def __init__(
        self,
        path: str,
        hunk_index: int,
        header: str,
        expected: str,
        line: int,
        actual: str | None,
        nearest: int | None,
        nearest_score: float,
        reason: str = "",
        max_offset: int = DEFAULT_MAX_OFFSET,
        kind: str = MISMATCH,
        fit: int | None = None,
        others: tuple[HunkMismatch, ...] = (),
        hunk_count: int = 1,
    ) -> None:
        super().__init__(
            path, hunk_index, header, expected, line, actual, nearest, nearest_score,
            reason, max_offset, kind, fit, others, hunk_count,
        )  # fmt: skip
        self.path = path
        self.hunk_index = hunk_index
        self.header = header
        self.expected = expected
        self.line = line
        self.actual = actual
        self.nearest = nearest
        self.nearest_score = nearest_score
        self.reason = reason
        self.max_offset = max_offset
        self.kind = kind
        self.fit = fit
        self.others = others
        self.hunk_count = hunk_count

    def in_file(self, others: tuple[HunkMismatch, ...], hunk_count: int) -> HunkMismatch:
        """This hunk's mismatch as one of ``hunk_count`` hunks, with the ``others`` failing."""
        return HunkMismatch(
            self.path, self.hunk_index, self.header, self.expected, self.line, self.actual,
            self.nearest, self.nearest_score, self.reason, self.max_offset, self.kind, self.fit,
            others, hunk_count,
        )  # fmt: skip

    @property
    def failures(self) -> tuple[HunkMismatch, ...]:
        """Every failing hunk of the file, this one first."""
        return (self, *self.others)

    @property
    def all_applied(self) -> bool:
        """Every hunk of the file is already applied: the whole change is upstream."""
        failures = self.failures
        return len(failures) == self.hunk_count and all(
            f.kind == ALREADY_APPLIED for f in failures
        )

    def describe(self) -> str:
        """Why this hunk does not apply, as a predicate of "hunk #N '@@ ... @@'" (``check``
        prints it under the hunk's name)."""
        if self.kind == ALREADY_APPLIED:
            return (
                f"is already applied: its new side is at line {self.fit} (the reversed hunk "
                "fits there)"
            )
        if self.kind == BEYOND_WINDOW:
            assert self.fit is not None
            distance = abs(self.fit - self.line)
            return (
                f"does not apply within {self.max_offset} lines of its stated line {self.line}: "
                f"its old side fits exactly at line {self.fit}, {distance} lines away. If that is "
                f"the place, allow it with 'Max-Offset: {distance}' in the diff's header "
                f"(Patch.diff(..., max_offset={distance})), or make the diff again against this "
                "version"
            )
        if self.kind == ORDER and self.fit is not None:
            distance = self.line - self.fit
            side = "before" if distance >= 0 else "after"
            return (
                f"does not apply after the previous hunk: its old side fits exactly at line "
                f"{self.fit}, {abs(distance)} lines {side} its stated line {self.line}, but "
                f"{self.reason}. Was the code moved upstream, or the previous hunk placed at the "
                "wrong one of two equal places? Make the diff again against this version"
            )
        if self.kind == NO_PLACE:
            where = f"after line {self.line - 1}" if self.line > 1 else "at the top"
            return f"cannot be placed: an insertion cannot go {where} ({self.reason})"
        found = "end of file" if self.actual is None else repr(self.actual)
        wanted = {"": "a blank line", "<end of file>": "the end of the file"}.get(
            self.expected, repr(self.expected)
        )
        if self.kind == ANCHORED:
            text = f"does not apply: {self.reason}: at line {self.line} expected {wanted} "
            text += f"but found {found}"
            if self.fit is not None:
                return text + f"; its old side fits exactly at line {self.fit}"
            if self.expected == "<end of file>":
                return text  # its lines are there, the file goes on after them
        else:
            if self.kind == MISMATCH:
                where = f"at its stated position or within {self.max_offset} lines of it"
            else:
                where = "at its stated position"
            text = f"does not apply {where}: at line {self.line} expected {wanted} "
            text += f"but found {found}"
            if self.reason:
                text += f" ({self.reason})"
            if self.kind != MISMATCH:
                return text
        if self.nearest is not None:
            return text + (
                f"; the closest fit in the whole source starts at line {self.nearest} "
                f"({self.nearest_score:.0%} of its old-side lines with a letter or digit "
                "match there)"
            )
        return text + (
            "; no place in the source resembles its old side "
            f"(at most {self.nearest_score:.0%} of its old-side lines with a letter or digit "
            "match anywhere)"
        )

    def message(self, version: str | None = None) -> str:
        """The whole explanation for the file: every failing hunk (up to MESSAGE_HUNKS), and
        whether the change is already upstream. ``version`` ('vllm 0.33.0') is named in it."""
        where = f" ({version})" if version else ""
        failures = self.failures
        applied = [f for f in failures if f.kind == ALREADY_APPLIED]
        if self.all_applied:
            places = ", ".join(f"#{f.hunk_index} at line {f.fit}" for f in failures)
            return (
                f"{self.path}: already applied in this version{where} — remove the patch or "
                f"bound its Requires (the new side of every hunk is there: {places})"
            )
        shown = [f"hunk #{f.hunk_index} {f.header!r} {f.describe()}" for f in failures]
        if len(failures) == 1:
            text = f"{self.path}: {shown[0]}"
        else:
            text = f"{self.path}: {len(failures)} of {self.hunk_count} hunks do not apply: "
            text += "; ".join(shown[:MESSAGE_HUNKS])
            if len(shown) > MESSAGE_HUNKS:
                text += f"; and {len(shown) - MESSAGE_HUNKS} more ('importpatch check' lists all)"
        if applied:
            numbers = ", ".join(f"#{f.hunk_index}" for f in applied)
            text += (
                f" — hunk(s) {numbers} already applied in this version{where} and the others "
                "not: the change is partly upstream; drop the applied hunks or bound the "
                "patch's Requires"
            )
        return text if text.endswith(".") else text + "."

    def __str__(self) -> str:
        return self.message()


# --------------------------------------------------------------------------- applying
#
# Placement is git apply's (apply.c, apply_one_fragment / find_pos / match_fragment) and GNU
# patch's (locate_hunk) wherever they agree, with a bounded search:
#
# * A hunk whose old side starts at line 1 (or 0: an insertion at the top) must match at the
#   start of the file; one with no context after its last change must end at the end of the
#   file (git's match_beginning / match_end: without them, an insertion at the top lands after a
#   newly added first line, and code appended at the end of a file lands before newer code).
#   Anchored hunks are tried at their anchor only, at any distance.
# * Other hunks are tried at their stated line shifted by the previous hunk's offset, then at
#   +1, -1, +2, -2, ... up to max_offset: on a tie the later place wins, as in both tools.
# * Hunks do not overlap and stay in order (GNU patch's last_frozen_line).
# * Hunks without any context line say nothing about their place: they are refused unless the
#   file patch is marked unidiff_zero (git apply --unidiff-zero), which also drops both anchors
#   but an insertion at line 0.


def _anchors(hunk: Hunk, unidiff_zero: bool) -> tuple[bool, bool]:
    """(must match at the start, must match at the end), as git apply decides them."""
    if unidiff_zero:
        return hunk.old_start == 0, False
    return hunk.old_start <= 1, hunk.trailing == 0


def _position_fits(keys: list[str], final_nl: bool, old: list[str], hunk: Hunk, p: int) -> bool:
    """Whether the hunk's old side is exactly at 0-based line p of the source."""
    n, length = len(keys), len(old)
    if length and keys[p] != old[0]:  # cheap reject first: most candidates fail here
        return False
    if keys[p : p + length] != old:
        return False
    at_eof = p + length == n
    if (hunk.old_eof_no_newline or hunk.new_eof_no_newline) and not at_eof:
        return False  # the marker pins the hunk to the end of the file
    # No fuzz on the final newline either: a hunk that touches the last line
    # must agree with the source about whether it ends with a newline.
    return not (at_eof and n and final_nl == hunk.old_eof_no_newline)


class _Source:
    """A source text split once: lines, comparison keys, final newline."""

    def __init__(self, source: str) -> None:
        # pieces[i] is line i without its '\n' (a CRLF line keeps its '\r').
        pieces = source.split("\n")
        self.final_nl = pieces[-1] == ""
        if self.final_nl:
            pieces.pop()
        self.pieces = pieces
        self.keys = (
            pieces if "\r" not in source else [p[:-1] if p.endswith("\r") else p for p in pieces]
        )
        crlf = source.count("\r\n")
        self.eol = "\r" if crlf > source.count("\n") - crlf else ""

    def fits(self, hunk: Hunk, old: list[str], p: int) -> bool:
        return 0 <= p <= len(self.keys) - len(old) and _position_fits(
            self.keys, self.final_nl, old, hunk, p
        )

    def place(
        self, hunk: Hunk, stated: int, lo: int, max_offset: int, unidiff_zero: bool
    ) -> int:
        """0-based line where the hunk's old side goes, or -1 (see the rules above)."""
        old = hunk.old_lines
        n, length = len(self.keys), len(old)
        at_start, at_end = _anchors(hunk, unidiff_zero)
        if at_start or at_end:
            p = 0 if at_start else n - length
            if at_end and p + length != n:
                return -1
            return p if p >= lo and self.fits(hunk, old, p) else -1
        hi = n - length
        for d in range(max_offset + 1):
            if stated - d < lo and stated + d > hi:
                break  # every further candidate is out of range on both sides
            for p in (stated + d, stated - d) if d else (stated,):
                if lo <= p <= hi and self.fits(hunk, old, p):
                    return p
        return -1

    def votes(self, old: list[str], counted: list[int]) -> dict[int, int]:
        """For each 0-based start, how many of the old-side lines at indexes ``counted`` equal
        the source there; O(n + hits): each source line votes for every start that aligns it
        with an equal counted line."""
        where: dict[str, list[int]] = {}
        for i in counted:
            where.setdefault(old[i], []).append(i)
        last_start = max(len(self.keys) - len(old), 0)
        votes: dict[int, int] = {}
        for j, key in enumerate(self.keys):
            for i in where.get(key, ()):
                p = j - i
                if 0 <= p <= last_start:
                    votes[p] = votes.get(p, 0) + 1
        return votes


def _telling(line: str) -> bool:
    """Whether a line says anything about a place: blank lines and lines of brackets and
    punctuation occur everywhere, so they neither make nor break a "closest fit"."""
    return any(c.isalnum() for c in line)


def _nearest_first(positions: list[int], stated: int) -> list[int]:
    """Nearest to ``stated`` first; on a tie the later place, as placement decides ties."""
    return sorted(positions, key=lambda p: (abs(p - stated), -p))


def _explain(
    src: _Source, patch: FilePatch, index: int, hunk: Hunk, stated: int, lo: int, max_offset: int
) -> tuple[HunkMismatch, int, int]:
    """Why the hunk does not fit; with, for an already-applied hunk, where its new side is (the
    0-based start and length, so later hunks are placed after it), else (-1, 0)."""
    keys, n = src.keys, len(src.keys)
    old = hunk.old_lines
    length = len(old)
    at_start, at_end = _anchors(hunk, patch.unidiff_zero)

    def mismatch(
        kind: str, expected: str, line: int, actual: str | None, reason: str = "",
        fit: int | None = None, nearest: int | None = None, score: float = 0.0,
    ) -> HunkMismatch:
        return HunkMismatch(
            patch.path, index, hunk.header, expected, line, actual, nearest, score, reason,
            max_offset, kind, fit,
        )  # fmt: skip

    reverse = hunk.reversed()
    if reverse.old_lines:  # an empty new side would "fit" anywhere
        back = src.place(reverse, stated, lo, max_offset, patch.unidiff_zero)
        if back >= 0:
            expected = old[0] if old else ""
            actual = keys[back] if back < n else None
            return mismatch(ALREADY_APPLIED, expected, back + 1, actual, fit=back + 1), back, (
                len(reverse.old_lines)
            )

    # Places are scored by the telling lines of the old side alone (see _telling and
    # NEAREST_FLOOR); a place where all of them are equal is checked for an exact fit.
    telling = [i for i, line in enumerate(old) if _telling(line)] or list(range(length))
    votes = src.votes(old, telling)
    full = [q for q, count in votes.items() if count == len(telling)]
    exact = _nearest_first([q for q in full if q >= lo and src.fits(hunk, old, q)], max(stated, 0))

    # Where the old side was expected: at the anchor, else at the stated position. A hunk bound
    # to the end of the file whose lines are elsewhere is explained where they are: the file
    # goes on after them.
    if at_start:
        p = 0
    elif at_end:
        p = exact[0] if exact else max(n - length, 0)
    else:
        p = max(stated, 0)
    end = p + length
    differs = next((q for q in range(p, end) if q >= n or keys[q] != old[q - p]), None)
    if differs is None and not old and (p > n or p < lo or (p and p == n and not src.final_nl)):
        if p > n:
            why = f"the source has only {n} lines"
        elif p < lo:
            why = "that is inside the previous hunk's lines"
        else:
            why = "the source does not end with a newline, so nothing can follow its last line"
        return mismatch(NO_PLACE, "", p + 1, keys[p] if p < n else None, why), -1, 0
    if differs is None and p < lo:
        return mismatch(ORDER, old[0], p + 1, keys[p], "that overlaps the previous hunk"), -1, 0
    if differs is None and not (at_end and end != n):
        # The lines are there; the final newline (or the marker pinning it) is not.
        if (hunk.old_eof_no_newline or hunk.new_eof_no_newline) and end != n:
            why = "the diff's '\\ No newline at end of file' says the file ends here"
            return mismatch(NEWLINE, "<end of file>", end + 1, keys[end], why), -1, 0
        if hunk.old_eof_no_newline:
            why = "the diff says this last line has no newline, the source has one"
        else:
            why = "the diff says this last line ends with a newline, the source has none"
        return mismatch(NEWLINE, old[-1], end, keys[end - 1], why), -1, 0

    if differs is None:  # anchored to the end, and the file goes on
        expected, line, actual = "<end of file>", end + 1, keys[end] if end < n else None
    else:
        expected, line = old[differs - p], differs + 1
        actual = keys[differs] if differs < n else None
    fit = next((q + 1 for q in exact if q != p), None)
    nearest, score = None, 0.0
    if votes and any(_telling(line) for line in old):
        best = min(votes, key=lambda q: (-votes[q], abs(q - stated), -q))
        score = votes[best] / len(telling)
        nearest = best + 1 if score >= NEAREST_FLOOR else None
    if at_start or at_end:
        if at_start:
            why = (
                f"its old side starts at line {hunk.old_start}, so it must match at the start of "
                "the file (as git apply places it)"
            )
        else:
            why = (
                "it has no context after its last change, so it must end at the end of the "
                f"file, line {n} (as git apply places it)"
            )
        if not hunk.leading and not hunk.trailing:
            why += "; it has no context lines at all (a diff made with 'git diff -U0'?)"
        return mismatch(ANCHORED, expected, line, actual, why, fit, nearest, score), -1, 0
    if fit is not None and abs(fit - 1 - stated) > max_offset:
        return mismatch(BEYOND_WINDOW, expected, stated + 1, actual, "", fit, nearest, score), -1, 0
    if fit is None and old:
        # Its old side is there, but only before the end of the previous hunk's place: say where.
        before = _nearest_first([q for q in full if q < lo and src.fits(hunk, old, q)], stated)
        if before:
            why = (f"the previous hunk's lines end at line {lo}, and hunks stay in order and "
                   "never overlap")
            return mismatch(ORDER, expected, stated + 1, actual, why, before[0] + 1, nearest,
                            score), -1, 0
    return mismatch(MISMATCH, expected, line, actual, "", None, nearest, score), -1, 0


def _reverse_places(src: _Source, patch: FilePatch, max_offset: int) -> list[int] | None:
    """Where each hunk's new side is, placing the reversed diff as apply places a diff; None
    when it does not apply whole."""
    places: list[int] = []
    done = delta = 0
    for hunk in patch.hunks:
        reverse = hunk.reversed()
        stated = old_range_start(reverse) + delta
        pos = src.place(reverse, stated, done, max_offset, patch.unidiff_zero)
        if pos < 0 or not reverse.old_lines:
            return None
        places.append(pos)
        delta = pos - old_range_start(reverse)
        done = pos + reverse.old_len
    return places


BOM = "\ufeff"
_UNBOUNDED = 1 << 62  # a max_offset no file reaches: place() stops at both ends of the file


def apply(source: str, patch: FilePatch, *, max_offset: int | None = None) -> str:
    """Return ``source`` with ``patch`` applied, or raise ``HunkMismatch`` (or ``DiffError``
    for a hunk without context, see ``require_context``). See ``_apply``."""
    if not source.startswith(BOM) and any(
        old_range_start(h) == 0 and h.old_lines and h.old_lines[0].startswith(BOM)
        for h in patch.hunks
    ):
        # git diff shows a file's UTF-8 BOM as part of its first line, and Python's decoding
        # (safefiles.decode_source) drops it from the text: put it back to place the hunks, and
        # take it off the result again.
        return _apply(BOM + source, patch, max_offset=max_offset).removeprefix(BOM)
    if patch.created:
        return _create(source, patch)
    return _apply(source, patch, max_offset=max_offset)


def _create(source: str, patch: FilePatch) -> str:
    """A new file's text, where the module does not exist (``source`` empty); the same file
    there already is ALREADY_APPLIED, another one a MISMATCH saying so."""
    new = patch.new_text()
    if not source:
        return new
    header = patch.hunks[0].header if patch.hunks else "(new empty file)"
    if source.replace("\r\n", "\n") == new:
        raise HunkMismatch(patch.path, 1, header, "", 1, None, None, 0.0, kind=ALREADY_APPLIED,
                           fit=1)
    first = source.split("\n", 1)[0]
    raise HunkMismatch(patch.path, 1, header, "<end of file>", 1, first, None, 0.0,
                       reason="the patch adds this module as a new file, and this version has "
                              "a module of that name with other text",
                       kind=ANCHORED)


def _apply(source: str, patch: FilePatch, *, max_offset: int | None = None) -> str:
    """``apply``.

    Hunks are located in the *original* source, in order, each no earlier than the end of the
    previous one, by the placement rules above; ``max_offset`` (default: the patch's own)
    bounds the search. When a hunk does not fit, the later ones are still placed (after the
    last hunk that did), so the error names every failing hunk. Context lines are copied from
    the source so each keeps its own line ending; added lines get the source's dominant ending.
    """
    if max_offset is None:
        max_offset = patch.max_offset
    if max_offset < 0:
        raise ValueError("max_offset must be >= 0")
    require_context(patch)
    src = _Source(source)
    pieces, n = src.pieces, len(src.pieces)

    placed: list[tuple[Hunk, int]] = []
    failures: list[HunkMismatch] = []
    done = 0  # source lines [0, done) are taken by earlier hunks
    delta = 0
    for index, hunk in enumerate(patch.hunks, 1):
        stated = old_range_start(hunk) + delta
        pos = src.place(hunk, stated, done, max_offset, patch.unidiff_zero)
        if pos >= 0:
            placed.append((hunk, pos))
            delta = pos - old_range_start(hunk)
            done = pos + hunk.old_len
            continue
        mismatch, back, length = _explain(src, patch, index, hunk, stated, done, max_offset)
        failures.append(mismatch)
        if back >= 0:  # already applied: its new side takes the place of its old side
            delta = back - old_range_start(hunk)
            done = back + length
    if failures:
        count = len(patch.hunks)
        # A hunk can fit both ways (its old and new sides both occur): if the whole reversed
        # diff applies, as git apply -R would do it, every hunk is already there. Like git
        # apply -R, at any distance: a change that is upstream is that, however far its code
        # moved (beyond the window, a hunk alone is not taken for applied: see _explain).
        places = _reverse_places(src, patch, _UNBOUNDED)
        if places is not None:
            failures = [
                HunkMismatch(
                    patch.path, i, h.header, (h.old_lines or [""])[0], pos + 1,
                    src.keys[pos] if pos < n else None, None, 0.0, "", max_offset,
                    ALREADY_APPLIED, pos + 1,
                )  # fmt: skip
                for i, (h, pos) in enumerate(zip(patch.hunks, places, strict=True), 1)
            ]
        first, *others = (f.in_file((), count) for f in failures)
        raise first.in_file(tuple(others), count)

    out: list[str] = []
    done = 0
    last_terminated = True  # whether the last hunk's last new-side line had an ending
    for hunk, pos in placed:
        out.extend(pieces[done:pos])
        j = pos
        last_terminated = True
        for tag, text in hunk.lines:
            if tag == " ":
                out.append(pieces[j])
                last_terminated = j < n - 1 or src.final_nl
                j += 1
            elif tag == "-":
                j += 1
            else:
                out.append(text + src.eol)
                last_terminated = True
        done = pos + hunk.old_len
    out.extend(pieces[done:])

    ends_with_nl = src.final_nl
    if placed and done == n:
        # The result's tail came from the last hunk, so the diff decides the final newline.
        last_hunk = placed[-1][0]
        ends_with_nl = not last_hunk.new_eof_no_newline
        if not ends_with_nl and last_hunk.new_len and last_terminated and out:
            out[-1] = out[-1].removesuffix("\r")  # drop the CR of a dropped CRLF
    if not out:
        return ""
    return "\n".join(out) + ("\n" if ends_with_nl else "")


# --------------------------------------------------------------------------- helpers


def _split_keepends(text: str) -> list[str]:
    """Lines with their endings, split on '\\n' only (see the module docstring)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _quote_path(path: str) -> str:
    """Quote like git does for characters that would make the header ambiguous."""
    if not any(c in path for c in '"\\\t\n\r') and all(c >= " " for c in path):
        return path
    body = []
    for ch in path:
        if ch in '"\\':
            body.append("\\" + ch)
        elif ch < " " or ch == "\x7f":
            body.append(f"\\{ord(ch):03o}")
        else:
            body.append(ch)
    return '"' + "".join(body) + '"'


def make_diff(old: str | None, new: str, path: str) -> str:
    """A git-style unified diff (3 lines of context) turning ``old`` into ``new``; ``old`` None:
    ``new`` is a new file (``new file mode``, ``--- /dev/null``), as ``git diff`` writes it.

    Returns '' when the texts are equal, as ``git diff`` prints nothing.
    """
    a, b = _split_keepends(old or ""), _split_keepends(new)
    src, dst = _quote_path("a/" + path), _quote_path("b/" + path)
    body = list(difflib.unified_diff(a, b, src, dst))
    out = [f"diff --git {src} {dst}\n"]
    if old is None:
        out.append("new file mode 100644\n")
        if not body:
            return "".join(out)  # an empty new file: no hunk, as git writes it
        body[0] = "--- /dev/null\n"
    elif not body:
        return ""
    for line in body:
        out.append(line)
        if not line.endswith("\n"):
            # Only a file's unterminated last line can lack '\n' here.
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)
