"""Parse unified diffs (as ``git diff`` writes them) and apply them to source text.

The diffs are made in a checkout of a target package and applied, in memory, to
the text of the installed module, so this module is deliberately strict: a hunk
either fits exactly (every context and removed line equal) where ``git apply``
would put it, at or near its stated position, or applying fails with an
explanation of every failing hunk (see "applying" below).  There is no fuzz.

Line model (shared by the parser and the applier, which is what makes them agree):

* Text is split on ``"\\n"`` only.  ``str.splitlines`` is not used because it
  also splits on form feed, ``\\x1c``, ``\\u2028`` and friends, which may occur
  inside a Python source line and which git does not treat as line breaks.
* One trailing ``"\\r"`` of a line belongs to its line ending, not its text.  So a
  CRLF source matches a diff with LF endings, and a diff saved with CRLF endings
  (or the ``\\r`` that ``git diff`` shows for a CRLF file) matches an LF source.
* Whether the last line has a line ending is tracked separately, exactly like
  the ``\\ No newline at end of file`` marker does in the diff.

Only what this library can do in memory is accepted: changes to the content of
``.py`` files, and new files (``--- /dev/null``: a module a patch adds, applied to the
empty text of a module that does not exist).  File deletion, renames, copies, binary and
combined diffs raise ``DiffError`` saying "not supported".  A file's mode is not code: a
mode-only section (``old mode``/``new mode`` and no content, as ``git diff`` writes
for a ``chmod``) is accepted as ``git apply`` accepts it, and listed in
``ParsedDiff.modes`` (with the mode changes of sections that also change content)
for the caller to report; nothing applies it.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

__all__ = [
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
]


class DiffError(ValueError):
    """Malformed or unsupported diff text.

    ``lineno`` is the 1-based line of the diff the message is about (None when
    the error is not about a diff line, e.g. from ``module_name``).
    """

    def __init__(self, message: str, lineno: int | None = None) -> None:
        # Both go to args so the exception pickles and re-raises across processes.
        super().__init__(message, lineno)
        self.message = message
        self.lineno = lineno

    def __str__(self) -> str:
        if self.lineno is None:
            return self.message
        return f"diff line {self.lineno}: {self.message}"


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
# history (scripts/diff_corpus.py --floor: 1,490 failing hunks of two samples): at 0.2 about 84%
# of the places offered are where the hunk's code went (61-65% with no floor) and 92-93% of the
# right places are still offered; higher floors buy little precision for much recall.
NEAREST_FLOOR = 0.2
# How many failing hunks one message names (``check`` lists all of them).
MESSAGE_HUNKS = 5
DEFAULT_MAX_OFFSET = 200


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


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` hunk.

    Invariants (established by ``parse``): the number of ``' '``/``'-'`` lines is
    ``old_len`` and of ``' '``/``'+'`` lines is ``new_len``; at least one line is ``'-'`` or
    ``'+'``; a start is 0 only when its length is 0; an ``*_eof_no_newline`` flag is set only if
    that side has at least one line, and only on the last hunk of a file.
    """

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str
    lines: tuple[tuple[str, str], ...]
    old_eof_no_newline: bool
    new_eof_no_newline: bool
    lineno: int = field(default=0, compare=False)  # the header's line in the diff (0: unknown)

    @property
    def old_lines(self) -> list[str]:
        """The text of the old side: context and removed lines, in order."""
        return [text for tag, text in self.lines if tag != "+"]

    @property
    def leading(self) -> int:
        """Context lines before the first change (git apply's ``leading``)."""
        return next((i for i, (tag, _) in enumerate(self.lines) if tag != " "), len(self.lines))

    @property
    def trailing(self) -> int:
        """Context lines after the last change (git apply's ``trailing``)."""
        tags = [tag for tag, _ in reversed(self.lines)]
        return next((i for i, tag in enumerate(tags) if tag != " "), len(tags))

    def reversed(self) -> Hunk:
        """The hunk that undoes this one (``git apply -R``)."""
        swap = {"-": "+", "+": "-", " ": " "}
        return Hunk(
            self.new_start, self.new_len, self.old_start, self.old_len, self.header,
            tuple((swap[tag], text) for tag, text in self.lines),
            self.new_eof_no_newline, self.old_eof_no_newline, self.lineno,
        )  # fmt: skip


