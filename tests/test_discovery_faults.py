"""Every request resolves, or its targets fail closed (issue 34, item 2, discovery's side; and
item 5's forking patch module). A patch file whose declaration raises, runs past the discovery
limit or cannot be read is known by the names and targets its text states (and those it had in
the previous index), so the name a user enabled fails its targets closed instead of "unknown
patch name"; a discovery child that dies keeps what it finished, the rest fails closed, and a
kill is retried, not recorded; a multi-GB "diff" is refused by its size; a patch module that
forks does not run the program twice. Real venvs with the built wheel, real child interpreters;
each test failed on the code before this work."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import time

import pytest
from conftest import clean_env
from coreutil import Lab

TARGET = {"tpkg/__init__.py": "", "tpkg/mod.py": "def f():\n    return 'orig'\n",
          "tpkg/other.py": "def f():\n    return 'orig'\n",
          "tpkg/third.py": "def f():\n    return 'orig'\n"}
READ = "import tpkg.mod; print(tpkg.mod.f())"
READ_OTHER = "import tpkg.other; print(tpkg.other.f())"
GOOD = """\
from importpatch import Patch
Patch("good").replace("tpkg.mod:f", lambda: "patched")
"""

pytestmark = pytest.mark.lab(target=TARGET)


def patch_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The PatchError that ended ``proc`` (its last line), after checking it ended so."""
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("importpatch.errors.PatchError: importpatch: patch "), proc.stderr
    return last


# A Liger-style patch file (issue 34, item 4): a module-level import of what is not installed
# (or an exit) before the Patch it would make; the file's stem is not the patch's name.
RAISING = """\
{statement}
from importpatch import Patch
fix = Patch("liger-fix")
fix.replace("tpkg.other:f", lambda: "patched")
"""


@pytest.mark.parametrize("statement", ["from liger_kernel_absent import ops",
                                       "raise SystemExit(3)"])
def test_a_raising_declaration_enabled_by_its_patch_name_fails_its_target_closed(
    lab: Lab, statement: str
) -> None:
    lab.patch({"liger_rmsnorm.py": RAISING.format(statement=statement), "good.py": GOOD})
    time.sleep(0.1)  # not racy: the index is written, and the second process reads it
    for _ in range(2):
        proc = lab.run(f"{READ}\n{READ_OTHER}", enable="good,liger-fix")
        assert proc.stdout.strip() == "patched", proc.stderr  # the healthy patch applies
        assert "unknown patch name" not in proc.stderr, proc.stderr
        last = patch_error(proc)
        # The patch, the file, the reason and the fix.
        assert "patch 'liger-fix' cannot apply to tpkg.other" in last, last
        assert str(lab.patches / "liger_rmsnorm.py") in last, last
        reason = "ModuleNotFoundError" if "import" in statement else "SystemExit: 3"
        assert reason in last and "importpatch check liger-fix" in last, last


SPIN = """\
while True:
    pass
from importpatch import Patch
Patch("slow-fix").replace("tpkg.other:f", lambda: "patched")
"""


def test_a_timed_out_declaration_enabled_by_its_patch_name_fails_its_target_closed(
    lab: Lab
) -> None:
    lab.patch({"spin_decl.py": SPIN, "good.py": GOOD})
    env = {"IMPORTPATCH_DISCOVERY_TIMEOUT": "2"}
    proc = lab.run(f"{READ}\n{READ_OTHER}", enable="good,slow-fix", env=env, timeout=90)
    assert proc.stdout.strip() == "patched", proc.stderr
    assert "unknown patch name" not in proc.stderr, proc.stderr
    last = patch_error(proc)
    assert "patch 'slow-fix' cannot apply to tpkg.other" in last, last
    assert str(lab.patches / "spin_decl.py") in last and "did not finish" in last, last
    assert "IMPORTPATCH_DISCOVERY_TIMEOUT" in last, last


