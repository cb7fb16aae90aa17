"""Fault campaign: concurrency, damaged caches, broken patches and broken configuration.

Every scenario runs real child interpreters of the wheel venv. Broken configurations must never
break an unrelated Python process: ``python -c pass``, ``pip --version`` and unrelated imports keep
working; only the import of a targeted module fails, with a ``PatchError`` naming the patch.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from conftest import Venv, clean_env
from coreutil import COMPILE_SPY
from ipc_helpers import cache_entries, diff_patch, patch_env, validate_cache

MakeTarget = Callable[[Mapping[str, str]], Path]


def _big_module(n: int) -> str:
    # Big enough that compiling takes a while, so 16 cold processes overlap in compile and store.
    body = "".join(f"def h{i}(x):\n    return x + {i}\n\n\n" for i in range(n))
    return "def f():\n    return 1\n\n\n" + body


COLD_START = """\
import json, tpkg.a, tpkg.b, tpkg.c
print(json.dumps([tpkg.a.f(), tpkg.b.f(), tpkg.c.f()]))
"""


def test_16_processes_cold_start_on_one_empty_cache_all_patched_all_entries_valid(
    wheel_venv: Venv, target_pkg: MakeTarget, tmp_path: Path
) -> None:
    files = {"tpkg/__init__.py": ""}
    files.update({f"tpkg/{m}.py": _big_module(1500) for m in "abc"})
    target = target_pkg(files)
    patches = tmp_path / "patches"
    for m, new in zip("abc", "234", strict=True):
        diff_patch(patches, f"bump-{m}", f"tpkg.{m}", "1", new)
    cache = tmp_path / "cache"
    env = clean_env({
        **patch_env(patches, cache, "bump-a,bump-b,bump-c"), "PYTHONPATH": str(target)
    })
    procs = [
        subprocess.Popen(
            [str(wheel_venv.python), "-c", COLD_START], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for _ in range(16)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert json.loads(out) == [2, 3, 4], err
        assert err == ""
    assert validate_cache(wheel_venv, cache) == {"good": 3, "bad": [], "stray": []}
    assert len(cache_entries(cache)) == 3
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]
    # The published patched text (what tracebacks and Triton read) is complete too.
    published = sorted(p.read_text().splitlines()[1] for p in cache.glob("src/*/*.py"))
    assert published == ["    return 2", "    return 3", "    return 4"]


THREADS = COMPILE_SPY + """\
import importlib, json, sys, threading
import importpatch
barrier = threading.Barrier(16)
seen = []
def worker():
    barrier.wait()
    mod = importlib.import_module("tpkg.slow")
    seen.append((id(mod), mod.f(), mod.EXECUTIONS))
threads = [threading.Thread(target=worker) for _ in range(16)]
for th in threads:
    th.start()
for th in threads:
    th.join(60)
alive = sum(th.is_alive() for th in threads)
applied = [e["target"] for e in importpatch.applied()]
print(json.dumps({"alive": alive, "seen": sorted(set(seen)), "n": len(seen),
                  "compiles": compiles, "applied": applied}))
"""

SLOW = """\
import builtins
import time

builtins.__dict__.setdefault("_slow_runs", []).append(1)
EXECUTIONS = len(builtins._slow_runs)
time.sleep(0.3)  # every thread arrives while the module is executing


def f():
    return "original"
"""

REPLACE_SLOW = """\
from importpatch import Patch

p = Patch("slow-fix")


@p.replace("tpkg.slow:f")
def f():
    return "patched"
"""


@pytest.mark.parametrize("cache_state", ["cold", "warm"])
def test_threads_importing_one_target_concurrently_no_deadlock_patched_once(
    wheel_venv: Venv, target_pkg: MakeTarget, tmp_path: Path, cache_state: str
) -> None:
    target = target_pkg({"tpkg/__init__.py": "", "tpkg/slow.py": SLOW})
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "slow_fix.py").write_text(REPLACE_SLOW, encoding="utf-8")
    env = {**patch_env(patches, tmp_path / "cache", "slow-fix"), "PYTHONPATH": str(target)}
    if cache_state == "warm":
        assert wheel_venv.run("import tpkg.slow", env=env).returncode == 0
    proc = wheel_venv.run(THREADS, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["alive"] == 0 and out["n"] == 16
    assert len(out["seen"]) == 1 and out["seen"][0][1:] == ["patched", 1]  # one module, run once
    assert out["compiles"] == (["tpkg.slow"] if cache_state == "cold" else [])
    assert out["applied"] == ["tpkg.slow:f"]


# ------------------------------------------------------------------ broken patches / config

RAISES_AT_IMPORT = """\
from importpatch import Patch

p = Patch("boom")


@p.replace("tpkg.mod:f")
def f():
    return 2


raise RuntimeError("boom at import")
"""

TRANSFORM_RAISES = """\
from importpatch import Patch

p = Patch("bad-transform")


@p.transform("tpkg.mod")
def explode(tree):
    raise ValueError("transform exploded")
"""

MISSING_SYMBOL = """\
from importpatch import Patch

p = Patch("no-such-symbol")


@p.replace("tpkg.mod:does_not_exist")
def does_not_exist():
    return 2
"""

REPLACEMENT_RAISES = """\
from importpatch import Patch

p = Patch("raising-replacement")


@p.replace("tpkg.mod:f")
def f():
    raise KeyError("raised by the replacement")