@dataclass(frozen=True)
class FilePatch:
    """The hunks for one file.  Invariant: at least one hunk (a new empty file: none), in
    ascending, non-overlapping old-side order (so they can be applied in one pass). A new file
    has no ``old_path`` (``created``).

    ``max_offset``: how many lines from its stated position a hunk is searched (the diff header
    ``Max-Offset:``); ``unidiff_zero``: accept hunks without context lines, placed by their line
    numbers alone, like ``git apply --unidiff-zero`` (the header ``Unidiff-Zero: yes``).
    """

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]
    max_offset: int = DEFAULT_MAX_OFFSET
    unidiff_zero: bool = False

    @property
    def created(self) -> bool:
        """A new file (``--- /dev/null``, ``new file mode``): applied where the module does not
        exist, to empty text; its one hunk (none for an empty file) is the whole text."""
        return self.old_path is None

    def new_text(self) -> str:
        """The whole text of a new file."""
        if not self.hunks:
            return ""
        hunk = self.hunks[-1]
        text = "".join(line + "\n" for tag, line in hunk.lines if tag == "+")
        return text[:-1] if hunk.new_eof_no_newline else text

    @property
    def path(self) -> str:
        path = self.new_path or self.old_path
        if path is None:
            raise DiffError("file patch has neither an old nor a new path")
        return path

    @property
    def module(self) -> str:
        return module_name(self.path)


@dataclass(frozen=True)
class ModeChange:
    """A file's mode change in a diff (``old mode 100755`` / ``new mode 100644``): not code,
    so nothing applies it; ``only``: the section changes nothing else (a ``chmod``)."""

    path: str
    old_mode: str
    new_mode: str
    only: bool
    lineno: int

    def describe(self) -> str:
        return f"mode {self.old_mode} -> {self.new_mode}"


@dataclass(frozen=True)
class ParsedDiff:
    preamble: str
    files: tuple[FilePatch, ...]
    modes: tuple[ModeChange, ...] = ()


# --------------------------------------------------------------------------- parsing
#
# Hand-written, not unidiff (PyPI; measured with scripts/unidiff_eval.py, unidiff 1.0.1): on 400
# real vLLM diffs both recover the same lines, but unidiff keeps git's quoted non-ASCII paths
# quoted and octal-escaped (a wrong module name), returns a file with no hunks for a malformed
# '@@' line and drops the lines past a hunk's stated length (a patch that silently does less),
# reports errors without a line number, needs its own checks to refuse creations, renames and
# binaries, does not return the preamble our headers live in, and parses 2.1x slower.

# ASCII digits only: \d would also accept e.g. Arabic-Indic digits, which int() takes.
# The digit count is bounded so int() never hits its str-conversion limit.
_HUNK_RE = re.compile(
    r"@@ -([0-9]{1,18})(?:,([0-9]{1,18}))? \+([0-9]{1,18})(?:,([0-9]{1,18}))? @@(.*)",
    re.DOTALL,
)

# git extended header lines that do not change what we do with the content.
_HARMLESS_GIT_HEADERS = ("index ", "old mode ", "new mode ", "dissimilarity index ",
                         "new file mode ")
# git extended header lines that mean an operation we cannot do in memory.
_UNSUPPORTED_GIT_HEADERS = {
    "deleted file mode ": "file deletion",
    "rename from ": "rename",
    "rename to ": "rename",
    "rename old ": "rename",
    "rename new ": "rename",
    "copy from ": "copy",
    "copy to ": "copy",
    "similarity index ": "rename/copy",
}

_C_ESCAPES = {
    "a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92,
}  # fmt: skip


def _is_binary_line(line: str) -> bool:
    return line.startswith("GIT binary patch") or (
        line.startswith("Binary files ") and line.endswith(" differ")
    )