COMPUTED = """\
{statement}
from importpatch import Patch
Patch("fix-" + "computed").replace("tpkg.other:f", lambda: "patched")
"""


def test_a_file_broken_after_it_loaded_keeps_the_names_and_targets_of_the_last_index(
    lab: Lab
) -> None:
    # Its name is computed: its text does not state it. The previous index knew it.
    lab.patch({"computed.py": COMPUTED.format(statement="")})
    time.sleep(0.1)
    assert lab.ok(READ_OTHER, enable="fix-computed").stdout.strip() == "patched"
    (lab.patches / "computed.py").write_text(
        COMPUTED.format(statement="raise ImportError('a dependency moved')"))
    time.sleep(0.1)
    proc = lab.run(READ_OTHER, enable="fix-computed")
    assert "unknown patch name" not in proc.stderr, proc.stderr
    last = patch_error(proc)
    assert "patch 'fix-computed' cannot apply to tpkg.other" in last, last
    assert "a dependency moved" in last and "importpatch check fix-computed" in last, last


KILLED = """\
import os, signal
if os.environ.get("KILL_DISCOVERY") and os.environ.get("_IMPORTPATCH_DISCOVERING"):
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does, while it declares
from importpatch import Patch
Patch("killed").replace("tpkg.other:f", lambda: "patched")
"""
LATER = """\
from importpatch import Patch
Patch("later").replace("tpkg.third:f", lambda: "patched")
"""


def test_a_killed_discovery_keeps_what_finished_fails_the_rest_closed_and_is_retried(
    lab: Lab
) -> None:
    # Issue 34, item 5: the discovery child killed (the OOM killer while a container starts many
    # workers) failed the whole activation, and the healthy patches' targets ran unpatched; a
    # kill during a declaration recorded that patch broken until its file changed.
    lab.patch({"a_good.py": GOOD, "b_killed.py": KILLED, "c_later.py": LATER})
    time.sleep(0.1)  # not racy: an index would be written
    enable = "good,killed,later"
    kill = {"KILL_DISCOVERY": "1"}
    proc = lab.run(READ, enable=enable, env=kill)
    assert proc.returncode == 0 and proc.stdout.strip() == "patched", proc.stderr  # finished
    for code, name, file in ((READ_OTHER, "killed", "b_killed.py"),
                             ("import tpkg.third; print(tpkg.third.f())", "later", "c_later.py")):
        last = patch_error(lab.run(code, enable=enable, env=kill))  # not finished: closed
        assert f"patch '{name}' cannot apply" in last, last
        assert f"discovery ended before it finished {lab.patches / file}" in last, last
        assert "killed by SIGKILL" in last and "the next process discovers again" in last, last
    assert not list(lab.cache.glob("catalog/*.marshal"))  # a kill is not written down
    # The next process, not killed, discovers again and applies all three.
    code = f"{READ}\n{READ_OTHER}\nimport tpkg.third; print(tpkg.third.f())"
    proc = lab.ok(code, enable=enable)
    assert proc.stdout.split() == ["patched"] * 3, proc.stderr
    assert list(lab.cache.glob("catalog/*.marshal"))


CLEARS_META_PATH = """\
import sys
from importpatch import Patch
Patch("clears").replace("tpkg.other:f", lambda: "patched")
sys.meta_path.clear()
"""


def test_a_declaration_that_breaks_discovery_outside_itself_keeps_the_healthy_patches(
    lab: Lab
) -> None:
    # A declaration that clears sys.meta_path: discovery fails after it, outside any declaration
    # (listing the patch packages). What finished stands; the process says what did not.
    lab.patch({"a_good.py": GOOD, "b_clears.py": CLEARS_META_PATH})
    proc = lab.run(READ, enable="good")
    assert proc.returncode == 0 and proc.stdout.strip() == "patched", proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "discovery ended before it finished listing the patch packages" in proc.stderr
    assert "after " + str(lab.patches / "b_clears.py") + " finished" in proc.stderr


