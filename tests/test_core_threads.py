"""Concurrent imports of one targeted module: importlib's module lock serialises them, so the
module executes and the patch lands exactly once, and no thread deadlocks."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Venv
from coreutil import Lab


def test_eight_threads_importing_one_target_land_the_patch_exactly_once(
    wheel_venv: Venv, tmp_path: Path
) -> None:
    lab = Lab(wheel_venv, tmp_path).target({
        "cpkg/__init__.py": "RUNS = []\n",
        "cpkg/slow.py": '''
            import time
            import cpkg
            cpkg.RUNS.append(1)
            time.sleep(0.2)  # keep the other seven threads waiting on the module lock

            def f():
                return "orig"
            ''',
    }).patch({"sl.py": '''
        from importpatch import Patch
        Patch("sl").replace("cpkg.slow:f", lambda: "patched")
        '''})
    events_dir = tmp_path / "events"
    out = lab.json('''
        import importlib, json, threading, cpkg, importpatch
        barrier = threading.Barrier(8)
        results = []

        def worker():
            barrier.wait()
            results.append(importlib.import_module("cpkg.slow").f())

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        print(json.dumps([results, sum(t.is_alive() for t in threads), len(cpkg.RUNS),
                          len(importpatch.applied())]))
        ''', enable="sl", env={"IMPORTPATCH_EVENTS_DIR": str(events_dir)}, timeout=90)
    results, alive, runs, applied = out
    assert results == ["patched"] * 8
    assert alive == 0 and runs == 1 and applied == 1
    lines = [json.loads(line) for f in events_dir.iterdir() for line in f.read_text().splitlines()]
    assert [(e["outcome"], e["patch"], e["target"]) for e in lines] == [
        ("applied", "sl", "cpkg.slow:f")
    ]
