"""A package index on 127.0.0.1 serving one release the way PyPI serves vLLM's: PEP 691 JSON or
PEP 503 HTML project pages, files with sha256 (and size), yanked files, a hash that lies.

The release is a real wheel of a throwaway package (tests/test_cli.py's ``tpkg``), published under
the file names vLLM's releases use (manylinux1, manylinux_2_28 for x86_64 and aarch64, a
cp312-only build, an sdist, an older version): ``pip download`` would need the exact platform tag
of each; importpatch.tools.releases takes any wheel of the version. The fixture is ``package_index``
(tests/conftest.py); tests/test_drift.py and tests/test_releases.py use it.
"""

from __future__ import annotations

import hashlib
import html
import http.server
import json
import threading
import zipfile
from pathlib import Path
from typing import Any

PROJECT = "tpkg-cpu"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
# What a release of vLLM looks like on the index (the first is the one to pick).
NAMES = [
    "tpkg_cpu-1.4.0-cp38-abi3-manylinux1_x86_64.whl",
    "tpkg_cpu-1.4.0-cp38-abi3-manylinux_2_28_aarch64.whl",
    "tpkg_cpu-1.4.0-cp312-cp312-manylinux_2_17_x86_64.whl",
    "tpkg_cpu-1.4.0.tar.gz",
    "tpkg_cpu-1.3.0-cp38-abi3-manylinux_2_28_x86_64.whl",
]


class Index:
    """A package index on 127.0.0.1: /simple/<project>/ and /files/<name>, with a request log."""

    def __init__(self, folder: Path, files: dict[str, bytes]) -> None:
        self.folder, self.files = folder, files
        self.json = True
        self.yanked: set[str] = set()
        self.bad_hash: set[str] = set()  # listed with the sha256 of other bytes
        self.short: set[str] = set()  # served 10 bytes short (the listed size stays right)
        self.requests: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                index.requests.append(self.path)
                if self.path == f"/simple/{PROJECT}/":
                    accept = self.headers.get("Accept", "")
                    kind, body = index.page(JSON_TYPE in accept and index.json)
                elif self.path.startswith("/files/") and self.path[7:] in index.files:
                    name = self.path[7:]
                    kind, body = "application/octet-stream", index.files[name]
                    if name in index.short:
                        body = body[:-10]
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/simple/"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def digest(self, name: str) -> str:
        data = self.files[name] + (b"tampered" if name in self.bad_hash else b"")
        return hashlib.sha256(data).hexdigest()

    def page(self, as_json: bool) -> tuple[str, bytes]:
        if as_json:
            files = [{"filename": n, "url": f"../../files/{n}", "hashes": {"sha256":
                      self.digest(n)}, "size": len(self.files[n]), "yanked": n in self.yanked}
                     for n in self.files]
            return JSON_TYPE, json.dumps({"meta": {"api-version": "1.1"}, "name": PROJECT,
                                          "files": files}).encode()
        yanked = ' data-yanked=""'
        links = "".join(
            f'<a href="../../files/{html.escape(n)}#sha256={self.digest(n)}"'
            f'{yanked if n in self.yanked else ""}>{html.escape(n)}</a><br>\n'
            for n in self.files)
        return "text/html", f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_release(folder: Path) -> Index:
    """Build the release's files under ``folder`` and serve them (close() when done)."""
    from test_cli import make_sdist, make_wheel

    (folder / "build").mkdir()
    files = {NAMES[3]: make_sdist(folder / "build" / NAMES[3], "").read_bytes()}
    for name in NAMES:
        if name.endswith(".whl"):  # each wheel differs (a file naming it): a mix-up shows
            wheel = make_wheel(folder / "build" / name)
            with zipfile.ZipFile(wheel, "a") as z:
                z.writestr("tpkg/_which.txt", name)
            files[name] = wheel.read_bytes()
    return Index(folder, files)
