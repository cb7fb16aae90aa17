"""Bytecode cache for patched modules, and the one folder the project writes to.

vLLM starts 3-4 interpreters per engine and each would compile every patched module again
(~3.5 ms per 1,000 lines, against ~0.1 ms to load a cached code object). Entries live under
``<root>/code/`` where ``<root>`` is ``config.cache_root()``: ``$IMPORTPATCH_CACHE_DIR``, else
``$XDG_CACHE_HOME/importpatch``, else ``~/.cache/importpatch``.

Invariants:
- The key is a 128-bit hash over everything that changes the compiled code: the original source
  bytes, the content of every applied code operation in the order it is applied (diff hunks; an
  AST transform's defining file, its place there, closure values and defaults), the targeted
  names, the interpreter's magic number and optimisation level, the project's version, the module
  name, its file and the root (the code's file name is one of them). Patch *names*, toggles, log
  settings and replacement objects are not in it: they do not change the code (replacements are
  looked up when the module executes). A transform is keyed by the whole text of the file that
  defines it, so a change to a helper *in another file* that it calls is not seen: change the
  transform's file too (or set ``IMPORTPATCH_NO_CACHE=1`` while developing). A transform whose
  file cannot be read, or whose closure holds objects (not plain values), has no key (b""): it
  is compiled every time rather than risk a stale entry.
- The hash is SipHash-1-3 (``_imp.source_hash``): the source bytes get one 64-bit hash, exactly
  the check CPython trusts for checked hash-based .pyc files; the key material two (128 bits).
  No ``hashlib`` import on the path of every patched import, ~3x faster than SHA-256, and a cache
  folder only its owner can write needs no defence against forged entries.
- An entry is written to a temporary name in the same folder and moved into place with
  ``os.replace``, so a reader sees a whole entry or none; concurrent writers of one key write the
  same bytes.
- On read the header (format, magic number, key), the payload size and the payload's CRC-32 are
  checked; a corrupt, truncated, empty or foreign entry is ignored (and rewritten by the store
  that follows the compile).
- The root must be a folder that only the current user can write (a cache file is code that will
  run): a group- or world-writable or foreign-owned root is refused and the loader compiles
  without a cache; so does a read-only root. Reported once per process, and only where a patched
  module is compiled (a process that patches nothing stays silent).
- Nothing here ever touches a package's own ``__pycache__``.
"""

from __future__ import annotations

import _imp
import _thread
import marshal
import os
import stat
import sys
import zlib

from . import config, events

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import CodeType

    from .declare import Op

FORMAT = b"IPC2"
_KEY_LEN = 16
_HEADER = len(FORMAT) + 4 + _KEY_LEN + 8 + 4  # format, magic number, key, payload size, crc32
_SIPHASH_KEYS = (0x1F0C_5E7A_23D1_9B46, 0x6A2B_8C3D_4E5F_7081)  # any two distinct C longs
_CodeType = type((lambda: 0).__code__)
_root_checked = False
_root: str | None = None
_root_problem: str | None = None


def enabled() -> bool:
    return not config.is_truthy(config.get(os.environ, config.NO_CACHE))


def usable_root(*, report: bool = False) -> str | None:
    """The cache root if it is safe and writable, else None. ``report``: say why, once per
    process (the loader of a patched module asks so; start-up and discovery stay silent)."""
    global _root_checked, _root, _root_problem
    if not _root_checked:
        root = config.cache_root()
        _root_problem = _check_root(root)
        _root = None if _root_problem else root
        _root_checked = True
    if report and _root_problem:
        events.warn_once("cache-root", _root_problem + "; compiling without the bytecode cache")
    return _root


def reset() -> None:
    """Forget the checked root (tests and late activation change the environment)."""
    global _root_checked, _root, _root_problem
    _root_checked, _root, _root_problem = False, None, None


def _check_root(root: str) -> str | None:
    """Why ``root`` must not hold code that will run, or None when it is fine."""
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        st = os.stat(root)
    except OSError as exc:
        return f"cache folder {root} unusable ({exc})"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return (
            f"cache folder {root} is owned by another user (uid {st.st_uid}); refused "
            f"(set {config.CACHE_DIR} to a folder of your own)"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"cache folder {root} is writable by others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"refused (chmod go-w it, or set {config.CACHE_DIR})"
        )
    if not os.access(root, os.W_OK):
        return f"cache folder {root} is read-only"
    return None


def _hash(data: bytes) -> bytes:
    return b"".join(_imp.source_hash(k, data) for k in _SIPHASH_KEYS)


def _part(data: bytes) -> bytes:
    return len(data).to_bytes(8, "little") + data


