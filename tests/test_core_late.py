"""Late activation: targets imported before patching started are patched in place and their
``from x import y`` copies re-bound; code patches (diffs) are refused for them."""

from __future__ import annotations

import json
import subprocess
import textwrap
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


pytestmark = pytest.mark.lab(target=TARGET, patch=PATCHES)


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
    assert "re-bound 3 copies in other modules: lpk.u1:f, lpk.u2:H, lpk.u2:g" in details


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
        import importpatch.integrations.vllm_plugin
        importpatch.integrations.vllm_plugin.activate()
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


# -- Only proven copies are re-bound (issue 11, item 1) ----------------------------------------

COPY_TARGET = {
    "cpk/__init__.py": "",
    "cpk/m.py": '''
        DEBUG = False

        def f():
            return "orig"
        ''',
    "cpk/reexport.py": "from cpk.m import *\n",
    "cpk/user.py": '''
        import cpk.m as mm
        from cpk.reexport import f as via_star
        from cpk.m import DEBUG
        ENABLED = False  # equal to cpk.m.DEBUG, and the same object: not a copy
        attr_copy = mm.f

        class K:
            method = via_star
        ''',
}
COPY_PATCH = {"cp.py": '''
    from importpatch import Patch
    import cpk.m as _m

    _orig = _m.f  # the patch keeps the original: late activation must not re-bind it
    p = Patch("cp")

    @p.replace("cpk.m:f")
    def f():
        return "patched(" + _orig() + ")"

    p.replace("cpk.m:DEBUG", True)
    '''}


def test_late_rebinds_only_copies_the_source_proves_and_reports_each(tmp_path: Path,
                                                                     wheel_venv: Venv) -> None:
    lab = Lab(wheel_venv, tmp_path).target(COPY_TARGET).patch(COPY_PATCH)
    out = lab.json(f'''
        import json, os, posixpath, site, sys
        import cpk.m, cpk.reexport, cpk.user
        os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
        import importpatch, importpatch.events
        before = [site.ENABLE_USER_SITE, posixpath.supports_unicode_filenames]
        importpatch.enable("cp")
        u = cpk.user
        print(json.dumps([
            cpk.m.f(), cpk.reexport.f(), u.via_star(), u.attr_copy(), u.K.method(),
            cpk.m.DEBUG, cpk.reexport.DEBUG, u.DEBUG, u.ENABLED,
            [site.ENABLE_USER_SITE, posixpath.supports_unicode_filenames] == before,
            sys.modules["builtins"].__dict__["False"],
            [[e["target"], e["detail"]] for e in importpatch.events.events()
             if e["how"] == "rebind"],
        ]))
        ''', enable=None, env={**NO_VARS, "IMPORTPATCH_EVENTS_DIR": str(tmp_path / "ev")})
    *calls, debug, re_debug, u_debug, enabled, untouched, builtins_false, rebinds = out
    # the replacement calls the original it saved: no recursion
    assert calls == ["patched(orig)"] * 5
    assert [debug, re_debug, u_debug] == [True, True, True]
    assert enabled is False and untouched is True and builtins_false is False
    sites = sorted(t for t, d in rebinds if d.startswith("copy of"))
    assert sites == [
        "cpk.reexport:DEBUG", "cpk.reexport:f", "cpk.user:DEBUG", "cpk.user:K.method",
        "cpk.user:attr_copy", "cpk.user:via_star",
    ]
    summaries = {t: d for t, d in rebinds if d.startswith("re-bound")}
    assert summaries["cpk.m:DEBUG"] == (
        "re-bound 2 copies in other modules: cpk.reexport:DEBUG, cpk.user:DEBUG")
    # importpatch status counts them (each is an event naming module:name)
    proc = subprocess.run([str(wheel_venv.script("importpatch")), "status", "--json",
                           "--events-dir", str(tmp_path / "ev")], capture_output=True, text=True,
                          check=True)
    assert json.loads(proc.stdout)["patches"]["cp"]["rebound"] == 6


