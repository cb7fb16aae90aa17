"""Interpreter start: called by the ``.pth`` line (and by the PEP 829 ``.start`` file) when an
``IMPORTPATCH_*`` (or ``VLLM_CUSTOM_PATCHES``) variable is set or the "nothing is on by default"
stamp is missing.

Invariants:
- ``start`` never raises: nothing patch code raises (``SystemExit``, ``KeyboardInterrupt``,
  ``GeneratorExit`` included) gets out, a broken configuration is reported on stderr (once per
  process) and the failure is deferred to the import of a targeted module. The one exception is a
  real Ctrl-C during start-up: discovery is abandoned without writing anything and the
  ``KeyboardInterrupt`` goes on, as it would without importpatch (see catalog.run_patch_code).
- It works once per process (venvs run ``.pth`` files twice).
- Discovery runs when the site module has finished building ``sys.path`` (at its import of
  ``sitecustomize``), never in the middle of ``.pth`` processing: a patch package (or its
  editable finder) on a folder that a later ``.pth`` or a later site folder adds is seen, and the
  index is keyed on the whole search path.
- The stamps the ``.pth`` line checks (``<default cache root>/s/<mtime>-<ctime>-<inode of its
  site folder>-<length of sys.path when it ran>``; mtime alone is shared by copies of a site
  folder and by reproducible builds, and one cache serves every venv of a HOME) are written only
  where that key covers everything that decides "is a patch on by default": no entry point of
  ``importpatch.patches`` anywhere, no folder on the search path that can gain a distribution
  without changing the site folder's mtime (only the standard library's folders besides it,
  existing or not), and no ``.pth`` file read after ours that names a folder which does not
  exist yet (site adds it when it appears). Elsewhere the index decides, in every process.
- Where patches are on by variables, an *enabled stamp* (``_write_enabled_stamp``) lets the next
  processes with exactly those variables wait for the first import of a package the chosen
  patches target, as for patches on by default, and start there: written only where that stamp's
  key (the site key above, the variables' text) and the signature of every path the index
  watched cover everything a start would decide, no problem is to be reported, and no variable
  beyond ``WAIT_VARS`` asks for the hook to run from the start (events, strict mode, a log).
  It only decides *when* the hook starts: what is on is decided then, by the same ``activate``.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from importlib.machinery import ModuleSpec
    from typing import Any

    from importpatch.discover.catalog import Entry
    from importpatch.load.finder import PatchFinder

_started = False
# What the .pth line saw: its site folder, that folder's (mtime, ctime, inode), the length of
# sys.path.
_pth: tuple[str, tuple[int, int, int], int] | None = None


def start(sitedir: str | None = None) -> None:
    """The start-up hook. ``sitedir``: the site folder of the ``.pth`` that calls it (None from
    the PEP 829 ``.start`` file, which runs after all ``.pth`` files)."""
    global _started, _pth
    if _started:
        return
    _started = True
    try:
        if sitedir is not None:  # first: _fails_closed reads it if a module below is missing
            st = os.stat(sitedir)
            _pth = (sitedir, (st.st_mtime_ns, st.st_ctime_ns, st.st_ino), len(sys.path))
        from importpatch import config

        if os.environ.pop(config.SCANNER, None) is not None:
            return  # the process that builds its parent's index (catalog.scan_bounded)
        if config.DISCOVERING in os.environ:
            # Started by patch code while another process ran its declarations in discovery:
            # discovering here too would start the next one, without end. Stay unpatched.
            _fail(RuntimeError(f"started by patch code while process "
                               f"{os.environ[config.DISCOVERING]} ran declarations"),
                  fail_closed=False)
            return
        toggles = config.read()
        _warn_problems(toggles.problems)
        if toggles.off:
            return
        import builtins

        if hasattr(builtins, "help") or sys.flags.no_site:  # a call after site's work (or -S)
            activate(start=True)
        else:  # the .pth line, or the .start file: site is still building sys.path
            from importpatch._slot import take_slot

            take_slot(_AfterSite())
    except BaseException as exc:  # noqa: BLE001 (start-up must not fail; see the docstring)
        _fail(exc)


def start_waited(site_path: list[str] | None, tops: Iterable[str] = ()) -> None:
    """Called by the .pth line's waiting finder (see importpatch/_pth_on.py) at the first import of
    a package that the patches on target (``tops``, the stamp's list: on by default, or on by
    variables where an enabled stamp holds): activate now, as the start would have. Never
    raises (but for a real Ctrl-C, as ``start``); where activation fails, the imports of
    ``tops`` fail closed."""
    global _started, _waited, _starting, activated_with
    if _started or activated_with is not None:  # started, or enable() activated it meanwhile
        return
    _started = _waited = _starting = True
    _waited_tops.update(t for t in tops if isinstance(t, str))
    try:
        from importpatch import sites

        sites.site_path = site_path if site_path is not None else list(sys.path)
        activate(start=True)
    except KeyboardInterrupt:
        # Ctrl-C (or a signal handler) during the start: it goes on as it would without
        # importpatch, and nothing is decided. The waiting finder keeps its slot, so the next
        # import of a target (a REPL's, a retry loop's) starts again from here.
        _started = _waited = False
        activated_with = None
        raise
    except BaseException as exc:  # noqa: BLE001 (see start)
        _fail(exc)
    finally:
        _starting = False


_starting = False  # start_waited is activating (a target imported by patch code meanwhile)


def starting() -> bool:
    """Whether a waited start is in progress (the waiting finder keeps its slot meanwhile)."""
    return _starting


from importpatch._slot import Slot as _Slot  # noqa: E402 (a waiting process registered it already)


class _AfterSite(_Slot):
    """Holds importpatch's slot on ``sys.meta_path`` (importpatch/_slot.py) from the ``.pth``
    line to the end of site's work: activates at the first import after every site folder and
    ``.pth`` file was processed (site's import of ``sitecustomize``; site sets
    ``builtins.help`` just before), which puts the patch finder (or a closed one) in its place,
    then hands that import on. A ``.pth`` file read after ours that imports a target meets it
    first: the hook starts there, with the search path as far as site has built it."""

    __slots__ = ()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        import builtins

        from importpatch._slot import ask_others, leave_slot

        global _before_site, _after_site_busy
        if _after_site_busy:
            return None  # (the imports of the activation below)
        if name not in ("sitecustomize", "usercustomize") and not hasattr(builtins, "help"):
            if not _targets_before_site(name):
                return None
            _before_site = True
        _after_site_busy = True
        try:
            _activate_at_start()
        except BaseException as exc:  # noqa: BLE001
            _fail(exc)
        leave_slot(self)  # (activation put its finder in this slot; nothing on: still here)
        return ask_others(self, name, path, target)  # type: ignore[no-any-return]

    def invalidate_caches(self) -> None:
        pass


def _targets_before_site(name: str) -> bool:
    """Whether ``name``, imported by a ``.pth`` line before site finished, belongs to a package
    that a patch may target: the list the hook last wrote for this site folder (what the closed
    imports use), and ``vllm`` where a variable enables patches. Such an import starts the hook
    at once instead of running the package's code unpatched."""
    top = name.partition(".")[0]
    if top in _early_tops:
        return True
    if _early_tops_read:
        return False
    _early_tops_read.append(True)
    env = os.environ
    if any((env.get(v) or "").strip() for v in (
            "IMPORTPATCH_ENABLE", "VLLM_IMPORTPATCH_ENABLE", "VLLM_CUSTOM_PATCHES")):
        _early_tops.add("vllm")
    if _pth is not None:
        cache = env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        _early_tops.update(_read_names(targets_path(f"/{cache}/importpatch", _pth[0])))
    return top in _early_tops


