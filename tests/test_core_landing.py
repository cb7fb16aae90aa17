"""Definition-site landing: a replacement takes effect where the target name is bound, so every
copy made while the target module executes (and later) holds the replacement."""

from __future__ import annotations

import json
from typing import Any

import pytest
from coreutil import EVENTS, Lab


def replace_f(target: str = "lpkg.a:f", name: str = "rep-f", *, decorated: bool = False
              ) -> dict[str, str]:
    """A patch file whose patch ``name`` replaces ``target`` with a function returning 'patched'."""
    return {f"{name}.py": f'''
        from importpatch import Patch
        p = Patch("{name}")

        @p.replace("{target}", decorated={decorated})
        def replacement(*args):
            return "patched"
        '''}


def values(lab: Lab, *exprs: str, imports: str = "import lpkg.a as a") -> list[Any]:
    body = ", ".join(exprs)
    return list(lab.json(f"import json\n{imports}\nprint(json.dumps([{body}]))"))


def test_registry_decorator_in_the_target_module_sees_the_replacement(lab: Lab) -> None:
    lab.target({"lpkg/__init__.py": "", "lpkg/a.py": '''
        HANDLERS = []

        def handler(fn):
            HANDLERS.append(fn)
            return fn

        @handler
        def f():
            return "orig"
        '''}).patch(replace_f())
    assert values(lab, "a.HANDLERS[0]()", "a.f()", "a.HANDLERS == [a.f]") == [
        "patched", "patched", True
    ]


def test_dict_and_list_of_functions_hold_the_replacement(lab: Lab) -> None:
    lab.target({"lpkg/__init__.py": "", "lpkg/a.py": '''
        def f():
            return "orig"

        TABLE = {"f": f}
        FUNCS = [f, f]
        '''}).patch(replace_f())
    assert values(lab, "a.TABLE['f']()", "[g() for g in a.FUNCS]") == [
        "patched", ["patched", "patched"]
    ]


def test_functools_partial_holds_the_replacement(lab: Lab) -> None:
    lab.target({"lpkg/__init__.py": "", "lpkg/a.py": '''
        import functools

        def f(x):
            return "orig"

        P = functools.partial(f, 1)
        '''}).patch(replace_f())
    assert values(lab, "a.P()", "a.P.func is a.f") == ["patched", True]


def test_class_body_alias_of_a_method_holds_the_replacement(lab: Lab) -> None:
    lab.target({"lpkg/__init__.py": "", "lpkg/a.py": '''
        class K:
            def meth(self):
                return "orig"
            alias = meth
        '''}).patch(replace_f("lpkg.a:K.meth"))
    assert values(lab, "a.K().alias()", "a.K().meth()") == ["patched", "patched"]


def test_default_argument_holds_the_replacement(lab: Lab) -> None:
    lab.target({"lpkg/__init__.py": "", "lpkg/a.py": '''
        def f():
            return "orig"

        def call(fn=f):
            return fn()
        '''}).patch(replace_f())
    assert values(lab, "a.call()") == ["patched"]


def test_circular_import_copy_made_mid_way_is_patched(lab: Lab) -> None:
    # a imports b before a is done; b does `from lpkg.a import f` while a is half executed
    lab.target({
        "lpkg/__init__.py": "",
        "lpkg/a.py": '''
            def f():
                return "orig"

            from lpkg import b  # noqa: E402

            def after():
                return b.f()
            ''',
        "lpkg/b.py": '''
            from lpkg.a import f

            COPY = f
            ''',
    }).patch(replace_f())
    imports = "import lpkg.a as a, lpkg.b as b"
    assert values(lab, "a.after()", "b.f()", "b.COPY()", imports=imports) == ["patched"] * 3


def test_later_from_import_copy_is_patched(lab: Lab) -> None:
    lab.target({
        "lpkg/__init__.py": "",
        "lpkg/a.py": 'def f():\n    return "orig"\n',
        "lpkg/c.py": "from lpkg.a import f as g\n",
    }).patch(replace_f())
    assert values(lab, "c.g()", imports="import lpkg.a, lpkg.c as c") == ["patched"]


DECORATED = {"lpkg/__init__.py": "", "lpkg/a.py": '''
    import functools

    def trace(fn):
        @functools.wraps(fn)
        def inner(*args):
            return ["traced", fn(*args)]
        return inner

    @trace
    def f():
        return "orig"
    '''}


def test_replacement_goes_under_the_original_decorators_by_default(lab: Lab) -> None:
    lab.target(DECORATED).patch(replace_f())
    assert values(lab, "a.f()") == [["traced", "patched"]]


def test_decorated_true_replaces_the_decorated_result(lab: Lab) -> None:
    lab.target(DECORATED).patch(replace_f(decorated=True))
    assert values(lab, "a.f()") == ["patched"]


