"""A copied function aligned with its original by statement (issue 37): what ``convert`` turns
into a diff, and what ``check`` compares with a release to say a copy is retired.

Real copies are not literal: the docstring is shortened or dropped, comments are dropped, locals
are renamed, the signature is written on one line. None of that is the edit. The copy and the
original are compared statement by statement (``ast``), so that

- a bare string statement (a docstring) and comments do not count: the original's stay where they
  are, the copy's are not written;
- a local the copy renamed (``topk_logprobs`` -> ``top_lp``) is the original's name: the copy's
  edited statements are written back with the original's names;
- the ``def`` line(s) stay the original's unless the signature really changed (parameters,
  defaults, ``async``; annotations and layout aside);
- a compound statement (``if``, ``for``, ``with``, ``try``) whose header is the same is aligned
  inside: an edit in its body changes only those lines.

``align(base_lines, base_fn, copy_text, copy_fn)`` gives the ``Edit``s: spans of the original's
lines and the copy's statements that stand there, written at the original's indentation.
"""

from __future__ import annotations

import ast
import copy as _copy
import dataclasses
import difflib
import io
import tokenize
from collections import Counter
from collections.abc import Sequence

# The fields of a compound statement that hold a block of statements, aligned one by one.
BLOCKS = ("body", "handlers", "orelse", "finalbody")


@dataclasses.dataclass
class Edit:
    first: int  # 1-based first line of the original replaced; an insertion: the line it goes before
    last: int  # last line replaced (first - 1 for an insertion)
    lines: list[str]  # what stands there (the copy's statements, the original's names and indent)
    removed: list[str]  # keys (``key``) of the original's statements it takes out
    added: list[str]  # keys of the copy's statements it puts in


@dataclasses.dataclass
class Alignment:
    edits: list[Edit]
    kept: float  # the share of the original's statements the copy keeps (difflib ratio)
    renamed: dict[str, str]  # the copy's local -> the original's
    signature_changed: bool

    def apply(self, lines: Sequence[str]) -> list[str]:
        """The original's ``lines`` (the whole module's) with the edits made."""
        out = list(lines)
        for e in sorted(self.edits, key=lambda e: e.first, reverse=True):
            out[e.first - 1:e.last] = e.lines
        return out


