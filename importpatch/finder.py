"""The import hook: a ``sys.meta_path`` finder for targeted modules and the loader patching them.

Invariants:
- ``find_spec`` costs one dict lookup for every module that no enabled patch targets, and never
  imports anything. For a targeted module it asks the *other* finders on ``sys.meta_path`` for
  the real spec (never ``importlib.util.find_spec``, which would re-enter this finder and take
  import locks) and swaps in ``PatchLoader``.
- The loader reads, patches, compiles and executes the source itself: it never reads or writes
  the target package's ``__pycache__`` (a stale .pyc would silently skip the patch; a patched one
  written there would poison later unpatched runs). Its own bytecode cache lives elsewhere.
- Any failure of an enabled patch raises ``PatchError`` out of ``exec_module``; importlib then
  removes the module from ``sys.modules``, so no half-patched module remains.
- importlib's per-module lock serialises concurrent imports of one module, so a module is
  patched exactly once however many threads import it.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from importlib.machinery import ModuleSpec
    from types import CodeType, ModuleType
    from typing import Any

    from .catalog import Entry
    from .declare import Op, Patch
    from .landing import ModulePlan


def module_exists(name: str) -> bool:
    """Whether module ``name`` exists, without importing it: imported, or a file or package
    folder under an already-imported ancestor package."""
    if name in sys.modules:
        return True
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        parent = sys.modules.get(".".join(parts[:i]))
        if parent is None:
            continue
        rest = parts[i:]
        for base in getattr(parent, "__path__", ()) or ():
            stem = os.path.join(base, *rest)
            if os.path.isfile(stem + ".py") or os.path.isfile(os.path.join(stem, "__init__.py")):
                return True
        return False
    from importlib.machinery import PathFinder

    return PathFinder.find_spec(name) is not None if len(parts) == 1 else False


def applicable_ops(patches: list[Any], fullname: str) -> list[Op]:
    """Operations of ``patches`` that target ``fullname``: it is one of the op's candidate
    module paths, and no earlier candidate exists (the first that exists wins)."""
    ops = []
    for patch in patches:
        for op in patch.ops:
            if fullname in op.modules:
                idx = op.modules.index(fullname)
                if not any(module_exists(m) for m in op.modules[:idx]):
                    ops.append(op)
    return ops


class PatchFinder:
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

    def __repr__(self) -> str:
        return f"<importpatch.PatchFinder {sorted(e.name for e in self.entries)}>"

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        entries = self.by_module.get(fullname)
        if entries is None:
            return None
        spec: ModuleSpec | None = None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, PatchFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        # duck-typed: subclassing importlib.abc.Loader would import importlib.abc at start
        spec.loader = PatchLoader(spec.loader, fullname, spec.origin, entries)  # type: ignore[assignment]
        spec.cached = None  # never the package's own __pycache__
        return spec

    # importlib.invalidate_caches() calls this on every meta path finder.
    def invalidate_caches(self) -> None:
        pass


class PatchLoader:
    """Loads one targeted module: original source -> diffs/transforms -> landings -> code."""

    def __init__(
        self, loader: Any, fullname: str, origin: str | None, entries: list[Entry]
    ) -> None:
        self.loader = loader
        self.fullname = fullname
        self.origin = origin
        self.entries = entries
        self._built: tuple[CodeType, ModulePlan | None, set[str], str] | None = None
        self._code_events: list[Op] = []

    def __getattr__(self, name: str) -> Any:
        # is_package, get_filename, get_data, get_resource_reader, path, name ... as the original.
        return getattr(self.loader, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        from .errors import PatchError

        code, plan, unseen, _ = self._build()
        namespace = module.__dict__
        try:
            if plan is not None:
                plan.before_exec(namespace)
            exec(code, namespace)
            if plan is not None:
                plan.finish(namespace, unseen)
        except PatchError as exc:
            if exc.module == self.fullname:  # not one raised by a nested import
                self._record_failure(exc)
            raise
        mark_handled(module, (e.name for e in self.entries))
        self._after_exec(module)

    def get_code(self, fullname: str) -> CodeType:
        # runpy (python -m) executes get_code()'s result in __main__ itself.
        return self._build()[0]

    def get_source(self, fullname: str) -> str:
        return self._build()[3]

    # -- building ------------------------------------------------------------------------------

    def _build(self) -> tuple[CodeType, ModulePlan | None, set[str], str]:
        from .errors import PatchError

        if self._built is None:
            try:
                self._built = self._build_uncached()
            except PatchError as exc:
                self._record_failure(exc)
                raise
        return self._built

    def _record_failure(self, exc: Any) -> None:
        from . import events

        events.record("failed", exc.patch, self.fullname, "import", exc.what)

    def _ops(self) -> list[Op]:
        from . import events
        from .catalog import load_patch
        from .errors import PatchError
        from .versions import check

        patches: list[Patch] = []
        for entry in self.entries:
            try:
                patch = load_patch(entry)
            except Exception as exc:
                raise PatchError(
                    entry.name, self.fullname,
                    f"the patch declaration failed to load from {entry.source}: {exc}",
                    file=self.origin,
                ) from exc
            if any(p is patch for p in patches):
                continue  # two entries for one Patch object: its ops must apply once
            ok, why = check(patch.requires)
            if not ok:
                events.record("skipped", patch.name, self.fullname, "version", why)
                continue
            patches.append(patch)
        return applicable_ops(patches, self.fullname)

    def _build_uncached(self) -> tuple[CodeType, ModulePlan | None, set[str], str]:
        from .errors import PatchError
        from .landing import tolerated

        origin = self.origin
        if origin is None or not hasattr(self.loader, "get_data") or not origin.endswith(".py"):
            raise PatchError(
                self.entries[0].name, self.fullname,
                f"only modules loaded from .py source can be patched (origin: {origin})",
                file=origin,
            )
        ops = self._ops()
        while True:
            try:
                return self._build_with(origin, ops)
            except PatchError as exc:
                # Nothing has run yet: drop an on_error="warn" patch and build without it.
                if not tolerated(exc, [op for op in ops if op.patch.name == exc.patch]):
                    raise
                ops = [op for op in ops if op.patch.name != exc.patch]

    def _build_with(
        self, origin: str, ops: list[Op]
    ) -> tuple[CodeType, ModulePlan | None, set[str], str]:
        from . import bytecache, landing, publish
        from .declare import CODE_KINDS
        from .errors import PatchError

        raw = self.loader.get_data(origin)
        text = _decode(raw)
        code_ops = [op for op in ops if op.kind in CODE_KINDS]
        object_ops = [op for op in ops if op.kind not in CODE_KINDS]
        qualnames = sorted({landing.site_of(op)[0] for op in object_ops} - {""})
        plan = landing.ModulePlan(self.fullname, object_ops, origin) if object_ops else None
        if plan is not None:
            landing.register(plan)
        cache_root = bytecache.usable_root(report=True)
        use_cache = cache_root is not None and bytecache.enabled()
        key = bytecache.key(self.fullname, raw, ops, qualnames, cache_root, origin)
        cached = bytecache.load(cache_root, key, text, self.fullname) if use_cache else None
        if cached is not None:
            code, unseen, patched = cached
            if patched != text:
                publish.publish(origin, patched, cache_root)
        else:
            from . import transforms  # not on the cache-hit path: it imports difflib, dataclasses

            patched = text
            if code_ops:
                patched = transforms.patch_text(self.fullname, origin, text, code_ops)
            filename = origin
            if patched != text:
                filename = publish.publish(origin, patched, cache_root)
            try:
                code, unseen = transforms.compile_module(
                    self.fullname, origin, patched, qualnames, filename
                )
            except SyntaxError as exc:
                raise PatchError(
                    code_ops[0].patch.name if code_ops else ops[0].patch.name, self.fullname,
                    f"patched source does not compile: {exc.msg} (line {exc.lineno})", file=origin,
                ) from None
            if use_cache:
                bytecache.store(cache_root, key, code, unseen, patched, text)
        for op in object_ops:
            qual = landing.site_of(op)[0]
            if op.patch.on_error == "warn" and qual in unseen:
                # Landing after execution could fail half-way through a patch; refuse up front.
                raise PatchError(
                    op.patch.name, self.fullname,
                    f"symbol {qual!r} has no binding in the source (target {op.target})",
                    file=origin,
                )
        self._code_events = code_ops
        return code, plan, unseen, patched

    def _after_exec(self, module: ModuleType) -> None:
        from . import events

        if self._code_events and "triton" in sys.modules:
            # Triton compiles a kernel's source text, not its code object: fail closed (before
            # anything is reported applied) when a kernel does not carry the patched text.
            from .errors import PatchError
            from .kernels import check_kernels

            code, _, _, patched = self._build()
            names = list(dict.fromkeys(op.patch.name for op in self._code_events))
            try:
                check_kernels(module, patched, names, code.co_filename)
            except PatchError as exc:
                self._record_failure(exc)
                raise
        seen: set[tuple[str, str]] = set()
        for op in self._code_events:
            if (op.patch.name, op.kind) in seen:
                continue
            seen.add((op.patch.name, op.kind))
            how = "source-diff" if op.kind == "diff" else "transform"
            events.record("applied", op.patch.name, self.fullname, how)


def _decode(raw: bytes) -> str:
    """Source bytes to text with the declared encoding, keeping line endings as they are (a CRLF
    file stays CRLF, so diffs made on it still match and the published text is faithful)."""
    import io
    import tokenize

    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    text = raw.decode(encoding)
    return text[1:] if text.startswith("\ufeff") else text


# Patches already handled (applied, skipped or failed) per module object: a later enable() must
# not apply them again in place (a second wrap would stack on the first).
_handled: dict[str, tuple[ModuleType, set[str]]] = {}


def handled(module: ModuleType) -> set[str]:
    entry = _handled.get(module.__name__)
    return entry[1] if entry is not None and entry[0] is module else set()


def mark_handled(module: ModuleType, patches: Iterable[str]) -> None:
    _handled[module.__name__] = (module, handled(module) | set(patches))


def installed() -> PatchFinder | None:
    for finder in sys.meta_path:
        if isinstance(finder, PatchFinder):
            return finder
    return None


def install(entries: list[Entry]) -> PatchFinder:
    """Put a finder for ``entries`` first on sys.meta_path, replacing ours if present (idempotent:
    the .pth runs twice in venvs on some Pythons)."""
    finder = PatchFinder(entries)
    for i, existing in enumerate(sys.meta_path):
        if isinstance(existing, PatchFinder):
            sys.meta_path[i] = finder
            return finder
    sys.meta_path.insert(0, finder)
    return finder


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, PatchFinder)]

