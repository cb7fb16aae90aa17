"""``importpatch capture`` (edits made in site-packages -> a diff patch, ``--restore``) and releases
named by version wherever a release is named (``check --against NAME==VERSION``), run for real: a
toy distribution installed with real pip into a real venv, edited in its site-packages the way
projects do (text replacement), captured, restored, and the diff applied by the hook in child
processes (a spawned one included); releases come from the local package index of
tests/package_index.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import Venv
from coreutil import write_wheel
from package_index import NAMES

CORE = '''\
"""Toy core."""


def compute(x):
    return x * 2


def name():
    return "toy"
'''
FILES = {
    "toy/__init__.py": '__version__ = "1.2.0"\n',
    "toy/core.py": CORE,
    "toy/gone.py": "GONE = 1\n",
    "toy/data.json": '{"limit": 10}\n',
}
WHEEL_NAME = "toy_dist-1.2.0-py3-none-any.whl"


def make_wheel(path: Path, files: dict[str, str], name: str = "toy_dist",
               version: str = "1.2.0") -> Path:
    """A wheel per the binary distribution format spec (RECORD with sha256 per file)."""
    return write_wheel(path, name.replace("_", "-"), version, files)


@pytest.fixture(scope="module")
def venv(venv_factory: Any, built_wheel: Path) -> Venv:
    """importpatch installed with pip into a venv of this module's own, with the rebase extra
    (merge3: a test rebases what capture wrote)."""
    return venv_factory(f"importpatch-hook[rebase] @ {built_wheel.resolve().as_uri()}",
                        name="capture-venv")


@pytest.fixture(scope="module")
def toy_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_wheel(tmp_path_factory.mktemp("toy") / WHEEL_NAME, FILES)


@pytest.fixture
def toy(venv: Venv, toy_wheel: Path) -> Path:
    """toy-dist 1.2.0 freshly installed by pip (what a test edited or added is gone)."""
    shutil.rmtree(venv.site_packages / "toy", ignore_errors=True)
    venv.pip("install", "--no-deps", "--no-index", "--force-reinstall", "-q", str(toy_wheel))
    return venv.site_packages


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str | None]:
    patches = tmp_path / "patches"
    patches.mkdir()
    return {"IMPORTPATCH_PATH": str(patches), "IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"),
            "XDG_DATA_HOME": str(tmp_path / "data"), "NO_COLOR": "1"}


def ip(venv: Venv, *args: str, env: dict[str, str | None]) -> subprocess.CompletedProcess[str]:
    return venv.run(["-m", "importpatch", *args], env=env, timeout=180)


def replace_in(path: Path, old: str, new: str) -> None:
    """The edit the way xorbitsai's patcher makes it: read, str.replace, write back."""
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The refusal: exit status 2, one error line (and a hint), no traceback, nothing on stdout."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("importpatch: error: ") and len(lines) <= 2, proc.stderr
    assert len(lines) == 1 or lines[1].startswith("hint: ")
    return lines[0]


def tree_state(*folders: Path) -> dict[str, bytes]:
    out = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                out[str(path)] = path.read_bytes()
    return out


RUN_TOY = """
import multiprocessing as mp
import toy.core

def child(_):
    import toy.core
    return toy.core.compute(5)

if __name__ == "__main__":
    with mp.get_context("spawn").Pool(1) as pool:
        print(toy.core.compute(2), pool.map(child, [0])[0])
"""


