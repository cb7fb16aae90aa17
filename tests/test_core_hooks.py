"""Other import hooks in the same process keep working with importpatch, in either order: real
wrapt post-import hooks, and a second meta-path hook that chains loaders the way ddtrace's
ModuleWatchdog does (wraps the loader, swaps its get_code, calls back after exec_module); real
typeguard (its import hook and its pytest plugin), beartype.claw and pytest's assertion rewriting
on a patched module, with their instrumentation kept; a user's finder put first; a loader that
cannot be composed with (a warning, or the import fails under strict mode). Also importlib.reload
of a patched module, and pytest with warnings as errors starting in a process importpatch
started in."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Venv
from coreutil import Lab, write_tree

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


# -- Hooks installed ahead of importpatch's finder, and hooks that compile the module themselves --
# Before: a finder inserted at sys.meta_path[0] after the start (typeguard's install_import_hook,
# pytest's assertion rewriting, a user's finder) answered for the target first, so the target ran
# unpatched with exit 0 and no word; a loader that transforms the source (beartype.claw) was
# bypassed, so the patch applied and beartype's checks were gone.

TYPED = {
    "tk/__init__.py": "",
    "tk/m.py": '''
        def f():
            return "orig"


        def typed(x: int) -> int:
            return x


        def check(x):
            assert x == 1
        ''',
    "tk/n.py": "def g():\n    return 'orig'\n",
}
TYPED_PATCH = {"tp.py": '''
    from importpatch import Patch
    p = Patch("tp")
    p.replace("tk.m:f", lambda: "patched")
    p.replace("tk.n:g", lambda: "patched")

    @p.wrap("tk.m:typed")
    def typed(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)
    '''}
HOOK_PACKAGES = ("typeguard>=4.3", "beartype>=0.18", "pytest")  # as in the test extra

# What the child prints: the patched function, whether the hook's check of `typed` still fires,
# and importpatch's events.
REPORT = '''
import json, importpatch.events as ev
try:
    tk.m.typed("x")
    checked = None
except Exception as exc:
    checked = type(exc).__name__
print(json.dumps([tk.m.f(), tk.m.typed(2), checked,
                  [[e["outcome"], e["how"], e["detail"]] for e in ev.events()]]))
'''


@pytest.fixture(scope="module")
def hooks_venv(venv_factory: Callable[..., Venv], built_wheel: Path) -> Venv:
    """The wheel with typeguard, beartype and pytest (real packages, from the index)."""
    return venv_factory(str(built_wheel), *HOOK_PACKAGES, name="hooks-venv")


def _composed(events: list[list[str]], loader: str) -> bool:
    return any(o == "info" and how == "other-hook" and loader in d and "kept" in d
               for o, how, d in events)


@pytest.mark.lab(target=TYPED, patch=TYPED_PATCH, venv="hooks_venv")
@pytest.mark.parametrize("order", ["importpatch-first", "typeguard-first"])
def test_typeguard_import_hook_keeps_its_checks_on_the_patched_module(lab: Lab, order: str
                                                                     ) -> None:
    # importpatch-first: the start (IMPORTPATCH_ENABLE) installed the finder, then typeguard put
    # its own at sys.meta_path[0]; typeguard-first: importpatch.enable() after typeguard's hook.
    code = "from typeguard import install_import_hook\ninstall_import_hook('tk')\n"
    enable: str | None = "tp"
    if order == "typeguard-first":
        code, enable = code + "import importpatch\nimportpatch.enable('tp')\n", None
    proc = lab.ok(code + "import tk.m\n" + REPORT, enable=enable)
    f, two, checked, events = json.loads(proc.stdout.splitlines()[-1])
    assert (f, two, checked) == ("patched", 2, "TypeCheckError")
    assert _composed(events, "TypeguardLoader"), events
    assert "warning" not in proc.stderr, proc.stderr


@pytest.mark.lab(target=TYPED, patch=TYPED_PATCH, venv="hooks_venv")
def test_beartype_claw_keeps_its_checks_on_the_patched_module(lab: Lab) -> None:
    proc = lab.ok("from beartype.claw import beartype_package\nbeartype_package('tk')\n"
                  "import tk.m\n" + REPORT, enable="tp")
    f, two, checked, events = json.loads(proc.stdout.splitlines()[-1])
    assert (f, two, checked) == ("patched", 2, "BeartypeCallHintParamViolation")
    assert _composed(events, "BeartypeSourceFileLoader"), events
    assert "warning" not in proc.stderr, proc.stderr


INNER_REWRITE = {
    "conftest.py": 'import pytest\npytest.register_assert_rewrite("tk.m")\n',
    "test_inner.py": '''
        import pytest


        def test_patched_and_rewritten():
            import tk.m
            assert tk.m.f() == "patched"
            with pytest.raises(AssertionError) as info:
                tk.m.check(2)
            assert "assert 2 == 1" in str(info.value)  # pytest's rewritten assert
        ''',
}
INNER_TYPEGUARD = {
    "test_inner.py": '''
        import pytest
        from typeguard import TypeCheckError


        def test_patched_and_checked():
            import tk.m
            assert tk.m.f() == "patched"
            with pytest.raises(TypeCheckError):
                tk.m.typed("x")
        ''',
}


@pytest.mark.lab(target=TYPED, patch=TYPED_PATCH, venv="hooks_venv")
@pytest.mark.parametrize("case", ["register_assert_rewrite", "typeguard-packages"])
def test_pytest_hooks_and_a_patch_both_apply_under_filterwarnings_error(lab: Lab, case: str
                                                                       ) -> None:
    # A real pytest run (filterwarnings = error, as strict projects run): the target is patched
    # and pytest's assertion rewriting (or typeguard's pytest plugin) still instruments it; no
    # .pyc of the patched module is written to the target package's __pycache__.
    inner = lab.root / "inner"
    files = INNER_REWRITE if case == "register_assert_rewrite" else INNER_TYPEGUARD
    write_tree(inner, {**files, "pytest.ini": "[pytest]\nfilterwarnings = error\n"})
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", str(inner)]
    if case == "typeguard-packages":
        args.append("--typeguard-packages=tk")
    proc = lab.run(args, enable="tp")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert not list(lab.targets.glob("tk/__pycache__/m.*")), list(lab.targets.glob("tk/**/*"))


USER_FINDER = '''
import importlib.util, os, sys

SEEN = []
TARGETS = os.environ["PYTHONPATH"]


class OwnLoader:
    """Loads a module its own way: no get_code (importpatch cannot hand it patched code)."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        SEEN.append(module.__name__)
        with open(module.__file__) as f:
            exec(compile(f.read(), module.__file__, "exec"), module.__dict__)

    def get_data(self, path):
        with open(path, "rb") as f:
            return f.read()