def function_of(tree: ast.Module) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The first function defined at the top of ``tree`` (a copy's, a pin's text)."""
    return next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
                None)


def statements(block: Sequence[ast.AST]) -> list[ast.AST]:
    """A block without its bare strings (docstrings: they do not count)."""
    return [s for s in block if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                     and isinstance(s.value.value, str))]


class _Renamer(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self.names.get(node.arg, node.arg)
        node.annotation = None  # annotations are no part of what a statement does here
        return node


def _stripped(node: ast.AST, names: dict[str, str], erase: bool = False) -> ast.AST:
    """A deep copy of ``node`` with ``names`` renamed, blocks emptied (a compound statement's
    header) and bare strings dropped from nested blocks."""
    clone = _copy.deepcopy(node)
    for field in BLOCKS:
        if isinstance(getattr(clone, field, None), list):
            setattr(clone, field, [])
    for sub in ast.walk(clone):
        for field in BLOCKS:
            block = getattr(sub, field, None)
            if isinstance(block, list) and block:
                setattr(sub, field, statements(block))
        if erase and isinstance(sub, ast.Name):
            sub.id = "_"
        if erase and isinstance(sub, ast.arg):
            sub.arg = "_"
    renamed: ast.AST = _Renamer(names).visit(clone)
    return renamed


def _has_blocks(node: ast.AST) -> bool:
    return any(isinstance(getattr(node, f, None), list) and getattr(node, f) for f in BLOCKS)


def header_key(node: ast.AST, names: dict[str, str], erase: bool = False) -> str:
    """The statement (a compound's header: which blocks it has, not what is in them)."""
    shape = tuple(len(statements(getattr(node, f, None) or [])) > 0 for f in BLOCKS)
    return f"{ast.dump(_stripped(node, names, erase))}{shape if _has_blocks(node) else ''}"


def key(node: ast.AST, names: dict[str, str]) -> str:
    """The whole statement, its bare strings aside."""
    clone = _copy.deepcopy(node)
    for sub in ast.walk(clone):
        for field in BLOCKS:
            block = getattr(sub, field, None)
            if isinstance(block, list) and block:
                setattr(sub, field, statements(block))
    return ast.dump(_Renamer(names).visit(clone))


def flat_keys(block: Sequence[ast.AST], names: dict[str, str]) -> list[str]:
    """The header keys of every statement of ``block`` and of the blocks in it, in order."""
    out: list[str] = []
    for s in statements(block):
        out.append(header_key(s, names))
        for field in BLOCKS:
            out += flat_keys(getattr(s, field, None) or [], names)
    return out


def flat_nodes(block: Sequence[ast.AST]) -> list[ast.AST]:
    out: list[ast.AST] = []
    for s in statements(block):
        out.append(s)
        for field in BLOCKS:
            out += flat_nodes(getattr(s, field, None) or [])
    return out


# -- Renamed locals ------------------------------------------------------------------------------


def _locals(fn: ast.AST) -> set[str]:
    """Names the function binds itself (parameters, assignments, loop and ``as`` targets)."""
    out: set[str] = set()
    for sub in ast.walk(fn):
        if isinstance(sub, ast.arg):
            out.add(sub.arg)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            out.add(sub.id)
    return out


def renames(base: ast.FunctionDef | ast.AsyncFunctionDef,
            copy: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, str]:
    """The copy's locals that are the original's under another name: paired where statements of
    the same shape (names erased) align, kept when the pairing is the same everywhere."""
    votes: dict[str, Counter[str]] = {}

    def vote(a: ast.AST, b: ast.AST) -> None:
        for x, y in zip(ast.walk(a), ast.walk(b), strict=False):  # the same shape
            if isinstance(x, ast.Name) and isinstance(y, ast.Name):
                votes.setdefault(y.id, Counter())[x.id] += 1
            elif isinstance(x, ast.arg) and isinstance(y, ast.arg):
                votes.setdefault(y.arg, Counter())[x.arg] += 1

    vote(base.args, copy.args)
    b, c = flat_nodes(base.body), flat_nodes(copy.body)
    matcher = difflib.SequenceMatcher(None, [header_key(s, {}, True) for s in b],
                                      [header_key(s, {}, True) for s in c], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for x, y in zip(b[i1:i2], c[j1:j2], strict=True):
                vote(_stripped(x, {}), _stripped(y, {}))
    own, theirs = _locals(copy), _locals(base)
    out: dict[str, str] = {}
    for name, counts in votes.items():
        target, n = counts.most_common(1)[0]
        if (name != target and name in own and target in theirs and target not in own
                and n * 2 > sum(counts.values())):
            out[name] = target
    return out


def rename_text(text: str, names: dict[str, str]) -> str:
    """``text`` (Python) with the names ``names`` renamed, attributes left alone."""
    if not names:
        return text
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text
    lines = text.splitlines(keepends=True)
    previous = ""
    spots = []
    for t in tokens:
        if t.type == tokenize.NAME and t.string in names and previous != ".":
            spots.append(t)
        if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT,
                          tokenize.DEDENT):
            previous = t.string
    for t in reversed(spots):
        row, col = t.start
        line = lines[row - 1]
        lines[row - 1] = line[:col] + names[t.string] + line[col + len(t.string):]
    return "".join(lines)


# -- Alignment -----------------------------------------------------------------------------------


def _first_line(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", None) or []
    return int(min([getattr(node, "lineno", 0), *(d.lineno for d in decorators)]))


@dataclasses.dataclass
class _Side:
    lines: Sequence[str]

    def text(self, first: int, last: int) -> list[str]:
        return list(self.lines[first - 1:last])


def _reindent(chunk: list[str], have: int, want: int) -> list[str]:
    out = []
    for line in chunk:
        if line.strip() and not line[:have].strip():
            out.append(" " * want + line[have:])
        elif not line.strip():
            out.append(line if line.endswith("\n") else line + "\n")
        else:
            out.append(line)
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    return out


class _Aligner:
    def __init__(self, base_lines: Sequence[str], copy_lines: Sequence[str],
                 names: dict[str, str]) -> None:
        self.base = _Side(base_lines)
        self.copy = _Side(copy_lines)
        self.names = names
        self.edits: list[Edit] = []
        base_text = "".join(base_lines)
        self.base_comments = {line.strip() for line in base_text.splitlines()
                              if line.strip().startswith("#")}

    def copied(self, nodes: Sequence[ast.AST], col: int, lead: bool = False) -> list[str]:
        """The copy's ``nodes`` as text at column ``col``, in the original's names (``lead``: the
        copy's own comment lines just above them too, when the original has none of them)."""
        if not nodes:
            return []
        first, last = _first_line(nodes[0]), getattr(nodes[-1], "end_lineno", 0)
        if lead:
            while (first > 1 and self.copy.lines[first - 2].strip().startswith("#")
                   and self.copy.lines[first - 2].strip() not in self.base_comments):
                first -= 1
        chunk = self.copy.text(first, last)
        have = getattr(nodes[0], "col_offset", 0)
        return _reindent(rename_text("".join(chunk), self.names).splitlines(keepends=True),
                         have, col)

    def replace(self, base: Sequence[ast.AST], copy: Sequence[ast.AST], col: int,
                after: int) -> None:
        added = [k for n in copy for k in flat_keys([n], self.names)]
        removed = [k for n in base for k in flat_keys([n], {})]
        if base:
            first, last = _first_line(base[0]), getattr(base[-1], "end_lineno", 0)
            self.edits.append(Edit(first, last, self.copied(copy, col, lead=True), removed,
                                   added))
        else:
            self.edits.append(Edit(after + 1, after, self.copied(copy, col, lead=True), [],
                                   added))

    def block(self, base_block: Sequence[ast.AST], copy_block: Sequence[ast.AST], col: int,
              after: int) -> None:
        """Align two blocks; ``col``: the original's indentation there; ``after``: the line
        after which a statement put at the block's start goes."""
        base, copy = statements(base_block), statements(copy_block)
        if base:
            col = getattr(base[0], "col_offset", col)
        matcher = difflib.SequenceMatcher(None, [header_key(s, {}) for s in base],
                                          [header_key(s, self.names) for s in copy],
                                          autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            at = getattr(base[i1 - 1], "end_lineno", after) if i1 else after
            if tag == "equal":
                for b, c in zip(base[i1:i2], copy[j1:j2], strict=True):
                    if key(b, {}) != key(c, self.names):
                        self.inside(b, c)
            elif (tag == "replace" and i2 - i1 == j2 - j1 == 1 and type(base[i1]) is
                  type(copy[j1]) and _has_blocks(base[i1]) and self.header(base[i1], copy[j1])):
                self.inside(base[i1], copy[j1])
            else:
                self.replace(base[i1:i2], copy[j1:j2], col, at)

    def header(self, base: ast.AST, copy: ast.AST) -> bool:
        """Replace just the header of a compound statement (its blocks aligned after); False
        when its lines cannot be told apart from its body's."""
        b_end = self._header_end(base, self.base.lines)
        c_end = self._header_end(copy, self.copy.lines)
        if b_end is None or c_end is None:
            return False
        first = getattr(base, "lineno", 0)
        chunk = self.copy.text(getattr(copy, "lineno", 0), c_end)
        have = getattr(copy, "col_offset", 0)
        text = _reindent(rename_text("".join(chunk), self.names).splitlines(keepends=True),
                         have, getattr(base, "col_offset", 0))
        self.edits.append(Edit(first, b_end, text, [header_key(base, {})],
                               [header_key(copy, self.names)]))
        return True

    @staticmethod
    def _header_end(node: ast.AST, lines: Sequence[str]) -> int | None:
        """The last line of a compound statement's header (comments under it: its body's)."""
        body = getattr(node, "body", None) or []
        first = getattr(node, "lineno", 0)
        if not body or body[0].lineno <= first:
            return None
        if isinstance(node, ast.If) and node.orelse:  # an elif / else line is its own header
            return None
        end = _first_line(body[0]) - 1
        while end > first and (not lines[end - 1].strip()
                               or lines[end - 1].strip().startswith("#")):
            end -= 1
        return end

    def inside(self, base: ast.AST, copy: ast.AST) -> None:
        """Two statements with the same header: align their blocks."""
        for field in BLOCKS:
            b, c = getattr(base, field, None) or [], getattr(copy, field, None) or []
            if not b and not c:
                continue
            if field == "handlers":
                for hb, hc in zip(b, c, strict=False):
                    if len(b) != len(c) or header_key(hb, {}) != header_key(hc, self.names):
                        self.replace([base], [copy], getattr(base, "col_offset", 0),
                                     _first_line(base) - 1)
                        return
                    self.block(hb.body, hc.body, hb.col_offset + 4, hb.lineno)
                continue
            col = getattr(base, "col_offset", 0) + 4
            after = (getattr(b[0], "lineno", 1) - 1 if b else getattr(base, "end_lineno", 0))
            self.block(b, c, col, after if field == "body" else _block_start(b, after))


def _block_start(block: Sequence[ast.AST], default: int) -> int:
    return _first_line(block[0]) - 1 if block else default


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, names: dict[str, str]) -> str:
    return f"{type(fn).__name__} {ast.dump(_Renamer(names).visit(_copy.deepcopy(fn.args)))}"


def align(base_lines: Sequence[str], base_fn: ast.FunctionDef | ast.AsyncFunctionDef,
          copy_lines: Sequence[str], copy_fn: ast.FunctionDef | ast.AsyncFunctionDef
          ) -> Alignment:
    """The edit that makes ``base_fn`` (in ``base_lines``, a module's) the copy ``copy_fn`` (in
    ``copy_lines``), statement by statement."""
    names = renames(base_fn, copy_fn)
    aligner = _Aligner(base_lines, copy_lines, names)
    changed = _signature(base_fn, {}) != _signature(copy_fn, names)
    body = statements(base_fn.body)
    if changed:  # the def line(s), to the first statement (the docstring stays)
        first_b, first_c = base_fn.lineno, copy_fn.lineno
        end_b, end_c = _first_line(base_fn.body[0]) - 1, _first_line(copy_fn.body[0]) - 1
        if end_b >= first_b and end_c >= first_c:
            chunk = aligner.copy.text(first_c, end_c)
            while chunk and (not chunk[-1].strip() or chunk[-1].strip().startswith("#")):
                chunk.pop()
            head = rename_text("".join(chunk), names)
            head = head.replace(f"def {copy_fn.name}", f"def {base_fn.name}", 1)
            text = _reindent(head.splitlines(keepends=True), copy_fn.col_offset,
                             base_fn.col_offset)
            while (end_b > first_b and (not base_lines[end_b - 1].strip()
                                        or base_lines[end_b - 1].strip().startswith("#"))):
                end_b -= 1
            aligner.edits.append(Edit(first_b, end_b, text, [], []))
    docstring = base_fn.body[0] if base_fn.body and base_fn.body[0] not in body else None
    after = (getattr(docstring, "end_lineno", 0) if docstring is not None
             else _first_line(base_fn.body[0]) - 1)
    aligner.block(base_fn.body, copy_fn.body, base_fn.col_offset + 4, after)
    kept = difflib.SequenceMatcher(None, flat_keys(base_fn.body, {}),
                                   flat_keys(copy_fn.body, names), autojunk=False).ratio()
    return Alignment(aligner.edits, kept, names, changed)


def edit_made(alignment: Alignment, base_fn: ast.AST, release_fn: ast.AST) -> bool:
    """Whether ``release_fn`` holds the copy's edit of ``base_fn``: every statement the edit puts
    in is there as often as after the edit, every one it takes out as rarely."""
    if not alignment.edits:
        return False
    removed = Counter(k for e in alignment.edits for k in e.removed)
    added = Counter(k for e in alignment.edits for k in e.added)
    base = Counter(flat_keys(getattr(base_fn, "body", []), {}))
    release = Counter(flat_keys(getattr(release_fn, "body", []), {}))
    if alignment.signature_changed and not _same_signature(alignment, release_fn):
        return False
    return all(release[k] == base[k] - removed[k] + added[k] for k in removed | added)


def _same_signature(alignment: Alignment, release_fn: ast.AST) -> bool:
    text = "".join(next((e.lines for e in alignment.edits if not e.removed and not e.added),
                        []))
    try:
        tree = ast.parse(text.strip() + "\n    pass\n")
    except SyntaxError:
        return False
    fn = function_of(tree)
    return (fn is not None and isinstance(release_fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            and _signature(fn, {}) == _signature(release_fn, {}))


def dropped(base_fn: ast.AST, copy_fn: ast.AST, release_fn: ast.AST, names: dict[str, str],
            release_lines: Sequence[str]) -> list[str]:
    """The first line of each statement upstream added to the function since ``base_fn`` that the
    copy does not have (the copy silently drops it)."""
    base = Counter(flat_keys(getattr(base_fn, "body", []), {}))
    mine = Counter(flat_keys(getattr(copy_fn, "body", []), names))
    out = []
    for node in flat_nodes(getattr(release_fn, "body", [])):
        k = header_key(node, {})
        if base[k] < 1 and mine[k] < 1:
            line = release_lines[getattr(node, "lineno", 1) - 1].strip()
            if line not in out:
                out.append(line)
    return out
