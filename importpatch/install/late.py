"""Late activation: patching targets that were imported before patching started.

Happens after an explicit ``importpatch.enable()``, when vLLM loads its general plugins in a
process where the ``.pth`` did not run (``python -S``) or ran before the toggles arrived (vLLM's
Ray executor sets worker variables by RPC after the worker started).

What is done, exactly:
- replace / wrap / add / subclass are applied in place, in the target module, all of a patch or
  none of it (``apply_in_place``, with the import's ``activation.ModulePlan``). A replacement or
  wrap of a decorated target (``decorated=False``, the default) gets the original decorators
  again where they can be rebuilt without side effects (``property`` and its setter chain,
  ``staticmethod``, ``classmethod``, ``functools.cached_property``, ``lru_cache``/``cache``), so
  the result is what import would have made; any other decorator (a registry, ``@triton.jit``)
  refuses the patch late, with a message to activate it at interpreter start.
- Copies are re-bound: a global (or class attribute) of a loaded module is re-bound when its
  module's *source* binds it from the target — ``from m import f``, ``from m import f as g``,
  ``from m import *`` (and re-exports of it), ``g = m.f``, ``g = f`` of such a copy, a class body's
  ``alias = f`` — and it still holds the original object. Nothing else is touched: not a global
  that merely holds an equal or identical object (``False``, ``0``, an interned string), not
  builtins, the standard library, importpatch, or a module that declared patches, by module object
  under every name it has (a patch file's ``_orig = m.f`` keeps the original it saved; a script
  is ``__main__`` and, once ``multiprocessing`` is imported, ``__mp_main__`` too). Each re-binding
  is an event (``rebind``) naming the module and name; the summary line gives the count.
- Values copied in other ways (into a dict or list, a default argument, ``functools.partial``, a
  registry, ``getattr``) keep the original: only patching at import reaches them. Each one found
  (``install/unreached.py``: a registering call such as vLLM's ``direct_register_custom_op`` in
  the module's source, a container, partial or default argument in memory) is said in a warning
  event (``how``: "unreached") with the fix, enabling the patch at interpreter start; under
  ``IMPORTPATCH_STRICT=1`` the patch is refused instead.
- What landed before (at import, or an earlier activation) is kept: a patch lands on top only where
  the chain ends up as one activation would have made it, else it is refused whole
  (``activation.landed_on``).
- ``after_import`` hooks run at once, ``fn(module)`` on the module as patched, once per process
  (event ``how``: "late"); a patch refused in place runs none of them.
- Source diffs and AST transforms cannot change code that already ran: they are refused with a
  clear message; so is a ``redirect`` (names were copied from the module already), unless the
  module already is its target (redirected at its import).
- A patch whose declaration fails to load is reported and not marked handled, so the next
  activation tries again.

Cost: candidates are found by identity in memory first; only modules that hold the original
object are read, and only those whose source mentions a copied name (or ``import *``) are parsed.
"""

from __future__ import annotations

import os
import sys

from importpatch import config, events
from importpatch.discover.declare import CODE_KINDS, REDIRECT

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    from collections.abc import Mapping
    from types import ModuleType
    from typing import Any

    from importpatch.discover.catalog import Entry
    from importpatch.discover.declare import Op
    from importpatch.install.activation import ModulePlan


def apply_to_imported(by_module: Mapping[str, list[Entry]]) -> int:
    """Patch the enabled patches' targets that are already imported (``by_module``: the installed
    finder's patches per target module); returns how many modules."""
    from importpatch.discover.catalog import retry_declaration
    from importpatch.discover.selection import applicable_ops, handled, load_patches, mark_handled

    done = 0
    for name, entries in by_module.items():
        module = sys.modules.get(name)
        if module is None:
            continue
        seen = handled(module)
        entries = [e for e in entries if e.name not in seen]
        if not entries:
            continue
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            # enable() ran inside this module's own import (a plugin it imports, a circular
            # import): what it binds below that point does not exist yet, and its loader is not
            # ours. Not marked handled: the next activation, after it ran, applies the patches.
            for e in entries:
                events.record(
                    "failed", e.name, name, "in-place",
                    f"{name} was still being imported when patching started (enable() ran "
                    "inside its import); its patches apply at the next activation, or enable "
                    "them at interpreter start (IMPORTPATCH_ENABLE in the environment)",
                )
            continue
        for e in entries:
            retry_declaration(e)
        patches, broken = load_patches(entries, name)
        for d in broken:  # not marked handled: the next activation tries again
            events.record(
                "failed", d.entry.name, name, "in-place",
                f"the patch declaration failed to load from {d.entry.source}: {d.error} "
                "(tried again at the next activation)",
            )
        failed_loads = {d.entry.name for d in broken}
        mark_handled(module, (e.name for e in entries if e.name not in failed_loads))
        warn_own_import([e for e in entries if e.name not in failed_loads], name)
        if apply_ops_in_place(name, module, applicable_ops(patches, name)):
            done += 1
    return done