def op_fingerprint(op: Op) -> bytes | None:
    """What a diff or transform contributes to the compiled code (never its patch's name); None
    when that cannot be known."""
    if op.kind == "diff":
        assert op.file_patch is not None
        return repr(op.file_patch.hunks).encode()
    if op.kind == "field":  # the inserted text; a default that is not a literal is looked up
        from .fields import fingerprint

        return fingerprint(op)
    # A transform may use anything its module defines: the whole text of the defining file, which
    # function of it, and the values in its closure and defaults. Code in *other* files that it
    # calls is not seen (see the module docstring).
    fn = op.obj
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    try:
        with open(code.co_filename, "rb") as f:
            file_text = f.read()
        cells = (c.cell_contents for c in fn.__closure__ or ())
        values = (fn.__defaults__, fn.__kwdefaults__, *cells)
        if any(isinstance(v, (set, frozenset)) for v in values):
            return None  # iteration order, and so the bytes, change with the hash seed
        # Marshal version 2 writes no back-references, so equal values give equal bytes in every
        # process; a function or object in the closure raises ValueError: not cached then.
        extra = marshal.dumps(values, 2)
    except (OSError, ValueError):
        return None
    where = f"{code.co_filename}\0{code.co_firstlineno}\0{code.co_name}".encode(
        "utf-8", "surrogateescape"
    )
    return _part(where) + _part(extra) + _part(file_text)


def key(
    module: str, source: bytes, ops: Iterable[Op], qualnames: list[str], root: str | None,
    origin: str | None = None,
) -> bytes:
    """The cache key of ``module`` built from ``source`` with ``ops``; b"" for uncacheable."""
    from importlib.util import MAGIC_NUMBER

    from . import __version__

    # Same order as transforms.patch_text: diffs, transforms, fields, each by patch name.
    rank = {"diff": 0, "transform": 1, "field": 2}
    code_ops = sorted(
        (op for op in ops if op.kind in rank), key=lambda op: (rank[op.kind], op.patch.name),
    )
    material = [
        FORMAT, MAGIC_NUMBER, str(sys.flags.optimize).encode(), __version__.encode(),
        module.encode(), (origin or "").encode("utf-8", "surrogateescape"),
        (root or "").encode("utf-8", "surrogateescape"),
        _imp.source_hash(_SIPHASH_KEYS[0], source),  # 64 bits, as CPython's checked .pyc files
        "\0".join(sorted(qualnames)).encode(),
    ]
    for op in code_ops:
        fp = op_fingerprint(op)
        if fp is None:
            return b""
        material.append(_hash(fp))
    return _hash(b"".join(_part(m) for m in material))


def _path(root: str, key: bytes) -> str:
    hexkey = key.hex()
    return os.path.join(root, "code", hexkey[:2], hexkey[2:] + ".ipc")


def load(
    root: str | None, key: bytes, original: str = ""
) -> tuple[CodeType, set[str], str] | None:
    """The entry for ``key`` (code, unseen names, patched text), or None when there is none or
    it fails any check. ``original``: the module's text, for entries stored without text."""
    if root is None or len(key) != _KEY_LEN:
        return None
    from importlib.util import MAGIC_NUMBER

    try:
        with open(_path(root, key), "rb") as f:
            data = f.read()
    except OSError:
        return None
    end = len(FORMAT) + 4 + _KEY_LEN
    if (
        len(data) < _HEADER
        or data[: len(FORMAT)] != FORMAT
        or data[len(FORMAT) : len(FORMAT) + 4] != MAGIC_NUMBER
        or data[len(FORMAT) + 4 : end] != key
        or int.from_bytes(data[end : end + 8], "little") != len(data) - _HEADER
        or zlib.crc32(memoryview(data)[_HEADER:]).to_bytes(4, "little") != data[end + 8 : _HEADER]
    ):
        return None
    try:
        code, unseen, text = marshal.loads(memoryview(data)[_HEADER:])
    except Exception:  # marshal raises EOFError, ValueError, TypeError on bad data
        return None
    if text is None:
        text = original
    if not isinstance(code, _CodeType) or not isinstance(text, str):
        return None
    return code, set(unseen), text


def store(
    root: str | None, key: bytes, code: CodeType, unseen: set[str], text: str, original: str = ""
) -> bool:
    """Write the entry for ``key`` atomically; False when it could not be written (logged once).
    The patched ``text`` is stored only where it differs from ``original`` (replace / wrap / add
    leave the text alone): a third less to read and check on every import."""
    if root is None or len(key) != _KEY_LEN:
        return False
    from importlib.util import MAGIC_NUMBER

    payload = marshal.dumps((code, tuple(sorted(unseen)), None if text == original else text))
    header = FORMAT + MAGIC_NUMBER + key + len(payload).to_bytes(8, "little")
    path = _path(root, key)
    # Unique per writer: processes (pid) and threads (ident) never share a temporary file.
    tmp = f"{path}.{os.getpid()}-{_thread.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as f:
            f.write(header + zlib.crc32(payload).to_bytes(4, "little") + payload)
        os.replace(tmp, path)
        return True
    except OSError as exc:
        events.warn_once("cache-write", f"cannot write the bytecode cache under {root}: {exc}")
        import contextlib

        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
