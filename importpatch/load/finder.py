"""The import hook: a ``sys.meta_path`` finder for targeted modules and the loader patching them.

Invariants:
- ``find_spec`` costs one set and one dict lookup for every module that no enabled patch
  targets, and never imports anything. For a targeted module it asks the *other* finders on
  ``sys.meta_path`` for the real spec (never ``importlib.util.find_spec``, which would re-enter
  this finder and take import locks) and swaps in ``PatchLoader``.
- At the first import of a targeted top-level package (``import vllm``), before any of its code
  runs, every enabled patch's target modules are looked up (found, not imported) under the
  package's folders: a module none of whose candidates exists there (a typo in the target,
  a module that moved) is a warning once per process and a ``missing`` event, and under strict
  mode a ``StrictError`` at that import and every later one (``importpatch/load/lookup.py``).
- The loader reads, patches, compiles and executes the source itself: it never reads or writes
  the target package's ``__pycache__`` (a stale .pyc would silently skip the patch; a patched one
  written there would poison later unpatched runs). Its own bytecode cache lives elsewhere.
- Any failure of an enabled patch raises ``PatchError`` out of ``exec_module``; importlib then
  removes the module from ``sys.modules``, so no half-patched module remains.
- ``exec_module`` runs what ``get_code`` returns, and that code calls ``activation.begin``/``done``
  itself: a hook that wraps our ``get_code`` sees the patched code, ``python -m`` (runpy executes
  ``get_code()``) gets the same checks and events, and code that ran without them fails closed.
- Other hooks on ``sys.meta_path`` compose, whenever they were installed: the finder stays ahead
  of every other finder (``MetaPath``: a finder inserted before it later goes behind it), asks
  them in their order and wraps the loader the first one returns. When one looks the module up
  again through ``importlib.util.find_spec`` while we ask it (wrapt, ddtrace), our loader is made
  once, innermost, under theirs; when a loader of another hook sits under ours, its
  ``exec_module`` runs (its callbacks fire) with the file loader handing out our code; a loader
  that transforms the source (typeguard, beartype.claw, pytest's assertion rewriting) compiles
  the patched module itself (importpatch/load/hooks.py); one that cannot be composed with is
  named in a warning (under strict mode the import fails).
- importpatch's own code failing to load after the start (a module of it removed by a reinstall
  in progress, a damaged install) fails the targeted import with one ``PatchError`` saying so
  (``closed_error``), raised by the finder's and the loader's entry points: never a raw
  ``ImportError`` from inside importpatch, never a targeted module run unpatched.
- importlib's per-module lock serialises concurrent imports of one module, so a module is
  patched exactly once however many threads import it.
"""

from __future__ import annotations

import os
import sys

from importpatch import _slot  # (a waiting process registered it: no import at its start)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import CodeType, ModuleType
    from typing import Any

    from importpatch.discover.catalog import Entry
    from importpatch.discover.declare import Op, Patch
    from importpatch.install.activation import ModulePlan