def apply_ops_in_place(name: str, module: ModuleType, ops: list[Op], hook_how: str = "late"
                       ) -> bool:
    """Apply ``ops`` (on module ``name``, already executed) in place, all of a patch or none,
    re-binding copies; code ops are refused; after_import hooks run at once (their events'
    ``how``: ``hook_how``). Whether anything was applied (failures are events)."""
    from importpatch.errors import PatchError
    from importpatch.install.activation import ModulePlan, register

    for op in [o for o in ops if o.kind in CODE_KINDS]:
        events.record(
            "failed", op.patch.name, name, "in-place",
            f"{op.kind} patches apply only when the module is imported, and {name} was "
            "imported before patching started; enable it at interpreter start "
            "(IMPORTPATCH_ENABLE in the environment) instead",
        )
    if any(o.kind == REDIRECT for o in ops):
        from importpatch.install.redirect import refuse_late

        refuse_late(name, ops)  # a patch that redirects lands nothing else in place either
        redirecting = {o.patch.name for o in ops if o.kind == REDIRECT}
        ops = [o for o in ops if o.patch.name not in redirecting]
    object_ops = [o for o in ops if o.kind not in CODE_KINDS]
    if not object_ops:
        return False
    namespace = module.__dict__
    object_ops = _unreached_first(name, module, object_ops)
    if not object_ops:
        return False
    try:
        plan = ModulePlan(name, object_ops, getattr(module, "__file__", None))
    except PatchError as exc:
        events.record("failed", exc.patch, name, "in-place", exc.what)
        return False
    before = {q: _raw(namespace, q) for q in plan.sites}
    seen = len(events.events())
    if plan.ops:
        from importpatch.install.activation import IN_PLACE_FIX

        # in place at its own import's end: on from interpreter start, so only landing at the
        # definition site makes it chain with the patches that landed there
        apply_in_place(plan, namespace, source_tree(module),
                       IN_PLACE_FIX if hook_how == "in-place" else None)
    register(plan)
    if plan.hooks:
        # after_import hooks run at once, on the module as patched (a patch refused in place
        # runs none: all of a patch or none of it). At an import's own end (apply_own_import)
        # that is still before the import returns.
        refused = {e["patch"] for e in events.events()[seen:] if e["outcome"] == "failed"}
        plan.hooks = [o for o in plan.hooks if o.patch.name not in refused]
        plan.run_hooks(module, hook_how)
    for qual, original in before.items():
        new = plan.final.get(qual)
        if original is None or new is None or new is original:
            continue
        label = ",".join(sorted({o.patch.name for o in object_ops if o.qualname == qual}))
        sites = rebind_copies(name, qual, original, new)
        for where, how in sites:
            events.record("info", label, where, "rebind", f"copy of {name}:{qual} ({how})")
        listed = ", ".join(w for w, _ in sites)
        events.record(
            "info", label, f"{name}:{qual}", "rebind",
            f"re-bound {len(sites)} copies in other modules" + (f": {listed}" if sites else ""),
        )
    return True


