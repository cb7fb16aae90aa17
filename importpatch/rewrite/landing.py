"""Definition-site landing: replace / wrap / add take effect *when the target name is bound*.

Monkeypatching after import misses every copy made while the module executed: a decorator that
registered the function, a dict or list of functions, ``functools.partial``, a default argument,
a class body alias, and every ``from x import y`` of a module imported during a circular import.
So the target module's tree is rewritten before it is compiled (``L`` stands for
``facts.HOOKS``, ``__import__('importpatch.install.activation').install.activation``: what the
code calls at import lives in importpatch/install/activation.py, which resolves through sys.modules
at run time, so the code works in any namespace, runpy's ``__main__`` too):

    L.begin('M')                  (after the docstring and __future__ imports)
    @register                     @L.land('M', 'f', 'outer')
    @triton.jit           ==>     @register
    def f(...): ...               @triton.jit
                                  @L.land('M', 'f', 'inner')
                                  def f(...): ...
    X = make()            ==>     X = L.land('M', 'X', 'assign')(make())
    X, Y = make()         ==>     X, Y = make()
                                  X = L.land('M', 'X', 'assign')(X)
    for X in ...:         ==>     for X in ...:
                                      X = L.land('M', 'X', 'assign')(X)
    if __name__ == "__main__":    L.done('M')
        main()                    if __name__ == "__main__": ...   (else: L.done at the end)

``begin`` adds module-level names (``add``); ``done`` runs ``ModulePlan.finish`` and the loader's
after-execution steps (Triton kernel check, events). Because they are part of the code, every way
of running it — import, ``python -m`` (runpy executes ``get_code()`` in ``__main__``), a hook that
executes ``get_code()`` itself — gets the same checks, failures and events.

Which binding a patch targets (one rule, from ``bindings``): every *independent* binding of the
name (a ``def``, a ``class``, an assignment, an import, a loop/with/except/case target) lands the
patch, so each object the name is bound to is patched before anything copies it. A *derived*
re-binding — its value computed from the name's previous value: ``f = lru_cache(f)``,
``@x.setter def x``, ``X += 1`` — carries the patched object forward and is not patched again
(``'follow'``). So ``def f`` + ``f = lru_cache(f)`` is wrapped once, inside the cache, like a
decorator (``decorated=True`` lands on the ``def`` statement's result, before the re-binding).

Invariants:
- Only targeted names get a landing; nothing else in the tree changes, and every inserted node
  carries the line of the statement it belongs to, so line numbers (and ``co_firstlineno``, which
  comes from the first decorator) of all code stay as they were.
- Inserted code reports no line that did not run (coverage.py, ``sys.settrace``, tracebacks): a
  landing's nodes are all on the *first* line of its statement (which runs whenever the landing
  does; a node spanning the statement made ``.land`` report its last line, the body of a
  function never called), and ``begin``/``done``, which belong to no statement, are on the line
  after the last line of the file, which no real statement has (``done`` was on the last line
  of the last statement: the last line of a function never called was reported run).
- The 'inner' landing stands the replacement in for the undecorated function, so the original
  decorators apply to it (the default); ``decorated=True`` operations land at 'outer', on the
  decorated result. Class ``add`` operations land at 'outer' of the class.
- Each qualname's final bound object is recorded; ``finish`` checks that the module attribute is
  that object, or patches it then (a name bound in a way the source does not show: ``globals()``,
  ``from m import *``, ``exec``), and that is logged as after-exec. "applied" events are recorded
  once per operation, by ``finish``, when the module has run: a failed import reports none.
- The code object refers to operations by (module, qualname) only, so the compiled code depends on
  *which* names are targeted and how, never on the replacement objects: that keeps it cacheable.
- ``on_error="fail"``: what the source proves cannot apply (a target bound nowhere, with nothing
  that could bind it unseen; an ``add`` of a name bound on every path) fails the import *before*
  the module's code runs, so no patched object of another patch can have been registered anywhere.
- ``on_error="warn"`` is all or nothing, per patch and module. Before the module runs, a warn
  patch that the source proves cannot apply is dropped (nothing of it ever lands). A warn patch
  whose every operation the source proves (targets bound on every path, adds free, every binding
  visible) lands at definition sites: it cannot fail later. Any other warn patch is *staged*: none
  of its operations lands while the module runs; ``finish`` checks all of them and then applies
  all of them (logged as after-exec) or none (logged as skipped). So no code — of the module or of
  anything it imports — ever observes a part of a warn patch that then does not apply.
"""

