"""Activation: what a patched module's compiled code calls while it executes (import time).

The rewrite (importpatch/rewrite/landing.py) bakes calls into the code: ``begin`` first, ``land`` at
each definition site of a target, ``value`` for a class-body field (fields.py), ``done`` last;
they reach this module as ``importpatch.rewrite.facts.HOOKS``
(``__import__('importpatch.install.activation').install.activation``), which resolves through
sys.modules at run time, so the code works in any namespace (runpy's ``__main__`` too). The name is
baked into cached code: the bytecode cache's key holds a hash of this module's source and of
facts.py (``bytecache.PRODUCERS``), so an entry made by other code expires.

``ModulePlan`` holds one module's operations, grouped by landing site, and applies them as
names are bound, then checks them in ``finish`` (the rules are in landing.py's docstring). The
``Fact`` objects (rewrite/facts.py) are what the source proved before the module ran, kept with
the code in the cache. Late activation (patching a module imported before,
importpatch/install/late.py) uses the same plan. Imported on every patched import, cache hit or
not: no ``ast`` at module level.
"""

from __future__ import annotations

import os
import sys

from importpatch import events
from importpatch.discover.declare import (
    ADD,
    AFTER_IMPORT,
    CHAIN_KINDS,
    REPLACE,
    SET,
    SUBCLASS,
    WRAP,
    RunOnce,
)
from importpatch.errors import PatchError
from importpatch.rewrite.facts import Fact

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ast
    from collections.abc import Callable, Iterable
    from typing import Any

    from importpatch.discover.declare import Op, Patch


# -- Where an operation lands ------------------------------------------------------------------


def site_of(op: Op) -> tuple[str, str]:
    """(qualname where the operation lands, stage). Adds land on the owner's binding; so does a
    set of a class member (``setattr`` on the finished class), while a set of a module-level name
    lands on that name's bindings (or, when the module binds it nowhere, is added after it ran)."""
    assert op.qualname is not None
    if _on_owner(op):
        owner, _, _ = op.qualname.rpartition(".")
        return owner, "outer"
    return op.qualname, "outer" if op.decorated else "inner"


def _on_owner(op: Op) -> bool:
    """An add, or a set of a class member: it is ``setattr`` on the owner."""
    return op.kind == ADD or (op.kind == SET and "." in (op.qualname or ""))


# -- What the source proves, before the module runs (kept with the code) ----------------------


def fact_quals(ops: Iterable[Op]) -> set[str]:
    """Every qualname a plan needs a fact for: targets and the owners adds land on."""
    quals: set[str] = set()
    for op in ops:
        assert op.qualname is not None
        quals.add(f"+{op.qualname}" if op.kind == ADD else op.qualname)
        owner = site_of(op)[0]
        if owner:
            quals.add(owner)
    return quals


# -- Run time: applying operations as names are bound --------------------------------------------


