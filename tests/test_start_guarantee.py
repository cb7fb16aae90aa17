"""One guarantee on every start path (issue 34): a requested patch is applied, or the import (or
the process) says why; never the target unpatched with exit status 0 and nothing said.

The hook starts in one of two timings: at the ``.pth`` line (no stamp yet: ``_AfterSite``, then
the PatchFinder), or *waiting* (an earlier process with the same variables wrote the enabled
stamp: the waiting finder holds the slot until the first import of a target). Each test runs
both where the case exists in both, in a venv whose site folder holds the targets (a PYTHONPATH
folder, as ``Lab`` sets, never lets a process wait). Each case here ran the target unpatched,
silently, before the change that made the waiting finder hold importpatch's one slot on
``sys.meta_path`` (importpatch/_pth_on.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Venv, current_home
from coreutil import install_dist

PATCH = "from importpatch import Patch\n\nPatch('p').replace('tpkg.mod:f', lambda: 'patched')\n"
FIRST = "import sys; print(type(sys.meta_path[0]).__name__)"
READ = "import tpkg.mod; print(tpkg.mod.f())"


def _add_targets(site: Path) -> None:
    for pkg in ("tpkg", "tpkg2"):
        (site / pkg).mkdir(exist_ok=True)
        (site / pkg / "__init__.py").write_text("")
        (site / pkg / "mod.py").write_text("def f():\n    return 'orig'\n")
    time.sleep(0.1)  # past the racy window of the site folder's new mtime


@pytest.fixture(scope="module")
def guard_venv(venv_factory: Callable[..., Venv], built_wheel: Path) -> Venv:
    """The wheel, typeguard (a real import hook users run beside us), targets in the site
    folder. Tests that add .pth files make a venv of their own."""
    venv = venv_factory(str(built_wheel), "typeguard>=4.3", name="start-guarantee")
    _add_targets(venv.site_packages)
    return venv


@pytest.fixture
def patches(tmp_path: Path) -> Path:
    folder = tmp_path / "patches"
    folder.mkdir()
    (folder / "p.py").write_text(PATCH)
    time.sleep(0.1)  # an index is not written for files changed within its racy window
    return folder


def _env(patches: Path, enable: str = "p", **extra: str) -> dict[str, str]:
    return {"IMPORTPATCH_PATH": str(patches), "IMPORTPATCH_ENABLE": enable, **extra}


def _enabled_stamps() -> list[Path]:
    return sorted((current_home() / ".cache" / "importpatch" / "s").glob("e-*"))


def _prepare(venv: Venv, env: dict[str, str], timing: str) -> None:
    """``waiting``: an earlier process writes the enabled stamp and the next one waits (checked,
    so the test runs the path it names); ``at-line``: no stamp, the hook starts at the line."""
    if timing == "at-line":
        return
    first = venv.run("pass", env=env)
    assert first.returncode == 0 and first.stderr == "", first.stderr
    assert _enabled_stamps(), "the first process wrote no enabled stamp"
    waits = venv.run(FIRST, env=env)
    assert waits.stdout.strip() == "_ImportpatchWaits", waits.stdout + waits.stderr


TIMINGS = ["at-line", "waiting"]

# A finder a program puts first, after the start (typeguard's install_import_hook, pytest's
# register_assert_rewrite, a user's finder): it answers with PathFinder's spec for the target.
OWN_FINDER = """\
import importlib.machinery, sys
class Mine:
    def find_spec(self, name, path=None, target=None):
        if name.startswith("tpkg"):
            return importlib.machinery.PathFinder.find_spec(name, path, target)
        return None