@pytest.mark.parametrize("decorated", [False, True])
def test_wrap_of_a_dataclass_keeps_the_methods_its_decorator_makes(lab: Lab, decorated: bool
                                                                   ) -> None:
    # decorated=False wraps the class before @dataclass runs: the decorator sets __init__,
    # __repr__, __eq__ on the wrapper it is given, and they must reach the class.
    lab.target({"lpkg/__init__.py": "", "lpkg/a.py": '''
        from dataclasses import dataclass

        @dataclass
        class D:
            x: int = 1
        '''}).patch({"wrap-d.py": f'''
        from importpatch import Patch

        @Patch("wrap-d").wrap("lpkg.a:D", decorated={decorated})
        def made(wrapped, instance, args, kwargs):
            obj = wrapped(*args, **kwargs)
            obj.seen = True
            return obj
        '''})
    assert values(lab, "repr(a.D(x=3))", "a.D(x=3).seen", "a.D(x=3) == a.D(x=3)",
                  "__import__('dataclasses').is_dataclass(a.D)",
                  "repr(__import__('pickle').loads(__import__('pickle').dumps(a.D(x=2))))") == [
        "D(x=3)", True, True, True, "D(x=2)"]


def test_name_bound_dynamically_is_patched_after_exec_and_logged(lab: Lab) -> None:
    lab.target({"lpkg/__init__.py": "", "lpkg/a.py": '''
        globals()["f"] = lambda: "orig"
        SEEN_DURING_EXEC = f()
        '''}).patch(replace_f())
    out = values(lab, "a.f()", "a.SEEN_DURING_EXEC", EVENTS,
                 imports="import lpkg.a as a, importpatch.events")
    assert out[:2] == ["patched", "orig"]
    assert [e[3] for e in out[2] if e[0] == "applied"] == [
        "after-exec (binding not visible in the source)"
    ]


def test_missing_symbol_raises_patch_error_naming_everything_and_leaves_no_module(lab: Lab) -> None:
    lab.target({
        "lpkg/__init__.py": '__version__ = "1.2.3"\n',
        "lpkg/a.py": 'def f():\n    return "orig"\n',
    }).patch(replace_f("lpkg.a:nope", "rep-nope"))
    proc = lab.ok('''
        import json, sys
        try:
            import lpkg.a
        except ImportError as exc:
            print(json.dumps([type(exc).__name__, str(exc), exc.name, "lpkg.a" in sys.modules]))
        ''')
    kind, message, name, still_there = json.loads(proc.stdout)
    assert kind == "PatchError" and name == "lpkg.a" and still_there is False
    file = str(lab.targets / "lpkg" / "a.py")
    for part in ("patch 'rep-nope'", "lpkg.a", "nope", file, "lpkg 1.2.3"):
        assert part in message, (part, message)
    # shown even though the caller swallowed the ImportError
    assert "importpatch: failed rep-nope to lpkg.a (import)" in proc.stderr


# -- on_error="warn" is all or nothing (issue 11, item 3) --------------------------------------

WARN_TARGET = {"lpkg/__init__.py": "", "lpkg/a.py": '''
    import os

    SEEN = []

    def register(fn):
        SEEN.append(fn)
        return fn

    @register
    def f():
        return "orig"

    if os.environ.get("DEFINE_G"):
        def g():
            return "g"

    class K:
        if os.environ.get("DEFINE_G"):
            attr = 1

    def add_extra(cls):
        cls.extra = "class decorator's"
        return cls

    @add_extra
    class D:
        pass
    '''}


WARN_IMPORTS = "import lpkg.a as a, importpatch.events"


def warn_patch(second: str) -> dict[str, str]:
    return {"half.py": f'''
        from importpatch import Patch
        p = Patch("half", on_error="warn")

        @p.replace("lpkg.a:f")
        def f():
            return "patched"

        {second}
        '''}


@pytest.mark.parametrize("second", [
    'p.replace("lpkg.a:g", lambda: "G")',          # a def under an if that is false
    'p.replace("lpkg.a:K.attr", 2)',               # a class attribute under a condition
    'p.add("lpkg.a:D.extra", "patch\'s")',         # an add of a name a class decorator sets
])
def test_warn_patch_that_cannot_apply_entirely_applies_nothing(lab: Lab, second: str) -> None:
    lab.target(WARN_TARGET).patch(warn_patch(second))
    out = values(lab, "a.f()", "a.SEEN[0]()", EVENTS, imports=WARN_IMPORTS)
    f, registered, events = out
    assert f == registered == "orig"  # nothing of the patch was observable, anywhere
    assert [e[0] for e in events] == ["failed"] and events[0][3] == "skipped (on_error=warn)"
    # the same patch applies entirely where it can
    if "D.extra" not in second:
        out = values(lab, "a.f()", "a.SEEN[0]()", EVENTS,
                     imports="import os; os.environ['DEFINE_G'] = '1'\n"
                             "import lpkg.a as a, importpatch.events")
        assert out[:2] == ["patched", "orig"]  # staged: applied after the module ran
        assert [e[0] for e in out[2]] == ["applied", "applied"]
        assert all(e[3].startswith("after-exec (on_error=warn") for e in out[2])


