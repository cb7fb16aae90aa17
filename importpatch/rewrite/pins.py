"""Pins: what a Python patch operation's target was when the patch was written (issue 28).

A pin records, per operation on a Python object (replace, wrap, subclass, set; add and field pin
the class they go into), the release its target came from (distribution and version) and the
original's source: its text, and the digest of its normalised text. Pins live beside the patch,
in ``<patch file without .py>.pin.toml`` (a package patch: beside the module that declares it,
e.g. ``pkg/__init__.pin.toml``), written by ``importpatch pin NAME``
(importpatch/tools/pinning.py), a TOML file meant to be read in review and committed with the
patch. A patch without one works as before ("unpinned").

This module is the part the import hook uses, so it stays cheap: ``digest_of`` runs when a module
is compiled (``landing.facts_of``; its result is cached with the code), and ``pins_of`` reads a
pin file with plain string operations (no ``tomllib``, no ``json``) at most once per process, when
a module that a pinned patch targets is imported. Comparing the two is a string compare.

What a pin covers: every live binding of the name that can run (``bound_nodes``): both branches
of an ``if``/``else``, a ``try``/``except ImportError`` fallback, a redefinition later in the
module, each a statement with its decorators, dedented, in source order (``original_text``). A name
bound once is that one statement, as before.

Normalised text (``normalise``): the comments dropped (``tokenize``'s COMMENT tokens: never a ``#``
inside a string), each line's trailing white space removed and blank lines dropped, except the
lines inside a multi-line string, which are content and kept as they are (embedded kernel source, a
shell script, a prompt template). Formatting and comment churn never changes it; any change of the
code or of a string does. Its digest is ``sha256-2:<hex>``.

Pins written before (``sha256:<hex>``, the first binding only, every blank or ``#``-line dropped,
``normalise_v1``) keep being compared the way they were made, so that upgrading importpatch does
not report drift that is not there; ``importpatch pin NAME`` again makes them cover every binding.
A fact's digest (``digests_of``) holds both, and ``matches`` compares a pin with the one of its
kind.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    from typing import Any

SUFFIX = ".pin.toml"
# Kinds pinned on their own target, and kinds pinned on the class they go into.
SELF_KINDS = ("replace", "wrap", "subclass", "set")
OWNER_KINDS = ("add", "field")


def pinned_qual(kind: str, qualname: str | None) -> str | None:
    """The qualname whose original a ``kind`` operation on ``qualname`` is pinned to, or None."""
    if not qualname:
        return None
    if kind in SELF_KINDS:
        return qualname
    if kind in OWNER_KINDS:
        return qualname.rpartition(".")[0] or None
    return None


def pin_kind(op: Any) -> str:
    """The kind ``op`` is pinned as: an ``after_import`` that declares an attribute it changes
    (``Patch.adopt``) as a ``set`` when the attribute is there before (replaced, deleted) and as
    an ``add`` (the class it goes into) when the function adds it; any other op as its own."""
    if op.kind == "after_import" and op.qualname:
        return "set" if op.existing else "add"
    return str(op.kind)


def segment(lines: list[str], node: ast.stmt) -> str:
    """The text of ``node`` (with its decorators) from the module's ``lines``, dedented."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
    last = getattr(node, "end_lineno", None) or node.lineno
    chunk = [line.rstrip("\r\n") for line in lines[first - 1:last]]
    indent = min((len(x) - len(x.lstrip()) for x in chunk if x.strip()), default=0)
    return "".join(f"{x[indent:] if not x[:indent].strip() else x.lstrip()}\n" for x in chunk)


PREFIX = "sha256-2:"  # the digest of ``normalise``: every binding, strings kept whole
PREFIX_V1 = "sha256:"  # pins written before: the first binding, ``normalise_v1``


def normalise_v1(text: str) -> str:
    """The normalisation of pins written before (``sha256:``): trailing white space off, blank
    lines and lines starting with ``#`` dropped (inside strings too)."""
    out = []
    for line in text.splitlines():
        stripped = line.rstrip()
        if stripped and not stripped.lstrip().startswith("#"):
            out.append(stripped)
    return "\n".join(out) + "\n"


