"""What a process tells about its patches: IMPORTPATCH_LOG=1 lines on stderr (with the pid) and
``importpatch.applied()``."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Venv
from coreutil import Lab

TARGET = {"epkg/__init__.py": "", "epkg/m.py": 'def f():\n    return "orig"\n\nN = 1\n'}
PATCH = {"ev.py": '''
    from importpatch import Patch
    p = Patch("ev")
    p.replace("epkg.m:f", lambda: "patched")
    p.replace("epkg.m:N", 2)
    '''}
SHOW = '''
import json, os, importpatch, epkg.m
print(json.dumps([os.getpid(), epkg.m.f(),
                  [[e["outcome"], e["patch"], e["target"], e["how"], e["pid"]]
                   for e in importpatch.applied()]]))
'''


def test_log_prints_one_applied_line_per_target_with_the_pid(wheel_venv: Venv, tmp_path: Path
                                                             ) -> None:
    lab = Lab(wheel_venv, tmp_path).target(TARGET).patch(PATCH)
    proc = lab.ok(SHOW, enable="ev", env={"IMPORTPATCH_LOG": "1"})
    pid = json.loads(proc.stdout)[0]
    lines = sorted(line for line in proc.stderr.splitlines() if line.startswith("importpatch: "))
    assert lines == [
        f"importpatch: applied ev to epkg.m:N (definition-site) (pid {pid}): replace",
        f"importpatch: applied ev to epkg.m:f (definition-site) (pid {pid}): replace",
    ], proc.stderr
    quiet = lab.ok(SHOW, enable="ev")
    assert quiet.stderr == ""


def test_applied_lists_the_events_of_this_process(wheel_venv: Venv, tmp_path: Path) -> None:
    lab = Lab(wheel_venv, tmp_path).target(TARGET).patch(PATCH)
    pid, value, applied = lab.json(SHOW, enable="ev")
    assert value == "patched"
    assert sorted(applied) == [
        ["applied", "ev", "epkg.m:N", "definition-site", pid],
        ["applied", "ev", "epkg.m:f", "definition-site", pid],
    ]
    assert lab.json(SHOW, enable=None)[1:] == ["orig", []]


TREE = '''
import multiprocessing, subprocess, sys


def helper():  # imports nothing patched; its own child does
    subprocess.run([sys.executable, "-c", "import epkg.m"], check=True)


def idle():
    pass


if __name__ == "__main__":
    for method, name, target in (("spawn", "Helper", helper), ("fork", "Forked", idle),
                                 ("forkserver", "Served", idle)):
        p = multiprocessing.get_context(method).Process(name=name, target=target)
        p.start()
        p.join()
        assert p.exitcode == 0, (method, p.exitcode)
    # fork + exec of another program (subprocess with preexec_fn runs Python's fork handlers):
    # no Python process there, so no line
    subprocess.run(["true"], preexec_fn=lambda: None, check=True)
'''


def test_events_dir_shows_every_process_where_the_hook_is_active(wheel_venv: Venv, tmp_path: Path
                                                                 ) -> None:
    lab = Lab(wheel_venv, tmp_path).target(TARGET).patch(PATCH)
    (tmp_path / "tree.py").write_text(TREE)
    events = tmp_path / "events"
    lab.ok([tmp_path / "tree.py"], enable="ev", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    status = lab.ok(["-m", "importpatch", "status", "--json", "--events-dir", events],
                    enable=None)
    data = json.loads(status.stdout)
    (root,) = data["processes"]

    def shape(proc: dict) -> tuple:
        applied = sorted(e["target"] for e in proc["events"] if e["outcome"] == "applied")
        label = proc["process"]
        if label == "MainProcess":  # multiprocessing's helper processes, by their command line
            label = next((w for w in ("resource_tracker", "forkserver")
                          if w in " ".join(proc["argv"])), label)
        return (label, applied, sorted(shape(c) for c in proc["children"]))

    # The driver, the spawn, fork and forkserver children, the fork server and multiprocessing's
    # resource tracker applied nothing, and are there all the same; the grandchild applied the
    # patch.
    assert shape(root) == ("MainProcess", [], sorted([
        ("Helper", [], [("MainProcess", ["epkg.m:N", "epkg.m:f"], [])]),
        ("Forked", [], []),
        ("forkserver", [], [("Served", [], [])]),
        ("resource_tracker", [], []),
    ])), json.dumps(data, indent=1)
    started = [e for e in root["events"] if e["outcome"] == "started"]
    assert [(e["how"], e["detail"]) for e in started] == [("start", "1 patch(es) on: ev")]
    assert data["patches"] == {"ev": {"applied": 2, "skipped": 0, "failed": 0, "shadowed": 0,
                                      "rebound": 0, "processes": 1, "verdict": "ok"}}
    human = lab.ok(["-m", "importpatch", "status", "--events-dir", events], enable=None).stdout
    assert human.splitlines()[0].endswith("7 process(es), 2 event(s)")
    assert human.count("nothing applied here; hook active (1 patch(es) on: ev)") == 6
    assert "    pid " in human and " Helper on " in human and " Served on " in human


def test_no_events_dir_no_line_and_nothing_imported(wheel_venv: Venv, tmp_path: Path) -> None:
    lab = Lab(wheel_venv, tmp_path).target(TARGET).patch(PATCH)
    out = lab.json("import json, sys; print(json.dumps(sorted(m for m in sys.modules "
                   "if m.startswith(('multiprocessing', 'json.'))) ))", enable="ev")
    assert not [m for m in out if m.startswith("multiprocessing")]


def test_an_event_cut_short_by_a_full_disk_is_reported_and_never_glued_to_the_next(
        wheel_venv: Venv, tmp_path: Path) -> None:
    # RLIMIT_FSIZE stands in for a full disk: a write past the limit writes what fits and the
    # next one fails (EFBIG; Python ignores SIGXFSZ). The `started` line fits, the next is cut,
    # the one after is lost; then the limit is lifted (the disk has room again) and epkg.n's
    # event is written on a line of its own.
    lab = Lab(wheel_venv, tmp_path).target({**TARGET, "epkg/n.py": "def g():\n    return 1\n"})
    lab.patch({**PATCH, "ev2.py": """
        from importpatch import Patch
        Patch("ev2").replace("epkg.n:g", lambda: 2)
        """})
    events = tmp_path / "events"
    code = """
