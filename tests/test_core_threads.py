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
        ("started", "", ""), ("applied", "sl", "cpkg.slow:f")
    ]


ROUNDS = 12


def test_two_threads_importing_two_targets_load_both_declarations(
    wheel_venv: Venv, tmp_path: Path
) -> None:
    # Each round: two threads import two different targets at once, each target's patch file
    # being executed (slowly) for the first time in both threads together. The index is warm.
    targets: dict[str, str] = {"tt/__init__.py": ""}
    patches: dict[str, str] = {}
    for r in range(ROUNDS):
        for side in "ab":
            targets[f"tt/m{r}{side}.py"] = 'def f():\n    return "orig"\n'
            patches[f"p{r}{side}.py"] = f'''
                import time
                from importpatch import Patch
                time.sleep(0.02)  # both threads are inside a declaration at once
                Patch("p{r}{side}").replace("tt.m{r}{side}:f", lambda: "p{r}{side}")
                '''
    lab = Lab(wheel_venv, tmp_path).target(targets).patch(patches)
    lab.ok("import tt")  # builds the index
    out = lab.json(f'''
        import importlib, json, threading
        results, errors = {{}}, []

        def load(name, barrier):
            barrier.wait()
            try:
                results[name] = importlib.import_module(name).f()
            except Exception as exc:
                errors.append(repr(exc))

        for r in range({ROUNDS}):
            barrier = threading.Barrier(2)
            threads = [threading.Thread(target=load, args=(f"tt.m{{r}}{{s}}", barrier))
                       for s in "ab"]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        print(json.dumps([results, errors]))
        ''', timeout=180)
    results, errors = out
    assert errors == []
    assert results == {f"tt.m{r}{s}": f"p{r}{s}" for r in range(ROUNDS) for s in "ab"}
