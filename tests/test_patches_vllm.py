"""The ready patches of patches/, tested the way a patch author would: with the project's own
pytest plugin (``importpatch_run``, ``assert_applies_cleanly``) against the installed vLLM 0.32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importpatch.config import builtin_folder
from importpatch.pytest_plugin import assert_applies_cleanly

pytestmark = pytest.mark.vllm

SHIPPED = [
    "vllm-priority-scheduler",
    "vllm-kv-block-sizes-log",
    "vllm-sampler-nan-guard",
    "vllm-ban-token-ids",
    "vllm-sched-step-trace",
    "vllm-triton-interpret-on-cpu",
    "example-vllm-triton-attention-temperature",
    "vllm-cpu-cli",
    "vllm-compile-cache-key",
]


def test_builtin_folder_ships_every_patch() -> None:
    folder = builtin_folder()
    assert folder is not None
    from importpatch import config
    from importpatch.discover import catalog

    names = {e.name for e in catalog.load(config.read({})) if e.origin == "builtin"}
    assert set(SHIPPED) <= names


@pytest.mark.parametrize("name", SHIPPED)
def test_patch_applies_cleanly_to_installed_vllm(name: str) -> None:
    assert_applies_cleanly(name)


def test_priority_scheduler_lands_on_the_class_before_subclasses_exist(importpatch_run) -> None:  # type: ignore[no-untyped-def]
    r = importpatch_run(
        "from vllm.v1.core.sched.scheduler import Scheduler\n"
        "from vllm.v1.core.sched.async_scheduler import AsyncScheduler\n"
        "import inspect\n"
        "result = {\n"
        "  'added': hasattr(Scheduler, 'order_waiting_by_priority'),\n"
        "  'wrapped': Scheduler.schedule.__wrapped__.__qualname__,\n"
        "  'subclass_sees_it': inspect.getattr_static(AsyncScheduler, 'schedule')\n"
        "      is vars(Scheduler)['schedule'],\n"
        "}\n",
        enable=["vllm-priority-scheduler"],
    )
    assert r.returncode == 0, r.stderr
    assert r.result == {"added": True, "wrapped": "Scheduler.schedule", "subclass_sees_it": True}
    assert {e["target"] for e in r.applied if e["patch"] == "vllm-priority-scheduler"} == {
        "vllm.v1.core.sched.scheduler:Scheduler.schedule",
        "vllm.v1.core.sched.scheduler:Scheduler.order_waiting_by_priority",
    }


def test_kv_block_sizes_copy_in_engine_core_module_is_the_wrapper(importpatch_run) -> None:  # type: ignore[no-untyped-def]
    # The by-name copy made by `from ... import resolve_kv_cache_block_sizes` in core.py is the
    # patched object: a monkeypatch after import would have left it pointing at the original.
    r = importpatch_run(
        "import vllm.v1.engine.core as core, vllm.v1.core.kv_cache_utils as kv\n"
        "result = [core.resolve_kv_cache_block_sizes is kv.resolve_kv_cache_block_sizes,\n"
        "          hasattr(core.resolve_kv_cache_block_sizes, '__wrapped__')]\n",
        enable=["vllm-kv-block-sizes-log"],
    )
    assert r.returncode == 0, r.stderr
    assert r.result == [True, True]


# The sampler patches, called on real tensors through vLLM's real ``Sampler`` in a fresh patched
# interpreter. Each test also runs the same code without the patch, to show what it changes.
# Values go through JSON as repr() strings (nan and inf are not JSON).
SAMPLER_PROBE = """
import types, torch
from vllm.v1.sample.sampler import Sampler

def rows(t):
    return [[repr(x) for x in row] for row in t.tolist()]
