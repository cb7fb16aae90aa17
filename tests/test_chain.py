"""See the chain (issue 12, item 4): per target, the replace and wraps that make the installed
object, innermost first — in ``list``, ``check`` (text and ``--json``) and ``status`` (from the
events, which carry each operation's place) — and the order they run in is that chain."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import Venv, clean_env
from coreutil import Lab

TARGET = {
    "cpk/__init__.py": "",
    "cpk/m.py": '''
        CALLS = []


        def register(fn):
            return fn


        @register
        def step(x):
            CALLS.append("original")
            return x


        def plain(x):
            return x
        ''',
}


def wrap_patch(name: str, order: int, decorated: bool = False) -> str:
    return f'''
from importpatch import Patch
p = Patch({name!r})

@p.wrap("cpk.m:step", order={order}, decorated={decorated})
def w(wrapped, instance, args, kwargs):
    import cpk.m
    cpk.m.CALLS.append({name!r})
    return wrapped(*args, **kwargs)
'''


PATCHES = {
    "zeta.py": wrap_patch("zeta", -10),      # innermost wrap despite its name: lowest order
    "alpha.py": wrap_patch("alpha", 0),
    "beta.py": wrap_patch("beta", 0),        # same order: by patch name
    "outer.py": wrap_patch("outer", -99, decorated=True),  # after the original's decorators
    "base.py": '''
from importpatch import Patch
p = Patch("base")

@p.replace("cpk.m:step", original=True)
def step(original, x):
    import cpk.m
    cpk.m.CALLS.append("base")
    return original(x)
''',
}
ENABLE = "zeta,alpha,beta,outer,base"
CHAIN = [("replace", "base", 0, False), ("wrap", "zeta", -10, False),
         ("wrap", "alpha", 0, False), ("wrap", "beta", 0, False), ("wrap", "outer", -99, True)]


pytestmark = pytest.mark.lab(target=TARGET, patch=PATCHES)


def ip(lab: Lab, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return lab.ok([str(lab.venv.script("importpatch")), *args], enable=ENABLE, env=env)


def links(chain: list[dict]) -> list[tuple]:
    return [(lk["kind"], lk["patch"], lk["order"], lk["decorated"]) for lk in chain]


def test_the_calls_run_in_the_order_of_the_chain(lab: Lab) -> None:
    out = lab.json("import json, cpk.m as m; m.step(1); print(json.dumps(m.CALLS))", enable=ENABLE)
    assert out == ["outer", "beta", "alpha", "zeta", "base", "original"]  # outermost first


def test_check_shows_the_chain_in_text_and_json(lab: Lab) -> None:
    report = json.loads(ip(lab, "check", "--json").stdout)
    (chain,) = report["chains"]
    assert chain["target"] == "cpk.m:step" and chain["module"] == "cpk.m"
    assert links(chain["links"]) == CHAIN
    assert [lk["position"] for lk in chain["links"]] == [1, 2, 3, 4, 5]
    assert {lk["length"] for lk in chain["links"]} == {5}
    assert chain["links"][0]["original"] is True
    by_patch = {p["name"]: p["ops"][0] for p in report["patches"]}
    assert by_patch["zeta"]["order"] == -10 and by_patch["zeta"]["chain"]["position"] == 2
    assert by_patch["outer"]["decorated"] is True and by_patch["outer"]["chain"]["position"] == 5
    text = ip(lab, "check").stdout
    assert "\n".join([
        "chain of cpk.m:step (of the enabled and named patches), innermost first:",
        "    1. replace  base (original=True)",
        "    2. wrap     zeta (order -10)",
        "    3. wrap     alpha (order 0)",
        "    4. wrap     beta (order 0)",
        "       (the original's decorators)",
        "    5. wrap     outer (order -99)",
    ]) in text
    assert "position 2 of 5 in its target's chain (innermost first), order -10" in text


def test_a_patch_that_is_off_is_not_in_the_chain(lab: Lab) -> None:
    report = json.loads(lab.ok([str(lab.venv.script("importpatch")), "check", "--all", "--json"],
                               enable="alpha,zeta").stdout)
    (chain,) = report["chains"]
    assert links(chain["links"]) == [("wrap", "zeta", -10, False), ("wrap", "alpha", 0, False)]
    off = next(p for p in report["patches"] if p["name"] == "beta")
    assert off["ops"][0]["chain"] is None and off["ops"][0]["order"] == 0


def test_list_shows_orders_and_chains(lab: Lab) -> None:
    listed = json.loads(ip(lab, "list", "--json").stdout)
    (chain,) = listed["chains"]
    assert chain["target"] == "cpk.m:step" and links(chain["links"]) == CHAIN
    ops = {p["name"]: p["ops"] for p in listed["patches"]}
    assert ops["zeta"] == [{"kind": "wrap", "target": "cpk.m:step", "order": -10,
                            "decorated": False, "original": False}]
    text = ip(lab, "list").stdout
    assert "    target    cpk.m:step (wrap order -10)" in text
    assert "chain of cpk.m:step (of the enabled patches), innermost first:" in text


def test_status_shows_the_chain_from_the_events(lab: Lab) -> None:
    events = lab.root / "events"
    lab.ok("import cpk.m", enable=ENABLE, env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    status = subprocess.run([str(lab.venv.script("importpatch")), "status", "--json",
                             "--events-dir", str(events)], capture_output=True, text=True,
                            env=clean_env(), check=True)
    (proc,) = json.loads(status.stdout)["processes"]
    (chain,) = proc["chains"]
    assert chain["target"] == "cpk.m:step" and links(chain["links"]) == CHAIN
    assert {lk["how"] for lk in chain["links"]} == {"definition-site"}
    by_patch = {e["patch"]: e["chain"] for e in proc["events"]}
    assert by_patch["beta"] == {"position": 4, "length": 5, "patch": "beta", "kind": "wrap",
                                "order": 0, "decorated": False}
    text = subprocess.run([str(lab.venv.script("importpatch")), "status", "--events-dir",
                           str(events)], capture_output=True, text=True, env=clean_env(),
                          check=True).stdout
    flat = " ".join(text.split())  # long lines are wrapped at 100 columns
    assert ("chain cpk.m:step: replace base < wrap zeta (-10) < wrap alpha (0) < wrap beta (0)"
            " < wrap outer (-99)") in flat
    assert "applied zeta -> cpk.m:step (definition-site): wrap [2 of 5, order -10]" in text


def test_late_activation_events_carry_the_chain_too(lab: Lab) -> None:
    lab.patch({"late.py": '''
        from importpatch import Patch
        through = lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs)
        Patch("zeta-late").wrap("cpk.m:plain", through, order=-10)
        Patch("alpha-late").wrap("cpk.m:plain", through)
        '''})
    events = lab.root / "events"
    lab.ok('''
        import cpk.m, importpatch
        importpatch.enable("zeta-late", "alpha-late")
        ''', enable=None, env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    status = subprocess.run([str(lab.venv.script("importpatch")), "status", "--json",
                             "--events-dir", str(events)], capture_output=True, text=True,
                            env=clean_env(), check=True)
    (proc,) = json.loads(status.stdout)["processes"]
    (chain,) = proc["chains"]
    assert links(chain["links"]) == [("wrap", "zeta-late", -10, False),
                                     ("wrap", "alpha-late", 0, False)]
    assert {lk["how"] for lk in chain["links"]} == {"in-place"}


STATIC_TARGET = {
    "spk/__init__.py": "",
    "spk/core.py": '''
        class Engine:
            @staticmethod
            def run(x, y=1):
                return x + y
        ''',
}
STATIC_WRAPS = {f"w{i}.py": f'''
from importpatch import Patch
p = Patch("w{i}")

@p.wrap("spk.core:Engine.run", order={i})
def w(wrapped, instance, args, kwargs):
    return [{i}, instance, wrapped(*args, **kwargs)]
''' for i in range(3)}


def test_chained_wraps_of_a_staticmethod_all_run_as_functions(tmp_path: Path,
                                                             wheel_venv: Venv) -> None:
    """Three wraps of one staticmethod (vLLM's EngineCoreProc.run_engine_core in the ports): the
    wraps are made before ``@staticmethod`` applies, as methods, and every one of them, not only
    the outermost, is made again as a function (the inner ones called with a missing self)."""
    lab = Lab(wheel_venv, tmp_path).target(STATIC_TARGET).patch(STATIC_WRAPS)
    out = lab.json("import json, spk.core as c; "
                   "print(json.dumps([c.Engine.run(1), c.Engine().run(2, y=3)]))",
                   enable="w0,w1,w2")
    assert out == [[2, None, [1, None, [0, None, 2]]], [2, None, [1, None, [0, None, 5]]]]