_before_site = False  # the hook started at an import a .pth line made: no stamp is written
_after_site_busy = False  # _AfterSite is activating (it stays in its slot meanwhile)
_early_tops: set[str] = set()
_early_tops_read: list[bool] = []


def _activate_at_start() -> None:
    from importpatch import sites

    sites.site_path = list(sys.path)  # the interpreter puts the script folder first later
    activate(start=True)


_waited = False  # started by the .pth line's waiting finder (a stamp listed packages)
_waited_tops: set[str] = set()  # the packages it waited for: they fail closed if activation fails


def _fail(exc: BaseException, *, fail_closed: bool = True) -> None:
    if isinstance(exc, KeyboardInterrupt):
        from importpatch.discover.catalog import _SigintWatch

        if _SigintWatch.hit:  # a real Ctrl-C: let it stop the process (see the docstring)
            raise exc
    reason = f"{type(exc).__name__}: {exc}"
    known: set[str] = set()
    try:
        if fail_closed:
            known = _fails_closed(reason)
    except Exception:  # noqa: S110 (a part of importpatch may be missing: a reinstall)
        pass
    try:  # noqa: SIM105 (contextlib is not loaded at interpreter start; keep it so)
        sys.stderr.write(f"importpatch: warning: not activated: {reason}"
                         + (f"; imports of {', '.join(sorted(known))} fail closed\n" if known
                            else "\n"))
    except Exception:
        pass


