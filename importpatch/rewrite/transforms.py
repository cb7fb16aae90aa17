"""Source diffs and AST transforms: from the module's original text to the patched text and code.

Order (deterministic): source diffs of every patch, by patch name, then AST transforms, by patch
name, then class-body fields (``fields.py``), by patch name, then the definition-site landings of
replace / wrap / add. Text is the currency between
steps: an AST transform's result is spliced back into the text statement by statement, so the
published text, the code's line numbers, Triton's view and tracebacks all agree, and statements a
transform did not touch keep their text (and, above the first edit that adds lines, their lines).
"""

from __future__ import annotations

import ast
import difflib
import re

from importpatch.discover.declare import DIFF, FIELD, TRANSFORM
from importpatch.errors import PatchError
from importpatch.rewrite import diffs, landing
from importpatch.rewrite.facts import HOOKS, Fact

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType

    from importpatch.discover.declare import Op


def _by_patch(ops: list[Op], kind: str) -> list[Op]:
    return sorted((op for op in ops if op.kind == kind), key=lambda op: op.patch.name)


def patch_text(
    module: str, file: str, text: str, ops: list[Op], *, version: str | None = None
) -> str:
    """Apply the diffs and AST transforms among ``ops`` to ``text``; raises PatchError.
    ``version`` ('vllm 0.33.0') is what a failed diff's message names; default: installed."""
    from importpatch.errors import installed_version

    for op in _by_patch(ops, DIFF):
        assert op.file_patch is not None
        try:
            text = diffs.apply(text, op.file_patch)
        except diffs.HunkMismatch as exc:  # every failing hunk, and whether it is upstream
            what = exc.message(version or installed_version(module))
            raise PatchError(op.patch.name, module, what, file=file) from None
        except diffs.DiffError as exc:  # a -U0 hunk of a FilePatch made without declare
            raise PatchError(op.patch.name, module, str(exc), file=file) from None
    transforms = _by_patch(ops, TRANSFORM)
    if transforms:
        tree = _parse(text, module, file, transforms[0])
        for op in transforms:
            try:
                new = op.obj(tree)
            except Exception as exc:
                raise PatchError(
                    op.patch.name, module, f"AST transform {op.obj.__qualname__} raised {exc!r}",
                    file=file,
                ) from exc
            if not isinstance(new, ast.Module):
                raise PatchError(
                    op.patch.name, module,
                    f"AST transform {op.obj.__qualname__} returned {type(new).__name__}, "
                    "not ast.Module", file=file,
                )
            tree = new
        text = splice(text, tree)
    for op in _by_patch(ops, FIELD):
        from importpatch.rewrite import fields

        try:
            text = fields.apply(text, op, module)
        except fields.FieldError as exc:
            raise PatchError(op.patch.name, module, f"field {op.qualname}: {exc}",
                             file=file) from None
        except SyntaxError as exc:
            raise PatchError(op.patch.name, module, f"field {op.qualname}: the source does not "
                             f"parse: {exc.msg} (line {exc.lineno})", file=file) from None
    return text


def _parse(text: str, module: str, file: str, op: Op) -> ast.Module:
    try:
        return ast.parse(text, filename=file)
    except SyntaxError as exc:
        raise PatchError(
            op.patch.name, module, f"patched source does not parse: {exc.msg} (line {exc.lineno})",
            file=file,
        ) from None


def splice(text: str, new_tree: ast.Module) -> str:
    """Text for ``new_tree``: original text for top-level statements that did not change,
    ``ast.unparse`` for the ones that did. A shorter replacement is padded with blank lines so
    the lines below it do not move."""
    old_tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    old_dumps = [ast.dump(s) for s in old_tree.body]
    new_dumps = [ast.dump(s) for s in new_tree.body]
    out: list[str] = []
    pos = 0  # next original line (0-based) not yet emitted

    def emit_original(upto: int) -> None:
        nonlocal pos
        out.extend(lines[pos:upto])
        pos = max(pos, upto)

    def span(stmt: ast.stmt) -> tuple[int, int]:
        start = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])]) - 1
        end = stmt.end_lineno if stmt.end_lineno is not None else stmt.lineno
        return start, end

    matcher = difflib.SequenceMatcher(a=old_dumps, b=new_dumps, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            if i2 > i1:
                emit_original(span(old_tree.body[i2 - 1])[1])
            continue
        # Region of original text being replaced: from the first old statement to the last.
        if i2 > i1:
            start, _ = span(old_tree.body[i1])
            _, end = span(old_tree.body[i2 - 1])
        else:
            start = end = pos
        emit_original(start)
        new_text = "".join(ast.unparse(s) + "\n" for s in new_tree.body[j1:j2])
        new_lines = new_text.splitlines()
        old_count = end - start
        new_lines += [""] * max(0, old_count - len(new_lines))
        out.extend(line + newline for line in new_lines)
        pos = max(pos, end)
    out.extend(lines[pos:])
    return "".join(out)


_MAIN_BLOCK = re.compile(r"^if\s+.*__main__", re.M)  # done() must go before such a block


def compile_module(
    module: str, text: str, qualnames: list[str], fact_quals: set[str], code_filename: str,
    original: str | None = None,
) -> tuple[CodeType, dict[str, Fact]]:
    """Parse the (patched) text, read what it proves of ``fact_quals`` (before the tree changes),
    add definition-site landings for ``qualnames`` and the begin/done hooks, compile.
    ``original``: the module's text before code changes, whose originals the facts' digests are
    of (default: ``text``)."""
    if not qualnames and not fact_quals and not _MAIN_BLOCK.search(text):
        # Only code changes: nothing to land, nothing to add, so the text plus one closing line
        # compiles directly (about twice as fast as parse + compile(tree)); lines do not move.
        closing = f"\n{HOOKS}.done({module!r})\n"
        return compile(text + closing, code_filename, "exec", dont_inherit=True), {}
    tree, facts = module_tree(module, text, qualnames, fact_quals, code_filename, original)
    return compile(tree, code_filename, "exec", dont_inherit=True), facts


def module_tree(
    module: str, text: str, qualnames: list[str], fact_quals: set[str], code_filename: str,
    original: str | None = None,
) -> tuple[ast.Module, dict[str, Fact]]:
    """What ``compile_module`` compiles, as a tree (landings and begin/done included): what
    another import hook's transform works on (importpatch/load/hooks.py)."""
    if not qualnames and not fact_quals and not _MAIN_BLOCK.search(text):
        closing = f"\n{HOOKS}.done({module!r})\n"
        return ast.parse(text + closing, filename=code_filename), {}
    tree = ast.parse(text, filename=code_filename)
    facts = landing.facts_of(tree, fact_quals)
    if original is None or original == text:
        landing.add_digests(facts, tree, text)
    else:  # the digests are of the originals as released, before the code changes
        try:  # noqa: SIM105 (contextlib is not imported on the import path)
            landing.add_digests(facts, ast.parse(original), original)
        except SyntaxError:
            pass
    # begin/done on the line after the file's last: a line no real statement has
    unseen = landing.rewrite(tree, module, qualnames, len(text.splitlines()) + 1)
    for qual in unseen & facts.keys():
        facts[qual].seen = False
    return tree, facts
