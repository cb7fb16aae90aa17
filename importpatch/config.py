"""Toggles: which patches are on, read from environment variables.

Read at interpreter start (from ``_boot``) and again on late activation, so this module
imports nothing beyond ``os``. Garbage in any variable is reported as a *problem* string (one
warning per process, naming the variable and the values it accepts) and never raises: the ``.pth``
line must not break a Python process.

One precedence rule, used by every reader (the ``.pth`` line's slow path, ``_boot``, the vLLM
plugin, ``enable()``, ``importpatch doctor``): ``IMPORTPATCH_X`` wins whenever it is *set*, even
to an empty value; ``VLLM_IMPORTPATCH_X`` is read only when ``IMPORTPATCH_X`` is absent.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# Every variable the project reads, in one place (docs/reference/environment.md and
# `importpatch doctor` list them).
ENABLE = "IMPORTPATCH_ENABLE"  # comma/space separated patch names, or "all" (not the built-in)
DISABLE = "IMPORTPATCH_DISABLE"  # names to switch off, wins over ENABLE and defaults
OFF = "IMPORTPATCH_OFF"  # global kill switch (a switch: see SWITCH_VALUES)
PATH = "IMPORTPATCH_PATH"  # os.pathsep separated folders of .py / .diff / .patch declarations
LOG = "IMPORTPATCH_LOG"  # switch: one line per event on stderr
EVENTS_DIR = "IMPORTPATCH_EVENTS_DIR"  # folder: every process appends its events there (JSON lines)
CACHE_DIR = "IMPORTPATCH_CACHE_DIR"  # bytecode cache, catalog index and published text live here
NO_CACHE = "IMPORTPATCH_NO_CACHE"  # switch: never read or write the bytecode cache
STRICT = "IMPORTPATCH_STRICT"  # switch: a problem with the chosen patches stops the program
# Seconds one declaration may run while the index is built (catalog.scan_bounded); 0: no limit.
DISCOVERY_TIMEOUT = "IMPORTPATCH_DISCOVERY_TIMEOUT"
DEFAULT_DISCOVERY_TIMEOUT = 20.0

ALL_VARS = (ENABLE, DISABLE, OFF, PATH, LOG, EVENTS_DIR, CACHE_DIR, NO_CACHE, STRICT,
            DISCOVERY_TIMEOUT)

# Set by discovery while declarations run (catalog.scan): a Python process that patch code starts
# then does not activate (it would run the declarations again, and start the next one).
DISCOVERING = "_IMPORTPATCH_DISCOVERING"

# Set (to "1") only for the process that builds the index for its parent (catalog.scan_bounded):
# its own start-up hook does nothing, silently, and removes the variable.
SCANNER = "_IMPORTPATCH_SCANNER"

# The warnings of the in-place landing of a patch package that imports its own target
# (install/late.py, ``warn_own_import``), one key a line: set in the process that printed one, so
# that the processes it starts (vLLM's EngineCore and Workers) do not print it again.
WARNED = "_IMPORTPATCH_WARNED"


def discovery_timeout(environ: Mapping[str, str]) -> float:
    """``IMPORTPATCH_DISCOVERY_TIMEOUT`` in seconds (0: no limit); the default when unset or not
    a number."""
    raw = get(environ, DISCOVERY_TIMEOUT)
    try:
        value = float(raw) if raw is not None and raw.strip() else DEFAULT_DISCOVERY_TIMEOUT
    except ValueError:
        return DEFAULT_DISCOVERY_TIMEOUT
    return value if value >= 0 and value == value else DEFAULT_DISCOVERY_TIMEOUT


# The variable of vLLM's plugin-system blog post (importpatch.integrations.compat): comma-separated
# names of patches as registered with its PatchManager. A set VLLM_CUSTOM_PATCHES is a reason to
# activate at start (the .pth line looks for it by name, importpatch/_pth.py), and its names switch
# on the importpatch patches of those names; a name importpatch does not know is the blog package's
# business, so it gets no warning.
CUSTOM_PATCHES = "VLLM_CUSTOM_PATCHES"

# vLLM's Ray executor copies only VLLM_-prefixed variables (and a few others) to its workers
# (vllm/ray/ray_env.py); the same toggles spelled VLLM_IMPORTPATCH_* ride along and are read
# when the IMPORTPATCH_* spelling is absent.
VLLM_PREFIX = "VLLM_"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
SWITCH_VALUES = "1, true, yes, on (on) or 0, false, no, off, empty (off)"


def get(environ: Mapping[str, str], name: str) -> str | None:
    """The value of ``name`` under the precedence rule of the module docstring."""
    value = environ.get(name)
    if value is None:
        value = environ.get(VLLM_PREFIX + name)
    return value


def switch(value: str | None, default: bool = False) -> bool | None:
    """A switch's value: True, False, or None when it is not one of SWITCH_VALUES (unset:
    ``default``)."""
    if value is None:
        return default
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    return None


def flag(environ: Mapping[str, str], name: str) -> bool:
    """A switch as every reader must interpret it: an unrecognised value of OFF means off
    (everything is disabled, the safe side), of LOG, NO_CACHE and STRICT their default (off)."""
    value = switch(get(environ, name))
    if value is None:
        return name == OFF
    return value


def is_truthy(value: str | None) -> bool:
    """Kept for callers outside the project's readers; prefer ``flag``."""
    return bool(switch(value))