def _fails_closed(reason: str) -> set[str]:
    """Where patches are on and the hook could not start (a reinstall in progress, a broken
    install): make the imports of the packages they target fail instead of running unpatched
    (the .pth line does the same where this module cannot even load: importpatch/_pth.py).
    Known: ``vllm`` where a variable enables patches, what the patches of this site folder target
    as an earlier process wrote it (``targets_path``), the stamp's list. Returns those names."""
    env = os.environ
    enabling = any((env.get(v) or "").strip() for v in (
        "IMPORTPATCH_ENABLE", "VLLM_IMPORTPATCH_ENABLE", "VLLM_CUSTOM_PATCHES"))
    if not (enabling or _waited):
        return set()
    known = {"vllm"} if enabling else set()
    known.update(_waited_tops)
    cache = env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    if _pth is not None:  # (a waited start: the stamp's packages are _waited_tops)
        known.update(_read_names(targets_path(f"/{cache}/importpatch", _pth[0])))
    known = {t for t in known if t.isidentifier()}
    if known:
        closed = _FailsClosed(known, reason)
        try:
            from importpatch._slot import take_slot

            if any(type(f).__name__ == "PatchFinder" for f in sys.meta_path):
                raise LookupError  # a working finder stays: the closed one goes before it
            take_slot(closed)  # in the waiting finder's (or _AfterSite's) place: kept first
        except Exception:
            sys.meta_path.insert(0, closed)
    return known


def targets_path(root: str, sitedir: str) -> str | None:
    """``<root>/s/t-<device>-<inode of the site folder>``: the top-level packages that the
    patches known to this site folder target, one per line (kept across reinstalls, which change
    the folder's mtime but not its inode)."""
    try:
        st = os.stat(sitedir)
    except OSError:
        return None
    return os.path.join(root, "s", f"t-{st.st_dev}-{st.st_ino}")


def _read_names(path: str | None) -> list[str]:
    """The names in a small cache file of ours (in folders of ours no one else can write)."""
    if path is None:
        return []
    uid = getattr(os, "getuid", int)()
    try:
        for folder in (os.path.dirname(os.path.dirname(path)), os.path.dirname(path)):
            st = os.lstat(folder)
            if st.st_uid != uid or st.st_mode & 0o170022 != 0o040000:
                return []
        st = os.lstat(path)
        if st.st_uid != uid or st.st_mode & 0o170000 != 0o100000:
            return []
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").split()
    except OSError:
        return []


class _FailsClosed(_Slot):
    """Fails the import of what the enabled patches target: the hook could not start. Holds
    the slot (kept first) where no patch finder does."""

    __slots__ = ("known", "reason")

    def __init__(self, known: set[str], reason: str) -> None:
        self.known, self.reason = known, reason

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] in self.known:
            raise ImportError(
                f"importpatch: {name} is not imported: patches are on but importpatch could not "
                f"start ({self.reason}); it fails closed rather than run unpatched. Reinstall "
                "importpatch-hook (or let the install in progress finish), or set "
                "IMPORTPATCH_OFF=1 to run without patches", name=name)

    def invalidate_caches(self) -> None:
        pass


def absolute_folders() -> None:
    """Make the relative folders of IMPORTPATCH_PATH (or its VLLM_ spelling) absolute in
    os.environ, as this process resolves them now: a child started after a chdir (a launcher, a
    worker that changes folder) then reads the same folders instead of none. Costs a look at one
    variable where no folder is relative."""
    from importpatch import config

    for var in (config.PATH, "VLLM_" + config.PATH):
        raw = os.environ.get(var)
        if not raw:
            continue
        parts = raw.split(os.pathsep)
        if all(not p.strip() or os.path.isabs(p) for p in parts):
            continue
        try:  # noqa: SIM105 (no contextlib import at start)
            os.environ[var] = os.pathsep.join(
                os.path.abspath(p) if p.strip() else p for p in parts)
        except (OSError, ValueError):  # the working folder is gone: leave it as it is
            pass


def _warn_problems(problems: tuple[str, ...]) -> None:
    if problems:
        from importpatch import events

        for problem in problems:
            events.warn_once(problem, problem)