def _unreached_first(name: str, module: ModuleType, ops: list[Op]) -> list[Op]:
    """Before ``ops`` apply late: what received their targets' originals at import and keeps
    them (``unreached.unreached``), said in a warning event per place; under strict mode a patch
    with such a place is refused whole (a failed event) and left out of what is returned."""
    from importpatch.discover.declare import CHAIN_KINDS, SET
    from importpatch.install import unreached

    chained = [o for o in ops if o.kind in (*CHAIN_KINDS, SET) and o.qualname]
    if not chained:
        return ops
    namespace = vars(module)
    targets = {q: _raw(namespace, q) for q in dict.fromkeys(o.qualname for o in chained) if q}
    protected = _protected()
    try:
        found = unreached.unreached(name, source_tree(module),
                                    {q: v for q, v in targets.items() if v is not None},
                                    [o.obj for o in ops], lambda n, m: _skipped(n, m, protected))
    except Exception:  # the warning must never cost the patch
        return ops
    if not found:
        return ops
    strict = config.flag(os.environ, config.STRICT)
    refused: set[str] = set()
    tree = source_tree(module)
    for qual, places in found.items():
        for patch in sorted({o.patch.name for o in chained if o.qualname == qual}):
            fix = unreached.FIX
            decorators = unreached.decorators_keep(tree, qual)
            if decorators and any(o.decorated for o in chained
                                  if o.qualname == qual and o.patch.name == patch):
                fix += (f", with decorated=False: decorated=True puts the patch outside "
                        f"{', '.join(decorators)}, which keeps what it was given at interpreter "
                        "start too")
            said = (f"{name} was imported before patching started, and while it ran "
                    f"{name}:{qual} was handed to what late activation cannot re-bind: "
                    f"{'; '.join(places)}. There the original stays, and what calls it through "
                    f"there runs it, not this patch: {fix}")
            if strict:
                refused.add(patch)
                events.record("failed", patch, f"{name}:{qual}", "in-place",
                              f"{said} ({config.STRICT}=1 refuses such a patch late)")
                continue
            events.record("info", patch, f"{name}:{qual}", "unreached", said, level=30)
            events.warn_once(f"unreached:{patch}:{name}:{qual}", f"patch {patch}: {said}")
    return [o for o in ops if o.patch.name not in refused]


def _raw(namespace: dict[str, Any], qual: str) -> Any:
    obj: Any = namespace
    for part in qual.split("."):
        store = obj if isinstance(obj, dict) else getattr(obj, "__dict__", {})
        if part not in store:
            return None
        obj = store[part]
    return obj


# -- Reading loaded modules' source ---------------------------------------------------------------

_texts: dict[str, tuple[Any, str | None]] = {}  # module name -> (module, its source or None)
_trees: dict[str, tuple[Any, ast.Module | None]] = {}


def source_text(module: ModuleType) -> str | None:
    """The source the module ran from (a patched module: the patched text), or None."""
    name = module.__name__
    cached = _texts.get(name)
    if cached is not None and cached[0] is module:
        return cached[1]
    text: str | None = None
    spec = getattr(module, "__spec__", None)
    loader = getattr(spec, "loader", None) or getattr(module, "__loader__", None)
    try:
        get_source = getattr(loader, "get_source", None)
        if get_source is not None:
            text = get_source(name)
    except Exception:
        text = None
    if text is None:
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.endswith(".py"):
            try:
                from importpatch.safefiles import decode_source

                with open(file, "rb") as f:
                    text = decode_source(f.read())
            except (OSError, SyntaxError, UnicodeDecodeError):
                text = None
    _texts[name] = (module, text)
    return text


_raw_texts: dict[str, tuple[Any, bytes | None, bool]] = {}  # module, raw text, has import *


def _mentions(module: ModuleType, names: set[str]) -> bool:
    """Whether the module's file mentions one of ``names`` or ``import *`` (a cheap byte search
    before any decoding or parsing; a module without a readable .py file is read the slow way)."""
    name = module.__name__
    cached = _raw_texts.get(name)
    if cached is None or cached[0] is not module:
        raw: bytes | None = None
        file = vars(module).get("__file__")
        if isinstance(file, str) and file.endswith(".py"):
            try:
                with open(file, "rb") as f:
                    raw = f.read()
            except OSError:
                raw = None
        cached = _raw_texts[name] = (module, raw, raw is None or b"import *" in raw)
    _, raw, star = cached
    return star or any(n.encode() in raw for n in names)  # type: ignore[operator]


def source_tree(module: ModuleType) -> ast.Module | None:
    name = module.__name__
    cached = _trees.get(name)
    if cached is not None and cached[0] is module:
        return cached[1]
    import ast

    text = source_text(module)
    tree: ast.Module | None = None
    if text is not None:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            tree = None
    _trees[name] = (module, tree)
    return tree


# -- Copies ---------------------------------------------------------------------------------------


