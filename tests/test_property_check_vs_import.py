"""Property (Hypothesis): ``importpatch check``'s verdict for a target agrees with what really
happens, for generated modules of assignments, augmented, subscript and attribute assignments,
``for``/``with``/``except``/``match`` targets, literal and non-literal conditions, decorated,
nested and conditional definitions, ``global`` in a function, class bodies, imports, star
imports, ``del`` and assignment expressions.

For each generated module and target (``replace``, or ``add``), the ground truth comes from a real
child interpreter of the wheel venv: the module's code run *unpatched* (does it bind the name?),
and the real import with the patch enabled (patched, or ``PatchError``). Then:
- check ``ok``   => the unpatched run binds it (``add``: leaves a value bound before it ran
  alone), the import applies the patch;
- check ``fail`` => the unpatched run does not bind it (``add``: touches it), the import fails;
- check ``warn`` => the import applies the patch exactly when the unpatched run allows it, and
  fails otherwise; never does a module import unpatched.
Many modules are batched into one child per example, so few interpreters start.
"""

from __future__ import annotations

import itertools
import json
import textwrap
from typing import Any

import pytest
from conftest import Venv
from coreutil import Lab
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from importpatch.discover.declare import Patch, collecting
from importpatch.tools import check, packages

PRELUDE = '''\
import os
FLAG_T, FLAG_F = bool(os.sep), not os.sep
D = {}
class _Obj:
    pass
O = _Obj()
class CM:
    def __enter__(self):
        return 7
    def __exit__(self, *exc):
        return False
def deco(fn):
    return fn
'''
NAMES = ["t0", "t1"]
TESTS = ["True", "False", "0", "1", "not False", "FLAG_T", "FLAG_F"]
BASE = 10**6


@st.composite
def simple(draw: Any, n: str) -> str:
    """One statement that may bind ``n`` (or seem to)."""
    k = draw(st.integers(0, 2))
    return draw(st.sampled_from([
        f"{n} = {k}",
        f"try:\n    {n} += 1\nexcept (NameError, TypeError):\n    pass",
        f'D["{n}"] = 1',
        f"O.{n} = 1",
        f"try:\n    D[{n}] = 1\nexcept NameError:\n    pass",  # binds neither D nor {n}
        f"try:\n    {n}.x = 1\nexcept (NameError, AttributeError):\n    pass",
        f"for {n} in range({k}):\n    pass",
        f"with CM() as {n}:\n    pass",
        f"try:\n    raise ValueError\nexcept ValueError as {n}:\n    pass",
        f"@deco\ndef {n}():\n    return 1",
        f"def outer_{n}():\n    def {n}():\n        pass\n    return {n}",
        f"from os import sep as {n}",
        f"try:\n    del {n}\nexcept NameError:\n    pass",
        f"({n} := {k})",
        f"match {k}:\n    case 1:\n        {n} = 1\n    case _:\n        pass",
    ]))


@st.composite
def statement(draw: Any, serial: Any) -> str:
    n = draw(st.sampled_from(NAMES))
    kind = draw(st.sampled_from(["simple", "simple", "if", "global", "class", "star"]))
    if kind == "if":
        body = textwrap.indent(draw(simple(n)), "    ")
        text = f"if {draw(st.sampled_from(TESTS))}:\n{body}"
        if draw(st.booleans()):
            text += "\nelse:\n" + textwrap.indent(draw(simple(n)), "    ")
        return text
    if kind == "global":
        j = next(serial)
        call = f"\nset_{j}()" if draw(st.booleans()) else ""
        return f"def set_{j}():\n    global {n}\n    {n} = 5{call}"
    if kind == "class":
        member = draw(st.sampled_from([
            "a0 = 1", "if FLAG_T:\n        a0 = 2", "if False:\n        a0 = 3",
            "def a0(self):\n        return 1", "pass",
        ]))
        deco = "@deco\n" if draw(st.integers(0, 4)) == 0 else ""
        return f"{deco}class C0:\n    {member}"
    if kind == "star":
        return "from os.path import *" if draw(st.integers(0, 3)) == 0 else "pass"
    return str(draw(simple(n)))


