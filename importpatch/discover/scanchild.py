"""Discovery under a time limit (catalog.scan_bounded): the declarations run in a child Python
process (the same interpreter, site and search path) that reports each declaration as it begins
and ends, then sends what it found. Imported only where the index is rebuilt: the warm path never
loads this module.

The child runs ``catalog.scan_for_parent``, which drives the scan with the helpers below
(``child_start``, ``child_progress``, ``child_done``): this module never imports the catalog.

The parent blames the declaration that was running when the limit passed (or when the child ended
without a result), kills the child, and scan_bounded starts it again with that source recorded
broken and not executed. The child also streams each source's entries as it finishes
(``child_report``): a child killed by a signal (the OOM killer), or that failed outside any
declaration, leaves what it finished (``Ended``), and only the rest is broken; a kill is retried by
the next process, never recorded. The child never outlives the parent (it reads a pipe the parent
holds open, and exits at its end) and ignores SIGINT (the parent decides what a Ctrl-C does).
Its output is not the user's: stdout goes nowhere, and of stderr only importpatch's own lines are
passed on (vLLM's log lines, printed while a patch package imports it, are not).
"""

from __future__ import annotations

import marshal
import os
import sys
import time

from importpatch import config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import Any

    # What the child found: entries (as tuples), watched files, entry points, imported_by.
    Found = tuple[list[tuple[Any, ...]], list[str], int, dict[str, str]]


def _frame(obj: Any) -> bytes:
    data = marshal.dumps(obj)
    return len(data).to_bytes(4, "big") + data


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def scan_in_child(
    folders: list[tuple[str, str]], dirs: list[str], user_site: str | None,
    skipped: dict[str, str], limit: float, watch: AbstractContextManager[Any],
    reuse: dict[str, Any] | None = None, bases: dict[str, Any] | None = None,
) -> Found | Ended | None:
    """The scan's result from a child process; or, where it ended without one, what it had
    streamed and how it ended (``Ended``); or None when no child could be started. ``watch``:
    held while waiting (the catalog's Ctrl-C watch). ``reuse``: the patch packages' records of
    the last scan (``catalog._reused``), sent to the child; ``bases`` gets this scan's."""
    import select
    import subprocess

    env = dict(os.environ)
    env[config.SCANNER] = "1"
    env[config.DISCOVERING] = str(os.getpid())
    request = _frame((folders, dirs, user_site, skipped, list(sys.path), reuse or {}))
    to_child, from_parent = None, None
    try:
        from_parent, to_child = os.pipe()
        from_child, to_parent = os.pipe()
    except OSError:
        for fd in (from_parent, to_child):
            if fd is not None:
                os.close(fd)
        return None
    # The catalog is this module's sibling (named so, the code string needs no import of it).
    code = f"import {__package__}.catalog as c; c.scan_for_parent({from_parent}, {to_parent})"
    flags = [f for f, on in (("-I", sys.flags.isolated), ("-E", sys.flags.ignore_environment),
                             ("-s", sys.flags.no_user_site)) if on]
    # What declarations print (vLLM's log lines while a patch package imports it, a patch's own
    # print) is not this process's output: a user who ran `python -c pass` or pip sees none of
    # it. The child's stdout goes nowhere, its stderr to a file of which only importpatch's own
    # lines are passed on (``_forward``); a pipe could fill and stall the child.
    try:
        import tempfile

        errors: Any = tempfile.TemporaryFile()  # noqa: SIM115 (closed by _forward, below)
    except OSError:
        errors = subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            [sys.executable, *flags, "-c", code], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=errors,
            pass_fds=(from_parent, to_parent), close_fds=True)
    except (OSError, ValueError, subprocess.SubprocessError):
        for fd in (from_parent, to_child, from_child, to_parent):
            os.close(fd)
        if errors is not subprocess.DEVNULL:
            errors.close()
        return None
    os.close(from_parent)
    os.close(to_parent)
    stack: list[str] = []
    buf = b""
    heard = False  # the child said hello: it runs importpatch (else scan here, as before)
    ended = Ended()  # what the child streamed so far: kept when it dies
    try:
        with watch:  # a real Ctrl-C while we wait stops this process (see _boot)
            _write_all(to_child, request)
            # A limit of 0 is none: the declarations still run in the child (the process that
            # builds the index never imports what they import), for as long as they take.
            deadline = time.monotonic() + limit if limit > 0 else float("inf")
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    if not heard:
                        return None
                    ended.blame = stack[0] if stack else None
                    ended.why = f"ran longer than {limit:g} s"
                    ended.how = f"it ran longer than {limit:g} s" + (
                        "" if stack else " outside any declaration")
                    ended.timed_out = True
                    return ended
                if not select.select([from_child], [], [], min(left, 3600.0))[0]:
                    continue
                chunk = os.read(from_child, 1 << 16)
                if not chunk:
                    if not heard:
                        return None
                    code_ = proc.wait()
                    ended.blame = stack[0] if stack else None
                    ended.why = f"ended the process (exit {code_})"
                    ended.how = ended.failed or _how_it_ended(code_)
                    ended.signal = -code_ if code_ < 0 else None
                    return ended
                buf += chunk
                while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                    size = int.from_bytes(buf[:4], "big")
                    msg, buf = marshal.loads(buf[4:4 + size]), buf[4 + size:]
                    if msg[0] == "hello":
                        heard = True
                    elif msg[0] == "begin":
                        stack.append(msg[1])
                    elif msg[0] == "end":
                        if stack:
                            stack.pop()
                    elif msg[0] == "source":  # one source finished: its entries
                        _, source, rows, imported, watched = msg
                        ended.finished[source] = list(rows)
                        ended.last = source
                        for module, by in imported:
                            ended.imported_by.setdefault(module, by)
                        ended.watched.extend(watched)
                    elif msg[0] == "basis":  # what a patch package's declaration read
                        if bases is not None:
                            bases[msg[1]] = msg[2]
                    elif msg[0] == "listed":  # the patch packages' entry points
                        ended.listed = list(msg[1])
                    elif msg[0] == "failed":  # the scan itself raised (not patch code)
                        ended.failed = f"it raised {msg[1]}"
                    else:
                        rows, watched, entry_points, imported_by = msg[1:]
                        return (list(rows), list(watched), entry_points, dict(imported_by))
                    if limit > 0:
                        deadline = time.monotonic() + limit
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(to_child)
        os.close(from_child)
        if errors is not subprocess.DEVNULL:
            _forward(errors)