def _unquote_c_style(s: str, lineno: int) -> tuple[str, str]:
    """Decode a git C-style quoted path at the start of ``s``; return (path, rest).

    git quotes paths with special characters, and by default (core.quotePath)
    every non-ASCII byte as octal, so non-ASCII file names need this.
    """
    out = bytearray()
    i = 1
    while i < len(s):
        ch = s[i]
        if ch == '"':
            try:
                return out.decode("utf-8"), s[i + 1 :]
            except UnicodeDecodeError:
                raise DiffError(f"quoted path {s!r} is not valid UTF-8", lineno) from None
        if ch == "\\":
            esc = s[i + 1 : i + 2]
            if esc in _C_ESCAPES:
                out.append(_C_ESCAPES[esc])
                i += 2
                continue
            octal = s[i + 1 : i + 4]
            if len(octal) == 3 and all(c in "01234567" for c in octal) and octal[0] in "0123":
                out.append(int(octal, 8))
                i += 4
                continue
            raise DiffError(f"bad escape in quoted path {s!r}", lineno)
        out.extend(ch.encode("utf-8", "surrogatepass"))
        i += 1
    raise DiffError(f"unterminated quoted path {s!r}", lineno)


def _header_path(line: str, marker: str, lineno: int) -> str:
    """The path of a '--- '/'+++ ' line, without quotes or trailing tab+timestamp.

    git ends names containing a space with a tab, GNU diff puts a tab before the
    timestamp; a tab cannot otherwise appear in an unquoted name.
    """
    raw = line[len(marker) :]
    if raw.startswith('"'):
        path, _ = _unquote_c_style(raw, lineno)
    else:
        path = raw.split("\t", 1)[0]
    if not path:
        raise DiffError(f"expected a path after {marker.strip()!r}", lineno)
    return path


def _is_file_header(lines: list[str], i: int) -> bool:
    """A non-git file header: '--- ' immediately followed by '+++ '.

    Requiring the pair keeps the lone '---' of a format-patch mail (before the
    diffstat) and a removed line starting with '-- ' from being taken as headers.
    """
    return lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def _parse_hunk(lines: list[str], i: int) -> tuple[Hunk, int]:
    """Parse the hunk whose header is lines[i]; return it and the index after it."""
    header = lines[i]
    m = _HUNK_RE.fullmatch(header)
    if m is None:
        raise DiffError(f"malformed hunk header {header!r}, expected '@@ -a,b +c,d @@'", i + 1)
    old_start, new_start = int(m.group(1)), int(m.group(3))
    # An omitted length means 1 (diff writes '-3' for a single line).
    old_len = int(m.group(2)) if m.group(2) is not None else 1
    new_len = int(m.group(4)) if m.group(4) is not None else 1
    if (old_start == 0 and old_len) or (new_start == 0 and new_len):
        raise DiffError(f"hunk header {header!r}: a non-empty range cannot start at line 0", i + 1)

    body: list[tuple[str, str]] = []
    rem_old, rem_new = old_len, new_len
    old_nl = new_nl = False
    after_marker = False
    j = i + 1
    while j < len(lines):
        line = lines[j]
        tag = line[:1]
        if rem_old == 0 and rem_new == 0 and tag != "\\":
            break  # complete; only a no-newline marker may still belong to the last line
        if tag == "\\":
            # '\ No newline at end of file' (text may be localized by GNU diff).
            if not body or after_marker:
                raise DiffError("'\\ No newline at end of file' must follow a hunk line", j + 1)
            prev = body[-1][0]
            # The marker says the previous line is the last of its side(s), so
            # nothing of that side may follow it.
            if (prev in " -" and rem_old) or (prev in " +" and rem_new):
                raise DiffError(
                    f"'\\ No newline at end of file' before the end of the hunk's "
                    f"{'old' if prev in ' -' and rem_old else 'new'} side "
                    f"(header {header!r} at line {i + 1})",
                    j + 1,
                )
            old_nl = old_nl or prev in " -"
            new_nl = new_nl or prev in " +"
            after_marker = True
            j += 1
            continue
        # An empty line is an empty context line whose leading space was eaten
        # (editors strip trailing whitespace); git apply accepts it too.
        if tag == " " or line == "":
            ok = rem_old > 0 and rem_new > 0
        elif tag == "-":
            ok = rem_old > 0
        elif tag == "+":
            ok = rem_new > 0
        else:
            raise DiffError(
                f"hunk ends early: expected a ' ', '-' or '+' line, found {line!r}; "
                f"header {header!r} at line {i + 1} promises {rem_old} more old-side "
                f"and {rem_new} more new-side lines",
                j + 1,
            )
        if not ok:
            raise DiffError(
                f"hunk has more lines than its header says: {line[:1]!r} line where "
                f"header {header!r} at line {i + 1} promises {rem_old} more old-side "
                f"and {rem_new} more new-side lines",
                j + 1,
            )
        body.append((tag or " ", line[1:]))
        rem_old -= tag != "+"
        rem_new -= tag != "-"
        after_marker = False
        j += 1
    if rem_old or rem_new:
        raise DiffError(
            f"diff ends inside hunk {header!r}: {rem_old} old-side and {rem_new} "
            f"new-side lines missing",
            i + 1,
        )
    if all(tag == " " for tag, _ in body):
        # git apply ("corrupt patch") and GNU patch refuse it too: a hunk must change something.
        raise DiffError(f"hunk {header!r} changes nothing: it has no '-' or '+' line", i + 1)
    hunk = Hunk(
        old_start, old_len, new_start, new_len, header, tuple(body), old_nl, new_nl, i + 1
    )
    return hunk, j