@st.composite
def case(draw: Any) -> tuple[str, str, str]:
    """(module source, target qualname, op kind)."""
    serial = itertools.count()
    body = [draw(statement(serial)) for _ in range(draw(st.integers(1, 6)))]
    qual = draw(st.sampled_from([*NAMES, "C0.a0"]))
    kind = draw(st.sampled_from(["replace", "replace", "replace", "add"]))
    return PRELUDE + "\n".join(body) + "\n", qual, kind


CHILD = '''
import importlib, importlib.util, json, sys
out = []
for i, (qual, kind) in enumerate(CASES):
    name = f"{PKG}.mod{i}"
    ns = {"__name__": name + "_plain"}
    owner, _, attr = qual.rpartition(".")
    added = object()
    if kind == "add" and not owner:  # an add is bound before the module runs and must survive
        ns[attr] = added
    with open(importlib.util.find_spec(name).origin) as f:
        exec(compile(f.read(), "<plain>", "exec"), ns)
    owner_ok = not owner or isinstance(ns.get(owner), type)
    store = (vars(ns[owner]) if owner else ns) if owner_ok else {}
    if kind == "add" and not owner:
        bound = [True, store.get(attr, None) is not added]
    else:
        bound = [owner_ok, attr in store]
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        out.append([bound, "PatchError" if type(exc).__name__ == "PatchError" else repr(exc)])
        continue
    value = module
    for part in qual.split("."):
        value = getattr(value, part, None)
    patched = isinstance(value, int) and value >= BASE * (i + 1) and value < BASE * (i + 2)
    out.append([bound, "patched" if patched else "unpatched: " + repr(value)])
print(json.dumps(out))
'''

_examples = itertools.count()


@pytest.fixture(scope="module")
def check_lab(wheel_venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return Lab(wheel_venv, tmp_path_factory.mktemp("checkprop"))


# No shrinking: each example starts an interpreter; the failing module is printed in full.
@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(case(), min_size=30, max_size=30))
def test_property_check_verdict_matches_the_real_import(
    check_lab: Lab, cases: list[tuple[str, str, str]]
) -> None:
    pkg = f"gm{next(_examples)}"
    files: dict[str, str] = {f"{pkg}/__init__.py": ""}
    decls = ["from importpatch import Patch"]
    with collecting():
        patches = []
        for i, (source, qual, kind) in enumerate(cases):
            files[f"{pkg}/mod{i}.py"] = source
            value = BASE * (i + 1)
            decls.append(f'Patch("{pkg}-{i}").{kind}("{pkg}.mod{i}:{qual}", {value})')
            patch = Patch(f"{pkg}-{i}")
            getattr(patch, kind)(f"{pkg}.mod{i}:{qual}", value)
            patches.append(patch)
    check_lab.target(files).patch({f"{pkg}.py": "\n".join(decls) + "\n"})
    checker = check._Checker(packages.FolderSource(str(check_lab.targets)))
    verdicts = [checker.op(p.ops[0]) for p in patches]
    code = (f"PKG = {pkg!r}\nBASE = {BASE}\n"
            f"CASES = {json.dumps([[q, k] for _, q, k in cases])}\n" + CHILD)
    proc = check_lab.ok(["-c", code], enable=",".join(p.name for p in patches))
    truths = json.loads(proc.stdout.strip().splitlines()[-1])
    for (source, qual, kind), verdict, ((owner_ok, bound), imported) in zip(
        cases, verdicts, truths, strict=True
    ):
        where = f"{kind} {qual} -> check {verdict.status} ({verdict.detail}), " \
                f"bound unpatched: {bound}, import: {imported}\n{source}"
        applies = bound if kind == "replace" else owner_ok and not bound
        assert imported in ("patched", "PatchError"), where  # never unpatched, never a crash
        if kind == "replace" or verdict.status != check.WARN:
            # (an add may also fail on a class statement that ran and was re-bound later)
            assert (imported == "patched") == applies, where
        if verdict.status == check.OK:
            assert applies, where
        elif verdict.status == check.FAIL:
            assert not applies, where
        else:
            assert verdict.status == check.WARN, where
