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

Normalised text: the statement's lines (decorators included), dedented, each line's trailing
white space removed, blank lines and lines holding only a comment dropped. Formatting and comment
churn elsewhere in the file never changes it; any change of the code does.
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


def segment(lines: list[str], node: ast.stmt) -> str:
    """The text of ``node`` (with its decorators) from the module's ``lines``, dedented."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
    last = getattr(node, "end_lineno", None) or node.lineno
    chunk = [line.rstrip("\r\n") for line in lines[first - 1:last]]
    indent = min((len(x) - len(x.lstrip()) for x in chunk if x.strip()), default=0)
    return "".join(f"{x[indent:] if not x[:indent].strip() else x.lstrip()}\n" for x in chunk)


def normalise(text: str) -> str:
    out = []
    for line in text.splitlines():
        stripped = line.rstrip()
        if stripped and not stripped.lstrip().startswith("#"):
            out.append(stripped)
    return "\n".join(out) + "\n"


def digest(text: str) -> str:
    """``sha256:<hex>`` of the normalised ``text``."""
    import hashlib

    return "sha256:" + hashlib.sha256(normalise(text).encode("utf-8", "surrogatepass")).hexdigest()


def digest_of(lines: list[str], node: ast.stmt) -> str:
    return digest(segment(lines, node))


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
