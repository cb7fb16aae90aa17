"""Bytecode cache for patched modules, and the one folder the project writes to.

vLLM starts 3-4 interpreters per engine and each would compile every patched module again
(~3.5 ms per 1,000 lines, against ~0.1 ms to load a cached code object). Entries live under
``<root>/code/`` where ``<root>`` is ``config.cache_root()``.

Invariants:
- The key is a SHA-256 over everything that changes the compiled code: the original source bytes,
  the content of every applied operation (diff hunks, the transform's code, which names land
  where and how), the interpreter's magic number, the project's version, the module name and the
  root (the code's file name lies under it). Patch *names*, toggles and replacement objects are
  not in it: they do not change the code (replacements are looked up when the module executes).
- An entry is written to a temporary name in the same folder and moved into place with
  ``os.replace``, so a reader sees a whole entry or none; concurrent writers of one key write the
  same bytes.
- On read the header (magic, magic number, key), the payload size and the payload's SHA-256 are
  checked; anything else is ignored (and rewritten by the next store).
- The root must be a folder that only the current user can write (a cache file is code that will
  run): a world- or group-writable or foreign-owned root is refused and the loader compiles
  without a cache; so does a read-only root. Either is logged once per process.
- Nothing here ever touches a package's own ``__pycache__``.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import stat

from . import config, events

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import CodeType

    from .declare import Op

FORMAT = b"IPC1"
_HEADER = len(FORMAT) + 4 + 32 + 8 + 32  # format, magic number, key, payload size, payload hash
_root_checked = False
_root: str | None = None


def enabled() -> bool:
    return not config.is_truthy(config.get(os.environ, config.NO_CACHE))


def usable_root() -> str | None:
    """The cache root if it is safe and writable, else None (reason logged once)."""
    global _root_checked, _root
    if not _root_checked:
        _root = _check_root(config.cache_root())
        _root_checked = True
    return _root


def reset() -> None:
    """Forget the checked root (tests and late activation change the environment)."""
    global _root_checked, _root
    _root_checked, _root = False, None


def _check_root(root: str) -> str | None:
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        st = os.stat(root)
    except OSError as exc:
        events.warn_once("cache-root", f"cache folder {root} unusable ({exc}); compiling without cache")
        return None
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        events.warn_once(
            "cache-root", f"cache folder {root} is owned by another user; refused, compiling "
            f"without cache (set {config.CACHE_DIR} to a folder of your own)"
        )
        return None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        events.warn_once(
            "cache-root", f"cache folder {root} is writable by others; refused, compiling without "
            f"cache (chmod go-w it, or set {config.CACHE_DIR})"
        )
        return None
    if not os.access(root, os.W_OK):
        events.warn_once("cache-root", f"cache folder {root} is read-only; compiling without cache")
        return None
    return root


def op_fingerprint(op: Op) -> bytes:
    """What an operation contributes to the compiled code (never its patch's name)."""
    if op.kind == "diff":
        assert op.file_patch is not None
        return repr((op.kind, op.file_patch.hunks)).encode()
    if op.kind == "transform":
        return b"transform" + marshal.dumps(op.obj.__code__)
    # replace/wrap/add only decide where landings go; see landing.site_of.
    return repr((op.kind, op.qualname, op.decorated)).encode()


def key(
    module: str, source: bytes, ops: Iterable[Op], qualnames: list[str], root: str | None
) -> bytes:
    from importlib.util import MAGIC_NUMBER

    from . import __version__

    h = hashlib.sha256()
    for part in (FORMAT, MAGIC_NUMBER, __version__.encode(), module.encode(), (root or "").encode()):
        h.update(len(part).to_bytes(8, "little") + part)
    h.update(hashlib.sha256(source).digest())
    for fp in sorted(op_fingerprint(op) for op in ops):
        h.update(hashlib.sha256(fp).digest())
    h.update(repr(sorted(qualnames)).encode())
    return h.digest()


def _path(root: str, key: bytes) -> str:
    hexkey = key.hex()
    return os.path.join(root, "code", hexkey[:2], hexkey[2:] + ".ipc")


def load(root: str | None, key: bytes) -> tuple[CodeType, set[str], str] | None:
    if root is None:
        return None
    from importlib.util import MAGIC_NUMBER

    try:
        with open(_path(root, key), "rb") as f:
            data = f.read()
    except OSError:
        return None
    if (
        len(data) < _HEADER
        or data[:4] != FORMAT
        or data[4:8] != MAGIC_NUMBER
        or data[8:40] != key
        or int.from_bytes(data[40:48], "little") != len(data) - _HEADER
        or hashlib.sha256(data[_HEADER:]).digest() != data[48:_HEADER]
    ):
        return None
    try:
        code, unseen, text = marshal.loads(data[_HEADER:])
    except (EOFError, ValueError, TypeError):
        return None
    return code, set(unseen), text


def store(root: str | None, key: bytes, code: CodeType, unseen: set[str], text: str) -> bool:
    if root is None:
        return False
    from importlib.util import MAGIC_NUMBER

    payload = marshal.dumps((code, tuple(sorted(unseen)), text))
    data = (
        FORMAT + MAGIC_NUMBER + key + len(payload).to_bytes(8, "little")
        + hashlib.sha256(payload).digest() + payload
    )
    path = _path(root, key)
    tmp = f"{path}.{os.getpid()}.{id(code)}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return True
    except OSError as exc:
        events.warn_once("cache-write", f"cannot write the bytecode cache under {root}: {exc}")
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


