"""Where patches are on by variables, a process waits for the first import of what they target
(issue 30, item 2): the ``.pth`` line reads one stamp written for exactly those variables, checks
the signature of every path the index watched, and puts a waiting finder first on
``sys.meta_path``; the hook starts at the first import of a targeted package, before its code
runs, so a process that never imports one (pip, a test runner, a launcher) loads nothing of
importpatch. The stamp only decides *when* the hook starts; each test here attacks one way it
could let a target run unpatched: an edited, added or removed patch file, other variables, a
problem that every process must report, ``python -m`` on a target, a spawned child, and an
install that breaks between the stamp and the import (the target's import must fail closed).
"""

from __future__ import annotations

import ast
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Venv, current_home

WHERE = ("import sys; print([type(f).__name__ for f in sys.meta_path][:1], "
         "sorted(m for m in sys.modules if m.startswith('importpatch')))")
READ = ("import sys, tpkg.mod; print(tpkg.mod.f(), [type(f).__name__ for f in sys.meta_path "
        "if type(f).__name__ in ('PatchFinder', '_ImportpatchWaits')])")
SPAWNED = """\
import multiprocessing as mp, sys


def job(q):
    import tpkg.mod
    q.put(tpkg.mod.f())


if __name__ == "__main__":
    waiting = type(sys.meta_path[0]).__name__
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=job, args=(q,))
    p.start()
    print(waiting, q.get(timeout=120))
    p.join()
"""


def _new_venv(venv_factory: Callable[..., Venv], wheel: Path, name: str) -> Venv:
    venv = venv_factory(str(wheel), name=name)
    pkg = venv.site_packages / "tpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("def f():\n    return 'orig'\n")
    (pkg / "show.py").write_text("from tpkg.mod import f\nprint(f())\n")
    other = venv.site_packages / "tpkg2"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "mod.py").write_text("def f():\n    return 'orig2'\n")
    time.sleep(0.1)  # past the racy window of the site folder's new mtime
    return venv


@pytest.fixture(scope="module")
def stamp_venv(venv_factory: Callable[..., Venv], built_wheel: Path) -> Venv:
    """One venv with the wheel and a target package ``tpkg`` in its site folder (each test has
    its own HOME, so its own cache of stamps, and its own patch folder)."""
    return _new_venv(venv_factory, built_wheel, "enabled-stamp")


def _patches(tmp_path: Path, value: str = "patched") -> Path:
    folder = tmp_path / "patches"
    folder.mkdir(exist_ok=True)
    (folder / "p.py").write_text(
        "from importpatch import Patch\n\n"
        f"Patch('p').replace('tpkg.mod:f', lambda: {value!r})\n")
    time.sleep(0.1)  # an index is not written for files changed within its racy window
    return folder


def _run(venv: Venv, code: str | list[str], patches: Path, enable: str = "p", **extra: str
         ) -> tuple[str, list[str], str]:
    """(first finder's name, importpatch modules loaded, stderr) for ``WHERE``; else stdout."""
    proc = venv.run(code, env={"IMPORTPATCH_PATH": str(patches), "IMPORTPATCH_ENABLE": enable,
                               **extra})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if code != WHERE:
        return proc.stdout, [], proc.stderr
    first, _, loaded = proc.stdout.strip().partition("] ")
    return first.strip("['"), ast.literal_eval(loaded), proc.stderr


def _stamps() -> list[Path]:
    return sorted((current_home() / ".cache" / "importpatch" / "s").glob("e-*"))


def test_an_enabled_start_waits_for_the_first_import_of_a_target(
    stamp_venv: Venv, tmp_path: Path
) -> None:
    patches = _patches(tmp_path)
    first, loaded, err = _run(stamp_venv, WHERE, patches)
    assert (first, err) == ("PatchFinder", ""), loaded  # no stamp yet: the hook starts at once
    (stamp,) = _stamps()
    body, _, check = stamp.read_bytes().rpartition(b"\0")  # ... the packages, the check
    assert body.endswith(b"\0tpkg") and check.isdigit(), stamp.read_bytes()
    first, loaded, err = _run(stamp_venv, WHERE, patches)
    # Nothing of importpatch loaded but the .pth line's own code (the waiting finder's module
    # and the slot's).
    own = ["importpatch._pth_on", "importpatch._slot"]
    assert (first, loaded, err) == ("_ImportpatchWaits", own, "")
    # The first import of the target starts the hook before its code runs: patched.
    out, _, err = _run(stamp_venv, READ, patches)
    assert (out, err) == ("patched ['PatchFinder']\n", "")
    # `python -m` on a module of the package: runpy imports the package first.
    out, _, err = _run(stamp_venv, ["-m", "tpkg.show"], patches)
    assert (out, err) == ("patched\n", "")
    # A spawned child of a waiting parent waits too, and patches at its own import.
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    out, _, err = _run(stamp_venv, [str(script)], patches)
    assert (out, err) == ("_ImportpatchWaits patched\n", "")
    assert _stamps() == [stamp]  # the processes that waited did not write it again