def _old_range_start(h: Hunk) -> int:
    """0-based index of the first old-side line; for an empty old side the
    header names the line *before* the insertion point, which is the same number."""
    return h.old_start - 1 if h.old_len else h.old_start


def _git_line_path(line: str, lineno: int) -> str:
    """The path a 'diff --git a/P b/P' line names (its b/ side), quoted or not."""
    rest = line[len("diff --git ") :]
    if rest.startswith('"'):
        _, rest = _unquote_c_style(rest, lineno)
        rest = rest.lstrip(" ")
        path = _unquote_c_style(rest, lineno)[0] if rest.startswith('"') else rest
    else:
        half = (len(rest) - 1) // 2  # 'a/P b/P': both halves name the same file
        if len(rest) % 2 == 1 and rest[half] == " " and rest[:half][2:] == rest[half + 1 :][2:]:
            path = rest[half + 1 :]
        else:
            path = rest.rsplit(" ", 1)[-1]
    return path[2:] if path.startswith("b/") else path


def _parse_file(lines: list[str], i: int) -> tuple[FilePatch | None, ModeChange | None, int]:
    """Parse one file's patch starting at lines[i] ('diff --git' or '--- '): (its patch, None
    for a mode-only section; its mode change or None; the index after it)."""
    modes: dict[str, str] = {}
    git_line = i
    if lines[i].startswith("diff --git "):
        i += 1
        while i < len(lines) and not lines[i].startswith("--- "):
            line = lines[i]
            for prefix, what in _UNSUPPORTED_GIT_HEADERS.items():
                if line.startswith(prefix):
                    raise DiffError(f"{what} is not supported ({line!r})", i + 1)
            if _is_binary_line(line):
                raise DiffError(f"binary patches are not supported ({line!r})", i + 1)
            if not line.startswith(_HARMLESS_GIT_HEADERS):
                break
            if line.startswith(("old mode ", "new mode ")):
                modes[line[:3]] = line[len("old mode ") :].strip()
            i += 1
        created = any(lines[k].startswith("new file mode ") for k in range(git_line + 1, i))
        if created and (i == len(lines) or lines[i].startswith("diff ")):
            # A new empty file (an __init__.py): git writes no '---'/'+++' lines for it.
            path = _git_line_path(lines[git_line], git_line + 1)
            return FilePatch(None, path, ()), None, i
        if i == len(lines) or not lines[i].startswith("--- "):
            if modes and (i == len(lines) or lines[i].startswith("diff ")):
                # A chmod: git apply accepts it; the mode is not code, so it is only listed.
                path = _git_line_path(lines[git_line], git_line + 1)
                change = ModeChange(path, modes.get("old", "?"), modes.get("new", "?"), True,
                                    git_line + 1)
                return None, change, i
            found = repr(lines[i]) if i < len(lines) else "end of diff"
            raise DiffError(
                f"expected '--- a/<path>' in the git header that starts at line "
                f"{git_line + 1}, found {found}",
                i + 1,
            )
    if not _is_file_header(lines, i):
        raise DiffError(f"expected '+++ b/<path>' after {lines[i]!r}", i + 2)
    old = _header_path(lines[i], "--- ", i + 1)
    new = _header_path(lines[i + 1], "+++ ", i + 2)
    if new == "/dev/null":
        raise DiffError(f"file deletion is not supported ({lines[i + 1]!r})", i + 2)
    creation = old == "/dev/null"
    # git's default prefixes.  Only stripped as a pair, so a --no-prefix diff of a
    # package that is really called 'a' keeps its name.
    if (old.startswith("a/") or creation) and new.startswith("b/"):
        old, new = old[2:], new[2:]
    i += 2

    if i >= len(lines) or not lines[i].startswith("@@"):
        found = repr(lines[i]) if i < len(lines) else "end of diff"
        raise DiffError(f"expected a hunk header '@@ -a,b +c,d @@', found {found}", i + 1)
    if lines[i].startswith("@@@"):
        raise DiffError("combined diffs ('@@@') are not supported", i + 1)
    hunks: list[Hunk] = []
    hunk_lines: list[int] = []
    while i < len(lines) and lines[i].startswith("@@"):
        hunk_lines.append(i + 1)
        hunk, i = _parse_hunk(lines, i)
        hunks.append(hunk)
    if i < len(lines):
        # What follows the last hunk may be free text (a format-patch signature
        # '-- ', blank lines, 'diff -r' lines between files), but a line that looks
        # like hunk content means the header's counts are wrong: fail rather than
        # silently drop it.
        nxt = lines[i]
        looks_like_body = nxt.startswith((" ", "+", "\\")) or (
            nxt.startswith("-") and nxt != "-- " and not _is_file_header(lines, i)
        )
        if looks_like_body:
            raise DiffError(
                f"hunk has more lines than its header {hunks[-1].header!r} "
                f"(line {hunk_lines[-1]}) says: {nxt!r}",
                i + 1,
            )

    for k in range(1, len(hunks)):
        prev, cur = hunks[k - 1], hunks[k]
        if _old_range_start(cur) < _old_range_start(prev) + prev.old_len:
            raise DiffError(
                f"hunk {cur.header!r} overlaps or precedes the previous hunk "
                f"{prev.header!r}; hunks must be in file order",
                hunk_lines[k],
            )
        if prev.old_eof_no_newline or prev.new_eof_no_newline:
            raise DiffError(
                f"hunk {prev.header!r} has '\\ No newline at end of file' but is "
                f"not the last hunk of the file",
                hunk_lines[k - 1],
            )
    # A new file: one hunk '@@ -0,0 +1,N @@' of added lines, the whole file.
    if creation and (len(hunks) != 1 or hunks[0].old_len or hunks[0].new_start != 1):
        raise DiffError(
            f"a new file's diff ('--- /dev/null') has one hunk '@@ -0,0 +1,N @@' of the "
            f"whole file, not {', '.join(repr(h.header) for h in hunks)}",
            hunk_lines[0],
        )
    patch = FilePatch(None if creation else old, new, tuple(hunks))
    mode: ModeChange | None = None
    if modes:
        mode = ModeChange(patch.path, modes.get("old", "?"), modes.get("new", "?"), False,
                          git_line + 1)
    return patch, mode, i


