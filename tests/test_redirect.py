"""``Patch.redirect(module, to)``: the import of ``module`` gives module ``to`` itself, in every
process where the patch is on (issue 38, item 3). Real child interpreters of the wheel venv
(``lab``), a spawned multiprocessing child among them."""

from __future__ import annotations

import json
import re

import pytest
from coreutil import EVENTS, Lab

TARGET = {
    "rpkg/__init__.py": "",
    "rpkg/ops.py": '''
        WHO = "original"
        RAN = True


        def add(a, b):
            return a + b
        ''',
    # an importer that copies names from the module while it is itself imported
    "rpkg/user.py": '''
        from rpkg.ops import WHO, add

        SEEN = [WHO, add(2, 3)]
        ''',
    "rpkg/work.py": '''
        import os


        def seen(_=None):
            import rpkg.ops
            import rpkg.user
            return [os.getpid(), rpkg.ops.WHO, rpkg.user.SEEN, rpkg.ops.__name__]


        def same(obj):
            import rpkg.ops
            return [type(obj) is rpkg.ops.Kernel, obj.n]
        ''',
    "myplug/__init__.py": "",
    "myplug/ops.py": '''
        from . import _impl  # a relative import: resolved in myplug, the module's own package

        WHO = "plugin"


        def add(a, b):
            return _impl.TIMES * (a + b)


        class Kernel:
            def __init__(self, n):
                self.n = n
        ''',
    "myplug/_impl.py": "TIMES = 10\n",
    "myplug/broken.py": "raise RuntimeError('no device here')\n",
    "myplug/cycle.py": "from rpkg.ops import WHO\n",
}
PATCHES = {
    "redir.py": '''
        from importpatch import Patch

        Patch("redir").redirect("rpkg.ops", "myplug.ops")
        ''',
}

pytestmark = pytest.mark.lab(target=TARGET, patch=PATCHES)


def test_the_import_gives_the_other_module_itself_and_copies_see_it(lab: Lab) -> None:
    out = lab.json(f'''
        import json, sys, importpatch.events
        import rpkg.user, rpkg.ops, myplug.ops
        from rpkg import ops as attr
        print(json.dumps([rpkg.user.SEEN, rpkg.ops is myplug.ops, attr is myplug.ops,
                          sys.modules["rpkg.ops"] is myplug.ops, rpkg.ops.__name__,
                          hasattr(rpkg.ops, "RAN"), {EVENTS},
                          [e["detail"] for e in importpatch.events.events()]]))
        ''', enable="redir")
    seen, same, attr, alias, name, ran, events, details = out
    assert seen == ["plugin", 50]  # `from rpkg.ops import WHO, add` at import: the plugin's
    assert same and attr and alias  # one module object, under both names
    assert name == "myplug.ops"
    assert ran is False  # the original's body never ran
    assert events == [["applied", "redir", "rpkg.ops", "redirect"]]
    assert re.match(r"redirect: rpkg\.ops is myplug\.ops \(.*myplug/ops\.py\)$", details[0])
    off = lab.json("import json, rpkg.user; print(json.dumps(rpkg.user.SEEN))", enable=None)
    assert off == ["original", 5]


def test_in_a_spawned_child_and_what_it_defines_pickles_by_its_own_name(lab: Lab) -> None:
    out = lab.json('''
        import json, multiprocessing as mp, os
        import rpkg.ops, rpkg.work
        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                child = pool.apply(rpkg.work.seen)
                # an object of the redirected module, pickled into the child: by myplug.ops's name
                same = pool.apply(rpkg.work.same, (rpkg.ops.Kernel(7),))
            print(json.dumps([os.getpid(), child, same]))
        ''', enable="redir")
    parent, (pid, who, seen, name), same = out
    assert pid != parent
    assert [who, seen, name] == ["plugin", ["plugin", 50], "myplug.ops"]
    assert same == [True, 7]


