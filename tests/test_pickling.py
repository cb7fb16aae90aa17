"""What importpatch installs at a target pickles by reference to the target (issue 12, item 1).

vLLM starts EngineCore and its Workers with ``Process(target=EngineCoreProc.run_engine_core)``:
spawn pickles the target. A wrap used to fail in the parent (``object proxy must define
__reduce_ex__()``) and a replacement pickled by the name of its patch file, a module only the
parent has (``No module named 'importpatch._declared'`` in the child). Here every kind of
installed object — wrapped and replaced functions, methods, staticmethods, classmethods, property
getters, nested classes, added functions and methods, a replacement class and its instances,
instances of a wrapped class, a replacement that receives the original — goes to real child
processes (spawn and forkserver ``Process`` targets and arguments, a spawn
``ProcessPoolExecutor``) with pickle and with cloudpickle, and the child must resolve *its own*
patched object: the very object at the target in the child (identity), running the patched code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Venv
from coreutil import Lab

TARGET = {
    "pk/__init__.py": "",
    "pk/m.py": '''
        import os


        def f_wrapped(x):
            return f"orig:{x}"


        def f_replaced(x):
            return f"orig:{x}"


        def f_original(x):
            return f"orig:{x}"


        class C:
            def meth_wrapped(self, x):
                return f"orig:{x}"

            def meth_replaced(self, x):
                return f"orig:{x}"

            @staticmethod
            def st_wrapped(x):
                return f"orig:{x}"

            @staticmethod
            def st_replaced(x):
                return f"orig:{x}"

            @classmethod
            def cm_wrapped(cls, x):
                return f"orig:{x}"

            @classmethod
            def cm_replaced(cls, x):
                return f"orig:{x}"

            @property
            def prop_wrapped(self):
                return "orig:prop"

            @property
            def prop_replaced(self):
                return "orig:prop"


        class Outer:
            class Inner:
                def deep_wrapped(self, x):
                    return f"orig:{x}"

                def deep_replaced(self, x):
                    return f"orig:{x}"


        class Thing:
            def value(self):
                return "orig:thing"


        class Boxed:
            def __init__(self, v):
                self.v = v

            def value(self):
                return f"boxed:{self.v}"


        class Engine:
            @staticmethod
            def run(queue, objects):
                """The process target, as vLLM's EngineCoreProc.run_engine_core."""
                import pickle
                if isinstance(objects, bytes):
                    objects = pickle.loads(objects)
                results = []
                for label, obj, args in objects:
                    here = None
                    if label:  # what the child has at the target, looked up by name
                        here = __import__("pk.m", fromlist=["m"])
                        for part in label.split("."):
                            here = getattr(here, part)
                    value = obj(*args) if args is not None else obj.value()
                    if not isinstance(value, str):  # an instance: its class's names
                        value = f"instance of {type(value).__module__}:{type(value).__qualname__}"
                    # Class.method of a wrapped method: wrapt binds anew at each access; the
                    # same object is the same installed wrapper.
                    parent = getattr(here, "_self_parent", None)
                    same = here is obj or (parent is not None and parent is obj._self_parent)
                    results.append([label, value, same if label else None])
                out = {"pid": os.getpid(), "results": results, "via": []}
                if queue is not None:
                    queue.put(out)
                return out
        ''',
}

PATCH = {"pk_patch.py": '''
    import os
    from importpatch import Patch

    p = Patch("pk")

    def through(wrapped, instance, args, kwargs):
        return "wrapped(" + wrapped(*args, **kwargs) + ")"

    for target in ("f_wrapped", "C.meth_wrapped", "C.st_wrapped", "C.cm_wrapped",
                   "C.prop_wrapped", "Outer.Inner.deep_wrapped"):
        p.wrap(f"pk.m:{target}", through)

    @p.replace("pk.m:f_replaced")
    def f_replaced(x):
        return f"patched:{x}"

    @p.replace("pk.m:f_original", original=True)
    def f_original(original, x):
        return "patched+" + original(x)

    @p.replace("pk.m:C.meth_replaced")
    def meth_replaced(self, x):
        return f"patched:{x}"

    @p.replace("pk.m:C.st_replaced")
    def st_replaced(x):
        return f"patched:{x}"

    @p.replace("pk.m:C.cm_replaced")
    def cm_replaced(cls, x):
        return f"patched:{cls.__name__}:{x}"

    @p.replace("pk.m:C.prop_replaced")
    def prop_replaced(self):
        return "patched:prop"

    @p.replace("pk.m:Outer.Inner.deep_replaced")
    def deep_replaced(self, x):
        return f"patched:{x}"

    # A wrapped class: its instances name the class by reference, not by a name that finds the
    # wrapper ("not the same object as pk.m.Boxed").
    @p.wrap("pk.m:Boxed")
    def construct(wrapped, instance, args, kwargs):
        obj = wrapped(*args, **kwargs)
        obj.v = f"wrapped-{obj.v}"
        return obj

    @p.add("pk.m:added")
    def added(x):
        return f"patched-added:{x}"

    @p.add("pk.m:C.added_method")
    def added_method(self, x):
        return f"patched-added-method:{x}"

    @p.replace("pk.m:Thing")
    class Thing:
        def value(self):
            return "patched:thing"

    # The process target itself: a replacement that receives the original, and a wrap over it.
    @p.replace("pk.m:Engine.run", original=True)
    def run(original, queue, objects):
        out = original(None, objects)
        out["via"].append("replaced")
        if queue is not None:
            queue.put(out)
        return out

    @p.wrap("pk.m:Engine.run")
    def run_wrapper(wrapped, instance, args, kwargs):
        queue, objects = args
        out = wrapped(None, objects)
        out["via"].append("wrapped")
        if queue is not None:
            queue.put(out)
        return out
    '''}

# What the parent sends: (label to look the object up by in the child, object, call args). Made
# under ``if __name__ == "__main__"`` only: a spawned child runs the parent's main module again
# (as ``__mp_main__``), and must meet ``pk.m`` first through what it unpickles, as vLLM's
# EngineCore meets ``vllm.v1.engine.core``.
OBJECTS = '''
def objects():
    global m
    import pk.m as m
    c = m.C()
    return [
        ("f_wrapped", m.f_wrapped, (1,)),
        ("f_replaced", m.f_replaced, (1,)),
        ("f_original", m.f_original, (1,)),
        ("C.meth_wrapped", m.C.meth_wrapped, (c, 1)),
        ("C.meth_replaced", m.C.meth_replaced, (c, 1)),
        (None, c.meth_wrapped, (1,)),
        (None, c.meth_replaced, (1,)),
        ("C.st_wrapped", m.C.st_wrapped, (1,)),
        ("C.st_replaced", m.C.st_replaced, (1,)),
        (None, m.C.cm_wrapped, (1,)),
        (None, m.C.cm_replaced, (1,)),
        ("C.prop_wrapped.fget", m.C.prop_wrapped.fget, (c,)),
        ("C.prop_replaced.fget", m.C.prop_replaced.fget, (c,)),
        ("Outer.Inner.deep_wrapped", m.Outer.Inner.deep_wrapped, (m.Outer.Inner(), 1)),
        ("Outer.Inner.deep_replaced", m.Outer.Inner.deep_replaced, (m.Outer.Inner(), 1)),
        ("added", m.added, (1,)),
        ("C.added_method", m.C.added_method, (c, 1)),
        ("Thing", m.Thing, ()),
        (None, m.Thing(), None),
        (None, m.Boxed(1), None),
    ]
