"""Importing a large patched module: a generated 13,000-line module (600 functions, 60 classes).

Every sample is a fresh process of the wheel venv that times ``import bigpkg.big`` (and, for the
anchors, the monkeypatch) with ``time.perf_counter`` around it. Before that, the process imports
a small module the same way (patched where the variant patches), so the one-time cost of loading
the loader's own modules is left out: the figure is what each further patched module costs.
The "first patched import" row includes that one-time cost.

Variants (one replace patch on ``func_5`` unless stated):
- plain: the unpatched module from its ``.pyc`` (nothing enabled)       <- baseline
- warm: patched, bytecode cache warm                                    goal <= 1.3 x plain
- cold: patched, ``IMPORTPATCH_NO_CACHE=1`` (read, patch, compile)     report
- diff warm: a one-line source diff instead (the patched text is also published) report
- wrapt hook: ``wrapt.register_post_import_hook`` replacing ``func_5`` after import   anchor
- monkeypatch: ``import`` then ``setattr``                              anchor
"""

from __future__ import annotations

import difflib
import shutil
import subprocess
from pathlib import Path

from _common import (
    BENCH_DIR, Row, clean_env, interleave, log, measure, median, ms, project_wheel, venv,
)

LINES_PER_FUNC = 9


def generate(n_funcs: int = 1200) -> str:
    out = ['"""Generated large module."""', "import functools", "", "REGISTRY = {}", ""]
    for i in range(n_funcs):
        out += [f"def func_{i}(a, b=2, *args, **kw):", f"    '''Function {i}.'''",
                f"    x = a + b * {i}", "    for j in range(3):", "        x += j",
                "    return x", "", f"REGISTRY['func_{i}'] = func_{i}", ""]
        if i % 10 == 0:
            out += [f"class Klass{i}:", f"    attr = {i}", "",
                    "    def method(self, y):", f"        return y + {i}", "",
                    "    @property", "    def prop(self):", "        return self.attr", "",
                    "    @functools.lru_cache(maxsize=None)", "    def cached(self, z):",
                    "        return z * 2", ""]
    return "\n".join(out) + "\n"


REPLACE = """\
from importpatch import Patch

p = Patch("bench-big")


@p.replace("bigpkg.big:func_5")
@p.replace("bigpkg.small:func_5")
def func_5(a, b=2, *args, **kw):
    return -1
"""

def make_diff(text: str, path: str) -> str:
    new = text.replace("    x = a + b * 5\n", "    x = a + b * 5 - 1000\n", 1)
    return "".join(difflib.unified_diff(
        text.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"))


CHILD = """\
import json, sys, time
mode = sys.argv[1]
def new_func_5(a, b=2, *args, **kw):
    return -1
if mode == "wrapt":
    import wrapt
    for name in ("bigpkg.small", "bigpkg.big"):
        wrapt.register_post_import_hook(lambda m: setattr(m, "func_5", new_func_5), name)
if mode != "first":
    import bigpkg.small
    if mode == "monkeypatch":
        bigpkg.small.func_5 = new_func_5
t0, c0 = time.perf_counter(), time.process_time()
import bigpkg.big
if mode == "monkeypatch":
    bigpkg.big.func_5 = new_func_5
t1, c1 = time.perf_counter(), time.process_time()
expected = {"plain": 14, "diff": 14 - 1000}.get(mode, -1)
assert bigpkg.big.func_5(1) == expected, (mode, bigpkg.big.func_5(1))
print(json.dumps({"wall": t1 - t0, "cpu": c1 - c0}))
"""


def run(scale: float = 1.0) -> list[Row]:
    wheel_venv = venv("startup-wheel", "packaging>=23", "wrapt>=1.16", wheel=project_wheel())
    work = BENCH_DIR / "large"
    shutil.rmtree(work, ignore_errors=True)
    (work / "pkg" / "bigpkg").mkdir(parents=True)
    text = generate()
    (work / "pkg" / "bigpkg" / "__init__.py").write_text("")
    (work / "pkg" / "bigpkg" / "big.py").write_text(text)
    (work / "pkg" / "bigpkg" / "small.py").write_text(generate(10))
    (work / "patches").mkdir()
    (work / "patches" / "big.py").write_text(REPLACE)
    (work / "diffs").mkdir()
    (work / "diffs" / "big.diff").write_text(
        "Name: bench-big-diff\n" + make_diff(text, "bigpkg/big.py")
        + make_diff(generate(10), "bigpkg/small.py"))
    py = wheel_venv.python
    subprocess.run([str(py), "-m", "compileall", "-q", str(work / "pkg")], check=True)
    base = clean_env({"PYTHONPATH": str(work / "pkg"), "XDG_CACHE_HOME": str(BENCH_DIR / "xdg")})
    patched = dict(base, IMPORTPATCH_PATH=str(work / "patches"), IMPORTPATCH_ENABLE="bench-big",
                   IMPORTPATCH_CACHE_DIR=str(work / "cache"))
    diffed = dict(base, IMPORTPATCH_PATH=str(work / "diffs"), IMPORTPATCH_ENABLE="bench-big-diff",
                  IMPORTPATCH_CACHE_DIR=str(work / "cache"))
    cold = dict(patched, IMPORTPATCH_NO_CACHE="1")

    def child(env: dict[str, str], mode: str) -> dict[str, float]:
        return measure(CHILD, env, py, mode)

    lines = text.count("\n")
    reps = max(10, int(40 * scale))
    log(f"large module: {lines} lines, {reps} interleaved rounds of 7 variants")
    s = interleave({
        "plain": lambda: child(base, "plain"),
        "warm": lambda: child(patched, "patched"),
        "cold": lambda: child(cold, "patched"),
        "diff": lambda: child(diffed, "diff"),
        "first": lambda: child(patched, "first"),
        "wrapt": lambda: child(base, "wrapt"),
        "monkeypatch": lambda: child(base, "monkeypatch"),
    }, reps)
    m = {k: median(v["wall"]) for k, v in s.items()}
    c = {k: median(v["cpu"]) for k, v in s.items()}
    plain = m["plain"]

    def ratio(k: str) -> str:
        return f"{m[k] / plain:.2f} (CPU {c[k] / c['plain']:.2f})"

    what = f"import of a patched {lines // 1000}k-line module"
    return [
        Row(f"{what}, warm cache / plain .pyc", f"plain {ms(plain)}", f"warm {ms(m['warm'])}",
            ratio("warm"), "<= 1.3", m["warm"] / plain <= 1.3),
        Row(f"{what}, cold (no cache) / plain .pyc", f"plain {ms(plain)}", f"cold {ms(m['cold'])}",
            ratio("cold"), "report", None),
        Row(f"{what}, one-line source diff, warm / plain", f"plain {ms(plain)}",
            f"diff warm {ms(m['diff'])}", ratio("diff"), "report", None),
        Row(f"{what}, warm, first patched import in the process / plain", f"plain {ms(plain)}",
            f"first {ms(m['first'])}", ratio("first"), "report", None),
        Row("anchor: same import + wrapt post-import hook / plain", f"plain {ms(plain)}",
            f"wrapt {ms(m['wrapt'])}", ratio("wrapt"), "anchor", None),
        Row("anchor: same import + plain monkeypatch / plain", f"plain {ms(plain)}",
            f"monkeypatch {ms(m['monkeypatch'])}", ratio("monkeypatch"), "anchor", None),
    ]


if __name__ == "__main__":
    from _common import table

    print(table(run()))
