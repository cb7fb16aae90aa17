"""``Patch.after_import(module, fn)``: ``fn(module)`` runs right after the module's body executed,
before its import returns to the importer, in every process where the patch is on (issue 38,
item 1). Real child interpreters of the wheel venv (``lab``)."""

from __future__ import annotations

import json
import re

import pytest
from coreutil import EVENTS, Lab

TARGET = {
    "apkg/__init__.py": "",
    "apkg/reg.py": '''
        REGISTRY = {"base": object}


        def register(name, cls):
            REGISTRY[name] = cls


        LAST = "the end of the body"
        ''',
    # an importer that copies from the module while it is itself imported
    "apkg/user.py": '''
        from apkg.reg import REGISTRY

        SEEN = sorted(REGISTRY)
        ''',
    "apkg/work.py": '''
        import os


        def names(_=None):
            import apkg.reg
            return [os.getpid(), sorted(apkg.reg.REGISTRY)]


        def same(cls):
            import apkg.reg
            return cls is apkg.reg.REGISTRY["mine"]
        ''',
    "ahelp/__init__.py": "",
    "ahelp/hooks.py": '''
        CALLS = []


        def register(mod):
            CALLS.append(mod.__name__)
            mod.register("helper", dict)
        ''',
}
PATCHES = {
    "ai.py": '''
        import sys

        from importpatch import Patch

        p = Patch("ai")


        class Mine:
            pass


        @p.after_import("apkg.reg")
        def add_mine(mod):
            # what the body made is there, and the importer waits at its import statement
            mod.SAW = [mod.LAST, sys.modules.get("apkg.reg") is mod,
                       hasattr(sys.modules.get("apkg.user"), "REGISTRY")]
            mod.register("mine", Mine)
        ''',
}

pytestmark = pytest.mark.lab(target=TARGET, patch=PATCHES)


def test_runs_after_the_body_and_before_the_importer_copies_from_the_module(lab: Lab) -> None:
    out = lab.json(f'''
        import json, importpatch.events
        import apkg.user, apkg.reg
        print(json.dumps([apkg.user.SEEN, apkg.reg.SAW, {EVENTS},
                          [e["detail"] for e in importpatch.events.events()]]))
        ''', enable="ai")
    seen, saw, events, details = out
    assert seen == ["base", "mine"]  # `from apkg.reg import REGISTRY` at import saw the entry
    assert saw == ["the end of the body", True, False]
    assert events == [["applied", "ai", "apkg.reg", "after-import"]]
    assert "after_import: ran add_mine (ai.py:13) on apkg.reg after its body ran" in details[0]
    off = lab.json("import json, apkg.user; print(json.dumps(apkg.user.SEEN))", enable=None)
    assert off == ["base"]


@pytest.mark.parametrize("pool", ["multiprocessing.Pool", "ProcessPoolExecutor"])
def test_runs_in_a_spawned_child_and_what_it_registers_pickles_there(lab: Lab, pool: str
                                                                      ) -> None:
    make = ("ctx.Pool(1)" if pool == "multiprocessing.Pool"
            else "cf.ProcessPoolExecutor(1, mp_context=ctx)")
    call = ("pool.apply" if pool == "multiprocessing.Pool"
            else "lambda f, a=(): pool.submit(f, *a).result()")
    out = lab.json(f'''
        import concurrent.futures as cf, json, multiprocessing as mp, os
        import apkg.reg, apkg.work
        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            with {make} as pool:
                call = {call}
                pid, names = call(apkg.work.names)
                # the class the hook registered, pickled by reference into the child: the
                # child's registry holds that very class (its own hook ran there)
                same = call(apkg.work.same, (apkg.reg.REGISTRY["mine"],))
            print(json.dumps([os.getpid(), pid, names, same]))
        ''', enable="ai")
    parent, child, names, same = out
    assert child != parent
    assert names == ["base", "mine"]
    assert same is True