def normalise(text: str) -> str:
    """``text`` without its comments, trailing white space and blank lines, by the tokenizer: a
    line that starts inside a string is content, kept whole (a ``#``-line of embedded C or shell
    is code there). Text the tokenizer refuses falls back to ``normalise_v1``."""
    import io
    import tokenize

    lines = text.splitlines()
    inside: set[int] = set()  # 1-based rows wholly inside a string (not the one it ends on)
    cuts: dict[int, list[tuple[int, int]]] = {}  # row: the (start, end) columns of comments
    opened: list[int] = []  # rows of the open f-/t-strings (3.12+: START ... END tokens)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            kind = tokenize.tok_name.get(tok.type, "")
            if tok.type == tokenize.COMMENT:
                cuts.setdefault(tok.start[0], []).append((tok.start[1], tok.end[1]))
            elif tok.type == tokenize.STRING:
                inside.update(range(tok.start[0] + 1, tok.end[0]))
            elif kind.endswith("STRING_START"):
                opened.append(tok.start[0])
            elif kind.endswith("STRING_END") and opened:
                inside.update(range(opened.pop() + 1, tok.end[0]))
    except (tokenize.TokenError, SyntaxError):
        return normalise_v1(text)
    out = []
    for row, line in enumerate(lines, 1):
        for start, end in reversed(cuts.get(row, [])):
            line = line[:start] + line[end:]
        if row in inside:  # content, blank or not: kept as it is
            out.append(line)
            continue
        line = line.rstrip()
        if line:
            out.append(line)
    return "\n".join(out) + "\n"


def digest(text: str) -> str:
    """``sha256-2:<hex>`` of the normalised ``text``."""
    import hashlib

    data = normalise(text).encode("utf-8", "surrogatepass")
    return PREFIX + hashlib.sha256(data).hexdigest()


def digest_v1(text: str) -> str:
    """``sha256:<hex>`` of ``normalise_v1(text)``: how pins written before were made."""
    import hashlib

    data = normalise_v1(text).encode("utf-8", "surrogatepass")
    return PREFIX_V1 + hashlib.sha256(data).hexdigest()


# An entry binding's node is the first statement of the block it enters (``for f in``, ``with ...
# as f``, ``except E as f``, a ``case`` capture): not code of the name, so not pinned.
_ENTRY_KINDS = ("for target", "with target", "except target", "match capture")


def bound_nodes(tree: ast.Module, qual: str) -> list[ast.stmt]:
    """Every live statement that binds ``qual`` (``name`` or ``Class.attr`` through every class
    statement of ``Class``), in source order: each branch of an ``if``, a ``try`` body and its
    handlers, a redefinition; dead code (``if False:``) left out. [] when none does."""
    import ast

    from importpatch.rewrite import bindings

    scopes: list[list[ast.stmt]] = [tree.body]
    *owners, name = qual.split(".")
    for part in owners:
        scopes = [b.node.body for body in scopes for b in bindings.scope_bindings(body, part)
                  if isinstance(b.node, ast.ClassDef)]
    out: list[ast.stmt] = []
    for body in scopes:
        for b in bindings.scope_bindings(body, name):
            if b.kind not in _ENTRY_KINDS and all(b.node is not n for n in out):
                out.append(b.node)
    return out


def original_text(lines: list[str], nodes: list[ast.stmt]) -> str:
    """The pinned text of ``nodes`` (``bound_nodes``): one statement's ``segment``; several, each
    after a comment line naming where it is (comments do not count in the digest, so moving
    them does not either)."""
    if len(nodes) == 1:
        return segment(lines, nodes[0])
    return "".join(f"# binding {i} of {len(nodes)}, line {n.lineno}\n{segment(lines, n)}"
                   for i, n in enumerate(nodes, 1))


def digests_of(tree: ast.Module, lines: list[str], qual: str) -> str:
    """What the import hook keeps of ``qual``'s original: ``digest`` of every binding and
    ``digest_v1`` of the first, separated by a space (``matches``); "" when nothing binds it."""
    nodes = bound_nodes(tree, qual)
    if not nodes:
        return ""
    return f"{digest(original_text(lines, nodes))} {digest_v1(segment(lines, nodes[0]))}"


def matches(pinned: str, digests: str) -> bool:
    """Whether a pin's digest is one of ``digests`` (``digests_of``): the digest of its kind."""
    return bool(pinned) and pinned in digests.split()


# -- Pin files -----------------------------------------------------------------------------------


def path_for_file(file: str) -> str:
    """The pin file of a patch declared in ``file``."""
    stem = file[:-3] if file.endswith(".py") else file
    return stem + SUFFIX