sys.meta_path.insert(0, Mine())
"""
TYPEGUARD = "from typeguard import install_import_hook\ninstall_import_hook('tpkg')\n"


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize("finder", ["own", "typeguard"])
@pytest.mark.parametrize("when", ["before-the-start", "after-the-start"])
def test_a_finder_put_first_later_never_answers_a_target_before_the_hook(
    guard_venv: Venv, patches: Path, timing: str, finder: str, when: str
) -> None:
    # Before: the waiting finder sat at sys.meta_path[0] of a plain list; a finder inserted there
    # afterwards answered `import tpkg.mod` first, so it ran unpatched (exit 0, nothing said).
    env = _env(patches)
    _prepare(guard_venv, env, timing)
    put = OWN_FINDER if finder == "own" else TYPEGUARD
    # after the start: `import tpkg` starts a waiting hook; the finder comes after it.
    code = (put + READ) if when == "before-the-start" else ("import tpkg\n" + put + READ)
    proc = guard_venv.run(code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["patched"], proc.stdout + proc.stderr


# Ctrl-C (or a signal handler's KeyboardInterrupt) at a point inside the waited start, raised by
# a real trace function when that code is entered; the program catches it and imports again (a
# REPL, a notebook cell run again, a retry loop).
INTERRUPTED = """\
import sys
hit = []
def tracer(frame, event, arg):
    code = frame.f_code
    if (event == "call" and not hit and code.co_name == {where!r}
            and code.co_filename.replace("\\\\", "/").endswith({file!r})):
        hit.append(1)
        raise KeyboardInterrupt
    return None