def test_a_module_imported_before_the_activation_gets_it_at_once_and_once(lab: Lab) -> None:
    out = lab.json(f'''
        import json, os
        import apkg.user, apkg.reg
        before = sorted(apkg.reg.REGISTRY)
        os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
        import importpatch, importpatch.events
        importpatch.enable("ai")
        importpatch.enable("ai")  # again: the hook does not run twice
        print(json.dumps([before, sorted(apkg.reg.REGISTRY), sorted(apkg.user.REGISTRY),
                          {EVENTS}, [e["detail"] for e in importpatch.events.events()]]))
        ''', enable=None, env={"IMPORTPATCH_PATH": None})
    before, after, copy, events, details = out
    assert before == ["base"]
    assert after == copy == ["base", "mine"]  # the copy is the same dict: it sees the entry
    assert events == [["applied", "ai", "apkg.reg", "late"]]
    assert "at once: the module was imported before patching started" in details[0]


@pytest.mark.parametrize("raised", ["ValueError('no room')", "SystemExit(3)"])
def test_a_hook_that_raises_fails_the_import_closed_naming_the_patch(lab: Lab, raised: str
                                                                     ) -> None:
    lab.patch({"boom.py": f'''
        from importpatch import Patch

        p = Patch("boom")


        @p.after_import("apkg.reg")
        def explode(mod):
            mod.HALF = True
            raise {raised}
        '''})
    out = lab.json(f'''
        import json, sys, importpatch.events
        from importpatch.errors import PatchError
        try:
            import apkg.user
            caught = None
        except PatchError as exc:
            caught = [exc.patch, exc.module, str(exc)]
        print(json.dumps([caught, "apkg.reg" in sys.modules, "apkg.user" in sys.modules,
                          {EVENTS}]))
        ''', enable="boom")
    caught, reg_left, user_left, events = out
    assert caught is not None, "the import did not fail"
    patch, module, message = caught
    kind = raised.partition("(")[0]
    assert (patch, module) == ("boom", "apkg.reg")
    assert f"after_import explode (boom.py:7) on apkg.reg raised {kind}" in message
    assert "IMPORTPATCH_DISABLE=boom" in message
    assert not reg_left and not user_left  # nothing half-done left in sys.modules
    assert ["failed", "boom", "apkg.reg", "import"] in events


def test_on_error_warn_skips_the_patch_and_imports_the_module(lab: Lab) -> None:
    lab.patch({"soft.py": '''
        from importpatch import Patch

        p = Patch("soft", on_error="warn")
        p.after_import("apkg.reg", lambda mod: 1 / 0)
        '''})
    out = lab.json(f'''
        import json, importpatch.events, apkg.user
        print(json.dumps([apkg.user.SEEN, {EVENTS}]))
        ''', enable="soft")
    seen, events = out
    assert seen == ["base"]
    assert events == [["failed", "soft", "apkg.reg", "skipped (on_error=warn)"]]


def test_a_string_function_is_imported_only_where_the_target_is(lab: Lab) -> None:
    lab.patch({"lazy.py": '''
        from importpatch import Patch

        Patch("lazy").after_import("apkg.reg", "ahelp.hooks:register")
        '''})
    elsewhere = lab.json('''
        import json, sys, apkg.work
        print(json.dumps(["ahelp.hooks" in sys.modules, "ahelp" in sys.modules]))
        ''', enable="lazy")
    assert elsewhere == [False, False]
    out = lab.json('''
        import json, sys, apkg.user, ahelp.hooks
        print(json.dumps([apkg.user.SEEN, ahelp.hooks.CALLS]))
        ''', enable="lazy")
    assert out == [["base", "helper"], ["apkg.reg"]]


def test_a_string_function_that_does_not_load_fails_the_import(lab: Lab) -> None:
    lab.patch({"gone.py": '''
        from importpatch import Patch

        Patch("gone").after_import("apkg.reg", "ahelp.nowhere:register")
        '''})
    proc = lab.run("import apkg.reg", enable="gone")
    assert proc.returncode == 1
    assert ("PatchError: importpatch: patch 'gone' cannot apply to apkg.reg" in proc.stderr)
    assert ("after_import ahelp.nowhere:register on apkg.reg could not be loaded: "
            "ModuleNotFoundError: No module named 'ahelp.nowhere'") in proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    ('"apkg.reg:REGISTRY", print', "give a module name, 'package.module'"),
    ('"apkg.reg", 3', "needs a function fn(module) or a 'helper.module:function' string"),
    ('"apkg.reg", "ahelp.hooks"', "a string must be 'helper.module:function'"),
])
def test_a_malformed_declaration_is_refused_where_it_is_made(lab: Lab, args: str, message: str
                                                             ) -> None:
    proc = lab.run(f'''
        from importpatch import Patch
        Patch("x").after_import({args})
        ''', enable=None)
    assert proc.returncode == 1
    assert "DeclarationError: patch x: after_import(" in proc.stderr
    assert message in proc.stderr


