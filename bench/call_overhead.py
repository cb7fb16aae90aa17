"""Per-call cost of patched functions, in one child process of the wheel venv.

The target module ``callpkg.m`` has identical functions ``def fN(x, y=2): return x``; the
``.pth`` hook patches some at import: ``f_wrapped`` with ``Patch.wrap`` (a wrapper that calls
through, wrapt's convention), ``f_replaced`` with ``Patch.replace`` (an identical function),
``f_original`` with ``Patch.replace(original=True)`` (a replacement that calls the original it
receives), ``f_bind`` with a wrap that reads an argument by name through ``importpatch.bind``
before calling through, and ``f_inspect`` with a wrap that does the same with
``inspect.signature(wrapped).bind`` (the usual way; signature cached per wrapped object would be
faster, but then every wrap must cache it). Anchors in the same process: ``f_mp`` monkeypatched
after import with a plain closure wrapper, and ``f_wrapt`` wrapped with
``wrapt.wrap_function_wrapper`` (what wrapt's post-import hooks install, and what a wrap was
before wraps of Python functions became generated Python functions that ``torch.compile`` traces:
importpatch's ``TargetWrapper`` is that wrapt ``FunctionWrapper``). Methods the same way, called
on an instance: ``C.m_plain``, ``C.m_hand`` (the plugin-system blog post's hand-written method:
the original saved, ``def m(self, *args, **kwargs): return saved(self, *args, **kwargs)``),
``C.m_wrapped`` (``Patch.wrap``), ``C.m_wrapt`` (wrapt's ``FunctionWrapper``, the form
before). Timing: ``timeit`` of ``m.fN(1)`` / ``c.m_N(1)``, the variants interleaved for
``reps`` rounds; per round the best of 3 loops; medians of the rounds.

Goals: a wrap of a function or a method <= +1,500 instructions a call (issue 35; printed beside
the hand-written wrapper and wrapt: ``python call_overhead.py --instructions``), in wall clock
wrap overhead (wrapped - plain) <= 1 us per call; replace overhead (replaced - plain) 0,
the replacement *is* the module attribute (checked), so the difference is measurement noise;
``original=True`` about a closure (one Python call); ``bind`` well below ``inspect``'s bind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from _common import (
    BENCH_DIR,
    Figure,
    Row,
    clean_env,
    instructions,
    log,
    project_wheel,
    rounds,
    venv,
)

NAMES = ["f_plain", "f_wrapped", "f_replaced", "f_original", "f_bind", "f_inspect", "f_mp",
         "f_wrapt"]
METHODS = ["m_plain", "m_hand", "m_wrapped", "m_wrapt"]
TARGET = "".join(f"def {n}(x, y=2):\n    return x\n\n\n" for n in NAMES) + "class C:\n" + "".join(
    f"    def {n}(self, x, y=2):\n        return x\n\n" for n in METHODS)

PATCH = """\
import inspect

import importpatch
from importpatch import Patch

p = Patch("bench-calls")


