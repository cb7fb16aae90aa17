# The start-up check that ``importpatch.pth`` runs in every Python process, in compiled form.
# mypy: disable-error-code="name-defined, used-before-def, has-type"
# ruff: noqa: F821 (the names of the namespace the .pth line executes this in: see below)
#
# Why a module: ``site`` compiles every import line of a ``.pth`` file each time it processes
# it, and a venv processes its site folder twice; compiling is most of what a ``.pth`` line costs
# (an instruction count of ``python -c pass``: 400k instructions for the check written inline,
# against 60k for ``import os``). So the line only loads this module's compiled code (the
# ``.pyc`` pip writes at install) and executes it in its own namespace: site's globals
# (``os``, ``sys``, ``io``, ``addpackage``), addpackage's locals (``sitedir``, ``name``) and the
# line's (``marshal``; ``p``, the path of that ``.pyc``; ``pyc``, the file it read, which this
# code closes: ``python -X dev`` would otherwise warn of it). This code makes the second pass skip
# the file. Without a ``.pyc`` (``pip install --no-compile``, uv; an editable install) the line
# has this module's loader get its code as an import would (which writes the ``.pyc`` where it
# can) and executes that in the same namespace.
#
# Why this shape: every Python process of the environment unmarshals and runs this code, and
# an instruction count (callgrind, ``python -c pass``) prices each part: a code object ~10k
# (so the check is module-level code, not a function), each distinct name or string ~1k, a
# stat call ~5k; a docstring is a string (so these are comments). This module holds only the
# common case, nothing on; anything else loads ``_pth_on`` the same way (see there).
#
# What it checks (the common case ends at the stamp: nothing imported, three stat calls):
# 1. no environment variable whose name contains ``IMPORTPATCH_`` (``IMPORTPATCH_*`` and
#    ``VLLM_IMPORTPATCH_*``, the kill switch ``IMPORTPATCH_OFF`` included) or is
#    ``VLLM_CUSTOM_PATCHES``: one C-level join of the names as the process got them (bytes;
#    ``os.environ`` decodes in Python at every access) and two searches in it
#    (``TORCH_DISPATCH_...`` and other names that merely contain "PATCH" never cost a start-up
#    more than the floor);
# 2. the stamp ``/<$XDG_CACHE_HOME or ~/.cache>/importpatch/s/<mtime>-<ctime>-<inode of the
#    site folder>-<length of sys.path>`` is an empty regular file of ours in a folder of ours
#    that no one else can write (``_boot`` writes it where that key covers everything, see
#    there; the leading "/" keeps a home-less ``~`` from ever meaning a folder under the working
#    folder): nothing is on. (Its parent folder needs no look: whoever can write there can
#    replace ``s`` only with a folder or link that is not ours.)
# Anything else (a stamp that lists packages, variables set, names that are not bytes as on
# Windows) runs ``_pth_on.on``. Nothing here raises (site would print it at every start): a
# failure of the hook is swallowed and the hook reports its own problems; where ``_pth_on``
# itself cannot load while patches may be on, the imports they target fail closed
# (``FAILS_CLOSED``, compiled only then).
#
# Names: module-level code here stores into addpackage's locals (a snapshot site discards);
# none of them is one of addpackage's own (``sitedir``, ``name``, ``fullname``, ``f``, ``n``,
# ``line``, ``st``, ...).

# Where ``_pth_on`` cannot load while patches may be on (a reinstall in progress, a broken
# install), FAILS_CLOSED (compiled only then) makes the imports of the packages they target fail
# (ImportError, with the reason) instead of running unpatched. Known: "vllm" where a variable
# enables patches, the packages a stamp lists (``tops``: the waiting finder's), and those every
# patch of this site folder targets as the hook last wrote them (t-<device>-<inode of the site
# folder>).
FAILS_CLOSED = r'''if 1:
    def fails_closed(exc, tops=frozenset()):
        environ = os.environ
        known = set(tops)
        if size > 0 and not known:
            try:  # the listing stamp's packages (its last field but the check: _pth_on)
                with open(stamp, "rb") as f:
                    listed = f.read().decode("utf-8", "replace").split("\0")[-2:-1]
                known.update(t for t in "".join(listed).split() if t.isidentifier())
            except (OSError, ValueError):
                pass
        if any((environ.get(v) or "").strip() for v in (
                "IMPORTPATCH_ENABLE", "VLLM_IMPORTPATCH_ENABLE", "VLLM_CUSTOM_PATCHES")):
            known.add("vllm")
            try:
                cache = environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
                base = f"/{cache}/importpatch"
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
        if tops:
            raise ImportError(f"importpatch cannot load ({reason}); see above")'''