class Toggles:
    """The parsed switches. ``problems`` lists what could not be understood; ``choice_problems``
    those of them that can leave off a patch the user asked for (a malformed name in ENABLE, a
    PATH entry that is not a folder): strict mode stops on these."""

    __slots__ = ("enable", "enable_all", "disable", "off", "path", "log", "events_dir",
                 "problems", "strict", "choice_problems", "custom")

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
        strict: bool = False,
        choice_problems: tuple[str, ...] = (),
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
        self.strict = strict
        self.choice_problems = choice_problems
        self.custom = custom

    def decide(self, name: str, default: bool, *, builtin: bool = False) -> tuple[bool, str]:
        """Whether patch ``name`` is on, and why (the reason is shown by `importpatch list`).

        ``all`` is every patch of the user's folders (PATH), of installed patch packages and of
        ``Patch()`` calls, never a built-in one (shipped in importpatch, e.g. an example that
        changes a kernel): those are on by name, or by default; ``all`` neither adds nor removes
        them."""
        if self.off:
            return False, f"{OFF} is set"
        if name in self.disable:
            return False, f"named in {DISABLE}"
        if name in self.enable:
            return True, f"named in {ENABLE}"
        if name in self.custom:
            return True, f"named in {CUSTOM_PATCHES}"
        if self.enable_all and not builtin:
            return True, f"{ENABLE}=all"
        if default:
            return True, "on by default"
        if self.enable_all:
            return False, (f"built-in, off by default: on only by name ({ENABLE}=all means the "
                           "patches of your folders and packages)")
        return False, "off by default"

    def decide_entry(self, entry: Any) -> tuple[bool, str]:
        """``decide`` for a catalog entry (its name, default and origin)."""
        return self.decide(entry.name, bool(entry.default), builtin=entry.origin == "builtin")

    @property
    def anything_requested(self) -> bool:
        return bool(self.enable or self.enable_all or self.path or self.custom)


# -- The patch folders of the toggles ------------------------------------------------------------


