"""Safe file handling, in one place: every rule about reading and writing files that code is run
from, so that the next fix to one of them touches one file.

- ``read_regular(path)``: the bytes of a regular file (a patch file, a helper of a patch folder);
  a FIFO, socket or device put there is refused, and never blocks the read;
- the cache folder: ``usable_root()`` is ``config.cache_root()`` when it is a folder of ours that
  no one else can write (a cache file is code that will run), ``folder(root, ...)`` creates and
  checks (owner, mode 0700) every folder under it before anything in it is trusted, and
  ``read_owned(path)`` reads only a regular file of ours there, non-blocking;
- ``replace_file(path, data)`` (raises) and ``write_atomic(path, data)`` (the cache's: warns):
  a temporary file in the same folder moved into place with ``os.replace``, so a reader sees a
  whole file or none;
- ``decode_source(raw)``: source bytes to text with the declared encoding, line endings kept.

Cheap to import (it runs in every patched process) and never raises out of the cache helpers:
they answer None or False and warn once per process.
"""

from __future__ import annotations

import _thread
import os
import stat
import time

from importpatch import config, events

_root_checked = False
_root: str | None = None
_root_problem: str | None = None
# Entries not read for this long get their mtime refreshed when read: the cache's prune removes
# the least recently used first, and a refresh costs one syscall a day per entry.
_TOUCH_AFTER_S = 86_400


def usable_root(*, report: bool = False) -> str | None:
    """The cache root if it is safe and writable, else None. ``report``: say why, once per
    process (the loader of a patched module asks so; start-up and discovery stay silent)."""
    global _root_checked, _root, _root_problem
    if not _root_checked:
        root = config.cache_root()
        _root_problem = config.default_cache_root()[1] if root is None else check_root(root)
        _root = None if _root_problem else root
        _root_checked = True
    if report and _root_problem:
        events.warn_once("cache-root", _root_problem + "; compiling without the bytecode cache")
    return _root


def root_problem() -> tuple[str | None, str | None]:
    """(the configured root, why it is not used or None): what `importpatch doctor` shows."""
    usable_root()
    return config.cache_root(), _root_problem


def reset() -> None:
    """Forget the checked root (tests and late activation change the environment)."""
    global _root_checked, _root, _root_problem
    _root_checked, _root, _root_problem = False, None, None
    _safe_dirs.clear()