class PatchFinder(_slot.Slot):
    """Finds the modules targeted by enabled patches; see the module docstring."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.by_module: dict[str, list[Entry]] = {}
        for entry in entries:
            for group in entry.modules:
                for name in group:
                    handles = self.by_module.setdefault(name, [])
                    if entry not in handles:
                        handles.append(entry)
        # Top-level packages whose target modules are not looked up yet (see the docstring).
        self.unchecked = {m.partition(".")[0] for m in self.by_module}

    def __repr__(self) -> str:
        return f"<importpatch.PatchFinder {sorted(e.name for e in self.entries)}>"

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname in self.unchecked:
            try:
                self._check_top(fullname, path, target, None)
            except Exception as exc:
                entry = next(e for e in self.entries if any(
                    m.partition(".")[0] == fullname for g in e.modules for m in g))
                closed = closed_error(exc, entry.name, fullname, None)
                if closed is None:
                    raise
                raise closed from None
        entries = self.by_module.get(fullname)
        if entries is None:
            return None
        import _thread

        # Another hook on sys.meta_path (wrapt's, ddtrace's) may look the module up again through
        # importlib.util.find_spec while we ask it: answer that once (our loader is then the
        # innermost, under theirs), and no deeper.
        key = (_thread.get_ident(), fullname)
        depth = _finding.get(key, 0)
        if depth >= 2:
            return None
        _finding[key] = depth + 1
        try:
            spec, via = self._others(fullname, path, target)
        finally:
            if depth:
                _finding[key] = depth
            else:
                del _finding[key]
        if spec is None:  # a module an enabled patch adds? (importpatch/load/newmodule.py)
            from importpatch.load.newmodule import spec_for

            spec = spec_for(fullname, path, entries)
        if spec is None or spec.loader is None or holds_patch_loader(spec.loader):
            return spec
        # duck-typed: subclassing importlib.abc.Loader would import importlib.abc at start
        spec.loader = PatchLoader(spec.loader, fullname, spec.origin, entries, via)  # type: ignore[assignment]
        spec.cached = None  # never the package's own __pycache__
        return spec

    def _others(self, fullname: str, path: Any, target: ModuleType | None
                ) -> tuple[ModuleSpec | None, Any]:
        """The first spec another finder returns, and that finder."""
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, _slot.Slot):
                continue  # (importpatch's own: this finder, or one that waits or fails closed)
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec, finder
        return None, None

    def _check_top(self, top: str, path: Any, target: Any, module: ModuleType | None = None,
                   strict: bool | None = None) -> None:
        """The look-up of the target modules under package ``top`` (importpatch/load/lookup.py,
        loaded only here: a process that imports no targeted package never loads it)."""
        self.unchecked.discard(top)
        from importpatch.load.lookup import check_top

        # here <- find_spec <- importlib._bootstrap._find_spec <- its caller
        check_top(self, top, path, target, module, strict, sys._getframe(3))

    def check_imported_tops(self, strict: bool) -> None:
        """At a late activation: the look-up for target packages already imported."""
        for top in sorted(self.unchecked):
            module = sys.modules.get(top)
            if module is not None:
                self._check_top(top, None, None, module, strict)

    # importlib.invalidate_caches() calls this on every meta path finder.
    def invalidate_caches(self) -> None:
        pass


_finding: dict[tuple[int, str], int] = {}  # (thread, module) -> nesting of find_spec calls


def holds_patch_loader(loader: Any) -> bool:
    """Whether ``loader`` is, or wraps (``.loader``, ``__wrapped__``), a PatchLoader."""
    for _ in range(8):
        if loader is None:
            return False
        if isinstance(loader, PatchLoader):  # wrapt's proxies answer isinstance for the wrapped
            return True
        loader = getattr(loader, "__wrapped__", None) or getattr(loader, "loader", None)
    return False


class Build:
    """What the loader made of the module: code, plan (operations and what the source proves),
    the patched source text, and the code-changing operations (diffs, transforms)."""

    __slots__ = ("code", "plan", "source", "code_ops")

    def __init__(self, code: CodeType, plan: ModulePlan, source: str, code_ops: list[Op]) -> None:
        self.code, self.plan, self.source, self.code_ops = code, plan, source, code_ops


def _closed(method: Any) -> Any:
    """A loader entry point: importpatch's own code failing to load ends in ``closed_error``."""

    def entry(self: PatchLoader, *args: Any) -> Any:
        try:
            return method(self, *args)
        except Exception as exc:
            closed = closed_error(exc, self.entries[0].name, self.fullname, self.origin)
            if closed is None:
                raise
            raise closed from None

    entry.__name__ = entry.__qualname__ = method.__name__
    entry.__doc__ = method.__doc__
    return entry