# How importpatch's own lines begin (events.warn_once, _boot._fail): the only child output the
# user is shown. Patch code's output (and that of what it imports) is dropped.
OWN_LINE = b"importpatch: "
FORWARD_MAX_BYTES = 1 << 20  # a declaration that floods stderr does not flood this process


def _forward(errors: Any) -> None:
    """Pass importpatch's own lines of the child's stderr on to this process's stderr."""
    try:
        errors.seek(0)
        data = errors.read(FORWARD_MAX_BYTES)
        errors.close()
        own = b"".join(line for line in data.splitlines(keepends=True)
                       if line.startswith(OWN_LINE))
        if own:
            sys.stderr.write(own.decode("utf-8", "replace"))
            sys.stderr.flush()
    except Exception:  # noqa: S110 (stderr closed or replaced: nothing to say it on)
        pass


class Ended:
    """A discovery child that ended without its result (it died, or the limit passed): whom to
    blame (the outermost declaration running then, or None), why (as the blame is worded), how
    (for a user), the signal that killed it, and what it had finished: entries (as tuples) by
    source, the modules they imported, the paths they watch, the entry points it listed."""

    def __init__(self) -> None:
        self.blame: str | None = None
        self.why = self.how = ""
        self.signal: int | None = None
        self.timed_out = False
        self.failed = ""
        self.finished: dict[str, list[Any]] = {}
        self.last: str | None = None
        self.imported_by: dict[str, str] = {}
        self.watched: list[str] = []
        self.listed: list[str] | None = None

    @property
    def retried(self) -> bool:
        """A death that says nothing about the patch code (the OOM killer's SIGKILL, a SIGTERM
        or SIGINT sent to the child, the limit passing outside any declaration): the next
        process discovers again, rather than recording a healthy patch broken until it changes."""
        import signal

        return (self.signal in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
                or (self.timed_out and self.blame is None))


