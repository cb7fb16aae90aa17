"""Issue 35, item 3: a patch package whose declaration imports its target package (the blog
layout as docs/migration.md leaves it: "the import may stay") never makes an unrelated process
import that package, nor print what its import prints. Its declaration runs in the discovery
child when the index is rebuilt (whatever IMPORTPATCH_DISCOVERY_TIMEOUT says), and in a process
only where one of its targets is imported.

The target, ``fakevllm``, stands in for vLLM: its ``__init__`` prints a line on stdout and one on
stderr (vLLM's "Triton is installed"), records which process imported it (pid and argv, in a
marker file) and sleeps 2 s (vLLM's import takes 15 s). The patch package is tests/blogpkg.py's
post, migrated as the guide says, pip-installed with its entry points. Real child interpreters
of the session's wheel venv; every test here failed on the code before this change.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
from blogpkg import PACKAGE, entry_points, migrate, published
from coreutil import Lab, install_dist

MODULE, CLASS = "fakevllm.sched", "Scheduler"
SAID = "FAKEVLLM: Triton is installed"
SAID_ERR = "FAKEVLLM: a log line on stderr"
FAKEVLLM = {
    "fakevllm/__init__.py": f"""\
        import json, os, sys, time
        print({SAID!r}, flush=True)
        print({SAID_ERR!r}, file=sys.stderr, flush=True)
        with open(os.environ["FAKEVLLM_MARK"], "a") as f:
            f.write(json.dumps([os.getpid(), sys.argv]) + "\\n")
        time.sleep(2)
        __version__ = "1.0.0"
        """,
    "fakevllm/sched.py": """\
        class Scheduler:
            def __init__(self):
                self.waiting = []

            def schedule(self):
                return "scheduled"
        """,
}
# The patched schedule says so: the target's own import is still patched.
LOG = '        print("PRIORITY-PATCHED", flush=True)\n'
NAME = "PriorityScheduler"
PID = "import json, os, sys; print(json.dumps([os.getpid(), 'fakevllm' in sys.modules]))"
USE = f"import {MODULE} as m; print(m.{CLASS}().schedule())"


def blog_lab(lab: Lab) -> Lab:
    """fakevllm on the lab's path, and the migrated blog package pip-installed beside it."""
    lab.target(FAKEVLLM)
    install_dist(lab.venv, lab.targets, "vllm", "0.32.0",  # for the post's @min_vllm_version
                 {"vllm/__init__.py": '__version__ = "0.32.0"\n'}, top_level=["vllm"])
    pkg = migrate(published(MODULE, CLASS, log=LOG, vllm_core=False), MODULE, CLASS)
    pkg.pop("setup.py")
    install_dist(lab.venv, lab.targets, "vllm-custom-patches", "0.1.0", pkg,
                 top_level=[PACKAGE], entry_points=entry_points(entry_point=True))
    time.sleep(0.1)  # an index of files changed within the clock's tick is not written (racy)
    return lab


def marks(lab: Lab) -> list[tuple[int, list[str]]]:
    path = lab.root / "mark"
    if not path.exists():
        return []
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()]  # type: ignore


def env(lab: Lab, timeout: str) -> dict[str, str | None]:
    return {"FAKEVLLM_MARK": str(lab.root / "mark"), "IMPORTPATCH_DISCOVERY_TIMEOUT": timeout}


def assert_silent(proc: object) -> None:
    out, err = proc.stdout, proc.stderr  # type: ignore[attr-defined]
    assert SAID not in out and SAID not in err, (out, err)
    assert SAID_ERR not in out and SAID_ERR not in err, (out, err)


# "20": the child under the default-like limit; "0": no limit (before: scanned in this process).
@pytest.mark.parametrize("timeout", ["20", "0"])
@pytest.mark.parametrize("enable", [None, NAME])
def test_python_c_after_an_install_neither_imports_nor_prints_the_target(
    lab: Lab, timeout: str, enable: str | None
) -> None:
    blog_lab(lab)
    for start in ("cold", "warm"):
        proc = lab.ok(PID, enable=enable, env=env(lab, timeout))
        assert_silent(proc)
        pid, imported = json.loads(proc.stdout.strip().splitlines()[-1])
        assert imported is False, (start, proc.stderr)
        assert pid not in [p for p, _ in marks(lab)], (start, marks(lab))
    # Discovery did import it (the declaration imports it), in its child, once: the index holds
    # what it found, and the warm process ran nothing.
    assert len(marks(lab)) == 1, marks(lab)
    # The package's patch is known: `importpatch list` names it, importing nothing either.
    proc = lab.ok(["-m", "importpatch", "list", "--json"], enable=None, env=env(lab, timeout))
    assert_silent(proc)
    assert NAME in [r["name"] for r in json.loads(proc.stdout)["patches"]]
    assert len(marks(lab)) == 1, marks(lab)


@pytest.mark.parametrize("timeout", ["20", "0"])
def test_importpatch_help_after_an_install_neither_imports_nor_prints_the_target(
    lab: Lab, timeout: str
) -> None:
    blog_lab(lab)
    proc = lab.ok(["-m", "importpatch", "--help"], enable=None, env=env(lab, timeout))
    assert_silent(proc)
    assert "usage" in proc.stdout.lower(), proc.stdout
    # Only the discovery child (argv ['-c']) imported it, never the CLI process.
    assert marks(lab) and all("--help" not in argv for _, argv in marks(lab)), marks(lab)


