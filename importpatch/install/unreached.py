"""What a late activation cannot reach: the places that got a target's original object while its
module was imported, and that re-binding globals does not change (issue 36, item 4).

Late activation (``late.py``) replaces the target's attribute and re-binds the copies that
other modules' source proves (``from m import f``). Anything else that received the original
before then keeps it:

- a registering call of the module's import that was passed the target: vLLM's
  ``direct_register_custom_op(op_name=..., op_func=f)`` (its only call path is then
  ``torch.ops.vllm.<name>``, which runs the original), ``torch.library``'s ``define``/``impl``, a
  registry's ``register(f)``; found in the module's source, at module level and in the module's
  own functions that its module level calls (vLLM's ``register_..._ops()``);
- a container, a ``functools.partial`` or a default argument that holds it: found in memory, in
  the globals of the loaded modules of the target's own top-level package (and the classes they
  define), one level deep.

Each is said in a warning event (``how``: "unreached") naming the place, with the fix: enable the
patch at interpreter start, where it lands before the module runs and every one of these gets the
patched object. ``IMPORTPATCH_STRICT=1`` refuses such a patch late instead (all of it).
Identity tests only; no attribute of a loaded object is read that could run code.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    from typing import Any

# Calls that look at an object without keeping it (a module-level ``isinstance(f, ...)``).
_LOOKS_ONLY = frozenset({
    "isinstance", "issubclass", "hasattr", "getattr", "callable", "id", "print", "repr", "str",
    "type", "len", "cast", "wraps", "update_wrapper", "signature", "getsource", "getdoc",
    "partial",  # a partial is a value: the scan in memory names where it is kept
})
# Decorators late activation puts back on a replacement (late._REBUILDABLE), and those that only
# mark a function: neither keeps the original anywhere else.
_HARMLESS_DECORATORS = frozenset({
    "property", "staticmethod", "classmethod", "cached_property", "lru_cache", "cache",
    "setter", "getter", "deleter", "wraps", "overload", "override", "final", "abstractmethod",
    "no_type_check", "contextmanager", "asynccontextmanager", "dataclass", "total_ordering",
    "singledispatch", "unique",
})

FIX = ("enable the patch at interpreter start (IMPORTPATCH_ENABLE in the environment), where it "
       "lands before the module runs and every one of these gets the patched object")


def _callee(func: ast.expr) -> str:
    import ast

    while isinstance(func, ast.Call):  # torch.library.impl("ns::op", "CPU")(f)
        func = func.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _op_name(call: ast.Call) -> str | None:
    """The ``op_name`` of a ``direct_register_custom_op`` call, when the source spells it."""
    import ast

    value = next((k.value for k in call.keywords if k.arg == "op_name"), None)
    if value is None and call.args:
        value = call.args[0]
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None


# Registrations that make a function a torch custom op: Dynamo calls the op, never traces its body.
CUSTOM_OP_CALLS = frozenset({"direct_register_custom_op", "custom_op", "impl"})


def custom_op_body(tree: ast.Module | None, qual: str) -> str:
    """How the module's import makes ``qual`` a torch custom op's body (a registering call or
    decorator, in words), or "" (``importpatch check``: torch.compile does not trace it)."""
    calls = registered_in_source(tree, qual, CUSTOM_OP_CALLS)
    if calls:
        line, what = calls[0]
        return f"{what} at line {line}"
    decorators = [d for d in decorators_keep(tree, qual)
                  if d[1:].partition("(")[0].rpartition(".")[2] in CUSTOM_OP_CALLS]
    return f"the decorator {decorators[0]}" if decorators else ""


def registered_in_source(tree: ast.Module | None, qual: str,
                         only: frozenset[str] | None = None) -> list[tuple[int, str]]:
    """(line, what) of each call that the module's import made with ``qual`` (``f``,
    ``Class.method``) as an argument (``only``: calls of these names only). Module level and
    class bodies (they run at import), and the bodies of the module's own functions that its
    module level calls by name."""
    import ast

    if tree is None:
        return []
    found: list[tuple[int, str]] = []
    top_defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef,
                                                               ast.AsyncFunctionDef))}
    called: list[ast.AST] = []

    def passes_target(call: ast.Call) -> bool:
        values = [*call.args, *(k.value for k in call.keywords)]
        return any(isinstance(v, (ast.Name, ast.Attribute)) and ast.unparse(v) == qual
                   for v in values)

    def visit(node: ast.AST, owner: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{owner}{node.name}"
            for deco in node.decorator_list:
                visit(deco, owner)
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    visit(stmt, f"{name}.")
            return  # a function body runs when called
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Call):
            callee = _callee(node.func)
            if callee and callee not in _LOOKS_ONLY and (only is None or callee in only) \
                    and passes_target(node):
                what = f"the call {ast.unparse(node.func)}(...)"
                op_name = _op_name(node) if callee == "direct_register_custom_op" else None
                if op_name:
                    what += (f", which registered it as the torch custom op "
                             f"torch.ops.vllm.{op_name} (vLLM calls it only through there)")
                found.append((node.lineno, what))
            if isinstance(node.func, ast.Name) and node.func.id in top_defs and owner == "":
                called.append(top_defs.pop(node.func.id))
        for child in ast.iter_child_nodes(node):
            visit(child, owner)

    for stmt in tree.body:
        visit(stmt, "")
    while called:  # the module's own registering functions, run by its module level
        fn = called.pop()
        assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for stmt in fn.body:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call):
                    callee = _callee(node.func)
                    if callee and callee not in _LOOKS_ONLY and (
                            only is None or callee in only) and passes_target(node):
                        what = (f"the call {ast.unparse(node.func)}(...) in {fn.name}(), which "
                                "the module runs at import")
                        op_name = (_op_name(node) if callee == "direct_register_custom_op"
                                   else None)
                        if op_name:
                            what += (f" (it registered it as the torch custom op "
                                     f"torch.ops.vllm.{op_name}, vLLM's only call path to it)")
                        found.append((node.lineno, what))
                    if isinstance(node.func, ast.Name) and node.func.id in top_defs:
                        called.append(top_defs.pop(node.func.id))
    return sorted(set(found))


def decorators_keep(tree: ast.Module | None, qual: str) -> list[str]:
    """The decorators of ``qual``'s definitions that may keep what they were given (a registry):
    with ``decorated=True`` a patch goes outside them, at interpreter start too."""
    import ast

    if tree is None:
        return []
    body: list[ast.stmt] = tree.body
    parts = qual.split(".")
    found: list[str] = []
    for i, part in enumerate(parts):
        defs = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.ClassDef)) and n.name == part]
        if i < len(parts) - 1:
            body = next((n.body for n in defs if isinstance(n, ast.ClassDef)), [])
            continue
        for node in defs:
            found += [f"@{ast.unparse(d)}" for d in node.decorator_list
                      if _callee(d) not in _HARMLESS_DECORATORS]
    return found


def _unwrapped(obj: Any) -> Any:
    return obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj


def held_in_memory(originals: dict[int, str], skip: set[int], skipped: Any, package: str
                   ) -> dict[str, list[str]]:
    """Per qualified target name (``originals``: id of its original -> its name): the places in
    the loaded modules of top-level ``package`` (the target's: where its registries are; a
    vLLM process holds ~5,000 modules, ~1,000 of them vLLM's, and scanning all of them took ~1 s
    at load 14 on 2 cores) that hold it and that re-binding does not change, as
    ``module:name[key]`` and what they are. One pass over those modules' globals (and the
    classes a module defines):
    dict values, list and tuple items, a partial's function and arguments, a function's default
    arguments. ``skip``: ids of values not to look into (the patches' own objects);
    ``skipped(name, module)``: modules not to look at (importpatch, the standard library, the
    patches' modules)."""
    import functools
    import types

    out: dict[str, list[str]] = {}
    ids = set(originals)

    def inside(value: Any, where: str) -> None:
        # type(), not isinstance(): a proxy's __class__ is code. The storage is read with the
        # base type's own methods: a subclass's items() may run code (transformers' lazy
        # mappings import every model when iterated).
        if id(value) in skip:
            return
        kind = type(value)
        if issubclass(kind, dict):
            if ids.isdisjoint(map(id, dict.values(value))):
                return
            for key, item in list(dict.items(value)):
                if id(item) in ids:
                    shown = repr(key) if type(key) in (str, int) else f"<{type(key).__name__}>"
                    out.setdefault(originals[id(item)], []).append(
                        f"{where}[{shown}] (a dict entry)")
        elif issubclass(kind, (list, tuple)):
            base = list if issubclass(kind, list) else tuple
            items = list(base.__iter__(value))
            if ids.isdisjoint(map(id, items)):
                return
            for i, item in enumerate(items):
                if id(item) in ids:
                    what = "a list item" if base is list else "a tuple item"
                    out.setdefault(originals[id(item)], []).append(f"{where}[{i}] ({what})")
        elif kind is functools.partial:
            held = [value.func, *value.args, *value.keywords.values()]
            for item in held:
                if id(item) in ids:
                    out.setdefault(originals[id(item)], []).append(
                        f"{where} (a functools.partial of it)")
        elif kind is types.FunctionType:
            held = [*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values()]
            for item in held:
                if id(item) in ids:
                    out.setdefault(originals[id(item)], []).append(
                        f"{where} (a default argument)")

    for name, module in list(sys.modules.items()):
        if module is None or name.partition(".")[0] != package or skipped(name, module):
            continue
        try:
            namespace = vars(module)
            for key, value in list(namespace.items()):
                if id(value) in ids or id(value) in skip:
                    continue  # the attribute itself: re-bound, or the target
                inside(value, f"{name}:{key}")
                if issubclass(type(value), type):
                    attrs = type.__dict__["__dict__"].__get__(value)
                    if attrs.get("__module__") != name:
                        continue
                    for attr, member in list(attrs.items()):
                        if id(member) not in ids:
                            inside(_unwrapped(member), f"{name}:{key}.{attr}")
        except Exception:  # a module whose namespace misbehaves: nothing to prove there
            continue
    return out


def unreached(module: str, tree: ast.Module | None, targets: dict[str, Any], own: list[Any],
              skipped: Any) -> dict[str, list[str]]:
    """Per qualified name of ``targets`` (targets of ``module`` about to be patched late, each
    with the original it still holds): what will keep the original, in words. ``own``: the
    patches' own objects (their replacements may hold the original as a default argument)."""
    out: dict[str, list[str]] = {}
    originals: dict[int, str] = {}
    for qual, original in targets.items():
        inner = _unwrapped(original)
        if not (callable(inner) or isinstance(inner, property)):
            continue  # a constant: identical ones are everywhere and prove nothing
        originals[id(original)] = originals[id(inner)] = qual
        for line, what in registered_in_source(tree, qual):
            out.setdefault(qual, []).append(f"{module} line {line}: {what}")
    if originals:
        for qual, places in held_in_memory(originals, {id(o) for o in own}, skipped,
                                           module.partition(".")[0]).items():
            out.setdefault(qual, []).extend(places)
    return out
