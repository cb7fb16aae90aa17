"""mkdocs hook: the site's search works opened from disk (``file://``) with no network.

Material's search runs in a Web Worker, which a browser does not start from a ``file://`` page;
its ``offline`` plugin then names the ``iframe-worker`` shim, by default from a CDN
(``https://unpkg.com/iframe-worker/shim``): with no network the shim does not load and the
search box stays hidden. mkdocs.yml names a copy inside the site instead
(``extra.polyfills: [assets/javascripts/iframe-worker-shim.js]``; the plugin adds no CDN URL when
one naming ``iframe-worker`` is there), and this hook writes that copy at build time, from the
npm registry's tarball of a pinned release, checked against the registry's integrity hash (npm's
own check), with its licence beside it. The tarball is kept in ``$DOCS_ASSET_CACHE`` (tox:
the env's folder), so a rebuild reads no network. Proven by scripts/release/check_offline_search.py
(a headless Chromium types a query into site/index.html opened from disk, network off).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

PACKAGE, VERSION = "iframe-worker", "1.0.4"
TARBALL = f"https://registry.npmjs.org/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"
# `npm view iframe-worker@1.0.4 dist.integrity`
INTEGRITY = ("sha512-roeaaI+Lg1LJNfgpCjoRe/+WzEjy9+Z08LoEvu85MCPbBjwm+qXz8Ag5U05lHa6V1Cys"
             "ZyGzE0SOkAtSUA5q7Q==")
SHIM = "assets/javascripts/iframe-worker-shim.js"  # as mkdocs.yml's extra.polyfills names it
MEMBERS = {"package/shim/index.js": SHIM, "package/LICENSE": SHIM.replace(".js", ".LICENSE.txt")}


def tarball() -> bytes:
    """The release's tarball, from the cache or the registry, checked."""
    cache = Path(os.environ.get("DOCS_ASSET_CACHE") or tempfile.gettempdir())
    kept = cache / f"{PACKAGE}-{VERSION}.tgz"
    data = kept.read_bytes() if kept.is_file() else b""
    if not _intact(data):
        try:
            with urllib.request.urlopen(TARBALL, timeout=60) as response:  # noqa: S310 (https)
                data = response.read()
        except OSError as exc:
            raise SystemExit(f"docs: cannot fetch {TARBALL} ({exc}); it is needed once, then "
                             f"kept in {kept}") from None
        if not _intact(data):
            raise SystemExit(f"docs: {TARBALL} does not match its integrity hash {INTEGRITY}")
        cache.mkdir(parents=True, exist_ok=True)
        kept.write_bytes(data)
    return data


def _intact(data: bytes) -> bool:
    algo, _, digest = INTEGRITY.partition("-")
    return bool(data) and base64.b64encode(hashlib.new(algo, data).digest()).decode() == digest


def on_post_build(config: Any, **kwargs: Any) -> None:
    polyfills = config.extra.get("polyfills") or []
    if SHIM not in polyfills or any("//" in str(p) for p in polyfills):
        raise SystemExit(f"docs: mkdocs.yml's extra.polyfills must be [{SHIM}] (no CDN URL), "
                         f"not {polyfills}")
    site = Path(config.site_dir)
    with tarfile.open(fileobj=io.BytesIO(tarball()), mode="r:gz") as archive:
        for member, dest in MEMBERS.items():
            extracted = archive.extractfile(member)
            if extracted is None:
                raise SystemExit(f"docs: {TARBALL} has no {member}")
            (site / dest).parent.mkdir(parents=True, exist_ok=True)
            (site / dest).write_bytes(extracted.read())