@p.wrap("callpkg.m:f_wrapped")
def through(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


@p.replace("callpkg.m:f_replaced")
def f_replaced(x, y=2):
    return x


@p.replace("callpkg.m:f_original", original=True)
def f_original(original, x, y=2):
    return original(x, y)


@p.wrap("callpkg.m:C.m_wrapped")
def method_through(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


@p.wrap("callpkg.m:f_bind")
def by_name(wrapped, instance, args, kwargs):
    importpatch.bind(wrapped, args, kwargs).arguments["y"]
    return wrapped(*args, **kwargs)


@p.wrap("callpkg.m:f_inspect")
def by_inspect(wrapped, instance, args, kwargs):
    bound = inspect.signature(wrapped).bind(*args, **kwargs)
    bound.apply_defaults()
    bound.arguments["y"]
    return wrapped(*args, **kwargs)
"""

CHILD = f"NAMES = {NAMES!r}\nMETHODS = {METHODS!r}\n" + """\
import json, statistics, sys, timeit
import wrapt
import callpkg.m as m
# replace binds the replacement itself: the patch file's function, no wrapper around it
assert type(m.f_replaced) is type(m.f_plain), "replace must bind the replacement itself"
assert m.f_replaced.__code__.co_filename.endswith("calls.py"), m.f_replaced.__code__
# a wrap of a Python function is a generated Python function (torch.compile traces it)
assert type(m.f_wrapped) is type(m.f_plain) and m.f_wrapped.__wrapped__ is not None
orig = m.f_mp
def f_mp(*args, **kwargs):
    return orig(*args, **kwargs)
m.f_mp = f_mp
def through(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
wrapt.wrap_function_wrapper(m, "f_wrapt", through)
wrapt.wrap_function_wrapper(m, "C.m_wrapt", through)
saved = m.C.m_hand
def m_hand(self, *args, **kwargs):
    return saved(self, *args, **kwargs)
m.C.m_hand = m_hand
c = m.C()
names = NAMES + METHODS
timers = {n: timeit.Timer(f"m.{n}(1)" if n in NAMES else f"c.{n}(1)", globals={"m": m, "c": c})
          for n in names}
number = int(sys.argv[1])
res = {n: [] for n in names}
for r in range(int(sys.argv[2])):
    order = names[r % len(names):] + names[:r % len(names)]
    for n in order:
        res[n].append(min(timers[n].repeat(3, number)) / number)
print(json.dumps({n: statistics.median(v) for n, v in res.items()}))
"""


# Per-call cost in instructions (issues 30, 35): the same call n times in a fresh process, under
# valgrind's callgrind (deterministic); the difference of two such processes over n is the
# overhead of one call, the start-up of both processes being the same. Every variant is set up in
# every process (only the one called differs), so the differences are the calls alone: a module
# function ``m.f(1)`` against ``f_plain``, a method ``c.m(1)`` against ``m_plain``.
COUNT = """\
import sys
import wrapt
import callpkg.m as m
def through(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
wrapt.wrap_function_wrapper(m, "f_wrapt", through)
wrapt.wrap_function_wrapper(m, "C.m_wrapt", through)
saved_f = m.f_mp
def f_mp(*args, **kwargs):
    return saved_f(*args, **kwargs)
m.f_mp = f_mp
saved_m = m.C.m_hand
def m_hand(self, *args, **kwargs):
    return saved_m(self, *args, **kwargs)
m.C.m_hand = m_hand
c = m.C()
name = sys.argv[1]
call = f"m.{name}(1)" if name.startswith("f_") else f"c.{name}(1)"
exec(f"def loop(n):\\n    for _ in range(n):\\n        {call}\\n", globals())
loop(int(sys.argv[2]))
"""

# What the instruction rows compare, each against its plain call: (name, plain, what it is).
COUNTED = [
    ("f_mp", "f_plain", "hand-written function wrapper (saved original, *args/**kwargs)"),
    ("f_wrapped", "f_plain", "importpatch wrap of a module function"),
    ("f_wrapt", "f_plain", "wrapt FunctionWrapper of a module function"),
    ("m_hand", "m_plain", "hand-written method (the blog post's: saved original, *args)"),
    ("m_wrapped", "m_plain", "importpatch wrap of a method"),
    ("m_wrapt", "m_plain", "wrapt FunctionWrapper of a method"),
]
WRAP_GOAL = 1500  # issue 35: a wrap of a function or a method, instructions a call


def per_call_instructions(py: str, env: dict[str, str], calls: int) -> dict[str, float] | None:
    """Instructions a call of each counted variant costs over its plain call; None without
    valgrind. Printed as one table: the plain calls, then each variant's delta and its ratio to
    the hand-written wrapper of the same kind."""
    from concurrent.futures import ThreadPoolExecutor

    def count(name: str, n: int) -> int | None:
        return instructions([py, "-c", COUNT, name, str(n)], env)

    names = ["f_plain", "m_plain", *(n for n, _, _ in COUNTED), "f_replaced"]
    # First alone, not counted: a process that finds the cache cold writes it (millions more).
    count("f_plain", 0)
    empty = count("f_plain", 0)
    with ThreadPoolExecutor(3) as pool:  # each a deterministic count: load does not move it
        total = dict(zip(names, pool.map(lambda name: count(name, calls), names), strict=True))
    if empty is None or not all(total.values()):
        return None
    got = {n: v for n, v in total.items() if v is not None}
    over = {n: (got[n] - got[plain]) / calls for n, plain, _ in COUNTED}
    over["f_replaced"] = (got["f_replaced"] - got["f_plain"]) / calls
    log(f"per call, instructions (callgrind, PYTHONHASHSEED=0, {calls:,} calls a process):")
    for plain in ("f_plain", "m_plain"):
        log(f"  {plain:10} {(got[plain] - empty) / calls:8,.0f} (the call and its loop)")
    for n, plain, what in COUNTED:
        hand = "f_mp" if plain == "f_plain" else "m_hand"
        log(f"  {n:10} {over[n]:+8,.0f}  {over[n] / over[hand]:5.2f}x the hand-written  {what}")
    return over


def setup() -> tuple[str, dict[str, str]]:
    """The wheel venv's interpreter and the environment that patches ``callpkg.m`` at import."""
    py = venv("startup-wheel", "packaging>=23", "wrapt>=1.16", wheel=project_wheel()).python
    work = BENCH_DIR / "calls"
    shutil.rmtree(work, ignore_errors=True)
    (work / "pkg" / "callpkg").mkdir(parents=True)
    (work / "pkg" / "callpkg" / "__init__.py").write_text("")
    (work / "pkg" / "callpkg" / "m.py").write_text(TARGET)
    (work / "patches").mkdir()
    (work / "patches" / "calls.py").write_text(PATCH)
    env = clean_env({
        "PYTHONPATH": str(work / "pkg"), "IMPORTPATCH_PATH": str(work / "patches"),
        "IMPORTPATCH_ENABLE": "bench-calls", "IMPORTPATCH_CACHE_DIR": str(work / "cache"),
    })
    return str(py), env


def run(scale: float = 1.0) -> list[Row]:
    py, env = setup()
    n = rounds("calls", 30, 5, scale)
    log(f"call overhead: {n} interleaved rounds of {len(NAMES)} variants x 3 x 200k calls")
    out = subprocess.run([py, "-c", CHILD, "200000", str(n)], env=env,
                         capture_output=True, text=True, check=True, timeout=1200)
    t = json.loads(out.stdout)
    base = t["f_plain"]

    def ns(k: str) -> str:
        return f"{t[k] * 1e9:.1f} ns"

    def over(k: str) -> float:
        return t[k] - base

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows = [
        Row(f"wrap patch: overhead per call (wrapped - plain call; wall clock at load {load:.1f})",
            f"plain {ns('f_plain')}", f"wrapped {ns('f_wrapped')}",
            f"+{over('f_wrapped') * 1e9:.0f} ns", "report", None),
        Row(f"replace patch: overhead per call (the attribute is the replacement; wall clock at "
            f"load {load:.1f})",
            f"plain {ns('f_plain')}", f"replaced {ns('f_replaced')}",
            f"{over('f_replaced') * 1e9:+.1f} ns (noise)", "report", None),
        Row("replace(original=True): overhead per call (the stand-in calls the replacement)",
            f"plain {ns('f_plain')}", f"original=True {ns('f_original')}",
            f"+{over('f_original') * 1e9:.0f} ns", "about a closure", None),
        Row("importpatch.bind in a wrap: cost per call over the plain wrap",
            f"wrapped {ns('f_wrapped')}", f"bind {ns('f_bind')}",
            f"+{(t['f_bind'] - t['f_wrapped']) * 1e9:.0f} ns "
            f"(inspect: +{(t['f_inspect'] - t['f_wrapped']) * 1e9:.0f} ns)",
            "< inspect's", t["f_bind"] < t["f_inspect"]),
        Row("wrap patch vs the wrapt form before (function): wrapped - wrapt",
            f"wrapt {ns('f_wrapt')}", f"wrapped {ns('f_wrapped')}",
            f"{(t['f_wrapped'] - t['f_wrapt']) * 1e9:+.0f} ns", "report", None),
        Row("wrap patch of a method: overhead per call (c.m(1), wrapped - plain)",
            f"plain {ns('m_plain')}", f"wrapped {ns('m_wrapped')}",
            f"+{(t['m_wrapped'] - t['m_plain']) * 1e9:.0f} ns "
            f"(wrapt form before: +{(t['m_wrapt'] - t['m_plain']) * 1e9:.0f} ns; hand-written "
            f"+{(t['m_hand'] - t['m_plain']) * 1e9:.0f} ns)", "<= 1 us",
            t["m_wrapped"] - t["m_plain"] <= 1e-6),
        Row("anchor: monkeypatch with a closure wrapper", f"plain {ns('f_plain')}",
            f"closure {ns('f_mp')}", f"+{over('f_mp') * 1e9:.0f} ns", "anchor", None),
        Row("anchor: wrapt.wrap_function_wrapper (wrapt post-import hook style)",
            f"plain {ns('f_plain')}", f"wrapt {ns('f_wrapt')}",
            f"+{over('f_wrapt') * 1e9:.0f} ns", "anchor", None),
    ]
    calls = max(50_000, int(300_000 * min(scale, 1.0)))
    cost = per_call_instructions(py, env, calls)
    if cost is not None:
        wrap, method, repl = cost["f_wrapped"], cost["m_wrapped"], cost["f_replaced"]
        wrapt_form = cost["f_wrapt"]
        rows[0:0] = [
            Row("wrap patch: overhead per call, instructions (valgrind callgrind, "
                f"{calls:,} calls against as many plain ones)", f"wrapt form +{wrapt_form:,.0f}",
                f"wrapped +{wrap:,.0f}", f"+{wrap:,.0f} instructions (hand-written "
                f"+{cost['f_mp']:,.0f})", f"<= +{WRAP_GOAL:,} (issue 35)", wrap <= WRAP_GOAL,
                figures=[Figure("wrap patch, overhead per call (instructions)", "absolute",
                                round(wrap), WRAP_GOAL, unit="instr")]),
            Row("wrap patch of a method: overhead per call, instructions (c.m(1))",
                f"wrapt form +{cost['m_wrapt']:,.0f}", f"wrapped +{method:,.0f}",
                f"+{method:,.0f} instructions (the blog's hand-written method "
                f"+{cost['m_hand']:,.0f})", f"<= +{WRAP_GOAL:,} (issue 35)",
                method <= WRAP_GOAL,
                figures=[Figure("wrap patch of a method, overhead per call (instructions)",
                                "absolute", round(method), WRAP_GOAL, unit="instr")]),
            Row("replace patch: overhead per call, instructions (the attribute is the "
                "replacement)", f"{calls:,} plain calls", f"replaced {repl:+,.1f} a call",
                f"{repl:+,.1f} instructions (two processes differ by up to ~5 a call: measured "
                "+3.0, -0.0, -4.5 in three runs)", "0", abs(repl) <= 5,
                figures=[Figure("replace patch, overhead per call (instructions)", "absolute",
                                round(repl, 1), 0, unit="instr", noise=5)]),
        ]
    return rows


if __name__ == "__main__":
    import sys

    from _common import table

    if sys.argv[1:] == ["--instructions"]:  # the per-call instruction table alone (stderr)
        per_call_instructions(*setup(), calls=int(os.environ.get("CALLS", "300000")))
    else:
        print(table(run()))