class PatchLoader:
    """Loads one targeted module: original source -> diffs/transforms -> landings -> code."""

    def __init__(
        self, loader: Any, fullname: str, origin: str | None, entries: list[Entry],
        via: Any = None,
    ) -> None:
        self.loader = loader
        self.fullname = fullname
        self.origin = origin
        self.entries = entries
        self.via = via  # the finder that returned the spec
        self._built: Build | None = None
        self._kind: str | None = None
        self._ops_made: list[Op] | None = None  # the applicable operations, once loaded

    def __getattr__(self, name: str) -> Any:
        # is_package, get_filename, get_data, get_resource_reader, path, name ... as the original.
        return getattr(self.loader, name)

    @_closed
    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        if self._redirect() is not None:
            return None  # a plain module, discarded (redirect.py): nothing of the original runs
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def _redirect(self) -> Op | None:
        """The redirect of this module among its applicable operations, or None. Only a
        module whose index entries state a redirect loads its patches here."""
        if not any("redirect" in (e.kinds or ()) for e in self.entries):
            return None
        from importpatch.install.redirect import redirect_of

        return redirect_of(self._ops())

    @property
    def kind(self) -> str:
        """How the module's own loader compiles it (``loader_kind``)."""
        if self._kind is None:
            self._kind = loader_kind(_innermost(self.loader))
        return self._kind

    @_closed
    def exec_module(self, module: ModuleType) -> None:
        from importpatch.discover.catalog import in_place_only
        from importpatch.errors import PatchError

        if self._diff_cannot_apply():
            self.loader.exec_module(module)  # unpatched, said (see _diff_cannot_apply)
            return
        if self._redirect() is not None:
            from importpatch.install.redirect import load_redirected

            if load_redirected(self.fullname, module, self._ops(), self.origin) is not None:
                return  # sys.modules[fullname] is the target now: importlib returns that
            self._ops_made = [op for op in self._ops() if op.kind != "redirect"]  # warn: skipped
        build = self._build()
        inner = _innermost(self.loader)
        if (inner is self.loader and _standard_exec(inner)) or self.kind in ("pytest", "opaque"):
            # Through get_code: a hook that wraps this loader's get_code sees the patched code.
            # (pytest's hook and other loaders with an exec_module of their own would run code
            # of their own making: see importpatch/load/hooks.py.)
            exec(self.get_code(self.fullname), module.__dict__)
        else:
            # Another hook's loader sits between us and the file loader: run its exec_module (its
            # callbacks, e.g. wrapt's post-import hooks) with the file loader handing out our code.
            try:
                inner.get_code = lambda fullname: self.get_code(fullname)
            except (AttributeError, TypeError):  # a loader without instance attributes
                exec(self.get_code(self.fullname), module.__dict__)
            else:
                try:
                    self.loader.exec_module(module)
                finally:
                    del inner.get_code
        if not build.plan.finished:
            # The code that ran was not ours (a hook replaced it): fail closed, never unpatched.
            raise build.plan.fail(PatchError(
                self.entries[0].name, self.fullname,
                "the module's code ran without importpatch's landings (another import hook "
                "replaced the code it executed)", file=self.origin,
            ))
        from importpatch.discover.selection import mark_handled

        own = [e for e in self.entries if in_place_only(e)]
        mark_handled(module, (e.name for e in self.entries if e not in own))
        if own:
            # Patches whose declaration imports this module: in place, now that it ran, before
            # the import returns (importpatch/install/late.py).
            from importpatch.install.late import apply_own_import

            apply_own_import(module, self.fullname, own)

    @_closed
    def get_code(self, fullname: str) -> CodeType:
        # runpy (python -m) executes get_code()'s result in __main__ itself: the code calls
        # activation.begin/done, so it gets the same checks, failures and events as an import.
        op = self._redirect()
        if op is not None:  # (exec_module never asks: only runpy and other hooks do)
            from importpatch.errors import PatchError

            raise PatchError(op.patch.name, self.fullname,
                             f"{self.fullname} is redirected to {op.obj}: it has no code of its "
                             f"own to run (python -m {op.obj} runs the module it is)",
                             file=self.origin)
        return self._build().code

    @_closed
    def get_source(self, fullname: str) -> str:
        return self._build().source

    # -- building ------------------------------------------------------------------------------

    def _build(self) -> Build:
        from importpatch.errors import PatchError

        if self._built is None:
            try:
                self._built = self._build_uncached()
            except PatchError as exc:
                if not exc.recorded:
                    self._record_failure(exc)
                raise
        return self._built

    def _record_failure(self, exc: Any) -> None:
        exc.recorded = True
        try:
            from importpatch import events
        except Exception:  # the error itself says it; importpatch's own code is damaged
            return
        events.record("failed", exc.patch, self.fullname, "import", exc.what)

    def _ops(self) -> list[Op]:
        from importpatch.discover.catalog import in_place_only
        from importpatch.discover.selection import applicable_ops, load_patches
        from importpatch.errors import PatchError

        if self._ops_made is not None:  # once: loading them records the skips
            return self._ops_made
        # (Those that land in place after the module ran are not built in: see exec_module.)
        entries = [e for e in self.entries if not in_place_only(e)]
        patches, broken = load_patches(entries, self.fullname)
        for d in broken:
            raise PatchError(
                d.entry.name, self.fullname,
                f"the patch declaration failed to load from {d.entry.source}: {d.error}",
                file=self.origin,
            )
        self._ops_made = applicable_ops(patches, self.fullname)
        return self._ops_made

    def _build_uncached(self) -> Build:
        from importpatch.errors import PatchError
        from importpatch.install.activation import record_skip

        origin = self.origin
        if origin is None or not hasattr(self.loader, "get_data") or not origin.endswith(".py"):
            raise PatchError(
                self.entries[0].name, self.fullname,
                f"{self.fullname} is {not_source(self.loader, origin)}: only modules loaded "
                f"from .py source can be patched (origin: {origin})", file=origin,
            )
        ops = self._ops()
        while True:
            try:
                return self._build_with(origin, ops)
            except PatchError as exc:
                # Nothing has run yet: drop an on_error="warn" patch and build without it.
                mine = [op for op in ops if op.patch.name == exc.patch]
                if exc.recorded or not mine or any(op.patch.on_error != "warn" for op in mine):
                    raise
                record_skip(exc.patch, self.fullname, exc.what)
                ops = [op for op in ops if op.patch.name != exc.patch]

    def _diff_cannot_apply(self) -> bool:
        """Whether this module is not Python source (a C extension, built in, frozen) and every
        patch targeting it is source diffs only: a diff whose header names ``math.py`` where
        ``math`` is a ``.so`` has no file to apply to, the missing-target rule's case
        (importpatch/load/lookup.py), so the same rule: the module imports unpatched with a
        warning (once per process) and a ``missing`` event naming the patch, the file, the module
        and why; under strict mode its import fails. Failing it closed would stop every program
        of the environment that imports it (``math``: pip itself, the tool to fix it).

        Decided from what the index states (``Entry.kinds``): nothing is imported here, this
        runs inside the import of a module the standard library's own imports need."""
        origin = self.origin
        if origin is not None and hasattr(self.loader, "get_data") and origin.endswith(".py"):
            return False  # (the usual case: nothing imported, nothing more looked at)
        from importpatch.discover.declare import DIFF

        if any(e.error or not e.kinds or set(e.kinds) - {DIFF} for e in self.entries):
            return False  # other kinds, or broken: the refusal (_build_uncached), fail closed
        what = not_source(self.loader, origin)
        if what == "not Python source":
            return False  # a sourceless .pyc, an unknown loader: the refusal
        from importpatch import config, events
        from importpatch.errors import PatchError

        strict = config.flag(os.environ, config.STRICT)
        for entry in dict.fromkeys(self.entries):
            detail = (f"the diff {entry.source} targets {self.fullname}, which is {what} "
                      f"(origin: {origin}), not Python source: a source diff cannot apply to it; "
                      "fix the diff's file header (--- a/... +++ b/...) to name the .py file it "
                      f"is for, or disable the patch (IMPORTPATCH_DISABLE={entry.name})")
            if strict:
                err = PatchError(entry.name, self.fullname, f"{detail}; {config.STRICT} is on",
                                 file=origin)
                self._record_failure(err)
                raise err
            events.record("missing", entry.name, self.fullname, "target-module", detail,
                          level=20)
            events.warn_once(f"missing:{entry.name}:{self.fullname}",
                             f"patch {entry.name}: {detail}; {self.fullname} is imported "
                             f"unpatched (set {config.STRICT}=1 to fail its import instead)")
        return True

    def _build_with(self, origin: str, ops: list[Op]) -> Build:
        from importpatch import safefiles
        from importpatch.discover.declare import AFTER_IMPORT, CODE_KINDS, FIELD
        from importpatch.errors import PatchError
        from importpatch.install import activation
        from importpatch.load import bytecache, publish
        from importpatch.rewrite.facts import Fact

        raw = self.loader.get_data(origin)
        text = safefiles.decode_source(raw)
        code_ops = [op for op in ops if op.kind in CODE_KINDS]
        # after_import ops land nowhere in the code: the plan runs them at done() (activation)
        object_ops = [op for op in ops if op.kind not in (*CODE_KINDS, AFTER_IMPORT)]
        qualnames = sorted({activation.site_of(op)[0] for op in object_ops} - {""})
        fact_quals = activation.fact_quals(object_ops)
        plan = activation.ModulePlan(self.fullname, [op for op in ops if op.kind not in CODE_KINDS],
                                     origin)
        plan.values = {op.qualname or "": op.obj for op in code_ops if op.kind == FIELD}
        kind = self.kind
        if kind == "opaque":  # before anything runs: strict mode fails the import here
            self._cannot_compose("it runs the module its own way (an exec_module without "
                                 "get_code), so it cannot be handed the patched code")
        cache_root = safefiles.usable_root(report=True)
        # Code another hook compiled depends on that hook's configuration: never cached.
        use_cache = cache_root is not None and bytecache.enabled() and kind in ("plain", "opaque")
        whole = whole_diffs(code_ops, self.fullname)
        siblings = b"".join(w.material for w in whole)
        key = bytecache.key(self.fullname, raw, ops, qualnames, cache_root, origin, fact_quals,
                            siblings)
        cached = bytecache.load(cache_root, key, text, self.fullname) if use_cache else None
        facts = Fact.unpack(cached[1]) if cached is not None else None
        if cached is not None and facts is not None:
            code, _, patched = cached
            filename = publish.publish(origin, patched, cache_root) if patched != text else origin
            if code.co_filename != filename:
                # The entry's code names a published file this process cannot vouch for (its
                # folder is not safe now, or it cannot be written): what is read there need not
                # be the patched text. Compile under the name publish gave.
                facts = None
        if facts is None:
            from importpatch.rewrite import (
                transforms,  # not on the cache-hit path: it imports difflib, dataclasses
            )

            for w in whole:  # no entry matched: is every other file of its diffs there to patch?
                w.require(self.fullname, origin)
            patched = text
            if code_ops:
                patched = transforms.patch_text(self.fullname, origin, text, code_ops)
            filename = origin
            if patched != text:
                filename = publish.publish(origin, patched, cache_root)
            try:
                if kind in ("plain", "opaque"):
                    code, facts = transforms.compile_module(
                        self.fullname, patched, qualnames, fact_quals, filename, original=text
                    )
                else:
                    code, facts = self._compose(patched, qualnames, fact_quals, filename, text)
            except SyntaxError as exc:
                raise PatchError(
                    code_ops[0].patch.name if code_ops else ops[0].patch.name, self.fullname,
                    f"patched source does not compile: {exc.msg} (line {exc.lineno})", file=origin,
                ) from None
            if use_cache:
                bytecache.store(cache_root, key, code, Fact.pack(facts), patched, text)
        plan.unseen = {q for q, fact in facts.items() if not fact.seen}
        plan.prepare(facts)  # may fail the import before anything ran
        build = Build(code, plan, patched, code_ops)
        plan.after_exec = lambda namespace: self._after_exec(build, namespace)
        activation.register(plan)
        return build

    def _compose(self, patched: str, qualnames: list[str], fact_quals: set[str], filename: str,
                 original: str) -> tuple[CodeType, dict[str, Any]]:
        """The patched module's code made by the other hook's loader (importpatch/load/hooks.py);
        where it cannot be, ours (``_cannot_compose``: a warning, or the failure under strict)."""
        from importpatch import events
        from importpatch.install import activation
        from importpatch.load import hooks
        from importpatch.rewrite import transforms

        assert self.origin is not None
        tree, facts = transforms.module_tree(self.fullname, patched, qualnames, fact_quals,
                                             filename, original)
        inner = _innermost(self.loader)
        try:
            code = hooks.compile_through(self.kind, inner, self.fullname, tree, patched,
                                         self.origin, filename, activation.__name__)
        except hooks.CannotCompose as exc:
            self._cannot_compose(str(exc))
            return transforms.compile_module(self.fullname, patched, qualnames, fact_quals,
                                             filename, original)
        what = (f"compiled through {hooks.describe(inner, self.via)}: that import hook's "
                "processing of the module is kept")
        for name in dict.fromkeys(e.name for e in self.entries):
            events.record("info", name, self.fullname, "other-hook", what)
        return code, facts

    def _cannot_compose(self, why: str) -> None:
        """Another import hook's loader cannot be composed with: a warning (once per process and
        hook) and an event, or under strict mode the import fails, before the module runs."""
        from importpatch import config, events
        from importpatch.errors import PatchError
        from importpatch.load import hooks

        inner = _innermost(self.loader)
        hook = hooks.describe(inner, self.via)
        what = (f"the import hook {hook} loads this module, and importpatch cannot compose with "
                f"it ({why})")
        if config.flag(os.environ, config.STRICT):
            err = PatchError(self.entries[0].name, self.fullname,
                             f"{what}; {config.STRICT} is on", file=self.origin)
            self._record_failure(err)  # (recorded: never taken for one on_error="warn" patch)
            raise err
        detail = f"{what}: patched without that hook's own processing of it"
        for name in dict.fromkeys(e.name for e in self.entries):
            events.record("info", name, self.fullname, "other-hook", detail, level=30)
        events.warn_once(f"other-hook:{type(inner).__module__}.{type(inner).__qualname__}",
                         f"{self.fullname}: {detail} (set {config.STRICT}=1 to fail such an "
                         "import instead)")

    def _after_exec(self, build: Build, namespace: dict[str, Any]) -> None:
        from importpatch import events

        if build.code_ops and "triton" in sys.modules:
            # Triton compiles a kernel's source text, not its code object: fail closed (before
            # anything is reported applied) when a kernel does not carry the patched text.
            from importpatch.errors import PatchError
            from importpatch.load.kernels import check_kernels

            names = list(dict.fromkeys(op.patch.name for op in build.code_ops))
            try:
                check_kernels(_module_of(namespace, self.fullname), build.source, names,
                              build.code.co_filename)
            except PatchError as exc:
                self._record_failure(exc)
                raise
        seen: set[tuple[str, str]] = set()
        for op in build.code_ops:
            if op.kind == "field":  # one event per field, naming it
                events.record("applied", op.patch.name, f"{self.fullname}:{op.qualname}",
                              "class-body", "field")
                continue
            if (op.patch.name, op.kind) in seen:
                continue
            seen.add((op.patch.name, op.kind))
            how = "source-diff" if op.kind == "diff" else "transform"
            if op.file_patch is not None and op.file_patch.created:
                how = "new-module"
            events.record("applied", op.patch.name, self.fullname, how)


