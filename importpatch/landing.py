"""Definition-site landing: replace / wrap / add take effect *when the target name is bound*.

Monkeypatching after import misses every copy made while the module executed: a decorator that
registered the function, a dict or list of functions, ``functools.partial``, a default argument,
a class body alias, and every ``from x import y`` of a module imported during a circular import.
So the target module's tree is rewritten before it is compiled:

    @register                     @__import__('importpatch.landing').landing.land(M, 'f', 'outer')
    @triton.jit           ==>     @register
    def f(...): ...               @triton.jit
                                  @__import__('importpatch.landing').landing.land(M, 'f', 'inner')
                                  def f(...): ...

    X = make()            ==>     X = make()
                                  X = __import__(...).landing.land(M, 'X', 'assign')(X)

Invariants:
- Only targeted names get a landing; nothing else in the tree changes, and every inserted node
  carries the line of the statement it belongs to, so line numbers (and ``co_firstlineno``, which
  comes from the first decorator) of all code stay as they were.
- The 'inner' landing stands the replacement in for the undecorated function, so the original
  decorators apply to it (the default); ``decorated=True`` operations land at 'outer', on the
  decorated result. Class ``add`` operations land at 'outer' of the class.
- A re-binding derived from the previous one (``@x.setter def x``) only records the new value.
- Each qualname's final bound object is recorded; after the module executed, ``finish`` checks
  that the module attribute is that object. A name bound in a way not visible here (``globals()``,
  ``from m import *``, ``exec``) is patched right after execution, and that is logged.
- The code object refers to operations by (module, qualname) only, so the compiled code depends on
  *which* names are targeted and how, never on the replacement objects: that keeps it cacheable.
"""

from __future__ import annotations

import ast

from . import events
from .declare import ADD, REPLACE, SET, WRAP
from .errors import PatchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from .declare import Op

_BLOCK_FIELDS = ("body", "orelse", "finalbody")


# -- Compile time: rewriting the tree ------------------------------------------------------------


def site_of(op: Op) -> tuple[str, str]:
    """(qualname where the operation lands, stage). Adds land on the owner's binding; so does a
    set of a class member (``setattr`` on the finished class), while a set of a module-level
    name lands on that name's binding, or after execution when the source does not bind it."""
    assert op.qualname is not None
    if op.kind == ADD or (op.kind == SET and "." in op.qualname):
        owner, _, _ = op.qualname.rpartition(".")
        return owner, "outer"
    if op.kind == SET:
        return op.qualname, "outer"
    return op.qualname, "outer" if op.decorated else "inner"


def rewrite(tree: ast.Module, module: str, qualnames: Iterable[str]) -> set[str]:
    """Insert landings for ``qualnames`` (module-level or ``Class.attr`` paths) into ``tree`` in
    place. Returns the qualnames that have no binding visible in the source."""
    trie: dict[str, Any] = {}
    for qual in qualnames:
        node = trie
        for part in qual.split("."):
            node = node.setdefault(part, {})
        node[""] = qual  # "" marks a target
    found: set[str] = set()
    _rewrite_block(tree.body, module, trie, found)
    wanted = {q for q in qualnames}
    return wanted - found


def _land_call(module: str, qual: str, stage: str, line: ast.AST) -> ast.expr:
    # __import__('importpatch.landing').landing.land(module, qual, stage): resolves through
    # sys.modules at run time, so the code works in any namespace (runpy's __main__ too).
    imp = ast.Call(ast.Name("__import__", ast.Load()), [ast.Constant("importpatch.landing")], [])
    fn = ast.Attribute(ast.Attribute(imp, "landing", ast.Load()), "land", ast.Load())
    call = ast.Call(fn, [ast.Constant(module), ast.Constant(qual), ast.Constant(stage)], [])
    return ast.fix_missing_locations(ast.copy_location(call, line))


def _bound_names(stmt: ast.stmt) -> set[str]:
    names: set[str] = set()
    if isinstance(stmt, ast.Assign):
        for t in stmt.targets:
            names |= _target_names(t)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        if getattr(stmt, "value", None) is not None:
            names |= _target_names(stmt.target)
    elif isinstance(stmt, ast.Import):
        for alias in stmt.names:
            names.add(alias.asname or alias.name.partition(".")[0])
    elif isinstance(stmt, ast.ImportFrom):
        for alias in stmt.names:
            if alias.name != "*":
                names.add(alias.asname or alias.name)
    return names


def _target_names(t: ast.expr) -> set[str]:
    if isinstance(t, ast.Name):
        return {t.id}
    if isinstance(t, (ast.Tuple, ast.List)):
        out: set[str] = set()
        for elt in t.elts:
            out |= _target_names(elt)
        return out
    if isinstance(t, ast.Starred):
        return _target_names(t.value)
    return set()


