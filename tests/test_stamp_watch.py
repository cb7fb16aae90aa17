"""Nothing enabled costs the floor on the set-ups users have (issue 35, item 1): a PYTHONPATH
folder, or only IMPORTPATCH_CACHE_DIR set, no longer start the hook in every process. The
nothing-on stamp covers what could change the answer: with PYTHONPATH it records sys.path and
the (mtime, ctime, inode) of each folder beside the site folder, which the .pth line compares
with a ``stat`` each; with only a cache folder of its own set, the stamp lives there. Each test
makes the change that must be seen (a patch package on by default appearing in the folder, a
folder appearing, another working folder for a relative PYTHONPATH, a damaged stamp) and checks
that the next process sees it. The instruction counts are in docs/benchmarks.md (bench/).
"""

from __future__ import annotations

import ast
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Venv, current_home
from coreutil import install_dist

LOADED = "import sys; print(sorted(m for m in sys.modules if m.startswith('importpatch')))"
READ = "import tpkg.mod; print(tpkg.mod.f())"


@pytest.fixture(scope="module")
def watch_venv(venv_factory: Callable[..., Venv], built_wheel: Path) -> Venv:
    venv = venv_factory(str(built_wheel), name="stamp-watch")
    (venv.site_packages / "tpkg").mkdir()
    (venv.site_packages / "tpkg" / "__init__.py").write_text("")
    (venv.site_packages / "tpkg" / "mod.py").write_text("def f():\n    return 'orig'\n")
    time.sleep(0.1)
    return venv


def _loaded(venv: Venv, env: dict[str, str], cwd: Path | None = None) -> list[str]:
    proc = venv.run(LOADED, env=env, cwd=cwd)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return ast.literal_eval(proc.stdout.strip())  # type: ignore[no-any-return]


def _default_on_package(venv: Venv, folder: Path) -> None:
    install_dist(venv, folder, "acme-patches", "1.0",
                 {"acme_patches/__init__.py": '''
                     from importpatch import Patch
                     Patch("acme", default=True).replace("tpkg.mod:f", lambda: "acme")
                     '''},
                 entry_points="[importpatch.patches]\nacme = acme_patches\n")
    time.sleep(0.1)  # past the racy window of the folder's new mtime


def _stamps(root: Path) -> list[Path]:
    return [p for p in (root / "s").glob("*") if not p.name.startswith(("t-", "e-"))]


@pytest.mark.parametrize("exists", [True, False], ids=["folder", "missing-folder"])
def test_a_pythonpath_folder_keeps_the_floor_and_a_patch_package_there_is_seen(
    watch_venv: Venv, tmp_path: Path, exists: bool
) -> None:
    # Before: a PYTHONPATH folder made every process start the whole hook (1.60x `python -c
    # pass`), since no stamp could cover a folder that can gain a distribution.
    folder = tmp_path / "pp"
    if exists:
        folder.mkdir()
        time.sleep(0.1)
    env = {"PYTHONPATH": str(folder)}
    assert "importpatch._boot" in _loaded(watch_venv, env)  # the first process decides
    (stamp,) = _stamps(current_home() / ".cache" / "importpatch")
    assert stamp.read_bytes().startswith(b"W\0"), stamp.read_bytes()
    assert _loaded(watch_venv, env) == []  # every later one: the line's check, nothing more
    _default_on_package(watch_venv, folder)  # (creates the folder where it was missing)
    proc = watch_venv.run(READ, env=env)
    assert (proc.returncode, proc.stdout.split()) == (0, ["acme"]), proc.stderr
    assert watch_venv.run(READ, env=env).stdout.split() == ["acme"]  # and the next one


def test_a_relative_pythonpath_is_another_folder_in_another_working_folder(
    watch_venv: Venv, tmp_path: Path
) -> None:
    # PYTHONPATH=src names ./src of each process: the stamp one wrote in a/ must not stand for
    # b/src, where a patch package on by default is installed.
    a, b = tmp_path / "a", tmp_path / "b"
    for work in (a, b):
        (work / "src").mkdir(parents=True)
    _default_on_package(watch_venv, b / "src")
    env = {"PYTHONPATH": "src"}
    _loaded(watch_venv, env, cwd=a)
    assert _loaded(watch_venv, env, cwd=a) == []
    proc = watch_venv.run(READ, env=env, cwd=b)
    assert (proc.returncode, proc.stdout.split()) == (0, ["acme"]), proc.stderr


@pytest.mark.parametrize("damage", ["flip", "cut"])
def test_a_damaged_watch_stamp_is_not_believed(
    watch_venv: Venv, tmp_path: Path, damage: str
) -> None:
    folder = tmp_path / "pp"
    folder.mkdir()
    time.sleep(0.1)
    env = {"PYTHONPATH": str(folder)}
    _loaded(watch_venv, env)
    (stamp,) = _stamps(current_home() / ".cache" / "importpatch")
    data = stamp.read_bytes()
    # A folder's recorded inode changed by a flipped digit, or the check cut short: the hook
    # starts and decides (and writes the stamp again).
    stamp.write_bytes(data.replace(b"\t", b"1\t", 1) if damage == "flip" else data[:-2])
    assert "importpatch._boot" in _loaded(watch_venv, env)
    assert _loaded(watch_venv, env) == []


