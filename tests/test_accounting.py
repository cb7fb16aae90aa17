"""Every requested patch is accounted for, in every process (issue 18 §3): a target module that
does not exist in its installed package is said at the package's first import (a StrictError under
strict mode), in spawned children too; strict mode stops programs whose targets nobody can name
(an unknown name, a missing patch folder) at their first import of a package; every requested
name's fate per process is recorded and ``importpatch status`` lists the names never applied
anywhere; ``doctor`` fails on what cannot apply here, with a "did you mean" from what exists; and
``check`` exits 1 when any patch it checked fails, ``--all`` checking every discovered one. Real
child interpreters of the wheel's venv."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from coreutil import Lab

TARGETS = {
    "toypkg/__init__.py": "LOADED = True\n",
    "toypkg/sched/__init__.py": "",
    "toypkg/sched/scheduler.py": ('class Scheduler:\n    def schedule(self):\n'
                                  '        return "orig"\n'),
}
PATCHES = {
    "toy.py": '''
        from importpatch import Patch
        Patch("toy-good").replace("toypkg.sched.scheduler:Scheduler.schedule",
                                  lambda self: "patched")
        Patch("toy-typo").replace("toypkg.sched.schedular:Scheduler.schedule",
                                  lambda self: "patched")
        Patch("toy-moved").replace("toypkg.gone|toypkg.sched.scheduler:Scheduler.schedule",
                                   lambda self: "moved")
        Patch("toy-symbol").replace("toypkg.sched.scheduler:Scheduler.schedul",
                                    lambda self: "patched")
        Patch("toy-old", requires="toypkg>=99").replace("toypkg.sched.schedular:Scheduler.x",
                                                        lambda self: "x")
        ''',
}
STRICT = {"IMPORTPATCH_STRICT": "1"}
MISSING = ("patch toy-typo: target module toypkg.sched.schedular does not exist in toypkg "
           "(version unknown) (")
DID_YOU_MEAN = "did you mean toypkg.sched.scheduler?"
READ = ("print('started', flush=True)\nimport toypkg.sched.scheduler as s\n"
        "print(s.Scheduler().schedule())")


pytestmark = pytest.mark.lab(target=TARGETS, patch=PATCHES)


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("importpatch: warning: ")]


# -- a target module that does not exist -----------------------------------------------------------


SPAWN = '''
import multiprocessing as mp, sys

def child():
    import toypkg.sched.scheduler as s
    import toypkg.sched  # a second import of the package: no second warning
    print("child", s.Scheduler().schedule(), flush=True)

if __name__ == "__main__":
    mp.set_start_method("spawn")
    import toypkg.sched.scheduler as s
    print("parent", s.Scheduler().schedule(), flush=True)
    p = mp.Process(target=child)
    p.start()
    p.join()
    sys.exit(p.exitcode)
'''


def test_missing_target_module_warns_once_per_process_spawned_children_too(lab: Lab) -> None:
    (lab.root / "spawn.py").write_text(SPAWN)
    proc = lab.ok([lab.root / "spawn.py"], enable="toy-good,toy-typo")
    # the good patch still applies, in the parent and in the spawned child
    assert proc.stdout.split() == ["parent", "patched", "child", "patched"]
    said = [w for w in warnings(proc.stderr) if "toypkg.sched.schedular" in w]
    assert len(said) == 2, proc.stderr  # once in each process that imported toypkg
    for line in said:
        assert line.startswith(f"importpatch: warning: {MISSING}"), line
        assert line.endswith(f"{lab.targets / 'toypkg'}); {DID_YOU_MEAN}"), line


def test_missing_target_module_says_nothing_where_a_candidate_exists_or_the_version_skips(
    lab: Lab
) -> None:
    proc = lab.ok(READ, enable="toy-moved,toy-old")
    assert proc.stdout.split() == ["started", "moved"]
    assert warnings(proc.stderr) == []
    # nothing is looked up in a process that never imports the package
    assert lab.ok("import json", enable="toy-typo").stderr == ""


def test_strict_missing_target_module_stops_the_import_of_its_package(lab: Lab) -> None:
    proc = lab.run(READ, enable="toy-good,toy-typo", env=STRICT)
    assert proc.returncode == 1 and proc.stdout.split() == ["started"], proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"importpatch.strict.StrictError: importpatch: {MISSING}"), last
    assert last.endswith(f"{DID_YOU_MEAN} (IMPORTPATCH_STRICT is on: stopped at the import of "
                         "toypkg)"), last
    caught = lab.json('''
        import importlib.util, json, sys
        probe = importlib.util.find_spec("toypkg") is not None  # a probe is answered
        out = []
        for _ in range(2):  # this import, and every later one
            try:
                import toypkg.sched.scheduler
            except ImportError as exc:
                out.append(type(exc).__name__)
        print(json.dumps([probe, out, "toypkg" in sys.modules]))
        ''', enable="toy-good,toy-typo", env=STRICT)
    assert caught == [True, ["StrictError", "StrictError"], False]


def test_strict_missing_target_module_raises_at_a_late_enable(lab: Lab) -> None:
    out = lab.json('''
        import json, importpatch, toypkg.sched.scheduler
        try:
            importpatch.enable("toy-typo")
        except ImportError as exc:
            print(json.dumps([type(exc).__name__, str(exc)]))
        ''', enable=None, env=STRICT)
    assert out[0] == "StrictError" and MISSING in out[1] and DID_YOU_MEAN in out[1]


# -- strict mode where nobody can name the targets ------------------------------------------------


@pytest.mark.parametrize("problem", ["folder", "name"])
def test_strict_stops_a_program_whose_only_targets_are_unknown(lab: Lab, problem: str) -> None:
    if problem == "folder":  # the only patch folder, mistyped: its patches are unknown
        env = {**STRICT, "IMPORTPATCH_PATH": str(lab.root / "patchez")}
        said = f"IMPORTPATCH_PATH: {str(lab.root / 'patchez')!r} is not a folder"
    else:  # no folder at all: the name is unknown
        env = {**STRICT, "IMPORTPATCH_PATH": None}
        said = "unknown patch name(s) toy-good in IMPORTPATCH_ENABLE"
    proc = lab.run(READ, enable="toy-good", env=env)
    assert proc.returncode == 1 and proc.stdout.split() == ["started"], proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("importpatch.strict.StrictError: importpatch: ") and said in last
    assert last.endswith("(IMPORTPATCH_STRICT is on: stopped at the import of toypkg)"), last
    # the tools that say what is wrong, and the standard library, still run
    assert lab.ok("import json, csv; print('ok')", enable="toy-good", env=env).stdout == "ok\n"
    assert lab.ok(["-m", "pip", "--version"], enable="toy-good", env=env).stdout.startswith("pip ")
    listed = json.loads(lab.ok(["-m", "importpatch", "list", "--json"], enable="toy-good",
                               env=env).stdout)
    assert said in " ".join(listed["problems"]) or problem == "name"
    # without strict: a warning, and the program runs unpatched
    env.pop("IMPORTPATCH_STRICT")
    assert lab.ok(READ, enable="toy-good", env=env).stdout.split() == ["started", "orig"]


# -- each requested name's fate, and status --------------------------------------------------------


def status(lab: Lab, events: Path) -> tuple[dict[str, Any], str]:
    data = json.loads(lab.ok(["-m", "importpatch", "status", "--events-dir", events, "--json"],
                             enable=None).stdout)
    text = lab.ok(["-m", "importpatch", "status", "--events-dir", events], enable=None).stdout
    return data, text


def test_status_lists_requested_names_never_applied_anywhere_with_their_fates(lab: Lab) -> None:
    (lab.root / "spawn.py").write_text(SPAWN)
    events = lab.root / "events"
    lab.ok([lab.root / "spawn.py"], enable="toy-good,toy-typo,toy-gooood,toy-old",
           env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    lab.ok("import json", enable="toy-good", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    data, text = status(lab, events)
    requested = data["requested"]
    assert data["never_applied"] == ["toy-gooood", "toy-old", "toy-typo"]
    assert requested["toy-good"]["applied_anywhere"] is True
    assert requested["toy-good"]["fates"]["applied"] == 2  # parent and spawned child
    assert requested["toy-good"]["fates"]["not-imported"] >= 1  # `import json` (+ the tracker)
    assert requested["toy-typo"]["fates"]["missing"] == 2
    assert DID_YOU_MEAN in requested["toy-typo"]["detail"]
    assert requested["toy-old"]["fates"] == {"not-imported": requested["toy-old"]["fates"][
        "not-imported"]}  # its requirement does not hold: never looked up, never imported
    gooood = requested["toy-gooood"]
    assert set(gooood["fates"]) == {"unknown"} and gooood["fates"]["unknown"] >= 2
    assert gooood["detail"] == "did you mean toy-good?"
    assert "requested but never applied anywhere:" in text
    assert re.search(r"toy-gooood: unknown name in \d+ \(did you mean toy-good\?\)", text), text
    assert re.search(r"toy-typo: target module missing in 2, not imported here in \d+", text)
    assert "toy-good: applied in 2 of" in text


def test_status_of_a_run_with_only_a_typo_says_so(lab: Lab) -> None:
    events = lab.root / "events"
    proc = lab.ok(READ, enable="toy-goodd", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    assert proc.stdout.split() == ["started", "orig"]
    data, text = status(lab, events)
    assert data["never_applied"] == ["toy-goodd"]
    assert data["requested"]["toy-goodd"]["fates"] == {"unknown": 1}
    (proc_row,) = data["processes"]
    assert proc_row["events"][0]["requested"] == ["toy-goodd"]
    assert "unknown toy-goodd (name): did you mean toy-good?" in text
    assert "toy-goodd: unknown name in 1 (did you mean toy-good?)" in text


# -- doctor ----------------------------------------------------------------------------------------


def doctor(lab: Lab, enable: str, env: dict[str, str | None] | None = None
           ) -> tuple[int, dict[str, Any]]:
    proc = lab.run(["-m", "importpatch", "doctor", "--json"], enable=enable, env=env)
    return proc.returncode, json.loads(proc.stdout)


def test_doctor_fails_on_what_cannot_apply_here_with_did_you_mean(lab: Lab) -> None:
    assert doctor(lab, "toy-good")[0] == 0
    assert doctor(lab, "toy-moved,toy-old")[0] == 0  # a candidate exists; a version skip is fine
    rc, out = doctor(lab, "toy-goood")
    assert rc == 1 and out["ok"] is False
    assert "unknown patch name toy-goood in IMPORTPATCH_ENABLE; did you mean toy-good?" in \
        out["problems"]
    rc, out = doctor(lab, "toy-typo")
    (problem,) = out["problems"]
    assert rc == 1 and problem.startswith("patch toy-typo cannot apply here: ")
    assert "module not found (tried toypkg.sched.schedular); " + DID_YOU_MEAN in problem
    rc, out = doctor(lab, "toy-symbol")
    (problem,) = out["problems"]
    assert rc == 1 and "Scheduler.schedul not found in toypkg.sched.scheduler" in problem
    assert "did you mean Scheduler.schedule?" in problem
    rc, out = doctor(lab, "toy-good", {"IMPORTPATCH_PATH": str(lab.root / "patchez")})
    assert rc == 1
    assert f"IMPORTPATCH_PATH: {str(lab.root / 'patchez')!r} is not a folder" in out["problems"]
    human = lab.run(["-m", "importpatch", "doctor"], enable="toy-goood")
    assert human.returncode == 1 and human.stdout.rstrip().endswith("problem(s)")


def test_a_mistyped_symbol_fails_at_import_with_did_you_mean(lab: Lab) -> None:
    # The import-time error, not only check/doctor, names the symbol the module does bind.
    proc = lab.run(READ, enable="toy-symbol")
    assert proc.returncode == 1 and proc.stdout.split() == ["started"], proc.stderr
    line = proc.stderr.strip().splitlines()[-1]  # the PatchError
    assert "symbol 'Scheduler.schedul' not found" in line and line.endswith(
        "did you mean toypkg.sched.scheduler:Scheduler.schedule?"), line


# -- check -----------------------------------------------------------------------------------------


def check(lab: Lab, *args: str, enable: str | None = None) -> tuple[int, dict[str, Any], str]:
    proc = lab.run(["-m", "importpatch", "check", *args, "--json"], enable=enable)
    text = lab.run(["-m", "importpatch", "check", *args], enable=enable)
    assert proc.returncode == text.returncode, (proc.stdout, text.stdout)
    return proc.returncode, json.loads(proc.stdout), text.stdout


def test_check_exits_1_when_any_patch_it_checked_fails_and_all_checks_every_one(lab: Lab) -> None:
    # default: the patches on here, and only those are shown
    rc, data, text = check(lab, enable="toy-good")
    assert rc == 0 and data["scope"] == "enabled"
    assert [p["name"] for p in data["patches"]] == ["toy-good"]
    assert "toy-typo" in data["unchecked"] and "toy-typo  FAIL" not in text
    assert "'importpatch check --all' checks them too" in " ".join(text.split())
    rc, data, text = check(lab, enable="toy-good,toy-typo")
    assert rc == 1 and "2 patch(es): 1 fail, 1 ok; exit status 1" in text
    # --all: every discovered patch, on or off; one that fails fails the check
    rc, data, text = check(lab, "--all", enable="toy-good")
    assert rc == 1 and data["scope"] == "all" and data["unchecked"] == []
    statuses = {p["name"]: p["status"] for p in data["patches"]}
    assert statuses["toy-typo"] == statuses["toy-symbol"] == "fail"
    assert statuses["toy-old"] == "skip" and statuses["toy-good"] == "ok"
    assert "checked: every discovered patch (--all)" in text
    # an unknown name in IMPORTPATCH_ENABLE cannot apply: it fails, with a did-you-mean
    rc, data, text = check(lab, enable="toy-good,toy-goood")
    assert rc == 1
    unknown = next(p for p in data["patches"] if p["name"] == "toy-goood")
    assert unknown["origin"] == "unknown" and unknown["status"] == "fail"
    assert unknown["problems"] == ["no patch of this name is discovered here; did you mean "
                                   "toy-good?"]
    bad = lab.run(["-m", "importpatch", "check", "toy-good", "--all"], enable=None)
    assert bad.returncode == 2 and "patch names and --all" in bad.stderr


def test_the_dockerfile_gate_checks_patches_switched_on_per_container(lab: Lab) -> None:
    """The example Dockerfile's `RUN importpatch check ...` line, run as written in the image's
    environment (its patch folder, its ENV defaults): a patch that only `docker run -e` switches
    on fails the build when it does not apply."""
    dockerfile = (ROOT / "examples" / "docker" / "Dockerfile").read_text()
    (gate,) = re.findall(r"^RUN (importpatch check.*)$", dockerfile, re.M)
    args = gate.split()[1:]
    assert "--all" in args
    env = {"IMPORTPATCH_ENABLE": "toy-good"}  # the image's default; toy-typo is per container
    proc = lab.run(["-m", "importpatch", *args], enable=None, env=env)
    assert proc.returncode == 1 and "toy-typo  FAIL" in proc.stdout, proc.stdout
    (lab.patches / "toy.py").write_text(
        'from importpatch import Patch\nPatch("toy-good").replace('
        '"toypkg.sched.scheduler:Scheduler.schedule", lambda self: "patched")\n')
    assert lab.run(["-m", "importpatch", *args], enable=None, env=env).returncode == 0