def _protected() -> set[int]:
    """Modules that declared patches, by object (ids): never re-bound under any of their names.
    One module may have several: ``__main__`` is also ``sys.modules["__mp_main__"]`` once
    ``multiprocessing`` is imported (torch and vLLM import it), and a patch records only the
    name its module had when it was made."""
    from importpatch.discover import catalog, declare

    patches = [*declare.iter_registry(), *catalog._ep_patches.values()]
    for loaded in list(catalog._loaded_files.values()):
        patches.extend(loaded)
    names = {p.defined_in for p in patches if p.defined_in}
    return {id(m) for n in names if (m := sys.modules.get(n)) is not None}


def _skipped(name: str, module: Any, protected: set[int]) -> bool:
    top = name.partition(".")[0]
    return (
        top == "importpatch" or id(module) in protected or top in sys.stdlib_module_names
        or name in sys.builtin_module_names
    )


def _get(module: Any, qual: str) -> Any:
    return _raw(vars(module), qual)


def _holds(module: Any, original: Any, target: Any) -> bool:
    """Whether a global of ``module`` is ``original``, or (when a global is the target module, as
    for ``class K: alias = m.f``) an attribute of a class it defines. Plain identity tests only:
    no attribute access that could run code (lazy modules, deprecation hooks)."""
    values = list(vars(module).values())
    ids = set(map(id, values))  # identity tests at C speed: ~5,000 modules in a vLLM process
    if id(original) in ids:
        return True
    if target is None or id(target) not in ids:
        return False
    name = module.__name__
    for value in values:
        if isinstance(value, type):
            attrs = type.__dict__["__dict__"].__get__(value)
            if attrs.get("__module__") == name and any(v is original for v in attrs.values()):
                return True
    return False


# What the last rebind_copies looked at (bench/late_rebind.py reports it).
last_stats: dict[str, int] = {}


def rebind_copies(
    target: str, qual: str, original: Any, new: Any
) -> list[tuple[str, str]]:
    """Re-bind the proven copies of ``target:qual`` (see the module docstring) that still hold
    ``original``. Returns ``("module:qual", how)`` for each, in a stable order."""
    from importpatch.rewrite import bindings

    protected = _protected()
    candidates: dict[str, Any] = {}
    target_module = sys.modules.get(target)
    for name, module in list(sys.modules.items()):
        if module is None or _skipped(name, module, protected):
            continue
        try:
            if _holds(module, original, target_module):
                candidates[name] = module
        except Exception:  # a module whose namespace misbehaves is no copy we can prove
            continue
    parsed = 0
    copies: dict[tuple[str, str], str] = {(target, qual): "the target"}
    names = {qual.rpartition(".")[2]}
    analysed: dict[str, tuple[list[tuple[str, str, str, int]], list[tuple[str, int]]]] = {}
    rejected: dict[str, int] = {}  # module -> how many names it was searched for
    while True:
        fresh = False
        for name, module in candidates.items():
            if name in analysed or rejected.get(name) == len(names):
                continue
            if not _mentions(module, names):
                rejected[name] = len(names)
                continue
            text = source_text(module)
            if text is None:
                continue
            parsed += 1
            tree = source_tree(module)
            if tree is None:
                continue
            package = getattr(module, "__package__", None)
            analysed[name] = bindings.copy_edges(tree, package, name)
            fresh = True
        grown = False
        for name, (edges, stars) in analysed.items():
            module = candidates[name]
            for local, src_mod, src_qual, line in edges:
                if (src_mod, src_qual) in copies and (name, local) not in copies \
                        and _get(module, local) is original:
                    copies[(name, local)] = f"{src_mod}:{src_qual} bound at line {line}"
                    names.add(local.rpartition(".")[2])
                    grown = True
            for src_mod, line in stars:
                for cm, cq in list(copies):
                    if cm != src_mod or "." in cq or (name, cq) in copies:
                        continue
                    if _exported(sys.modules.get(src_mod), cq) and _get(module, cq) is original:
                        copies[(name, cq)] = f"'from {src_mod} import *' at line {line}"
                        grown = True
        if not grown and not fresh:
            break
    last_stats.update(modules=len(sys.modules), candidates=len(candidates), parsed=parsed)
    out = []
    for (name, local), how in sorted(copies.items()):
        if (name, local) == (target, qual):
            continue
        owner_qual, _, attr = local.rpartition(".")
        module = candidates[name] if name in candidates else sys.modules[name]
        owner = _get(module, owner_qual) if owner_qual else vars(module)
        if isinstance(owner, dict):
            owner[attr] = new
        else:
            setattr(owner, attr, new)
        out.append((f"{name}:{local}", how))
    return out