if __name__ != "importpatch._pth":  # executed by the .pth line (imported: nothing runs)
    try:
        try:  # noqa: SIM105 (contextlib: an import in every process)
            pyc.close()  # the line's open .pyc: one expression, it cannot close what it read
        except NameError:  # (no .pyc: the line took its other way)
            pass
        if getattr(addpackage, "__name__", None) == "addpackage":
            # site processes a venv's site folder twice (venv() and main() both add it): the
            # second pass skips this file only; every other .pth file goes through as before.
            def _addpackage_once(sitedir, pth, known_paths, _add=addpackage, _ours=name):
                # type: (str, str, object, object, str) -> object
                if pth == _ours:
                    return None
                return _add(sitedir, pth, known_paths)  # type: ignore[operator]

            globals()["addpackage"] = _addpackage_once  # site's
        stamp = None
        size = -1
        try:
            environ_bytes = os.environ._data
            names = b" ".join(environ_bytes)  # POSIX: the bytes names, joined in C
        except Exception:
            names = b"IMPORTPATCH_"  # not bytes (Windows): _pth_on decides
        stamps = None
        if b"IMPORTPATCH_" not in names and b"VLLM_CUSTOM_PATCHES" not in names:
            # The cache folder as _boot spells it: $XDG_CACHE_HOME, else
            # os.path.expanduser("~/.cache"), which is $HOME/.cache where HOME is set.
            cache = environ_bytes.get(b"XDG_CACHE_HOME")
            if not cache:
                home = environ_bytes.get(b"HOME")
                cache = (home.rstrip(b"/") + b"/.cache" if home is not None
                         else os.path.expanduser(b"~/.cache"))
            stamps = b"/" + cache + b"/importpatch/s"
        elif names.count(b"IMPORTPATCH_") == 1 and b"VLLM_CUSTOM_PATCHES" not in names:
            # Only a cache folder of its own is set (a cache volume, patches off): its stamps
            # are there (absolute only, as _boot writes them).
            cache = (environ_bytes.get(b"IMPORTPATCH_CACHE_DIR")
                     or environ_bytes.get(b"VLLM_IMPORTPATCH_CACHE_DIR") or b"")
            if cache[:1] == b"/":
                stamps = cache.rstrip(b"/") + b"/s"
        if stamps is not None:
            # mtime alone is shared by site folders that tar, cp -a or a reproducible build
            # made: ctime (set by the kernel, never copied) and inode tell them apart.
            info = os.stat(sitedir)
            stamp = b"%s/%d-%d-%d-%d" % (
                stamps, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, len(sys.path))
            # Only a regular file of ours, in a folder of ours, is a stamp: not a FIFO,
            # /dev/zero, another user's file or link in a shared XDG_CACHE_HOME (lstat: what
            # the link IS, not what it points to); else the hook starts and decides (and says).
            uid = os.getuid()
            try:
                info = os.lstat(stamps)
                if info.st_uid == uid and info.st_mode & 0o170022 == 0o040000:
                    info = os.lstat(stamp)
                    if info.st_uid == uid and info.st_mode & 0o170000 == 0o100000:
                        size = info.st_size
                if 0 < size < 65536:
                    # Nothing on, where folders beside the site folder could bring a patch
                    # package (PYTHONPATH): "W", sys.path as it is here (one entry a line: a
                    # relative PYTHONPATH names other folders elsewhere), then "<ctime>\t<folder>"
                    # of each such folder (-1 where missing: a folder's ctime moves with every
                    # entry added, removed or renamed, and with its replacement), then the check
                    # of the body (_pth_on.stamp_check), NUL-separated (_boot.watch_stamp_bytes).
                    # All equal: nothing on. Anything else: _pth_on (which starts the hook).
                    # (Few names: each distinct one costs every process ~1k instructions;
                    # os.read, not open(): no file objects, 20k fewer.)
                    pyc = os.open(stamp, os.O_RDONLY)
                    try:
                        w_body, _, w_sig = os.read(pyc, 65536).rpartition(b"\0")
                    finally:
                        os.close(pyc)
                    w_kind, w_path, w_sigs = w_body.split(b"\0")
                    if w_kind == b"W" and w_sig == b"%d" % (
                            int.from_bytes(w_body, "little") % 1073741789) and (
                            w_path == "\n".join(sys.path).encode("utf-8", "surrogateescape")):
                        for w_line in w_sigs.split(b"\n"):
                            w_sig, _, w_line = w_line.partition(b"\t")
                            try:
                                if w_sig != b"%d" % os.stat(w_line).st_ctime_ns:
                                    break
                            except OSError:
                                if w_sig != b"-1":
                                    break
                        else:
                            size = 0
            except Exception:  # (a NUL in a variable, a missing folder): the hook decides
                pass
        if size != 0:
            # Something may be on: the rest of the check, compiled as this module is (or
            # imported), executed as the module importpatch._pth_on, registered as an import
            # would register it (it loads importpatch._slot, the slot on sys.meta_path every
            # start path shares, the same way, only where the process waits).
            on_module = type(sys)("importpatch._pth_on")
            scope = on_module.__dict__
            scope.update(os=os, sys=sys, sitedir=sitedir, stamp=stamp, size=size)
            try:
                pyc_dir, _, pyc_tag = p.rpartition("/_pth.")
                if "importpatch._pth_on" in sys.modules:  # (imported already: the only one)
                    scope = sys.modules["importpatch._pth_on"].__dict__
                elif os.path.exists(pyc_dir + "/_pth_on." + pyc_tag):
                    with io.open_code(pyc_dir + "/_pth_on." + pyc_tag) as pyc:
                        on_module.__file__ = pyc_dir.rpartition("/")[0] + "/_pth_on.py"
                        on_module.__package__ = "importpatch"
                        exec(marshal.loads(pyc.read()[16:]), scope)  # noqa: S102
                    sys.modules["importpatch._pth_on"] = on_module
                else:
                    import importpatch._pth_on

                    scope["on"] = importpatch._pth_on.on
            except Exception as exc:
                exec(FAILS_CLOSED, scope)  # noqa: S102 (our own text, above)
                scope["fails_closed"](exc)
            else:
                scope["on"](sitedir, stamp, size, FAILS_CLOSED, scope)
    except Exception:
        pass
