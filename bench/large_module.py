"""Importing a large patched module: a generated 12,500-line module (1,200 functions, 120
classes), 450 KB of source.

Every sample is a fresh process of the wheel venv that times ``import bigpkg.big`` (and, for the
anchors, the monkeypatch) with ``time.perf_counter`` / ``time.process_time`` around it. Before
that, the process imports ``bigpkg.small`` the same way, so one-time costs (the loader's own
modules) are outside the timed import; the "first patched import" row includes them.

Variants (a replace patch on ``func_5`` unless stated):
- plain: the unpatched module from its ``.pyc``; importpatch active in the process (it patches
  ``bigpkg.small``), so both sides have the same modules loaded         <- baseline
- warm: patched, bytecode cache warm                                    goal <= 1.3 x plain
- cold: patched, ``IMPORTPATCH_NO_CACHE=1`` (read, patch, compile)     report
- diff warm: a one-line source diff instead (its text is also published)   report
- plain, no importpatch: nothing enabled in the process; warm / this is reported too, since
  importpatch's loader brings ~55 modules (logging, socket, ast, tokenize ...) into a bare process
  and every garbage collection during the import then walks twice the objects
- first: warm, but the first patched import of the process (loader modules loaded then) / plain,
  no importpatch                                                         report
- wrapt hook: ``wrapt.register_post_import_hook`` replacing ``func_5``  anchor, / no importpatch
- monkeypatch: ``import`` then ``setattr``                              anchor, / no importpatch
"""

from __future__ import annotations

import difflib
import shutil
import subprocess

from _common import (
    BENCH_DIR,
    Figure,
    Row,
    clean_env,
    interleave,
    log,
    measure,
    median,
    ms,
    project_wheel,
    rounds,
    venv,
)


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

big = Patch("bench-big")
small = Patch("bench-small")


@big.replace("bigpkg.big:func_5")
@small.replace("bigpkg.small:func_5")
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
    bare = clean_env({"PYTHONPATH": str(work / "pkg"), "XDG_CACHE_HOME": str(BENCH_DIR / "xdg")})
    on = dict(bare, IMPORTPATCH_PATH=str(work / "patches"),
              IMPORTPATCH_CACHE_DIR=str(work / "cache"))
    plain = dict(on, IMPORTPATCH_ENABLE="bench-small")
    patched = dict(on, IMPORTPATCH_ENABLE="bench-small,bench-big")
    cold = dict(patched, IMPORTPATCH_NO_CACHE="1")
    diffed = dict(on, IMPORTPATCH_PATH=str(work / "diffs"), IMPORTPATCH_ENABLE="bench-big-diff")

    def child(env: dict[str, str], mode: str) -> dict[str, float]:
        return measure(CHILD, env, py, mode)

    lines = text.count("\n")
    reps = rounds("large module", 40, 10, scale)
    variants = {
        "plain": lambda: child(plain, "plain"),
        "warm": lambda: child(patched, "patched"),
        "cold": lambda: child(cold, "patched"),
        "diff": lambda: child(diffed, "diff"),
        "bare": lambda: child(bare, "plain"),
        "first": lambda: child(patched, "first"),
        "wrapt": lambda: child(bare, "wrapt"),
        "monkeypatch": lambda: child(bare, "monkeypatch"),
    }
    log(f"large module: {lines} lines, {reps} interleaved rounds of {len(variants)} variants")
    s = interleave(variants, reps)
    m = {k: median(v["wall"]) for k, v in s.items()}
    c = {k: median(v["cpu"]) for k, v in s.items()}

    def ratio(k: str, base: str) -> str:
        return f"{m[k] / m[base]:.2f} (CPU {c[k] / c[base]:.2f})"

    what = f"import of a patched {lines / 1000:.1f}k-line module"
    plain_a = f"plain .pyc {ms(m['plain'])}"
    bare_a = f"plain .pyc, no importpatch {ms(m['bare'])}"
    return [
        Row(f"{what}, warm cache / plain .pyc import", plain_a, f"warm {ms(m['warm'])}",
            ratio("warm", "plain"), "<= 1.3", m["warm"] / m["plain"] <= 1.3,
            figures=[Figure(f"{lines / 1000:.1f}k-line module, patched, warm cache / plain .pyc",
                            "ratio", round(m["warm"] / m["plain"], 2), 1.3)]),
        Row(f"{what}, cold (no cache) / plain .pyc import", plain_a, f"cold {ms(m['cold'])}",
            ratio("cold", "plain"), "report", None),
        Row(f"{what}, one-line source diff, warm / plain", plain_a, f"diff warm {ms(m['diff'])}",
            ratio("diff", "plain"), "report", None),
        Row(f"{what}, warm / plain in a process without importpatch", bare_a,
            f"warm {ms(m['warm'])}", ratio("warm", "bare"), "report", None),
        Row(f"{what}, warm, first patched import of the process", bare_a,
            f"first {ms(m['first'])}", ratio("first", "bare"), "report", None),
        Row("anchor: same import + wrapt post-import hook", bare_a, f"wrapt {ms(m['wrapt'])}",
            ratio("wrapt", "bare"), "anchor", None),
        Row("anchor: same import + plain monkeypatch", bare_a,
            f"monkeypatch {ms(m['monkeypatch'])}", ratio("monkeypatch", "bare"), "anchor", None),
    ]


if __name__ == "__main__":
    from _common import table

    print(table(run()))
