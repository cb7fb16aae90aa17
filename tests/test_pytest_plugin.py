"""The pytest plugin: ``importpatch_run`` and ``assert_applies_cleanly``, used the way a patch
author uses them, in an inner pytest run (pytester from this checkout, and a venv with the wheel
and pytest installed, where the plugin comes from the ``pytest11`` entry point)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, Venv

pytest_plugins = ["pytester"]

INNER_TESTS = '''
import pytest
from importpatch.pytest_plugin import assert_applies_cleanly

TARGET = {target!r}
PATCHES = {patches!r}


def test_snippet_runs_patched_and_returns_result(importpatch_run):
    r = importpatch_run(
        """
        import os
        import spkg.mod
        result = {{"f": spkg.mod.f(), "pid": os.getpid()}}
        """,
        enable=["wrap-f"], path=[PATCHES], env={{"PYTHONPATH": TARGET}},
    )
    assert r.returncode == 0, r.stderr
    assert r.result["f"] == 2
    assert [(e["outcome"], e["patch"], e["target"]) for e in r.events] == [
        ("applied", "wrap-f", "spkg.mod:f")]
    assert r.events[0]["pid"] == r.result["pid"]
    assert r.applied == r.events


def test_events_of_child_processes_are_collected(importpatch_run):
    r = importpatch_run(
        """
        import os, subprocess, sys
        import spkg.mod
        subprocess.run([sys.executable, "-c", "import spkg.mod"], check=True)
        result = os.getpid()
        """,
        enable=["wrap-f"], path=[PATCHES], env={{"PYTHONPATH": TARGET}},
    )
    assert r.returncode == 0, r.stderr
    pids = [e["pid"] for e in r.events]
    assert len(pids) == 2 and pids[0] == r.result != pids[1]
    assert r.events[1]["ppid"] == r.result
    assert sorted(p["pid"] for p in r.processes) == sorted(pids)  # both had the hook active


def test_patch_not_enabled_leaves_the_module_alone(importpatch_run):
    r = importpatch_run("import spkg.mod\\nresult = spkg.mod.f()", enable=[],
                        path=[PATCHES], env={{"PYTHONPATH": TARGET}})
    assert (r.returncode, r.result, r.events) == (0, 1, [])


def test_stdout_stderr_and_failures_come_back(importpatch_run):
    r = importpatch_run("print('out')\\nraise SystemExit('boom')", enable=[])
    assert (r.returncode, r.stdout, r.result) == (1, "out\\n", None)
    assert "boom" in r.stderr


def test_applies_cleanly():
    assert_applies_cleanly("wrap-f", against=TARGET, path=[PATCHES])


def test_does_not_apply_cleanly_shows_the_report():
    with pytest.raises(AssertionError) as info:
        assert_applies_cleanly("wrap-g", against=TARGET, path=[PATCHES])
    assert "wrap-g  FAIL" in str(info.value)
    assert "g not found in spkg.mod" in str(info.value)
'''


@pytest.fixture
def inner_tests(tmp_path: Path) -> str:
    target = tmp_path / "target"
    (target / "spkg").mkdir(parents=True)
    (target / "spkg" / "__init__.py").write_text("")
    (target / "spkg" / "mod.py").write_text("def f():\n    return 1\n")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "wraps.py").write_text(textwrap.dedent("""\
        from importpatch import Patch

        Patch("wrap-f").wrap("spkg.mod:f", lambda wrapped, instance, args, kwargs: 2)
        Patch("wrap-g").wrap("spkg.mod:g", lambda wrapped, instance, args, kwargs: 3)
    """))
    return INNER_TESTS.format(target=str(target), patches=str(patches))


def test_fixture_and_helper_work_from_a_checkout(
    pytester: pytest.Pytester, inner_tests: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importpatch

    args = ["-p", "no:importpatch", "-p", "importpatch.tools.pytest_plugin", "-p",
            "no:cacheprovider"]
    checkout = Path(importpatch.__file__).resolve().is_relative_to(ROOT)
    if checkout:  # importpatch is not installed here: only the snippet's own process is patched
        monkeypatch.setenv("PYTHONPATH", str(ROOT))
        args += ["-k", "not child_processes"]
    for name in ("IMPORTPATCH_ENABLE", "IMPORTPATCH_PATH", "IMPORTPATCH_EVENTS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("IMPORTPATCH_CACHE_DIR", str(tmp_path / "cache"))
    pytester.makepyfile(test_inner=inner_tests)
    # the entry point may or may not be installed here: load the plugin by module name only
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=5 if checkout else 6, deselected=1 if checkout else 0)


def test_plugin_is_registered_by_the_installed_wheel(
    venv_factory: object, built_wheel: Path, inner_tests: str, tmp_path: Path
) -> None:
    venv: Venv = venv_factory(str(built_wheel), "pytest", name="plugin-venv")  # type: ignore[operator]
    (tmp_path / "test_inner.py").write_text(inner_tests)
    proc = venv.run(
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_inner.py")],
        env={"IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache")}, cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 passed" in proc.stdout
    listed = venv.run(["-m", "pytest", "--fixtures", "-p", "no:cacheprovider"], cwd=tmp_path)
    assert "importpatch_run" in listed.stdout


ENVIRONMENT_TESTS = '''
import pytest

TARGET = {target!r}


def test_the_patch_folder_of_the_environment_is_the_childs(importpatch_run):
    # assert_applies_cleanly reads IMPORTPATCH_PATH; the child must find the same patches
    r = importpatch_run("import spkg.mod\\nresult = spkg.mod.f()", enable=["wrap-f"],
                        env={{"PYTHONPATH": TARGET}})
    assert (r.returncode, r.result) == (0, 2), r.stderr


def test_a_name_the_child_does_not_know_fails_the_run(importpatch_run):
    # else the snippet runs unpatched, and a test that asserts only "it did not crash" passes
    with pytest.raises(pytest.fail.Exception) as info:
        importpatch_run("import spkg.mod", enable=["wrap-f", "wrap-typo"],
                        env={{"PYTHONPATH": TARGET}})
    assert "importpatch_run: enable=['wrap-typo']" in str(info.value)
    assert "no patch of that name in the child" in str(info.value)
'''


def test_the_child_sees_the_environments_patches_and_an_unknown_name_fails(
    pytester: pytest.Pytester, inner_tests: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = tmp_path / "target"  # made by inner_tests
    monkeypatch.setenv("IMPORTPATCH_PATH", str(tmp_path / "patches"))
    monkeypatch.setenv("IMPORTPATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("IMPORTPATCH_ENABLE", raising=False)
    pytester.makepyfile(test_env=ENVIRONMENT_TESTS.format(target=str(target)))
    result = pytester.runpytest_subprocess("-p", "no:importpatch", "-p",
                                           "importpatch.tools.pytest_plugin", "-p",
                                           "no:cacheprovider")
    result.assert_outcomes(passed=2)
