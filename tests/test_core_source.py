"""After a source diff, everyone who reads source sees the patched text: inspect, linecache (also
after clearcache/checkcache), the traceback module and the interpreter's own uncaught-exception
traceback; ``__file__`` stays the real path and the package's __pycache__ is never written."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import Venv, make_venv
from coreutil import Lab

TARGET = {
    "spkg/__init__.py": "",
    "spkg/m.py": '''
        def boom():
            raise ValueError("original message")


        class Thing:
            def kind(self):
                return "original"
        ''',
}
DIFF = {"sd.diff": "\n".join([
    "Name: sd",
    "--- a/spkg/m.py",
    "+++ b/spkg/m.py",
    "@@ -1,8 +1,9 @@",
    " ",
    " def boom():",
    '-    raise ValueError("original message")',
    "+    # an inserted line: everything below moves down by one",
    '+    raise ValueError("patched message")',
    " ",
    " ",
    " class Thing:",
    "     def kind(self):",
    '-        return "original"',
    '+        return "patched"',
    "",
])}
SHOW = '''
import inspect, json, linecache, os, sys, traceback
import spkg.m as m
out = {"fn": inspect.getsource(m.boom), "cls": inspect.getsource(m.Thing),
       "line": linecache.getline(m.__file__, 4)}
linecache.clearcache()
linecache.checkcache()
out["after_clear"] = [inspect.getsource(m.Thing), linecache.getline(m.__file__, 4),
                      linecache.getline(m.boom.__code__.co_filename, 4)]
try:
    m.boom()
except ValueError:
    out["format_exc"] = traceback.format_exc()
out["file"] = m.__file__
out["pycache"] = sorted(os.listdir(os.path.join(os.path.dirname(m.__file__), "__pycache__")))
print(json.dumps(out), flush=True)
m.boom()  # uncaught: the interpreter prints this traceback itself
'''


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` that runs (pyenv shims need PYENV_VERSION)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python{version}"),
                  *sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))]
    for exe in filter(None, candidates):
        if subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0:
            return exe
    return None


@pytest.fixture(scope="module", params=["3.11", "3.12", "3.13"])
def venv(request: pytest.FixtureRequest, built_wheel: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Venv:
    if request.param == "3.11":
        venv: Venv = request.getfixturevalue("wheel_venv")
        return venv
    exe = find_python(request.param)
    if exe is None:
        pytest.skip(f"no python{request.param} here")
    return make_venv(tmp_path_factory.mktemp(f"py{request.param}") / "venv", str(built_wheel),
                     python=exe)


def test_patched_text_is_what_inspect_linecache_and_tracebacks_show(
    venv: Venv, tmp_path: Path
) -> None:
    lab = Lab(venv, tmp_path).target(TARGET).patch(DIFF)
    (lab.root / "show.py").write_text(SHOW)
    proc = lab.run(["show.py"], enable="sd")  # PYTHONDONTWRITEBYTECODE is not passed on
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    patched_raise = '    raise ValueError("patched message")\n'
    assert out["fn"] == (
        "def boom():\n    # an inserted line: everything below moves down by one\n" + patched_raise
    )
    assert out["cls"] == 'class Thing:\n    def kind(self):\n        return "patched"\n'
    assert out["line"] == patched_raise
    assert out["after_clear"] == [out["cls"], patched_raise, patched_raise]
    assert patched_raise.strip() in out["format_exc"]
    assert "original message" not in out["format_exc"]
    assert out["file"] == str(lab.targets / "spkg" / "m.py")
    # bytecode is written (the __init__ is there) but never for the patched module
    assert out["pycache"] and not [n for n in out["pycache"] if n.startswith("m.")], out
    # the interpreter's own traceback reads the file by name: the published file has the text
    tb = proc.stderr.splitlines()
    assert tb[-1] == "ValueError: patched message"
    assert patched_raise.strip() in [line.strip() for line in tb], proc.stderr
    assert ", line 4, in boom" in proc.stderr


# Something reads the published file (Triton at decoration, a debugger), then it goes away or is
# rewritten while the process runs (`importpatch cache prune` or `clear` in another process).
AFTER_PUBLISHED_FILE_CHANGES = '''
import inspect, json, linecache, os, sys, traceback
import spkg.m as m
published = m.boom.__code__.co_filename
inspect.getsource(m.boom)
if sys.argv[1] == "deleted":
    os.unlink(published)
else:
    with open(published, "w") as f:
        f.write("def boom():\\\\n    pass\\\\n    raise ValueError('not the patched text')\\\\n")
out = {"published": published}
try:
    m.boom()
except ValueError:
    out["format_exc"] = traceback.format_exc()
linecache.clearcache()
out["getsource"] = inspect.getsource(m.boom)
print(json.dumps(out))
'''


@pytest.mark.parametrize("change", ["deleted", "rewritten"])
@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_patched_text_stays_readable_when_the_published_file_changes_while_running(
    wheel_venv: Venv, tmp_path: Path, change: str, cache: str
) -> None:
    lab = Lab(wheel_venv, tmp_path).target(TARGET).patch(DIFF)
    (lab.root / "show.py").write_text(AFTER_PUBLISHED_FILE_CHANGES)
    if cache == "warm":
        lab.ok("import spkg.m", enable="sd")
    out = json.loads(lab.ok(["show.py", change], enable="sd").stdout)
    assert Path(out["published"]).is_relative_to(lab.cache / "src")
    patched_raise = 'raise ValueError("patched message")'
    assert f'm.py", line 4, in boom\n    {patched_raise}\n' in out["format_exc"], out
    assert out["getsource"] == (
        "def boom():\n    # an inserted line: everything below moves down by one\n"
        f"    {patched_raise}\n"
    )
