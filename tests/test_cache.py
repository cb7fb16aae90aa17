"""The bytecode cache and the start-up budgets, on real installs and real child processes.

Compiles are counted inside the child (a counter around the loader's one compile step, see
ipc_helpers.COUNTED_IMPORT); cache files are read back with the installed ``bytecache.load``.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from conftest import Venv
from coreutil import write_wheel
from ipc_helpers import (
    cache_entries,
    can_mount_read_only,
    counted_import,
    diff_patch,
    patch_env,
    run_read_only,
    validate_cache,
)

MakeTarget = Callable[[Mapping[str, str]], Path]

MOD = "def f():\n    return 1\n\n\ndef g():\n    return 'g'\n"
TARGET = {"tpkg/__init__.py": "", "tpkg/mod.py": MOD, "tpkg/other.py": MOD}


@pytest.fixture
def setup(tmp_path: Path, target_pkg: MakeTarget) -> tuple[Path, Path, Path]:
    """(target folder, patches folder, cache folder) with a diff patch 'bump' on tpkg.mod."""
    target = target_pkg(TARGET)
    patches = tmp_path / "patches"
    diff_patch(patches, "bump", "tpkg.mod", "1", "2")
    return target, patches, tmp_path / "cache"


def test_second_process_loads_patched_code_from_cache_without_compiling(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    target, patches, cache = setup
    env = patch_env(patches, cache, "bump")
    first = counted_import(wheel_venv, ["tpkg.mod"], env, target)
    assert first["compiles"] == ["tpkg.mod"] and first["values"] == {"tpkg.mod": 2}
    assert len(cache_entries(cache)) == 1
    second = counted_import(wheel_venv, ["tpkg.mod"], env, target)
    assert second["compiles"] == [] and second["values"] == {"tpkg.mod": 2}


def test_one_byte_change_in_target_source_compiles_afresh(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    target, patches, cache = setup
    env = patch_env(patches, cache, "bump")
    counted_import(wheel_venv, ["tpkg.mod"], env, target)
    mod = target / "tpkg" / "mod.py"
    before = mod.stat()
    mod.write_text(MOD.replace("'g'", "'h'"), encoding="utf-8")  # same size
    os.utime(mod, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime too: only the bytes
    out = counted_import(wheel_venv, ["tpkg.mod"], env, target)
    assert out["compiles"] == ["tpkg.mod"] and out["values"] == {"tpkg.mod": 2}
    assert len(cache_entries(cache)) == 2
    again = counted_import(wheel_venv, ["tpkg.mod"], env, target)
    assert again["compiles"] == []


def test_one_byte_change_in_diff_patch_compiles_afresh(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    target, patches, cache = setup
    env = patch_env(patches, cache, "bump")
    assert counted_import(wheel_venv, ["tpkg.mod"], env, target)["values"] == {"tpkg.mod": 2}
    diff_patch(patches, "bump", "tpkg.mod", "1", "3")
    out = counted_import(wheel_venv, ["tpkg.mod"], env, target)
    assert out["compiles"] == ["tpkg.mod"] and out["values"] == {"tpkg.mod": 3}


TRANSFORM = """\
import ast
from importpatch import Patch

VALUE = {value}
p = Patch("consts")