def parse(text: str) -> ParsedDiff:
    """Parse a unified diff of one or more files.

    Free text before the first file header is returned as ``preamble``; free
    text between files is skipped (both as ``git apply`` does).
    """
    raw = text.split("\n")
    if raw[-1] == "":
        raw.pop()  # the text's final newline terminates a line, it does not start one
    lines = [line[:-1] if line.endswith("\r") else line for line in raw]

    files: list[FilePatch] = []
    modes: list[ModeChange] = []
    first: int | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git ") or _is_file_header(lines, i):
            if first is None:
                first = i
            patch, mode, i = _parse_file(lines, i)
            if patch is not None:
                files.append(patch)
            if mode is not None:
                modes.append(mode)
        elif line.startswith(("diff --cc ", "diff --combined ")):
            raise DiffError(f"combined diffs are not supported ({line!r})", i + 1)
        elif _is_binary_line(line):
            raise DiffError(f"binary patches are not supported ({line!r})", i + 1)
        elif _HUNK_RE.fullmatch(line):
            raise DiffError(
                f"hunk header {line!r} without a file header ('--- a/<path>' / '+++ b/<path>')",
                i + 1,
            )
        else:
            i += 1
    if first is None:
        return ParsedDiff(text, ())
    # Exactly the original characters of the lines before the first header.
    preamble = "".join(part + "\n" for part in raw[:first])
    return ParsedDiff(preamble, tuple(files), tuple(modes))


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


