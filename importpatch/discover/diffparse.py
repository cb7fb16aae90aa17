"""Parse unified diffs (as ``git diff`` writes them) into hunks: what a patch declares.

Declaring a diff patch (``Patch.diff``, a ``.diff`` file) parses it here, so a malformed diff fails
when it is declared, not at the target's import; ``importpatch.rewrite.diffs`` applies the parsed
hunks to the module's text (and re-exports these names). Both sides keep one line model:

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

import re
from dataclasses import dataclass, field


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


# How many lines from its stated position a hunk is searched, by default (Max-Offset).
DEFAULT_MAX_OFFSET = 200

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
# Hand-written, not unidiff (PyPI; measured with scripts/eval/unidiff_eval.py, unidiff 1.0.1):
# on 400 real vLLM diffs both recover the same lines, but unidiff keeps git's quoted non-ASCII paths
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


def old_range_start(h: Hunk) -> int:
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
        if old_range_start(cur) < old_range_start(prev) + prev.old_len:
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
