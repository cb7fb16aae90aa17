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