def test_warn_patch_the_source_proves_lands_at_the_definition_site(lab: Lab) -> None:
    lab.target(WARN_TARGET).patch(warn_patch('p.replace("lpkg.a:K", K2 := type("K", (), {}))'))
    out = values(lab, "a.f()", "a.SEEN[0]()", EVENTS, imports=WARN_IMPORTS)
    assert out[:2] == ["patched", "patched"]
    assert [(e[0], e[3]) for e in out[2]] == [("applied", "definition-site")] * 2


def test_fail_patch_on_a_symbol_absent_from_the_source_fails_before_the_module_runs(
    lab: Lab
) -> None:
    # another patch's replacement would be registered in a table of another module while the
    # target runs; the import fails, so nothing of either patch may be registered anywhere
    lab.target({
        "lpkg/__init__.py": "",
        "lpkg/table.py": "HANDLERS = []\n",
        "lpkg/a.py": '''
            from lpkg.table import HANDLERS

            def f():
                return "orig"

            HANDLERS.append(f)
            ''',
    }).patch({**replace_f(), **replace_f("lpkg.a:nope", "rep-nope")})
    out = values(lab, "[h() for h in table.HANDLERS]", "ok",
                 imports="import lpkg.table as table\ntry:\n    import lpkg.a\n    ok = True\n"
                         "except ImportError:\n    ok = False")
    assert out == [[], False]



ENUM_TARGET = {"lpkg/__init__.py": "", "lpkg/a.py": '''
    import enum

    class Color(enum.Enum):
        RED = 1
        BLUE = 2

    def f():
        return "orig"
    '''}


@pytest.mark.parametrize("on_error", ["fail", "warn"])
def test_replace_of_an_enum_member_is_refused_by_name_and_a_warn_patch_leaves_the_module_intact(
    lab: Lab, on_error: str
) -> None:
    # An Enum body refuses a second binding of a member ('RED' already defined): the landing
    # must not bind it twice, and the patch is refused (pointing to patch.field) before the
    # module runs, so the module imports whole and unpatched under "warn".
    lab.target(ENUM_TARGET).patch({"en.py": f'''
        from importpatch import Patch
        p = Patch("en", on_error={on_error!r})

        @p.replace("lpkg.a:f")
        def f():
            return "patched"

        p.replace("lpkg.a:Color.RED", 10)
        '''})
    out = values(lab, "ok", "ok and a.f()", "ok and a.Color.RED.value", "str(err)",
                 imports="try:\n    import lpkg.a as a\n    ok, err = True, ''\n"
                         "except ImportError as exc:\n    ok, err = False, exc")
    ok, f, red, err = out
    if on_error == "warn":
        assert (ok, f, red) == (True, "orig", 1)
    else:
        assert ok is False and "patch 'en'" in err
    message = err or lab.ok("import lpkg.a", env={"IMPORTPATCH_LOG": "1"}).stderr
    assert "Color.RED is an Enum member" in message and "existing=True" in message, message
    check = lab.run(["-m", "importpatch", "check", "en"])
    assert check.returncode == 1 and "Color.RED is an Enum member" in check.stdout, check.stdout


# -- a name bound twice is patched once (item 4) ---------------------------------------------------


def test_def_then_functional_decorator_rebinding_is_wrapped_once(lab: Lab) -> None:
    lab.target({"lpkg/__init__.py": "", "lpkg/a.py": '''
        import functools

        def f(x):
            return x

        f = functools.lru_cache(f)

        class C:
            def m(self):
                return 1
            m = staticmethod(m)
        '''}).patch({"w.py": '''
        from importpatch import Patch
        p = Patch("w")

        @p.wrap("lpkg.a:f")
        def w(wrapped, instance, args, kwargs):
            return ["w", wrapped(*args, **kwargs)]

        @p.wrap("lpkg.a:C.m")
        def wm(wrapped, instance, args, kwargs):
            return ["wm", wrapped(*args, **kwargs)]
        '''})
    out = values(lab, "a.f(1)", "a.f.cache_info().currsize", "a.C.m(None)", EVENTS,
                 imports="import lpkg.a as a, importpatch.events")
    f, cached, m, events = out
    assert f == ["w", 1] and cached == 1  # the wrap sits inside the cache, once
    assert m == ["wm", 1]
    assert sorted((e[0], e[2]) for e in events) == [("applied", "lpkg.a:C.m"),
                                                    ("applied", "lpkg.a:f")]
