"""Bytecode cache for patched modules, and the one folder the project writes to.

vLLM starts 3-4 interpreters per engine and each would compile every patched module again
(~3.5 ms per 1,000 lines, against ~0.1 ms to load a cached code object). Entries live under
``<root>/code/`` where ``<root>`` is ``config.cache_root()``: ``$IMPORTPATCH_CACHE_DIR``, else
``$XDG_CACHE_HOME/importpatch``, else ``~/.cache/importpatch``.

Invariants:
- The key is a 128-bit hash over everything that changes the compiled code: the original source
  bytes, the content of every applied code operation in the order it is applied (diff hunks; an
  AST transform's defining file, its place there, closure values and defaults), the targeted
  names and those whose facts are stored with the code (``activation.fact_quals``), the
  interpreter's magic number and optimisation level, the project's version, the module name,
  its file and the root (the code's file name is one of them). Patch *names*, toggles, log
  settings and replacement objects are not in it: they do not change the code (replacements are
  looked up when the module executes). A transform is keyed by the whole text of the file that
  defines it and, for a patch of a patch folder, by the content of every helper of that
  folder (importpatch/discover/folders.py); a change to code *elsewhere* that it calls (another
  package) is not seen: change the transform's file too (or set ``IMPORTPATCH_NO_CACHE=1`` while
  developing). A transform whose
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
import marshal
import os
import sys
import time
import zlib

from importpatch import config, events, safefiles

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import CodeType
    from typing import Any

    from importpatch.discover.declare import Op

FORMAT = b"IPC2"
_KEY_LEN = 16
_HEADER = len(FORMAT) + 4 + _KEY_LEN + 8 + 4  # format, magic number, key, payload size, crc32
_SIPHASH_KEYS = (0x1F0C_5E7A_23D1_9B46, 0x6A2B_8C3D_4E5F_7081)  # any two distinct C longs
_CodeType = type((lambda: 0).__code__)
# A temporary file of write_atomic younger than this belongs to a writer at work: prune() keeps it.
_WRITER_AT_WORK_S = 3600
# The cache is pruned to PRUNE_TO of this size when a new entry makes it bigger (see prune()).
MAX_BYTES = 256 * 1024 * 1024
PRUNE_TO = 0.75
# The modules whose code decides what code a patched module compiles to: a change to any of them
# (an editable checkout, a dev upgrade) must not reuse entries compiled by the old code.
# Paths below the package folder, without ".py" (tests/test_layout.py checks each exists).
PRODUCERS = (
    "install/activation", "rewrite/bindings", "load/bytecache", "discover/declare", "rewrite/diffs",
    "rewrite/fields", "load/finder", "rewrite/landing", "load/publish", "safefiles",
    "rewrite/transforms", "rewrite/pins", "rewrite/facts", "discover/diffparse",
)


def enabled() -> bool:
    """Whether to read and write compiled entries. ``IMPORTPATCH_NO_CACHE`` only: ``python -B``
    and ``PYTHONDONTWRITEBYTECODE`` are about ``.pyc`` files next to the sources, which importpatch
    never writes; its cache lives in its own folder and is used under them too."""
    return not config.flag(os.environ, config.NO_CACHE)


def key_hash(data: bytes) -> bytes:
    return b"".join(_imp.source_hash(k, data) for k in _SIPHASH_KEYS)


def key_part(data: bytes) -> bytes:
    return len(data).to_bytes(8, "little") + data


def op_fingerprint(op: Op) -> bytes | None:
    """What a diff or transform contributes to the compiled code (never its patch's name); None
    when that cannot be known."""
    if op.kind == "diff":
        assert op.file_patch is not None
        return repr(op.file_patch.hunks).encode()
    if op.kind == "field":  # the inserted text; a default that is not a literal is looked up
        from importpatch.rewrite.fields import fingerprint

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
    from importpatch.discover.folders import folder_of, helpers_digest

    folder = folder_of(op.patch.source)  # a patch file's transform may call its folder's helpers
    helpers = helpers_digest(folder) if folder else b""
    return key_part(where) + key_part(extra) + key_part(file_text) + key_part(helpers)


def producers_hash() -> bytes:
    """A hash of the source of the modules in PRODUCERS, computed once per process and kept in
    ``<root>/catalog/producers`` keyed by their stat signature (so a process reads a stat per
    module and one small file, not ~200 KB of source)."""
    global _producers
    if _producers is not None:
        return _producers
    here = os.path.dirname(os.path.abspath(__file__))
    for _ in range(__name__.count(".") - 1):  # this module's package up to importpatch/
        here = os.path.dirname(here)
    files = tuple(os.path.join(here, *f"{name}.py".split("/")) for name in PRODUCERS)
    sig = []
    for f in files:
        try:
            st = os.stat(f)
            sig.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            sig.append((-1, -1, -1))
    root = safefiles.usable_root()
    memo = safefiles.folder(root, "catalog", "producers") if root else None
    if memo is not None:
        data = safefiles.read_owned(memo)
        try:
            files_seen, sig_seen, digest = marshal.loads(data) if data else ((), (), b"")
            if files_seen == files and sig_seen == tuple(sig) and len(digest) == _KEY_LEN:
                _producers = digest
                return digest
        except Exception:
            pass
    parts = []
    for f in files:
        try:
            with open(f, "rb") as fh:
                parts.append(key_part(fh.read()))
        except OSError:
            parts.append(key_part(b""))
    _producers = key_hash(b"".join(parts))
    if memo is not None:
        safefiles.write_atomic(memo, marshal.dumps((files, tuple(sig), _producers)))
    return _producers


_producers: bytes | None = None


def key(
    module: str, source: bytes, ops: Iterable[Op], qualnames: list[str], root: str | None,
    origin: str | None = None, fact_quals: Iterable[str] = (), siblings: bytes = b"",
) -> bytes:
    """The cache key of ``module`` built from ``source`` with ``ops``; b"" for uncacheable.
    ``qualnames`` decide the landings compiled in; ``fact_quals`` the facts stored beside the code
    (an add on ``C`` and a set of ``C.kind`` land on the same name but need different facts).
    ``siblings``: what decides that a multi-file diff applies to its other files (their sources
    and hunks, ``finder.whole_diffs``): an entry is stored only once they were found to apply."""
    from importlib.util import MAGIC_NUMBER

    from importpatch._version import __version__

    # Same order as transforms.patch_text: diffs, transforms, fields, each by patch name.
    rank = {"diff": 0, "transform": 1, "field": 2}
    code_ops = sorted(
        (op for op in ops if op.kind in rank), key=lambda op: (rank[op.kind], op.patch.name),
    )
    material = [
        FORMAT, MAGIC_NUMBER, str(sys.flags.optimize).encode(), __version__.encode(),
        producers_hash(),
        module.encode(), (origin or "").encode("utf-8", "surrogateescape"),
        (root or "").encode("utf-8", "surrogateescape"),
        _imp.source_hash(_SIPHASH_KEYS[0], source),  # 64 bits, as CPython's checked .pyc files
        "\0".join(sorted(qualnames)).encode(),
        "\0".join(sorted(fact_quals)).encode(),
        siblings,
    ]
    for op in code_ops:
        fp = op_fingerprint(op)
        if fp is None:
            return b""
        material.append(key_hash(fp))
    return key_hash(b"".join(key_part(m) for m in material))


def _path(root: str, key: bytes) -> str | None:
    hexkey = key.hex()
    return safefiles.folder(root, "code", hexkey[:2], hexkey[2:] + ".ipc")


def load(
    root: str | None, key: bytes, original: str = "", module: str = ""
) -> tuple[CodeType, set[str], str] | None:
    """The entry for ``key`` (code, unseen names, patched text), or None when there is none or
    it fails any check; why an existing entry was not used is recorded as a debug event.
    ``original``: the module's text, for entries stored without text."""
    if root is None or len(key) != _KEY_LEN:
        return None
    path = _path(root, key)
    if path is None:
        return None
    why: list[str] = []
    data = safefiles.read_owned(path, why)
    if data is None:
        if why:
            _not_used(module, path, why[0])
        return None
    result = _decode(data, key, original, why)
    if result is None:
        _not_used(module, path, why[0])
    return result


def _not_used(module: str, path: str, why: str) -> None:
    events.record("info", "", module, "cache", f"entry {path} not used: {why}", level=10)


def _decode(
    data: bytes, key: bytes, original: str, why: list[str]
) -> tuple[CodeType, set[str], str] | None:
    from importlib.util import MAGIC_NUMBER

    end = len(FORMAT) + 4 + _KEY_LEN
    checks = (
        (len(data) >= _HEADER, "truncated"),
        (data[: len(FORMAT)] == FORMAT, "bad format"),
        (data[len(FORMAT) : len(FORMAT) + 4] == MAGIC_NUMBER, "bad magic number"),
        (data[len(FORMAT) + 4 : end] == key, "bad key"),
        (int.from_bytes(data[end : end + 8], "little") == len(data) - _HEADER, "bad size"),
    )
    for ok, reason in checks:
        if not ok:
            why.append(reason)
            return None
    if zlib.crc32(memoryview(data)[_HEADER:]).to_bytes(4, "little") != data[end + 8 : _HEADER]:
        why.append("bad CRC")
        return None
    try:
        code, unseen, text = marshal.loads(memoryview(data)[_HEADER:])
    except Exception:  # marshal raises EOFError, ValueError, TypeError on bad data
        why.append("bad payload")
        return None
    if text is None:
        text = original
    if not isinstance(code, _CodeType) or not isinstance(text, str):
        why.append("bad payload")
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

    path = _path(root, key)
    if path is None:
        return False
    payload = marshal.dumps((code, tuple(sorted(unseen)), None if text == original else text))
    header = FORMAT + MAGIC_NUMBER + key + len(payload).to_bytes(8, "little")
    entry = header + zlib.crc32(payload).to_bytes(4, "little") + payload
    if not safefiles.write_atomic(path, entry):
        return False
    if usage(root)["bytes"] > MAX_BYTES:
        prune(root, int(MAX_BYTES * PRUNE_TO))
    return True


# -- size and pruning (`importpatch cache`, `doctor`) ---------------------------------------------

AREAS = ("code", "src", "catalog", "s")  # compiled modules, published text, indexes, stamps
# Downloaded release artifacts (importpatch.tools.releases: `rebase`, scripts/eval/drift.py) live
# beside the areas, in <root>/releases. Not an area: the size bound and `prune` never delete them
# (they are not rebuilt, but downloaded again, hundreds of MB each); `importpatch cache` shows
# them apart.
RELEASES = "releases"


def _files(root: str, areas: tuple[str, ...] = AREAS) -> list[tuple[str, str, os.stat_result]]:
    out = []
    for area in areas:
        for base, _, names in os.walk(os.path.join(root, area)):
            for name in names:
                path = os.path.join(base, name)
                try:  # noqa: SIM105 (contextlib costs 15M instructions at start)
                    out.append((area, path, os.lstat(path)))
                except OSError:
                    pass
    return out


def usage(root: str) -> dict[str, Any]:
    """{"files": n, "bytes": n, "areas": {area: {"files", "bytes"}}} of the cache under root."""
    areas = {a: {"files": 0, "bytes": 0} for a in AREAS}
    for area, _, st in _files(root):
        areas[area]["files"] += 1
        areas[area]["bytes"] += st.st_size
    return {"files": sum(a["files"] for a in areas.values()),
            "bytes": sum(a["bytes"] for a in areas.values()), "areas": areas}


def releases_usage(root: str) -> dict[str, Any]:
    """{"folder", "files", "bytes"} of the release artifacts under root (not in ``usage``)."""
    files = _files(root, (RELEASES,))
    return {"folder": os.path.join(root, RELEASES), "files": len(files),
            "bytes": sum(st.st_size for _, _, st in files)}


def prune(root: str, max_bytes: int | None = None, older_than_s: float | None = None
          ) -> tuple[int, int]:
    """Remove compiled entries and published texts, least recently used first, until the cache
    holds at most ``max_bytes`` (and every one not used for ``older_than_s``); indexes and stamps
    are rebuilt on demand and go when older than ``older_than_s``; a writer's temporary file goes
    only when older than an hour. Returns (files, bytes)."""
    files = sorted(_files(root), key=lambda f: f[2].st_mtime)
    total = sum(st.st_size for _, _, st in files)
    removed = freed = 0
    now = time.time()
    for area, path, st in files:
        if path.endswith(".tmp") and st.st_mtime > now - _WRITER_AT_WORK_S:
            continue  # a writer's os.replace would fail (see write_atomic); a crashed one's goes
        old = older_than_s is not None and st.st_mtime < now - older_than_s
        big = max_bytes is not None and total > max_bytes and area in ("code", "src")
        if not (old or big):
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        removed, freed, total = removed + 1, freed + st.st_size, total - st.st_size
    return removed, freed