def test_list_and_check_show_the_op_and_where_it_runs(lab: Lab) -> None:
    lab.patch({"lazy.py": '''
        from importpatch import Patch

        Patch("lazy").after_import("apkg.reg", "ahelp.hooks:register")
        Patch("lost").after_import("apkg.reg", "nowhere_at_all:register")
        '''})
    listed = json.loads(lab.ok(["-m", "importpatch", "list", "--json"], enable="ai,lazy").stdout)
    rows = {r["name"]: r for r in listed["patches"]}
    assert rows["ai"]["kinds"] == ["after_import"]
    assert rows["ai"]["targets"] == ["apkg.reg"]
    assert [(o["kind"], o["runs"]) for o in rows["ai"]["ops"]] == [
        ("after_import", "add_mine (ai.py:13)")]
    assert rows["lazy"]["ops"][0]["runs"] == "ahelp.hooks:register"
    human = lab.ok(["-m", "importpatch", "list"], enable="ai,lazy").stdout
    assert ("target    apkg.reg (after_import: runs ahelp.hooks:register right after its body)"
            in human)

    report = json.loads(lab.ok(["-m", "importpatch", "check", "ai", "lazy", "--json"],
                               enable="ai,lazy").stdout)
    ops = {p["name"]: p["ops"] for p in report["patches"]}
    assert [(o["kind"], o["status"], o["module"]) for o in ops["ai"]] == [
        ("after_import", "ok", "apkg.reg")]
    assert ops["lazy"][0]["detail"] == (
        "runs ahelp.hooks:register on apkg.reg right after its body, before its import returns")
    human = lab.ok(["-m", "importpatch", "check", "lazy"], enable="lazy").stdout
    assert "after_import ok    apkg.reg" in human
    lost = json.loads(lab.ok(["-m", "importpatch", "check", "lost", "--json"],
                             enable="lost").stdout)["patches"][0]["ops"][0]
    assert lost["status"] == "warn"
    assert "module nowhere_at_all is not found on sys.path here" in lost["detail"]


def test_a_string_function_s_file_is_part_of_the_compile_cache_digest(lab: Lab) -> None:
    # (a patch file's digest is its bytes: tests/test_compile_cache_key.py, k-after-import)
    code = '''
        import json, importpatch
        from importpatch import Patch
        Patch("api-hook").after_import("apkg.reg", "ahelp.hooks:register")
        importpatch.enable()
        from importpatch.integrations.vllm_compile import factor
        print(json.dumps([factor(), "ahelp.hooks" in __import__("sys").modules]))
        '''
    before, imported = lab.json(code, enable=None)
    assert before.startswith("api-hook=") and imported is False  # found, not imported
    assert lab.json(code, enable=None)[0] == before
    lab.target({"ahelp/hooks.py": "def register(mod):\n    mod.register('other', set)\n"})
    assert lab.json(code, enable=None)[0] != before


def test_status_shows_where_it_ran_in_each_process(lab: Lab) -> None:
    events = lab.root / "events"
    lab.ok('''
        import multiprocessing as mp
        import apkg.user, apkg.work
        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                pool.apply(apkg.work.names)
        ''', enable="ai", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    status = lab.ok(["-m", "importpatch", "status", "--events-dir", str(events)],
                    enable="ai").stdout
    ran = [line.strip() for line in status.splitlines() if "applied ai -> apkg.reg" in line]
    assert len(ran) == 2, status  # the parent and its spawned child, each its own
    said = "applied ai -> apkg.reg (after-import): after_import: ran add_mine (ai.py:13) on"
    assert all(line.startswith(said) for line in ran), ran
    assert re.search(r"^ai: applied in 2 of \d+ process\(es\); 2 applied, 0 skipped, 0 failed",
                     status, re.M), status