def activate(
    environ: Mapping[str, str] | None = None, *, late: bool = False, start: bool = False
) -> PatchFinder | None:
    """Read the toggles, discover patches, install the finder for the enabled ones.

    ``late=True`` (an explicit ``enable()``, vLLM's general-plugin hook, a Ray worker whose
    variables arrived after start) also patches targets that are already imported."""
    from importpatch import config, events, safefiles
    from importpatch.discover import catalog
    from importpatch.load import finder

    global activated_with
    if environ is None:
        absolute_folders()
    activated_with = toggles_key(environ)
    toggles = config.read(environ)
    if not start:
        _warn_problems(toggles.problems)
    if toggles.off:
        finder.uninstall()
        return None
    safefiles.reset()
    if safefiles.usable_root() is None and not config.get(os.environ, config.CACHE_DIR):
        problem = config.default_cache_root()[1]
        if problem:
            events.warn_once("cache-root", problem + "; running without a cache")
    index = catalog.load_index(toggles)
    if getattr(index, "partial", None):
        # Discovery was killed (the OOM killer, a SIGTERM): said in every process it serves, as
        # what the files it had not finished do (their targets fail closed).
        events.warn_once("discovery-ended", f"discovery ended before it finished "
                         f"({index.partial}): the patches of the files it had not finished "
                         "fail closed at their targets' imports; the next process discovers "
                         "again")
    entries = (index.entries or []) + api_entries()
    chosen = [e for e in entries if toggles.decide_entry(e)[0]]
    problems = _choice_problems(toggles, entries, chosen)
    for key, message in problems:
        events.warn_once(key, message)
    unknown = _unknown_names(toggles, entries)
    if toggles.strict and (problems or toggles.choice_problems):
        _stop(toggles, entries, [m for _, m in problems], late=late,
              anything=bool(unknown or toggles.choice_problems
                            or any(e.error and not e.modules for e in entries)))
    elif "importpatch.strict" in sys.modules:
        sys.modules["importpatch.strict"].uninstall()  # a later enable() fixed the problem
    requested = sorted(toggles.enable | (toggles.custom & {e.name for e in entries}))
    if chosen or requested:
        names = sorted({e.name for e in chosen})
        detail = f"{len(names)} patch(es) on: {', '.join(names)}" if names else "no patch on"
        events.process_started("late" if late else "start", detail,
                               requested=requested, on=names)
    for name, close in unknown:  # each requested name's fate, in every process (status)
        events.record("unknown", name, "", "name",
                      f"did you mean {close}?" if close else "no patch of that name here",
                      level=20)
    if not chosen:
        finder.uninstall()
        if start and not toggles.anything_requested:
            _write_stamp(index, entries)
        elif start and not (problems or unknown or toggles.problems):
            # A patch folder set and nothing on in it: the next process with exactly these
            # variables stats what the index watched and stops at the line (issue 35).
            _write_enabled_stamp(index, entries, [])
        return None
    if start and not toggles.anything_requested:  # on by default only: the stamp lists targets
        _write_stamp(index, entries, chosen)
    elif start and not (problems or unknown or toggles.problems):
        _write_enabled_stamp(index, entries, chosen)
    if start and index.fresh:  # what patches target changes only when the index is rebuilt
        _write_targets(entries)
    installed = finder.install(chosen)
    if late:
        from importpatch.install.late import apply_to_imported

        installed.check_imported_tops(strict=toggles.strict)
        apply_to_imported(installed.by_module)
    elif start:
        _imported_before_start(installed, toggles)
    return installed


def _imported_before_start(installed: PatchFinder, toggles: Any) -> None:
    """At a start: a target already imported (by the interpreter, a ``.pth`` line, discovery
    itself, patch code) gets late activation's rule: applied in place where that is complete,
    otherwise a failure every process prints, and under strict mode the Gate stops the next
    import of any package (what was asked for did not happen). Nothing targeted runs unsaid."""
    imported = [name for name in installed.by_module if name in sys.modules]
    if not imported:
        return  # (the common case: one dict lookup per target module, nothing imported)
    from importpatch import events
    from importpatch.install.late import apply_to_imported
    from importpatch.strict import StrictError

    mark = len(events.events())
    try:  # noqa: SIM105 (contextlib is not loaded at start: keep it so)
        installed.check_imported_tops(strict=toggles.strict)
    except StrictError:
        pass  # (its Gate stops the next import of that package: the first safe point)
    apply_to_imported({name: installed.by_module[name] for name in imported})
    failed = [e for e in events.events()[mark:] if e.get("outcome") == "failed"]
    if toggles.strict and failed:
        from importpatch import strict

        strict.install(strict.targeted_tops(installed.entries), [
            f"patch {e['patch']}: {e['target']} was imported before importpatch started: "
            f"{e['detail']}" for e in failed], True)


def enable(*names: str, environ: dict[str, str] | None = None) -> int:
    """``importpatch.enable()`` (see there): the patches named, by the environment and made with
    ``Patch(...)`` in this process, on from now; returns the number of enabled patches. Where
    importpatch's own code cannot load (a reinstall in progress), it is the start's failure: one
    warning, and the imports of what patches target fail closed (``_fail``); returns 0."""
    try:
        return _enable(*names, environ=environ)
    except Exception as exc:
        if not _own_failure(exc):
            raise
        _fail(exc)
        return 0


