"""The original at hand and arguments by name (issue 12, item 3): ``replace(..., original=True)``
passes the original to the replacement; ``importpatch.bind(wrapped, args, kwargs)`` gives a wrap
the call's arguments by parameter name. Both on functions, methods, staticmethods, classmethods,
properties and decorated definitions, in real child processes."""

from __future__ import annotations

import pytest
from conftest import Venv
from coreutil import Lab

TARGET = {
    "opkg/__init__.py": "",
    "opkg/m.py": '''
        import functools

        REGISTRY = []


        def register(fn):
            REGISTRY.append(fn)
            return fn


        def resolve(kv_cache_spec, block_size=16, *, dtype="f32"):
            return ["orig", kv_cache_spec, block_size, dtype]


        @register
        def registered(x):
            return ["orig", x]


        class Engine:
            def step(self, batch, /, budget=4, *extra, flag=False, **options):
                return ["orig", batch, budget, list(extra), flag, options]

            @staticmethod
            def make(n):
                return ["orig", n]

            @classmethod
            def build(cls, n):
                return ["orig", cls.__name__, n]

            @property
            def size(self):
                return 3

            @functools.lru_cache
            def cached(self, x):
                return ["orig", x]

            def tune(self, kv_cache_spec, block_size=16):
                return ["orig", kv_cache_spec, block_size]
        ''',
}

PATCH = {"ob.py": '''
    import importpatch
    from importpatch import Patch

    p = Patch("ob")

    @p.replace("opkg.m:resolve", original=True)
    def resolve(original, kv_cache_spec, *args, **kwargs):
        return ["patched", *original(kv_cache_spec, *args, **kwargs)]

    @p.replace("opkg.m:registered", original=True)
    def registered(original, x):
        return ["patched", *original(x)]

    @p.replace("opkg.m:Engine.step", original=True)
    def step(original, self, *args, **kwargs):
        return ["patched", type(self).__name__, *original(self, *args, **kwargs)]

    @p.replace("opkg.m:Engine.make", original=True)
    def make(original, n):
        return ["patched", *original(n)]

    @p.replace("opkg.m:Engine.build", original=True)
    def build(original, cls, n):
        return ["patched", *original(cls, n)]

    @p.replace("opkg.m:Engine.size", original=True)
    def size(original, self):
        return original(self) * 10

    @p.replace("opkg.m:Engine.cached", original=True)
    def cached(original, self, x):
        return ["patched", *original(self, x)]

    seen = p.add("opkg.m:SEEN", [])  # read back by the test

    # Arguments by name: the wrap finds kv_cache_spec however the caller passed it, and changes
    # block_size by name before calling on.
    @p.wrap("opkg.m:Engine.tune")
    def tune(wrapped, instance, args, kwargs):
        bound = importpatch.bind(wrapped, args, kwargs)
        seen.append(dict(bound.arguments))
        bound.arguments["block_size"] *= 2
        return wrapped(*bound.args, **bound.kwargs)
    '''}


pytestmark = pytest.mark.lab(target=TARGET, patch=PATCH)


def test_a_replacement_receives_the_original_on_every_kind_of_target(lab: Lab) -> None:
    out = lab.json('''
        import json
        import opkg.m as m
        e = m.Engine()
        print(json.dumps({
            "function": m.resolve(1, dtype="f16"),
            "registered": [m.REGISTRY[0] is m.registered, m.REGISTRY[0](2)],
            "method": e.step("b", 5, 6, flag=True, k=1),
            "through the class": m.Engine.step(e, "c"),
            "staticmethod": [m.Engine.make(3), e.make(4)],
            "classmethod": [m.Engine.build(5), e.build(6)],
            "property": e.size,
            "lru_cache": [e.cached(7), m.Engine.cached.cache_info().hits, e.cached(7),
                          m.Engine.cached.cache_info().hits],
        }))
        ''', enable="ob")
    assert out == {
        "function": ["patched", "orig", 1, 16, "f16"],
        # decorated=False: the registry decorator saw the replacement, as at any definition site
        "registered": [True, ["patched", "orig", 2]],
        "method": ["patched", "Engine", "orig", "b", 5, [6], True, {"k": 1}],
        "through the class": ["patched", "Engine", "orig", "c", 4, [], False, {}],
        "staticmethod": [["patched", "orig", 3], ["patched", "orig", 4]],
        "classmethod": [["patched", "orig", "Engine", 5], ["patched", "orig", "Engine", 6]],
        "property": 30,
        "lru_cache": [["patched", "orig", 7], 0, ["patched", "orig", 7], 1],
    }