class ModulePlan:
    """The operations for one module, grouped by landing site, and what happened to them."""

    def __init__(self, module: str, ops: list[Op], file: str | None) -> None:
        self.module = module
        self.file = file
        # after_import ops bind no name: they run once the module's body ran (``run_hooks``)
        self.hooks = [op for op in ops if op.kind == AFTER_IMPORT]
        self.ops = [op for op in ops if op.kind != AFTER_IMPORT]
        self.sites: dict[str, dict[str, list[Op]]] = {}
        for op in self.ops:
            qual, stage = site_of(op)
            if not qual:  # add to the module itself: done by begin()
                continue
            self.sites.setdefault(qual, {}).setdefault(stage, []).append(op)
        for stages in self.sites.values():
            for stage_ops in stages.values():
                _check_conflicts(module, stage_ops, file)
                stage_ops.sort(key=op_order)
        self.staged: dict[str, str] = {}  # warn patch name -> why it applies after execution
        self.final: dict[str, Any] = {}  # qualname -> the object its last landing installed
        self.landed: set[str] = set()  # qualnames that had a landing with operations
        self.unseen: set[str] = set()  # targets with no landing site in the code
        self.finished = False
        self.after_exec: Callable[[dict[str, Any]], None] | None = None  # the loader's steps
        self.named: set[int] = set()  # ids of installed objects given their target's names
        self.values: dict[str, Any] = {}  # qualname -> default of a class-body field (fields.py)

    @property
    def module_adds(self) -> list[Op]:
        return [op for op in self.ops if op.kind == ADD and "." not in (op.qualname or "")]

    def fail(self, err: PatchError) -> PatchError:
        """Record a failure of this module's import (once) and return it, to be raised."""
        events.record("failed", err.patch, self.module, "import", err.what)
        return err

    # -- before the module runs

    def prepare(self, facts: dict[str, Fact]) -> None:
        """Apply what the source proves (see the module docstring): raise for a fail patch that
        cannot apply, drop a warn patch that cannot apply, stage a warn patch that cannot be
        proven."""
        for patch in dict.fromkeys(op.patch for op in self.ops):
            ops = [op for op in self.ops if op.patch is patch]
            doomed = next((e for e in (self._doomed(op, facts) for op in ops) if e), None)
            if doomed is not None:
                if patch.on_error != "warn":
                    raise self.fail(doomed)
                self.drop(patch, doomed.what)
                continue
            if patch.on_error == "warn":
                why = next((w for w in (self._unproven(op, facts) for op in ops) if w), "")
                if why:
                    self.staged[patch.name] = why
            self._drift(patch, ops, facts)

    def _drift(self, patch: Patch, ops: list[Op], facts: dict[str, Fact]) -> None:
        """A pinned original that changed since the pin (``rewrite.pins``): one warning per
        process and an ``info`` event; under IMPORTPATCH_STRICT=1 the import fails (an
        on_error="warn" patch is dropped). The digests were computed at compile time."""
        if patch.origin == "builtin":
            return  # checked over every release its Requires admits (docs/compat-matrix.md)
        from importpatch.rewrite.pins import matches, pinned_qual, pins_of

        pins = pins_of(patch)
        if not pins:
            return
        for op in ops:
            qual = pinned_qual(op.kind, op.qualname)
            fact = facts.get(qual) if qual else None
            pin = next((p for m in (self.module, *op.modules) if (p := pins.get((m, qual or "")))),
                       None)
            if pin is None or fact is None or not fact.digest or matches(pin.digest, fact.digest):
                continue
            what = (f"{op.kind} {op.target}: the original {self.module}:{qual} changed since "
                    f"the patch was pinned ({pin.release or 'unknown release'}); "
                    f"'importpatch check {patch.name}' shows upstream's diff")
            from importpatch import config

            if config.flag(os.environ, config.STRICT):
                err = PatchError(patch.name, self.module, f"{what} ({config.STRICT} is on)",
                                 file=self.file)
                if patch.on_error != "warn":
                    raise self.fail(err)
                self.drop(patch, err.what)
                return
            events.record("info", patch.name, f"{self.module}:{qual}", "drift", what)
            events.warn_once(f"drift\0{patch.name}\0{self.module}\0{qual}",
                             f"{patch.name}: {what}")

    def _doomed(self, op: Op, facts: dict[str, Fact]) -> PatchError | None:
        from importpatch.rewrite.bindings import ABSENT, BOUND, REFUSED

        assert op.qualname is not None
        owner = site_of(op)[0] if _on_owner(op) else op.qualname
        if op.kind == SET and not _on_owner(op):
            owner = ""  # a module-level set replaces, or adds a name the module never binds
        for qual in ([owner] if owner else []):
            fact = facts.get(qual)
            if fact is not None and fact.state == ABSENT:
                why = f"; {fact.why}" if fact.why else ""
                if not why and qual == op.qualname and "." in qual and op.kind in CHAIN_KINDS:
                    hint = inherited_hint(self.module, self.file, qual)
                    why = f": {hint}" if hint else ""
                if not why:  # a typo: the name the module's source binds closest to it
                    close = close_symbol(self.file, qual)
                    why = f"; did you mean {self.module}:{close}?" if close else ""
                return PatchError(
                    op.patch.name, self.module,
                    f"symbol {qual!r} not found (target {self.module}:{op.qualname}){why}",
                    file=self.file,
                )
        fact = facts.get(op.qualname)
        if op.kind in CHAIN_KINDS and fact is not None and fact.state == REFUSED:
            return PatchError(op.patch.name, self.module, fact.why, file=self.file)
        fact = facts.get(f"+{op.qualname}")
        if op.kind == ADD and fact is not None and fact.state == BOUND:
            where = f" (line {fact.line})" if fact.line else ""
            owner_qual, _, attr = op.qualname.rpartition(".")
            what = (f"{attr!r} already exists" if owner_qual
                    else "the module defines that name itself")
            return PatchError(
                op.patch.name, self.module, f"add {op.qualname}: {what}{where} (use replace)",
                file=self.file,
            )
        return None

    @staticmethod
    def _unproven(op: Op, facts: dict[str, Fact]) -> str:
        from importpatch.rewrite.bindings import ABSENT, BOUND

        assert op.qualname is not None
        owner = site_of(op)[0]
        checks = [(owner, BOUND)] if _on_owner(op) and owner else []
        if op.kind == ADD:
            checks.append((f"+{op.qualname}", ABSENT))
        elif op.kind != SET:  # a set needs nothing of the name itself
            checks.append((op.qualname, BOUND))
        for qual, wanted in checks:
            fact = facts.get(qual)
            if fact is None or fact.state != wanted:
                return fact.why if fact is not None and fact.why else f"{qual} cannot be proven"
            if wanted == BOUND and not fact.seen:
                return f"{qual} is bound in a way the loader cannot land on"
        return ""

    def drop(self, patch: Patch, why: str) -> None:
        """Leave a warn patch out of this module entirely (nothing of it has landed)."""
        record_skip(patch.name, self.module, why)
        self.ops = [op for op in self.ops if op.patch is not patch]
        self.hooks = [op for op in self.hooks if op.patch is not patch]
        for stages in self.sites.values():
            for stage, stage_ops in stages.items():
                stages[stage] = [op for op in stage_ops if op.patch is not patch]
        self.staged.pop(patch.name, None)

    def begin(self, namespace: dict[str, Any]) -> None:
        for op in self.module_adds:
            if op.patch.name in self.staged:
                continue
            assert op.qualname is not None
            # A reload runs the module again in its namespace: the patch's own object is no clash.
            if op.qualname in namespace and namespace[op.qualname] is not op.obj:
                raise self.fail(PatchError(
                    op.patch.name, self.module, f"add {op.qualname}: already exists",
                    file=self.file))
            adopt(op, self.module)
            namespace[op.qualname] = op.obj

    # -- while it runs

    def land(self, qual: str, stage: str) -> Callable[[Any], Any]:
        def apply(obj: Any) -> Any:
            if stage in ("check", "follow") and qual in self.landed:
                # A derived re-binding is about to run (the decorators of a ``def`` run before
                # the name is re-bound): it derives from the patched object only if nothing
                # re-bound the name unseen in between (a walrus, ``global`` in a function, ...).
                current = sys._getframe(1).f_locals.get(qual.rpartition(".")[2], _MISSING)
                if current is not self.final.get(qual, _MISSING):
                    self.landed.discard(qual)
            if stage == "check":
                return obj
            stages = self.sites.get(qual, {})
            if stage in ("follow", "carry") and qual in self.landed:
                result = obj  # derived from the patched object: carried, not patched again
            elif stage == "inner":
                result = self.make_object(qual, self._live(stages.get("inner", [])), obj)
            else:  # outer, assign, or follow / carry of a name not landed yet
                ops = stages.get("outer", [])
                if stage != "outer":
                    ops = stages.get("inner", []) + ops
                result = self.make_object(qual, self._live(ops), obj)
            if stage != "inner":
                # around what landed at "inner"
                if type(result) in (property, classmethod, staticmethod):
                    from importpatch.install.objects import settle

                    result = settle(result, self.module, qual, self.named)
                self.final[qual] = result
                if any(self._live(o) for o in stages.values()):
                    self.landed.add(qual)
            return result

        return apply

    def _live(self, ops: list[Op]) -> list[Op]:
        return [op for op in ops if op.patch.name not in self.staged] if self.staged else ops

    def make_object(self, qual: str, ops: list[Op], obj: Any) -> Any:
        """The one place that makes the object installed at a target from what is there."""
        from importpatch.install import objects

        for op in ops:
            home = objects.name_home(op.patch)
            if op.kind == REPLACE:
                if (op.original or not isinstance(op.obj, type)) and self._class_statement(
                        obj, qual):
                    raise self.fail(PatchError(
                        op.patch.name, self.module, not_a_class(qual, op), file=self.file))
                if op.original:
                    try:
                        new = objects.stand_in(obj, op.obj, self.module, qual)
                    except TypeError as exc:
                        raise self.fail(PatchError(
                            op.patch.name, self.module,
                            f"replace {qual} with original=True: {exc}", file=self.file)) from None
                    self.named.add(id(new))
                else:
                    new = op.obj
                    objects.adopt_names(new, self.module, qual, home)
                    self.named.add(id(new))
                obj = _same_descriptor(obj, new)
            elif op.kind == WRAP:
                from importpatch.install import (
                    wrappers,  # wrapt costs ~25 ms: imported only where one is wrapped
                )

                obj = wrappers.wrap_object(obj, op.obj, self.module, qual)
            elif op.kind == SUBCLASS:
                obj = self._subclass(qual, op, obj)
                self.named.add(id(obj))
            elif op.kind == ADD:
                assert op.qualname is not None
                attr = op.qualname.rpartition(".")[2]
                existing = getattr(obj, "__dict__", {}).get(attr, op.obj)
                if existing is not op.obj:
                    raise self.fail(PatchError(
                        op.patch.name, self.module,
                        f"add {op.qualname}: {attr!r} already exists (use replace)",
                        file=self.file))
                objects.adopt_names(op.obj, self.module, op.qualname, home)
                setattr(obj, attr, op.obj)
            elif op.kind == SET:  # importpatch.integrations.compat: setattr, replacing or adding
                assert op.qualname is not None
                if "." in op.qualname:  # obj is the owner class
                    setattr(obj, op.qualname.rpartition(".")[2], op.obj)
                else:
                    obj = op.obj
        return obj

    def _class_statement(self, obj: Any, qual: str) -> bool:
        """Whether ``obj`` is the class that the class statement of ``qual`` made (not a class
        that an assignment binds there, ``Factory = dict``): what ``check`` can tell too."""
        return isinstance(obj, type) and getattr(obj, "__module__", None) == self.module \
            and getattr(obj, "__qualname__", None) == qual

    def _subclass(self, qual: str, op: Op, original: Any) -> Any:
        from importpatch.install import objects

        def fail(what: str) -> PatchError:
            return self.fail(PatchError(op.patch.name, self.module, f"subclass {qual}: {what}",
                                        file=self.file))

        if not isinstance(original, type):
            raise fail(f"{self.module}:{qual} is a {type(original).__name__}, not a class "
                       "(replace or wrap it)")
        try:
            new = op.obj(original)
        except Exception as exc:
            raise fail(f"the factory {_name_of(op.obj)} raised "
                       f"{type(exc).__name__}: {exc}") from exc
        if not (isinstance(new, type) and issubclass(new, original)):
            what = (f"the class {new.__module__}.{new.__qualname__}" if isinstance(new, type)
                    else f"a {type(new).__name__}")
            raise fail(f"the factory {_name_of(op.obj)} returned {what}, not a subclass of "
                       f"{self.module}:{qual} (it must return `class X(Original): ...`)")
        if new is not original:
            objects.take_names(new, self.module, qual)
            setattr(new, ORIGINAL_CLASS, original)  # members are patched there, not here
        return new

    # -- after it ran

    def _resolve(self, namespace: dict[str, Any], qual: str) -> tuple[Any, Any]:
        try:
            return resolve(namespace, qual, self)
        except PatchError as err:
            raise self.fail(err) from None

    def finish(self, namespace: dict[str, Any]) -> None:
        """After execution: every target holds its patched object, or the import fails; staged
        warn patches are applied entirely or skipped entirely; "applied" events are recorded."""
        unseen = self.unseen
        for name in list(self.staged):
            problem = self._cannot_apply(namespace, name)
            if problem is not None:
                self.drop(next(op.patch for op in self.ops if op.patch.name == name), problem)
        how_of: dict[int, str] = {}
        for op in self.module_adds:
            assert op.qualname is not None
            if op.patch.name in self.staged:
                adopt(op, self.module)
                namespace[op.qualname] = op.obj
                how_of[id(op)] = self._after_exec_how(op.patch.name, "")
            elif namespace.get(op.qualname) is not op.obj:
                raise self.fail(PatchError(
                    op.patch.name, self.module,
                    f"add {op.qualname}: the module defines that name itself (use replace)",
                    file=self.file))
        # Outer classes before their members, so a member patched late sees the final class.
        for qual in sorted(self.sites, key=lambda q: q.count(".")):
            stages = self.sites[qual]
            ops = stages.get("inner", []) + stages.get("outer", [])
            if not ops:
                continue
            live = self._live(ops)
            if "." not in qual and qual not in namespace and all(o.kind == SET for o in ops):
                # a set of a name the module never bound: it is added now
                namespace[qual] = self.final[qual] = self.make_object(qual, live, None)
                for op in live:
                    how_of[id(op)] = "after-exec (a name the module does not bind: added)"
                continue
            owner, current = self._resolve(namespace, qual)
            staged = [op for op in ops if op.patch.name in self.staged]
            if live and not (qual in self.final and current is self.final[qual]):
                why = (
                    "binding not visible in the source"
                    if qual in unseen or qual not in self.final
                    else "name re-bound after its definition"
                )
                current = self.make_object(qual, live, current)
                set_attr(owner, qual.rpartition(".")[2], current)
                for op in live:
                    how_of[id(op)] = f"after-exec ({why})"
            if staged:
                current = self.make_object(qual, staged, current)
                set_attr(owner, qual.rpartition(".")[2], current)
                for op in staged:
                    how_of[id(op)] = self._after_exec_how(op.patch.name, qual)
            self.final[qual] = current
        for op in self.ops:
            if op.kind == ADD and "." in (op.qualname or ""):
                assert op.qualname is not None
                owner_obj = beneath_subclasses(self._resolve(namespace, site_of(op)[0])[1])
                attr = op.qualname.rpartition(".")[2]
                if getattr(owner_obj, "__dict__", {}).get(attr) is not op.obj:
                    raise self.fail(PatchError(
                        op.patch.name, self.module,
                        f"add {op.qualname}: the module sets {attr!r} itself after the class "
                        "statement (use replace)", file=self.file))
        links = chain_links(self.ops)
        by_qual: dict[str, list[dict[str, Any]]] = {}
        for op in self.ops:
            by_qual.setdefault(op.qualname or "", []).append(events.record(
                "applied", op.patch.name, f"{self.module}:{op.qualname}",
                how_of.get(id(op), "definition-site"), op.kind, chain=links.get(id(op))))
        watch_applied(namespace, by_qual, self)
        _landed[self.module] = (namespace, list(self.ops))  # a reload starts the record afresh
        self.finished = True

    def run_hooks(self, module: Any, how: str = "after-import") -> set[str]:
        """Call each after_import ``fn(module)``, by patch name (a patch's own in the order it
        declared them); returns the names of the patches whose hooks failed. At import a failure
        of an on_error="fail" patch raises PatchError (the loader's import then fails: importlib
        removes the half-run module from sys.modules, as for any failing op); "warn" skips the
        patch's remaining hooks with the event. Late (``how`` not "after-import"): every failure
        is the event only, as late activation's other refusals are."""
        failed: set[str] = set()
        for op in sorted(self.hooks, key=lambda o: o.patch.name):
            if op.patch.name in failed:
                continue
            name = hook_name(op)
            loading = True
            try:
                fn = hook_function(op)
                loading = False
                fn(module)
            except BaseException as exc:
                err = PatchError(op.patch.name, self.module,
                                 hook_failure(op, self.module, exc, loading), file=self.file)
                failed.add(op.patch.name)
                if isinstance(exc, KeyboardInterrupt):
                    # (the import fails all the same; a Ctrl-C is not made an ImportError that an
                    # `except ImportError` around the import would swallow)
                    self.fail(err)
                    raise
                if how != "after-import":
                    events.record("failed", op.patch.name, self.module, how, err.what)
                elif op.patch.on_error == "warn":
                    record_skip(op.patch.name, self.module, err.what)
                else:
                    raise self.fail(err) from exc
                continue
            when = {"after-import": "after its body ran, before its import returned",
                    "late": "at once: the module was imported before patching started"}.get(
                        how, "after it ran, in place")
            if isinstance(op.obj, RunOnce):  # Patch.adopt: one event per target it changes
                change = "adds" if not op.existing else "replaces or deletes"
                ran = (f"ran at {self.module} {when}" if op.obj.ran_at == self.module
                       else f"ran once in this process, at {op.obj.ran_at or 'another import'}")
                events.record("applied", op.patch.name, f"{self.module}:{op.qualname}", how,
                              f"adopted {name} ({change} {op.qualname}): {ran}")
                continue
            events.record("applied", op.patch.name, self.module, how,
                          f"after_import: ran {name} on {self.module} {when}")
        return failed

    def _after_exec_how(self, patch: str, qual: str) -> str:
        why = self.staged[patch]
        return f"after-exec (on_error=warn, applied whole after the module ran: {why})"

    def _cannot_apply(self, namespace: dict[str, Any], patch: str) -> str | None:
        """Why staged patch ``patch`` cannot apply now, or None."""
        for op in self.ops:
            if op.patch.name != patch:
                continue
            assert op.qualname is not None
            owner_qual, _, attr = op.qualname.rpartition(".")
            try:
                owner = (beneath_subclasses(resolve(namespace, owner_qual, self)[1]) if owner_qual
                         else namespace)
                if op.kind not in (ADD, SET):
                    resolve(namespace, op.qualname, self)
            except PatchError as err:
                return err.what
            store = owner if isinstance(owner, dict) else getattr(owner, "__dict__", {})
            if op.kind == ADD and attr in store:
                return f"add {op.qualname}: {attr!r} already exists (use replace)"
        return None


