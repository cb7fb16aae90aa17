"""Subclassing a class in place (issue 18, item A): ``patch.subclass(target)`` calls a factory with
the original class when the module binds it, and binds the subclass it returns under the original
name; ``replace`` of a class by a non-class (``original=True`` among them) is refused by ``check``
and at import with that op as advice; a target on an inherited method says where it is defined.
Real child processes of the wheel venv, a real spawn child for pickling."""

from __future__ import annotations

import json
from textwrap import dedent

import pytest
from coreutil import EVENTS, Lab

TARGET = {
    "spk/__init__.py": "",
    "spk/m.py": '''
        import dataclasses


        @dataclasses.dataclass
        class Spec:
            block_size: int = 16

            def size(self):
                return self.block_size


        class FullSpec(Spec):  # a later subclass in the module: must build on the patched class
            pass


        SPECS = {"base": Spec, "full": FullSpec}  # a registry filled as the module runs


        def make_spec(n):
            return Spec(n)


        def helper():
            return "helper"


        def describe(spec):  # run in a spawned child: what it unpickled
            return [type(spec).__module__, type(spec).__qualname__, len(type(spec).__mro__),
                    spec.size(), isinstance(spec, SPECS["base"])]
        ''',
    "spk/other.py": "from spk.m import Spec\n",
    "spk/base.py": '''
        class Worker:
            def load_model(self):
                return "worker"
        ''',
    "spk/cpu.py": '''
        from spk import base
        from spk.base import Worker


        class CPUWorker(Worker):
            def execute(self):
                return "cpu"


        class Other(base.Worker):
            pass
        ''',
}

SUB = {"sub.py": '''
    from importpatch import Patch

    p = Patch("sub")


    @p.subclass("spk.m:Spec")
    def make(Original):
        class Spec(Original):
            def size(self):
                return 2 * super().size()

            def extra(self):
                return "extra"

        return Spec
    '''}


pytestmark = pytest.mark.lab(target=TARGET)


def test_a_subclass_is_bound_under_the_original_name_for_the_module_and_its_importers(
    lab: Lab,
) -> None:
    lab.patch(SUB)
    out = lab.json(f'''
        import dataclasses, json, multiprocessing, pickle
        import importpatch
        import spk.m as m, spk.other

        original = m.Spec.__mro__[1]
        spec = m.make_spec(3)
        back = pickle.loads(pickle.dumps(spec))
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            child = pool.apply(m.describe, (spec,))
        print(json.dumps({{
            "size": [m.Spec().size(), spec.size(), spec.extra(), m.FullSpec().size()],
            "bound": [spk.other.Spec is m.Spec, m.SPECS["base"] is m.Spec,
                      issubclass(m.FullSpec, m.Spec), isinstance(spec, original),
                      original.__qualname__, dataclasses.is_dataclass(m.Spec)],
            "names": [m.Spec.__module__, m.Spec.__qualname__, m.Spec.__name__,
                      m.Spec.size.__qualname__],
            "pickle": [type(back) is m.Spec, back.size()],
            "child": child,
            "events": [e for e in {EVENTS} if e[1] == "sub"],
        }}))
        ''', enable="sub")
    assert out["size"] == [32, 6, "extra", 32]
    assert out["bound"] == [True, True, True, True, "Spec", True]
    assert out["names"] == ["spk.m", "Spec", "Spec", "Spec.size"]
    assert out["pickle"] == [True, 6]
    # the spawned child unpickled an instance of its own subclass (the patch is on there too)
    assert out["child"] == ["spk.m", "Spec", 3, 6, True]
    assert out["events"] == [["applied", "sub", "spk.m:Spec", "definition-site"]]


def test_subclasses_stack_and_compose_with_member_patches_and_wraps(lab: Lab) -> None:
    lab.patch({**SUB, "more.py": '''
        from importpatch import Patch

        a = Patch("a-sub")   # by patch name: "a-sub" is nearest the original, then "sub"

        @a.subclass("spk.m:Spec")
        def make(Original):
            class Spec(Original):
                def size(self):
                    return super().size() + 1
            return Spec

        a.replace("spk.m:Spec.size", lambda self: self.block_size * 10)

        w = Patch("w")

        @w.wrap("spk.m:Spec", decorated=True)
        def wrap(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs)
        '''})
    out = lab.json('''
        import json
        import spk.m as m
        chain = [c.__module__ + ":" + c.__qualname__ for c in m.Spec.__wrapped__.__mro__]
        print(json.dumps([m.Spec(2).size(), m.FullSpec(2).size(), chain]))
        ''', enable="sub,a-sub,w")
    # member replace (x10) in the original, "a-sub" (+1) on it, "sub" (x2) outermost; wrap above
    assert out[0] == out[1] == 42
    assert out[2] == ["spk.m:Spec", "spk.m:Spec", "spk.m:Spec", "builtins:object"]
    listed = lab.ok(["-m", "importpatch", "check"], enable="sub,a-sub,w").stdout
    assert "subclass  ok    spk.m:Spec" in listed
    assert "chain of spk.m:Spec" in listed
    assert "1. replace" not in listed  # the member replace is on Spec.size, not in this chain
    lines = listed[listed.index("chain of spk.m:Spec"):].splitlines()[1:4]
    assert [line.split()[1:3] for line in lines] == [
        ["subclass", "a-sub"], ["subclass", "sub"], ["wrap", "w"]]