def test_a_replacement_with_the_original_applied_late(lab: Lab) -> None:
    """Late activation: the original's decorators are rebuilt around the stand-in (a registry
    decorator refuses the whole patch late, as for any replacement: not in this one)."""
    lab.patch({"late.py": '''
        from importpatch import Patch

        p = Patch("ob-late")
        p.replace("opkg.m:resolve", lambda original, *a, **k: ["patched", *original(*a, **k)],
                  original=True)
        p.replace("opkg.m:Engine.make", lambda original, n: ["patched", *original(n)],
                  original=True)
        p.replace("opkg.m:Engine.size", lambda original, self: original(self) * 10,
                  original=True)
        p.replace("opkg.m:Engine.cached", lambda original, s, x: ["patched", *original(s, x)],
                  original=True)
        '''})
    out = lab.json('''
        import json
        import opkg.m as m
        import importpatch
        importpatch.enable("ob-late")
        e = m.Engine()
        print(json.dumps([m.resolve(1), m.Engine.make(2), e.size, e.cached(3)]))
        ''', enable=None)
    assert out == [["patched", "orig", 1, 16, "f32"], ["patched", "orig", 2], 30,
                   ["patched", "orig", 3]]


def test_bind_gives_the_arguments_by_name_and_rebuilds_the_call(lab: Lab) -> None:
    out = lab.json('''
        import json
        import opkg.m as m
        e = m.Engine()
        results = [e.tune(1), e.tune(kv_cache_spec=2, block_size=3), m.Engine.tune(e, 4, 5)]
        print(json.dumps([results, m.SEEN]))
        ''', enable="ob")
    results, seen = out
    assert seen == [{"kv_cache_spec": 1, "block_size": 16},
                    {"kv_cache_spec": 2, "block_size": 3},
                    {"kv_cache_spec": 4, "block_size": 5}]
    assert results == [["orig", 1, 32], ["orig", 2, 6], ["orig", 4, 10]]


def test_bind_on_every_kind_of_signature(wheel_venv: Venv) -> None:
    proc = wheel_venv.run('''
import functools, json
from importpatch import bind

def f(a, b=2, /, c=3, *rest, d, e=5, **more):
    pass

class K:
    def m(self, x, y=1):
        pass

def error(call):
    try:
        call()
    except TypeError as exc:
        return str(exc)

make = lambda n: (lambda v=n: v)   # one code object, different defaults
rows = [
    bind(f, (1,), {"d": 4}).arguments,
    bind(f, (1, 9, 8, 7, 6), {"d": 4, "z": 0}).arguments,
    bind(K().m, (1,), {}).arguments,
    bind(make(1), (), {}).arguments, bind(make(2), (), {}).arguments,
    bind(functools.partial(f, 1), (), {"d": 0}).arguments,   # not a function: via inspect
    bind(len, ([1, 2],), {}).arguments,
]
b = bind(f, (1, 9, 8, 7, 6), {"d": 4, "z": 0})
rows.append([b.args, b.kwargs])
rows.append([error(lambda: bind(f, (), {})), error(lambda: f())])
rows.append([error(lambda: bind(K().m, (), {"y": 2})), error(lambda: K().m(y=2))])
rows.append([error(lambda: bind(f, (1,), {"d": 1, "a": 2})), error(lambda: f(1, d=1, a=2))])
print(json.dumps(rows))
''')
    assert proc.returncode == 0, proc.stderr
    import json
    rows = json.loads(proc.stdout)
    assert rows[0] == {"a": 1, "b": 2, "c": 3, "rest": [], "d": 4, "e": 5, "more": {}}
    assert rows[1] == {"a": 1, "b": 9, "c": 8, "rest": [7, 6], "d": 4, "e": 5, "more": {"z": 0}}
    assert rows[2] == {"x": 1, "y": 1}  # bound method: no self, as inspect.signature
    assert rows[3] == {"v": 1} and rows[4] == {"v": 2}
    assert rows[5] == {"b": 2, "c": 3, "rest": [], "d": 0, "e": 5, "more": {}}
    assert rows[6] == {"obj": [1, 2]}
    assert rows[7] == [[1, 9, 8, 7, 6], {"d": 4, "e": 5, "z": 0}]
    for ours, python in rows[8:]:  # a call that does not fit: Python's own message
        assert ours == python, (ours, python)
