"""A patch package laid out as in vLLM's blog post "Building Clean, Maintainable vLLM
Modifications Using the Plugin System" (blog.vllm.ai, 2025-11-20), written for the tests:

    vllm_custom_patches/
    ├── setup.py                  entry point vllm.general_plugins -> register_patches
    ├── vllm_custom_patches/
    │   ├── __init__.py           PatchManager, manager, register_patches()
    │   ├── core.py               VLLMPatch[Target], min_vllm_version (the post's semantics)
    │   └── patches/
    │       ├── __init__.py
    │       └── <one module per patch class>

``files(...)`` gives the package as {relative path: text}. ``compat=True`` changes the one import
line of each patch module to ``from importpatch.compat import ...``; ``entry_point=True`` adds the
one ``importpatch.patches`` entry point line to setup.py (and to ``ENTRY_POINTS``).
"""

from __future__ import annotations

import textwrap

PACKAGE = "vllm_custom_patches"
OWN_IMPORT = f"from {PACKAGE}.core import VLLMPatch, min_vllm_version"
COMPAT_IMPORT = "from importpatch.compat import VLLMPatch, min_vllm_version"

# The post's core.py: setattr on the target after import, a record per target, ValueError on a
# second patch of one attribute, a version check against vllm.__version__ that skips with a warning.
CORE = '''
import logging
from types import MethodType, ModuleType
from typing import Type, Union

from packaging import version

import vllm

logger = logging.getLogger(__name__)

PatchTarget = Union[Type, ModuleType]


class VLLMPatch:
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not hasattr(cls, "_patch_target"):
            raise TypeError(f"{cls.__name__} must be defined as VLLMPatch[Target]")

    @classmethod
    def __class_getitem__(cls, target: PatchTarget) -> Type:
        if not isinstance(target, (type, ModuleType)):
            raise TypeError(f"Can only patch classes or modules, not {type(target)}")
        return type(f"{cls.__name__}[{target.__name__}]", (cls,), {"_patch_target": target})

    @classmethod
    def apply(cls):
        if cls is VLLMPatch:
            raise TypeError("Cannot apply base VLLMPatch class directly")
        target = cls._patch_target
        if not hasattr(target, "_applied_patches"):
            target._applied_patches = {}
        for name, attr in cls.__dict__.items():
            if name.startswith("_") or name in ("apply",):
                continue
            if name in target._applied_patches:
                raise ValueError(
                    f"{target.__name__}.{name} already patched by {target._applied_patches[name]}"
                )
            target._applied_patches[name] = cls.__name__
            if isinstance(attr, MethodType):
                attr = MethodType(attr.__func__, target)
            action = "replaced" if hasattr(target, name) else "added"
            setattr(target, name, attr)
            logger.info(f"{cls.__name__} {action} {target.__name__}.{name}")


def min_vllm_version(version_str: str):
    def decorator(cls):
        original_apply = cls.apply

        @classmethod
        def checked_apply(cls):
            if version.parse(vllm.__version__) < version.parse(version_str):
                logger.warning(
                    f"Skipping {cls.__name__}: requires vLLM >= {version_str}, "
                    f"but found {vllm.__version__}"
                )
                return
            original_apply()

        cls.apply = checked_apply
        cls._min_version = version_str
        return cls

    return decorator
'''