def test_a_changed_patch_folder_starts_the_hook_at_once(
    stamp_venv: Venv, tmp_path: Path
) -> None:
    patches = _patches(tmp_path)
    _run(stamp_venv, WHERE, patches)
    assert _run(stamp_venv, WHERE, patches)[0] == "_ImportpatchWaits"
    # Edited in place, same size: the signature of the file differs, the hook starts at once and
    # applies the new text.
    _patches(tmp_path, "PATCHED")
    assert _run(stamp_venv, WHERE, patches)[0] == "PatchFinder"
    assert _run(stamp_venv, READ, patches)[0] == "PATCHED ['PatchFinder']\n"
    assert _run(stamp_venv, WHERE, patches)[0] == "_ImportpatchWaits"  # a new stamp, for it
    # A new patch file (the folder's signature): a patch on "all" that targets another package
    # the stamp does not list must be seen at start, not waited past.
    (patches / "q.py").write_text("from importpatch import Patch\n\n"
                                  "Patch('q').replace('json:dumps', lambda *a, **k: 'q')\n")
    time.sleep(0.1)
    assert _run(stamp_venv, WHERE, patches, enable="all")[0] == "PatchFinder"
    out, _, _ = _run(stamp_venv, "import json; print(json.dumps(1))", patches, enable="all")
    assert out == "q\n"
    # Removed: the name is unknown now, and every process says so (no stamp hides it).
    (patches / "p.py").unlink()
    (patches / "q.py").unlink()
    time.sleep(0.1)
    for _ in range(2):
        first, _, err = _run(stamp_venv, WHERE, patches)
        assert first != "_ImportpatchWaits" and "unknown patch name(s) p" in err, err


@pytest.mark.parametrize("extra", [
    {"IMPORTPATCH_LOG": "1"}, {"IMPORTPATCH_STRICT": "1"}, {"VLLM_CUSTOM_PATCHES": "p"},
    {"IMPORTPATCH_DISCOVERY_TIMEOUT": "60"}, {"IMPORTPATCH_ENABLE": "p,nope"},
    {"IMPORTPATCH_PATH": "/nonexistent/importpatch-patches", "IMPORTPATCH_ENABLE": "p"},
], ids=["log", "strict", "blog-variable", "discovery-limit", "unknown-name", "missing-folder"])
def test_other_variables_or_a_problem_start_the_hook_in_every_process(
    stamp_venv: Venv, tmp_path: Path, extra: dict[str, str]
) -> None:
    # A log, strict mode, the blog's variable, a discovery limit want the hook running from the
    # start; a problem (an unknown name) is reported by every process. None writes a stamp.
    patches = _patches(tmp_path)
    for _ in range(3):
        first, loaded, err = _run(stamp_venv, WHERE, patches, **extra)
        assert first != "_ImportpatchWaits" and "importpatch.load.finder" in loaded, (first, err)
        if "nope" in extra.get("IMPORTPATCH_ENABLE", ""):
            assert "unknown patch name(s) nope" in err, err
        if "nonexistent" in extra.get("IMPORTPATCH_PATH", ""):
            assert "is not a folder" in err, err  # said by every process, never waited past
    assert _stamps() == []


def test_a_declaration_that_raises_SystemExit_is_reported_by_every_process(
    stamp_venv: Venv, tmp_path: Path
) -> None:
    # A broken patch file (BaseException at its declaration) is a problem every process says:
    # no stamp, so no process waits quietly past it.
    patches = _patches(tmp_path)
    (patches / "p.py").write_text("raise SystemExit('no')\n")
    time.sleep(0.1)
    for _ in range(3):
        first, _, err = _run(stamp_venv, WHERE, patches)
        assert first != "_ImportpatchWaits" and "is broken" in err, (first, err)
    assert _stamps() == []