def _own_failure(exc: BaseException) -> bool:
    """``errors.own_failure``, or True where that module itself is what cannot load."""
    try:
        from importpatch.errors import own_failure
    except Exception:
        return True
    return own_failure(exc)


def _enable(*names: str, environ: dict[str, str] | None = None) -> int:
    from importpatch import config
    from importpatch.discover.declare import iter_registry
    from importpatch.load.finder import installed

    env = dict(os.environ if environ is None else environ)
    # Earlier enable() calls stay in force: the new finder replaces the old one.
    current = installed()
    previous = [e.name for e in current.entries] if current is not None else []
    api_names = [p.name for p in iter_registry()]
    wanted = [config.get(env, config.ENABLE) or "", *previous, *names, *api_names]
    in_env = set((config.get(env, config.ENABLE) or "").replace(",", " ").split())
    env[config.ENABLE] = ",".join(filter(None, wanted))
    global _enable_call
    _enable_call = {n for n in names if n not in in_env}  # an unknown one is said as the call's
    try:
        finder = activate(env, late=True)
    finally:
        _enable_call = set()
    return len(finder.entries) if finder is not None else 0


# The names passed to the importpatch.enable() call in progress (not in IMPORTPATCH_ENABLE).
_enable_call: set[str] = set()


def _unknown_names(toggles: Any, entries: list[Entry]) -> list[tuple[str, str]]:
    """(name, the closest known name or "") of each name in ENABLE that no patch has. Only the
    first 10 (those the warning lists) are matched: difflib for each of 10,000 names of a
    generated list cost ~0.7 s in every process; the others' closest name is ""."""
    known = sorted({e.name for e in entries})
    unknown = sorted(toggles.enable.difference(known))
    if not unknown:
        return []
    import difflib

    return [(n, next(iter(difflib.get_close_matches(n, known, n=1)), "") if i < 10 else "")
            for i, n in enumerate(unknown)]


def _choice_problems(
    toggles: Any, entries: list[Entry], chosen: list[Entry]
) -> list[tuple[str, str]]:
    """(once-key, message) of each problem with the chosen patches: the warnings every process
    prints, and what strict mode stops on. (A patch whose declaration imports its own target but
    can land in place is not one outside strict mode: it warns when it is applied.)"""
    from importpatch import config
    from importpatch.discover.catalog import in_place_only

    out = []
    known = {e.name for e in entries}
    unknown = _unknown_names(toggles, entries)
    if unknown:
        names = [n for n, _ in unknown]
        # One line in every process: the first 10 names and 20 known ones, then "and N more"
        # (10,000 names were a 60 KB line).
        shown = unknown[:10]
        close = [f"{c} for {n}" if len(unknown) > 1 else c for n, c in shown if c]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        called = [n for n, _ in shown if n in _enable_call]
        listed = [n for n, _ in shown if n not in _enable_call]
        where = "; ".join(filter(None, (
            f"{', '.join(listed)} in {config.ENABLE}" if listed else "",
            f"{', '.join(called)} passed to importpatch.enable()" if called else "")))
        if len(unknown) > len(shown):
            where += f", and {len(unknown) - len(shown):,} more"
        names_known = sorted(known)
        known_text = ", ".join(names_known[:20]) or "(none)"
        if len(names_known) > 20:
            known_text += f", and {len(names_known) - 20:,} more"
        out.append((
            "unknown:" + ",".join(names),
            f"unknown patch name(s) {where}; known: {known_text}{hint}",
        ))
    for e in entries:
        # Enabled and broken, or broken before it said what it declares (it may hold a patch on
        # by default).
        if e.error and (e in chosen or e.unsure) and (toggles.strict or not in_place_only(e)):
            out.append((f"broken:{e.source}", f"patch {e.name} ({e.source}) is broken: {e.error}"))
    return out


def _stop(toggles: Any, entries: list[Entry], problems: list[str], *, late: bool,
          anything: bool = False) -> None:
    """Strict mode: stop at the first safe point (see importpatch/strict.py). ``anything``: the
    targets of what was asked for are unknown (an unknown name, a missing folder): any package
    outside the standard library may be one."""
    from importpatch import strict

    problems = [*toggles.choice_problems, *problems]
    if late:
        raise strict.StrictError(problems, "importpatch's late activation (importpatch.enable() "
                                           "or vLLM's general-plugin hook)")
    strict.install(strict.targeted_tops(entries), problems, anything)


# What the last activate() read (see toggles_key); vllm_plugin re-activates when it changed.
activated_with: tuple[str | None, ...] | None = None


