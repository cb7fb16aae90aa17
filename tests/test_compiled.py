"""Patches inside ``torch.compile``d code: every kind of operation gives the same result compiled
as eager, under the eager, aot_eager and inductor backends (CPU), with ``fullgraph=True``.

Real torch (``tox -e vllm``), real child interpreters of this test's environment, patches switched
on by the real hook (IMPORTPATCH_PATH + IMPORTPATCH_ENABLE). Before wraps were generated Python
functions, Dynamo traced a wrapt proxy's ``__code__`` -- the original's: a compiled caller ran
unpatched -- and could not trace a wrapped method at all (``__call__`` of ``_BoundTargetWrapper``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import clean_env, missing

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(missing("torch"), reason="torch is not importable here (tox -e vllm)"),
]

TARGET = '''\
import torch


def f(x):
    return x + 1


def g(x):
    return x + 1


def h(x):
    return x + 1


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fwd = self.forward_native  # vLLM's CustomOp keeps a bound method like this

    def forward(self, x):
        return x * 3

    def forward_native(self, x):
        return x * 5

    @classmethod
    def cm(cls, x):
        return x + 10

    @staticmethod
    def sm(x):
        return x + 100

    @classmethod
    def cm_outer(cls, x):
        return x + 20

    @staticmethod
    def sm_outer(x):
        return x + 200


class Box:
    def __init__(self, x):
        self.x = x + 1
'''

SOURCE = '''\
import dataclasses


@dataclasses.dataclass
class Cfg:
    a: float = 1.0


CFG = Cfg()


def diffed(x):
    return x + 1


def transformed(x):
    return x + 1
'''

PATCH = '''\
import ast

from importpatch import Patch

p = Patch("compiled")


def twice(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs) * 2


def method_twice(wrapped, instance, args, kwargs):
    assert type(instance).__name__ == "Layer", instance
    return wrapped(*args, **kwargs) * 2


def class_twice(wrapped, instance, args, kwargs):
    assert instance is not None and wrapped.__self__ is instance, (wrapped, instance)
    return wrapped(*args, **kwargs) * 2


def static_twice(wrapped, instance, args, kwargs):
    assert instance is None, instance
    return wrapped(*args, **kwargs) * 2


p.wrap("ctk.m:f", twice)
p.wrap("ctk.m:Layer.forward", method_twice)
p.wrap("ctk.m:Layer.forward_native", method_twice)
p.wrap("ctk.m:Layer.cm", class_twice)
p.wrap("ctk.m:Layer.sm", static_twice)
p.wrap("ctk.m:Layer.cm_outer", class_twice, decorated=True)
p.wrap("ctk.m:Layer.sm_outer", static_twice, decorated=True)


@p.replace("ctk.m:g", original=True)
def g(original, x):
    return original(x) * 2


@p.replace("ctk.m:h")
def h(x):
    return x + 5


@p.add("ctk.m:Layer.extra")
def extra(self, x):
    return x + 7


@p.wrap("ctk.m:Box")
def box(wrapped, instance, args, kwargs):
    made = wrapped(*args, **kwargs)
    made.x = made.x * 2
    return made


p.field("ctk.src:Cfg.scale", "float", 3.0)
p.diff("""\\
--- a/ctk/src.py
+++ b/ctk/src.py
@@ -13,3 +13,3 @@ CFG = Cfg()
 def diffed(x):