def test_capture_restore_then_the_hook_carries_the_edit_in_every_process(
    venv: Venv, toy: Path, toy_wheel: Path, env: dict[str, str | None], tmp_path: Path
) -> None:
    core = toy / "toy" / "core.py"
    replace_in(core, "return x * 2", "return x * 3  # tripled")
    replace_in(toy / "toy" / "data.json", "10", "20")
    (toy / "toy" / "extra.py").write_text("EXTRA = 1\n")
    (toy / "toy" / "gone.py").unlink()
    edited = core.read_bytes()
    script = tmp_path / "run_toy.py"
    script.write_text(RUN_TOY)
    assert venv.run([script], env=env, check=True).stdout.split() == ["6", "15"]

    proc = ip(venv, "capture", "toy-dist", "--name", "triple", "--from", str(toy_wheel),
              "--restore", "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    out = Path(str(env["IMPORTPATCH_PATH"])) / "triple.diff"
    assert report["out"] == str(out) and report["files"] == ["toy/core.py"]
    assert report["restored"] == ["toy/core.py"]
    assert report["base"] == "toy-dist==1.2.0" and report["requires"] == ["toy>=1.2,<1.3"]
    assert {(c["how"], c["path"]) for c in report["not_carried"]} == {
        ("edited", "toy/data.json"), ("added", "toy/extra.py"), ("deleted", "toy/gone.py")}
    text = out.read_text()
    assert text.startswith("Name: triple\nBase: toy-dist==1.2.0\nRequires: toy>=1.2,<1.3\n")
    assert "-    return x * 2\n+    return x * 3  # tripled\n" in text
    assert "deleted toy/gone.py" in text  # the header's free text lists what was not carried
    # Restored: the installed module is the release's again; what was not carried is untouched.
    assert core.read_text() == CORE
    assert (toy / "toy" / "data.json").read_text() == '{"limit": 20}\n'
    assert (toy / "toy" / "extra.py").is_file() and not (toy / "toy" / "gone.py").exists()

    # The change now lands through the hook, in the process and in a spawned child.
    on = {**env, "IMPORTPATCH_ENABLE": "triple"}
    assert venv.run([script], env=on, check=True).stdout.split() == ["6", "15"]
    assert venv.run([script], env=env, check=True).stdout.split() == ["4", "10"]
    # The diff is the one `git apply` takes on the edited file's release text.
    repo = tmp_path / "repo"
    (repo / "toy").mkdir(parents=True)
    (repo / "toy" / "core.py").write_text(CORE)
    subprocess.run(["git", "apply", str(out)], cwd=repo, check=True, capture_output=True)
    assert (repo / "toy" / "core.py").read_bytes() == edited

    # Nothing left to capture: the installed modules match RECORD; the rest is named.
    again = ip(venv, "capture", "toy-dist", "--name", "again", "--from", str(toy_wheel), env=env)
    assert "nothing to capture" in one_error(again) and "toy/data.json" in again.stderr


def test_capture_without_restore_keeps_the_edit_and_says_so(
    venv: Venv, toy: Path, toy_wheel: Path, env: dict[str, str | None], tmp_path: Path
) -> None:
    replace_in(toy / "toy" / "core.py", '"toy"', '"toy, edited"')
    out = tmp_path / "elsewhere.diff"
    proc = ip(venv, "capture", "toy", "--name", "renamed", "--from", str(toy_wheel),
              "--out", str(out), env=env)  # the import package names its distribution
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout and "still hold the edits" in proc.stdout
    assert '+    return "toy, edited"' in out.read_text()
    assert '"toy, edited"' in (toy / "toy" / "core.py").read_text()
    assert not list(Path(str(env["IMPORTPATCH_PATH"])).iterdir())


def test_refusals_are_one_line_and_change_nothing(
    venv: Venv, toy: Path, toy_wheel: Path, env: dict[str, str | None], tmp_path: Path
) -> None:
    patches = Path(str(env["IMPORTPATCH_PATH"]))
    data = tmp_path / "data"
    core = toy / "toy" / "core.py"

    def refused(*args: str) -> str:
        before = tree_state(toy / "toy", patches, tmp_path / "data")
        line = one_error(ip(venv, "capture", *args, env=env))
        assert tree_state(toy / "toy", patches, tmp_path / "data") == before
        return line

    assert "no distribution nosuch-dist is installed" in refused("nosuch-dist", "--name", "x")
    # A distribution without RECORD (a tool that writes none).
    meta = toy / "norecord-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: norecord\nVersion: 1.0\n")
    try:
        assert "norecord 1.0 has no RECORD" in refused("norecord", "--name", "x")
    finally:
        for f in meta.iterdir():
            f.unlink()
        meta.rmdir()
    # Nothing edited (seven added files: the line names five and counts the rest).
    for i in range(7):
        (toy / "toy" / f"new{i}.py").write_text("")
    line = refused("toy-dist", "--name", "x", "--from", str(toy_wheel))
    assert "nothing to capture" in line and "added toy/new4.py; and 2 more)" in line
    for i in range(7):
        (toy / "toy" / f"new{i}.py").unlink()
    # An edit that wrote latin-1 bytes into the UTF-8 module.
    core.write_bytes(CORE.replace('"toy"', '"toy é"').encode("latin-1"))
    line = refused("toy-dist", "--name", "x", "--from", str(toy_wheel))
    assert "core.py is not UTF-8 text" in line and "byte 0xe9" in line
    core.write_text(CORE.replace("x * 2", "x * 4"))
    # A --from that is not the installed release.
    other = make_wheel(tmp_path / "w" / WHEEL_NAME, {**FILES, "toy/core.py": CORE + "# 1.2.1\n"})
    line = refused("toy-dist", "--name", "x", "--from", str(other))
    assert "toy/core.py of wheel" in line and "is not the file toy-dist 1.2.0 installed" in line
    assert "no such file or folder" in refused("toy-dist", "--name", "x", "--from", "/nope.whl")
    # Dirty state: the patch file exists; the work folder holds unsaved edits.
    # (with its target stated: a broken patch file whose targets no one can know is said by
    # every process, this refusal's included: issue 34)
    (patches / "taken.diff").write_text("Name: taken\n--- a/toy/core.py\n+++ b/toy/core.py\n")
    assert "taken.diff exists" in refused("toy-dist", "--name", "taken", "--from",
                                          str(toy_wheel))
    (patches / "taken.diff").unlink()
    made = ip(venv, "edit", "toy.core", "--name", "busy", env=env)
    assert made.returncode == 0, made.stderr
    edit_copy = data / "importpatch" / "work" / "busy" / "edit" / "toy" / "core.py"
    edit_copy.write_text(edit_copy.read_text() + "# work in progress\n")
    assert "holds unsaved edits" in refused("toy-dist", "--name", "busy", "--from",
                                            str(toy_wheel))
    assert "patch name" in refused("toy-dist", "--name", "../up", "--from", str(toy_wheel))


