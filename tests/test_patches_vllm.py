"""The ready patches of patches/, tested the way a patch author would: with the project's own
pytest plugin (``importpatch_run``, ``assert_applies_cleanly``) against the installed vLLM 0.32."""

from __future__ import annotations

import pytest

from importpatch.catalog import builtin_folder
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
]


def test_builtin_folder_ships_every_patch() -> None:
    folder = builtin_folder()
    assert folder is not None
    from importpatch import catalog, config

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
    assert {e["target"] for e in r.applied} == {
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