def op_order(op: Op) -> tuple[int, int, str]:
    # replace first (innermost), then adds, then subclasses, then wraps by (order, patch name):
    # deterministic. (A subclass of a wrapt proxy is no class: subclasses go beneath wraps.)
    rank = {REPLACE: 0, ADD: 1, SET: 1, SUBCLASS: 2, WRAP: 3}[op.kind]
    return (rank, op.order, op.patch.name)


def chain(ops: Iterable[Op]) -> list[Op]:
    """The replace, subclass and wrap operations of one target in the order they make the
    installed object, innermost first: on the undecorated definition a replace, then wraps by
    (order, patch name); then the original's decorators; then the ``decorated=True`` ones in the
    same order, subclasses (always on the decorated class) after a replace and before wraps.
    (The order ``ModulePlan`` applies them in: ``list``, ``check`` and events show this.)"""
    return sorted((op for op in ops if op.kind in CHAIN_KINDS),
                  key=lambda op: (op.decorated, op_order(op)))


def link(op: Op, position: int, length: int) -> dict[str, Any]:
    """One operation's place in its target's chain (events, ``list``, ``check``)."""
    return {"position": position, "length": length, "patch": op.patch.name, "kind": op.kind,
            "order": op.order, "decorated": op.decorated,
            **({"original": True} if op.original else {})}