# -- A diff lands whole or not at all -----------------------------------------------------------


class WholeDiff:
    """The other files of a patch's diff, as the import of one of its files sees them: the
    module each is for (the first of its candidates that exists), its source file and bytes.

    A patch's diff is all or nothing per process, as ``git apply`` takes a diff: before the first
    of its files is patched, the others are read from disk and the diff is applied to each (in
    memory); if one does not apply, no file of the patch is patched (``on_error="warn"``: each
    module imports unpatched with a warning naming that file and hunk; ``"fail"``: the import of
    any of its files raises naming them). The verdict is kept per process, keyed by the bytes
    read; ``material`` (those bytes and the other files' hunks) is part of the bytecode cache
    key, so a cache hit means the same files were found to apply when the entry was stored.
    """

    __slots__ = ("patch", "others", "material")

    def __init__(self, patch: Patch, others: list[tuple[Op, str | None, str | None, bytes]]
                 ) -> None:
        from importpatch.load.bytecache import key_hash, key_part

        self.patch = patch
        self.others = others  # (op, module, file, raw): module None when none of its exists
        parts = []  # never the patch's name (see bytecache.op_fingerprint)
        for op, module, file, raw in others:
            assert op.file_patch is not None
            where = f"{module}\0{file}" if module else "\0".join(op.modules) + "\0<missing>"
            parts += [key_part(repr(op.file_patch.hunks).encode()),
                      key_part(where.encode("utf-8", "surrogateescape")), key_part(raw)]
        self.material = key_hash(b"".join(parts))  # 16 bytes: kept per process as the verdict's key

    def require(self, fullname: str, origin: str) -> None:
        """Raise PatchError when another file of the diff does not apply (verdict cached)."""
        from importpatch.errors import PatchError

        why = _whole_verdicts.get(self.material)
        if why is None:
            why = _whole_verdicts[self.material] = self._verdict()
        if why:
            raise PatchError(self.patch.name, fullname, why, file=origin)

    def _verdict(self) -> str:
        from importpatch.errors import installed_version
        from importpatch.rewrite import diffs
        from importpatch.safefiles import decode_source

        for op, module, file, raw in self.others:
            assert op.file_patch is not None
            path = op.file_patch.path
            if (module is None or file is None) and op.file_patch.created:
                continue  # a module the patch adds: its import makes it
            if module is None or file is None:
                problem = (f"{path}: no module {' / '.join(op.modules)} with a .py source to "
                           "patch in this installation")
            else:
                try:
                    diffs.apply(decode_source(raw), op.file_patch)
                    continue
                except diffs.HunkMismatch as exc:
                    problem = exc.message(installed_version(module))
                except (diffs.DiffError, UnicodeDecodeError, SyntaxError, LookupError) as exc:
                    problem = f"{path}: {exc}"
            return (f"its diff is applied whole or not at all, and another of its files does "
                    f"not apply: {problem.rstrip('.')}; so no file of it is patched")
        return ""