# -- decorated= keeps its meaning late (item 2) --------------------------------------------------

DECO_TARGET = {
    "dk/__init__.py": "",
    "dk/m.py": '''
        import functools

        REGISTRY = []

        def register(fn):
            REGISTRY.append(fn)
            return fn

        class C:
            @property
            def size(self):
                return 1

            @size.setter
            def size(self, value):
                self.stored = value

            @staticmethod
            def st():
                return "st"

            @functools.lru_cache(maxsize=7)
            def cached(self):
                return "cached"

        @register
        def handler():
            return "orig"
        ''',
}
DECO_PATCH = {"dp.py": '''
    from importpatch import Patch
    p = Patch("dp")
    p.replace("dk.m:C.size", lambda self: 2)
    p.replace("dk.m:C.st", lambda: "ST")
    p.replace("dk.m:C.cached", lambda self: "CACHED")
    reg = Patch("reg")
    reg.replace("dk.m:handler", lambda: "patched")
    '''}
DECO_READ = '''
    import json, dk.m as m, importpatch.events as ev
    c = m.C()
    c.size = 5
    print(json.dumps([c.size, c.stored, m.C.st(), c.cached(),
                      m.C.__dict__["cached"].cache_parameters()["maxsize"],
                      type(m.C.__dict__["size"]).__name__,
                      [[e["outcome"], e["patch"], e["detail"]] for e in ev.events()
                       if e["outcome"] == "failed"]]))
    '''


def test_late_replacement_of_decorated_targets_matches_import(tmp_path: Path,
                                                              wheel_venv: Venv) -> None:
    lab = Lab(wheel_venv, tmp_path).target(DECO_TARGET).patch(DECO_PATCH)
    at_import = lab.json(DECO_READ, enable="dp")
    late = lab.json(textwrap.dedent(f'''
        import os, dk.m
        os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
        import importpatch
        importpatch.enable("dp")
        ''') + textwrap.dedent(DECO_READ), enable=None, env=NO_VARS)
    assert at_import == late == [2, 5, "ST", "CACHED", 7, "property", []]


def test_late_replacement_under_a_registry_decorator_is_refused_with_advice(
    tmp_path: Path, wheel_venv: Venv
) -> None:
    lab = Lab(wheel_venv, tmp_path).target(DECO_TARGET).patch(DECO_PATCH)
    out = lab.json(f'''
        import json, os, dk.m as m
        os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
        import importpatch, importpatch.events as ev
        importpatch.enable("reg")
        print(json.dumps([m.handler(), m.REGISTRY[0](),
                          [e["detail"] for e in ev.events() if e["outcome"] == "failed"]]))
        ''', enable=None, env=NO_VARS)
    handler, registered, failures = out
    assert handler == registered == "orig"  # nothing half-done
    assert len(failures) == 1
    assert "decorated with @register" in failures[0]
    assert "activate the patch at interpreter start" in failures[0]


def test_late_replace_of_an_enum_member_applies_nothing_of_the_patch(
    tmp_path: Path, wheel_venv: Venv
) -> None:
    lab = Lab(wheel_venv, tmp_path).target({
        "en/__init__.py": "",
        "en/m.py": '''
            import enum

            class Color(enum.Enum):
                RED = 1

            def f():
                return "orig"
            ''',
    }).patch({"en.py": '''
        from importpatch import Patch
        p = Patch("en")

        @p.replace("en.m:f")
        def f():
            return "late"

        p.replace("en.m:Color.RED", 10)
        '''})
    out = lab.json(f'''
        import json, os, en.m as m
        os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
        import importpatch, importpatch.events as ev
        try:
            importpatch.enable("en")
            raised = ""
        except BaseException as exc:
            raised = repr(exc)
        print(json.dumps([raised, m.f(), m.Color.RED.value,
                          [e["detail"] for e in ev.events() if e["outcome"] == "failed"]]))
        ''', enable=None, env=NO_VARS)
    raised, f, red, failures = out
    assert (raised, f, red) == ("", "orig", 1)  # nothing half-done, nothing escaped enable()
    assert len(failures) == 1 and "Color.RED is an Enum member" in failures[0]


