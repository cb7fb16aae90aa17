"""What happened in this process: every patch applied, skipped or failed.

Three outlets, all fed by ``record``:
- stdlib ``logging`` under the ``importpatch`` logger;
- ``IMPORTPATCH_LOG=1``: one line per event on stderr, ``importpatch: applied <patch> to <target>
  (pid N)``;
- ``IMPORTPATCH_EVENTS_DIR=folder``: one JSON line per event appended to
  ``folder/<host>-<pid>.jsonl``; ``importpatch status`` reads them back as a process tree.
``events()`` / ``importpatch.applied()`` return them as dicts, in order.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from typing import Any

_events: list[dict[str, Any]] = []
_once: set[str] = set()
# (patch, target, detail) of each failure recorded here: one failure is one event, though the
# loader and the finder that raises it each record it, and an import tried again fails again.
_failed: dict[tuple[str, str, str], dict[str, Any]] = {}


def _settings() -> tuple[bool, str | None]:
    from importpatch import config

    return config.flag(os.environ, config.LOG), config.get(os.environ, config.EVENTS_DIR)


def record(
    outcome: str, patch: str, target: str, how: str, detail: str = "", *, level: int | None = None,
    chain: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``outcome``: applied | skipped | failed | shadowed | info. ``how``: definition-site,
    after-exec, in-place, source-diff, transform, rebind, unreached, ... ``chain``: a
    replace's or wrap's place among the operations of its target (``activation.link``), kept as
    the event's ``chain`` key.
    A failure already recorded (same patch, target and detail) is not recorded again."""
    if outcome == "failed":
        first = _failed.get((patch, target, detail))
        if first is not None and first["pid"] == os.getpid():  # a fork child records its own
            return first
    event = _event(outcome, patch, target, how, detail)
    if outcome == "failed":
        _failed[(patch, target, detail)] = event
    if chain is not None:
        event["chain"] = chain
    _events.append(event)
    if level is None:  # logging's ERROR, INFO, DEBUG
        level = {"failed": 40, "skipped": 20}.get(outcome, 10)
    line = f"{outcome} {patch} to {target} ({how}) (pid {event['pid']})"
    if chain is not None and chain["length"] > 1:
        line += f" [{chain['position']} of {chain['length']} in its chain, innermost first]"
    if detail:
        line += f": {detail}"
    # Only where logging is in use: importing it (and socket, for the host name) was most of
    # the first patched import's cost in a bare process, and unconfigured logging shows nothing.
    if "logging" in sys.modules:
        _logger().log(level, line)
    to_stderr, folder = _settings()
    # A failure is always shown: PatchError is an ImportError, which callers may swallow.
    if to_stderr or outcome == "failed":
        try:
            sys.stderr.write(f"importpatch: {line}\n")
            sys.stderr.flush()
        except Exception:  # a closed stderr must not break an import
            pass
    if folder:
        _append(folder, event)
    return event