def builtin_folder() -> str | None:
    """The built-in patches: shipped in the package, or ``patches/`` beside it in a checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    shipped, checkout = "_builtin_patches", os.path.join(os.path.dirname(here), "patches")
    for candidate in (os.path.join(here, shipped), checkout):
        if os.path.isdir(candidate):
            return candidate
    return None


def patch_folders(toggles: Toggles) -> list[tuple[str, str]]:
    """(kind, folder) of every patch folder of these toggles: the built-in one first, then each
    folder of ``IMPORTPATCH_PATH`` that exists, once."""
    import stat  # loaded by site already: free here

    out = []
    builtin = builtin_folder()
    if builtin:
        out.append(("builtin", builtin))
    # One folder named twice (itself and a link to it, or a path with "..") is scanned once:
    # told by device and inode (one stat each; realpath costs a stat per path component).
    seen: set[tuple[int, int]] = set()
    for p in ([builtin] if builtin else []) + list(toggles.path):
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            if p != builtin:
                out.append(("folder", os.path.abspath(p)))
    return out


def _names(raw: str, var: str, problems: list[str]) -> set[str]:
    names: set[str] = set()
    bad = []
    for part in raw.replace(",", " ").split():
        if all(c.isalnum() or c in "-_." for c in part):
            names.add(part)
        else:
            bad.append(part)
    if bad:
        problems.append(_listed(var, bad, "ignored", "ignored", before=True)
                        + " (a patch name has letters, digits, - _ .)")
    return names


def _listed(var: str, values: list[str], one: str, many: str, *, before: bool = False) -> str:
    """One problem line for ``values`` of ``var``, however many: each problem is a line in every
    process (3,000 missing folders were 3,000 lines), so the first 5 are named, then how many
    more. ``before``: the verb comes first ("ignored 'a!'"), else last ("'/x' is not a folder")."""
    shown = ", ".join(repr(v) for v in values[:5])
    if len(values) > 5:
        shown += f", and {len(values) - 5:,} more"
    verb = one if len(values) == 1 else many
    counted = "" if len(values) == 1 else f"{len(values):,} entries: "
    return f"{var}: {counted}{verb} {shown}" if before else f"{var}: {counted}{shown} {verb}"


def read(environ: Mapping[str, str] | None = None) -> Toggles:
    env = os.environ if environ is None else environ
    problems: list[str] = []
    for name in ALL_VARS:  # both spellings set and different: say which one counts
        plain, vllm = env.get(name), env.get(VLLM_PREFIX + name)
        if plain is not None and vllm is not None and plain != vllm:
            problems.append(f"{name}={plain!r} and {VLLM_PREFIX}{name}={vllm!r} are both set: "
                            f"{name} wins (the {VLLM_PREFIX} spelling is read only without it)")
    for name in (OFF, LOG, NO_CACHE, STRICT):
        raw = get(env, name)
        if switch(raw) is None:
            means = "everything is off" if name == OFF else "off"
            problems.append(f"{_spelled(env, name)}={raw!r} is not a switch value (accepted: "
                            f"{SWITCH_VALUES}); taken as {means}")
    choice_problems: list[str] = []
    enable = _names(get(env, ENABLE) or "", ENABLE, choice_problems)
    enable_all = "all" in enable
    enable.discard("all")
    disable = _names(get(env, DISABLE) or "", DISABLE, problems)
    off = flag(env, OFF)
    path = tuple(p for p in (get(env, PATH) or "").split(os.pathsep) if p.strip())
    missing = [p for p in path if not os.path.isdir(p)]
    if missing:
        choice_problems.append(_listed(PATH, missing, "is not a folder", "are not folders"))
    problems += choice_problems
    events_dir = get(env, EVENTS_DIR) or None
    if events_dir is not None:
        events_dir = os.path.abspath(events_dir)  # children may run in another folder
    # Split as the post's PatchManager.apply_from_env does: on commas, blanks stripped.
    custom = {n.strip() for n in (env.get(CUSTOM_PATCHES) or "").split(",") if n.strip()}
    return Toggles(
        enable=frozenset(enable),
        enable_all=enable_all,
        disable=frozenset(disable),
        off=off,
        path=path,
        log=flag(env, LOG),
        events_dir=events_dir,
        problems=tuple(problems),
        strict=flag(env, STRICT),
        choice_problems=tuple(choice_problems),
        custom=frozenset(custom),
    )


def _spelled(env: Mapping[str, str], name: str) -> str:
    return name if name in env else VLLM_PREFIX + name


def default_cache_root(environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """The default cache root ($XDG_CACHE_HOME/importpatch, else ~/.cache/importpatch) and, when
    there is none, why. A relative XDG_CACHE_HOME is ignored (XDG base directory spec); without a
    home folder (HOME unset and no password-database entry) there is no default: never a
    relative ``~/.cache`` under the working folder. (The .pth line computes the same path inline
    and puts a "/" in front, so that it never looks at a relative path either.)"""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CACHE_HOME") or ""
    if os.path.isabs(xdg):
        return os.path.join(xdg, "importpatch"), ""
    home = env.get("HOME") or ""
    if not home:
        home = os.path.expanduser("~")  # the password database
    if not os.path.isabs(home):
        uid = os.getuid() if hasattr(os, "getuid") else "?"
        return None, (f"no cache folder: HOME is not set and user id {uid} has no home in the "
                      f"password database (set {CACHE_DIR} or HOME)")
    if not os.path.isdir(home):
        # A home folder that does not exist is never created (with its parents) by a cache.
        return None, (f"no cache folder: the home folder {home} does not exist (it is not "
                      f"created; set {CACHE_DIR}, or HOME to a folder that exists)")
    return os.path.join(home, ".cache", "importpatch"), ""


def cache_root(environ: Mapping[str, str] | None = None) -> str | None:
    """$IMPORTPATCH_CACHE_DIR (made absolute: children may run in another folder), else the
    default root; None when there is none (see ``default_cache_root``)."""
    env = os.environ if environ is None else environ
    explicit = get(env, CACHE_DIR)
    if explicit:
        return os.path.abspath(explicit)
    return default_cache_root(env)[0]