def toggles_key(environ: Mapping[str, str] | None = None) -> tuple[str | None, ...]:
    """The values of the variables that choose the patches, as ``activate`` would read them:
    a Ray worker's variables can change after start (vLLM sets them by RPC)."""
    from importpatch import config

    env = os.environ if environ is None else environ
    return tuple(config.get(env, v) for v in (config.ENABLE, config.DISABLE, config.OFF,
                                               config.PATH, config.STRICT)) + (
        env.get(config.CUSTOM_PATCHES),)


def api_entries() -> list[Entry]:
    """Patches made with ``Patch(...)`` in this process (not from a patch file)."""
    declare = sys.modules.get("importpatch.discover.declare")
    if declare is None:  # no Patch(...) was ever made here (at start: always): import nothing
        return []
    from importpatch.discover.catalog import Entry

    return [Entry.from_patch(p, "api", p.source, None) for p in declare.iter_registry()]


def stamp_path(root: str, site_key: tuple[int, int, int], path_len: int) -> str:
    """The file the .pth line checks (keep in step with importpatch/_pth.py)."""
    mtime_ns, ctime_ns, inode = site_key
    return os.path.join(root, "s", f"{mtime_ns}-{ctime_ns}-{inode}-{path_len}")


def _write_stamp(index: Any, entries: list[Entry], chosen: list[Entry] | None = None) -> None:
    """Write the .pth line's stamp when its key covers everything (see the module docstring):
    empty when nothing is on; else (``chosen``: patches on by default only, none broken) the
    top-level packages they target, one per line, which the line then waits for."""
    from importpatch import config, safefiles

    if _pth is None or index.entry_points or index.path is None:
        return
    chosen = chosen or []
    if any(e.unsure or (e.default and e not in chosen) for e in entries):
        return
    tops = sorted({m.partition(".")[0] for e in chosen for group in e.modules for m in group})
    if chosen and (not tops or any(e.error or not e.modules for e in chosen)):
        return
    raw = config.get(os.environ, config.CACHE_DIR)
    if raw:  # a cache folder of its own (a cache volume): the .pth line looks there if absolute
        root = safefiles.usable_root()
        if root is None or not os.path.isabs(raw) or os.path.normpath(raw) != root:
            return
    else:
        root = config.default_cache_root()[0]
        if root is None or root != safefiles.usable_root():
            return
    watch: list[str] = []  # folders beside the site folder (PYTHONPATH), watched by the line
    if not _site_key_covers(None if chosen else watch):
        return
    _, site_key, path_len = _pth
    path = stamp_path(root, site_key, path_len)
    data = stamp_bytes("", "", tops) if tops else watch_stamp_bytes(watch) if watch else b""
    if data is not None and safefiles.folder(root, "s", "") is not None:
        safefiles.write_atomic(path, data)


def watch_stamp_bytes(folders: list[str]) -> bytes | None:
    """The nothing-on stamp where folders beside the site folder could bring a patch package (a
    PYTHONPATH): "W", sys.path as the .pth line saw it, the ctime of each folder ("-1" where it
    does not exist), the check; the .pth line compares all of it with a ``stat`` a folder
    (importpatch/_pth.py). A new distribution in such a folder changes its ctime (and mtime). None
    where a folder's name cannot be written in it or it changed within the clock's resolution."""
    from importpatch import sites
    from importpatch.discover import catalog

    site_path = sites.site_path or []
    if any(c in p for p in [*folders, *site_path] for c in "\n\t\0"):
        return None
    if catalog.is_racy(catalog.signature(tuple(folders)), __import__("time").time_ns()):
        return None
    lines = []
    for folder in folders:
        try:
            st = os.stat(folder)
            lines.append(f"{st.st_ctime_ns}\t{folder}")
        except OSError:
            lines.append(f"-1\t{folder}")
    body = "\0".join(("W", "\n".join(site_path), "\n".join(lines))).encode(
        "utf-8", "surrogateescape")
    return body + b"\0" + stamp_check(body)


def stamp_check(body: bytes) -> bytes:
    """The check of a stamp's body, as ``_pth_on.stamp_check`` computes it (and the .pth line,
    inline): keep the three in step. (Not imported from there: _pth_on imports this module.)"""
    return b"%d" % (int.from_bytes(body, "little") % 1073741789)


def stamp_bytes(text: str, watched: str, tops: list[str]) -> bytes:
    """A listing or enabled stamp: the variables' text ("" for patches on by default), the
    watched paths' signature lines, ``sys.path`` as site left it here, the packages to wait for,
    each NUL-separated, then the check of all of it (importpatch/_pth_on.py reads it: a waiting
    process whose sys.path differs starts at once)."""
    from importpatch import sites

    body = "\0".join((text, watched, "\n".join(sites.site_path or ()), " ".join(tops))).encode(
        "utf-8", "surrogateescape")
    return body + b"\0" + stamp_check(body)