@pytest.mark.parametrize("index", ["warm", "scanned-while-broken"])
def test_a_declaration_that_failed_to_load_late_is_tried_again(tmp_path: Path, wheel_venv: Venv,
                                                               index: str) -> None:
    # "scanned-while-broken": the index itself records the failure (the scan ran the file while
    # it failed), which a warm index written a moment ago also does when its mtime is racy.
    lab = Lab(wheel_venv, tmp_path).target(TARGET).patch({"flaky.py": '''
        import os
        from importpatch import Patch
        if os.environ.get("FLAKY_BROKEN"):
            raise RuntimeError("not yet")
        Patch("flaky").replace("lpk.m:f", lambda: "flaky")
        '''})
    if index == "warm":
        lab.ok("import lpk.m", enable="flaky")  # the index knows the patch (it loaded then)
    out = lab.json(f'''
        import json, os, lpk.m
        os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
        os.environ["FLAKY_BROKEN"] = "1"
        import importpatch, importpatch.events as ev
        importpatch.enable("flaky")
        first = lpk.m.f()
        del os.environ["FLAKY_BROKEN"]
        importpatch.enable("flaky")
        print(json.dumps([first, lpk.m.f(),
                          [e["outcome"] for e in ev.events()
                           if e["patch"] == "flaky" and e["outcome"] != "info"]]))
        ''', enable=None, env=NO_VARS)
    assert out[0] == "orig" and out[1] == "flaky"
    assert out[2] == ["failed", "applied"]


def test_a_later_activation_composes_with_what_landed_before_or_refuses(lab: Lab) -> None:
    # Each activation applies its own patches on what is there. Without a record of what landed
    # earlier, a replace enabled later silently threw away a wrap applied at import, a second
    # replace silently won over the first (both on at import: a conflict), and a wrap enabled
    # later went outermost whatever its place in the chain.
    lab.patch({"lw.py": '''
        from importpatch import Patch

        @Patch("lw").wrap("lpk.m:f")
        def w(wrapped, instance, args, kwargs):
            return "lw(" + wrapped(*args, **kwargs) + ")"
        '''})
    out = lab.json('''
        import json, lpk.m, lpk.u1
        import importpatch, importpatch.events as ev
        from importpatch import Patch

        def wrapper(label):
            return lambda wrapped, instance, args, kwargs: f"{label}(" + wrapped() + ")"

        seen = [lpk.m.f()]
        Patch("api-replace").replace("lpk.m:f", lambda: "api")   # beneath the wrap: refused
        importpatch.enable()
        seen.append(lpk.m.f())
        Patch("a-inner").wrap("lpk.m:f", wrapper("a"))           # before "lw": refused
        importpatch.enable()
        seen.append(lpk.m.f())
        Patch("z-outer").wrap("lpk.m:f", wrapper("z"))           # after "lw": as at import
        importpatch.enable()
        seen.append(lpk.m.f())
        seen.append(lpk.u1.f())
        chains = [e["chain"]["patch"] + " %(position)s/%(length)s" % e["chain"]
                  for e in ev.events() if e["outcome"] == "applied"]
        print(json.dumps([seen, chains, {e["patch"]: e["detail"] for e in ev.events()
                                         if e["outcome"] == "failed"}]))
        ''', enable="lw")
    seen, chains, failures = out
    assert seen == ["lw(orig)", "lw(orig)", "lw(orig)", "z(lw(orig))", "z(lw(orig))"]
    assert chains == ["lw 1/1", "z-outer 2/2"]
    assert sorted(failures) == ["a-inner", "api-replace"]
    assert "already wrapped by 'lw'" in failures["api-replace"]
    assert "a replace goes beneath the wraps" in failures["api-replace"]
    assert "goes inside the wrap of 'lw'" in failures["a-inner"]
    assert "enable them together" in failures["a-inner"]