def _event(outcome: str, patch: str, target: str, how: str, detail: str) -> dict[str, Any]:
    return {
        "time": time.time(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": _host(),
        "argv": list(getattr(sys, "orig_argv", sys.argv))[:12],
        "process": _process_name(),
        "outcome": outcome,
        "patch": patch,
        "target": target,
        "how": how,
        "detail": detail,
    }


# -- "started": every process where the hook is active, in the events folder ----------------------
# importpatch status draws the tree of processes from the folder; a process that applied nothing
# (the driver of a vLLM run, an EngineCore whose patches target the Worker) would be missing.

_started: tuple[int, str] | None = None  # (pid, process name) of the last "started" line written
_started_detail = ""
_started_names: dict[str, list[str]] = {}
_fork_hook = False


def process_started(
    how: str, detail: str | None = None, *, requested: list[str] | None = None,
    on: list[str] | None = None,
) -> None:
    """With IMPORTPATCH_EVENTS_DIR set, write a "started" line for this process (patch and target
    empty; not one of ``events()``): once per process, once more when a multiprocessing child
    learns its name (EngineCore_DP0, VllmWorker-0), and again when an activation changes what is
    on. ``how``: start, late, spawn, fork. ``requested``: the names asked for by name
    (IMPORTPATCH_ENABLE, VLLM_CUSTOM_PATCHES), known or not; ``on``: the patches on here. Both
    are keys of the line: ``importpatch status`` gives each requested name its fate."""
    global _started, _started_detail, _fork_hook
    folder = _settings()[1]
    if not folder:
        return
    names = {"requested": requested, "on": on}
    changed = any(v is not None and v != _started_names.get(k) for k, v in names.items())
    _started_names.update({k: v for k, v in names.items() if v is not None})
    if detail is not None:
        _started_detail = detail
    event = _event("started", "", "", how, _started_detail)
    event.update(_started_names)
    if _started == (event["pid"], event["process"]) and not changed:
        return
    _started = (event["pid"], event["process"])
    _append(folder, event)
    if not _fork_hook:
        _fork_hook = True
        os.register_at_fork(after_in_child=_forked)
    if event["process"] == "":  # a spawn child: its name comes with spawn's preparation data
        _when_prepared()


def _when_prepared() -> None:
    """Write the line again once spawn's ``prepare`` has set the process name (before the child
    unpickles its target, so a child that dies there is named too)."""
    import multiprocessing.spawn as spawn  # the child's spawn_main imports it next anyway

    prepare = spawn.prepare
    if getattr(prepare, "__wrapped__", None) is not None:
        return

    def named_prepare(*args: Any, **kwargs: Any) -> Any:
        try:
            return prepare(*args, **kwargs)
        finally:
            process_started("spawn")

    named_prepare.__wrapped__ = prepare  # type: ignore[attr-defined]
    spawn.prepare = named_prepare


def _forked() -> None:
    # In a forked child: nothing is written here (a fork followed by exec, like subprocess's
    # preexec_fn, would leave a line for a process that never ran Python). A child that
    # multiprocessing starts (fork, forkserver) writes its line when it starts its target, named:
    # multiprocessing runs its after-fork callbacks then.
    global _started
    _started = None
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util.register_after_fork(_TOKEN, lambda _: process_started("fork"))


class _Token:
    """Kept alive by this module: multiprocessing's after-fork registry holds weak references."""


_TOKEN = _Token()


def _host() -> str:
    uname = getattr(os, "uname", None)
    if uname is not None:
        return str(uname().nodename)
    import socket

    return socket.gethostname()


def _process_name() -> str:
    """multiprocessing's name for this process (vLLM names them EngineCore_DP0, VllmWorker-0, ...);
    spawn sets it before the child imports anything, so it is right for import-time events."""
    mp = sys.modules.get("multiprocessing")
    if mp is None and "--multiprocessing-fork" in getattr(sys, "orig_argv", ()):
        return ""  # a spawn child before multiprocessing told it its name
    try:
        return str(mp.current_process().name) if mp is not None else "MainProcess"
    except Exception:
        return "?"


_cut: set[str] = set()  # event files of this process whose last line was cut short


def _append(folder: str, event: dict[str, Any]) -> None:
    import json

    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{event['host']}-{event['pid']}.jsonl")
        # O_APPEND: one write per line, so concurrent writers never interleave within a line.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            # A line cut short before (disk full, a file-size limit) is ended first, so that this
            # event does not run on into it (`status` counts the cut one as unreadable).
            line = b"\n" * (path in _cut) + (json.dumps(event, sort_keys=True) + "\n").encode()
            written = os.write(fd, line)
            if written != len(line):
                _cut.add(path)
                raise OSError(f"only {written} of {len(line)} bytes of an event were written")
            _cut.discard(path)
        finally:
            os.close(fd)
    except OSError as exc:
        warn_once(f"events-dir:{folder}", f"cannot write events to {folder}: {exc}")


def _logger() -> logging.Logger:
    import logging

    logger = logging.getLogger("importpatch")
    if not logger.handlers:
        # Without a handler, logging's last resort would print every warning a second time
        # next to our own stderr line; an application's handlers (propagation) still see them.
        logger.addHandler(logging.NullHandler())
    return logger


def warn_once(key: str, message: str) -> None:
    """A problem worth one line per process, not one per import."""
    if key in _once:
        return
    _once.add(key)
    _logger().warning(message)
    try:  # noqa: SIM105 (no contextlib import on this path)
        sys.stderr.write(f"importpatch: warning: {message}\n")
    except Exception:
        pass


def events() -> list[dict[str, Any]]:
    return list(_events)


def applied() -> list[dict[str, Any]]:
    """Events of patches applied in this process whose objects are still in place now. A target
    that something re-assigned since (a ``vllm.general_plugins`` plugin's ``Scheduler.schedule =
    other``) no longer runs the patch: its applied events are left out, and a ``shadowed`` event
    (``events()``) names what is there instead (see ``check_shadowed``)."""
    check_shadowed("check")
    gone = {id(e) for w in _watched.values() if w[4] for e in w[3]}
    return [e for e in _events if e["outcome"] == "applied" and id(e) not in gone]


# -- shadowed: is what a patch set still where it set it? ----------------------------------------
# Each applied replace / wrap / subclass / add / set records the attribute it set and the object
# it left there (``watch``). ``check_shadowed`` compares them with what the attribute holds now:
# on demand (``applied()``, ``importpatch doctor``) and once at exit (atexit), so that the
# events folder says it for ``importpatch status``. Identity tests only; nothing here raises.

# (id(owner), attribute) -> [owner, attribute, object left there, [applied events], what shadows
# it now ("" while in place)]
_watched: dict[tuple[int, str], list[Any]] = {}
_exit_hook = False


def watch(applied_events: list[dict[str, Any]], owner: Any, attr: str) -> None:
    """After ``applied_events`` (the patches of one attribute) were applied: remember what
    ``owner``'s ``attr`` holds now. A later activation that lands on top of them (or a reload)
    watches the same attribute again: the earlier events then share the new object, which
    holds theirs."""
    global _exit_hook
    try:
        store = owner if isinstance(owner, dict) else vars(owner)
        if attr not in store:
            return
        key = (id(owner), attr)
        held = _watched.get(key)
        fresh = {id(e) for e in applied_events}
        earlier = [e for e in held[3] if id(e) not in fresh] if held else []
        _watched[key] = [owner, attr, store[attr], [*earlier, *applied_events], ""]
        if not _exit_hook:
            _exit_hook = True
            import atexit

            atexit.register(_check_at_exit)
    except Exception:  # an owner without a namespace: nothing to watch
        pass


def check_shadowed(how: str) -> list[dict[str, Any]]:
    """Record a ``shadowed`` event (outcome "shadowed", ``how``: "check" or "exit") for each
    applied event whose attribute no longer holds the object its patch left there, once per
    attribute and occupant; returns the shadowed events of this process (all of them, earlier
    ones too). An occupant that wraps the patch's object (``__wrapped__``, or a closure that
    holds it) still runs it: not shadowed."""
    out: list[dict[str, Any]] = []
    for watched in list(_watched.values()):
        try:
            owner, attr, expected, applied_events, said = watched
            store = owner if isinstance(owner, dict) else vars(owner)
            missing = attr not in store
            now = store.get(attr)
            if not missing and (now is expected or _holds_inside(now, expected)):
                watched[4] = ""
                continue
            what = "nothing (the attribute was deleted)" if missing else describe(now)
            if what != said:
                watched[4] = what
                for ev in applied_events:
                    out.append(record(
                        "shadowed", ev["patch"], ev["target"], how,
                        f"shadowed by {what}: {ev['target']} no longer holds the object this "
                        "patch left there (something re-assigned it after the patch applied), "
                        "so the patch does not run there; patch what re-assigns it instead "
                        "(wrap it, or apply that change as a patch)", level=30))
        except Exception:  # a namespace that misbehaves: nothing to say about it
            continue
    return [e for e in _events if e["outcome"] == "shadowed"]


def _check_at_exit() -> None:
    try:  # noqa: SIM105 (no contextlib import on this path)
        check_shadowed("exit")
    except BaseException:  # never a traceback at exit
        pass


def _holds_inside(obj: Any, inner: Any) -> bool:
    """Whether ``obj`` calls ``inner`` visibly: through ``__wrapped__`` links, or a closure cell
    of its function (``orig = C.f; C.f = lambda self: orig(self)`` keeps the patch running)."""
    function = type(_holds_inside)
    for _ in range(8):  # (a chain of __wrapped__ links, as inspect.unwrap follows them)
        func = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
        if func is inner:
            return True
        if type(func) is function and any(_cell(c) is inner for c in func.__closure__ or ()):
            return True
        try:  # the standard link (functools.wraps, wrapt's proxies)
            obj = getattr(func, "__wrapped__", None)
        except Exception:
            return False
        if obj is None:
            return False
    return False


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def describe(obj: Any) -> str:
    """``module:qualname`` of what ``obj`` is (a function, class, method descriptor, property),
    else of its type ("a module:Type object")."""
    inner = obj
    for _ in range(3):
        if isinstance(inner, (staticmethod, classmethod)):
            inner = inner.__func__
        elif isinstance(inner, property) and inner.fget is not None:
            inner = inner.fget
    try:
        if isinstance(inner, type) or callable(inner):
            module, qual = getattr(inner, "__module__", None), getattr(inner, "__qualname__", None)
            if isinstance(module, str) and isinstance(qual, str):
                return f"{module}:{qual}"
    except Exception:
        pass
    kind = type(obj)
    return f"a {kind.__module__}:{kind.__qualname__} object"


# Keys every event line carries ("process" came later: older lines lack it).
EVENT_KEYS = ("time", "pid", "ppid", "host", "argv", "outcome", "patch", "target", "how", "detail")


def read(
    folder: str | os.PathLike[str], *, strict: bool = False
) -> tuple[list[dict[str, Any]], int]:
    """Every event written to ``folder`` by any process, oldest first, and how many lines were not
    events (not JSON, or without the keys). ``strict``: raise ValueError on such a line instead
    (a test reading a finished run wants to know; ``importpatch status`` reads live folders)."""
    import json

    found: list[dict[str, Any]] = []
    bad = 0
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jsonl"):
            continue
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                    if not isinstance(event, dict) or any(k not in event for k in EVENT_KEYS):
                        raise ValueError("missing keys")
                    event["time"] = float(event["time"])
                except (ValueError, TypeError) as exc:
                    if strict:
                        raise ValueError(f"{path}:{number}: not an event: {exc}") from None
                    bad += 1
                    continue
                found.append(event)
    found.sort(key=lambda e: e["time"])
    return found, bad
