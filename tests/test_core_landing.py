"""Definition-site landing: a replacement takes effect where the target name is bound, so every
copy made while the target module executes (and later) holds the replacement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Venv
from coreutil import EVENTS, Lab


@pytest.fixture
def lab(wheel_venv: Venv, tmp_path: Path) -> Lab:
    return Lab(wheel_venv, tmp_path)


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