INIT = '''
import logging
import os
from typing import Dict, List

logger = logging.getLogger(__name__)


class PatchManager:
    def __init__(self):
        self.available_patches: Dict[str, type] = {}
        self.applied_patches: List[str] = []

    def register(self, name: str, patch_class: type):
        self.available_patches[name] = patch_class
        logger.info(f"Registered patch: {name}")

    def apply_patch(self, name: str) -> bool:
        if name not in self.available_patches:
            logger.error(f"Unknown patch: {name}")
            return False
        try:
            self.available_patches[name].apply()
            self.applied_patches.append(name)
            return True
        except Exception as e:
            logger.error(f"Failed to apply {name}: {e}")
            return False

    def apply_from_env(self):
        env_patches = os.environ.get("VLLM_CUSTOM_PATCHES", "").strip()
        if not env_patches:
            logger.info("No custom patches specified (VLLM_CUSTOM_PATCHES not set)")
            return
        patch_names = [p.strip() for p in env_patches.split(",") if p.strip()]
        logger.info(f"Applying patches: {patch_names}")
        for name in patch_names:
            self.apply_patch(name)
        logger.info(f"Successfully applied: {self.applied_patches}")


manager = PatchManager()


def register_patches():
    """Main entry point called by vLLM's plugin system (vllm.general_plugins)."""
{imports}
{registrations}
    manager.apply_from_env()
'''

SETUP = '''
from setuptools import find_packages, setup

setup(
    name="vllm-custom-patches",
    version="0.1.0",
    description="Clean vLLM modifications via the plugin system",
    packages=find_packages(),
    install_requires=["packaging>=20.0"],
    entry_points={
        "vllm.general_plugins": [
            "custom_patches = vllm_custom_patches:register_patches",
        ],{extra}
    },
)
'''
EXTRA = '''
        "importpatch.patches": [
            "custom_patches = vllm_custom_patches:register_patches",
        ],'''

ENTRY_POINT_VLLM = "[vllm.general_plugins]\ncustom_patches = vllm_custom_patches:register_patches\n"
ENTRY_POINT_IMPORTPATCH = (
    "[importpatch.patches]\ncustom_patches = vllm_custom_patches:register_patches\n"
)


def files(
    patches: dict[str, tuple[str, str, str]], *, compat: bool, entry_point: bool,
    vllm_core: bool = True,
) -> dict[str, str]:
    """``patches``: module name -> (registered name, class name, module text). A module text
    says ``{IMPORT}`` where the post's import of VLLMPatch and min_vllm_version goes.
    ``vllm_core=False`` leaves ``import vllm`` out of core.py (for targets that are not vLLM)."""
    imports = "\n".join(
        f"    from {PACKAGE}.patches.{mod} import {cls}" for mod, (_, cls, _) in patches.items()
    )
    registrations = "\n".join(
        f"    manager.register({name!r}, {cls})" for name, cls, _ in patches.values()
    )
    core = CORE if vllm_core else CORE.replace("import vllm\n", "")
    out = {
        "setup.py": SETUP.replace("{extra}", EXTRA if entry_point else ""),
        f"{PACKAGE}/__init__.py": INIT.replace("{imports}", imports).replace(
            "{registrations}", registrations),
        f"{PACKAGE}/core.py": core,
        f"{PACKAGE}/patches/__init__.py": "",
    }
    for mod, (_, _, text) in patches.items():
        line = COMPAT_IMPORT if compat else OWN_IMPORT
        out[f"{PACKAGE}/patches/{mod}.py"] = textwrap.dedent(text).replace("{IMPORT}", line)
    return {rel: textwrap.dedent(text).lstrip("\n") for rel, text in out.items()}


def entry_points(*, entry_point: bool) -> str:
    return ENTRY_POINT_VLLM + ("\n" + ENTRY_POINT_IMPORTPATCH if entry_point else "")


# -- The post's package as published, and the migration the guide prescribes ----------------------

# The post's patch module: the target imported at module level, the original saved there, a class
# patch calling it. ``{MODULE}`` / ``{CLASS}``: where the target lives (vLLM's Scheduler in the
# vllm env, a throwaway class elsewhere); ``{LOG}``: a line that records each call (or nothing).
PUBLISHED_PRIORITY = '''
import logging

from {MODULE} import {CLASS}
from vllm_custom_patches.core import VLLMPatch, min_vllm_version

logger = logging.getLogger(__name__)

_original_schedule = {CLASS}.schedule


@min_vllm_version("0.9.1")
class PrioritySchedulerPatch(VLLMPatch[{CLASS}]):
    """Waiting requests with a lower priority value are scheduled first."""

    def schedule_with_priority(self, *args, **kwargs):
        waiting = getattr(self, "waiting", None)
        if waiting is not None and len(waiting) > 1 and hasattr(waiting, "extend"):
            ordered = sorted(waiting, key=lambda r: (r.priority, r.arrival_time))
            waiting.clear()
            waiting.extend(ordered)
        output = _original_schedule(self, *args, **kwargs)
{LOG}
        return output

    schedule = schedule_with_priority
'''

