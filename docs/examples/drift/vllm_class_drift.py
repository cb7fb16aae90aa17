"""vllm-class-drift: two subclasses of real vLLM classes, written against vLLM 0.22.0.

An example for docs/notes/drift.md, not a shipped patch (discovered only with
``IMPORTPATCH_PATH=docs/examples/drift``). Its pins, ``vllm_class_drift.pin.toml``, were made
with ``importpatch pin vllm-class-drift --against vllm==0.22.0``; ``importpatch check
vllm-class-drift --against vllm==0.33.0`` then reports each class ``changed``, with upstream's
diff of it and the members upstream added that these subclasses do not define.

What:   the scheduler counts the requests that finished by length; the min-tokens logits
        processor keeps a flag of whether any request is still under its minimum, and its
        ``apply`` (overridden: a copy of 0.22.0's, guarded by the flag) masks the stop tokens.
        Written against 0.22.0; by 0.29.0 upstream's ``apply`` also restores the stop tokens of
        structured-output requests (``_mask_stop_token_logits``), which this override skips.
"""

from importpatch import Patch

patch = Patch(
    "vllm-class-drift",
    requires="vllm>=0.22,<0.40",
    doc="example: subclasses of Scheduler and MinTokensLogitsProcessor (docs/notes/drift.md)",
)


@patch.subclass("vllm.v1.core.sched.scheduler:Scheduler")
def counting_scheduler(Original):
    class Scheduler(Original):
        finished_by_length = 0

        def update_from_output(self, scheduler_output, model_runner_output):
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            for engine_outputs in outputs.values():
                for out in engine_outputs.outputs:
                    if out.finish_reason is not None and str(out.finish_reason) == "length":
                        type(self).finished_by_length += 1
            return outputs

    return Scheduler


@patch.subclass("vllm.v1.sample.logits_processor.builtin:MinTokensLogitsProcessor")
def min_tokens(Original):
    class MinTokensLogitsProcessor(Original):
        def update_state(self, batch_update):
            super().update_state(batch_update)
            self.active = bool(self.min_toks)

        def apply(self, logits):
            if getattr(self, "active", False):
                logits.index_put_(self.logits_slice, self.neg_inf_tensor)
            return logits

    return MinTokensLogitsProcessor
