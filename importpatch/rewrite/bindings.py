"""Where a module's source binds a name: one analysis, used by the loader (where a patch lands, and
what is known before the module runs), by ``importpatch check`` (its verdict) and by late
activation (which globals of other modules are copies of a target).

Python's rules for a module or class scope, as applied here:
- Only a plain name binds: ``f = ...``, ``f: T = ...`` (with a value), ``f += ...``, ``def f``,
  ``class f``, ``import a.b`` (binds ``a``), ``import a.b as f``, ``from m import x as f``,
  ``for f in ...``, ``with ... as f``, ``except ... as f`` (unbound again when the handler ends),
  ``case`` captures, ``(f := ...)``. Subscript and attribute targets (``d[k] = ...``,
  ``o.f = ...``) bind no name. ``del f`` unbinds.
- Nested blocks (if/else, for/while/else, with, try/except/else/finally, match) are the same
  scope; function bodies and lambdas are not; a class body is a scope of its own, read for
  ``Class.attr`` targets.
- A binding is *conditional* when it is not on every path: under an ``if`` whose test is not a
  literal, in a loop, in a ``with`` body (a context manager may swallow an exception), in a
  ``try`` body (unless every handler binds the name too), a handler, a ``match`` case. Literal
  tests (``if True:``, ``if 0:``) are decided; code under a false one binds nothing.
- A binding is *derived* when its value is computed from the name's previous value
  (``f = lru_cache(f)``, ``@x.setter def x``, ``@f.register def f``, ``X += 1``): a patch landed
  on the earlier binding is carried by it (landing.py).
- *Hidden binders* may bind a name the source does not show: ``from m import *``, a module
  ``__getattr__``, ``globals()``, ``vars()``, ``locals()``, ``exec``, ``eval``, ``setattr``,
  ``__dict__``, ``global NAME`` in a function; for class attributes also class decorators, a
  metaclass, and ``C.attr = ...`` outside the class.
"""

from __future__ import annotations

import ast

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

# States of a name at the end of a scope.
BOUND, MAYBE, UNBOUND = "bound", "maybe", "unbound"
# Verdicts for a target (see ``verdict``). REFUSED: bound, but no patch can land there (why).
ABSENT, UNKNOWN, REFUSED = "absent", "unknown", "refused"

_DYNAMIC_CALLS = frozenset({"globals", "vars", "locals", "exec", "eval", "setattr"})


class Binding:
    """One binding of a name in a scope."""

    __slots__ = ("name", "kind", "line", "node", "conditional", "derived")

    def __init__(
        self, name: str, kind: str, node: ast.stmt, *, conditional: bool, derived: bool
    ) -> None:
        self.name = name
        self.kind = kind  # def, class, assignment, augmented, import, for, with, except, match, ...
        self.line = node.lineno
        self.node = node
        self.conditional = conditional
        self.derived = derived

    def __repr__(self) -> str:
        cond = " conditional" if self.conditional else ""
        return f"<Binding {self.name} {self.kind} line {self.line}{cond}>"


# -- What one statement does ----------------------------------------------------------------------


def target_names(target: ast.expr) -> list[str]:
    """Names a target binds: ``a``, ``a, (b, *c)``; never those inside ``d[k]`` or ``o.attr``."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in target_names(elt)]
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    return []


def direct(stmt: ast.stmt) -> list[tuple[str, str]]:
    """(name, kind) bound by ``stmt`` itself when it completes (not in its nested blocks)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [(stmt.name, "def")]
    if isinstance(stmt, ast.ClassDef):
        return [(stmt.name, "class")]
    if isinstance(stmt, ast.Assign):
        return [(n, "assignment") for t in stmt.targets for n in target_names(t)]
    if isinstance(stmt, ast.AnnAssign):
        return [(n, "assignment") for n in target_names(stmt.target)] if stmt.value else []
    if isinstance(stmt, ast.AugAssign):
        return [(n, "augmented assignment") for n in target_names(stmt.target)]
    if isinstance(stmt, ast.Import):
        return [(a.asname or a.name.partition(".")[0], "import") for a in stmt.names]
    if isinstance(stmt, ast.ImportFrom):
        return [(a.asname or a.name, "import") for a in stmt.names if a.name != "*"]
    return []


