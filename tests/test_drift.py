"""scripts/drift.py finds, downloads and caches a release the way it does on PyPI, against a
package index served by this test on 127.0.0.1 (PEP 691 JSON or PEP 503 HTML pages, files with
sha256), so no test reaches the network or the real cache (~/.cache/importpatch-drift).

The release is a real wheel of a throwaway package, published under the file names vLLM's
releases use (manylinux1, manylinux_2_28 for x86_64 and aarch64, a cp312-only build, an sdist):
pip download would need the exact platform tag of each; the script takes any wheel of the version.
"""

from __future__ import annotations

import hashlib
import html
import http.server
import json
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env
from test_cli import make_sdist, make_wheel

DRIFT = ROOT / "scripts" / "drift.py"
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
        self.bad_hash: set[str] = set()
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
                    kind, body = "application/octet-stream", index.files[self.path[7:]]
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


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    (tmp_path / "build").mkdir()
    files = {NAMES[3]: make_sdist(tmp_path / "build" / NAMES[3], "").read_bytes()}
    for name in NAMES:
        if name.endswith(".whl"):  # each wheel differs (a file naming it): a mix-up shows
            wheel = make_wheel(tmp_path / "build" / name)
            with zipfile.ZipFile(wheel, "a") as z:
                z.writestr("tpkg/_which.txt", name)
            files[name] = wheel.read_bytes()
    served = Index(tmp_path, files)
    yield served
    served.close()


def drift(cache: Path, *args: str, stdout: int = subprocess.PIPE) -> subprocess.Popen[str]:
    env = clean_env({"IMPORTPATCH_DRIFT_CACHE": str(cache), "PIP_INDEX_URL": None})
    return subprocess.Popen([sys.executable, str(DRIFT), *args], stdout=stdout,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))


def run(cache: Path, *args: str) -> tuple[int, str, str]:
    proc = drift(cache, *args)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def header(out: str) -> list[str]:
    return out.splitlines()[0].split()