def chain_links(ops: Iterable[Op]) -> dict[int, dict[str, Any]]:
    """id(op) -> ``link`` of every replace and wrap among ``ops``, per target qualname."""
    by_qual: dict[str | None, list[Op]] = {}
    for op in ops:
        by_qual.setdefault(op.qualname, []).append(op)
    out: dict[int, dict[str, Any]] = {}
    for group in by_qual.values():
        links = chain(group)
        for i, op in enumerate(links, 1):
            out[id(op)] = link(op, i, len(links))
    return out


def record_landed(module: str, namespace: dict[str, Any], ops: list[Op]) -> None:
    """What landed on ``module`` (this namespace) so far, in the order applied (``landed_on``)."""
    _landed[module] = (namespace, ops)


# What landed on each module so far: the import's operations (``finish``), then each late
# activation's (``apply_in_place``), with the namespace they landed in. A late activation applies
# on what is there, so it must know it: a replace enabled later would otherwise silently drop the
# wraps above it, a second replace silently win (at import: a conflict), and a wrap enabled later
# go outermost whatever its place in the chain. Invariant: a late operation lands only where the
# target's chain ends up as one activation of all of them would have made it.
_landed: dict[str, tuple[dict[str, Any], list[Op]]] = {}


def landed_on(module: str, namespace: dict[str, Any]) -> list[Op]:
    """The operations that landed on ``module`` (this namespace) before, in the order applied."""
    entry = _landed.get(module)
    return entry[1] if entry is not None and entry[0] is namespace else []