def walrus_names(stmt: ast.stmt) -> list[str]:
    """Names bound by ``(n := ...)`` in the expressions of ``stmt`` (not in nested statements,
    lambdas or function bodies; a walrus in a comprehension binds in this scope)."""
    out: list[str] = []
    stack: list[ast.AST] = [
        v for f, v in ast.iter_fields(stmt)
        if f not in ("body", "orelse", "finalbody", "handlers", "cases", "decorator_list")
        and isinstance(v, ast.AST)
    ]
    for f, v in ast.iter_fields(stmt):
        if f in ("targets", "decorator_list", "items", "bases", "keywords") and isinstance(v, list):
            stack.extend(x for x in v if isinstance(x, ast.AST))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            out.append(node.target.id)
        stack.extend(ast.iter_child_nodes(node))
    return out


def deleted(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Delete):
        return [n for t in stmt.targets for n in target_names(t)]
    return []


def _literal(test: ast.expr) -> bool | None:
    """The truth of a literal test (``True``, ``0``, ``"x"``, ``not False``), else None."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _literal(test.operand)
        return None if inner is None else not inner
    return None


class Block:
    """A nested block of the same scope: its statements, the names bound when it is entered
    (``for``/``with``/``except``/``case`` targets), and whether it runs on every path."""

    __slots__ = ("body", "entry", "conditional", "dead", "unbinds_at_exit")

    def __init__(
        self, body: list[ast.stmt], *, entry: list[tuple[str, str]] = (),  # type: ignore[assignment]
        conditional: bool = True, dead: bool = False, unbinds_at_exit: str | None = None,
    ) -> None:
        self.body = body
        self.entry = list(entry)
        self.conditional = conditional
        self.dead = dead
        self.unbinds_at_exit = unbinds_at_exit


def _pattern_names(pattern: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(pattern):
        name = getattr(node, "name", None) if isinstance(node, (ast.MatchAs, ast.MatchStar)) \
            else getattr(node, "rest", None) if isinstance(node, ast.MatchMapping) else None
        if isinstance(name, str):
            out.append(name)
    return out


def blocks(stmt: ast.stmt) -> list[Block]:
    """The nested blocks of ``stmt`` in the same scope (none for def/class)."""
    if isinstance(stmt, ast.If):
        lit = _literal(stmt.test)
        return [
            Block(stmt.body, conditional=lit is None, dead=lit is False),
            Block(stmt.orelse, conditional=lit is None, dead=lit is True),
        ]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        entry = [(n, "for target") for n in target_names(stmt.target)]
        return [Block(stmt.body, entry=entry), Block(stmt.orelse)]
    if isinstance(stmt, ast.While):
        dead = _literal(stmt.test) is False
        return [Block(stmt.body, dead=dead), Block(stmt.orelse)]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        entry = [
            (n, "with target") for item in stmt.items if item.optional_vars is not None
            for n in target_names(item.optional_vars)
        ]
        return [Block(stmt.body, entry=entry)]
    if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
        try_stmt: ast.Try = stmt  # type: ignore[assignment]
        out = [Block(try_stmt.body)]
        for handler in try_stmt.handlers:
            entry = [(handler.name, "except target")] if handler.name else []
            out.append(Block(handler.body, entry=entry, unbinds_at_exit=handler.name))
        out.append(Block(try_stmt.orelse))
        out.append(Block(try_stmt.finalbody, conditional=False))
        return out
    if isinstance(stmt, ast.Match):
        return [
            Block(case.body, entry=[(n, "match capture") for n in _pattern_names(case.pattern)])
            for case in stmt.cases
        ]
    return []


def is_derived(stmt: ast.stmt, name: str) -> bool:
    """Whether ``stmt``'s new value of ``name`` is computed from its previous value."""
    if isinstance(stmt, ast.AugAssign):
        return True
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        exprs: list[ast.expr] = list(stmt.decorator_list)
        if isinstance(stmt, ast.ClassDef):
            exprs += stmt.bases + [k.value for k in stmt.keywords]
    elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
        exprs = [stmt.value]
    else:
        return False
    return any(_loads(e, name) for e in exprs)