def declaring_file(patch: Any) -> str | None:
    """The file of the module that declares ``patch``: a patch file, or the module of its entry
    point or of the code that made it."""
    source = str(getattr(patch, "source", "") or "")
    if source.endswith(".py") and os.path.isabs(source):
        return source
    module = source.partition(" = ")[2].partition(":")[0].strip() if " = " in source else ""
    module = module or str(getattr(patch, "defined_in", "") or "")
    file = getattr(sys.modules.get(module), "__file__", None) if module else None
    return file if isinstance(file, str) and file.endswith(".py") else None


def path_of(patch: Any) -> str | None:
    file = declaring_file(patch)
    return path_for_file(file) if file else None


class Pin:
    """One ``[[pin]]`` table."""

    __slots__ = ("patch", "kind", "target", "module", "qualname", "dist", "version", "digest",
                 "source")
    # The fields, for type checkers (set from __slots__ by __init__).
    patch: str
    kind: str
    target: str
    module: str
    qualname: str
    dist: str
    version: str
    digest: str
    source: str

    def __init__(self, **fields: str) -> None:
        for name in self.__slots__:
            setattr(self, name, fields.get(name, ""))

    @property
    def release(self) -> str:
        return f"{self.dist} {self.version}".strip()

    def to_dict(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in self.__slots__}


_read: dict[str, list[Pin]] = {}


def pins_of(patch: Any) -> dict[tuple[str, str], Pin]:
    """The pins of ``patch`` by (module, qualname); {} when it has none. Read once per process."""
    path = path_of(patch)
    if path is None:
        return {}
    pins = _read.get(path)
    if pins is None:
        try:
            with open(path, encoding="utf-8") as f:
                pins = parse(f.read())
        except (OSError, UnicodeDecodeError, ValueError):
            pins = []
        _read[path] = pins
    name = getattr(patch, "name", "")
    return {(pin.module, pin.qualname): pin for pin in pins if pin.patch == name}


def parse(text: str) -> list[Pin]:
    """The pins of a pin file: the TOML subset ``render`` writes (``[[pin]]`` tables of string
    values; ``source`` a multi-line literal string, or a basic string when the text needs
    escapes). Raises ValueError on anything else."""
    pins: list[Pin] = []
    fields: dict[str, str] | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        if line == "[[pin]]":
            if fields is not None:
                pins.append(Pin(**fields))
            fields = {}
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or fields is None or not key.isidentifier():
            raise ValueError(f"line {i}: expected [[pin]] or key = \"value\"")
        if value == "'''":  # a multi-line literal string: up to the closing '''
            body = []
            while i < len(lines) and lines[i] != "'''":
                body.append(lines[i] + "\n")
                i += 1
            if i == len(lines):
                raise ValueError(f"line {i}: unterminated '''")
            i += 1
            fields[key] = "".join(body)
        elif len(value) >= 2 and value[0] == value[-1] == '"':
            fields[key] = _unescape(value[1:-1])
        else:
            raise ValueError(f"line {i}: {key}: a string value is expected")
    if fields is not None:
        pins.append(Pin(**fields))
    return pins


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    import json

    return str(json.loads(f'"{value}"'))


def _basic(value: str) -> str:
    import json

    out = json.dumps(value, ensure_ascii=False)
    return out.replace("\x7f", "\\u007f")


def render(pins: list[Pin]) -> str:
    """The text of a pin file (valid TOML: ``tomllib`` reads it too)."""
    out = [
        "# importpatch pins: what each target of these patches was when they were written.",
        "# Written by `importpatch pin NAME`; `importpatch check` compares them with a release.",
        "# Review and commit this file with the patch.",
    ]
    for pin in pins:
        out += ["", "[[pin]]"]
        for name in Pin.__slots__:
            value = getattr(pin, name)
            if name == "source" and _literal_ok(value):
                out += ["source = '''", value.rstrip("\n"), "'''"]
            else:
                out.append(f"{name} = {_basic(value)}")
    return "\n".join(out) + "\n"


def _literal_ok(text: str) -> bool:
    """Whether ``text`` can be a TOML multi-line literal string as ``parse`` reads it back."""
    if not text.endswith("\n") or text.endswith("\n\n") or "'''" in text or "\r" in text:
        return False
    if any(line == "'''" for line in text.splitlines()):
        return False
    return all(c == "\n" or c == "\t" or (c >= " " and c != "\x7f") for c in text)