from __future__ import annotations

import ast

from importpatch.rewrite.facts import HOOKS, Fact

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

# -- Compile time: rewriting the tree ------------------------------------------------------------


def rewrite(tree: ast.Module, module: str, qualnames: Iterable[str],
            past_end: int | None = None) -> set[str]:
    """Insert landings for ``qualnames`` (module-level or ``Class.attr`` paths) and the
    ``begin``/``done`` calls into ``tree`` in place (on line ``past_end``: the line after the last
    of the file). Returns the qualnames that have no binding visible in the source."""
    trie: dict[str, Any] = {}
    wanted = set(qualnames)
    for qual in wanted:
        node = trie
        for part in qual.split("."):
            node = node.setdefault(part, {})
        node[""] = qual  # "" marks a target
    found: set[str] = set()
    _rewrite_block(tree.body, module, trie, found)
    if past_end is None:  # the line after the last statement's
        past_end = max((getattr(s, "end_lineno", None) or s.lineno for s in tree.body),
                       default=0) + 1
    _insert_begin_and_done(tree, module, past_end)
    return wanted - found


def _on_line(node: Any, line: int) -> Any:
    """``node`` and every node under it on line ``line`` alone (columns 0): for inserted nodes
    only (see the module docstring: no line reported that did not run)."""
    for sub in ast.walk(node):
        if "lineno" in sub._attributes:
            for attr, value in (("lineno", line), ("end_lineno", line), ("col_offset", 0),
                                ("end_col_offset", 0)):
                setattr(sub, attr, value)
    return node


def _hook_call(func: str, args: list[str], line: int) -> ast.expr:
    ("""``HOOKS.func(*args)`` (``__import__('importpatch.install.activation').install.activation"
     ".func(...)``), on line ``line``.""")
    target: ast.expr = ast.parse(HOOKS, mode="eval").body
    fn = ast.Attribute(target, func, ast.Load())
    call = ast.Call(fn, [ast.Constant(a) for a in args], [])
    return _on_line(call, line)  # type: ignore[no-any-return]


def _land_call(module: str, qual: str, stage: str, line: ast.AST) -> ast.expr:
    """``L.land(module, qual, stage)`` on the first line of statement (or decorator) ``line``."""
    return _hook_call("land", [module, qual, stage], line.lineno)  # type: ignore[attr-defined]


def _land_statement(module: str, qual: str, name: str, stage: str, line: ast.AST) -> ast.stmt:
    """``name = L.land(module, qual, stage)(name)`` on the first line of ``line``."""
    call = ast.Call(_land_call(module, qual, stage, line), [ast.Name(name, ast.Load())], [])
    assign = ast.Assign([ast.Name(name, ast.Store())], call)
    return _on_line(assign, line.lineno)  # type: ignore[attr-defined, no-any-return]


def _is_main_block(stmt: ast.stmt) -> bool:
    """``if __name__ == "__main__":``"""
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare):
        return False
    sides = [stmt.test.left, *stmt.test.comparators]
    return (
        len(sides) == 2 and isinstance(stmt.test.ops[0], ast.Eq)
        and any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
        and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
    )


def _insert_begin_and_done(tree: ast.Module, module: str, past_end: int) -> None:
    body = tree.body
    start = 0
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        start = 1  # the docstring stays the docstring
    while start < len(body) and isinstance(body[start], ast.ImportFrom) \
            and body[start].module == "__future__":  # type: ignore[attr-defined]
        start += 1
    body.insert(start, _on_line(ast.Expr(_hook_call("begin", [module], past_end)), past_end))
    # The module "has run" before a trailing `if __name__ == "__main__":` block (under python -m
    # it calls main(), which must find the module patched and checked), else at the end.
    end = len(body)
    if end > start + 1 and _is_main_block(body[-1]):
        end -= 1
    body.insert(end, _on_line(ast.Expr(_hook_call("done", [module], past_end)), past_end))


