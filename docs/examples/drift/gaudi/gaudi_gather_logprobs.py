"""vllm-gaudi's copy of Sampler.gather_logprobs (written against vLLM 0.22.0): the whole method,
to delete the two torch._dynamo mark_unbacked lines HPU graphs do not support.

The copy as it stands in vllm-gaudi's own module, whose imports (torch, LogprobsTensors,
batched_count_greater_than) are not repeated here: docs/notes/drift.md pins, checks and converts
it, which reads it and never calls it."""
# ruff: noqa: F821
from __future__ import annotations

from importpatch import Patch

patch = Patch("gaudi-gather-logprobs", requires="vllm>=0.22")


@patch.replace("vllm.v1.sample.sampler:Sampler.gather_logprobs")
def gather_logprobs(
    logprobs: torch.Tensor,
    num_logprobs: int,
    token_ids: torch.Tensor,
) -> LogprobsTensors:
    """
    Gather logprobs for topk and sampled/prompt token.

    Args:
      logprobs: (num tokens) x (vocab) tensor
      num_logprobs: maximum number of logprobs to
                    retain per token
      token_ids: prompt tokens (if prompt logprobs)
                 or sampled tokens (if sampled
                 logprobs); 1D token ID tensor
                 with (num tokens) elements
                 Must be int64.

    Returns:
      Top-k int indices tensor, (num tokens) x (num_logprobs + 1)
      Top-k float logprobs tensor, (num tokens) x (num_logprobs + 1)
      Sampled token rank tensor, (num tokens)
    """
    assert token_ids.dtype == torch.int64
    # Find the topK values.
    topk_logprobs, topk_indices = torch.topk(logprobs, num_logprobs, dim=-1)

    # Get with the logprob of the prompt or sampled token.
    token_ids = token_ids.unsqueeze(-1)
    token_logprobs = logprobs.gather(-1, token_ids)

    # Compute the ranks of the actual token.
    # Avoid 0/1 specialization recompile on the batch dimension
    # of the compiled batched_count_greater_than. mark_unbacked makes
    # the size fully symbolic so dynamo doesn't specialize when
    # batch_size transitions from 1 to >=2.
    token_ranks = batched_count_greater_than(logprobs, token_logprobs)

    # Concatenate together with the topk.
    indices = torch.cat((token_ids, topk_indices), dim=1)
    logprobs = torch.cat((token_logprobs, topk_logprobs), dim=1)

    # Use int32 to reduce the tensor size.
    indices = indices.to(torch.int32)

    return LogprobsTensors(indices, logprobs, token_ranks)