class UserFinder:
    def __init__(self, own):
        self.own = own

    def find_spec(self, name, path=None, target=None):
        if name not in ("tk.m", "tk.n"):
            return None
        file = os.path.join(TARGETS, *name.split(".")) + ".py"
        loader = OwnLoader() if self.own else None
        return importlib.util.spec_from_file_location(name, file, loader=loader)


def put_first(own):
    sys.meta_path.insert(0, UserFinder(own))
'''


@pytest.mark.lab(target={**TYPED, "userfinder.py": USER_FINDER}, patch=TYPED_PATCH)
def test_a_user_finder_at_index_0_gets_the_module_patched(lab: Lab) -> None:
    proc = lab.ok("import json, sys, userfinder\nuserfinder.put_first(own=False)\n"
                  "import tk.m, tk.n\nprint(json.dumps([tk.m.f(), tk.n.g(), "
                  "type(sys.meta_path[0]).__name__]))", enable="tp")
    assert json.loads(proc.stdout) == ["patched", "patched", "PatchFinder"]
    assert "warning" not in proc.stderr, proc.stderr


@pytest.mark.lab(target={**TYPED, "userfinder.py": USER_FINDER}, patch=TYPED_PATCH)
def test_a_loader_that_cannot_be_composed_with_warns_once_or_fails_closed_under_strict(
    lab: Lab
) -> None:
    code = ("import json, userfinder\nuserfinder.put_first(own=True)\n"
            "import tk.m, tk.n\nprint(json.dumps([tk.m.f(), tk.n.g(), userfinder.SEEN]))")
    events = lab.root / "events"
    proc = lab.ok(code, enable="tp", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    assert json.loads(proc.stdout) == ["patched", "patched", []]  # ours ran, patched
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, proc.stderr  # once per process and hook, not per module
    assert "userfinder.OwnLoader (found by userfinder.UserFinder)" in warnings[0]
    assert "IMPORTPATCH_STRICT" in warnings[0]
    status = lab.ok(["-m", "importpatch", "status", "--events-dir", str(events)], enable=None)
    hook_lines = [line for line in status.stdout.splitlines() if "(other-hook)" in line]
    assert [line.split()[0:4] for line in hook_lines] == [
        ["info", "tp", "->", "tk.m"], ["info", "tp", "->", "tk.n"]], status.stdout
    # Strict: the import fails before the module ran (the hook's loader never ran either),
    # naming the hook.
    proc = lab.run(code, enable="tp", env={"IMPORTPATCH_STRICT": "1"})
    assert proc.returncode != 0, proc.stdout
    assert proc.stderr.splitlines()[-1].startswith("importpatch.errors.PatchError: "), proc.stderr
    assert "userfinder.OwnLoader" in proc.stderr and "IMPORTPATCH_STRICT is on" in proc.stderr
    out = lab.json("import json, sys, userfinder\nuserfinder.put_first(own=True)\n"
                   "try:\n    import tk.m\nexcept ImportError:\n    pass\n"
                   "print(json.dumps(['tk.m' in sys.modules, userfinder.SEEN]))",
                   enable="tp", env={"IMPORTPATCH_STRICT": "1"})
    assert out == [False, []]


@pytest.mark.lab(target=TYPED, patch=TYPED_PATCH, venv="hooks_venv")
@pytest.mark.parametrize("env", [{"IMPORTPATCH_LOG": "0"}, {"IMPORTPATCH_ENABLE": "tp"}])
def test_pytest_with_warnings_as_errors_starts_with_importpatch_imported(
    lab: Lab, env: dict[str, str]
) -> None:
    # Any IMPORTPATCH_ variable starts the hook in pytest's process before pytest runs; pytest
    # then marks the packages of its plugins' distributions (importpatch has a pytest11 entry
    # point) for rewriting and warned "Module already imported so cannot be rewritten;
    # importpatch", which filterwarnings = error (or -W error) made exit 1.
    inner = write_tree(lab.root / "plain", {
        "pytest.ini": "[pytest]\nfilterwarnings = error\n",
        "test_plain.py": "def test_one():\n    assert 1 + 1 == 2\n",
    })
    for extra in ([], ["-W", "error"]):
        proc = lab.run(["-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, str(inner)],
                       enable=env.get("IMPORTPATCH_ENABLE"), env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "1 passed" in proc.stdout
