"""Patches hold in every process: the wheel's .pth installs the hook at interpreter start, so
children started by multiprocessing (each start method), process pools, subprocess and
``python -m`` are patched too; an editable install of the checkout activates the hook as well."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT, Venv
from coreutil import Lab

TARGET = {
    "ppkg/__init__.py": "",
    "ppkg/mod.py": '''
        import os

        def value():
            return "orig"

        def report(_=None):
            import importpatch.events as ev
            return [os.getpid(), value(), len(ev.applied())]
        ''',
    "ppkg/user.py": '''
        from ppkg.mod import value

        if __name__ == "__main__":
            import os
            print(os.getpid(), value())
        ''',
    "ppkg/selfmain.py": '''
        def value():
            return "orig"

        if __name__ == "__main__":
            import os
            print(os.getpid(), value())
        ''',
}
PATCH = {"pp.py": '''
    from importpatch import Patch
    p = Patch("pp")

    @p.replace("ppkg.mod:value")
    def value():
        return "patched"

    @p.replace("ppkg.selfmain:value")
    def value_main():
        return "patched"
    '''}

DRIVER = '''
import json, multiprocessing as mp, os, sys

def child(queue):
    import ppkg.mod
    queue.put(ppkg.mod.report())

if __name__ == "__main__":
    method, parent_first = sys.argv[1], sys.argv[2] == "parent-first"
    if parent_first:
        import ppkg.mod
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    result = queue.get(timeout=60)
    proc.join(60)
    print(json.dumps({"parent": os.getpid(), "child": result, "exitcode": proc.exitcode}))
'''


pytestmark = pytest.mark.lab(target=TARGET, patch=PATCH)


@pytest.mark.parametrize(
    ("method", "order"),
    [("spawn", "child-only"), ("forkserver", "child-only"),
     ("fork", "child-only"), ("fork", "parent-first")],
)
def test_multiprocessing_child_runs_patched_code(lab: Lab, method: str, order: str) -> None:
    (lab.root / "drive.py").write_text(DRIVER)
    proc = lab.ok(["drive.py", method, order], enable="pp")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    pid, value, applied = out["child"]
    assert out["exitcode"] == 0 and pid != out["parent"]
    assert value == "patched"
    assert applied == 1  # the child holds the record of the one landing (its own, or inherited)


def test_process_pool_workers_run_patched_code(lab: Lab) -> None:
    out = lab.json('''
        import concurrent.futures as cf, json, multiprocessing as mp, os
        import ppkg.mod
        if __name__ == "__main__":
            with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
                results = list(pool.map(ppkg.mod.report, range(4)))
            print(json.dumps([os.getpid(), results]))
        ''', enable="pp")
    parent, results = out
    assert {r[1] for r in results} == {"patched"}
    assert parent not in {r[0] for r in results}
    assert all(r[2] == 1 for r in results)  # each spawned worker landed the patch itself


def test_subprocess_of_sys_executable_runs_patched_code(lab: Lab) -> None:
    out = lab.json('''
        import json, os, subprocess, sys
        child = subprocess.run(
            [sys.executable, "-c", "import json, ppkg.mod; print(json.dumps(ppkg.mod.report()))"],
            capture_output=True, text=True, check=True,
        )
        print(json.dumps([os.getpid(), json.loads(child.stdout)]))
        ''', enable="pp")
    parent, (pid, value, applied) = out
    assert pid != parent and value == "patched" and applied == 1


@pytest.mark.parametrize("module", ["ppkg.selfmain", "ppkg.user"])
def test_python_dash_m_runs_patched_code(lab: Lab, module: str) -> None:
    # ppkg.selfmain is itself targeted (run as __main__); ppkg.user imports a target
    proc = lab.ok(["-m", module], enable="pp")
    assert proc.stdout.split()[-1] == "patched", proc.stdout
    unpatched = lab.ok(["-m", module], enable=None)
    assert unpatched.stdout.split()[-1] == "orig"


def test_editable_install_activates_the_hook(
    venv_factory: Callable[..., Venv], tmp_path: Path
) -> None:
    venv = venv_factory("-e", str(ROOT), name="editable")
    lab = Lab(venv, tmp_path).target(TARGET).patch(PATCH)
    out = lab.json('''
        import json, sys, importpatch, ppkg.mod
        print(json.dumps([ppkg.mod.value(), importpatch.__file__,
                          [type(f).__name__ for f in sys.meta_path].count("PatchFinder")]))
        ''', enable="pp")
    assert out[0] == "patched"
    assert Path(out[1]).resolve() == (ROOT / "importpatch" / "__init__.py").resolve()
    assert out[2] == 1


# -- python -m is an import like any other (issue 11, item 5) ----------------------------------

MAIN_TARGET = {
    "mpkg/__init__.py": "",
    "mpkg/run.py": '''
        import json
        globals()["dyn"] = lambda: "orig"

        def value():
            return "orig"

        if __name__ == "__main__":
            import importpatch.events as ev
            print(json.dumps([value(), dyn(), [[e["outcome"], e["target"], e["how"]]
                                               for e in ev.events()]]))
        ''',
}


def test_python_dash_m_on_a_target_gets_the_checks_and_events_of_an_import(lab: Lab) -> None:
    lab.target(MAIN_TARGET).patch({"mp.py": '''
        from importpatch import Patch
        p = Patch("mp")
        p.replace("mpkg.run:value", lambda: "patched")
        p.replace("mpkg.run:dyn", lambda: "patched")
        '''})
    proc = lab.ok(["-m", "mpkg.run"], enable="mp")
    value, dyn, events = json.loads(proc.stdout.strip().splitlines()[-1])
    assert value == dyn == "patched"
    assert sorted(events) == [
        ["applied", "mpkg.run:dyn", "after-exec (binding not visible in the source)"],
        ["applied", "mpkg.run:value", "definition-site"],
    ]


def test_python_dash_m_with_a_patch_on_a_missing_symbol_fails_like_an_import(lab: Lab) -> None:
    lab.target(MAIN_TARGET).patch({"mp.py": '''
        from importpatch import Patch
        Patch("mp").replace("mpkg.run:nope", lambda: "patched")
        '''})
    proc = lab.run(["-m", "mpkg.run"], enable="mp")
    assert proc.returncode == 1
    assert "patch 'mp' cannot apply to mpkg.run" in proc.stderr
    assert "symbol 'nope' not found" in proc.stderr
    assert "importpatch: failed mp to mpkg.run (import)" in proc.stderr
    assert proc.stdout == ""  # the module did not run unpatched


def test_python_dash_m_with_a_symbol_bound_only_at_run_time_fails_when_absent(lab: Lab) -> None:
    # bound through globals(): known only after the module ran; -m must check it like import
    lab.target(MAIN_TARGET).patch({"mp.py": '''
        from importpatch import Patch
        Patch("mp").replace("mpkg.run:dyn_missing", lambda: "patched")
        '''})
    proc = lab.run(["-m", "mpkg.run"], enable="mp")
    assert proc.returncode == 1, proc.stdout
    assert "symbol 'dyn_missing' not found" in proc.stderr
    assert proc.stdout == ""