def test_any_wheel_of_the_version_is_fetched_verified_shown_and_cached(
    index: Index, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    status, out, err = run(cache, "--index-url", index.url, "--release", f"{PROJECT}==1.4.0")
    assert status == 0, err
    assert header(out) == ["patch", PROJECT, "1.4.0"]  # checked: the release's own metadata
    assert sorted(p.name for p in cache.glob("*.whl")) == [NAMES[0]]
    assert hashlib.sha256((cache / NAMES[0]).read_bytes()).hexdigest() == index.digest(NAMES[0])
    assert f"drift: downloading {NAMES[0]} into {cache}" in err
    assert f"drift: {NAMES[0]} " in err and "(100%)" in err  # progress, one line per 10 %
    assert "Traceback" not in err
    assert index.requests == [f"/simple/{PROJECT}/", f"/files/{NAMES[0]}"]

    index.close()  # the second run needs no index
    status, again, err = run(cache, "--index-url", index.url, "--release", f"{PROJECT}==1.4.0",
                             "--fetch-only")
    assert (status, again) == (0, f"{cache / NAMES[0]}\n"), err
    assert "downloading" not in err


def test_the_html_index_and_yanked_files_and_the_sdist_on_request(
    index: Index, tmp_path: Path
) -> None:
    index.json = False
    index.yanked = {NAMES[0]}
    status, out, err = run(tmp_path / "c1", "--index-url", index.url,
                           "--release", f"{PROJECT}==1.4.0", "--fetch-only")
    assert status == 0, err
    # manylinux1 yanked: the other x86_64 wheels rank cp38-abi3 > cp312 ... but the abi3 one left
    # is aarch64, so the cp312 x86_64 wheel wins (the platform comes first).
    assert [p.name for p in (tmp_path / "c1").glob("*.whl")] == [NAMES[2]]
    status, out, err = run(tmp_path / "c2", "--index-url", index.url,
                           "--release", f"{PROJECT}==1.4.0:sdist", "--fetch-only")
    assert status == 0, err
    assert out == f"{tmp_path / 'c2' / NAMES[3]}\n"
    assert [p.name for p in (tmp_path / "c2").iterdir() if not p.name.startswith(".")] == [
        NAMES[3]]


def test_a_download_that_does_not_match_the_index_hash_leaves_nothing(
    index: Index, tmp_path: Path
) -> None:
    index.bad_hash = {NAMES[0]}
    cache = tmp_path / "cache"
    status, out, err = run(cache, "--index-url", index.url, "--release", f"{PROJECT}==1.4.0",
                           "--fetch-only")
    assert status == 1 and out == ""
    assert err.splitlines()[-1].startswith(f"drift: error: {NAMES[0]}: sha256 ")
    assert "is not the index's" in err and "Traceback" not in err
    assert list(cache.iterdir()) == []  # no partial file, nothing a later run would trust


def test_a_release_the_index_does_not_have_is_a_clear_error(index: Index, tmp_path: Path) -> None:
    status, out, err = run(tmp_path / "cache", "--index-url", index.url,
                           "--release", f"{PROJECT}==9.9", "--fetch-only")
    assert status == 1 and out == ""
    assert err.strip() == f"drift: error: {index.url} lists no wheel or sdist of {PROJECT}==9.9"
    status, out, err = run(tmp_path / "cache", "--release", "not a spec", "--fetch-only")
    assert status == 1
    assert "must look like NAME==VERSION" in err and "Traceback" not in err


def test_a_reader_that_goes_away_ends_the_run_quietly(index: Index, tmp_path: Path) -> None:
    """`drift.py --json | head`: the reader closes the pipe before the first line is written."""
    cache = tmp_path / "cache"
    assert run(cache, "--index-url", index.url, "--release", f"{PROJECT}==1.4.0",
               "--fetch-only")[0] == 0
    proc = drift(cache, "--release", f"{PROJECT}==1.4.0", "--json")
    assert proc.stdout is not None
    proc.stdout.close()  # no reader left: the first write raises BrokenPipeError
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141, err  # what a shell reports for SIGPIPE
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_the_matrix_keeps_the_reasons_written_into_it(tmp_path: Path) -> None:
    """A release where a shipped patch applies but its Requires excludes it: the matrix flags the
    cell until a reason is written into excluded_because, and regenerating keeps that reason."""
    tree = tmp_path / "vllm-0.9.9"  # a source tree that check reads like a release
    (tree / "vllm" / "v1" / "core" / "sched").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").write_text("")
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.9.9\n")
    (tree / "vllm" / "v1" / "core" / "sched" / "scheduler.py").write_text(
        "class Scheduler:\n    def schedule(self):\n        return None\n")
    docs = tmp_path / "docs"
    docs.mkdir()
    args = ("--against", str(tree), "--write-matrix", "--matrix-dir", str(docs))
    status, _, err = run(tmp_path / "cache", *args)
    assert status == 0, err
    matrix = json.loads((docs / "compat-matrix.json").read_text())
    assert [r["label"] for r in matrix["releases"]] == ["vllm 0.9.9"]
    rows = {r["name"]: r for r in matrix["patches"]}
    trace = rows["vllm-sched-step-trace"]
    assert trace["file"] == "patches/vllm_sched_step_trace.py"
    assert trace["sha256"] == hashlib.sha256(
        (ROOT / trace["file"]).read_bytes()).hexdigest()
    assert trace["verdicts"]["vllm 0.9.9"] == {
        "applies": True, "admitted": False, "status": "skip", "detail": None}
    nan_guard = rows["vllm-sampler-nan-guard"]["verdicts"]["vllm 0.9.9"]
    assert nan_guard["applies"] is False and "module not found" in nan_guard["detail"]
    assert (nan_guard["git_apply"], nan_guard["gnu_patch"]) == (False, False)
    table = (docs / "compat-matrix.md").read_text()
    assert "| `vllm-sched-step-trace` | `vllm>=0.10,<0.40` | EXCLUDED? |" in table

    trace["excluded_because"] = {"vllm 0.9.9": "requests have no priority yet"}
    (docs / "compat-matrix.json").write_text(json.dumps(matrix))
    status, _, err = run(tmp_path / "cache", *args)
    assert status == 0, err
    again = {r["name"]: r for r in
             json.loads((docs / "compat-matrix.json").read_text())["patches"]}
    assert again["vllm-sched-step-trace"]["excluded_because"] == {
        "vllm 0.9.9": "requests have no priority yet"}
    table = (docs / "compat-matrix.md").read_text()
    assert "| `vllm-sched-step-trace` | `vllm>=0.10,<0.40` | excluded† |" in table
    assert "- `vllm-sched-step-trace` on vllm 0.9.9: requests have no priority yet" in table