@p.transform("tpkg.mod")
def set_return(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
            if node.value.value == 1:
                node.value = ast.Constant(VALUE)
    return tree
"""


def test_one_byte_change_in_transform_module_compiles_afresh(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    # The transform's own code does not change, only a constant of its module: still a new key.
    target, _, cache = setup
    patches = target.parent / "transforms"
    patches.mkdir()
    (patches / "consts.py").write_text(TRANSFORM.format(value=7), encoding="utf-8")
    env = patch_env(patches, cache, "consts")
    assert counted_import(wheel_venv, ["tpkg.mod"], env, target)["values"] == {"tpkg.mod": 7}
    assert counted_import(wheel_venv, ["tpkg.mod"], env, target)["compiles"] == []
    (patches / "consts.py").write_text(TRANSFORM.format(value=8), encoding="utf-8")
    out = counted_import(wheel_venv, ["tpkg.mod"], env, target)
    assert out["compiles"] == ["tpkg.mod"] and out["values"] == {"tpkg.mod": 8}


REPLACE = """\
from importpatch import Patch

p = Patch({name!r})


@p.replace("tpkg.mod:f")
def f():
    return {value}
"""


def test_replacement_body_and_patch_name_stay_out_of_the_key(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    # The compiled module only says *where* replacements land: a new replacement body, another
    # patch name or other log settings reuse the entry, and the new replacement is what runs.
    target, _, cache = setup
    patches = target.parent / "replaces"
    patches.mkdir()
    (patches / "r.py").write_text(REPLACE.format(name="first", value=10), encoding="utf-8")
    env = patch_env(patches, cache, "first")
    assert counted_import(wheel_venv, ["tpkg.mod"], env, target)["compiles"] == ["tpkg.mod"]
    (patches / "r.py").write_text(REPLACE.format(name="second", value=20), encoding="utf-8")
    env = patch_env(patches, cache, "second", IMPORTPATCH_LOG="1")
    out = counted_import(wheel_venv, ["tpkg.mod"], env, target)
    assert out["compiles"] == [] and out["values"] == {"tpkg.mod": 20}
    assert "applied second" in out["stderr"]
    assert len(cache_entries(cache)) == 1


def _damage(entry: Path, how: str, other: Path) -> None:
    data = entry.read_bytes()
    if how == "corrupt":  # one flipped byte in the payload, header intact
        i = len(data) - 10
        entry.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
    elif how == "truncated":
        entry.write_bytes(data[: len(data) // 2])
    elif how == "zero-length":
        entry.write_bytes(b"")
    elif how == "foreign":  # a whole valid entry of another module under this name
        entry.write_bytes(other.read_bytes())
    elif how == "garbage":
        entry.write_bytes(os.urandom(len(data)))


@pytest.mark.parametrize("how", ["corrupt", "truncated", "zero-length", "foreign", "garbage"])
def test_damaged_cache_entry_is_detected_recompiled_and_rewritten(
    wheel_venv: Venv, setup: tuple[Path, Path, Path], how: str
) -> None:
    target, patches, cache = setup
    diff_patch(patches, "bump-other", "tpkg.other", "1", "5")
    env = patch_env(patches, cache, "bump,bump-other")
    counted_import(wheel_venv, ["tpkg.other"], env, target)
    (other,) = cache_entries(cache)
    counted_import(wheel_venv, ["tpkg.mod"], env, target)
    (entry,) = set(cache_entries(cache)) - {other}
    _damage(entry, how, other)
    damaged = entry.read_bytes()
    out = counted_import(wheel_venv, ["tpkg.mod"], env, target)
    assert out["compiles"] == ["tpkg.mod"] and out["values"] == {"tpkg.mod": 2}
    assert entry.read_bytes() != damaged
    assert validate_cache(wheel_venv, cache) == {"good": 2, "bad": [], "stray": []}
    assert counted_import(wheel_venv, ["tpkg.mod"], env, target)["compiles"] == []


def test_target_package_pycache_is_never_read_or_written(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    target, patches, cache = setup
    mod = target / "tpkg" / "mod.py"
    # Plant a valid-looking .pyc of *other* code: same size and mtime as the real source, so
    # a plain import runs it (checked below) and a loader that read __pycache__ would too.
    real = mod.read_bytes()
    st = mod.stat()
    mod.write_bytes(real.replace(b"return 1", b"return 9"))
    pyc = Path(py_compile.compile(str(mod), doraise=True))
    mod.write_bytes(real)
    os.utime(mod, ns=(st.st_atime_ns, pyc_mtime_ns(pyc)))
    planted = pyc.read_bytes()
    plain = counted_import(wheel_venv, ["tpkg.mod"], {}, target)
    assert plain["values"] == {"tpkg.mod": 9}  # the stale .pyc is live
    env = patch_env(patches, cache, "bump")
    for _ in range(2):  # cold, then warm
        assert counted_import(wheel_venv, ["tpkg.mod"], env, target)["values"] == {"tpkg.mod": 2}
    assert pyc.read_bytes() == planted
    # Without a planted file, nothing is written there either (bytecode writing is on).
    shutil.rmtree(target / "tpkg" / "__pycache__")
    shutil.rmtree(cache)
    for _ in range(2):
        assert counted_import(wheel_venv, ["tpkg.mod"], env, target)["values"] == {"tpkg.mod": 2}
    assert not list((target / "tpkg").glob("__pycache__/mod.*"))
    assert list((target / "tpkg").glob("__pycache__/__init__.*"))  # unpatched: normal .pyc


def pyc_mtime_ns(pyc: Path) -> int:
    return int.from_bytes(pyc.read_bytes()[8:12], "little") * 1_000_000_000


@pytest.mark.parametrize("where", ["IMPORTPATCH_CACHE_DIR", "XDG_CACHE_HOME", "HOME"])
def test_cache_location_follows_the_documented_order(
    wheel_venv: Venv, setup: tuple[Path, Path, Path], tmp_path: Path, where: str
) -> None:
    target, patches, _ = setup
    places = {
        "IMPORTPATCH_CACHE_DIR": tmp_path / "explicit",
        "XDG_CACHE_HOME": tmp_path / "xdg",
        "HOME": tmp_path / "home",
    }
    expected = {
        "IMPORTPATCH_CACHE_DIR": places["IMPORTPATCH_CACHE_DIR"],
        "XDG_CACHE_HOME": places["XDG_CACHE_HOME"] / "importpatch",
        "HOME": places["HOME"] / ".cache" / "importpatch",
    }[where]
    places["HOME"].mkdir()  # a home folder that does not exist is never created (test_start)
    names = list(places)
    env: dict[str, str | None] = {"IMPORTPATCH_PATH": str(patches), "IMPORTPATCH_ENABLE": "bump"}
    # Variables before `where` in the order are unset; `where` and the ones after are set.
    for name in names:
        env[name] = str(places[name]) if names.index(name) >= names.index(where) else None
    counted_import(wheel_venv, ["tpkg.mod"], env, target)
    candidates = [
        places["IMPORTPATCH_CACHE_DIR"],
        places["XDG_CACHE_HOME"] / "importpatch",
        places["HOME"] / ".cache" / "importpatch",
    ]
    assert [len(cache_entries(c)) for c in candidates] == [int(c == expected) for c in candidates]
    assert stat.S_IMODE(expected.stat().st_mode) & 0o077 == 0  # created for the user alone


def _refused(wheel_venv: Venv, target: Path, env: Mapping[str, str | None], cache: Path) -> str:
    """Imports two patched modules twice; each time both are patched and compiled, nothing is
    written in the cache folder, and one line says why. Returns that line."""
    for _ in range(2):
        out = counted_import(wheel_venv, ["tpkg.mod", "tpkg.other"], env, target)
        assert out["values"] == {"tpkg.mod": 2, "tpkg.other": 5}
        assert out["compiles"] == ["tpkg.mod", "tpkg.other"]
        lines = [ln for ln in out["stderr"].splitlines() if "cache folder" in ln]
        assert len(lines) == 1, out["stderr"]
    assert not cache_entries(cache) and not (cache / "catalog").exists()
    return lines[0]


def test_world_writable_cache_folder_is_refused_and_still_patched(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    target, patches, cache = setup
    diff_patch(patches, "bump-other", "tpkg.other", "1", "5")
    cache.mkdir()
    cache.chmod(0o777)
    line = _refused(wheel_venv, target, patch_env(patches, cache, "bump,bump-other"), cache)
    assert "writable by others" in line


def test_foreign_owned_cache_folder_is_refused_and_still_patched(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    import pwd

    target, patches, cache = setup
    diff_patch(patches, "bump-other", "tpkg.other", "1", "5")
    cache.mkdir(mode=0o700)
    os.chown(cache, pwd.getpwnam("nobody").pw_uid, -1)  # the child runs as root: a foreign owner
    line = _refused(wheel_venv, target, patch_env(patches, cache, "bump,bump-other"), cache)
    assert "owned by another user" in line


RO_SCRIPT = "import importlib, json; print(json.dumps([importlib.import_module(m).f() for m in "
RO_SCRIPT += "('tpkg.mod', 'tpkg.other')]))"


@pytest.mark.skipif(not can_mount_read_only(), reason="needs root and unshare for a ro mount")
def test_read_only_cache_folder_compiles_without_cache_with_one_log_line(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    target, patches, cache = setup
    diff_patch(patches, "bump-other", "tpkg.other", "1", "5")
    cache.mkdir(mode=0o700)
    env = {**patch_env(patches, cache, "bump,bump-other"), "PYTHONPATH": str(target)}
    proc = run_read_only([cache], [str(wheel_venv.python), "-c", RO_SCRIPT], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[2, 5]"
    lines = [ln for ln in proc.stderr.splitlines() if "importpatch" in ln]
    assert len(lines) == 1 and "read-only" in lines[0], proc.stderr
    assert not any(cache.iterdir())
    # A process that patches nothing stays silent about it.
    quiet = run_read_only([cache], [str(wheel_venv.python), "-c", "pass"], {
        "IMPORTPATCH_CACHE_DIR": str(cache), "PYTHONPATH": str(target)})
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


@pytest.mark.skipif(not can_mount_read_only(), reason="needs root and unshare for a ro mount")
def test_read_only_site_packages_and_target_are_still_patched(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    target, patches, cache = setup
    env = {**patch_env(patches, cache, "bump"), "PYTHONPATH": str(target)}
    code = "import tpkg.mod; print(tpkg.mod.f())"
    for _ in range(2):  # cold cache, then warm
        proc = run_read_only(
            [wheel_venv.site_packages, target], [str(wheel_venv.python), "-c", code], env
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "2" and proc.stderr == ""
    assert len(cache_entries(cache)) == 1
    # Read-only everything: site-packages, the target and the cache folder.
    proc = run_read_only(
        [wheel_venv.site_packages, target, cache], [str(wheel_venv.python), "-c", code], env
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "2", proc.stderr


def test_no_cache_variable_compiles_every_time_and_writes_nothing(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    target, patches, cache = setup
    env = patch_env(patches, cache, "bump", IMPORTPATCH_NO_CACHE="1")
    for _ in range(2):
        out = counted_import(wheel_venv, ["tpkg.mod"], env, target)
        assert out["compiles"] == ["tpkg.mod"] and out["values"] == {"tpkg.mod": 2}
    assert not cache_entries(cache)


# ------------------------------------------------------------------ start-up budgets


def _imported(importtime_stderr: str) -> list[str]:
    return [
        line.rpartition("|")[2].strip()
        for line in importtime_stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    ]


def test_nothing_enabled_imports_no_importpatch_module(wheel_venv: Venv, tmp_path: Path) -> None:
    # The .pth's fast path (no IMPORTPATCH_ variable at all) imports nothing of the package once
    # the stamp exists. (A set IMPORTPATCH_ variable always runs the hook: its value is checked.)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = wheel_venv.run("pass", env=env)  # writes the "no default-on patch here" stamp
    assert first.returncode == 0 and first.stderr == "", first.stderr
    proc = wheel_venv.run(["-X", "importtime", "-c", "pass"], env=env)
    assert proc.returncode == 0
    mods = _imported(proc.stderr)
    assert "site" in mods  # importtime output is there, and the .pth ran
    assert not [m for m in mods if m.startswith("importpatch")], mods


def make_wheel(out: Path, dist: str, files: Mapping[str, str], entry_points: str) -> Path:
    """A real (pure-Python) wheel, written by hand: pip installs it like any other."""
    return write_wheel(out / f"{dist.replace('-', '_')}-1.0-py3-none-any.whl", dist, "1.0", files,
                       entry_points=entry_points)


DEFAULT_ON = """\
from importpatch import Patch

p = Patch("acme-default", default=True)


@p.replace("acme_target:f")
def f():
    return "patched"
"""


def test_default_on_patch_second_process_does_not_scan_entry_points(
    venv_factory: Callable[..., Venv], built_wheel: Path, tmp_path: Path
) -> None:
    patches_whl = make_wheel(
        tmp_path, "acme-patches",
        {"acme_patches.py": DEFAULT_ON, "acme_target.py": "def f():\n    return 'original'\n"},
        "[importpatch.patches]\nacme = acme_patches\n",
    )
    venv = venv_factory(str(built_wheel), str(patches_whl), name="default-on")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # no IMPORTPATCH_ variable at all
    code = "import acme_target, sys; print(acme_target.f(), 'importpatch._boot' in sys.modules)"
    first = venv.run(code, env=env)  # discovery: scans entry points, writes the index
    assert first.returncode == 0 and first.stdout.split() == ["patched", "True"], first.stderr
    proc = venv.run(["-X", "importtime", "-c", code], env=env)
    assert proc.returncode == 0 and proc.stdout.split() == ["patched", "True"], proc.stderr
    mods = _imported(proc.stderr)
    assert "importpatch._boot" in mods and "acme_target" in mods
    assert not [m for m in mods if m.startswith("importlib.metadata")], mods


@pytest.mark.parametrize("which", ["entry", "published text", "producers memo"])
def test_fifo_in_place_of_a_cache_file_is_ignored_not_waited_on(
    wheel_venv: Venv, setup: tuple[Path, Path, Path], which: str
) -> None:
    # Opening a FIFO for reading blocks until a writer comes: the import must not hang on one.
    target, patches, cache = setup
    env = patch_env(patches, cache, "bump")
    counted_import(wheel_venv, ["tpkg.mod"], env, target)
    (entry,) = cache_entries(cache)
    (published,) = (cache / "src").rglob("mod.py")
    path = {"entry": entry, "published text": published,
            "producers memo": cache / "catalog" / "producers"}[which]
    path.unlink()
    os.mkfifo(path)
    proc = wheel_venv.run(["-c", "import tpkg.mod as m; print(m.f())"],
                          env={**env, "PYTHONPATH": str(target)}, timeout=30)
    assert proc.returncode == 0 and proc.stdout.split() == ["2"], proc.stderr


SHOW_SOURCE = "import inspect, tpkg.mod as m; print(m.f.__code__.co_filename); "
SHOW_SOURCE += "print(inspect.getsource(m.f), end='')"


def test_warm_entry_never_names_a_published_file_in_a_folder_that_is_not_safe(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    # The code of an entry names the published file it was compiled under. When this process
    # cannot trust that folder (another user may write it), what inspect, linecache and Triton
    # read there is not the patched text: the entry must not be used as is.
    target, patches, cache = setup
    env = {**patch_env(patches, cache, "bump"), "PYTHONPATH": str(target)}
    cold = wheel_venv.run(["-c", SHOW_SOURCE], env=env)
    published = Path(cold.stdout.splitlines()[0])
    assert published.is_relative_to(cache / "src") and "return 2" in cold.stdout
    (cache / "src").chmod(0o777)
    published.parent.chmod(0o777)
    published.chmod(0o666)
    published.write_text("def f():\n    return 'written by someone else'\n", encoding="utf-8")
    warm = wheel_venv.run(["-c", SHOW_SOURCE], env=env)
    assert warm.returncode == 0, warm.stderr
    filename, *source = warm.stdout.splitlines()
    assert source == ["def f():", "    return 2"], warm.stdout
    assert filename == str(target / "tpkg" / "mod.py")
    assert "writable by others" in warm.stderr


ADD_PATCH = """\
from importpatch import Patch

patch = Patch("adder")


@patch.add("tpkg.side:C.{attr}")
def added(self):
    return "added"
"""
SIDE = "print('module body ran')\n\n\nclass C:\n    def kind(self):\n        return 1\n"


def test_facts_of_an_entry_are_those_of_the_enabled_operations(
    wheel_venv: Venv, tmp_path: Path, target_pkg: MakeTarget
) -> None:
    # An add on C and a set of C.kind both land on C (same landing names, same code), but what
    # the source must prove differs: an add of a name C already has fails *before* the module
    # body runs, cached or not.
    target = target_pkg({"tpkg/__init__.py": "", "tpkg/side.py": SIDE})
    patches = tmp_path / "patches"
    patches.mkdir()
    env = {**patch_env(patches, tmp_path / "cache", "adder"), "PYTHONPATH": str(target)}
    show = "import tpkg.side as m; print(m.C().kind())"
    (patches / "adder.py").write_text(ADD_PATCH.format(attr="extra"), encoding="utf-8")
    assert wheel_venv.run(["-c", show], env=env).stdout.split() == ["module", "body", "ran", "1"]
    (patches / "adder.py").write_text(ADD_PATCH.format(attr="kind"), encoding="utf-8")
    for how, run_env in (("no cache", {**env, "IMPORTPATCH_NO_CACHE": "1"}), ("cached", env)):
        proc = wheel_venv.run(["-c", show], env=run_env)
        assert proc.returncode != 0, how
        assert "'kind' already exists (line 5)" in proc.stderr, (how, proc.stderr)
        assert "module body ran" not in proc.stdout, how


PRUNE_ALL = "import sys; from importpatch.load import bytecache; bytecache.prune(sys.argv[1], 0, 0)"


def test_prune_leaves_the_temporary_file_of_a_writer_at_work(
    wheel_venv: Venv, setup: tuple[Path, Path, Path]
) -> None:
    # A prune (another process past the size cap, `importpatch cache prune`) that removes a
    # writer's temporary file makes its os.replace fail: the entry or the published text is not
    # written, and the code is compiled under the real path (tracebacks then read the original).
    target, patches, cache = setup
    counted_import(wheel_venv, ["tpkg.mod"], patch_env(patches, cache, "bump"), target)
    (entry,) = cache_entries(cache)
    (published,) = (cache / "src").rglob("mod.py")
    writing = [Path(f"{p}.4242-1.tmp") for p in (entry, published)]
    crashed = [Path(f"{p}.4343-1.tmp") for p in (entry, published)]
    for tmp in writing + crashed:
        tmp.write_bytes(b"half")
    for tmp in crashed:  # a writer that died two hours ago
        os.utime(tmp, (tmp.stat().st_atime - 7200, tmp.stat().st_mtime - 7200))
    assert wheel_venv.run(["-c", PRUNE_ALL, str(cache)]).returncode == 0
    assert not entry.exists() and not published.exists()
    assert [tmp.exists() for tmp in writing + crashed] == [True, True, False, False]