def _check_conflicts(module: str, ops: list[Op], file: str | None) -> None:
    # Two patches replacing (or setting) one name: whichever ran last would silently win.
    by_name: dict[str | None, list[Op]] = {}
    for op in ops:
        if op.kind in (REPLACE, SET):
            by_name.setdefault(op.qualname, []).append(op)
    for replacing in by_name.values():
        if len(replacing) > 1:
            first = min(op.patch.name for op in replacing)
            raise PatchError(first, module, conflict(replacing), file=file)


def conflict(replacing: list[Op]) -> str:
    names = sorted(op.patch.name for op in replacing)
    verb = "set" if all(op.kind == SET for op in replacing) else "replace"
    return (f"conflict: patches {' and '.join(repr(n) for n in names)} both {verb} "
            f"{replacing[0].qualname}; enable one of them")


# What makes a refused late landing land: the advice of ``landing_refusal`` for a patch enabled
# after its target was imported (late activation) ...
TOGETHER = "enable them together (one enable() call, or IMPORTPATCH_ENABLE at interpreter start)"
# ... and for one applied in place because its own declaration imports its target
# (late.apply_own_import): both are on from interpreter start already, so "together" cannot be
# followed; landing at the definition site puts both in one chain.
IN_PLACE_FIX = ("land it at the definition site, where one import builds the whole chain: "
                "delete its declaration's module-level import of the target (import it inside "
                "the function that uses it) and give the target as a string (a saved original "
                "becomes a wrap: Patch.wrap hands it to you); or enable only one of them")