"""


def test_nan_guard_makes_nan_logits_impossible_and_keeps_everything_else(importpatch_run) -> None:  # type: ignore[no-untyped-def]
    code = SAMPLER_PROBE + (
        "nan, inf = float('nan'), float('inf')\n"
        "given = torch.tensor([[nan, inf, -inf, 1.5, nan], [0.0, nan, -2.0, 3.25, inf]])\n"
        "before = given.clone()\n"
        "seen = []\n"
        "class Stop(Exception):\n"
        "    pass\n"
        "def capture(logits, *args):\n"  # the next call after the guard in Sampler.forward
        "    seen.append(logits)\n"
        "    raise Stop\n"
        "sampler = Sampler()\n"
        "sampler.apply_logits_processors = capture\n"
        "try:\n"
        "    sampler(given, types.SimpleNamespace(max_num_logprobs=None, logprob_token_ids=None))\n"
        "except Stop:\n"
        "    pass\n"
        "result = {'guarded': rows(seen[0]), 'dtype': str(seen[0].dtype),\n"
        "          'input_untouched': torch.equal(given.isnan(), before.isnan())\n"
        "              and bool((given.nan_to_num() == before.nan_to_num()).all()),\n"
        "          'new_tensor': seen[0].data_ptr() != given.data_ptr()}\n"
    )
    r = importpatch_run(code, enable=["vllm-sampler-nan-guard"])
    assert r.returncode == 0, r.stderr
    assert r.result == {
        "guarded": [["-inf", "inf", "-inf", "1.5", "-inf"], ["0.0", "-inf", "-2.0", "3.25", "inf"]],
        "dtype": "torch.float32",
        "input_untouched": True,  # out of place: the model runner's tensor keeps its values
        "new_tensor": True,
    }
    vanilla = importpatch_run(code, enable=[])
    assert vanilla.returncode == 0, vanilla.stderr
    assert vanilla.result["guarded"][0][0] == "nan"


def test_ban_token_ids_sets_banned_columns_to_minus_inf_in_place(importpatch_run) -> None:  # type: ignore[no-untyped-def]
    code = SAMPLER_PROBE + (
        "metadata = types.SimpleNamespace(\n"
        "    bad_words_token_ids=None, no_penalties=True, output_token_ids=[[], []],\n"
        "    allowed_token_ids_mask=None,\n"
        "    logitsprocs=types.SimpleNamespace(non_argmax_invariant=[]),\n"
        "    thinking_budget_state_holder=None, spec_token_ids=None)\n"
        "sampler = Sampler()\n"
        "out = {}\n"
        "for vocab in (10, 5, 10):\n"  # 12 is outside both vocabularies; 7 only inside the first
        "    given = torch.arange(2 * vocab, dtype=torch.float32).reshape(2, vocab)\n"
        "    got = sampler.apply_logits_processors(given, metadata, False)\n"
        "    out.setdefault(vocab, []).append({'rows': rows(got), 'same_tensor': got is given})\n"
        "result = out\n"
    )
    r = importpatch_run(code, enable=["vllm-ban-token-ids"],
                        env={"IMPORTPATCH_BANNED_TOKEN_IDS": "7, 3,12"})
    assert r.returncode == 0, r.stderr

    def banned(vocab: int, ids: set[int]) -> list[list[str]]:
        return [[repr(float("-inf")) if i in ids else repr(float(row * vocab + i))
                 for i in range(vocab)] for row in range(2)]

    ten = {"rows": banned(10, {3, 7}), "same_tensor": True}
    assert r.result == {"10": [ten, ten], "5": [{"rows": banned(5, {3}), "same_tensor": True}]}
    vanilla = importpatch_run(code, enable=[], env={"IMPORTPATCH_BANNED_TOKEN_IDS": "7, 3,12"})
    assert vanilla.returncode == 0, vanilla.stderr
    assert vanilla.result["10"][0]["rows"] == banned(10, set())


def test_sched_step_trace_appends_one_json_line_per_step_to_the_file_the_path_names(
    importpatch_run, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    """The trace wrapper of the real patched ``Scheduler.schedule`` (called with a stand-in step
    result): the lines, their fields and order, what happens when the file is rotated or deleted
    between steps (the next line goes to a file at the path, created if needed), that lines
    still queued when the process exits are written (the patch writes from a background thread;
    ``flush()`` waits for it), that nothing is written without the variable, and that a line
    that cannot be written fails a step, as it did when the step wrote it itself."""
    trace, quiet = tmp_path / "trace.jsonl", tmp_path / "quiet.jsonl"
    missing = tmp_path / "no-such-folder" / "trace.jsonl"
    code = (
        "import os, types\n"
        "from vllm.v1.core.sched.scheduler import Scheduler\n"
        "trace_step = vars(Scheduler)['schedule']._importpatch_wrap[2]\n"
        "flush = trace_step.__globals__['flush']\n"
        "scheduler = types.SimpleNamespace(current_step=7, running=[1, 2, 3], waiting=[4])\n"
        "def step(*ids):\n"
        "    out = types.SimpleNamespace(num_scheduled_tokens=dict.fromkeys(ids, 2),\n"
        "                                total_num_scheduled_tokens=2 * len(ids))\n"
        "    assert trace_step(lambda: out, scheduler, (), {}) is out\n"
        "result = {'pid': os.getpid()}\n"
        "os.environ.pop('IMPORTPATCH_SCHED_TRACE_FILE', None)\n"  # the variable is read each step
        f"os.environ['VLLM_IMPORTPATCH_SCHED_TRACE_FILE'] = {str(missing)!r}\n"
        "step('x'); flush()\n"
        "try:\n"
        "    step('y')\n"
        "except OSError as exc:\n"
        "    result['error'] = type(exc).__name__\n"
        "del os.environ['VLLM_IMPORTPATCH_SCHED_TRACE_FILE']\n"
        "step('q'); flush()\n"
        f"result['quiet'] = os.listdir({str(tmp_path)!r})\n"
        f"os.environ['IMPORTPATCH_SCHED_TRACE_FILE'] = path = {str(trace)!r}\n"
        "step('b-1', 'a-2'); step(); step('c')\n"  # a step that scheduled nothing: no line
        "assert flush()\n"
        "os.rename(path, path + '.1')\n"  # rotated, as logrotate does
        "step('d')\n"
        "assert flush()\n"
        "os.unlink(path)\n"
        "for i in range(200):\n"  # left in the queue at exit
        "    step(f'e{i:03}')\n"
    )
    r = importpatch_run(code, enable=["vllm-sched-step-trace"],
                        env={"IMPORTPATCH_SCHED_TRACE_FILE": str(quiet)})
    assert r.returncode == 0, r.stderr
    assert r.result["error"] == "FileNotFoundError"
    assert r.result["quiet"] == []  # nothing written while no variable named a file
    rotated = [json.loads(x) for x in Path(f"{trace}.1").read_text().splitlines()]
    current = [json.loads(x) for x in trace.read_text().splitlines()]
    assert [x["req_ids"] for x in rotated] == [["a-2", "b-1"], ["c"]]
    assert [x["req_ids"] for x in current] == [[f"e{i:03}"] for i in range(200)]  # "d": deleted
    first = rotated[0]
    assert set(first) == {"pid", "step", "time", "num_requests", "tokens_scheduled", "running",
                          "waiting", "req_ids"}
    assert (first["pid"], first["step"], first["num_requests"], first["tokens_scheduled"],
            first["running"], first["waiting"]) == (r.result["pid"], 7, 2, 4, 3, 1)
    times = [x["time"] for x in rotated + current]
    assert times == sorted(times)  # taken at each step, in step order
