"""Late activation: patching targets that were imported before patching started.

Happens after an explicit ``importpatch.enable()``, when vLLM loads its general plugins in a
process where the ``.pth`` did not run (``python -S``) or ran before the toggles arrived (vLLM's
Ray executor sets worker variables by RPC after the worker started). replace / wrap / add are
applied in place, then every other loaded module's global that still holds the original object
(a ``from x import y`` copy) is re-bound; the count is logged. Source diffs and AST transforms
cannot change code that already ran: they are refused with a clear message.
"""

from __future__ import annotations

import sys

from . import events
from .declare import CODE_KINDS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .finder import PatchFinder


def apply_to_imported(finder: PatchFinder) -> int:
    from . import landing
    from .catalog import load_patch
    from .errors import PatchError
    from .finder import applicable_ops, handled, mark_handled
    from .versions import check

    done = 0
    for name, entries in finder.by_module.items():
        module = sys.modules.get(name)
        if module is None:
            continue
        seen = handled(module)
        entries = [e for e in entries if e.name not in seen]
        if not entries:
            continue
        mark_handled(module, (e.name for e in entries))
        patches = []
        for entry in entries:
            try:
                patch = load_patch(entry)
            except Exception as exc:
                events.record("failed", entry.name, name, "in-place", f"declaration failed: {exc}")
                continue
            ok, why = check(patch.requires)
            if ok:
                patches.append(patch)
            else:
                events.record("skipped", patch.name, name, "version", why)
        ops = applicable_ops(patches, name)
        for op in [o for o in ops if o.kind in CODE_KINDS]:
            events.record(
                "failed", op.patch.name, name, "in-place",
                f"{op.kind} patches apply only when the module is imported, and {name} was "
                "imported before patching started; enable it at interpreter start "
                "(IMPORTPATCH_ENABLE in the environment) instead",
            )
        object_ops = [o for o in ops if o.kind not in CODE_KINDS]
        if not object_ops:
            continue
        namespace = module.__dict__
        try:
            plan = landing.ModulePlan(name, object_ops, getattr(module, "__file__", None))
            before = {q: _raw(namespace, q) for q in plan.sites}
            for op in plan.module_adds:
                assert op.qualname is not None
                if op.qualname in namespace:
                    raise PatchError(op.patch.name, name, f"add {op.qualname}: already exists")
                namespace[op.qualname] = op.obj
            plan.finish(namespace, set(plan.sites), late=True)
        except PatchError as exc:
            events.record("failed", exc.patch, name, "in-place", exc.what)
            continue
        landing.register(plan)
        # The patch's own module keeps what it saved (``_orig = m.f``): re-binding it would make
        # a replacement that calls its original call itself.
        homes = {getattr(o.patch, "home", None) for o in object_ops}
        skip = [module, *(sys.modules[h] for h in homes if h in sys.modules)]
        for qual, original in before.items():
            if original is not None and "." not in qual:
                count = rebind(original, plan.final[qual], skip=skip)
                events.record(
                    "info", ",".join(sorted({o.patch.name for o in object_ops})),
                    f"{name}:{qual}", "rebind", f"re-bound {count} copies in other modules",
                )
        done += 1
    return done


def _raw(namespace: dict[str, Any], qual: str) -> Any:
    obj: Any = namespace
    for part in qual.split("."):
        store = obj if isinstance(obj, dict) else getattr(obj, "__dict__", {})
        if part not in store:
            return None
        obj = store[part]
    return obj


def rebind(original: Any, new: Any, *, skip: list[Any] | tuple[Any, ...] = ()) -> int:
    """Point every module global that is ``original`` at ``new`` (modules in ``skip`` aside);
    returns how many."""
    count = 0
    for module in list(sys.modules.values()):
        if module is None or any(module is s for s in skip):
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        for key, value in list(namespace.items()):
            if value is original:
                namespace[key] = new
                count += 1
    return count
