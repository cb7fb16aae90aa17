"""Toggles: which patches are on, read from environment variables.

Read at interpreter start (from ``_boot``) and again on late activation, so this module
imports nothing beyond ``os``. Garbage in any variable is reported as a *problem* string and
never raises: the ``.pth`` line must not break a Python process.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# Every variable the project reads, in one place (the README and `importpatch doctor` list them).
ENABLE = "IMPORTPATCH_ENABLE"  # comma/space separated patch names, or "all"
DISABLE = "IMPORTPATCH_DISABLE"  # names to switch off, wins over ENABLE and defaults
OFF = "IMPORTPATCH_OFF"  # global kill switch: any value but 0/false/no/off/"" disables all
PATH = "IMPORTPATCH_PATH"  # os.pathsep separated folders of .py / .diff / .patch declarations
LOG = "IMPORTPATCH_LOG"  # "1": one line per event on stderr
EVENTS_DIR = "IMPORTPATCH_EVENTS_DIR"  # folder: every process appends its events there (JSON lines)
CACHE_DIR = "IMPORTPATCH_CACHE_DIR"  # bytecode cache, catalog index and published text live here
NO_CACHE = "IMPORTPATCH_NO_CACHE"  # "1": never read or write the bytecode cache

ALL_VARS = (ENABLE, DISABLE, OFF, PATH, LOG, EVENTS_DIR, CACHE_DIR, NO_CACHE)

# The variable of vLLM's plugin-system blog post (importpatch.compat): comma-separated names of
# patches as registered with its PatchManager. They switch on the importpatch patches of those
# names too; a name importpatch does not know is the blog package's business, so no warning.
CUSTOM_PATCHES = "VLLM_CUSTOM_PATCHES"

# vLLM's Ray executor copies only VLLM_-prefixed variables (and a few others) to its workers
# (vllm/ray/ray_env.py); the same toggles spelled VLLM_IMPORTPATCH_* ride along and are read
# when the IMPORTPATCH_* spelling is absent.
VLLM_PREFIX = "VLLM_"

_FALSY = ("", "0", "false", "no", "off")


def get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    if value is None:
        value = environ.get(VLLM_PREFIX + name)
    return value


def is_truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in _FALSY


class Toggles:
    """The parsed switches. ``problems`` lists what could not be understood."""

    __slots__ = (
        "enable", "enable_all", "disable", "off", "path", "log", "events_dir", "problems", "custom",
    )

    def __init__(
        self,
        enable: frozenset[str] = frozenset(),
        enable_all: bool = False,
        disable: frozenset[str] = frozenset(),
        off: bool = False,
        path: tuple[str, ...] = (),
        log: bool = False,
        events_dir: str | None = None,
        problems: tuple[str, ...] = (),
        custom: frozenset[str] = frozenset(),
    ) -> None:
        self.enable = enable
        self.enable_all = enable_all
        self.disable = disable
        self.off = off
        self.path = path
        self.log = log
        self.events_dir = events_dir
        self.problems = problems
        self.custom = custom

    def decide(self, name: str, default: bool) -> tuple[bool, str]:
        """Whether patch ``name`` is on, and why (the reason is shown by `importpatch list`)."""
        if self.off:
            return False, f"{OFF} is set"
        if name in self.disable:
            return False, f"named in {DISABLE}"
        if name in self.enable:
            return True, f"named in {ENABLE}"
        if name in self.custom:
            return True, f"named in {CUSTOM_PATCHES}"
        if self.enable_all:
            return True, f"{ENABLE}=all"
        if default:
            return True, "on by default"
        return False, "off by default"

    @property
    def anything_requested(self) -> bool:
        return bool(self.enable or self.enable_all or self.path or self.custom)


def _names(raw: str, var: str, problems: list[str]) -> set[str]:
    names: set[str] = set()
    for part in raw.replace(",", " ").split():
        if all(c.isalnum() or c in "-_." for c in part):
            names.add(part)
        else:
            problems.append(f"{var}: ignored {part!r} (a patch name has letters, digits, - _ .)")
    return names


def read(environ: Mapping[str, str] | None = None) -> Toggles:
    env = os.environ if environ is None else environ
    problems: list[str] = []
    enable = _names(get(env, ENABLE) or "", ENABLE, problems)
    enable_all = "all" in enable
    enable.discard("all")
    disable = _names(get(env, DISABLE) or "", DISABLE, problems)
    off = is_truthy(get(env, OFF))
    path = tuple(p for p in (get(env, PATH) or "").split(os.pathsep) if p.strip())
    for p in path:
        if not os.path.isdir(p):
            problems.append(f"{PATH}: {p!r} is not a folder")
    events_dir = get(env, EVENTS_DIR) or None
    # Split as the post's PatchManager.apply_from_env does: on commas, blanks stripped.
    custom = {n.strip() for n in (env.get(CUSTOM_PATCHES) or "").split(",") if n.strip()}
    return Toggles(
        enable=frozenset(enable),
        enable_all=enable_all,
        disable=frozenset(disable),
        off=off,
        path=path,
        log=is_truthy(get(env, LOG)),
        events_dir=events_dir,
        problems=tuple(problems),
        custom=frozenset(custom),
    )


def cache_root(environ: Mapping[str, str] | None = None) -> str:
    """The documented default: $IMPORTPATCH_CACHE_DIR, else $XDG_CACHE_HOME/importpatch, else
    ~/.cache/importpatch. (The .pth line computes the same path inline; keep them in step.)"""
    env = os.environ if environ is None else environ
    explicit = get(env, CACHE_DIR)
    if explicit:
        return os.path.abspath(explicit)  # children may run in another folder
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "importpatch")