# The post's __init__.py with its manager made inside register_patches() (the other layout the
# post's readers use): ``INIT`` with the module-level manager moved into the function.
LOCAL_MANAGER = ("\n\nmanager = PatchManager()\n", "\n"), (
    '    """Main entry point called by vLLM\'s plugin system (vllm.general_plugins)."""\n',
    '    """Main entry point called by vLLM\'s plugin system (vllm.general_plugins)."""\n'
    "    manager = PatchManager()\n")


def published(module: str, cls: str, *, log: str = "", local_manager: bool = False,
              vllm_core: bool = True) -> dict[str, str]:
    """The post's package as published (one patch module, priority_scheduler), targeting
    ``module``'s class ``cls``: {relative path: text}."""
    text = (PUBLISHED_PRIORITY.replace("{MODULE}", module).replace("{CLASS}", cls)
            .replace("{LOG}\n", log))
    out = files({"priority_scheduler": ("PriorityScheduler", "PrioritySchedulerPatch", text)},
                compat=False, entry_point=False, vllm_core=vllm_core)
    if local_manager:
        init = f"{PACKAGE}/__init__.py"
        for old, new in LOCAL_MANAGER:
            assert out[init].count(old) == 1, old
            out[init] = out[init].replace(old, new)
    return out


def migrate(pkg: dict[str, str], module: str, cls: str) -> dict[str, str]:
    """What docs/migration.md says to change, line by line: each patch module's import of the
    post's core, its target as a string, and one entry point in setup.py."""
    out = dict(pkg)
    rel = f"{PACKAGE}/patches/priority_scheduler.py"
    for old, new in ((OWN_IMPORT, COMPAT_IMPORT),
                     (f"VLLMPatch[{cls}]", f'VLLMPatch["{module}:{cls}"]')):
        assert out[rel].count(old) == 1, old
        out[rel] = out[rel].replace(old, new)
    anchor = '            "custom_patches = vllm_custom_patches:register_patches",\n        ],\n'
    assert out["setup.py"].count(anchor) == 1
    out["setup.py"] = out["setup.py"].replace(anchor, anchor + (
        '        "importpatch.patches": ["custom_patches = vllm_custom_patches:register_patches"],'
        "\n"))
    return out


def changed_lines(before: dict[str, str], after: dict[str, str]) -> tuple[int, int]:
    """(lines removed, lines written: changed or added), over every file: a unified diff's - and
    + lines."""
    import difflib

    removed = written = 0
    for rel in sorted(set(before) | set(after)):
        for line in difflib.unified_diff(before.get(rel, "").splitlines(),
                                         after.get(rel, "").splitlines(), lineterm="", n=0):
            if line.startswith(("+++", "---")):
                continue
            removed += line.startswith("-")
            written += line.startswith("+")
    return removed, written


def migration_diff() -> str:
    """The migration of the post's package (vLLM's Scheduler), as a diff a reader applies:
    docs/examples/blog-migration.diff, which docs/migration.md includes."""
    import difflib

    before = published("vllm.v1.core.sched.scheduler", "Scheduler")
    after = migrate(before, "vllm.v1.core.sched.scheduler", "Scheduler")
    out = []
    for rel in sorted(before):
        if before[rel] != after[rel]:
            out += difflib.unified_diff(before[rel].splitlines(True), after[rel].splitlines(True),
                                        f"a/{rel}", f"b/{rel}", n=4)
    return "".join(out)
