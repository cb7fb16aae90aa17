"""Publish patched text so that everyone who reads source by file name reads the patched text.

Triton's ``@jit`` (and its interpreter) read a kernel's source through ``inspect`` and
``linecache`` by the code object's ``co_filename``; tracebacks on 3.11/3.12 read the file from
disk. Measured (shared notes): only a *real file* holding the patched text, used as the code's
``co_filename``, is seen by all of them and survives ``linecache.clearcache()``. So:

- the patched text is written once to a content-addressed file ``<cache>/src/<hash>/<name>.py``
  (atomic: temporary name in the same folder, then ``os.replace``; every folder on the way is
  the user's alone) and compiled under that name; an existing file is used only when its bytes
  are the patched text (compared, not trusted by name or size);
- ``inspect.getsource(SomeClass)`` goes through the module's ``__file__``, which stays the real
  path (vLLM loads data files relative to it), so the real path gets a ``linecache`` entry with
  mtime ``None`` (``checkcache`` keeps those), re-added after every ``linecache.clearcache()``;
- the published name gets a ``linecache`` entry with mtime ``None`` as well, so that pruning
  or rewriting the file while the process runs changes nothing that reads source by name
  (tracebacks printed by the default hook on 3.11/3.12 excepted: they read the file itself);
- if no file can be written, the code is compiled under the real path and the ``linecache``
  entry alone carries the patched text (tracebacks printed by the default hook on 3.11/3.12 then
  show the original line; logged once).
"""

from __future__ import annotations

import _imp
import io
import linecache
import os

from importpatch import events

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_KEY = 0x1A9_07C4  # any constant: SipHash key for content addresses
_entries: dict[str, tuple[int, None, list[str], str]] = {}
_original_clearcache: Any = None


def publish(real_path: str, text: str, cache_root: str | None) -> str:
    """Make ``text`` readable as the source of the module at ``real_path``; returns the file name
    to compile the patched code under."""
    # As linecache reads a file (universal newlines): str.splitlines would also split on form
    # feeds and \u2028 inside a line, and every later line number would be off.
    lines = io.StringIO(text, newline=None).readlines()
    entry = (len(text), None, lines, real_path)
    _entries[real_path] = entry
    linecache.cache[real_path] = entry
    _guard_clearcache()
    if cache_root is None:
        return real_path
    data = text.encode("utf-8", "surrogatepass")
    # SipHash-1-3 (CPython's checked-.pyc hash; no hashlib import) plus the length names the
    # folder; what is trusted is the content itself: an existing file is used only when its bytes
    # are these bytes (what Triton compiles and tracebacks show must be exactly the patched text).
    digest = f"{_imp.source_hash(_KEY, data).hex()}{len(data):x}"
    from importpatch import safefiles

    path = safefiles.folder(cache_root, "src", digest, os.path.basename(real_path))
    try:
        if path is None:
            raise OSError("a cache folder on the way is not safe (see the warning above)")
        if safefiles.read_owned(path) != data:
            safefiles.replace_file(path, data, private=True)
    except OSError as exc:
        # One line per process for a cache that cannot be written (a full disk): the key of
        # safefiles.write_atomic's warning, with what this failure costs.
        events.warn_once(
            "cache-write",
            f"cannot write patched source under {cache_root} ({exc}); tracebacks printed by the "
            "default exception hook on Python < 3.13 will show the original lines",
        )
        return real_path
    # The file may be pruned or rewritten while this process runs (after linecache read it, its
    # checkcache would evict it and tracebacks would show nothing or other text): linecache
    # holds the text under this name too, mtime None, kept through clearcache like the other.
    _entries[path] = linecache.cache[path] = (entry[0], None, lines, path)
    return path


def _guard_clearcache() -> None:
    """Torch inductor and others call linecache.clearcache(); keep our entries through it."""
    global _original_clearcache
    if _original_clearcache is not None:
        return
    _original_clearcache = linecache.clearcache

    def clearcache() -> None:
        _original_clearcache()
        linecache.cache.update(_entries)

    clearcache.__doc__ = _original_clearcache.__doc__
    linecache.clearcache = clearcache