def _exported(module: Any, name: str) -> bool:
    """Whether ``from module import *`` binds ``name``."""
    if module is None:
        return False
    public = getattr(module, "__all__", None)
    if public is not None:
        return name in public
    return not name.startswith("_")


def apply_own_import(module: ModuleType, name: str, entries: list[Entry]) -> None:
    """Right after ``name`` executed (the loader's ``exec_module``, before the import returns):
    apply in place the patches of ``entries``, whose declarations import ``name`` themselves
    (``catalog.in_place_only``), as a late activation does, with the warning of
    ``warn_own_import``. A declaration that does not load, or a patch refused in place (other
    patches' chains on its target, a decorator that cannot be rebuilt) fails the import closed
    (PatchError; ``On-Error: warn``: the event only), as at the definition site."""
    from importpatch.discover.selection import applicable_ops, load_patches, mark_handled
    from importpatch.errors import PatchError

    running = _running_declarations(entries)
    if running:
        # The package's own module is what imported ``name`` (the blog post's layout: the patch
        # module imports its target at module level, and vLLM's plugin imports that module):
        # its class is not defined yet, and loading it now would import that half-run module
        # again. Applied when it has finished, before its import returns (``_when_imported``).
        mark_handled(module, (e.name for e in entries))
        _defer(module, name, entries, running)
        return
    file = getattr(module, "__file__", None)
    patches, broken = load_patches(entries, name)
    for d in broken:
        err = PatchError(
            d.entry.name, name,
            f"the patch declaration failed to load from {d.entry.source}: {d.error}", file=file,
        )
        # Recorded, as the loader records a failure at import: `status` says "failed", with
        # the error, not "not imported here".
        err.recorded = True
        events.record("failed", err.patch, name, "import", err.what)
        raise err
    mark_handled(module, (e.name for e in entries))
    warn_own_import(entries, name)
    seen = len(events.events())
    apply_ops_in_place(name, module, applicable_ops(patches, name), hook_how="in-place")
    failing = {p.name: p for p in patches if p.on_error != "warn"}
    for event in events.events()[seen:]:
        if event["outcome"] == "failed" and event["patch"] in failing:
            source = next(e.source for e in entries if e.name == event["patch"])
            from importpatch.install.activation import IN_PLACE_FIX

            fix = "" if IN_PLACE_FIX in event["detail"] else (
                ": give the targets as strings and drop that import")
            raise PatchError(
                event["patch"], name,
                f"{event['detail']} (applied in place because {source} imports {name} while "
                f"it declares its patches{fix})",
                file=file,
            )


def _package_of(entry: Entry) -> str:
    """The top-level package of a patch package's declaration (``entry.defined``, else the
    module of its entry point's value ``module:function``)."""
    value = entry.defined or str(entry.source).partition(" = ")[2]
    return value.partition(":")[0].strip().partition(".")[0]


def _running_declarations(entries: list[Entry]) -> list[ModuleType]:
    """The modules of the entries' packages that are executing their own import right now (an
    import of one of them is what imported the target)."""
    tops = {_package_of(e) for e in entries}
    out = []
    for modname, mod in list(sys.modules.items()):
        if modname.partition(".")[0] in tops and getattr(
                getattr(mod, "__spec__", None), "_initializing", False):
            out.append(mod)
    return out


# target module name -> (module, entries) whose declaring package was still being imported when
# the target finished: applied when it has been (``_when_imported``, or ``run_deferred``).
_deferred: dict[str, tuple[ModuleType, list[Entry]]] = {}


def _defer(module: ModuleType, name: str, entries: list[Entry], running: list[ModuleType]
           ) -> None:
    held = _deferred.get(name)
    _deferred[name] = (module, (held[1] if held else []) + entries)
    for mod in running:
        _when_imported(mod)