"""

MALFORMED_DIFF = """\
Name: broken-diff
--- a/tpkg/mod.py
+++ b/tpkg/mod.py
@@ -1,2 +1,2 @@ this hunk says 2 lines but has one
-    return 1
"""

# (declaration file, enabled name, what importing tpkg.mod gives: PatchError text or value)
SCENARIOS = {
    "patch-module-raises-at-import": ("boom.py", RAISES_AT_IMPORT, "boom", "boom at import"),
    "transform-raises": ("t.py", TRANSFORM_RAISES, "bad-transform", "transform exploded"),
    "replace-missing-symbol": ("m.py", MISSING_SYMBOL, "no-such-symbol", "does_not_exist"),
    "malformed-diff": ("broken-diff.diff", MALFORMED_DIFF, "broken-diff", "malformed"),
    "replacement-raises-when-called": ("r.py", REPLACEMENT_RAISES, "raising-replacement", None),
    "unknown-patch-name": (None, None, "no-such-patch", None),
}

TRY_TARGET = """\
import json
try:
    import tpkg.mod
except ImportError as exc:
    from importpatch import PatchError
    print(json.dumps({"error": type(exc).__name__, "patch": getattr(exc, "patch", None),
                      "is_patch_error": isinstance(exc, PatchError), "message": str(exc)}))
else:
    try:
        print(json.dumps({"value": tpkg.mod.f()}))
    except Exception as exc:
        print(json.dumps({"call_raised": repr(exc)}))
"""


def _keeps_working(venv: Venv, env: Mapping[str, str | None]) -> None:
    """python -c pass, pip --version and an unrelated import work in this environment."""
    proc = venv.run("pass", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    pip = venv.run(["-m", "pip", "--version"], env=env)
    assert pip.returncode == 0 and pip.stdout.startswith("pip "), pip.stderr
    assert "Traceback" not in pip.stderr
    other = venv.run("import json, tpkg.other; print(tpkg.other.f())", env=env)
    assert other.returncode == 0 and other.stdout.strip() == "1", other.stderr


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_broken_patch_keeps_python_and_pip_working_and_target_fails_naming_the_patch(
    wheel_venv: Venv, target_pkg: MakeTarget, tmp_path: Path, scenario: str
) -> None:
    fname, text, name, expected = SCENARIOS[scenario]
    target = target_pkg({
        "tpkg/__init__.py": "", "tpkg/mod.py": "def f():\n    return 1\n",
        "tpkg/other.py": "def f():\n    return 1\n",
    })
    patches = tmp_path / "patches"
    patches.mkdir()
    if fname is not None:
        assert text is not None
        (patches / fname).write_text(text, encoding="utf-8")
    env = {**patch_env(patches, tmp_path / "cache", name), "PYTHONPATH": str(target)}
    _keeps_working(wheel_venv, env)
    for _ in range(2):  # the second run goes through the catalog index and any cache
        proc = wheel_venv.run(TRY_TARGET, env=env)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        if scenario == "replacement-raises-when-called":
            assert out == {"call_raised": "KeyError('raised by the replacement')"}
        elif scenario == "unknown-patch-name":
            assert out == {"value": 1}
            assert "unknown patch name(s) no-such-patch" in proc.stderr
        else:
            assert out["is_patch_error"] and out["patch"] == name, out
            assert f"patch {name!r}" in out["message"] and "tpkg.mod" in out["message"]
            assert expected in out["message"], out["message"]


GARBAGE = "\x01;;,, ../../etc/passwd $(rm -rf /) \u2603 \\x00 all all=1 -- ,"


@pytest.mark.parametrize("prefix", ["IMPORTPATCH_", "VLLM_IMPORTPATCH_"])
def test_garbage_in_every_variable_keeps_python_and_pip_working(
    wheel_venv: Venv, target_pkg: MakeTarget, tmp_path: Path, prefix: str
) -> None:
    target = target_pkg({"tpkg/__init__.py": "", "tpkg/other.py": "def f():\n    return 1\n"})
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    names = ["ENABLE", "DISABLE", "OFF", "PATH", "LOG", "EVENTS_DIR", "CACHE_DIR", "NO_CACHE"]
    env: dict[str, str | None] = {prefix + n: GARBAGE for n in names}
    env[prefix + "OFF"] = "maybe?"  # garbage, not a documented "off" value
    env[prefix + "CACHE_DIR"] = str(blocker / "cache")  # under a file: cannot exist
    env[prefix + "EVENTS_DIR"] = str(blocker / "events")
    env["PYTHONPATH"] = str(target)
    env["XDG_CACHE_HOME"] = str(blocker)
    _keeps_working(wheel_venv, env)
    # And with the kill switch off, so the garbage actually reaches the parser.
    env[prefix + "OFF"] = "0"
    _keeps_working(wheel_venv, env)
    proc = wheel_venv.run("pass", env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_patch_error_is_documented_and_target_stays_unimported(
    wheel_venv: Venv, target_pkg: MakeTarget, tmp_path: Path
) -> None:
    # After the failed import the module is not in sys.modules; a second import fails the same.
    target = target_pkg({"tpkg/__init__.py": "", "tpkg/mod.py": "def f():\n    return 1\n"})
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "t.py").write_text(TRANSFORM_RAISES, encoding="utf-8")
    env = {**patch_env(patches, tmp_path / "cache", "bad-transform"), "PYTHONPATH": str(target)}
    code = textwrap.dedent("""
        import sys
        from importpatch import PatchError
        for _ in range(2):
            try:
                import tpkg.mod
            except PatchError as exc:
                assert "tpkg.mod" not in sys.modules
                print(exc.patch, exc.module)
    """)
    proc = wheel_venv.run(code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["bad-transform tpkg.mod"] * 2