def _loads(expr: ast.expr, name: str) -> bool:
    """``expr`` reads ``name`` when it is evaluated (lambda bodies are not evaluated then)."""
    stack: list[ast.AST] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


# -- A scope --------------------------------------------------------------------------------------


def scope_bindings(body: list[ast.stmt], name: str) -> list[Binding]:
    """Every live binding of ``name`` in one scope, in source order (dead code left out)."""
    return list(_walk(body, name, conditional=False))


def touched(body: list[ast.stmt], name: str) -> tuple[str, Binding | None]:
    """Whether the scope's code binds or deletes ``name`` at all (even if it ends unbound, as after
    ``except E as name``): BOUND on every path, MAYBE on some, UNBOUND on none. An ``add`` of the
    name is overwritten or deleted by any of them."""
    found = list(_walk(body, name, conditional=False, deletions=True))
    if not found:
        return UNBOUND, None
    sure = [b for b in found if not b.conditional]
    return (BOUND, sure[0]) if sure else (MAYBE, found[0])


def _walk(
    body: list[ast.stmt], name: str, *, conditional: bool, deletions: bool = False
) -> Iterator[Binding]:
    for stmt in body:
        if deletions and name in deleted(stmt):
            yield Binding(name, "del", stmt, conditional=conditional, derived=False)
        for bound, kind in direct(stmt):
            if bound == name:
                yield Binding(name, kind, stmt, conditional=conditional,
                              derived=is_derived(stmt, name))
        if name in walrus_names(stmt):
            yield Binding(name, "assignment expression", stmt, conditional=True, derived=False)
        for block in blocks(stmt):
            if block.dead:
                continue
            cond = conditional or block.conditional
            for bound, kind in block.entry:
                if bound == name and block.body:
                    yield Binding(name, kind, block.body[0], conditional=True, derived=False)
            yield from _walk(block.body, name, conditional=cond, deletions=deletions)


def _join(a: str, b: str) -> str:
    return a if a == b else MAYBE


def final_state(body: list[ast.stmt], name: str, state: str = UNBOUND) -> str:
    """Whether ``name`` is bound when the scope's code has run to its end: BOUND, UNBOUND or
    MAYBE (bound on some paths only)."""
    for stmt in body:
        if any(bound == name for bound, _ in direct(stmt)):
            state = BOUND
        elif name in deleted(stmt):
            state = UNBOUND
        elif name in walrus_names(stmt):
            state = _join(state, BOUND) if isinstance(stmt, (ast.If, ast.While)) else BOUND
        parts = blocks(stmt)
        if not parts:
            continue
        if isinstance(stmt, ast.If):
            body_block, else_block = parts
            outcomes = [
                _run(b, name, state) for b in (body_block, else_block) if not b.dead
            ]
            state = outcomes[0] if len(outcomes) == 1 else _join(*outcomes)
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            loop, orelse = parts
            if not loop.dead:
                state = _join(state, _run(loop, name, state))
            state = _join(state, _run(orelse, name, state)) if orelse.body else state
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            state = _join(state, _run(parts[0], name, state))
        elif isinstance(stmt, ast.Match):
            outcomes = [_run(b, name, state) for b in parts]
            irrefutable = any(
                isinstance(c.pattern, ast.MatchAs) and c.pattern.pattern is None and c.guard is None
                for c in stmt.cases
            )
            if not irrefutable:
                outcomes.append(state)
            for o in outcomes[1:]:
                outcomes[0] = _join(outcomes[0], o)
            state = outcomes[0] if outcomes else state
        else:  # try
            try_block, *handlers, orelse, final = parts
            after_body = _run(try_block, name, state)
            partial = _join(state, after_body)  # an exception may come at any point of the body
            outcome = _run(orelse, name, after_body)
            for handler in handlers:
                outcome = _join(outcome, _run(handler, name, partial))
            state = _run(final, name, outcome)
    return state