def _when_imported(mod: ModuleType) -> None:
    """Call ``run_deferred`` as soon as ``mod``'s import has finished: importlib sets its spec's
    ``_initializing`` back to False right after the module's code ran (``_load_unlocked``, the
    same on Python 3.10-3.13), so the spec's class is swapped for a subclass that watches that
    one attribute and puts the original class back. Elsewhere (no spec, a spec of a class that
    cannot be swapped) ``run_deferred`` runs at the patch class's ``apply()``."""
    spec = getattr(mod, "__spec__", None)
    cls = type(spec)
    if spec is None or getattr(cls, "_importpatch_watch", False):
        return
    watcher = _watchers.get(cls)
    if watcher is None:
        def _get(self: Any) -> Any:
            return vars(self).get("_initializing", False)

        def _set(self: Any, value: Any) -> None:
            vars(self)["_initializing"] = value
            if not value:
                self.__class__ = cls
                run_deferred()

        watcher = _watchers[cls] = type(cls.__name__, (cls,), {
            "_initializing": property(_get, _set), "_importpatch_watch": True,
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        })
    try:  # noqa: SIM105 (no contextlib import on this path)
        spec.__class__ = watcher
    except TypeError:
        pass


_watchers: dict[type, type] = {}


def run_deferred() -> None:
    """Apply in place the deferred patches whose packages have finished importing (failures
    raise PatchError, as ``apply_own_import`` does)."""
    for name, (module, entries) in list(_deferred.items()):
        if _running_declarations(entries):
            continue
        del _deferred[name]
        if sys.modules.get(name) is not module:
            continue  # the target's import failed or it was dropped meanwhile
        missing = [e for e in entries if e.defined
                   and e.defined.partition(":")[0] not in sys.modules]
        if missing:
            # The package's module failed to import after it imported the target (its own error
            # is on its way up): its patches cannot be read, and the target ran without them.
            for e in missing:
                events.record("failed", e.name, name, "in-place",
                              f"{e.source} imported {name} and then failed to import itself")
            entries = [e for e in entries if e not in missing]
            if not entries:
                continue
        apply_own_import(module, name, entries)


def warn_own_import(entries: list[Entry], module: str) -> None:
    """Once per process and package: its patches on ``module`` are applied in place because its
    declaration imports their target (``catalog.in_place_only``), what in place cannot reach,
    and the fix."""
    from importpatch.discover.catalog import in_place_only, own_import_sites, string_form

    for e in entries:
        if not in_place_only(e):
            continue
        names = sorted(x.name for x in entries if x.source == e.source and in_place_only(x))
        key = f"own-import:{e.source}"
        said = os.environ.get(config.WARNED, "")
        if key in said.split("\n"):
            continue  # the process that started this one printed it (once per process tree)
        os.environ[config.WARNED] = f"{said}\n{key}" if said else key
        sites = own_import_sites(e, module)
        where = f" ({', '.join(sites)})" if sites else ""
        events.warn_once(
            key,
            f"patch package {e.source} imports {module} while it declares its patches "
            f"({', '.join(names)}), so they are applied in place after {module} ran: what the "
            "module did with the originals while it executed (decorators, registries, "
            "subclasses, default arguments) keeps them. Give the targets as strings "
            f"('pkg.mod:Name.attr': {string_form(e, module)}) and drop the module-level "
            f"import{'s' if len(sites) > 1 else ''}{where}, so that they land at the definition "
            "site",
        )


# -- Applying a plan in place (landing at import, redone on a module that already ran) -----------