'''

EXPECTED = [
    ["f_wrapped", "wrapped(orig:1)", True],
    ["f_replaced", "patched:1", True],
    ["f_original", "patched+orig:1", True],
    ["C.meth_wrapped", "wrapped(orig:1)", True],
    ["C.meth_replaced", "patched:1", True],
    [None, "wrapped(orig:1)", None],
    [None, "patched:1", None],
    ["C.st_wrapped", "wrapped(orig:1)", True],
    ["C.st_replaced", "patched:1", True],
    [None, "wrapped(orig:1)", None],
    [None, "patched:C:1", None],
    ["C.prop_wrapped.fget", "wrapped(orig:prop)", True],
    ["C.prop_replaced.fget", "patched:prop", True],
    ["Outer.Inner.deep_wrapped", "wrapped(orig:1)", True],
    ["Outer.Inner.deep_replaced", "patched:1", True],
    ["added", "patched-added:1", True],
    ["C.added_method", "patched-added-method:1", True],
    ["Thing", "instance of pk.m:Thing", True],
    [None, "patched:thing", None],
    [None, "boxed:wrapped-1", None],
]


@pytest.fixture(scope="module")
def pickle_venv(venv_factory: Callable[..., Venv], built_wheel: Path) -> Venv:
    """The wheel and cloudpickle (what Ray and vLLM's collective_rpc use)."""
    return venv_factory(str(built_wheel), "cloudpickle", name="pickle-venv")


pytestmark = pytest.mark.lab(target=TARGET, patch=PATCH, venv="pickle_venv")


def check_child(out: dict, parent: int) -> None:
    assert out["pid"] != parent
    assert out["results"] == EXPECTED
    assert out["via"] == ["replaced", "wrapped"]  # the target ran patched in the child


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_process_target_and_arguments_pickle_by_reference(lab: Lab, method: str) -> None:
    """``Process(target=<wrapped, replaced staticmethod>, args=(every kind of patched object))``
    with spawn / forkserver: pickled in the parent, resolved by name in the child."""
    (lab.root / "drive.py").write_text(OBJECTS + f'''