def _run(block: Block, name: str, state: str) -> str:
    for bound, _ in block.entry:
        if bound == name:
            state = BOUND
    state = final_state(block.body, name, state)
    if block.unbinds_at_exit == name:
        state = UNBOUND
    return state


def hidden_binders(tree: ast.Module, name: str) -> str:
    """Why ``name`` may be bound at run time without a binding in the source ('' if nothing)."""
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
            return f"'from {'.' * stmt.level}{stmt.module or ''} import *' at line {stmt.lineno} " \
                   "may bind it"
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__getattr__":
            return f"the module-level __getattr__ at line {stmt.lineno} may provide it"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return f"'import *' at line {node.lineno} may bind it"
        if isinstance(node, ast.Global) and name in node.names:
            return f"'global {name}' at line {node.lineno} may bind it"
        reason = _dynamic(node)
        if reason:
            return reason
    return ""


def _dynamic(node: ast.AST) -> str:
    if isinstance(node, ast.Name) and node.id in _DYNAMIC_CALLS and isinstance(node.ctx, ast.Load):
        return f"{node.id}() at line {node.lineno} may bind names the source does not show"
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
        return f"__dict__ at line {node.lineno} may bind names the source does not show"
    return ""


def _class_hidden_binders(tree: ast.Module, cls: ast.ClassDef, attr: str) -> str:
    if cls.decorator_list:
        return f"class {cls.name} has decorators (line {cls.lineno}), which may set {attr}"
    if cls.keywords:
        return f"class {cls.name} has class keywords (a metaclass?), which may set {attr}"
    for node in ast.walk(cls):
        reason = _dynamic(node)
        if reason:
            return reason
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if (isinstance(t, ast.Attribute) and t.attr == attr
                    and isinstance(t.value, ast.Name) and t.value.id == cls.name):
                return f"line {t.lineno} sets {cls.name}.{attr} from outside the class"
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")):
            return f"{node.func.id}() at line {node.lineno} may set {cls.name}.{attr}"
    return ""


class Verdict:
    """What the source says of a target ``Outer.attr``: ``state`` is BOUND (bound on every path
    when the module has run), ABSENT (on no path, and nothing hidden may bind it), MAYBE (bound on
    some paths) or UNKNOWN (not visible, but may be bound in a way the source does not show, or its
    owner is not a class statement). ``binding``: the first live binding, for messages."""

    __slots__ = ("qualname", "state", "binding", "why", "owner_found")

    def __init__(self, qualname: str, state: str, binding: Binding | None, why: str = "",
                 owner_found: bool = True) -> None:
        self.qualname = qualname
        self.state = state
        self.binding = binding
        self.why = why
        self.owner_found = owner_found

    def __repr__(self) -> str:
        return f"<Verdict {self.qualname} {self.state} {self.why}>"