def apply_in_place(plan: ModulePlan, namespace: dict[str, Any], tree: ast.Module | None,
                   fix: str | None = None) -> None:
    """Patch an already-executed module: the same objects as at import where the source shows
    how (decorators re-applied: see ``redecorate_plan``), all of a patch or none of it. ``fix``:
    the advice of a refusal on top of earlier patches (default ``activation.TOGETHER``)."""
    import enum

    from importpatch.discover.declare import ADD, SET
    from importpatch.errors import PatchError
    from importpatch.install.activation import (
        TOGETHER,
        adopt,
        beneath_subclasses,
        chain_links,
        landed_on,
        op_order,
        record_landed,
        resolve,
        set_attr,
        watch_applied,
    )

    by_patch: dict[str, list[tuple[Op, Any, Any]]] = {}
    problems: dict[str, str] = {}
    earlier = landed_on(plan.module, namespace)
    for op in plan.ops:
        assert op.qualname is not None
        owner_qual, _, attr = op.qualname.rpartition(".")
        try:
            refusal = _after_earlier(op, earlier, fix or TOGETHER)
            if refusal:
                raise LateRefusal(refusal)
            owner = (beneath_subclasses(resolve(namespace, owner_qual, plan)[1]) if owner_qual
                     else namespace)
            store = owner if isinstance(owner, dict) else getattr(owner, "__dict__", {})
            if isinstance(owner, enum.EnumMeta) and attr in owner.__members__:
                raise LateRefusal(  # the class refuses setattr of a member
                    f"{op.qualname} is an Enum member: a built Enum class refuses to "
                    "reassign it; use patch.field(target, default=VALUE, existing=True), "
                    "which applies at import: activate at interpreter start")
            if op.kind in (ADD, SET):  # set: setattr, whatever is there
                if op.kind == ADD and attr in store and store[attr] is not op.obj:
                    raise PatchError(op.patch.name, plan.module,
                                     f"add {op.qualname}: already exists", file=plan.file)
                by_patch.setdefault(op.patch.name, []).append((op, owner, None))
                continue
            current = resolve(namespace, op.qualname, plan)[1]
            layers = None
            if not op.decorated:
                layers = redecorate_plan(tree, op.qualname, current, plan.module)
            by_patch.setdefault(op.patch.name, []).append((op, owner, layers))
        except PatchError as err:
            problems.setdefault(op.patch.name, err.what)
        except LateRefusal as exc:
            problems.setdefault(op.patch.name, str(exc))
    for name, what in problems.items():
        events.record("failed", name, plan.module, "in-place", what)
    applied = {n: v for n, v in by_patch.items() if n not in problems}
    ops_ok = [op for op in plan.ops if op.patch.name in applied]
    for qual in sorted({op.qualname or "" for op in ops_ok}, key=lambda q: q.count(".")):
        here = sorted((o for o in ops_ok if o.qualname == qual), key=op_order)
        owner_qual, _, attr = qual.rpartition(".")
        owner = (beneath_subclasses(resolve(namespace, owner_qual, plan)[1]) if owner_qual
                 else namespace)
        adds = [o for o in here if o.kind in (ADD, SET)]
        for op in adds:
            adopt(op, plan.module)
            set_attr(owner, attr, op.obj)
        if adds and qual in plan.sites:  # a module-level set: its copies are re-bound
            plan.final[qual] = adds[-1].obj
        rest = [o for o in here if o.kind not in (ADD, SET)]
        if not rest:
            continue
        current = resolve(namespace, qual, plan)[1]
        inner = [o for o in rest if not o.decorated]
        outer = [o for o in rest if o.decorated]
        if inner:
            layers = next(v[2] for v in applied[inner[0].patch.name] if v[0] is inner[0])
            current = rebuild(layers, plan.make_object(qual, inner, peel(layers, current)), owner,
                              attr)
        current = plan.make_object(qual, outer, current)
        if type(current) in (property, classmethod, staticmethod):
            from importpatch.install.objects import settle

            current = settle(current, plan.module, qual, plan.named)
        set_attr(owner, attr, current)
        plan.final[qual] = current
    links = chain_links([*earlier, *ops_ok])  # places in the whole chain, as at import
    by_qual: dict[str, list[dict[str, Any]]] = {}
    for op in ops_ok:
        by_qual.setdefault(op.qualname or "", []).append(events.record(
            "applied", op.patch.name, f"{plan.module}:{op.qualname}", "in-place", op.kind,
            chain=links.get(id(op))))
    watch_applied(namespace, by_qual, plan)
    record_landed(plan.module, namespace, [*earlier, *ops_ok])
    plan.finished = True


def _after_earlier(op: Op, earlier: list[Op], fix: str) -> str:
    """Why ``op`` cannot land on top of the operations that landed before it, or "" (the rule
    ``importpatch check`` applies too: ``activation.landing_refusal``)."""
    from importpatch.install.activation import landing_refusal

    return landing_refusal(op, earlier, fix)


# -- Late: re-applying the original decorators to a replacement -----------------------------------


class LateRefusal(Exception):
    """A patch cannot be applied to an already-imported module the way import would apply it."""