def _how_it_ended(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"it exited with status {code}"


# A declaration cut off by the time limit is retried by the first start after this many times
# the limit (doubling with each consecutive cut-off, at most a day), and at once by a process
# whose limit is higher than the one it was cut off under: a slow machine is not a broken patch.
RETRY_AFTER_LIMITS = 15
RETRY_AFTER_MAX_S = 86400.0


def timeout_records(
    entries: list[Any], cut_off: dict[str, float], tries: dict[str, int]
) -> tuple[tuple[str, float, float, int], ...]:
    """The index's records of the declarations cut off in this scan (by source, with the limit
    they ran under): (source, limit, retry_at, tries), which ``catalog._timeouts_due`` reads; the
    entries' errors say when they are retried and what works now. Here, not in the catalog: only
    a rebuild of the index needs it."""
    records = []
    now = time.time()
    for source, limit in cut_off.items():
        count = tries.get(source, 0) + 1
        wait = min(RETRY_AFTER_MAX_S, RETRY_AFTER_LIMITS * limit * 2 ** (count - 1))
        retry_at = now + wait
        records.append((source, limit, retry_at, count))
        when = time.strftime("%H:%M:%S", time.localtime(retry_at))
        for e in entries:
            if e.source == source and e.error and e.error.startswith("did not finish"):
                e.error = (
                    f"did not finish: its declaration ran longer than {limit:g} s (the limit) "
                    "while patches were discovered; it is recorded broken for now. A time-out "
                    f"is not a verdict: the first start after {when} "
                    f"(in {wait:g} s) runs it again, and so does the next start with a higher "
                    f"limit: set {config.DISCOVERY_TIMEOUT} (e.g. to {max(120, 6 * limit):g}, "
                    "or 0 for none) where this machine is slow. A declaration that only "
                    "declares (string targets, no import of what it patches) is fast anywhere"
                )
    return tuple(records)


def child_start(from_parent: int, to_parent: int) -> tuple[Any, ...]:
    """The child's side of ``scan_in_child``, up to the scan (``catalog.scan_for_parent`` runs
    it): ignore SIGINT, read the request, take the parent's search path, say hello, and exit when
    the parent is gone. Returns (folders, dirs, user_site, skipped, reuse)."""
    import _signal  # type: ignore[import-not-found]
    import threading

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # the parent decides what a Ctrl-C does
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
        chunk = os.read(from_parent, 1 << 16)
        if not chunk:
            os._exit(2)
        buf += chunk
    folders, dirs, user_site, skipped, path, reuse = marshal.loads(buf[4:])
    sys.path[:] = path
    _write_all(to_parent, _frame(("hello",)))

    def orphaned() -> None:  # the parent is gone (killed): never outlive it
        while os.read(from_parent, 1 << 16):
            pass
        os._exit(3)

    threading.Thread(target=orphaned, daemon=True).start()
    return folders, dirs, user_site, skipped, reuse


def child_progress(to_parent: int, kind: str, source: str) -> None:
    """Tell the parent a declaration begins or ends (whom to blame when the limit passes)."""
    _write_all(to_parent, _frame((kind, source)))


def child_report(to_parent: int, kind: str, *payload: Any) -> None:
    """Stream to the parent what the scan finished: ("source", source, entries, imported,
    watched) as each source ends, ("listed", sources) once the entry points are listed. A child
    that dies later (the OOM killer) loses only what it had not finished."""
    if kind == "source":
        source, entries, imported, watched = payload
        payload = (source, tuple(e.as_tuple() for e in entries), tuple(imported), tuple(watched))
    _write_all(to_parent, _frame((kind, *payload)))


def child_failed(to_parent: int, what: str) -> None:
    """The scan itself raised (a declaration took away what it needs: ``sys.meta_path`` cleared):
    say so (the parent names it), exit without a traceback on the user's terminal."""
    import contextlib

    with contextlib.suppress(Exception):
        _write_all(to_parent, _frame(("failed", what)))
    os._exit(1)


def child_done(to_parent: int, result: tuple[Any, ...]) -> None:
    """Send the scan's result (entries as tuples, watched, entry points, imported_by); exit."""
    import contextlib

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # patch code may have closed or replaced it
            stream.flush()
    _write_all(to_parent, _frame(("done", *result)))
    os._exit(0)  # not the exit handlers or threads that patch code left behind