def _site_key_covers(watch: list[str] | None = None) -> bool:
    """Whether the .pth line's site key (its site folder's mtime, ctime and inode, the length of
    sys.path when it ran) covers the whole search path this process ended with: nothing came
    after the line, no folder can gain a distribution without changing the site folder, none
    that does not exist yet can join (see the module docstring). ``watch``: a list to which
    the folders beside the site folder (PYTHONPATH, existing or not) are added instead, for a
    stamp that watches them."""
    from importpatch import sites
    from importpatch.discover import catalog

    if _pth is None or _before_site:
        return False  # (a start before site finished: the search path is not whole yet)
    sitedir, site_key, path_len = _pth
    site_path = sites.site_path or []
    if len(site_path) != path_len or sites.user_site_if_enabled() not in (None, *site_path):
        return False  # folders came after the .pth line ran, or the user site may appear
    static = _stdlib_folders()
    for folder in sites.search_path():
        if folder != os.path.abspath(sitedir) and os.path.realpath(folder) not in static:
            if watch is None:
                return False
            watch.append(folder)
    for entry in site_path:  # a folder that does not exist yet (PYTHONPATH) joins it on appearing
        folder = os.path.abspath(entry or os.curdir)
        if not os.path.exists(folder) and os.path.realpath(folder) not in static:
            if watch is None:
                return False
            watch.append(folder)
    if _later_pth_names_a_missing_folder(sitedir):
        return False
    now = catalog.signature((sitedir,))
    mtime_ns, ctime_ns, _, inode = now[0]
    racy = catalog.is_racy(now, __import__("time").time_ns())
    return (mtime_ns, ctime_ns, inode) == site_key and not racy


# The variables an enabled start may wait with (importpatch/_pth_on.py reads the same list; each
# also in its VLLM_ spelling): any other importpatch variable (a log, an events folder, strict
# mode, a discovery limit) or VLLM_CUSTOM_PATCHES wants the hook running from the start.
WAIT_VARS = ("IMPORTPATCH_ENABLE", "IMPORTPATCH_DISABLE", "IMPORTPATCH_PATH",
             "IMPORTPATCH_CACHE_DIR")


def enabled_key(environ: Mapping[str, str]) -> str | None:
    """The text of the variables an enabled stamp is for, as the .pth line computes it (keep in
    step with importpatch/_pth_on.py), or None where a variable beyond ``WAIT_VARS`` is set."""
    items = sorted((k, v) for k, v in environ.items()
                   if "IMPORTPATCH_" in k or k == "VLLM_CUSTOM_PATCHES")
    if not items or any(k.removeprefix("VLLM_") not in WAIT_VARS for k, _ in items):
        return None
    return "".join(f"{k}={v}\n" for k, v in items)


def enabled_stamp_name(site_key: tuple[int, int, int], path_len: int, text: str) -> str:
    """``e-<mtime>-<ctime>-<inode>-<length of sys.path>-<length>-<byte sum of the text>``; the
    file holds the text itself, so two sets of variables with one name only overwrite each
    other's stamp (keep in step with importpatch/_pth_on.py)."""
    raw = text.encode("utf-8", "surrogateescape")
    mtime_ns, ctime_ns, inode = site_key
    return f"e-{mtime_ns}-{ctime_ns}-{inode}-{path_len}-{len(raw)}-{sum(raw)}"


def _write_enabled_stamp(index: Any, entries: list[Entry], chosen: list[Entry]) -> None:
    """Where patches are on by variables (``WAIT_VARS`` only, no problem reported): the stamp
    that lets the .pth line of the next process with exactly these variables wait for the first
    import of a package the chosen patches target, as long as every path the index watched has
    the ctime it has now. Its text: the variables, NUL, the watched paths (``watched_field``),
    NUL, sys.path, NUL, the packages. Never written where it could
    let a target be imported before the hook: a package already imported here (by site, or
    before the hook), an entry point of ``importpatch.patches`` (an ordinary import a warm
    process makes), a declaration cut off by the time limit, a broken or unsure patch."""
    from importpatch import config, safefiles
    from importpatch.discover import catalog

    text = enabled_key(os.environ)
    if _pth is None or text is None or "\0" in text:
        return  # (no _pth: a process that waited, or started without the .pth line)
    if index.timeouts or index.entry_points or index.path is None:
        return
    if any(e.error or not e.modules for e in chosen) or any(e.unsure for e in entries):
        return
    if not chosen and any(e.error for e in entries):
        return  # (nothing on: every broken file must be said again, by the hook)
    tops = sorted({m.partition(".")[0] for e in chosen for group in e.modules for m in group})
    if (chosen and not tops) or any(t in sys.modules for t in tops):
        return
    # The root the .pth line looks in, spelled as it spells it (it puts a "/" in front).
    raw = config.get(os.environ, config.CACHE_DIR) or (
        (os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) + "/importpatch")
    root = safefiles.usable_root()
    if root is None or not os.path.isabs(raw) or os.path.normpath(raw) != root:
        return
    if any(c in p for p in index.watched for c in "\n\t\0") or not _site_key_covers():
        return
    sig = index.sig if index.sig is not None else catalog.signature(index.watched)
    if catalog.is_racy(sig, __import__("time").time_ns()):
        return  # a path changed within the clock's resolution: its next change may not show
    data = stamp_bytes(text, watched_field(index.watched, sig), tops)
    path = os.path.join(root, "s", enabled_stamp_name(_pth[1], _pth[2], text))
    if safefiles.folder(root, "s", "") is None or safefiles.read_owned(path) == data:
        return
    safefiles.write_atomic(path, data)