def test_enable_in_code_of_a_waiting_process_activates_once(
    stamp_venv: Venv, tmp_path: Path
) -> None:
    # Late activation: the application calls importpatch.enable() (a patch made in code) before
    # it imports the target, in a process that waits. The hook activates there, once; the
    # waiting finder then leaves without starting it again, and both patches apply.
    patches = _patches(tmp_path)
    _run(stamp_venv, WHERE, patches)
    assert _run(stamp_venv, WHERE, patches)[0] == "_ImportpatchWaits"
    code = textwrap.dedent("""\
        import sys, importpatch
        importpatch.Patch("late").replace("tpkg2.mod:f", lambda: "late")
        importpatch.enable("late")
        import tpkg.mod, tpkg2.mod
        print(tpkg.mod.f(), tpkg2.mod.f(), [type(f).__name__ for f in sys.meta_path
              if type(f).__name__ in ("PatchFinder", "_ImportpatchWaits")])
        """)
    proc = stamp_venv.run(code, cwd=tmp_path, env={"IMPORTPATCH_PATH": str(patches),
                                                    "IMPORTPATCH_ENABLE": "p"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "patched late ['PatchFinder']", proc.stdout + proc.stderr


def test_a_home_that_does_not_exist_never_waits_and_is_never_created(
    stamp_venv: Venv, tmp_path: Path
) -> None:
    # No cache folder (HOME missing, no XDG_CACHE_HOME): no stamp can be kept, every process
    # starts the hook and patches; the home folder is not created.
    patches = _patches(tmp_path)
    home = tmp_path / "gone" / "home"
    env = {"IMPORTPATCH_PATH": str(patches), "IMPORTPATCH_ENABLE": "p", "HOME": str(home),
           "XDG_CACHE_HOME": None}
    for _ in range(2):
        proc = stamp_venv.run(READ, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "patched ['PatchFinder']\n", proc.stdout + proc.stderr
    assert not home.exists() and not (tmp_path / "gone").exists()


def test_an_enabled_stamp_in_an_own_cache_folder(stamp_venv: Venv, tmp_path: Path) -> None:
    patches = _patches(tmp_path)
    cache = tmp_path / "own-cache"
    _run(stamp_venv, WHERE, patches, IMPORTPATCH_CACHE_DIR=str(cache))
    assert len(list((cache / "s").glob("e-*"))) == 1
    assert _run(stamp_venv, WHERE, patches, IMPORTPATCH_CACHE_DIR=str(cache))[0] == (
        "_ImportpatchWaits")
    out = _run(stamp_venv, READ, patches, IMPORTPATCH_CACHE_DIR=str(cache))[0]
    assert out == "patched ['PatchFinder']\n"
    # A relative folder of patches: a process resolves it when it starts (its children get the
    # absolute path), so a start never waits on a stamp for another working folder's folder.
    rel = stamp_venv.run(WHERE, cwd=tmp_path, env={"IMPORTPATCH_PATH": "patches",
                                                    "IMPORTPATCH_ENABLE": "p"})
    again = stamp_venv.run(WHERE, cwd=tmp_path, env={"IMPORTPATCH_PATH": "patches",
                                                      "IMPORTPATCH_ENABLE": "p"})
    assert "_ImportpatchWaits" not in rel.stdout + again.stdout, again.stdout


RACE = """\
import threading, time
import importpatch._boot as boot
start_waited = boot.start_waited


def slow(*args, **kwargs):  # the hook's start, made slow: another thread imports meanwhile
    time.sleep(1.0)
    return start_waited(*args, **kwargs)


boot.start_waited = slow
out = {}


def other():
    time.sleep(0.3)  # inside the start the main thread's import began
    import tpkg2.mod
    out["other"] = tpkg2.mod.f()


thread = threading.Thread(target=other)
thread.start()
import tpkg.mod
thread.join()
print(tpkg.mod.f(), out["other"])
"""


def test_a_second_thread_importing_another_target_during_the_start_waits_for_it(
    stamp_venv: Venv, tmp_path: Path
) -> None:
    # Another thread's import of another listed package while the hook starts must not slip
    # through unpatched. importlib calls each finder's find_spec under its global import lock
    # (importlib._bootstrap._find_spec), so that import waits for the start: the promise, held
    # here with a start slowed to a second.
    patches = _patches(tmp_path)
    (patches / "q.py").write_text("from importpatch import Patch\n\n"
                                  "Patch('q').replace('tpkg2.mod:f', lambda: 'patched2')\n")
    time.sleep(0.1)
    env = {"IMPORTPATCH_PATH": str(patches), "IMPORTPATCH_ENABLE": "p,q"}
    stamp_venv.run("pass", env=env, cwd=tmp_path)  # writes the stamp
    waits = stamp_venv.run(WHERE, env=env, cwd=tmp_path)
    assert waits.stdout.startswith("['_ImportpatchWaits']"), waits.stdout + waits.stderr
    proc = stamp_venv.run(RACE, env=env, cwd=tmp_path)  # cwd: not the checkout's importpatch
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["patched", "patched2"], proc.stdout + proc.stderr


@pytest.mark.parametrize("gone", ["importpatch/load/finder.py", "importpatch/_boot.py"])
def test_an_install_broken_after_the_stamp_fails_the_target_closed(
    venv_factory: Callable[..., Venv], built_wheel: Path, tmp_path: Path, gone: str
) -> None:
    # A reinstall in progress removes importpatch's files while processes start: the stamp says
    # wait, and the hook cannot start at the target's import (its start-up module is gone, or a
    # module activation needs). The import must fail with the reason, never run unpatched.
    venv = _new_venv(venv_factory, built_wheel, f"stamp-broken-{Path(gone).stem}")
    patches = _patches(tmp_path)
    _run(venv, WHERE, patches)
    assert _run(venv, WHERE, patches)[0] == "_ImportpatchWaits"
    path = venv.site_packages / gone
    path.unlink()
    for pyc in path.parent.glob(f"__pycache__/{path.stem}.*.pyc"):
        pyc.unlink()
    proc = venv.run(READ, env={"IMPORTPATCH_PATH": str(patches), "IMPORTPATCH_ENABLE": "p"})
    assert proc.returncode != 0 and "orig" not in proc.stdout, proc.stdout + proc.stderr
    assert "fail closed" in proc.stderr or "fails closed" in proc.stderr, proc.stderr
    assert "ImportError" in proc.stderr or "ModuleNotFoundError" in proc.stderr, proc.stderr
