"""Property (Hypothesis), issue 36 item 1: ``importpatch check``'s verdict on a generated *set* of
patches is what the real import does with that set, as tests/test_property_check_vs_import.py
checks it for one patch at a time.

Each example is a fresh target package (``h`` a function, ``C.f`` a method) and two to four
patches on it, each drawn from the kinds (replace, wrap, add, source diff, after_import) × the
landing (a patch file: at the definition site; a patch package whose declaration imports the
target at module level: in place, right after the module ran, ``catalog.in_place_only``) × the
target, the wrap order and the patch name (which orders ties). ``importpatch check --json`` runs
as the real CLI; the ground truth is the real import of the target, with the same variables, in a
child interpreter of the wheel venv. Then, with ``on_error="fail"``: check's exit status is 0
exactly when the import succeeds, and then every patch applied (an "applied" event each) and each
target runs the chain check showed; otherwise the patch the import's ``PatchError`` names is one
that check fails. With ``on_error="warn"`` (the import goes on without a failing patch): check
fails exactly the patches that did not apply.

(Not drawn: late activation of a target imported before the hook, and more than one in-place
package per set, whose declarations would import the target in an order discovery decides.)
Six examples here (CI, ~10 s after the wheel venv); ``tox -e checkset`` runs 200 (~2 min),
``IMPORTPATCH_SET_EXAMPLES=N`` any other number. The long runs found what the set rules now say:
two adds of one name (the later, in place last, fails), a replace conflict (the first by name
fails, the last applies under on_error=warn), three diffs that do not stack (each that does not
fit on the rest fails).
"""

from __future__ import annotations

import itertools
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import Venv
from coreutil import Lab, write_tree
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

MODULE = '''\
def h(x):
    return [x]


class C:
    def f(self, x):
        return [x]
'''
KINDS = ["replace", "wrap", "add", "diff", "after_import"]
LANDINGS = ["definition-site", "in-place"]


@st.composite
def patch_spec(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(KINDS))
    spec = {"kind": kind, "landing": draw(st.sampled_from(LANDINGS)),
            "prefix": draw(st.sampled_from("az")), "order": draw(st.sampled_from([-1, 0, 1]))}
    if kind in ("replace", "wrap"):
        spec["qual"] = draw(st.sampled_from(["h", "h", "C.f"]))
    elif kind == "add":
        spec["qual"] = draw(st.sampled_from(["n0", "C.n0", "C.n1", "h"]))
    return spec


@st.composite
def patch_set(draw: Any) -> list[dict[str, Any]]:
    specs = draw(st.lists(patch_spec(), min_size=2, max_size=4))
    on_error = draw(st.sampled_from(["fail", "warn"]))  # warn: each patch's own fate is seen
    for spec in specs:
        spec["on_error"] = on_error
    seen_in_place = False
    for spec in specs:  # at most one in-place package (see the docstring)
        if spec["landing"] == "in-place":
            if seen_in_place:
                spec["landing"] = "definition-site"
            seen_in_place = True
    return specs


def declaration(pkg: str, name: str, spec: dict[str, Any], i: int) -> str:
    target = f"{pkg}.m:{spec.get('qual', '')}"
    kind = spec["kind"]
    body = f"from importpatch import Patch\n\np = Patch({name!r}, on_error={spec['on_error']!r})\n"
    if kind == "replace":
        body += (f"def _r(*args):\n    return ['r{i}']\n\n"
                 f"p.replace({target!r}, _r)\n")
    elif kind == "wrap":
        body += (f"def _w(wrapped, instance, args, kwargs):\n"
                 f"    return wrapped(*args, **kwargs) + ['w{i}']\n\n"
                 f"p.wrap({target!r}, _w, order={spec['order']})\n")
    elif kind == "add":
        body += f"def _a(*args):\n    return 'a{i}'\n\np.add({target!r}, _a)\n"
    elif kind == "diff":
        diff = (f"--- a/{pkg}/m.py\n+++ b/{pkg}/m.py\n@@ -1,5 +1,5 @@\n def h(x):\n"
                f"-    return [x]\n+    return [x, 'd{i}']\n \n \n class C:\n")
        body += f"p.diff({diff!r})\n"
    else:
        body += (f"def _hook(module):\n    module.HOOK{i} = True\n\n"
                 f"p.after_import({pkg + '.m'!r}, _hook)\n")
    if spec["landing"] == "in-place":  # the blog layout: the target imported while it declares
        body = f"import {pkg}.m  # noqa: F401\n" + body
    return body