def test_a_second_replace_enabled_later_is_the_conflict_it_is_at_import(lab: Lab) -> None:
    out = lab.json('''
        import json, lpk.m
        import importpatch, importpatch.events as ev
        from importpatch import Patch
        Patch("first").replace("lpk.m:f", lambda: "first")
        importpatch.enable()
        Patch("second").replace("lpk.m:f", lambda: "second")
        importpatch.enable()
        print(json.dumps([lpk.m.f(), [e["detail"] for e in ev.events()
                                      if e["outcome"] == "failed"]]))
        ''', enable=None, env=NO_VARS)
    f, failures = out
    assert f == "first"
    assert len(failures) == 1
    assert "conflict: patches 'first' and 'second' both replace f" in failures[0]


def test_enable_inside_the_targets_own_import_says_so_and_a_later_activation_applies(
    tmp_path: Path, wheel_venv: Venv
) -> None:
    # A module imported by the target (a plugin loader, a circular import) calls enable() while
    # the target is half-run: its names below that point do not exist yet. That was reported as
    # "symbol 'f' not found" and the patch marked done, so no later activation applied it.
    lab = Lab(wheel_venv, tmp_path).target({
        "half/__init__.py": "",
        "half/m.py": '''
            import half.plugin

            def f():
                return "orig"
            ''',
        "half/plugin.py": '''
            import importpatch
            from importpatch import Patch
            Patch("early").replace("half.m:f", lambda: "patched")
            importpatch.enable()
            ''',
    })
    out = lab.json('''
        import json, importpatch, importpatch.events as ev
        import half.m
        first = half.m.f()
        importpatch.enable()
        print(json.dumps([first, half.m.f(), [e["detail"] for e in ev.events()
                                              if e["outcome"] == "failed"]]))
        ''', enable=None, env=NO_VARS)
    first, after, failures = out
    assert (first, after) == ("orig", "patched")
    assert len(failures) == 1
    assert "half.m was still being imported when patching started" in failures[0]
    assert "not found" not in failures[0]


# -- The module that saved an original, under every name it has (issue 18, item B) -------------

MAIN_SAVES_THE_ORIGINAL = {
    "api": '''
        import multiprocessing  # __main__ is now also sys.modules["__mp_main__"]
        import json, sys
        import lpk.m as m
        import importpatch
        from importpatch import Patch

        orig = m.f
        p = Patch("p2")

        @p.replace("lpk.m:f")
        def f():
            return "patched(" + orig() + ")"

        importpatch.enable("p2")
        ''',
    "compat": '''
        import multiprocessing  # __main__ is now also sys.modules["__mp_main__"]
        import json, sys
        import lpk.m as m
        from importpatch.compat import VLLMPatch

        orig = m.f

        def patched():
            return "patched(" + orig() + ")"

        class FPatch(VLLMPatch["lpk.m"]):
            f = patched

        FPatch.apply()
        ''',
}


@pytest.mark.parametrize("api", sorted(MAIN_SAVES_THE_ORIGINAL))
def test_a_main_script_keeps_the_original_it_saved_once_multiprocessing_is_imported(
    lab: Lab, api: str
) -> None:
    # The exemption of a module that declared patches went by the name it had ("__main__"), and
    # late activation re-bound its `orig` through the other name, "__mp_main__": the
    # replacement then called itself (RecursionError).
    script = lab.root / "main.py"
    script.write_text(textwrap.dedent(MAIN_SAVES_THE_ORIGINAL[api]) + textwrap.dedent('''
        print(json.dumps([sys.modules["__mp_main__"] is sys.modules["__main__"], m.f(),
                          orig is m.f]))
        '''), encoding="utf-8")
    proc = lab.run([script], enable=None, env=NO_VARS)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, "patched(orig)", False]