def landing_refusal(op: Op, earlier: list[Op], fix: str = TOGETHER) -> str:
    """Why ``op`` cannot land on a module on top of ``earlier``, the operations that landed on it
    before (in the order applied), or "": the one rule late activation and the in-place landing of
    a package that imports its own target apply (``late.apply_in_place``), and that ``importpatch
    check`` judges a whole set by. Invariant: a later operation lands only where the target's
    chain ends up as one activation of all of them would have made it. ``fix``: what to do
    instead, from where the user stands (``TOGETHER``, ``IN_PLACE_FIX``)."""
    if op.kind not in (*CHAIN_KINDS, SET):
        return ""
    before = [e for e in earlier if e.qualname == op.qualname and e.kind in (*CHAIN_KINDS, SET)
              and e.patch.name != op.patch.name]
    if not before:
        return ""
    replacing = [e for e in before if e.kind in (REPLACE, SET)]
    if op.kind in (REPLACE, SET) and replacing:
        return (conflict([op, replacing[0]]) + f" ({replacing[0].patch.name!r} was applied "
                "earlier in this process)")
    above = [e for e in before if e.kind in (SUBCLASS, WRAP)]
    if op.kind in (REPLACE, SET) and above:
        listed = " and ".join(repr(e.patch.name) for e in above)
        kinds = {e.kind for e in above}
        how = " and ".join(("wrapped" if k == WRAP else "subclassed") for k in sorted(kinds,
                                                                                   reverse=True))
        return (f"{op.qualname} is already {how} by {listed} (applied earlier in this "
                "process); a replace goes beneath the wraps and subclasses, and applying it now "
                f"would drop them: {fix}")
    outer = chain([*before, op])[-1]
    if outer is not op:
        return (f"the {op.kind} of {op.qualname} by {op.patch.name!r} goes inside the "
                f"{outer.kind} of {outer.patch.name!r} (by decorated, kind, order, then patch "
                "name), which was applied earlier in this process; applying it now would put it "
                f"outside: {fix}")
    return ""