_whole_verdicts: dict[bytes, str] = {}  # WholeDiff.material -> why it does not apply ("": it does)


def whole_diffs(code_ops: list[Op], fullname: str) -> list[WholeDiff]:
    """For each patch among ``code_ops`` whose diff has other files than ``fullname``'s: those
    files, read (one small read each; nothing is imported)."""
    from importpatch.discover.declare import DIFF

    out = []
    for patch in dict.fromkeys(op.patch for op in code_ops if op.kind == DIFF):
        others = []
        for op in patch.ops:
            if op.kind != DIFF or fullname in op.modules:
                continue
            module = file = None
            raw = b""
            for candidate in op.modules:
                file = source_file(candidate)
                if file is not None:
                    module = candidate
                    break
            if file is not None:
                try:
                    with open(file, "rb") as f:
                        raw = f.read()
                except OSError:
                    module = file = None
            others.append((op, module, file, raw))
        if others:
            out.append(WholeDiff(patch, others))
    return out


def source_file(name: str) -> str | None:
    """The ``.py`` file module ``name`` is (or would be) loaded from, found without importing
    anything: its spec when imported, else under the nearest imported package (or the top-level
    package sys.path finds), as a file or a package folder."""
    module = sys.modules.get(name)
    if module is not None:
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        return origin if isinstance(origin, str) and origin.endswith(".py") else None
    parts = name.split(".")
    bases: list[str] = []
    rest: list[str] = []
    for i in range(len(parts) - 1, 0, -1):
        parent = sys.modules.get(".".join(parts[:i]))
        if parent is not None:
            bases, rest = list(getattr(parent, "__path__", ()) or ()), parts[i:]
            break
    else:
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(parts[0])
        if spec is None:
            return None
        if len(parts) == 1:
            origin = spec.origin
            return origin if isinstance(origin, str) and origin.endswith(".py") else None
        bases, rest = list(spec.submodule_search_locations or ()), parts[1:]
    from importpatch.discover.selection import file_under

    return file_under(bases, rest)


