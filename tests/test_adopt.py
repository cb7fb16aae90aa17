"""``importpatch adopt MODULE:FUNCTION``: a monkeypatch function run in children, what it changed
attributed to the modules that define it, and a patch that runs the same function right after the
first of those modules is imported, in every process (issue 38, item 2). Stand-in packages in
real child interpreters of the wheel venv (``lab``); the real vLLM ones: tests/test_adopt_vllm.py.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from coreutil import EVENTS, Lab

TARGET = {
    "fakepkg/__init__.py": "",
    "fakepkg/core.py": '''
        class Engine:
            def step(self):
                return "step"


        def helper():
            return "helper"
        ''',
    # copies made at import: a monkeypatch run after this import misses them
    "fakepkg/user.py": '''
        from fakepkg.core import Engine, helper


        def use():
            return [helper(), Engine().step()]
        ''',
    "fakepkg/other.py": '''
        LIMIT = 1
        ''',
    "teampatches/__init__.py": "",
    "teampatches/vllm_like.py": '''
        _DONE = False


        def monkey_patch_engine():
            global _DONE
            import fakepkg.core as core

            if getattr(core.Engine, "_patched", False):  # a guard against double application
                return
            original = core.Engine.step

            def step(self):
                return "patched " + original(self)

            core.Engine.step = step
            core.Engine._patched = True
            core.helper = lambda: "patched helper"
            _DONE = True


        def through_a_reexport():
            # the class is reached through fakepkg.user, and defined in fakepkg.core
            import fakepkg.user as user
            import fakepkg.other as other

            user.Engine.extra = 1
            other.LIMIT = 2
            del other.__doc__


        def noop():
            import fakepkg.core  # imports, reads, changes nothing
            fakepkg.core.helper()


        def only_builtins():
            import builtins

            builtins.team_flag = True


        def raises():
            raise RuntimeError("no GPU here")
        ''',
}

pytestmark = pytest.mark.lab(target=TARGET, patch={})

ADOPT = ["-m", "importpatch", "adopt"]


def adopt(lab: Lab, *args: str) -> dict:
    return json.loads(lab.ok([*ADOPT, *args, "--json"], enable=None).stdout)


def test_the_patch_runs_the_function_before_the_importers_copy_in_every_process(lab: Lab
                                                                                 ) -> None:
    done = adopt(lab, "teampatches.vllm_like:monkey_patch_engine")
    written = lab.patches / "monkey_patch_engine.py"
    assert done["out"] == str(written) and written.exists()
    (fn,) = done["functions"]
    assert [(c["target"], c["how"]) for c in fn["changes"]] == [
        ("fakepkg.core:Engine._patched", "added"),
        ("fakepkg.core:Engine.step", "replaced"),
        ("fakepkg.core:helper", "replaced")]
    # the function's own module global is its own, no target
    assert [(c["target"], c["how"]) for c in fn["own"]] == [
        ("teampatches.vllm_like:_DONE", "replaced")]
    text = written.read_text()
    assert 'patch.adopt("teampatches.vllm_like:monkey_patch_engine", {' in text

    code = f'''
        import json, multiprocessing as mp, importpatch.events
        import fakepkg.user
        import teampatches.vllm_like as team
        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                child = pool.apply(fakepkg.user.use)
            team.monkey_patch_engine()  # the team's own call, still in the code: harmless
            print(json.dumps([fakepkg.user.use(), child, {EVENTS}]))
        '''
    here, child, events = lab.json(code, enable="monkey-patch-engine")
    # `from fakepkg.core import helper` in fakepkg.user got the patched function: the function
    # ran right after fakepkg.core's body, before fakepkg.user copied from it
    assert here == child == ["patched helper", "patched step"]
    assert sorted(e[2] for e in events) == [
        "fakepkg.core:Engine._patched", "fakepkg.core:Engine.step", "fakepkg.core:helper"]
    assert {e[3] for e in events} == {"after-import"}
    # off: the team's own call in the parent misses the copy made before it, and the child
    assert lab.json(code, enable=None)[:2] == [["helper", "patched step"], ["helper", "step"]]


def test_changes_are_attributed_to_the_defining_module(lab: Lab) -> None:
    (fn,) = adopt(lab, "teampatches.vllm_like:through_a_reexport", "--dry-run")["functions"]
    assert [(c["target"], c["how"]) for c in fn["changes"]] == [
        ("fakepkg.core:Engine.extra", "added"),  # reached through fakepkg.user, defined in core
        ("fakepkg.other:LIMIT", "replaced"),
        ("fakepkg.other:__doc__", "deleted")]
    assert not list(lab.patches.iterdir())  # --dry-run wrote nothing


def test_runs_once_at_whichever_of_its_modules_comes_first(lab: Lab) -> None:
    adopt(lab, "teampatches.vllm_like:through_a_reexport", "--name", "reexport")
    out = lab.json('''
        import json, sys, importpatch.events
        import fakepkg.other   # first: it runs here, and imports fakepkg.user itself
        ran = "fakepkg.user" in sys.modules
        import fakepkg.core
        print(json.dumps([ran, fakepkg.other.LIMIT, fakepkg.core.Engine.extra,
                          [e["detail"] for e in importpatch.events.events()]]))
        ''', enable="reexport")
    ran, limit, extra, details = out
    assert ran is True and limit == 2 and extra == 1
    assert sum("ran at fakepkg.other" in d for d in details) == 2, details
    assert any("ran once in this process, at fakepkg.other" in d for d in details), details


@pytest.mark.parametrize(("function", "said"), [
    ("noop", "changed no attribute of any module or class"),
    ("only_builtins", "it changed added builtins:team_flag (builtins has no Python source"),
    ("raises", "raised when called with no arguments (probe): RuntimeError: no GPU here"),
])
def test_a_function_that_changes_nothing_adoptable_is_refused_with_what_it_did(
        lab: Lab, function: str, said: str) -> None:
    proc = lab.run([*ADOPT, f"teampatches.vllm_like:{function}"], enable=None)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in proc.stderr
    assert not list(lab.patches.iterdir())


def test_the_written_file_loads_and_check_pin_and_drift_know_its_targets(lab: Lab) -> None:
    adopt(lab, "teampatches.vllm_like:monkey_patch_engine", "--name", "engine")
    listed = json.loads(lab.ok(["-m", "importpatch", "list", "--json"], enable="engine").stdout)
    (row,) = [r for r in listed["patches"] if r["name"] == "engine"]
    assert row["error"] is None and row["kinds"] == ["after_import"]
    assert row["targets"] == ["fakepkg.core:Engine._patched", "fakepkg.core:Engine.step",
                              "fakepkg.core:helper"]
    report = json.loads(lab.ok(["-m", "importpatch", "check", "engine", "--json"],
                               enable="engine").stdout)
    ops = report["patches"][0]["ops"]
    assert [(o["target"], o["status"]) for o in ops] == [
        (t, "ok") for t in row["targets"]], ops
    assert "teampatches.vllm_like:monkey_patch_engine replaces or deletes it" in ops[1]["detail"]
    pinned = lab.ok(["-m", "importpatch", "pin", "engine"], enable="engine").stdout
    assert "pinned" in pinned and (lab.patches / "engine.pin.toml").exists()
    lab.target({"fakepkg/core.py": TARGET["fakepkg/core.py"].replace('"step"', '"stride"')})
    drift = json.loads(lab.ok(["-m", "importpatch", "check", "engine", "--json"],
                              enable="engine").stdout)["patches"][0]
    assert drift["drift"] == "changed"
    lab.target({"fakepkg/core.py": "class Engine:\n    pass\n"})  # step and helper gone
    gone = lab.run(["-m", "importpatch", "check", "engine", "--json"], enable="engine")
    statuses = [o["status"] for o in json.loads(gone.stdout)["patches"][0]["ops"]]
    assert statuses == ["ok", "fail", "fail"], gone.stdout


def test_the_compile_cache_digest_counts_the_adopted_function_s_file(lab: Lab) -> None:
    adopt(lab, "teampatches.vllm_like:monkey_patch_engine", "--name", "engine")
    code = '''
        import json, fakepkg.core
        from importpatch.integrations.vllm_compile import factor
        print(json.dumps(factor()))
        '''
    before = lab.json(code, enable="engine")
    assert re.fullmatch(r"engine=[0-9a-f]{16}", before)
    assert lab.json(code, enable="engine") == before
    edited = textwrap.dedent(TARGET["teampatches/vllm_like.py"]) + "# edited\n"
    lab.target({"teampatches/vllm_like.py": edited})
    assert lab.json(code, enable="engine") != before


def test_a_broken_adopt_file_fails_its_targets_closed_not_the_function_s_module(lab: Lab
                                                                               ) -> None:
    lab.patch({"broken.py": '''
        from importpatch import Patch

        patch = Patch("broken")
        patch.adopt("teampatches.vllm_like:monkey_patch_engine", {
            "fakepkg.core:helper": "replaced",
        })
        raise RuntimeError("a declaration that breaks")
        '''})
    target = lab.run("import fakepkg.core", enable="broken")
    assert target.returncode != 0 and "broken" in target.stderr, target.stderr
    lab.ok("import teampatches.vllm_like", enable="broken")  # the function's module: no target


def test_check_warns_when_the_adopted_function_s_module_is_not_importable(lab: Lab) -> None:
    adopt(lab, "teampatches.vllm_like:monkey_patch_engine", "--name", "engine")
    import shutil

    shutil.rmtree(lab.targets / "teampatches")
    report = json.loads(lab.ok(["-m", "importpatch", "check", "engine", "--json"],
                               enable="engine").stdout)
    ops = report["patches"][0]["ops"]
    assert {o["status"] for o in ops} == {"warn"}, ops
    assert "module teampatches.vllm_like is not found on sys.path here" in ops[0]["detail"]
