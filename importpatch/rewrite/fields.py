"""Class-body fields: a member written into a class body *before* the class statement runs.

A dataclass, a ``msgspec.Struct`` (vLLM's ``SamplingParams``), a pydantic model, a ``NamedTuple``,
a ``TypedDict`` or an ``Enum`` collects its fields from the class body when the class is built;
an attribute set afterwards (``add``) is a class attribute, not a field. ``Patch.field`` inserts
the line into the class body in the module's text, as a source diff would:

    patch.field("vllm.sampling_params:SamplingParams.banned_token_ids", "list[int] | None", None)

    ==>     class SamplingParams(PydanticMsgspecMixin, msgspec.Struct, ...):
                ...
                skip_reading_prefix_cache: bool | None = None
                banned_token_ids: list[int] | None = None      <- inserted

Where the line goes: after the last annotated member of the class body (and the string that
documents it, if any); a member without a default goes before the first annotated member with a
default (dataclasses and Structs need that order); a member without an annotation (an Enum member)
after the last assignment; a class with none of these gets it first (after its docstring).
Comments stay where they are. ``existing=True`` changes the default (and, when given, the
annotation) of a member the class body already assigns, in place.

Invariants:
- The default is written as a literal when it is one (``None``, numbers, strings, bytes, and
  lists, tuples, dicts and sets of them: ``repr`` parses back to an equal value), so the patched
  text reads as the edit a person would make. Any other object stays in the patch and the line
  reads ``__import__('importpatch.install.activation').install.activation.value('MODULE',
  'Class.name')``: the code names the field, never the object, so the compiled module stays
  cacheable (``fingerprint``: the bytecode cache keys on the inserted text).
- A field is a code change like a diff: ``importpatch diff`` shows it, ``check`` tries it, and an
  already-imported module cannot get it late.
"""

from __future__ import annotations

import ast

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from importpatch.discover.declare import Op

_LITERAL_TYPES = (type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set)


class FieldError(ValueError):
    """A field cannot be written into the class body (the message says why)."""


def literal(value: Any) -> str | None:
    """``repr(value)`` when it is a Python literal that reads back as an equal value, else None."""
    if not _is_plain(value):
        return None
    text = repr(value)
    try:
        back = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return text if type(back) is type(value) and back == value else None


def _is_plain(value: Any, depth: int = 0) -> bool:
    if type(value) not in _LITERAL_TYPES or depth > 20:
        return False
    if isinstance(value, dict):
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, (tuple, list, set)):
        return all(_is_plain(v, depth + 1) for v in value)
    return True


def value_text(op: Op, module: str) -> str | None:
    """The text of the field's default (None: the op gives no default)."""
    from importpatch.discover.declare import _MISSING

    if op.obj is _MISSING:
        return None
    text = literal(op.obj)
    if text is not None:
        return text
    from importpatch.rewrite.facts import HOOKS

    return f"{HOOKS}.value({module!r}, {op.qualname!r})"


def fingerprint(op: Op) -> bytes:
    """What the field contributes to the compiled code: its target, annotation and value text
    (the value object itself only when it is a literal: it is then part of the text)."""
    assert op.qualname is not None
    parts = (op.qualname, op.annotation or "", str(op.existing),
             value_text(op, "") or "<no default>")
    return "\0".join(parts).encode("utf-8", "surrogateescape")


def describe(op: Op, module: str) -> str:
    """One line for ``check``: what the field writes where."""
    assert op.qualname is not None
    from importpatch.discover.declare import _MISSING

    owner, _, name = op.qualname.rpartition(".")
    value = None if op.obj is _MISSING else (
        literal(op.obj) or f"<the patch's {type(op.obj).__name__} object>")
    if op.existing:
        parts = [f"default {value}" if value is not None else "",
                 f"annotation {op.annotation}" if op.annotation is not None else ""]
        return f"changes the {' and '.join(p for p in parts if p)} of {op.qualname} in place"
    text = name + (f": {op.annotation}" if op.annotation is not None else "")
    text += f" = {value}" if value is not None else ""
    return f"writes '{text}' into the body of class {owner}"


# -- Writing it into the text ---------------------------------------------------------------------


def apply(text: str, op: Op, module: str) -> str:
    """``text`` with ``op``'s field written into every class statement of its owner."""
    from importpatch.rewrite import bindings
    from importpatch.rewrite.diffs import _split_keepends

    assert op.qualname is not None
    owner, _, name = op.qualname.rpartition(".")
    tree = ast.parse(text)
    classes = bindings.class_nodes(tree, owner)
    if not classes:
        raise FieldError(f"class {owner} not found (no class statement binds it)")
    lines = _split_keepends(text)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    value = value_text(op, module)
    # Bottom-up, so the line numbers of the edits still to make stay valid.
    for cls in sorted(classes, key=lambda c: c.lineno, reverse=True):
        members = _members(cls.body, name)
        where = f"{owner}.{name}"
        if op.existing:
            if not members:
                raise FieldError(f"{where} is not assigned in the class body (line {cls.lineno}); "
                                 "use existing=False to add it")
            for stmt in sorted(members, key=lambda s: s.lineno, reverse=True):
                lines = _change(lines, stmt, where, op.annotation, value)
        else:
            if members:
                raise FieldError(f"{where} already exists (line {members[0].lineno}); "
                                 "use existing=True to change its default")
            lines = _insert(lines, cls, name, op.annotation, value, newline)
    return "".join(lines)