HUGE_HEADER = """\
Name: huge
Summary: not a patch: a core dump someone named .diff

--- a/tpkg/other.py
+++ b/tpkg/other.py
@@ -1,2 +1,2 @@
 def f():
-    return 'orig'
+    return 'patched'
"""


def test_a_multi_gigabyte_sparse_diff_is_refused_by_its_size_and_healthy_patches_apply(
    lab: Lab
) -> None:
    huge = lab.patches / "huge.diff"
    huge.write_text(HUGE_HEADER)
    os.truncate(huge, 8 << 30)  # 8 GiB, sparse: no disk used
    lab.patch({"good.py": GOOD})
    # Reading it whole (what discovery did) needs 8 GiB: the child may have 2 GiB of address
    # space, ample for an interpreter, so that a read of it fails here rather than swap the
    # machine.
    def two_gib() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    env = clean_env(lab.env("good,huge"))
    proc = subprocess.run([str(lab.venv.python), "-c", f"{READ}\n{READ_OTHER}"], env=env,
                          cwd=lab.root, capture_output=True, text=True, timeout=120,
                          preexec_fn=two_gib)
    assert proc.stdout.strip() == "patched", proc.stderr  # the healthy patch applies
    last = patch_error(proc)
    assert "patch 'huge' cannot apply to tpkg.other" in last, last
    assert f"{huge} is 8.0 GiB (8589934592 bytes), more than a patch file may be" in last, last
    assert "not read" in last and "MemoryError" not in proc.stderr, last
    listed = json.loads(lab.ok(["-m", "importpatch", "list", "--json"], enable=None).stdout)
    (row,) = [r for r in listed["patches"] if r["name"] == "huge"]
    assert "more than a patch file may be (64 MiB)" in row["error"], row


FORKS = """\
import os
from importpatch import Patch
Patch("forks").replace("tpkg.mod:f", lambda: "patched")
child = os.fork()  # a daemon started at import, whose child falls off the end of the file
if child:
    os.waitpid(child, 0)
"""


@pytest.mark.parametrize("timeout", ["120", "0"])  # discovery in a child / in the process
def test_a_patch_module_that_forks_does_not_run_the_program_twice(
    lab: Lab, timeout: str
) -> None:
    lab.patch({"forks.py": FORKS})
    code = f"print('start', flush=True)\n{READ}\nprint('end')"
    for _ in range(2):  # discovers, then from the index (the file runs at the import)
        proc = lab.ok(code, enable="forks", env={"IMPORTPATCH_DISCOVERY_TIMEOUT": timeout})
        assert proc.stdout.split() == ["start", "patched", "end"], proc.stdout + proc.stderr


def test_a_discovery_child_killed_by_sigterm_from_outside_is_retried(lab: Lab) -> None:
    # The kill comes from outside (a container's stop, a supervisor), not from patch code.
    ready = lab.root / "ready"
    lab.patch({"a_good.py": GOOD, "b_waits.py": f"""
        import os, time
        if os.environ.get("_IMPORTPATCH_DISCOVERING") and os.environ.get("WAIT_IN_DISCOVERY"):
            with open({str(ready)!r}, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(60)
        from importpatch import Patch
        Patch("waits").replace("tpkg.other:f", lambda: "patched")
        """})
    time.sleep(0.1)
    env = clean_env({**lab.env("good,waits"), "WAIT_IN_DISCOVERY": "1"})
    child = subprocess.Popen([str(lab.venv.python), "-c", f"{READ}\n{READ_OTHER}"], env=env,
                             cwd=lab.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(int(ready.read_text()), signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 1 and out.strip() == "patched", err
    assert "patch 'waits' cannot apply" in err and "killed by SIGTERM" in err, err
    proc = lab.ok(f"{READ}\n{READ_OTHER}", enable="good,waits")
    assert proc.stdout.split() == ["patched", "patched"], proc.stderr