def _derived_rebinding(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """``@x.setter def x`` / ``@f.register def f``: the new value is built from the old one."""
    return any(
        isinstance(d, ast.Attribute) and isinstance(d.value, ast.Name) and d.value.id == node.name
        for d in node.decorator_list
    )


def _rewrite_block(
    body: list[ast.stmt], module: str, trie: dict[str, Any], found: set[str]
) -> None:
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
                    if _derived_rebinding(stmt):
                        stmt.decorator_list.insert(0, _land_call(module, qual, "follow", first))
                    else:
                        stmt.decorator_list.insert(0, _land_call(module, qual, "outer", first))
                        stmt.decorator_list.append(_land_call(module, qual, "inner", stmt))
        else:
            for name in sorted(_bound_names(stmt)):
                qual = trie.get(name, {}).get("")
                if qual is None:
                    continue
                found.add(qual)
                land = _land_call(module, qual, "assign", stmt)
                call = ast.Call(land, [ast.Name(name, ast.Load())], [])
                assign = ast.Assign([ast.Name(name, ast.Store())], call)
                inserted.append(ast.fix_missing_locations(ast.copy_location(assign, stmt)))
            # Same scope, nested blocks: if/else, try/except/finally, with, for/while, match.
            for field in _BLOCK_FIELDS:
                block = getattr(stmt, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    _rewrite_block(block, module, trie, found)
            for handler in getattr(stmt, "handlers", ()) or ():
                _rewrite_block(handler.body, module, trie, found)
            for case in getattr(stmt, "cases", ()) or ():
                _rewrite_block(case.body, module, trie, found)
        body[i + 1 : i + 1] = inserted
        i += 1 + len(inserted)


# -- Run time: applying operations as names are bound --------------------------------------------


class ModulePlan:
    """The operations for one module, grouped by landing site, and what happened to them."""

    def __init__(self, module: str, ops: list[Op], file: str | None) -> None:
        self.module = module
        self.file = file
        self.sites: dict[str, dict[str, list[Op]]] = {}
        for op in ops:
            qual, stage = site_of(op)
            if not qual:  # add to the module itself: done before execution
                continue
            self.sites.setdefault(qual, {}).setdefault(stage, []).append(op)
        self.module_adds = [op for op in ops if op.kind == ADD and "." not in (op.qualname or "")]
        self.final: dict[str, Any] = {}
        for stages in self.sites.values():
            for stage_ops in stages.values():
                _check_conflicts(module, stage_ops, file)
                stage_ops.sort(key=_op_order)

    def land(self, qual: str, stage: str) -> Callable[[Any], Any]:
        def apply(obj: Any) -> Any:
            if stage == "follow":
                result = obj
            elif stage == "inner":
                inner = self.sites[qual].get("inner", [])
                result = self._apply(qual, inner, obj, "definition-site")
            else:  # outer, assign
                stages = self.sites.get(qual, {})
                ops = stages.get("outer", [])
                if stage == "assign":
                    ops = stages.get("inner", []) + ops
                result = self._apply(qual, ops, obj, "definition-site")
            if stage != "inner":
                self.final[qual] = result
            return result

        return apply

    def _apply(self, qual: str, ops: list[Op], obj: Any, how: str) -> Any:
        for op in ops:
            if op.kind == REPLACE:
                obj = _same_descriptor(obj, op.obj)
            elif op.kind == WRAP:
                obj = wrap_object(obj, op.obj)
            elif op.kind == ADD:
                assert op.qualname is not None
                attr = op.qualname.rpartition(".")[2]
                if attr in getattr(obj, "__dict__", {}):
                    err = PatchError(
                        op.patch.name, self.module,
                        f"add {op.qualname}: {attr!r} already exists (use replace)", file=self.file,
                    )
                    if tolerated(err, [op]):
                        continue
                    raise err
                setattr(obj, attr, op.obj)
            elif op.kind == SET:
                assert op.qualname is not None
                if "." in op.qualname:  # obj is the owner class: replace or add the member
                    setattr(obj, op.qualname.rpartition(".")[2], op.obj)
                else:
                    obj = op.obj
            events.record("applied", op.patch.name, f"{self.module}:{op.qualname}", how, op.kind)
        return obj

    def before_exec(self, namespace: dict[str, Any]) -> None:
        for op in self.module_adds:
            assert op.qualname is not None
            if op.qualname in namespace:
                raise PatchError(op.patch.name, self.module, f"add {op.qualname}: already exists")
            namespace[op.qualname] = op.obj

    def finish(self, namespace: dict[str, Any], unseen: set[str], *, late: bool = False) -> None:
        """After execution (or, ``late``, on an already-imported module): every target holds its
        patched object, or the import fails."""
        for op in self.module_adds:
            assert op.qualname is not None
            if namespace.get(op.qualname) is not op.obj:
                err = PatchError(
                    op.patch.name, self.module,
                    f"add {op.qualname}: the module defines that name itself (use replace)",
                    file=self.file,
                )
                if tolerated(err, [op]):
                    continue
                raise err
            how = "in-place" if late else "definition-site"
            events.record("applied", op.patch.name, f"{self.module}:{op.qualname}", how, op.kind)
        # Outer classes before their members, so a member patched late sees the final class.
        for qual in sorted(self.sites, key=lambda q: q.count(".")):
            stages = self.sites[qual]
            ops = stages.get("inner", []) + stages.get("outer", [])
            try:
                owner, current = resolve(namespace, qual, self)
            except PatchError as err:
                if "." not in qual and all(op.kind == SET for op in ops):
                    # set of a module-level name the module never bound: it is added.
                    how = "in-place" if late else "after-exec (name not bound by the module)"
                    namespace[qual] = self.final[qual] = self._apply(qual, ops, None, how)
                    continue
                if tolerated(err, ops):
                    continue
                raise
            if qual in self.final and current is self.final[qual]:
                continue
            why = (
                "binding not visible in the source"
                if qual in unseen or qual not in self.final
                else "name re-bound after its definition"
            )
            how = "in-place" if late else f"after-exec ({why})"
            result = self._apply(qual, ops, current, how)
            _set(owner, qual.rpartition(".")[2], result)
            self.final[qual] = result


def tolerated(err: PatchError, ops: list[Op]) -> bool:
    """``on_error="warn"``: a failure that concerns only such patches is logged, not raised."""
    if not ops or any(op.patch.on_error != "warn" for op in ops):
        return False
    import logging

    events.record(
        "failed", err.patch, err.module, "skipped (on_error=warn)", err.what, level=logging.WARNING
    )
    return True


def _op_order(op: Op) -> tuple[int, int, str]:
    # replace first (innermost), then adds and sets, then wraps by (order, patch name).
    rank = {REPLACE: 0, ADD: 1, SET: 1, WRAP: 2}[op.kind]
    return (rank, op.order, op.patch.name)


def _check_conflicts(module: str, ops: list[Op], file: str | None) -> None:
    # Two patches replacing (or setting) one name: whichever ran last would silently win.
    by_name: dict[str | None, list[Op]] = {}
    for op in ops:
        if op.kind in (REPLACE, SET):
            by_name.setdefault(op.qualname, []).append(op)
    for qualname, replacing in by_name.items():
        names = sorted({op.patch.name for op in replacing})
        if len(replacing) > 1:
            verb = "set" if all(op.kind == SET for op in replacing) else "replace"
            raise PatchError(
                names[0], module,
                f"conflict: patches {' and '.join(repr(n) for n in names)} both {verb} "
                f"{qualname}; enable one of them",
                file=file,
            )


def resolve(namespace: dict[str, Any], qual: str, plan: ModulePlan) -> tuple[Any, Any]:
    """(owner, raw value) of ``qual``; raw means as stored, e.g. a staticmethod object."""
    parts = qual.split(".")
    owner: Any = namespace
    for i, part in enumerate(parts):
        store = owner if isinstance(owner, dict) else getattr(owner, "__dict__", {})
        if part not in store:
            ops = plan.sites.get(qual, {})
            first = next(iter(o for s in ops.values() for o in s))
            raise PatchError(
                first.patch.name, plan.module,
                f"symbol {'.'.join(parts[: i + 1])!r} not found (target {plan.module}:{qual})",
                file=plan.file,
            )
        if i == len(parts) - 1:
            return owner, store[part]
        owner = store[part]
    raise AssertionError(qual)


def _set(owner: Any, name: str, value: Any) -> None:
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)


def _same_descriptor(original: Any, replacement: Any) -> Any:
    """A plain function replacing a staticmethod/classmethod keeps the descriptor kind."""
    if isinstance(original, (staticmethod, classmethod)) and not isinstance(
        replacement, (staticmethod, classmethod)
    ):
        return type(original)(replacement)
    return replacement


def wrap_object(obj: Any, wrapper: Any) -> Any:
    """wrapt's FunctionWrapper keeps signature, __wrapped__, __name__, __doc__ and binding;
    descriptor objects are wrapped inside so the descriptor kind is kept."""
    import wrapt

    if isinstance(obj, (staticmethod, classmethod)):
        return type(obj)(wrapt.FunctionWrapper(obj.__func__, wrapper))
    if isinstance(obj, property):
        assert obj.fget is not None
        return property(wrapt.FunctionWrapper(obj.fget, wrapper), obj.fset, obj.fdel, obj.__doc__)
    return wrapt.FunctionWrapper(obj, wrapper)


_plans: dict[str, ModulePlan] = {}


def register(plan: ModulePlan) -> None:
    _plans[plan.module] = plan


def land(module: str, qual: str, stage: str) -> Callable[[Any], Any]:
    """Called by rewritten module code (see the module docstring)."""
    return _plans[module].land(qual, stage)
