"""``Patch.redirect(module, to)``: the import of ``module`` gives module ``to`` itself.

Chosen: an alias, not a copy. The loader of ``module`` imports ``to`` and puts ``to``'s module
object in ``sys.modules[module]`` (importlib hands the importer whatever the loader left there,
and sets it as the parent package's attribute). Why not ``to``'s source run again under
``module``'s name: that would make a second module with its own classes and state beside ``to``
(``isinstance`` across them fails, a registry filled in one is empty in the other), its relative
imports would resolve against ``module``'s package, and what it defines would pickle under
``module``'s name, which a process without the patch resolves to the original. As an alias
there is one object, its code runs once, under its own name, and pickles resolve in every
process.

Invariants:
- The original ``module`` never runs (its loader's ``create_module`` is not called either: a C
  extension's initialisation is code of the original).
- Fails closed: ``to`` failing to import makes the import of ``module`` raise ``PatchError``
  (``on_error="warn"``: skipped, the original is imported, with the event); so does another
  patch's operation that would land in ``module``'s own code (nothing of it runs); two
  redirects of one module fail both closed. ``after_import`` hooks of ``module`` run on ``to``'s
  module, before the import returns.
- ``to`` importing ``module`` while it is redirected (a cycle) gets an ImportError that says so
  at the first attribute it reads, not a half-made module.
- Refused where ``module`` is already imported when patching starts (``late.py``): names were
  copied from the original already, and swapping the module would leave them behind.
"""

from __future__ import annotations

import sys

from importpatch import events
from importpatch.discover.declare import AFTER_IMPORT, REDIRECT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from importpatch.discover.declare import Op


def redirect_of(ops: list[Op]) -> Op | None:
    """The redirect among a module's applicable operations (the first by patch name)."""
    found = sorted((op for op in ops if op.kind == REDIRECT), key=lambda op: op.patch.name)
    return found[0] if found else None


def load_redirected(fullname: str, placeholder: ModuleType, ops: list[Op],
                    file: str | None) -> Any:
    """Run the redirect of ``fullname`` (``ops``: its applicable operations, one a redirect) in
    its loader's ``exec_module``: ``sys.modules[fullname]`` becomes the target module. Returns
    that module, or None where the redirect was skipped (``on_error="warn"``: the caller then
    runs the original)."""
    from importpatch.errors import PatchError
    from importpatch.install.activation import ModulePlan, record_skip

    op = redirect_of(ops)
    assert op is not None
    to = str(op.obj)
    others = sorted((o for o in ops if o.kind == REDIRECT and o.patch is not op.patch),
                    key=lambda o: o.patch.name)
    if others:
        other = others[0]
        raise _recorded(PatchError(
            other.patch.name, fullname, f"two patches redirect {fullname}: {op.patch.name} to "
            f"{to} and {other.patch.name} to {other.obj}; enable one of them", file=file))
    landing = [o for o in ops if o.kind not in (REDIRECT, AFTER_IMPORT)
               and o.patch is not op.patch]
    for patch in dict.fromkeys(o.patch for o in landing):
        kinds = ", ".join(sorted({o.kind for o in landing if o.patch is patch}))
        what = (f"{fullname} is redirected to {to} by patch {op.patch.name}, so its own code "
                f"never runs and this patch's {kinds} cannot land there; target {to} instead")
        if patch.on_error == "warn":
            record_skip(patch.name, fullname, what)
            continue
        raise _recorded(PatchError(patch.name, fullname, what, file=file))
    own = [o for o in ops if o.patch is op.patch and o.kind not in (REDIRECT, AFTER_IMPORT)]
    if own:
        raise _recorded(PatchError(
            op.patch.name, fullname, f"the patch redirects {fullname} to {to} and also changes "
            f"{fullname} ({', '.join(sorted({o.kind for o in own}))}), whose code never runs: "
            f"target {to} instead", file=file))

    def cycle(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # (what importlib itself asks: __path__, __spec__ ...)
        raise ImportError(
            f"importpatch: {fullname} is redirected to {to} (patch {op.patch.name}), and {to} "
            f"read {fullname}.{name} while it was itself being imported: {to} must not import "
            f"{fullname} (it is {to})", name=fullname)

    placeholder.__getattr__ = cycle  # type: ignore[method-assign]
    import importlib

    try:
        target = importlib.import_module(to)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        what = (f"redirect to {to}: importing {to} raised {type(exc).__name__}: {exc}; fix "
                f"{to}, or disable the patch (IMPORTPATCH_DISABLE={op.patch.name})")
        if op.patch.on_error == "warn":
            record_skip(op.patch.name, fullname, what)
            del placeholder.__getattr__
            return None
        raise _recorded(PatchError(op.patch.name, fullname, what, file=file)) from exc
    sys.modules[fullname] = target
    where = getattr(target, "__file__", None) or to
    events.record("applied", op.patch.name, fullname, "redirect",
                  f"redirect: {fullname} is {to} ({where})")
    hooks = [o for o in ops if o.kind == AFTER_IMPORT]
    if hooks:  # on the module the importer gets, before the import returns
        # (a failing one raises: importlib then removes sys.modules[fullname], the alias)
        ModulePlan(fullname, hooks, file).run_hooks(target)
    from importpatch.discover.selection import mark_handled

    mark_handled(target, (o.patch.name for o in ops if o.kind in (REDIRECT, AFTER_IMPORT)))
    return target


def _recorded(err: Any) -> Any:
    """A failure of the import, recorded once (``status`` says "failed", with why)."""
    events.record("failed", err.patch, err.module, "import", err.what)
    err.recorded = True
    return err


def refuse_late(name: str, ops: list[Op]) -> None:
    """A redirect of module ``name``, already imported when patching starts: refused (a
    ``failed`` event), unless ``name`` already is the target (redirected at its import)."""
    for op in ops:
        if op.kind != REDIRECT:
            continue
        current = sys.modules.get(name)
        if current is not None and current is sys.modules.get(str(op.obj)):
            continue
        events.record(
            "failed", op.patch.name, name, "in-place",
            f"redirect to {op.obj}: {name} was imported before patching started, and names were "
            f"copied from it already; a redirect applies only at its import: enable it at "
            "interpreter start (IMPORTPATCH_ENABLE in the environment) instead")