def _members(body: list[ast.stmt], name: str) -> list[ast.stmt]:
    """Statements of a class body (its nested blocks included) that bind or annotate ``name``."""
    from importpatch.rewrite import bindings

    out: list[ast.stmt] = []
    for stmt in body:
        annotated = isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
            and stmt.target.id == name  # `name: T` binds nothing, yet declares a field
        if annotated or any(bound == name for bound, _ in bindings.direct(stmt)):
            out.append(stmt)
        for block in bindings.blocks(stmt):
            out += _members(block.body, name)
    return out


def _is_field(stmt: ast.stmt, annotated: bool) -> bool:
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name)
    return not annotated and isinstance(stmt, ast.Assign) and all(
        isinstance(t, ast.Name) for t in stmt.targets)


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(
        stmt.value.value, str)


def _insert(lines: list[str], cls: ast.ClassDef, name: str, annotation: str | None,
            value: str | None, newline: str) -> list[str]:
    body = cls.body
    if body[0].lineno == cls.lineno:
        raise FieldError(f"class {cls.name} (line {cls.lineno}) has its body on the class line; "
                         "a field cannot be inserted there")
    annotated = annotation is not None
    fields = [i for i, s in enumerate(body) if _is_field(s, annotated)]
    defaulted = [i for i in fields if getattr(body[i], "value", None) is not None]
    before: ast.stmt | None = None
    after: ast.stmt | None = None
    if annotated and value is None and defaulted:
        before = body[defaulted[0]]
    elif fields:
        i = fields[-1]
        if i + 1 < len(body) and _is_docstring(body[i + 1]):
            i += 1  # the string that documents the last field stays with it
        after = body[i]
    elif _is_docstring(body[0]):
        after = body[0]
    else:
        before = body[0]
    anchor = before or after
    assert anchor is not None
    indent = _indent(lines[anchor.lineno - 1])  # a body statement's line: the body's indent
    text = name + (f": {annotation}" if annotation is not None else "")
    text += f" = {value}" if value is not None else ""
    new = f"{indent}{text}{newline}"
    if after is not None:
        at = after.end_lineno or after.lineno
        if not lines[at - 1].endswith("\n"):  # the file's last line, unterminated
            lines[at - 1] += newline
    else:
        assert before is not None
        at = min([before.lineno] + [d.lineno for d in getattr(before, "decorator_list", [])]) - 1
        while at > cls.lineno and lines[at - 1].strip().startswith("#"):
            at -= 1  # above the comment that introduces that member
    return lines[:at] + [new] + lines[at:]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _span(lines: list[str], node: ast.AST) -> tuple[int, int, int, int]:
    """(first line index, first char, last line index, end char) of ``node`` in ``lines``."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1  # type: ignore[attr-defined]

    def char(index: int, byte: int) -> int:
        return len(lines[index].encode("utf-8")[:byte].decode("utf-8", "replace"))

    return (first, char(first, node.col_offset),  # type: ignore[attr-defined]
            last, char(last, node.end_col_offset))  # type: ignore[attr-defined]


def _replace(lines: list[str], node: ast.AST, text: str) -> list[str]:
    first, start, last, end = _span(lines, node)
    merged = lines[first][:start] + text + lines[last][end:]
    return lines[:first] + [merged] + lines[last + 1:]


def _change(lines: list[str], stmt: ast.stmt, where: str, annotation: str | None,
            value: str | None) -> list[str]:
    """Change the default (and annotation) of one assignment, editing only those spans."""
    if isinstance(stmt, ast.AnnAssign):
        if value is not None:
            if stmt.value is not None:
                lines = _replace(lines, stmt.value, value)
            else:
                first, start, last, end = _span(lines, stmt.annotation)
                lines[last] = lines[last][:end] + f" = {value}" + lines[last][end:]
        if annotation is not None:
            lines = _replace(lines, stmt.annotation, annotation)
        return lines
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
            stmt.targets[0], ast.Name):
        if value is not None:
            lines = _replace(lines, stmt.value, value)
        if annotation is not None:
            lines = _replace(lines, stmt.targets[0], f"{stmt.targets[0].id}: {annotation}")
        return lines
    kind = type(stmt).__name__
    raise FieldError(f"{where} is bound by a {kind} statement at line {stmt.lineno}, not a plain "
                     "'name = value' or 'name: type = value' (use replace)")