def require_context(patch: FilePatch) -> None:
    """Raise DiffError for a hunk without context lines that is not pinned to the whole file,
    unless ``patch.unidiff_zero``: a diff made with ``git diff -U0``."""
    if patch.unidiff_zero:
        return
    for index, hunk in enumerate(patch.hunks, 1):
        if hunk.old_start > 1 and all(tag != " " for tag, _ in hunk.lines):
            raise DiffError(
                f"{patch.path}: hunk #{index} {hunk.header!r} has no context lines (a diff made "
                "with 'git diff -U0'?), so nothing tells where it goes: make the diff again with "
                "context (plain 'git diff'), or, to place it by its line numbers alone, add "
                "'Unidiff-Zero: yes' to the diff's header (Patch.diff(..., unidiff_zero=True))",
                hunk.lineno or None,
            )


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
        stated = _old_range_start(reverse) + delta
        pos = src.place(reverse, stated, done, max_offset, patch.unidiff_zero)
        if pos < 0 or not reverse.old_lines:
            return None
        places.append(pos)
        delta = pos - _old_range_start(reverse)
        done = pos + reverse.old_len
    return places


BOM = "\ufeff"
_UNBOUNDED = 1 << 62  # a max_offset no file reaches: place() stops at both ends of the file


def apply(source: str, patch: FilePatch, *, max_offset: int | None = None) -> str:
    """Return ``source`` with ``patch`` applied, or raise ``HunkMismatch`` (or ``DiffError``
    for a hunk without context, see ``require_context``). See ``_apply``."""
    if not source.startswith(BOM) and any(
        _old_range_start(h) == 0 and h.old_lines and h.old_lines[0].startswith(BOM)
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
        stated = _old_range_start(hunk) + delta
        pos = src.place(hunk, stated, done, max_offset, patch.unidiff_zero)
        if pos >= 0:
            placed.append((hunk, pos))
            delta = pos - _old_range_start(hunk)
            done = pos + hunk.old_len
            continue
        mismatch, back, length = _explain(src, patch, index, hunk, stated, done, max_offset)
        failures.append(mismatch)
        if back >= 0:  # already applied: its new side takes the place of its old side
            delta = back - _old_range_start(hunk)
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


def module_name(path: str) -> str:
    """Dotted module name for a repository-relative ``.py`` path.

    'vllm/v1/core/sched/scheduler.py' -> 'vllm.v1.core.sched.scheduler',
    'pkg/__init__.py' -> 'pkg'.  A leading 'src/' is kept: only the caller knows
    the layout of its repository.
    """
    if not path.endswith(".py"):
        raise DiffError(f"{path!r} is not a Python source file (.py), it has no module name")
    parts = path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(part.isidentifier() for part in parts):
        raise DiffError(f"{path!r} is not an importable module path")
    return ".".join(parts)


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
