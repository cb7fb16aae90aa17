"""What a patch file states about itself, read from its text and never run: the names of the
``Patch`` objects it makes, the modules its target strings and diff headers name, and whether
it says ``default=True``.

For a file whose declaration raised (``SystemExit`` too), ran past the discovery limit, could
not be read in full, or that discovery never reached before it ended (catalog._broken_entries):
enabled by the name it states, its targets fail closed at their import instead of the request
ending in "unknown patch name" and the target running unpatched (issue 34, item 2). What the
text does not show (a name computed at run time) leaves the entry ``unsure``.

Imported only where the index is rebuilt and a file is broken: the warm path never loads it.
"""

from __future__ import annotations

import os
import re

from importpatch import safefiles

# Of a file refused by its size (or cut short), the head read to find what it states.
HEAD_BYTES = 1 << 20

# Methods of a Patch whose first argument is a target string ("pkg.mod:Qual" or, for
# ``transform``, ``after_import`` and ``redirect``, "pkg.mod"; candidates "a.b|c.d").
_OP_METHODS = ("replace", "wrap", "add", "subclass", "field", "transform", "after_import",
               "redirect")
_MODULE_ONLY = ("transform", "after_import", "redirect")
_NAME = re.compile(r"""\bPatch\(\s*(?:name\s*=\s*)?(['"])([A-Za-z0-9_.-]+)\1""")
_DIFF_FILE = re.compile(r"^(?:\+\+\+|---) (?:[ab]/)?(\S+)\.py\s*$", re.M)
_TARGET = re.compile(r"""["']([A-Za-z_][\w.|]*):[A-Za-z_][\w.]*["']""")


def head_text(path: str) -> str | None:
    """The text of ``path`` (of its first ``HEAD_BYTES`` when it is bigger than a patch file may
    be), or None where it cannot be read (not a regular file, no permission)."""
    try:
        raw = safefiles.read_regular(path, safefiles.MAX_PATCH_FILE_BYTES)
    except safefiles.TooBig:
        try:
            raw = safefiles.read_regular(path, HEAD_BYTES, head=True)
        except OSError:
            return None
    except OSError:
        return None
    return raw.decode("utf-8", "replace")


