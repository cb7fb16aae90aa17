"""per-request-banned-tokens: ``SamplingParams(banned_token_ids=[...])`` bans token ids in one
request only (an example of a per-request setting that reaches the Worker's sampler).

How the value travels: ``patch.field`` makes ``banned_token_ids`` a field of ``SamplingParams`` in
every process where the patch is on (the driver builds the request; msgspec carries the field to
the EngineCore and, in the scheduler's output, to the Worker). In the Worker the sampler never sees
a ``SamplingParams``: ``InputBatch.add_request`` copies each request's settings into per-row state
that the sampler reads every step. The wrap adds the ids there as one-token "bad words", which the
sampler bans at every step of that request.
"""

from importpatch import Patch

patch = Patch("per-request-banned-tokens", requires="vllm>=0.11,<0.40")
patch.field("vllm.sampling_params:SamplingParams.banned_token_ids", "list[int] | None", None)


@patch.wrap("vllm.v1.worker.gpu_input_batch:InputBatch.add_request")
def add_request(wrapped, instance, args, kwargs):
    req_index = wrapped(*args, **kwargs)
    request = args[0] if args else kwargs["request"]  # vLLM passes it by position today
    params = request.sampling_params
    banned = getattr(params, "banned_token_ids", None) if params is not None else None
    if banned:
        words = instance.bad_words_token_ids.get(req_index, [])  # the request's own bad words
        instance.bad_words_token_ids[req_index] = [*words, *([t] for t in banned)]
    return req_index