def not_source(loader: Any, origin: str | None) -> str:
    """What a module that is not loaded from ``.py`` source is, for a message: "a C extension",
    "a built-in module", "a frozen module", or "not Python source" (a sourceless .pyc, another
    loader). No import."""
    inner = _innermost(loader)
    external = sys.modules["_frozen_importlib_external"]
    bootstrap = sys.modules["_frozen_importlib"]
    if isinstance(inner, external.ExtensionFileLoader) or (
            origin and origin.endswith(tuple(external.EXTENSION_SUFFIXES))):
        return "a C extension"
    if inner is bootstrap.BuiltinImporter or isinstance(inner, bootstrap.BuiltinImporter) or (
            origin == "built-in"):
        return "a built-in module"
    if inner is bootstrap.FrozenImporter or isinstance(inner, bootstrap.FrozenImporter) or (
            origin == "frozen"):
        return "a frozen module"
    return "not Python source"


def loader_kind(loader: Any) -> str:
    """How a targeted module's own loader compiles it (importpatch/load/hooks.py says what is
    done with each): "plain" (importlib's source loader), "pytest" (pytest's assertion
    rewriting), "source" (a source loader with a get_code or source_to_code of its own: an AST
    transform) or "opaque" (anything else). No import: the plain case loads nothing more."""
    cls = type(loader)
    base = sys.modules["_frozen_importlib_external"].SourceLoader
    get_code = getattr(cls, "get_code", None)
    if get_code is base.get_code and getattr(cls, "source_to_code", None) is base.source_to_code:
        return "plain"
    if cls.__name__ == "AssertionRewritingHook" and cls.__module__ == "_pytest.assertion.rewrite":
        return "pytest"
    if get_code is not None and callable(getattr(loader, "get_data", None)):
        return "source"
    return "opaque"