def resolve(namespace: dict[str, Any], qual: str, plan: ModulePlan) -> tuple[Any, Any]:
    """(owner, raw value) of ``qual``; raw means as stored, e.g. a staticmethod object."""
    parts = qual.split(".")
    owner: Any = namespace
    for i, part in enumerate(parts):
        store = owner if isinstance(owner, dict) else getattr(owner, "__dict__", {})
        if part not in store:
            first = next(
                (o for o in plan.ops if o.qualname == qual or site_of(o)[0] == qual), None
            )
            raise PatchError(
                first.patch.name if first is not None else "?", plan.module,
                f"symbol {'.'.join(parts[: i + 1])!r} not found (target {plan.module}:{qual})",
                file=plan.file,
            )
        if i == len(parts) - 1:
            return owner, store[part]
        owner = beneath_subclasses(store[part])
    raise AssertionError(qual)


# A class made by ``subclass`` names the class it was made from here (in its own __dict__): a
# patch of a member (``Spec.size``) is of the original class's member, which the subclasses
# inherit or override, at import (after the module ran: ``finish``) and late alike.
ORIGINAL_CLASS = "__importpatch_subclassed__"


def beneath_subclasses(obj: Any) -> Any:
    """The class that ``subclass`` operations (none: ``obj`` itself) made ``obj`` from."""
    for _ in range(100):
        try:
            original = vars(obj).get(ORIGINAL_CLASS)
        except Exception:  # no __dict__, or not a mapping: nothing subclassed it
            return obj
        if original is None:
            return obj
        obj = original
    return obj


def watch_applied(namespace: dict[str, Any], by_qual: dict[str, list[dict[str, Any]]],
                  plan: ModulePlan) -> None:
    """Have ``events`` watch each patched attribute (``events.watch``): the events of one
    qualified name, and where that name lives now (a member of a class a patch subclassed lives
    on the class beneath)."""
    for qual, applied in by_qual.items():
        owner_qual, _, attr = qual.rpartition(".")
        try:
            owner = (beneath_subclasses(resolve(namespace, owner_qual, plan)[1]) if owner_qual
                     else namespace)
        except Exception:  # (resolved before: only a namespace changed meanwhile gets here)
            continue
        events.watch(applied, owner, attr)


def set_attr(owner: Any, name: str, value: Any) -> None:
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


def adopt(op: Op, module: str) -> None:
    from importpatch.install import objects

    assert op.qualname is not None
    objects.adopt_names(op.obj, module, op.qualname, objects.name_home(op.patch))


# -- The hooks the rewritten code calls -----------------------------------------------------------

_plans: dict[str, ModulePlan] = {}
_MISSING: Any = object()


def register(plan: ModulePlan) -> None:
    _plans[plan.module] = plan


def land(module: str, qual: str, stage: str) -> Callable[[Any], Any]:
    """Called by rewritten module code (see the module docstring)."""
    return _plans[module].land(qual, stage)


def value(module: str, qual: str) -> Any:
    """The default of a class-body field that is not a literal (``fields.value_text``)."""
    return _plans[module].values[qual]


def begin(module: str) -> None:
    """First statement of a patched module's code: names added to the module."""
    _plans[module].begin(sys._getframe(1).f_globals)


def done(module: str) -> None:
    """Last statement of a patched module's code (before a trailing ``__main__`` block)."""
    plan = _plans[module]
    namespace = sys._getframe(1).f_globals
    plan.finish(namespace)
    if plan.after_exec is not None:
        plan.after_exec(namespace)
    if plan.hooks:  # last: fn(module) sees every other patch of the module landed
        plan.run_hooks(_module_for(namespace, module))


def _module_for(namespace: dict[str, Any], name: str) -> Any:
    """The module whose namespace this is (importlib put it in sys.modules before running it;
    ``__main__`` under python -m)."""
    found = sys.modules.get(namespace.get("__name__", name))
    if found is not None and vars(found) is namespace:
        return found
    import types

    view = types.ModuleType(name)  # (code run outside an import: its namespace, as a module)
    vars(view).update(namespace)
    return view