def test_a_module_imported_before_patching_started_is_refused(lab: Lab) -> None:
    out = lab.json(f'''
        import json, os
        import rpkg.user
        os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
        import importpatch, importpatch.events, rpkg.ops
        importpatch.enable("redir")
        import rpkg.ops as after
        print(json.dumps([after.WHO, rpkg.user.SEEN, {EVENTS},
                          [e["detail"] for e in importpatch.events.events()]]))
        ''', enable=None, env={"IMPORTPATCH_PATH": None})
    who, seen, events, details = out
    assert [who, seen] == ["original", ["original", 5]]  # left as it was, whole
    assert events == [["failed", "redir", "rpkg.ops", "in-place"]]
    assert details[0].startswith("redirect to myplug.ops: rpkg.ops was imported before "
                                 "patching started")
    assert "enable it at interpreter start" in details[0]


def test_a_target_that_fails_to_import_fails_the_import_closed(lab: Lab) -> None:
    lab.patch({"bad.py": '''
        from importpatch import Patch

        Patch("bad").redirect("rpkg.ops", "myplug.broken")
        '''})
    out = lab.json(f'''
        import json, sys, importpatch.events
        from importpatch.errors import PatchError
        try:
            import rpkg.user
            caught = None
        except PatchError as exc:
            caught = [exc.patch, exc.module, str(exc)]
        print(json.dumps([caught, "rpkg.ops" in sys.modules, "rpkg.user" in sys.modules,
                          {EVENTS}]))
        ''', enable="bad")
    caught, ops_left, user_left, events = out
    assert caught is not None, "the import did not fail"
    patch, module, message = caught
    assert (patch, module) == ("bad", "rpkg.ops")
    assert ("redirect to myplug.broken: importing myplug.broken raised RuntimeError: "
            "no device here") in message
    assert "IMPORTPATCH_DISABLE=bad" in message
    assert not ops_left and not user_left
    assert ["failed", "bad", "rpkg.ops", "import"] in events


def test_on_error_warn_imports_the_original_with_the_event(lab: Lab) -> None:
    lab.patch({"soft.py": '''
        from importpatch import Patch

        Patch("soft", on_error="warn").redirect("rpkg.ops", "myplug.broken")
        '''})
    out = lab.json(f'''
        import json, importpatch.events, rpkg.user
        print(json.dumps([rpkg.user.SEEN, {EVENTS}]))
        ''', enable="soft")
    assert out == [["original", 5], [["failed", "soft", "rpkg.ops", "skipped (on_error=warn)"]]]


def test_a_target_that_imports_the_redirected_module_is_told_so(lab: Lab) -> None:
    lab.patch({"loop.py": '''
        from importpatch import Patch

        Patch("loop").redirect("rpkg.ops", "myplug.cycle")
        '''})
    proc = lab.run("import rpkg.ops", enable="loop")
    assert proc.returncode == 1
    assert "PatchError: importpatch: patch 'loop' cannot apply to rpkg.ops" in proc.stderr
    assert ("rpkg.ops is redirected to myplug.cycle (patch loop), and myplug.cycle read "
            "rpkg.ops.WHO while it was itself being imported") in proc.stderr


def test_another_patch_s_change_of_the_redirected_module_fails_closed(lab: Lab) -> None:
    lab.patch({"wrapper.py": '''
        from importpatch import Patch

        p = Patch("wrapper")

        @p.wrap("rpkg.ops:add")
        def add(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs)
        '''})
    proc = lab.run("import rpkg.ops", enable="redir,wrapper")
    assert proc.returncode == 1
    assert ("rpkg.ops is redirected to myplug.ops by patch redir, so its own code never runs "
            "and this patch's wrap cannot land there; target myplug.ops instead") in proc.stderr


def test_after_import_hooks_run_on_the_module_it_became(lab: Lab) -> None:
    lab.patch({"hook.py": '''
        from importpatch import Patch

        Patch("hook").after_import("rpkg.ops", lambda mod: setattr(mod, "HOOKED", mod.WHO))
        '''})
    out = lab.json('''
        import json, myplug.ops, rpkg.ops
        print(json.dumps(myplug.ops.HOOKED))
        ''', enable="redir,hook")
    assert out == "plugin"