import glob, json, os, resource
(log,) = glob.glob(os.path.join(os.environ["IMPORTPATCH_EVENTS_DIR"], "*.jsonl"))
limit = os.path.getsize(log) + 100  # the `started` line is in; the next one is longer
print(limit)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
import epkg.m
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
import epkg.n
print(json.dumps([epkg.m.f(), epkg.n.g()]))
"""
    proc = lab.ok(code, enable="ev,ev2", env={"IMPORTPATCH_EVENTS_DIR": str(events),
                                              "IMPORTPATCH_NO_CACHE": "1"})
    limit, printed = proc.stdout.splitlines()
    assert json.loads(printed) == ["patched", 2]
    (log,) = events.iterdir()
    lines = log.read_bytes().split(b"\n")
    assert len(lines) == 4 and lines[-1] == b"", lines
    assert json.loads(lines[0])["outcome"] == "started"
    assert len(lines[0]) + 1 + len(lines[1]) == int(limit)  # cut at the limit ...
    assert lines[1].startswith(b'{"argv"') and not lines[1].endswith(b"}")  # ... and alone
    last = json.loads(lines[2])
    assert (last["outcome"], last["patch"], last["target"]) == ("applied", "ev2", "epkg.n:g")
    assert f"importpatch: warning: cannot write events to {events}: only " in proc.stderr
    status = wheel_venv.run([wheel_venv.script("importpatch"), "status", "--events-dir",
                             str(events)])
    assert "1 line(s) could not be read" in status.stdout, status.stdout + status.stderr
    assert "ev2: applied in 1 of 1 process(es)" in status.stdout, status.stdout
