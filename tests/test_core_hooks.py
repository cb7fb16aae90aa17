"""Other import hooks in the same process keep working with importpatch, in either order: real
wrapt post-import hooks, and a second meta-path hook that chains loaders the way ddtrace's
ModuleWatchdog does (wraps the loader, swaps its get_code, calls back after exec_module). Also
importlib.reload of a patched module."""

from __future__ import annotations

import pytest
from coreutil import Lab

TARGET = {
    "hk/__init__.py": "",
    "hk/m.py": '''
        def f():
            return "orig"
        ''',
}
PATCH = {"hp.py": '''
    from importpatch import Patch
    p = Patch("hp")
    p.replace("hk.m:f", lambda: "patched")
    p.add("hk.m:EXTRA", "added")
    '''}

# A meta-path hook in the style of ddtrace's ModuleWatchdog: it finds the spec through the other
# finders (importlib.util.find_spec, guarded against itself), wraps the loader in a chained loader
# whose exec_module wraps the inner loader's get_code (a code transformer), runs the inner
# exec_module and then calls back.
CHAINED_HOOK = '''
import importlib.util, sys

SEEN = []

class Chained:
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        original = self.loader.get_code

        def get_code(fullname):
            code = original(fullname)
            SEEN.append(("code", fullname, "activation" in str(code.co_consts)))
            return code

        self.loader.get_code = get_code
        try:
            self.loader.exec_module(module)
        finally:
            del self.loader.get_code
        SEEN.append(("after", module.__name__, module.f()))

class Watchdog:
    def __init__(self):
        self.finding = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "hk.m" or fullname in self.finding:
            return None
        self.finding.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.finding.discard(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = Chained(spec.loader)
        return spec
'''


pytestmark = pytest.mark.lab(target={**TARGET, "chainedhook.py": CHAINED_HOOK}, patch=PATCH)


@pytest.mark.parametrize("order", ["importpatch-first", "wrapt-first"])
def test_wrapt_post_import_hook_fires_with_the_patched_module(lab: Lab, order: str) -> None:
    # importpatch-first: enable() after wrapt registered its hook (ours is then first on
    # sys.meta_path); wrapt-first: wrapt registered after the .pth installed ours.
    register = '''
        import wrapt
        FIRED = []
        wrapt.register_post_import_hook(lambda m: FIRED.append([m.f(), m.EXTRA]), "hk.m")
        '''
    enable = f'''
        import os
        os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
        import importpatch
        importpatch.enable("hp")
        '''
    first, second = (register, enable) if order == "importpatch-first" else (enable, register)
    out = lab.json(first + second + '''
        import json, hk.m
        print(json.dumps([hk.m.f(), FIRED]))
        ''', enable=None, env={"IMPORTPATCH_PATH": None})
    assert out == ["patched", [["patched", "added"]]]


@pytest.mark.parametrize("order", ["importpatch-first", "hook-first"])
def test_a_second_meta_path_hook_sees_patched_code_and_calls_back(lab: Lab, order: str) -> None:
    install = "import sys, chainedhook\nsys.meta_path.insert(0, chainedhook.Watchdog())\n"
    enable = f'''
import os
os.environ["IMPORTPATCH_PATH"] = {str(lab.patches)!r}
import importpatch
importpatch.enable("hp")
'''
    first, second = (install, enable) if order == "importpatch-first" else (enable, install)
    out = lab.json(first + second + '''
import json, chainedhook, hk.m, importpatch.events as ev
print(json.dumps([hk.m.f(), chainedhook.SEEN, len(ev.applied())]))
''', enable=None, env={"IMPORTPATCH_PATH": None})
    f, seen, applied = out
    assert f == "patched" and applied == 2
    assert seen == [["code", "hk.m", True], ["after", "hk.m", "patched"]]


def test_reload_of_a_patched_module_patches_it_again(lab: Lab) -> None:
    out = lab.json('''
        import importlib, json, hk.m, importpatch.events as ev
        first = [hk.m.f(), hk.m.EXTRA]
        importlib.reload(hk.m)
        print(json.dumps([first, hk.m.f(), hk.m.EXTRA,
                          [e["outcome"] for e in ev.events()]]))
        ''', enable="hp")
    assert out == [["patched", "added"], "patched", "added", ["applied"] * 4]