def hook_function(op: Op) -> Callable[[Any], Any]:
    """The function of an after_import op: a ``"helper.module:function"`` string is imported
    now, when its target is (wrapt's ``register_post_import_hook`` form)."""
    fn = op.obj
    if not isinstance(fn, str):
        return fn  # type: ignore[no-any-return]
    import importlib

    name, _, qual = fn.partition(":")
    obj: Any = importlib.import_module(name)
    for part in qual.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{fn} is a {type(obj).__name__}, not a function")
    return obj  # type: ignore[no-any-return]


def hook_name(op: Op) -> str:
    """``helper.module:function`` of an after_import op, for messages, ``list`` and events."""
    fn = op.obj
    if isinstance(fn, str):
        return fn
    if isinstance(fn, RunOnce):
        return fn.function
    code = getattr(fn, "__code__", None)
    if code is not None:  # a patch file's module name says nothing: its file and line do
        return f"{_name_of(fn)} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
    mod = getattr(fn, "__module__", None)
    return f"{mod}:{_name_of(fn)}" if mod else _name_of(fn)


def hook_failure(op: Op, module: str, exc: BaseException, loading: bool) -> str:
    """What a failing after_import hook says (the import's PatchError, the event)."""
    what = "could not be loaded:" if loading else "raised"
    return (f"after_import {hook_name(op)} on {module} {what} {type(exc).__name__}: {exc}; "
            f"fix the function, or disable the patch (IMPORTPATCH_DISABLE={op.patch.name})")


def record_skip(patch: str, module: str, why: str) -> None:
    """An ``on_error="warn"`` patch left out of ``module`` entirely."""
    import logging

    events.record("failed", patch, module, "skipped (on_error=warn)", why, level=logging.WARNING)


# -- Messages ------------------------------------------------------------------------------------


def _name_of(obj: Any) -> str:
    return str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or obj)


def not_a_class(qual: str, op: Op) -> str:
    """Why a replace of class ``qual`` by something that is not a class is refused (check and
    import say the same)."""
    what = ("original=True (a function calling the replacement stands in for the class)"
            if op.original else f"a {type(op.obj).__name__}, not a class")
    return (f"replace {qual} with {what}: {qual} is a class, and a non-class in its place breaks "
            f"`class Sub({qual.rpartition('.')[2]})`, isinstance and class decorators; to build "
            f"on the original class use patch.subclass({op.target!r}), whose factory is called "
            "with the original and returns a subclass of it")


def close_symbol(file: str | None, qual: str) -> str:
    """The qualname closest to ``qual`` that the source file binds (``bindings.close_symbol``),
    or "". Only on the way to an error: reads and parses the file then."""
    import ast

    from importpatch.rewrite import bindings
    from importpatch.safefiles import decode_source, read_regular

    if not file or not file.endswith(".py"):
        return ""
    try:  # read_regular: the project's FIFO-proof read, as everywhere else
        return bindings.close_symbol(ast.parse(decode_source(read_regular(file))), qual)
    except (OSError, SyntaxError, ValueError):
        return ""


def inherited_hint(module: str, file: str | None, qual: str) -> str:
    """``bindings.inherited_advice`` for a member ``Class.attr`` that the class statement of
    ``module`` does not bind but a base class does, or "". Reads source files found on
    ``sys.path`` (importlib's PathFinder: nothing is imported). Only on the way to an error."""
    import ast
    import importlib.machinery

    from importpatch.rewrite import bindings
    from importpatch.safefiles import decode_source

    def load(name: str) -> tuple[ast.Module, bool] | None:
        path: list[str] | None = None
        package = False
        origin = None
        parts = name.split(".")
        try:
            for i in range(len(parts)):
                spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), path)
                if spec is None:
                    return None
                package = spec.submodule_search_locations is not None
                path = list(spec.submodule_search_locations or [])
                origin = spec.origin
            if not isinstance(origin, str) or not origin.endswith(".py"):
                return None
            with open(origin, "rb") as f:
                return ast.parse(decode_source(f.read())), package
        except (OSError, SyntaxError, ValueError, ImportError):
            return None

    if not file or not file.endswith(".py"):
        return ""
    try:
        with open(file, "rb") as f:
            tree = ast.parse(decode_source(f.read()))
    except (OSError, SyntaxError, ValueError):
        return ""
    package = module if file.endswith("__init__.py") else module.rpartition(".")[0]
    try:
        where = bindings.inherited_from(tree, module, package, qual, load)
    except Exception:  # a hint only: never in the way of the error it adds to
        return ""
    return bindings.inherited_advice(module, qual, where) if where else ""