def test_only_a_cache_folder_set_keeps_the_floor_and_its_stamp_lives_there(
    watch_venv: Venv, tmp_path: Path
) -> None:
    # Before: IMPORTPATCH_CACHE_DIR alone (a cache volume, patches off) wrote no stamp, so the
    # whole hook started in every process (1.38x).
    cache = tmp_path / "volume"
    env = {"IMPORTPATCH_CACHE_DIR": str(cache)}
    assert "importpatch._boot" in _loaded(watch_venv, env)
    assert [p.read_bytes() for p in _stamps(cache)] == [b""]
    assert not _stamps(current_home() / ".cache" / "importpatch")  # not in the HOME's cache
    assert _loaded(watch_venv, env) == []
    # Patches enabled with the same cache folder: the hook starts and applies them.
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "p.py").write_text("from importpatch import Patch\n\n"
                                  "Patch('p').replace('tpkg.mod:f', lambda: 'patched')\n")
    proc = watch_venv.run(READ, env={**env, "IMPORTPATCH_PATH": str(patches),
                                     "IMPORTPATCH_ENABLE": "p"})
    assert (proc.returncode, proc.stdout.split()) == (0, ["patched"]), proc.stderr
    # A relative cache folder is never looked up by the line: the hook decides every time.
    rel = {"IMPORTPATCH_CACHE_DIR": "rel-cache"}
    _loaded(watch_venv, rel, cwd=tmp_path)
    assert "importpatch._boot" in _loaded(watch_venv, rel, cwd=tmp_path)


def test_a_patch_folder_with_nothing_on_stops_at_the_line_and_sees_a_change(
    watch_venv: Venv, tmp_path: Path
) -> None:
    # Before: IMPORTPATCH_PATH set and nothing enabled (a team's folder, patches off) started
    # the whole hook and read the index in every process (2.96x with 1,000 files). Now the
    # enabled stamp says "nothing on" for exactly these variables, with the signature of every
    # path the index watched: one stat a file, and any edit starts the hook again.
    patches = tmp_path / "patches"
    patches.mkdir()
    for i in range(3):
        (patches / f"p{i}.py").write_text(
            "from importpatch import Patch\n\n"
            f"Patch('p{i}').replace('tpkg.mod:f', lambda: 'p{i}')\n")
    time.sleep(0.1)
    env = {"IMPORTPATCH_PATH": str(patches)}
    assert "importpatch._boot" in _loaded(watch_venv, env)
    # (only the check: the slot's module loads only where a process waits)
    assert _loaded(watch_venv, env) == ["importpatch._pth_on"]
    assert watch_venv.run(READ, env=env).stdout.split() == ["orig"]
    # An edit in place (the folder's mtime unchanged) turns one on by default.
    path = patches / "p1.py"
    path.write_text(path.read_text().replace("Patch('p1')", "Patch('p1', default=True)")
                    .replace("lambda: 'p1'", "lambda: 'on'"))
    time.sleep(0.1)
    proc = watch_venv.run(READ, env=env)
    assert (proc.returncode, proc.stdout.split()) == (0, ["on"]), proc.stderr
    # Other variables are another stamp: enabling one starts the hook and applies it.
    proc = watch_venv.run(READ, env={**env, "IMPORTPATCH_ENABLE": "p2",
                                     "IMPORTPATCH_DISABLE": "p1"})
    assert (proc.returncode, proc.stdout.split()) == (0, ["p2"]), proc.stderr


def test_an_edit_in_place_in_a_thousand_file_folder_is_seen_by_the_next_process(
    watch_venv: Venv, tmp_path: Path
) -> None:
    # The enabled stamp keeps one ctime a watched path (compared with one stat each, no string
    # built: a 1,000-file folder cost 18k instructions a file, now ~8k): every edit that leaves
    # the folder's mtime as it was must still be seen, nothing on and one enabled alike.
    patches = tmp_path / "patches"
    patches.mkdir()
    for i in range(1000):
        (patches / f"p{i:04d}.py").write_text(
            "from importpatch import Patch\n\n"
            f"Patch('p{i}').replace('tpkg.mod:f', lambda: 'p{i}')\n#{'.' * 40}\n")
    time.sleep(0.1)
    env = {"IMPORTPATCH_PATH": str(patches)}
    assert "importpatch._boot" in _loaded(watch_venv, env)  # discovery; writes the stamp
    assert _loaded(watch_venv, env) == ["importpatch._pth_on"]  # nothing on: the line stops
    folder_mtime = patches.stat().st_mtime_ns
    # Enabling a patch by an edit in place, its size and mtime kept (as `cp -p` or a restoring
    # tool leaves them): only the file's ctime moves.
    path = patches / "p0500.py"
    before = path.stat()
    text = path.read_text()
    on_text = "Patch('p500', default=True)"
    edited = text.replace("Patch('p500')", on_text).replace(
        "." * (len(on_text) - len("Patch('p500')")), "", 1)  # the same size
    assert len(edited) == len(text) and edited != text
    path.write_text(edited)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    time.sleep(0.1)
    assert patches.stat().st_mtime_ns == folder_mtime
    proc = watch_venv.run(READ, env=env)
    assert (proc.returncode, proc.stdout.split()) == (0, ["p500"]), proc.stderr
    path.write_text(text)  # off again
    time.sleep(0.1)
    # One enabled by variables, the process waiting (the target not imported): an edit of the
    # enabled file in the same way is seen at the next import.
    on = {**env, "IMPORTPATCH_ENABLE": "p7"}
    proc = watch_venv.run(READ, env=on)
    assert (proc.returncode, proc.stdout.split()) == (0, ["p7"]), proc.stderr
    assert _loaded(watch_venv, on) == ["importpatch._pth_on", "importpatch._slot"]  # waits
    path = patches / "p0007.py"
    before = path.stat()
    path.write_text(path.read_text().replace("lambda: 'p7'", "lambda: 'q7'"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    time.sleep(0.1)
    assert patches.stat().st_mtime_ns == folder_mtime
    proc = watch_venv.run(READ, env=on)
    assert (proc.returncode, proc.stdout.split()) == (0, ["q7"]), proc.stderr