@pytest.mark.parametrize("timeout", ["20", "0"])
def test_the_targets_own_import_is_still_patched_in_place_with_its_warning(
    lab: Lab, timeout: str
) -> None:
    blog_lab(lab)
    for start, imports in (("cold", 2), ("warm", 3)):
        proc = lab.ok(USE, enable=NAME, env=env(lab, timeout))
        # Cold: the discovery child imported it, then the program; warm: the program alone.
        assert len({pid for pid, _ in marks(lab)}) == imports, (start, marks(lab))
        assert proc.stdout.split()[-2:] == ["PRIORITY-PATCHED", "scheduled"], (start, proc)
        # Here the program imports fakevllm: its own lines are its own output, once.
        assert proc.stdout.count(SAID) == 1, (start, proc.stdout)
        (warning,) = [w for w in proc.stderr.splitlines()
                      if w.startswith("importpatch: warning") and "in place" in w]
        assert f"imports {MODULE}" in warning and PACKAGE in warning, warning
    # Not enabled: the import runs the original, and the declaration never ran in that process.
    proc = lab.ok(USE, enable=None, env=env(lab, timeout))
    assert proc.stdout.split()[-1] == "scheduled" and "PRIORITY-PATCHED" not in proc.stdout


def test_only_importpatch_lines_of_the_discovery_child_reach_the_user(lab: Lab) -> None:
    # A patch file that prints while it is declared, and an importpatch warning raised in the
    # child: the user of `python -c pass` sees the warning, never the patch code's output.
    lab.patch({"noisy.py": """\
        import sys
        from importpatch import Patch, events
        print("NOISY-OUT", flush=True)
        print("NOISY-ERR", file=sys.stderr, flush=True)
        events.warn_once("noisy", "noisy.py says so while it is declared")
        Patch("noisy").replace("fakevllm.sched:Scheduler.schedule", lambda self: "x")
        """})
    lab.target(FAKEVLLM)
    time.sleep(0.1)
    proc = lab.ok("pass", enable=None, env=env(lab, "20"))
    assert "NOISY-OUT" not in proc.stdout + proc.stderr, proc
    assert "NOISY-ERR" not in proc.stdout + proc.stderr, proc
    assert "importpatch: warning: noisy.py says so while it is declared" in proc.stderr, proc


# -- after any other install the declaration is not run again (the index is rebuilt) ------------

OTHER = {"otherpkg/__init__.py": "", "otherpkg/patches.py": """\
    from importpatch import Patch
    Patch("other-one").replace("fakevllm.sched:Scheduler.schedule", lambda self: "other")
    """}


def listed(lab: Lab) -> list[str]:
    proc = lab.ok(["-m", "importpatch", "list", "--json"], enable=None, env=env(lab, "20"))
    assert_silent(proc)
    return [r["name"] for r in json.loads(proc.stdout)["patches"]]


def test_after_another_install_the_declaration_is_not_run_again(lab: Lab) -> None:
    blog_lab(lab)
    assert NAME in listed(lab) and len(marks(lab)) == 1  # cold: its child imported fakevllm
    install_dist(lab.venv, lab.targets, "otherpkg", "0.1.0", OTHER, top_level=["otherpkg"],
                 entry_points="[importpatch.patches]\nother = otherpkg.patches\n")
    time.sleep(0.1)
    # The index was rebuilt (the new package's patch is known), the blog package's declaration
    # was not run again: nothing it read changed.
    names = listed(lab)
    assert "other-one" in names and NAME in names, names
    assert len(marks(lab)) == 1, marks(lab)
    proc = lab.ok(USE, enable=NAME, env=env(lab, "20"))
    assert proc.stdout.split()[-2:] == ["PRIORITY-PATCHED", "scheduled"], proc
    assert "in place" in proc.stderr, proc.stderr


VERPKG = {"verpkg/__init__.py": "", "verpkg/patches.py": """\
    from importlib.metadata import version
    from importpatch import Patch

    # What it declares depends on a version it reads and on a module it fails to import.
    Patch("ver-" + version("vllm").replace(".", "-")).replace(
        "fakevllm.sched:Scheduler.schedule", lambda self: "v")
    try:
        import optmod  # not installed yet
    except ImportError:
        pass
    else:
        Patch("probe-opt").replace("fakevllm.sched:Scheduler.schedule", lambda self: "o")
    """}


def test_a_change_to_what_a_declaration_read_runs_it_again(lab: Lab) -> None:
    # A module it imported changed (fakevllm.sched edited), a version it read changed (vllm
    # upgraded), a module it failed to import appeared: each runs that declaration again.
    blog_lab(lab)
    install_dist(lab.venv, lab.targets, "verpkg", "0.1.0", VERPKG, top_level=["verpkg"],
                 entry_points="[importpatch.patches]\nver = verpkg.patches\n")
    time.sleep(0.1)
    names = listed(lab)
    assert "ver-0-32-0" in names and "probe-opt" not in names and len(marks(lab)) == 1, names
    sched = lab.targets / "fakevllm" / "sched.py"
    sched.write_text(sched.read_text() + "\nEDITED = True\n")
    (lab.targets / "nudge").mkdir()  # the index is rebuilt (a folder of the search path changed)
    time.sleep(0.1)
    assert NAME in listed(lab) and len(marks(lab)) == 2, marks(lab)
    shutil.rmtree(lab.targets / "vllm-0.32.0.dist-info")
    install_dist(lab.venv, lab.targets, "vllm", "0.33.0",
                 {"vllm/__init__.py": '__version__ = "0.33.0"\n'}, top_level=["vllm"])
    time.sleep(0.1)
    names = listed(lab)
    assert "ver-0-33-0" in names and "ver-0-32-0" not in names, names
    assert NAME in names and len(marks(lab)) == 2, marks(lab)  # the blog one read no version
    lab.target({"optmod.py": ""})
    time.sleep(0.1)
    assert "probe-opt" in listed(lab)