def verdict(tree: ast.Module, qualname: str, *, add: bool = False) -> Verdict:
    """The verdict for ``qualname`` (``name`` or ``Class.attr`` paths) in a module's tree.
    ``add``: for the last part, whether the code binds or deletes the name at all (``touched``):
    an added name must survive the module's execution."""
    parts = qualname.split(".")
    body: list[ast.stmt] = tree.body
    owner: ast.ClassDef | None = None
    for depth, part in enumerate(parts):
        found = scope_bindings(body, part)
        state = final_state(body, part)
        if add and depth == len(parts) - 1:
            state, first_touch = touched(body, part)
            if first_touch is not None and not found:
                found = [first_touch]
        if owner is None:
            hidden = hidden_binders(tree, part)
        else:
            hidden = _class_hidden_binders(tree, owner, part)
        here = ".".join(parts[: depth + 1])
        if state == UNBOUND:
            if hidden:
                return Verdict(qualname, UNKNOWN, found[0] if found else None, hidden,
                               owner_found=depth == len(parts) - 1)
            why = f"{here} is deleted at line {_last_del(body, part)}" if found else ""
            return Verdict(qualname, ABSENT, found[0] if found else None, why,
                           owner_found=depth == len(parts) - 1)
        first = found[0] if found else None
        if depth == len(parts) - 1:
            if owner is not None and not add and (why := _enum_member(tree, owner, found)):
                return Verdict(qualname, REFUSED, first, why)
            if state == MAYBE:
                assert first is not None
                why = f"{here} is bound only on some paths (line {first.line})"
                return Verdict(qualname, MAYBE, first, why)
            return Verdict(qualname, BOUND, first)
        classes = [b for b in found if b.kind == "class"]
        if state != BOUND or len(classes) != len(found) or not classes:
            b = first
            assert b is not None
            why = (
                f"{here} is bound by {b.kind} at line {b.line}, not only by a class statement "
                "on every path: its attributes cannot be read from the source"
            )
            return Verdict(qualname, UNKNOWN, b, why)
        if len(classes) > 1:
            sub = [verdict_in_class(tree, c.node, parts[depth + 1:], add=add) for c in classes]
            states = {v.state for v in sub}
            if len(states) == 1:
                return sub[0]
            return Verdict(qualname, MAYBE, sub[0].binding,
                           f"{here} is defined {len(classes)} times; they differ")
        node = classes[0].node
        assert isinstance(node, ast.ClassDef)
        owner, body = node, node.body
    raise AssertionError("unreachable")


def _enum_member(tree: ast.Module, owner: ast.ClassDef, found: list[Binding]) -> str:
    """Why a replace or wrap cannot land on this member of ``owner`` ('' if it can): an Enum
    body refuses a second assignment of a member (``TypeError: 'RED' already defined``), and
    the finished class refuses ``setattr`` of one. A method (``def``) or a ``_sunder_`` /
    ``__dunder__`` name is no member."""
    values = [b for b in found if b.kind != "def" and b.kind != "class"]
    if not values or (values[0].name.startswith("_") and values[0].name.endswith("_")):
        return ""
    why = enum_class(tree, owner)
    if not why:
        return ""
    return (
        f"{owner.name}.{values[0].name} is an Enum member ({why}; {values[0].kind} at line "
        f"{values[0].line}): the class makes the member from the value when it is built and "
        "refuses a second one; to change its value use patch.field(target, default=VALUE, "
        "existing=True)"
    )


def verdict_in_class(
    tree: ast.Module, cls: ast.stmt, rest: list[str], *, add: bool = False
) -> Verdict:
    assert isinstance(cls, ast.ClassDef)
    wrapper = ast.Module(body=[cls], type_ignores=[])
    v = verdict(wrapper, ".".join([cls.name, *rest]), add=add)
    # hidden binders of the module (C.attr = ... elsewhere) are looked up against the whole tree
    if v.state == ABSENT and len(rest) == 1:
        hidden = _class_hidden_binders(tree, cls, rest[0])
        if hidden:
            return Verdict(v.qualname, UNKNOWN, v.binding, hidden)
    return v


def _last_del(body: list[ast.stmt], name: str) -> int:
    line = 0
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Delete) and name in [
                n for t in node.targets for n in target_names(t)
            ]:
                line = node.lineno
            elif isinstance(node, ast.ExceptHandler) and node.name == name:
                line = node.end_lineno or node.lineno
    return line