import json, multiprocessing as mp, os, pickle
if __name__ == "__main__":
    OBJECTS = objects()
    ctx = mp.get_context({method!r})
    queue = ctx.Queue()
    proc = ctx.Process(target=m.Engine.run, args=(queue, OBJECTS))
    proc.start()
    out = queue.get(timeout=120)
    proc.join(60)
    wire = pickle.dumps(OBJECTS)
    print(json.dumps({{"parent": os.getpid(), "out": out, "exitcode": proc.exitcode,
                      "declared_in_wire": b"importpatch._declared" in wire
                      or b".importpatch." in wire}}))
''')
    proc = lab.ok(["drive.py"], enable="pk", timeout=240)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["exitcode"] == 0
    check_child(res["out"], res["parent"])
    assert not res["declared_in_wire"]  # nothing names the patch file's module


def test_process_pool_executor_pickles_by_reference(lab: Lab) -> None:
    (lab.root / "drive.py").write_text(OBJECTS + '''
import concurrent.futures as cf, json, multiprocessing as mp, os
if __name__ == "__main__":
    OBJECTS = objects()
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        out = pool.submit(m.Engine.run, None, OBJECTS).result(timeout=120)
    print(json.dumps({"parent": os.getpid(), "out": out}))
''')
    res = json.loads(lab.ok(["drive.py"], enable="pk", timeout=240).stdout.strip().splitlines()[-1])
    check_child(res["out"], res["parent"])


def test_cloudpickle_pickles_by_reference(lab: Lab) -> None:
    """cloudpickle sends a function by reference only when looking it up by name finds the very
    object (else by value: the original's code, unpatched, in the receiver)."""
    (lab.root / "drive.py").write_text(OBJECTS + '''
import cloudpickle, json, multiprocessing as mp, os
if __name__ == "__main__":
    OBJECTS = objects()
    blob = cloudpickle.dumps(OBJECTS)
    by_value = [label for label, obj, _ in OBJECTS if label
                and b"co_code" in cloudpickle.dumps(obj)]  # cloudpickle's by-value marker
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=m.Engine.run, args=(queue, blob))
    proc.start()
    out = queue.get(timeout=120)
    proc.join(60)
    declared = [i for i, (_, obj, _) in enumerate(OBJECTS)
                if b"importpatch._declared" in cloudpickle.dumps(obj)
                or b".importpatch." in cloudpickle.dumps(obj)]
    print(json.dumps({"parent": os.getpid(), "out": out, "by_value": by_value,
                      "declared": declared}))