# Decorators whose effect can be rebuilt on another function without side effects.
_REBUILDABLE = ("property", "staticmethod", "classmethod", "cached_property", "lru_cache", "cache")


def _decorator_name(expr: ast.expr) -> str:
    import ast

    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return expr.id if isinstance(expr, ast.Name) else ast.unparse(expr)


def redecorate_plan(
    tree: ast.Module | None, qual: str, current: Any, module: str
) -> list[tuple[str, Any]]:
    """The decorator layers around the undecorated definition of ``qual`` (outermost first), as
    ``(kind, layer object)``; raises LateRefusal when they cannot be rebuilt."""
    import ast

    from importpatch.rewrite import bindings

    advice = (
        f"{module} was imported before patching started and {qual} is decorated with "
        "{what}, which cannot be applied again to the replacement without side effects; "
        "activate the patch at interpreter start (IMPORTPATCH_ENABLE in the environment)"
    )
    if tree is None:
        if callable(current) and not hasattr(current, "__wrapped__") and not isinstance(
                current, type):
            return []
        raise LateRefusal(advice.format(what="decorators the source (not readable) would show"))
    body: list[ast.stmt] = tree.body
    parts = qual.split(".")
    found: list[bindings.Binding] = []
    for i, part in enumerate(parts):
        found = bindings.scope_bindings(body, part)
        if i < len(parts) - 1:
            cls = next((b.node for b in found if isinstance(b.node, ast.ClassDef)), None)
            if cls is None:
                return []
            body = cls.body
    defs = [b for b in found if not b.derived]
    derived = [b for b in found if b.derived]
    decorated = [b for b in defs if getattr(b.node, "decorator_list", None)]
    if not decorated:
        if derived:
            raise LateRefusal(advice.format(what=f"a re-binding at line {derived[0].line}"))
        return []
    lists = {tuple(ast.dump(d) for d in b.node.decorator_list) for b in decorated}  # type: ignore[attr-defined]
    names = [_decorator_name(d) for d in decorated[0].node.decorator_list]  # type: ignore[attr-defined]
    if len(lists) > 1 or len(decorated) != len(defs) or any(n not in _REBUILDABLE for n in names):
        what = ", ".join(f"@{n}" for n in names if n not in _REBUILDABLE) or "several definitions"
        raise LateRefusal(advice.format(what=what))
    for b in derived:  # only the property chain (@x.setter / getter / deleter) is rebuilt
        decos = getattr(b.node, "decorator_list", [])
        if not (names[0] == "property" and len(decos) == 1 and isinstance(decos[0], ast.Attribute)
                and decos[0].attr in ("setter", "getter", "deleter")):
            raise LateRefusal(advice.format(what=f"a re-binding at line {b.line}"))
    layers: list[tuple[str, Any]] = []
    obj = current
    for name in names:
        layers.append((name, obj))
        obj = _inner(name, obj)
        if obj is None:
            raise LateRefusal(advice.format(what=f"@{name} (its object is not what it makes)"))
    return layers


def _inner(kind: str, layer: Any) -> Any:
    import functools

    if kind == "property":
        return layer.fget if isinstance(layer, property) else None
    if kind in ("staticmethod", "classmethod"):
        return layer.__func__ if isinstance(layer, (staticmethod, classmethod)) else None
    if kind == "cached_property":
        return layer.func if isinstance(layer, functools.cached_property) else None
    if hasattr(layer, "cache_parameters") and hasattr(layer, "__wrapped__"):
        return layer.__wrapped__
    return None


def peel(layers: list[tuple[str, Any]] | None, current: Any) -> Any:
    """The undecorated object inside ``current``."""
    for kind, layer in layers or []:
        current = _inner(kind, layer)
    return current


def rebuild(layers: list[tuple[str, Any]] | None, func: Any, owner: Any, attr: str) -> Any:
    """``func`` with the decorators of ``layers`` applied again, innermost first."""
    import functools

    for kind, layer in reversed(layers or []):
        if kind == "property":
            func = layer.getter(func)  # keeps the setter, deleter and a doc not from the getter
        elif kind in ("staticmethod", "classmethod"):
            func = type(layer)(func)
        elif kind == "cached_property":
            func = functools.cached_property(func)
            func.__set_name__(owner, attr)
        else:
            func = functools.lru_cache(**layer.cache_parameters())(func)
    return func