# -- Copies: names another module binds from a target (late activation) ---------------------------


def resolve_relative(module: str, level: int, package: str | None) -> str:
    """``from ..x import y`` in ``package``'s module: the absolute module name."""
    if not level:
        return module
    base = (package or "").rsplit(".", level - 1)[0] if level > 1 else (package or "")
    return f"{base}.{module}" if module else base


def copy_edges(
    tree: ast.Module, package: str | None, this: str
) -> tuple[list[tuple[str, str, str, int]], list[tuple[str, int]]]:
    """How ``this`` module binds names from other modules' names, read from its source.

    Returns ``(edges, stars)``: edges ``(local_qual, source_module, source_qual, line)`` for
    ``from m import x [as y]``, ``y = m.x`` / ``y = pkg.m.x`` (``m`` bound by an import),
    ``y = x`` (a local alias: source module ``this``), and class attributes ``C.y = x`` written
    in the class body; stars ``(source_module, line)`` for ``from m import *``."""
    edges: list[tuple[str, str, str, int]] = []
    stars: list[tuple[str, int]] = []
    modules: dict[str, str] = {}  # local name -> module it may be bound to

    chain = _dotted  # ``a.b.c`` -> ["a", "b", "c"]

    def sources(expr: ast.expr, scope_quals: dict[str, str]) -> list[tuple[str, str]]:
        parts = chain(expr)
        if parts is None:
            return []
        head, rest = parts[0], parts[1:]
        out: list[tuple[str, str]] = []
        if not rest:
            out.append((this, scope_quals.get(head, head)))
        if head in modules:
            mod = modules[head]
            for i in range(len(rest)):  # pkg.sub.f: (pkg.sub, f) or (pkg, sub.f)
                out.append((".".join([mod, *rest[:i]]), ".".join(rest[i:])))
        elif rest:
            out.append((this, ".".join(parts)))  # Class.attr of this module
        return out

    def visit(body: list[ast.stmt], owner: str) -> None:
        local_quals: dict[str, str] = {}
        for stmt in body:
            if isinstance(stmt, ast.ImportFrom):
                source = resolve_relative(stmt.module or "", stmt.level, package)
                for alias in stmt.names:
                    if alias.name == "*":
                        stars.append((source, stmt.lineno))
                        continue
                    local = alias.asname or alias.name
                    edges.append((owner + local, source, alias.name, stmt.lineno))
                    modules[local] = f"{source}.{alias.name}" if source else alias.name
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        modules[alias.asname] = alias.name
                    else:
                        top = alias.name.partition(".")[0]
                        modules[top] = top
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                for src_mod, src_qual in sources(stmt.value, local_quals):
                    edges.extend((owner + n, src_mod, src_qual, stmt.lineno) for n in names)
            elif isinstance(stmt, ast.ClassDef) and not owner:
                visit(stmt.body, f"{stmt.name}.")
            for bound, _ in direct(stmt):
                if owner:
                    local_quals[bound] = owner + bound
            for block in blocks(stmt):
                visit(block.body, owner)

    visit(tree.body, "")
    return edges, stars


# -- A member a class only inherits (messages of check and import) --------------------------------


def inherited_from(
    tree: ast.Module, module: str, package: str | None, qualname: str, load: Any
) -> str:
    """``"pkg.mod:Base"`` when ``Class.attr`` (``qualname``) is not bound by the class statement
    of ``Class`` in ``tree`` but by that of a base class, found statically through the bases
    (left to right, depth first: the MRO of single inheritance), their imports and re-exports;
    ``load(module)`` returns another module's ``(tree, is_package)`` or None. "" when not found
    (a base bound dynamically, a C extension, ...)."""
    owner, _, attr = qualname.rpartition(".")
    if not owner or "." in owner:
        return ""
    start = _class_statement(tree, module, package, [owner], load, 0)
    if start is None:
        return ""
    seen: set[tuple[str, str]] = set()
    stack = [start]
    while stack:
        mod, mtree, pkg, cls = stack.pop()
        if (mod, cls.name) in seen or len(seen) > 32:
            continue
        seen.add((mod, cls.name))
        if cls is not start[3] and final_state(cls.body, attr) != UNBOUND:
            return f"{mod}:{cls.name}"
        found = []
        for base in cls.bases:
            parts = _dotted(base)
            hit = _class_statement(mtree, mod, pkg, parts, load, 0) if parts else None
            if hit is not None:
                found.append(hit)
        stack.extend(reversed(found))
    return ""