def _single_target(stmt: ast.stmt, name: str) -> bool:
    """``name = value`` or ``name: T = value``: the value can be landed before it is bound."""
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        targets = [stmt.target]
    else:
        return False
    return len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id == name


def _rewrite_block(
    body: list[ast.stmt], module: str, trie: dict[str, Any], found: set[str]
) -> None:
    from importpatch.rewrite import bindings

    i = 0
    while i < len(body):
        stmt = body[i]
        inserted: list[ast.stmt] = []
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            sub = trie.get(stmt.name)
            if sub is not None:
                if isinstance(stmt, ast.ClassDef):
                    _rewrite_block(stmt.body, module, sub, found)
                qual = sub.get("")
                if qual is not None:
                    found.add(qual)
                    first = stmt.decorator_list[0] if stmt.decorator_list else stmt
                    if bindings.is_derived(stmt, stmt.name):
                        stmt.decorator_list.insert(0, _land_call(module, qual, "follow", first))
                    else:
                        stmt.decorator_list.insert(0, _land_call(module, qual, "outer", first))
                        stmt.decorator_list.append(_land_call(module, qual, "inner", stmt))
        else:
            for name in sorted({n for n, _ in bindings.direct(stmt)}):
                qual = trie.get(name, {}).get("")
                if qual is None:
                    continue
                found.add(qual)
                if bindings.is_derived(stmt, name):
                    # 'check' sees the value it derives from; 'carry' keeps the result.
                    check = ast.Expr(ast.Call(_land_call(module, qual, "check", stmt),
                                              [ast.Constant(None)], []))
                    body.insert(i, _on_line(check, stmt.lineno))
                    i += 1
                    inserted.append(_land_statement(module, qual, name, "carry", stmt))
                elif _single_target(stmt, name):
                    # ``X = L.land(...)(value)``: bound once, as the source binds it (an Enum
                    # body refuses a second binding of a member, even when no patch is live).
                    assert isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value
                    call = ast.Call(_land_call(module, qual, "assign", stmt), [stmt.value], [])
                    # (only the call's own place: the value keeps its lines)
                    call.lineno = call.end_lineno = stmt.lineno
                    call.col_offset = call.end_col_offset = 0
                    stmt.value = call
                else:
                    inserted.append(_land_statement(module, qual, name, "assign", stmt))
            # Same scope, nested blocks: if/else, try/except/finally, with, for/while, match.
            for block in bindings.blocks(stmt):
                _rewrite_block(block.body, module, trie, found)
                entry = []
                for name in sorted({n for n, _ in block.entry}):
                    qual = trie.get(name, {}).get("")
                    if qual is not None and block.body:
                        found.add(qual)
                        entry.append(_land_statement(module, qual, name, "assign", block.body[0]))
                block.body[0:0] = entry
        body[i + 1 : i + 1] = inserted
        i += 1 + len(inserted)


# -- What the source proves, before the module runs -----------------------------------------------


def facts_of(tree: ast.Module, qualnames: Iterable[str]) -> dict[str, Fact]:
    """What the (not yet rewritten) tree proves of each qualname (``+qual``: of an ``add``
    target, which fails if the module binds or deletes the name at all)."""
    from importpatch.rewrite import bindings

    out = {}
    for key in qualnames:
        qual = key.removeprefix("+")
        v = bindings.verdict(tree, qual, add=key.startswith("+"))
        line = v.binding.line if v.binding is not None else 0
        out[key] = Fact(v.state, True, v.why, line)
    return out


def add_digests(facts: dict[str, Fact], tree: ast.Module, text: str) -> None:
    """Each fact's ``digest``: of its original's normalised text in ``tree`` / ``text`` (the
    module as released, before code changes; ``rewrite.pins``), compared with pins at import."""
    from importpatch.rewrite import bindings
    from importpatch.rewrite.pins import digests_of

    lines = text.splitlines(keepends=True)
    for key, fact in facts.items():
        if key.startswith("+"):
            continue
        v = bindings.verdict(tree, key)
        if v.binding is not None and v.state in (bindings.BOUND, bindings.MAYBE):
            # every binding that can run (each branch, each redefinition), as check reads it
            fact.digest = digests_of(tree, lines, key)