-    return x + 1
+    return x + 4
\\x20
""")


@p.transform("ctk.src")
def plus_six(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "transformed":
            node.body[0].value.right = ast.Constant(6)
    return tree
'''

CHILD = '''\
import json, sys
import torch
from ctk import m, src

layer = m.Layer()
cases = {
    "wrap function": lambda x: m.f(x),
    "replace original=True": lambda x: m.g(x),
    "replace": lambda x: m.h(x),
    "wrap method (module call)": lambda x: layer(x),
    "wrap method (bound method kept)": lambda x: layer.fwd(x),
    "wrap method (through the class)": lambda x: m.Layer.forward(layer, x),
    "wrap classmethod": lambda x: m.Layer.cm(x),
    "wrap classmethod (instance)": lambda x: layer.cm(x),
    "wrap staticmethod": lambda x: layer.sm(x),
    "wrap classmethod decorated=True": lambda x: m.Layer.cm_outer(x),
    "wrap staticmethod decorated=True": lambda x: m.Layer.sm_outer(x),
    "add": lambda x: layer.extra(x),
    "field": lambda x: x * src.CFG.scale,
    "source diff": lambda x: src.diffed(x),
    "transform": lambda x: src.transformed(x),
}
out = {}
backend = sys.argv[1]
x = torch.ones(2)
for name, fn in cases.items():
    torch._dynamo.reset()
    eager = fn(x)
    compiled = torch.compile(fn, fullgraph=True, backend=backend)(x)
    out[name] = [eager.tolist(), compiled.tolist()]
# A wrapped class cannot be traced: the graph breaks at it (the wrap runs); under fullgraph=True
# Dynamo refuses, naming importpatch's wrapper.
box = lambda x: m.Box(x).x
torch._dynamo.reset()
out["wrap class"] = [box(x).tolist(), torch.compile(box, backend=backend)(x).tolist()]
torch._dynamo.reset()
try:
    torch.compile(box, fullgraph=True, backend=backend)(x)
    out["wrap class fullgraph"] = "compiled"
except Exception as exc:
    out["wrap class fullgraph"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(out))
'''

# Every case on torch.ones(2): the patched value (the unpatched one differs).
EXPECTED = {
    "wrap function": 4.0,  # unpatched 2
    "replace original=True": 4.0,
    "replace": 6.0,
    "wrap method (module call)": 6.0,  # unpatched 3
    "wrap method (bound method kept)": 10.0,  # unpatched 5
    "wrap method (through the class)": 6.0,
    "wrap classmethod": 22.0,  # unpatched 11
    "wrap classmethod (instance)": 22.0,
    "wrap staticmethod": 202.0,  # unpatched 101
    "wrap classmethod decorated=True": 42.0,
    "wrap staticmethod decorated=True": 402.0,
    "add": 8.0,
    "field": 3.0,
    "source diff": 5.0,  # unpatched 2
    "transform": 7.0,
    "wrap class": 4.0,
}


@pytest.fixture(scope="module")
def compiled_lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("compiled")
    (root / "pkg" / "ctk").mkdir(parents=True)
    (root / "pkg" / "ctk" / "__init__.py").write_text("")
    (root / "pkg" / "ctk" / "m.py").write_text(TARGET)
    (root / "pkg" / "ctk" / "src.py").write_text(SOURCE)
    (root / "patches").mkdir()
    (root / "patches" / "compiled.py").write_text(PATCH)
    (root / "child.py").write_text(CHILD)
    return root


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_every_kind_of_patch_is_the_same_compiled_as_eager(
    compiled_lab: Path, backend: str
) -> None:
    env = clean_env({
        "PYTHONPATH": str(compiled_lab / "pkg"), "IMPORTPATCH_PATH": str(compiled_lab / "patches"),
        "IMPORTPATCH_ENABLE": "compiled", "IMPORTPATCH_CACHE_DIR": str(compiled_lab / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(compiled_lab / f"inductor-{backend}"),
    })
    proc = subprocess.run([sys.executable, str(compiled_lab / "child.py"), backend], env=env,
                          capture_output=True, text=True, timeout=900, cwd=compiled_lab)
    assert proc.returncode == 0, proc.stderr[-6000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    refused = out.pop("wrap class fullgraph")
    got = {name: (eager, compiled) for name, (eager, compiled) in out.items()}
    assert got == {name: ([value] * 2, [value] * 2) for name, value in EXPECTED.items()}
    assert "ClassWrapper" in refused and "__call__" in refused, refused


CACHED_CHILD = '''\
import json
import torch
from torch._dynamo.utils import counters
from ctk import src

y = torch.compile(src.diffed, fullgraph=True, backend="inductor")(torch.ones(2))
print("RESULT " + json.dumps({"y": y.tolist(), "fx": dict(counters["inductor"]),
                              "aot": dict(counters["aot_autograd"])}))
'''


def test_inductors_own_caches_are_keyed_on_the_patched_graph(compiled_lab: Path) -> None:
    """torch's Inductor FX-graph cache and AOTAutograd cache (one TORCHINDUCTOR_CACHE_DIR through
    patch off, on, off, on) are keyed on the traced graph: a patched function's graph is another
    entry, never the unpatched one's (docs/triton.md, compile caches)."""
    (compiled_lab / "cached_child.py").write_text(CACHED_CHILD)
    shared = compiled_lab / "inductor-shared"
    runs = []
    for enable in ("", "compiled", "", "compiled"):
        env = clean_env({
            "PYTHONPATH": str(compiled_lab / "pkg"),
            "IMPORTPATCH_PATH": str(compiled_lab / "patches"),
            "IMPORTPATCH_ENABLE": enable, "IMPORTPATCH_CACHE_DIR": str(compiled_lab / "cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(shared), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        })
        proc = subprocess.run([sys.executable, str(compiled_lab / "cached_child.py")], env=env,
                              capture_output=True, text=True, timeout=900, cwd=compiled_lab)
        assert proc.returncode == 0, proc.stderr[-6000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        runs.append(json.loads(line[len("RESULT "):]))
    assert [r["y"] for r in runs] == [[2.0, 2.0], [5.0, 5.0], [2.0, 2.0], [5.0, 5.0]]
    hits = [r["fx"].get("fxgraph_cache_hit", 0) + r["aot"].get("autograd_cache_hit", 0)
            for r in runs]
    assert hits[0] == hits[1] == 0, runs  # the patched graph is not the unpatched one's entry
    assert hits[2] > 0 and hits[3] > 0, runs  # and each is found again: the caches are in use


# -- Real vLLM: LLM() compiling the model (no enforce_eager) -----------------------------------

VLLM_PATCH = '''\
from importpatch import Patch

p = Patch("compiled-llama")


@p.wrap("vllm.model_executor.models.llama:LlamaMLP.forward")
def mlp(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs) * 1.5


@p.replace("vllm.model_executor.models.llama:LlamaAttention.forward", original=True)
def attention(original, self, positions, hidden_states):
    return original(self, positions, hidden_states) * 0.5
'''

DRIVER = '''\
import json, os, sys

if __name__ == "__main__":
    from vllm import LLM, SamplingParams

    llm = LLM(model=sys.argv[1], enforce_eager=sys.argv[2] == "eager", dtype="float32",
              max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=1)
    outs = llm.generate(["the capital of france is", "hello world my name is"], params,
                        use_tqdm=False)
    print("RESULT " + json.dumps({
        "pid": os.getpid(),
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids,
                                                       o.outputs[0].logprobs)] for o in outs],
    }))
'''


@pytest.mark.slow
@pytest.mark.skipif(missing("vllm"), reason="vLLM is not importable here (tox -e vllm)")
def test_vllm_compiled_model_runs_the_wrap_and_the_replacement(tmp_path: Path) -> None:
    """A wrap (LlamaMLP.forward) and a replace(original=True) (LlamaAttention.forward) in the
    model's forward, in vLLM's spawned Worker: LLM() compiling the model (vLLM's torch.compile,
    inductor on CPU) gives what the same patches give under enforce_eager, and not what vLLM
    gives unpatched. Before, the wrap made LLM() fail to start unless enforce_eager."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))
    from tiny_model import build_tiny_llama

    model = str(build_tiny_llama(tmp_path / "tiny-llama"))
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "compiled_llama.py").write_text(VLLM_PATCH)
    (tmp_path / "driver.py").write_text(DRIVER)
    results = {}
    for label, mode, enable in (("compiled", "compile", "compiled-llama"),
                                ("eager", "eager", "compiled-llama"),
                                ("unpatched", "eager", "")):
        run = tmp_path / label
        run.mkdir()
        # vLLM's IPC sockets live in TMPDIR: a path of at most 107 characters
        ipc = tempfile.mkdtemp(prefix="ipc-", dir="/tmp")
        env = clean_env({
            "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(run / "vllm-cache"), "TMPDIR": ipc,
            "IMPORTPATCH_CACHE_DIR": str(run / "importpatch-cache"),
            "IMPORTPATCH_EVENTS_DIR": str(run / "events"),
            "IMPORTPATCH_PATH": str(tmp_path / "patches"), "IMPORTPATCH_ENABLE": enable,
        })
        try:
            proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), model, mode],
                                  env=env, capture_output=True, text=True, timeout=900, cwd=run)
        finally:
            shutil.rmtree(ipc, ignore_errors=True)
        assert proc.returncode == 0, proc.stderr[-6000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        results[label] = json.loads(line[len("RESULT "):])
        if label == "compiled":  # vLLM did compile the model (its torch.compile cache)
            compiled = list((run / "vllm-cache").rglob("torch_compile_cache"))
            assert compiled, sorted(p.name for p in (run / "vllm-cache").rglob("*"))[:50]
        if enable:  # both patches applied in the spawned Worker (not in this driver)
            events = [json.loads(x) for f in (run / "events").glob("*.jsonl")
                      for x in f.read_text().splitlines()]
            applied = {(e["target"], e["pid"]) for e in events if e["outcome"] == "applied"}
            driver = results[label]["pid"]
            targets = {t for t, pid in applied if pid != driver}
            assert {"vllm.model_executor.models.llama:LlamaMLP.forward",
                    "vllm.model_executor.models.llama:LlamaAttention.forward"} <= targets
    compiled, eager, unpatched = (results[k] for k in ("compiled", "eager", "unpatched"))
    assert compiled["tokens"] == eager["tokens"]
    for got, want in zip(compiled["logprobs"], eager["logprobs"], strict=True):
        assert got == pytest.approx(want, abs=1e-3)
    # unpatched differs: other tokens, or the same tokens with other log-probabilities
    assert unpatched["tokens"] != eager["tokens"] or any(
        abs(a - b) > 1e-2 for u, e in zip(unpatched["logprobs"], eager["logprobs"], strict=True)
        for a, b in zip(u, e, strict=True)), (unpatched, eager)