''')
    res = json.loads(lab.ok(["drive.py"], enable="pk", timeout=240).stdout.strip().splitlines()[-1])
    check_child(res["out"], res["parent"])
    assert res["by_value"] == []
    # cloudpickle sends a classmethod's function by value, also unpatched (``getattr(C, name)``
    # is a bound method, never the function): only the replaced classmethod names the patch
    # module, as the ``__name__`` of the globals its code came with. It ran patched above.
    assert [EXPECTED[i][1] for i in res["declared"]] == ["patched:C:1"]


def test_installed_objects_carry_the_targets_names_and_their_own_code(lab: Lab) -> None:
    out = lab.json('''
        import inspect, json, pickle
        import pk.m as m
        rows = {}
        for label, obj in [("f_replaced", m.f_replaced), ("C.meth_replaced", m.C.meth_replaced),
                           ("C.prop_replaced", m.C.prop_replaced.fget), ("added", m.added),
                           ("Thing", m.Thing), ("Thing.value", m.Thing.value),
                           ("f_original", m.f_original), ("f_wrapped", m.f_wrapped)]:
            rows[label] = [obj.__module__, obj.__qualname__, obj.__name__,
                           getattr(obj, "__code__", None) and obj.__code__.co_filename]
        rows["getsource"] = inspect.getsource(m.f_replaced).splitlines()[-1].strip()
        rows["signature"] = str(inspect.signature(m.f_original))
        print(json.dumps(rows))
        ''', enable="pk")
    patch_file = str(lab.patches / "pk_patch.py")
    assert out["f_replaced"] == ["pk.m", "f_replaced", "f_replaced", patch_file]
    assert out["C.meth_replaced"] == ["pk.m", "C.meth_replaced", "meth_replaced", patch_file]
    assert out["C.prop_replaced"] == ["pk.m", "C.prop_replaced.fget", "prop_replaced", patch_file]
    assert out["added"] == ["pk.m", "added", "added", patch_file]
    assert out["Thing"][:3] == ["pk.m", "Thing", "Thing"]
    assert out["Thing.value"] == ["pk.m", "Thing.value", "value", patch_file]
    # the stand-in of original=True is importpatch's own function, named as the target
    assert out["f_original"][:3] == ["pk.m", "f_original", "f_original"]
    assert out["signature"] == "(x)"  # the original's: what callers pass
    # a wrap keeps the original's names (wrapt proxies them); tracebacks and getsource still
    # show the patch's code
    assert out["f_wrapped"][:3] == ["pk.m", "f_wrapped", "f_wrapped"]
    assert out["getsource"] == 'return f"patched:{x}"'


def test_patches_made_in_application_code_keep_their_names(lab: Lab) -> None:
    """A child process may not run the application's ``Patch(...)`` code, and a function of an
    importable module resolves there by its own name: those are not renamed."""
    out = lab.json('''
        import json, importpatch, pickle
        from importpatch import Patch

        def mine(x):
            return "api"

        Patch("api-patch").replace("pk.m:f_replaced", mine)
        importpatch.enable()
        import pk.m as m
        print(json.dumps([m.f_replaced is mine, mine.__module__, mine.__qualname__]))
        ''', enable=None)
    assert out == [True, "__main__", "mine"]


def test_a_wrapped_method_binds_as_wrapt_binds(lab: Lab) -> None:
    """A wrap of a method or a property's getter is a Python function that its name finds
    (``C.meth``, ``C.prop.fget``: cloudpickle sends it by reference, see above); calls through
    the class pass the instance on."""
    out = lab.json('''
        import inspect, json, types
        import pk.m as m

        class Sub(m.C):
            pass

        c = m.C()
        print(json.dumps([m.C.meth_wrapped(c, 2), Sub.meth_wrapped(Sub(), 3), c.meth_wrapped(4),
                          m.C.__dict__["meth_wrapped"](c, 5),
                          isinstance(c.meth_wrapped, types.MethodType),
                          inspect.isfunction(m.f_wrapped), inspect.isfunction(m.C.st_wrapped),
                          inspect.isfunction(m.C.meth_wrapped),
                          inspect.isfunction(m.C.prop_wrapped.fget)]))
        ''', enable="pk")
    assert out == ["wrapped(orig:2)", "wrapped(orig:3)", "wrapped(orig:4)", "wrapped(orig:5)",
                   True, True, True, True, True]


def test_copy_and_deepcopy_treat_wrapped_objects_as_python_treats_functions(lab: Lab) -> None:
    """``copy`` keeps a function or class itself; a structure holding one (a config, vLLM's
    ``SamplingParams.clone``) is deep-copied with it. wrapt's proxies raise there instead
    (``object proxy must define __deepcopy__()``): a wrap must not change that."""
    out = lab.json('''
        import copy, json
        import pk.m as m
        c = m.C()
        atomic = {"f": m.f_wrapped, "C.meth": m.C.meth_wrapped, "st": m.C.st_wrapped,
                  "cm.fget": m.C.prop_wrapped.fget, "Boxed": m.Boxed,
                  "deep": m.Outer.Inner.deep_wrapped}
        rows = {}
        for label, obj in atomic.items():
            rows[label] = [copy.copy(obj) is obj, copy.deepcopy({"k": obj})["k"] is obj]
        bound = c.meth_wrapped
        shallow, deep = copy.copy(bound), copy.deepcopy([c, bound])
        rows["bound"] = [shallow.__self__ is c, shallow(1), deep[1].__self__ is deep[0],
                         deep[0] is not c, deep[1](2)]
        cm = copy.deepcopy(m.C.cm_wrapped)
        rows["classmethod"] = [cm.__self__ is m.C, cm(3)]
        print(json.dumps(rows))
        ''', enable="pk")
    assert out.pop("bound") == [True, "wrapped(orig:1)", True, True, "wrapped(orig:2)"]
    assert out.pop("classmethod") == [True, "wrapped(orig:3)"]
    assert out == {label: [True, True] for label in out}
    assert sorted(out) == ["Boxed", "C.meth", "cm.fget", "deep", "f", "st"]