CHILD = '''
import json
import importpatch.events as events
out = {}
try:
    import PKG.m as m
    out["ok"] = True
    out["calls"] = [m.h(0), m.C().f(0)]
except ImportError as exc:
    out["ok"] = False
    out["error"] = type(exc).__name__
    out["patch"] = getattr(exc, "patch", None)
    out["message"] = str(exc)
out["events"] = [[e["outcome"], e["patch"], e["detail"]] for e in events.events()]
print(json.dumps(out))
'''

_examples = itertools.count()


def expected_call(qual: str, specs: list[dict[str, Any]], names: list[str],
                  chains: list[dict[str, Any]]) -> list[Any]:
    """What ``qual(0)`` returns when the chain ``check`` reported for it is what runs: the
    original (its diffs applied) or a replacement innermost, then each wrap's tag outwards."""
    out: list[Any] = [0] + [f"d{i}" for i, s in enumerate(specs)
                            if s["kind"] == "diff" and qual == "h"]
    links = next((c["links"] for c in chains if c["qualname"] == qual), [])
    for link in links:
        i = names.index(link["patch"])
        if link["kind"] == "replace":
            out = [f"r{i}"]
        else:
            out.append(f"w{i}")
    return out


@pytest.fixture(scope="module")
def set_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkset")


EXAMPLES = int(os.environ.get("IMPORTPATCH_SET_EXAMPLES", "6"))


# No shrinking: each example starts three interpreters; the failing set is printed in full.
@settings(max_examples=EXAMPLES, deadline=None,
          phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(patch_set())
def test_property_check_verdict_on_a_set_matches_the_real_import(
    wheel_venv: Venv, set_root: Path, specs: list[dict[str, Any]]
) -> None:
    n = next(_examples)
    pkg = f"sp{n}"
    lab = Lab(wheel_venv, set_root / pkg)
    lab.target({f"{pkg}/__init__.py": "", f"{pkg}/m.py": MODULE})
    names = []
    for i, spec in enumerate(specs):
        name = f"{pkg}-{spec['prefix']}{i}"
        names.append(name)
        text = declaration(pkg, name, spec, i)
        if spec["landing"] == "definition-site":
            lab.patch({f"p{i}.py": text})
            continue
        mod = f"{pkg}_pp{i}"
        info = f"{mod}-0.1.dist-info"
        write_tree(lab.targets, {
            f"{mod}.py": text,
            f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {mod}\nVersion: 0.1\n",
            f"{info}/entry_points.txt": f"[importpatch.patches]\n{mod} = {mod}\n",
        })
    enable = ",".join(names)
    proc = lab.run(["-m", "importpatch", "check", "--json"], enable=enable)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    truth = json.loads(lab.ok(CHILD.replace("PKG", pkg), enable=enable).stdout.splitlines()[-1])
    words = {p["name"]: (p["status"], p.get("landing"), p["problems"]) for p in report["patches"]}
    where = (f"\nset: {json.dumps(specs)}\ncheck: {json.dumps(words, indent=1)}\n"
             f"conflicts: {report['conflicts']}\nimport: {json.dumps(truth, indent=1)}\n"
             + "\n".join(textwrap.indent(declaration(pkg, names[i], s, i), "    ")
                         for i, s in enumerate(specs)))
    failing = {p["name"] for p in report["patches"] if p["failing"]}
    if specs[0]["on_error"] == "warn" and truth["ok"]:
        # each patch's fate: check fails exactly the ones the import skips or fails
        applied = {e[1] for e in truth["events"] if e[0] == "applied"}
        assert failing == set(names) - applied, where
        return
    assert (report["exit_status"] == 0) == truth["ok"], where
    if truth["ok"]:
        applied = {e[1] for e in truth["events"] if e[0] == "applied"}
        assert applied >= set(names), where
        # and each target runs the chain check showed, innermost first
        for qual, called in zip(["h", "C.f"], truth["calls"], strict=True):
            assert called == expected_call(qual, specs, names, report["chains"]), where
    else:
        assert truth["error"] == "PatchError", where
        assert truth["patch"] in failing, where