def test_check_and_list_show_the_subclass_op(lab: Lab) -> None:
    lab.patch(SUB)
    check = json.loads(lab.run(["-m", "importpatch", "check", "--json"], enable="sub").stdout)
    ops = [op for p in check["patches"] if p["name"] == "sub" for op in p["ops"]]
    assert [(op["kind"], op["target"], op["status"]) for op in ops] == [
        ("subclass", "spk.m:Spec", "ok")]
    listing = json.loads(lab.run(["-m", "importpatch", "list", "--json"], enable="sub").stdout)
    row = next(r for r in listing["patches"] if r["name"] == "sub")
    assert row["kinds"] == ["subclass"]
    assert [op["kind"] for op in row["ops"]] == ["subclass"]
    assert listing["chains"][0]["links"][0]["kind"] == "subclass"


def test_a_subclass_applied_late_rebinds_the_name_and_its_copies(lab: Lab) -> None:
    lab.patch(SUB)
    out = lab.json('''
        import json, os
        import spk.m as m, spk.other
        import importpatch
        importpatch.enable("sub")
        print(json.dumps([m.Spec(3).size(), spk.other.Spec is m.Spec,
                          m.Spec.__mro__[1] is m.SPECS["base"]]))
        ''', enable=None)
    assert out == [6, True, True]


BAD = {
    "not-a-subclass": ('''
        @p.subclass("spk.m:Spec")
        def make(Original):
            class Spec:
                pass
            return Spec
        ''', "subclass Spec: the factory make returned the class ", "not a subclass of spk.m:Spec"),
    "function-target": ('''
        @p.subclass("spk.m:helper")
        def make(Original):
            return Original
        ''', "subclass helper:", "not a class (replace or wrap it)"),
    "original-true": ('''
        @p.replace("spk.m:Spec", original=True)
        def spec(original, *args, **kwargs):
            return original(*args, **kwargs)
        ''', "replace Spec with original=True", "use patch.subclass('spk.m:Spec')"),
    "function-for-class": ('''
        @p.replace("spk.m:Spec")
        def spec(*args, **kwargs):
            return None
        ''', "replace Spec with a function, not a class", "use patch.subclass('spk.m:Spec')"),
    "inherited": ('''
        p.replace("spk.cpu:CPUWorker.load_model", lambda self: "patched")
        ''', "CPUWorker.load_model is inherited from spk.base:Worker: target that, "
             "spk.base:Worker.load_model", "patch.add('spk.cpu:CPUWorker.load_model', ...)"),
    "inherited-via-module": ('''
        p.wrap("spk.cpu:Other.load_model", lambda w, i, a, k: w(*a, **k))
        ''', "Other.load_model is inherited from spk.base:Worker", "spk.base:Worker.load_model"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_check_and_import_refuse_what_cannot_subclass_naming_the_patch(lab: Lab,
                                                                       case: str) -> None:
    body, *expected = BAD[case]
    lab.patch({"bad.py": "from importpatch import Patch\np = Patch('bad')\n" + dedent(body)})
    module = "spk.cpu" if case.startswith("inherited") else "spk.m"
    proc = lab.run(["-m", "importpatch", "check", "--json"], enable="bad")
    ops = [op for p in json.loads(proc.stdout)["patches"] if p["name"] == "bad" for op in p["ops"]]
    if case != "not-a-subclass":  # what the factory returns is known only when it runs
        assert ops[0]["status"] == "fail", ops
        for part in expected:
            assert part in ops[0]["detail"], ops[0]["detail"]
    run = lab.run(f"import {module}", enable="bad")
    assert run.returncode == 1
    err = run.stderr.strip().splitlines()[-1]
    assert f"PatchError: importpatch: patch 'bad' cannot apply to {module}" in err, run.stderr
    for part in expected:
        assert part in err, err


def test_a_late_subclass_or_replace_that_would_reorder_the_chain_is_refused_whole(
    lab: Lab,
) -> None:
    # A subclass goes beneath wraps and above a replace: enabled later than a wrap (it would go
    # outside it) or before a replace (which would drop it), it is refused, as at import.
    lab.patch({"chain.py": '''
        from importpatch import Patch

        w = Patch("w")
        w.wrap("spk.m:Spec", lambda wrapped, i, a, k: wrapped(*a, **k), decorated=True)

        s = Patch("s")

        @s.subclass("spk.m:Spec")
        def make(Original):
            class Spec(Original):
                def size(self):
                    return 2 * super().size()
            return Spec

        r = Patch("r")

        @r.replace("spk.m:Spec")
        class Spec:
            def size(self):
                return 5
        '''})
    code = '''
        import json, sys
        import spk.m as m
        import importpatch, importpatch.events as ev
        importpatch.enable(sys.argv[1])
        print(json.dumps([m.Spec().size(), [e["detail"] for e in ev.events()
                                            if e["outcome"] == "failed"]]))
        '''
    size, failed = lab.json(code.replace("sys.argv[1]", '"s"'), enable="w")
    assert size == 16 and len(failed) == 1
    assert "the subclass of Spec by 's' goes inside the wrap of 'w'" in failed[0]
    size, failed = lab.json(code.replace("sys.argv[1]", '"r"'), enable="s")
    assert size == 32 and len(failed) == 1
    assert "Spec is already subclassed by 's'" in failed[0]
    assert "a replace goes beneath the wraps and subclasses" in failed[0]