def _dotted(expr: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    return [expr.id, *reversed(parts)]


def _class_statement(
    tree: ast.Module, module: str, package: str | None, parts: list[str], load: Any, depth: int
) -> tuple[str, ast.Module, str | None, ast.ClassDef] | None:
    """(module, its tree, its package, class statement) that ``parts`` (``Name`` or
    ``mod.Name``, as written in ``module``) refers to, following imports."""
    if depth > 8 or not parts:
        return None
    head, rest = parts[0], parts[1:]
    for b in scope_bindings(tree.body, head):
        node = b.node
        if isinstance(node, ast.ClassDef) and not rest:
            return module, tree, package, node
        if isinstance(node, ast.ImportFrom):
            alias = next((a for a in node.names if (a.asname or a.name) == head), None)
            if alias is None:
                continue
            source = resolve_relative(node.module or "", node.level, package)
            sub = f"{source}.{alias.name}" if source else alias.name
            loaded = load(sub) if rest else None  # `from pkg import mod` then mod.Class
            if loaded is not None:
                return _class_statement(loaded[0], sub, sub if loaded[1] else source, rest,
                                        load, depth + 1)
            loaded = load(source) if source else None
            if loaded is not None:
                pkg = source if loaded[1] else source.rpartition(".")[0]
                return _class_statement(loaded[0], source, pkg, [alias.name, *rest], load,
                                        depth + 1)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.partition(".")[0]
                if name != head:
                    continue
                # `import a.b as m`: m is a.b; `import a.b`: a, and a.b.C is written out in full
                dotted = alias.name.split(".") if alias.asname else [head]
                rest_parts = list(rest)
                while not alias.asname and rest_parts[:-1] and \
                        load(".".join([*dotted, rest_parts[0]])) is not None:
                    dotted.append(rest_parts.pop(0))
                target = ".".join(dotted)
                loaded = load(target)
                if loaded is not None:
                    pkg = target if loaded[1] else target.rpartition(".")[0]
                    return _class_statement(loaded[0], target, pkg, rest_parts, load, depth + 1)
    return None


def inherited_advice(module: str, qualname: str, where: str) -> str:
    """What check and import say of a target that its class only inherits from ``where``."""
    owner, _, attr = qualname.rpartition(".")
    return (f"{qualname} is inherited from {where}: target that, {where}.{attr} (every subclass "
            f"that does not define {attr} changes), or give {owner} only its own {attr} with "
            f"patch.add('{module}:{qualname}', ...)")


def class_nodes(tree: ast.Module, qualname: str) -> list[ast.ClassDef]:
    """Every live class statement binding ``qualname`` (``Outer.Inner`` paths)."""
    scopes: list[list[ast.stmt]] = [tree.body]
    found: list[ast.ClassDef] = []
    for part in qualname.split("."):
        found = [b.node for body in scopes for b in scope_bindings(body, part)
                 if isinstance(b.node, ast.ClassDef)]
        scopes = [c.body for c in found]
    return found


# -- Which classes collect their fields when built (for check, and Enum members here) ------------

# Bases and decorators that collect fields from the class body, by their last dotted part.
FIELD_BASES = {
    "Struct": "a msgspec.Struct", "NamedTuple": "a NamedTuple", "TypedDict": "a TypedDict",
    "Enum": "an Enum", "IntEnum": "an Enum", "StrEnum": "an Enum", "Flag": "an Enum",
    "IntFlag": "an Enum", "ReprEnum": "an Enum", "BaseModel": "a pydantic model",
    "RootModel": "a pydantic model", "BaseSettings": "a pydantic settings class",
    "SQLModel": "a SQLModel",
}
FIELD_DECORATORS = {
    "dataclass": "a dataclass", "s": "an attrs class", "attrs": "an attrs class",
    "define": "an attrs class", "frozen": "an attrs class", "mutable": "an attrs class",
    "dataclass_transform": "a dataclass",
}


def _last_name(expr: ast.expr) -> str:
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Subscript):  # Generic[T]-style bases
        expr = expr.value
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return expr.id if isinstance(expr, ast.Name) else ""