sys.settrace(tracer)
try:
    import tpkg.mod
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted")
sys.settrace(None)
import tpkg.mod
print(tpkg.mod.f())
"""
INTERRUPT_POINTS = [
    ("<module>", "importpatch/_boot.py"),  # the hook's own import
    ("activate", "importpatch/_boot.py"),
    ("load_index", "importpatch/discover/catalog.py"),
    ("install", "importpatch/load/finder.py"),
]


@pytest.mark.parametrize(("where", "file"), INTERRUPT_POINTS,
                         ids=[w.strip("<>") for w, _ in INTERRUPT_POINTS])
def test_ctrl_c_during_a_waited_start_and_the_next_import_is_patched(
    guard_venv: Venv, patches: Path, where: str, file: str
) -> None:
    # Before: the waiting finder removed itself, then imported the hook catching only Exception:
    # a KeyboardInterrupt in between left neither finder, and the next import got the original.
    env = _env(patches)
    _prepare(guard_venv, env, "waiting")
    proc = guard_venv.run(INTERRUPTED.format(where=where, file=file), env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["interrupted", "patched"], proc.stdout + proc.stderr


@pytest.mark.parametrize("damage", ["cut-short", "package-renamed", "path-changed", "appended"])
def test_an_enabled_stamp_whose_body_fails_its_check_is_not_believed(
    guard_venv: Venv, patches: Path, damage: str
) -> None:
    # Before: the stamp's package list was believed as it stood: a torn write or a flipped byte
    # ("tpkh") made the process wait for a package nothing imports, and tpkg ran unpatched.
    env = _env(patches)
    _prepare(guard_venv, env, "waiting")
    (stamp,) = _enabled_stamps()
    data = stamp.read_bytes()
    damaged = {"cut-short": data[:-4], "package-renamed": data.replace(b"\0tpkg\0", b"\0tpkh\0"),
               "path-changed": data.replace(b"site-packages", b"site-packagez", 1),
               "appended": data + b"7"}[damage]
    assert damaged != data
    stamp.write_bytes(damaged)
    first = guard_venv.run(FIRST, env=env)
    assert first.stdout.strip() != "_ImportpatchWaits", first.stdout + first.stderr
    proc = guard_venv.run(READ, env=env)
    assert (proc.returncode, proc.stdout.split()) == (0, ["patched"]), proc.stderr


@pytest.fixture(scope="module")
def pth_venv(venv_factory: Callable[..., Venv], built_wheel: Path) -> Venv:
    venv = venv_factory(str(built_wheel), name="guarantee-pth")
    _add_targets(venv.site_packages)
    return venv


@pytest.fixture
def own_venv(pth_venv: Venv) -> Iterator[Venv]:
    """A venv whose site folder the test may give .pth files: they are removed after it (each
    test has its own HOME, so its own stamps; the site folder's new mtime is a new key)."""
    before = set(pth_venv.site_packages.glob("*.pth"))
    yield pth_venv
    for pth in set(pth_venv.site_packages.glob("*.pth")) - before:
        pth.unlink()


def test_a_folder_a_later_pth_line_adds_is_searched_by_a_waiting_process(
    own_venv: Venv, patches: Path, tmp_path: Path
) -> None:
    # Before: the stamp was written where a .pth import line (read after ours) added nothing;
    # in a process where it adds a folder holding a patch package on by default, the waiting
    # process waited for the stamp's packages only, and tpkg2 ran unpatched. The stamp records
    # sys.path as site left it: another one starts the hook at once.
    extra = tmp_path / "extra"
    extra.mkdir()
    install_dist(own_venv, extra, "acme-patches", "1.0",
                 {"acme_patches/__init__.py": '''
                     from importpatch import Patch
                     Patch("acme", default=True).replace("tpkg2.mod:f", lambda: "acme")
                     '''},
                 entry_points="[importpatch.patches]\nacme = acme_patches\n")
    (own_venv.site_packages / "zz_extra.pth").write_text(
        "import os, sys; d = os.environ.get('IP_TEST_EXTRA'); d and sys.path.append(d)\n")
    time.sleep(0.1)
    env = _env(patches)
    _prepare(own_venv, env, "waiting")  # written without the folder
    code = "import tpkg2.mod, tpkg.mod; print(tpkg.mod.f(), tpkg2.mod.f())"  # tpkg2 first
    proc = own_venv.run(code, env={**env, "IP_TEST_EXTRA": str(extra)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["patched", "acme"], proc.stdout + proc.stderr
    # ... and still waits where the folder is not added.
    assert own_venv.run(FIRST, env=env).stdout.strip() == "_ImportpatchWaits"


DIFF = """\
--- a/tpkg/mod.py
+++ b/tpkg/mod.py
@@ -1,2 +1,2 @@
 def f():
-    return 'orig'
+    return 'diffed'
"""


@pytest.mark.parametrize("pth", ["aa_early.pth", "zz_late.pth"])
@pytest.mark.parametrize("kind", ["replace", "diff"])
def test_a_target_a_pth_file_imports_is_applied_late_or_named(
    own_venv: Venv, tmp_path: Path, pth: str, kind: str
) -> None:
    # A .pth read before ours (or after it, where the hook starts at the line) imports the
    # target. Before: the hook started after it and never looked: tpkg.mod ran unpatched, exit
    # 0, nothing on stderr. Now: late activation's rule at the start: a replace applies in
    # place; a diff cannot change code that ran, and every process says so by name.
    (own_venv.site_packages / pth).write_text("import tpkg.mod\n")
    folder = tmp_path / "patches"
    folder.mkdir()
    if kind == "replace":
        (folder / "p.py").write_text(PATCH)
    else:
        (folder / "p.diff").write_text(DIFF)
    time.sleep(0.1)
    for run in range(2):  # the first process builds the index; the second reads it
        proc = own_venv.run(READ, env=_env(folder))
        assert proc.returncode == 0, proc.stderr
        if kind == "replace":
            assert proc.stdout.split() == ["patched"], proc.stdout + proc.stderr
        elif run == 1 and pth == "zz_late.pth":
            # The hook at the line meets that import first, now that the index says what
            # patches target (the file a closed start reads too): it starts right there.
            assert (proc.stdout.split(), proc.stderr) == (["diffed"], "")
        else:
            assert proc.stdout.split() == ["orig"]
            assert "failed p to tpkg.mod" in proc.stderr, proc.stderr
            assert "imported before patching started" in proc.stderr, proc.stderr
    assert not _enabled_stamps()  # a target imported before the hook: never a waiting start
    if kind == "diff" and pth == "aa_early.pth":  # strict: stopped at its next import
        proc = own_venv.run("import tpkg2.mod", env=_env(folder, IMPORTPATCH_STRICT="1"))
        assert proc.returncode != 0, proc.stdout + proc.stderr
        assert "StrictError" in proc.stderr and "patch p" in proc.stderr, proc.stderr


def test_a_target_the_interpreter_imported_is_replaced_at_the_start(
    guard_venv: Venv, tmp_path: Path
) -> None:
    # `os` is imported before any .pth line: a replace of os:getcwd was a silent no-op (also
    # under strict mode). Now it applies in place at the start, as a late activation does.
    folder = tmp_path / "patches"
    folder.mkdir()
    (folder / "cwd.py").write_text(
        "from importpatch import Patch\n\n"
        "Patch('cwd').replace('os:getcwd', lambda: '/patched')\n")
    time.sleep(0.1)
    for extra in ({}, {"IMPORTPATCH_STRICT": "1"}):
        proc = guard_venv.run("import os; print(os.getcwd())", env=_env(folder, "cwd", **extra))
        assert (proc.returncode, proc.stdout.split()) == (0, ["/patched"]), proc.stderr