# -- Releases named by version (local package index) ---------------------------------------------


@pytest.fixture
def tpkg(venv: Venv, package_index: Any, tmp_path: Path) -> Path:
    """tpkg-cpu 1.4.0 (the release the index serves) installed by pip; uninstalled after."""
    wheel = tmp_path / "dl" / NAMES[0]
    wheel.parent.mkdir()
    wheel.write_bytes(package_index.files[NAMES[0]])
    venv.pip("install", "--no-deps", "--no-index", "-q", str(wheel))
    yield venv.site_packages
    venv.pip("uninstall", "-y", "-q", "tpkg-cpu")


def test_capture_takes_the_pristine_files_from_the_release_cache(
    venv: Venv, tpkg: Path, package_index: Any, env: dict[str, str | None], tmp_path: Path
) -> None:
    core = tpkg / "tpkg" / "core.py"
    pristine = core.read_text()
    replace_in(core, "x * 2", "x * 5")
    idx = {**env, "PIP_INDEX_URL": package_index.url}
    proc = ip(venv, "capture", "tpkg-cpu", "--name", "five", "--restore", env=idx)
    assert proc.returncode == 0, proc.stderr
    assert f"/files/{NAMES[0]}" in package_index.requests  # the release, from the index
    assert "importpatch: downloading" in proc.stderr and "MiB" in proc.stderr  # progress
    text = (Path(str(env["IMPORTPATCH_PATH"])) / "five.diff").read_text()
    assert "Base: tpkg-cpu==1.4.0\nRequires: tpkg>=1.4,<1.5\n" in text
    assert core.read_text() == pristine
    cached = Path(str(env["IMPORTPATCH_CACHE_DIR"])) / "releases" / NAMES[0]
    assert cached.is_file()


KEEP = ("Name: keep\nBase: tpkg-cpu==1.4.0\nRequires: tpkg>=1\n\n--- a/tpkg/core.py\n"
        "+++ b/tpkg/core.py\n@@ -7,3 +7,3 @@\n def compute(x):\n-    total = x * 2\n"
        "+    total = x * 7\n     return total + 1\n")


def test_check_against_a_release_by_version_downloads_it_once(
    venv: Venv, package_index: Any, env: dict[str, str | None], tmp_path: Path
) -> None:
    patches = Path(str(env["IMPORTPATCH_PATH"]))
    (patches / "keep.diff").write_text(KEEP)
    idx = {**env, "PIP_INDEX_URL": package_index.url}
    spec = "tpkg-cpu==1.4.0"
    proc = ip(venv, "check", "keep", "--against", spec, "--json", env=idx)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["against"]["kind"] == "wheel" and report["against"]["path"].endswith(NAMES[0])
    assert report["patches"][0]["status"] == "ok"
    assert "downloading" in proc.stderr
    files = [r for r in package_index.requests if r.startswith("/files/")]
    again = ip(venv, "check", "keep", "--against", spec, env=idx)
    assert again.returncode == 0, again.stderr
    assert [r for r in package_index.requests if r.startswith("/files/")] == files  # cached
    bad = ip(venv, "check", "--against", "tpkg-cpu==9.9.9", env=idx)
    assert "lists no wheel or sdist of tpkg-cpu==9.9.9" in one_error(bad)


def test_the_installed_release_is_read_from_disk_and_edited_files_from_the_release(
    venv: Venv, tpkg: Path, package_index: Any, env: dict[str, str | None]
) -> None:
    idx = {**env, "PIP_INDEX_URL": package_index.url}
    proc = ip(venv, "edit", "tpkg.newhome.engine", "--name", "e1", "--against",
              "tpkg-cpu==1.4.0", "--json", env=idx)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["source"].startswith("installed tpkg-cpu 1.4.0")
    # rebase's base (the Base: header) is the installed release too.
    (Path(str(env["IMPORTPATCH_PATH"])) / "keep.diff").write_text(KEEP)
    proc = ip(venv, "rebase", "keep", "--to", "installed", "--dry-run", "--json", env=idx)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["status"] == "clean"
    assert package_index.requests == []  # no download: the installed files are that release
    core = tpkg / "tpkg" / "core.py"
    pristine = core.read_text()
    replace_in(core, "x * 2", "x * 9")
    proc = ip(venv, "edit", "tpkg.core", "--name", "e2", "--against", "tpkg-cpu==1.4.0",
              "--json", env=idx)
    assert proc.returncode == 0, proc.stderr
    orig = json.loads(proc.stdout)["files"][0]["orig"]
    assert Path(orig).read_text() == pristine  # the release's text, not the edited file
    assert f"/files/{NAMES[0]}" in package_index.requests
    os.unlink(orig)