def _unsafe(path: str, st: os.stat_result) -> str | None:
    """Why a folder (or file) of the cache must not be trusted, or None."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return (f"{path} is owned by another user (uid {st.st_uid}); refused "
                f"(set {config.CACHE_DIR} to a folder of your own)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}); refused "
                f"(chmod go-w it and remove what is in it, or set {config.CACHE_DIR})")
    return None


def check_root(root: str) -> str | None:
    """Why ``root`` must not hold code that will run, or None when it is fine."""
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        st = os.stat(root)
    except OSError as exc:
        return f"cache folder {root} unusable ({exc})"
    problem = _unsafe(f"cache folder {root}", st)
    if problem:
        return problem
    if not os.access(root, os.W_OK):
        return f"cache folder {root} is read-only"
    _safe_dirs.add(root)
    return None


# Folders under the root checked in this process (owner and mode; see folder()).
_safe_dirs: set[str] = set()


def folder(root: str, *parts: str) -> str | None:
    """``root/part/.../name``: every folder on the way is created 0700 when missing and checked
    (ours, writable by no one else) before anything in it is trusted; None when one is not fine
    (reported once per process). The last part is a file name ("" for the folder itself)."""
    path = root
    for part in parts[:-1]:
        path = os.path.join(path, part)
        if path in _safe_dirs:
            continue
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
        try:
            st = os.lstat(path)
        except OSError:
            return None
        problem = _unsafe(f"cache folder {path}", st) or (
            None if stat.S_ISDIR(st.st_mode) else f"{path} is not a folder")
        if problem:
            events.warn_once(f"cache-dir:{path}", problem + "; entries under it are ignored")
            return None
        _safe_dirs.add(path)
    return os.path.join(path, parts[-1]) if parts else path


def read_owned(path: str, why: list[str] | None = None) -> bytes | None:
    """The bytes of the cache file ``path`` if it is a regular file of ours that nobody else
    can write; else None (and the reason appended to ``why``)."""
    # O_NONBLOCK: opening a FIFO put where a cache file should be must not wait for a writer
    # (fstat then finds it is not a file); it changes nothing for a regular file.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if why is not None:
            why.append(f"unreadable ({exc.strerror})")
        return None
    try:
        st = os.fstat(fd)
        problem = _unsafe(path, st) or (None if stat.S_ISREG(st.st_mode) else "not a file")
        if problem:
            if why is not None:
                why.append(f"owner or mode: {problem}")
            return None
        with open(fd, "rb", closefd=False) as f:
            data = f.read()
        if st.st_mtime < time.time() - _TOUCH_AFTER_S:
            try:  # noqa: SIM105 (no contextlib at start) LRU order for prune()
                os.utime(fd)
            except OSError:
                pass
        return data
    finally:
        os.close(fd)


def replace_file(path: str, data: bytes, *, mode: int | None = None, private: bool = False
                 ) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``:
    a reader sees the old file or the new one, never half of one. ``mode``: the new file's mode
    (else 0666 less the umask, as ``open`` makes it; ``private``: 0600). Raises OSError, the
    temporary file removed."""
    # Unique per writer: processes (pid) and threads (ident) never share a temporary file.
    tmp = f"{path}.{os.getpid()}-{_thread.get_ident()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0),
                     0o600 if private else 0o666)
        with open(fd, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError:
        try:  # noqa: SIM105 (contextlib costs 15M instructions at start)
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_atomic(path: str, data: bytes) -> bool:
    """``replace_file`` for a file of the cache (0600): False (and one warning per process) when
    it fails."""
    try:
        replace_file(path, data, private=True)
        return True
    except OSError as exc:
        events.warn_once("cache-write", f"cannot write under {os.path.dirname(path)}: {exc}")
        return False


class TooBig(OSError):
    """A file bigger than its reader allows (``read_regular``'s ``limit``); it was not read."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(f"{path} is {size} bytes, more than the {limit} allowed; not read")
        self.path, self.size, self.limit = path, size, limit


def read_regular(path: str, limit: int | None = None, *, head: bool = False) -> bytes:
    """The bytes of ``path`` if it is a regular file (a symlink to one is fine). Never blocks:
    the file is checked before it is opened, opened non-blocking, and checked again. ``limit``:
    never more bytes than that are read: a bigger file raises ``TooBig`` unread, or with
    ``head`` gives its first ``limit`` bytes."""
    kind = not_regular(os.stat(path).st_mode)
    if kind:
        raise OSError(f"{path} is {kind}, not a regular file; not read")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        kind = not_regular(st.st_mode)
        if kind:  # replaced between the two checks
            raise OSError(f"{path} is {kind}, not a regular file; not read")
        if limit is not None and st.st_size > limit and not head:
            raise TooBig(path, st.st_size, limit)
        chunks: list[bytes] = []
        total = 0
        while True:
            want = max(st.st_size, 1 << 16)
            if limit is not None:
                want = min(want, limit + 1 - total)  # one more: tells a file that grew past it
            chunk = os.read(fd, want) if want > 0 else b""
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
            if limit is not None and total > limit:
                if head:
                    return b"".join(chunks)[:limit]
                raise TooBig(path, max(total, os.fstat(fd).st_size), limit)
    finally:
        os.close(fd)


# The most bytes a patch file may have. A patch file is text a person wrote or `git diff`
# printed: the largest real ones (a vLLM port) are a few hundred KiB. A bigger "patch file" is a
# mistake (a core dump, an 8 GB sparse file named .diff), and reading it whole would hold the
# memory of every starting process: it is refused by its size, never read.
MAX_PATCH_FILE_BYTES = 64 << 20


def read_patch_file(path: str) -> bytes:
    """The bytes of a patch file: a regular file (never blocks) of at most
    ``MAX_PATCH_FILE_BYTES``. Raises OSError; one whose message names the file, its size and
    what to do when it is too big (it is then not read at all)."""
    try:
        return read_regular(path, MAX_PATCH_FILE_BYTES)
    except TooBig as exc:
        raise OSError(
            f"{path} is {exc.size / (1 << 30):.1f} GiB ({exc.size} bytes), more than a patch "
            f"file may be ({MAX_PATCH_FILE_BYTES >> 20} MiB), so it is not read: a patch file is "
            "the text of a declaration or a diff. Remove it from the patch folder (or move it "
            "out), or fix what wrote it") from None


def not_regular(mode: int) -> str:
    if stat.S_ISREG(mode):
        return ""
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def decode_source(raw: bytes) -> str:
    """Source bytes to text with the declared encoding, keeping line endings as they are (a CRLF
    file stays CRLF, so diffs made on it still match and the published text is faithful)."""
    import io
    import tokenize

    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    text = raw.decode(encoding)
    return text[1:] if text.startswith("\ufeff") else text