class Stated:
    """What one patch file's text states. ``names``: the patch names, in order; ``modules``: per
    name, the candidate groups of the modules it targets (the modules the text names that no
    one ``Patch`` can be told to own go to every name); ``default``: the names that say
    ``default=True``; ``sure``: every ``Patch(...)`` of it has a literal name and default, so
    no other patch (one on by default) can hide in it."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.modules: dict[str, list[tuple[str, ...]]] = {}
        self.default: set[str] = set()
        self.requires: dict[str, tuple[str, ...]] = {}
        self.sure = True
        self.loose: list[tuple[str, ...]] = []  # named where the text names no patch

    def every(self) -> list[tuple[str, ...]]:
        """Every group of modules the text names."""
        out = list(self.loose)
        for groups in self.modules.values():
            out.extend(g for g in groups if g not in out)
        return out

    def add(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)
            self.modules[name] = []

    def target(self, name: str | None, group: tuple[str, ...]) -> None:
        if not self.names and group not in self.loose:
            self.loose.append(group)
        for owner in [name] if name in self.modules else self.names:
            if group not in self.modules[owner]:
                self.modules[owner].append(group)


def of_file(path: str) -> Stated:
    """What the text of the patch file ``path`` states (empty where it cannot be read)."""
    text = head_text(path)
    if text is None:
        out = Stated()
        out.sure = False
        return out
    if path.endswith((".diff", ".patch")):
        return _of_diff(path, text)
    return _of_python(text)


def _diff_modules(text: str) -> list[tuple[str, ...]]:
    mods = [m.group(1).replace("/", ".").removesuffix(".__init__")
            for m in _DIFF_FILE.finditer(text)]
    return [(m,) for m in dict.fromkeys(mods) if m != "dev.null"]


def _of_diff(path: str, text: str) -> Stated:
    from importpatch.discover.declare import parse_header, split_requires

    preamble = []
    for line in text.splitlines():
        if line.startswith(("diff --git ", "--- ", "+++ ", "@@ ")):
            break
        preamble.append(line)
    header = parse_header("\n".join(preamble))
    out = Stated()
    # A diff without a Name header is named by its file's stem (declare.patch_from_diff_file).
    name = (header.get("name") or [os.path.splitext(os.path.basename(path))[0]])[0]
    out.add(name)
    if (header.get("default") or ["off"])[0].lower() in ("on", "true", "yes"):
        out.default.add(name)
    out.requires[name] = tuple(r for line in header.get("requires", [])
                               for r in split_requires(line))
    for group in _diff_modules(text):
        out.target(name, group)
    return out


def _groups(target: str, *, module_only: bool) -> tuple[str, ...] | None:
    mods = target if module_only else target.partition(":")[0]
    if not module_only and ":" not in target:
        return None
    group = tuple(m.strip() for m in mods.split("|"))
    if not group or not all(p.isidentifier() for m in group for p in m.split(".")):
        return None
    return group


def _of_python(text: str) -> Stated:
    import ast

    out = Stated()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte
        tree = None
    if tree is None:  # it does not parse: the names and targets its text shows, by pattern
        out.sure = False
        for m in _NAME.finditer(text):
            out.add(m.group(2))
        for group in _regex_groups(text):
            out.target(None, group)
        return out
    consts: dict[str, str] = {}  # NAME = "text" at module level: Patch(NAME)
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            consts[node.targets[0].id] = node.value.value
    aliases = {"Patch"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                           for a in n.names if a.name == "Patch" and a.asname}
    variables: dict[str, str] = {}  # p = Patch("x"): p's operations are x's

    def literal(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return consts.get(node.id)
        return None

    def patch_name(node: ast.AST) -> str | None:
        """The name of the Patch a ``Patch(...)`` call makes, or None (not such a call)."""
        if not isinstance(node, ast.Call):
            return None
        func = node.func
        if not ((isinstance(func, ast.Name) and func.id in aliases)
                or (isinstance(func, ast.Attribute) and func.attr == "Patch")):
            return None
        keywords = {k.arg: k.value for k in node.keywords}
        name = literal(node.args[0] if node.args else keywords.get("name"))
        if name is None or None in keywords:  # a computed name, or **options
            out.sure = False
            return None
        out.add(name)
        default = keywords.get("default")
        if default is not None:
            if isinstance(default, ast.Constant):
                if default.value:
                    out.default.add(name)
            else:
                out.sure = False  # default=<computed>: maybe on
        requires = literal(keywords.get("requires"))
        if requires:
            from importpatch.discover.declare import split_requires

            out.requires[name] = tuple(split_requires(requires))
        return name

    def owner_of(node: ast.AST) -> str | None:
        """The patch an operation's receiver is: ``p`` of ``p = Patch("x")``, or the call."""
        if isinstance(node, ast.Name):
            return variables.get(node.id)
        return patch_name(node)

    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    for call in calls:  # every name first: an operation may come before its Patch in walk order
        patch_name(call)
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
                stmt.targets[0], ast.Name):
            value: ast.AST = stmt.value
            while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                   and patch_name(value) is None):
                value = value.func.value  # p = Patch("x").replace(...): its receiver
            owner = owner_of(value)
            if owner is not None:
                variables[stmt.targets[0].id] = owner
    attributed: set[tuple[str, ...]] = set()
    for call in calls:
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr in (*_OP_METHODS, "diff", "adopt")):
            continue
        first = literal(call.args[0]) if call.args else None
        if func.attr == "after_import" and len(call.args) > 1:
            helper = literal(call.args[1])  # "helper.module:function": no target of the patch
            if helper and ":" in helper:
                attributed.add(tuple(helper.partition(":")[0].split("|")))
        if func.attr == "redirect" and len(call.args) > 1:
            to = literal(call.args[1])  # the module it becomes: no target of the patch
            if to:
                attributed.add((to,))
        if func.attr == "adopt" and first and ":" in first:
            # Patch.adopt("team.module:function", {"pkg.mod:Qual": "replaced", ...}): the
            # function's module is no target; the dict's keys are
            attributed.add(tuple(first.partition(":")[0].split("|")))
            owner = owner_of(func.value)
            table = call.args[1] if len(call.args) > 1 else None
            keys = table.keys if isinstance(table, ast.Dict) else []
            for group in filter(None, (_groups(k, module_only=False) for k in map(literal, keys)
                                       if k)):
                out.target(owner, group)
                attributed.add(group)
            continue
        if first is None:
            continue
        if func.attr == "diff":
            groups = _diff_modules(first)
        else:
            one = _groups(first, module_only=func.attr in _MODULE_ONLY)
            groups = [one] if one else []
        owner = owner_of(func.value)
        for group in groups:
            out.target(owner, group)
            attributed.add(group)
    # Target strings and diff headers elsewhere in the text (a table of targets, a helper that
    # declares): any of its patches may own them.
    for group in _regex_groups(text):
        if not any(set(group) <= set(g) for g in attributed):
            out.target(None, group)
    return out


def _regex_groups(text: str) -> list[tuple[str, ...]]:
    groups = _diff_modules(text)
    for m in _TARGET.finditer(text):
        group = tuple(m.group(1).split("|"))
        if group not in groups:
            groups.append(group)
    return groups