@pytest.mark.parametrize(("args", "message"), [
    ('"rpkg.ops:add", "myplug.ops"', "give the module to redirect as 'package.module'"),
    ('"rpkg.ops", "myplug.ops:add"', "give the module it becomes as 'package.module'"),
    ('"rpkg.ops", "rpkg.ops.inner"', "rpkg.ops.inner is rpkg.ops or inside it"),
])
def test_a_malformed_declaration_is_refused_where_it_is_made(lab: Lab, args: str, message: str
                                                             ) -> None:
    proc = lab.run(f'''
        from importpatch import Patch
        Patch("x").redirect({args})
        ''', enable=None)
    assert proc.returncode == 1
    assert "DeclarationError: patch x: redirect(" in proc.stderr
    assert message in proc.stderr


def test_python_m_of_a_redirected_module_fails_closed(lab: Lab) -> None:
    proc = lab.run(["-m", "rpkg.ops"], enable="redir")
    assert proc.returncode == 1
    assert ("rpkg.ops is redirected to myplug.ops: it has no code of its own to run "
            "(python -m myplug.ops runs the module it is)") in proc.stderr


def test_list_check_and_status_show_it(lab: Lab) -> None:
    lab.patch({"lost.py": '''
        from importpatch import Patch

        Patch("lost").redirect("rpkg.ops", "nowhere_at_all.ops")
        '''})
    listed = json.loads(lab.ok(["-m", "importpatch", "list", "--json"], enable="redir").stdout)
    row = next(r for r in listed["patches"] if r["name"] == "redir")
    assert row["kinds"] == ["redirect"] and row["targets"] == ["rpkg.ops"]
    assert [(o["kind"], o["to"]) for o in row["ops"]] == [("redirect", "myplug.ops")]
    human = lab.ok(["-m", "importpatch", "list"], enable="redir").stdout
    assert "target    rpkg.ops (redirect: its import gives myplug.ops)" in human

    report = json.loads(lab.ok(["-m", "importpatch", "check", "redir", "--json"],
                               enable="redir").stdout)
    op = report["patches"][0]["ops"][0]
    assert (op["kind"], op["status"], op["module"]) == ("redirect", "ok", "rpkg.ops")
    assert op["detail"] == ("the import of rpkg.ops gives myplug.ops itself; rpkg.ops's own "
                            "code never runs")
    proc = lab.run(["-m", "importpatch", "check", "lost", "--json"], enable="lost")
    assert proc.returncode == 1
    lost = json.loads(proc.stdout)["patches"][0]["ops"][0]
    assert lost["status"] == "fail"
    assert "module nowhere_at_all.ops is not found here" in lost["detail"]

    events = lab.root / "events"
    lab.ok('''
        import multiprocessing as mp
        import rpkg.work
        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                pool.apply(rpkg.work.seen)
            rpkg.work.seen()
        ''', enable="redir", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    status = lab.ok(["-m", "importpatch", "status", "--events-dir", str(events)],
                    enable="redir").stdout
    said = [line.strip() for line in status.splitlines() if "applied redir -> rpkg.ops" in line]
    assert len(said) == 2, status  # the parent and its spawned child
    assert all(line.startswith("applied redir -> rpkg.ops (redirect): redirect: rpkg.ops is "
                               "myplug.ops") for line in said), said


def test_the_compile_cache_digest_counts_the_module_it_redirects_to(lab: Lab) -> None:
    code = '''
        import json, importpatch, sys
        importpatch.enable("redir")
        from importpatch.integrations.vllm_compile import factor
        print(json.dumps([factor(), "myplug.ops" in sys.modules]))
        '''
    env = {"IMPORTPATCH_PATH": str(lab.patches)}
    before, imported = lab.json(code, enable=None, env=env)
    assert before.startswith("redir=") and imported is False  # found, not imported
    assert lab.json(code, enable=None, env=env)[0] == before
    lab.target({"myplug/ops.py": "WHO = 'plugin, changed'\n"})
    assert lab.json(code, enable=None, env=env)[0] != before