def enum_class(tree: ast.Module, cls: ast.ClassDef) -> str:
    """Why the source shows ``cls`` is an Enum ('' if it does not): an Enum base (by its last
    dotted part), ``metaclass=EnumMeta``/``EnumType``, or a class of the same module that is."""
    return collects_fields(tree, cls, enum_only=True)


def collects_fields(tree: ast.Module, cls: ast.ClassDef, _seen: frozenset[str] = frozenset(),
                    *, enum_only: bool = False) -> str:
    """Why class ``cls`` builds fields from its body ('' if nothing says so): a base such as
    ``msgspec.Struct``, ``NamedTuple``, ``TypedDict``, ``Enum``, ``BaseModel`` (or a class of the
    same module that has one), a ``metaclass=`` keyword, or a decorator such as ``dataclass``
    or attrs' ``define``. ``enum_only``: only what makes it an Enum."""
    for deco in [] if enum_only else cls.decorator_list:
        kind = FIELD_DECORATORS.get(_last_name(deco))
        if kind:
            return f"class {cls.name} is {kind} (decorator at line {deco.lineno})"
    for kw in cls.keywords:
        if kw.arg == "metaclass" and not enum_only:
            return f"class {cls.name} has a metaclass (line {cls.lineno})"
        if kw.arg == "metaclass" and _last_name(kw.value) in ("EnumMeta", "EnumType"):
            return f"class {cls.name} has metaclass {ast.unparse(kw.value)} (line {cls.lineno})"
    for base in cls.bases:
        name = _last_name(base)
        kind = FIELD_BASES.get(name)
        if kind and (kind == "an Enum" or not enum_only):
            return f"class {cls.name} is {kind} (base {ast.unparse(base)}, line {cls.lineno})"
        if name and name not in _seen and isinstance(base, ast.Name):
            for parent in class_nodes(tree, name):
                why = collects_fields(tree, parent, _seen | {cls.name}, enum_only=enum_only)
                if why:
                    return f"class {cls.name} derives from {name}: {why}"
    return ""


def close_symbol(tree: ast.Module, qualname: str) -> str:
    """The name the module (or the class the qualname goes through) binds closest to
    ``qualname``'s missing part (difflib), as a qualname; "" when none is close."""
    import difflib

    body: list[ast.stmt] = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        names = bound_names(body)
        if part not in names:
            close = difflib.get_close_matches(part, sorted(names), n=1)
            return ".".join([*parts[:i], close[0]]) if close else ""
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if cls is None:
            return ""
        body = cls.body
    return ""


def bound_names(body: list[ast.stmt]) -> dict[str, None]:
    """Names the statements of ``body`` bind at their own level (defs, classes, assignments,
    imports), nested blocks (if / try / with) included."""
    out: dict[str, None] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = None
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                out.update((n.id, None) for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(((a.asname or a.name).partition(".")[0], None) for a in node.names)
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list) and not isinstance(node, (
                    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.update(bound_names([n for n in inner if isinstance(n, ast.stmt)]))
                for h in inner:
                    if isinstance(h, ast.ExceptHandler):
                        out.update(bound_names(h.body))
    return out
