"""Late activation: targets imported before patching started are patched in place and their
``from x import y`` copies re-bound; code patches (diffs) are refused for them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Venv
from coreutil import EVENTS, Lab

TARGET = {
    "lpk/__init__.py": "",
    "lpk/m.py": '''
        def f():
            return "orig"

        class K:
            def meth(self):
                return "meth"
        ''',
    "lpk/u1.py": "from lpk.m import f\n",
    "lpk/u2.py": "from lpk.m import f as g\nH = g\n",
}
PATCHES = {
    "lp.py": '''
        from importpatch import Patch
        p = Patch("lp")

        @p.replace("lpk.m:f")
        def f():
            return "late"

        @p.wrap("lpk.m:K.meth")
        def w(wrapped, instance, args, kwargs):
            return "wrapped-" + wrapped(*args, **kwargs)
        ''',
    "ld.diff": '''\
        --- a/lpk/m.py
        +++ b/lpk/m.py
        @@ -2,3 +2,3 @@
         def f():
        -    return "orig"
        +    return "diffed"

        ''',
}
NO_VARS = {"IMPORTPATCH_PATH": None}


@pytest.fixture
def lab(wheel_venv: Venv, tmp_path: Path) -> Lab:
    return Lab(wheel_venv, tmp_path).target(TARGET).patch(PATCHES)


def test_enable_after_import_patches_in_place_and_rebinds_copies(lab: Lab) -> None:
    out = lab.json(f'''
        import json, os, sys
        import lpk.m, lpk.u1, lpk.u2
        before = [lpk.m.f(), lpk.u1.f(), lpk.u2.g(), lpk.u2.H()]
        os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
        import importpatch, importpatch.events
        count = importpatch.enable("lp")
        after = [lpk.m.f(), lpk.u1.f(), lpk.u2.g(), lpk.u2.H(), lpk.m.K().meth()]
        print(json.dumps([before, count, after, {EVENTS},
                          [e["detail"] for e in importpatch.events.events()]]))
        ''', enable=None, env=NO_VARS)
    before, count, after, events, details = out
    assert before == ["orig"] * 4
    assert count == 1
    assert after == ["late", "late", "late", "late", "wrapped-meth"]
    assert sorted((e[2], e[3]) for e in events if e[0] == "applied") == [
        ("lpk.m:K.meth", "in-place"), ("lpk.m:f", "in-place")
    ]
    assert "re-bound 3 copies in other modules" in details  # u1.f, u2.g, u2.H


def test_patch_made_in_code_is_enabled_in_place_by_enable(lab: Lab) -> None:
    out = lab.json('''
        import json, lpk.m, lpk.u1
        from importpatch import Patch, enable
        Patch("api").replace("lpk.m:f", lambda: "api")
        print(json.dumps([enable(), lpk.m.f(), lpk.u1.f()]))
        ''', enable=None, env=NO_VARS)
    assert out == [1, "api", "api"]


def test_diff_patch_for_already_imported_module_is_refused_with_a_clear_message(lab: Lab) -> None:
    proc = lab.ok(f'''
        import json, os, lpk.m
        os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
        import importpatch, importpatch.events
        importpatch.enable("ld")
        print(json.dumps([lpk.m.f(), {EVENTS}]))
        ''', enable=None, env=NO_VARS)
    assert '["orig", [["failed", "ld", "lpk.m", "in-place"]]]' in proc.stdout
    message = [line for line in proc.stderr.splitlines() if "failed ld to lpk.m" in line]
    assert len(message) == 1, proc.stderr
    assert ("diff patches apply only when the module is imported, and lpk.m was imported "
            "before patching started") in message[0]


def test_python_dash_big_s_patches_after_vllm_plugin_activates(lab: Lab) -> None:
    # -S: no site, so no .pth; vLLM's general-plugin hook activates patching late
    env = {"PYTHONPATH": f"{lab.targets}:{lab.venv.site_packages}"}
    out = lab.json('''
        import json, sys
        no_hook = "importpatch" not in sys.modules and "site" not in sys.modules
        import lpk.m, lpk.u1
        import importpatch.vllm_plugin
        importpatch.vllm_plugin.activate()
        import lpk.u2  # imported after activation: patched at load
        finders = [type(f).__name__ for f in sys.meta_path].count("PatchFinder")
        print(json.dumps([no_hook, lpk.m.f(), lpk.u1.f(), lpk.u2.g(), finders]))
        ''', enable="lp", env=env, flags=["-S"])
    assert out == [True, "late", "late", "late", 1]


def test_enable_again_neither_stacks_wraps_nor_refuses_what_import_applied(lab: Lab) -> None:
    out = lab.json(f'''
        import json, importpatch, importpatch.events, lpk.m
        importpatch.enable()
        importpatch.enable("lp")
        print(json.dumps([lpk.m.K().meth(), lpk.m.f(), {EVENTS}]))
        ''', enable="lp,ld")
    meth, f, events = out
    assert meth == "wrapped-meth" and f == "late"
    assert [e for e in events if e[0] != "applied"] == []  # the diff is not "refused" later
    assert sorted(e[2] for e in events) == ["lpk.m", "lpk.m:K.meth", "lpk.m:f"]


def test_enable_turns_on_no_discovered_patch_that_was_not_asked_for(lab: Lab) -> None:
    # the first process scans every declaration (ld.diff too); enable() must not pick ld up
    out = lab.json(f'''
        import json, importpatch, importpatch.events, lpk.m
        importpatch.enable()
        print(json.dumps([lpk.m.f(), {EVENTS}]))
        ''', enable="lp")
    f, events = out
    assert f == "late"
    assert [e for e in events if e[1] == "ld"] == []