def _standard_exec(loader: Any) -> bool:
    """Whether ``loader``'s exec_module is importlib's (runs ``get_code``'s code, nothing else)."""
    base = sys.modules["_frozen_importlib_external"]._LoaderBasics
    return getattr(type(loader), "exec_module", None) is base.exec_module


def _innermost(loader: Any) -> Any:
    """The loader at the bottom of a chain of wrapping loaders (``.loader``, ``__wrapped__``)."""
    for _ in range(8):
        inner = getattr(loader, "__wrapped__", None) or getattr(loader, "loader", None)
        if inner is None or not hasattr(inner, "get_code"):
            return loader
        loader = inner
    return loader


def _module_of(namespace: dict[str, Any], name: str) -> ModuleType:
    """The module whose namespace this is (``__main__`` under python -m)."""
    module = sys.modules.get(namespace.get("__name__", name))
    if module is not None and vars(module) is namespace:
        return module
    import types

    view = types.ModuleType(name)
    vars(view).update(namespace)
    return view


# -- importpatch's own code failing to load after the start ------------------------------------


def closed_error(exc: BaseException, patch: str, module: str, file: str | None
                 ) -> BaseException | None:
    """At an entry point of the finder or the loader: the one error (``errors.fails_closed``)
    when ``exc`` is importpatch's own code failing to load (``errors.own_failure``), else None.
    Where ``importpatch.errors`` itself cannot load, a plain ImportError with its message."""
    try:
        from importpatch.errors import fails_closed, own_failure
    except Exception as missing:
        where = f" ({file})" if file else ""
        return ImportError(
            f"importpatch: patch {patch!r} cannot apply to {module}{where}: importpatch cannot "
            f"load its own code ({type(missing).__name__}: {missing}): a reinstall in progress "
            "or a damaged install; it fails closed rather than run the module unpatched. "
            "Reinstall importpatch-hook (or let the install in progress finish), or set "
            "IMPORTPATCH_OFF=1 to run without patches", name=module, path=file)
    return fails_closed(exc, patch, module, file) if own_failure(exc) else None


# -- The finder on sys.meta_path ------------------------------------------------------------------


# The slot on sys.meta_path and the list that keeps it first: one implementation for every way
# the hook starts (the waiting finder, _AfterSite, this finder), in importpatch/_slot.py.
MetaPath = _slot.MetaPath


def installed() -> PatchFinder | None:
    for finder in sys.meta_path:
        if isinstance(finder, PatchFinder):
            return finder
    return None


def install(entries: list[Entry]) -> PatchFinder:
    """Put a finder for ``entries`` first on sys.meta_path, replacing ours if present (idempotent:
    the .pth runs twice in venvs on some Pythons); sys.meta_path becomes a ``MetaPath``."""
    finder = PatchFinder(entries)
    _slot.take_slot(finder)  # in place of the finder there: no moment without one
    return finder


def uninstall() -> None:
    """Nothing is on: no finder of importpatch's holds the slot (nor waits, nor fails closed)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _slot.Slot)]