def watched_field(paths: tuple[str, ...], sig: tuple[tuple[int, int, int, int], ...]) -> str:
    """The watched paths of an enabled stamp, as ``_pth_on.watched_unchanged`` checks them in
    every process with these variables: the paths that exist, one a line; TAB; those that do
    not; TAB; the hex of the marshalled list of the first ones' ctimes (``sig``: the index's
    (mtime, ctime, size, inode) of each path, -1s where missing). No name holds a newline, tab
    or NUL (the caller's check)."""
    import marshal

    present = [(path, ctime) for path, (_, ctime, _, _) in zip(paths, sig, strict=True)
               if ctime != -1]
    absent = [path for path, (_, ctime, _, _) in zip(paths, sig, strict=True) if ctime == -1]
    ctimes = marshal.dumps([ctime for _, ctime in present]).hex()
    return "\t".join(("\n".join(path for path, _ in present), "\n".join(absent), ctimes))


def _write_targets(entries: list[Entry]) -> None:
    """Keep ``targets_path`` up to date: what every known patch targets, for the imports that
    fail closed when the hook cannot start (see _fails_closed). Called where the index was
    rebuilt (never on the warm path); written only when it changed."""
    from importpatch import config, safefiles

    root = config.default_cache_root()[0]
    if _pth is None or root is None:
        return
    if root != safefiles.usable_root() and safefiles.check_root(root) is not None:
        return  # (IMPORTPATCH_CACHE_DIR elsewhere: the .pth line looks in the default root)
    tops = sorted({m.partition(".")[0] for e in entries for group in e.modules for m in group})
    path = targets_path(root, _pth[0])
    if path is None or _read_names(path) == tops:
        return
    if safefiles.folder(root, "s", "") is not None:
        safefiles.write_atomic(path, "".join(t + "\n" for t in tops).encode("utf-8"))


def _later_pth_names_a_missing_folder(sitedir: str) -> bool:
    """Whether a ``.pth`` file that site reads after ours names a folder that does not exist
    (yet): site adds it once it appears, which changes neither the site folder nor the length of
    sys.path when our line runs, so no stamp key could see it. (A folder that exists is on the
    search path, checked by the caller; so is what an import line added.)"""
    import stat

    try:
        names = sorted(n for n in os.listdir(sitedir) if n.endswith(".pth")
                       and not n.startswith(".") and n > PTH_NAME)  # site's order
    except OSError:
        return True
    for name in names:
        path = os.path.join(sitedir, name)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # never open a FIFO (site would hang)
                return True
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return True
        for line in lines:  # site.addpackage's reading of a line
            if line.startswith(("#", "import ", "import\t")) or not line.strip():
                continue
            if not os.path.exists(os.path.join(sitedir, line.rstrip())):
                return True
    return False


PTH_NAME = "importpatch.pth"  # bootstrap/importpatch.pth, as pip installs it


def _stdlib_folders() -> set[str]:
    import sysconfig

    paths = sysconfig.get_paths()
    out = set()
    for key in ("stdlib", "platstdlib"):
        if key in paths:
            out.add(os.path.realpath(paths[key]))
            out.add(os.path.realpath(os.path.join(paths[key], "lib-dynload")))
    # The zip of the standard library that the interpreter lists whether or not it exists.
    version = f"{sys.version_info[0]}{sys.version_info[1]}"
    out.add(os.path.realpath(os.path.join(sys.base_prefix, "lib", f"python{version}.zip")))
    out.add(os.path.realpath(os.path.join(sys.base_prefix, f"python{version}.zip")))  # Windows
    return out
