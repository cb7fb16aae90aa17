"""Tiny random-weight Llama model for running real vLLM offline on CPU.

This is the project's test/demo model builder.  It writes, into one folder, a
randomly initialised ``transformers`` Llama checkpoint (float32, safetensors)
and a matching tokenizer built with the ``tokenizers`` library (a WordLevel
vocabulary with a whitespace pre-tokenizer, saved as a
``PreTrainedTokenizerFast`` with bos/eos/unk/pad tokens).  Nothing is
downloaded (``HF_HUB_OFFLINE=1`` is set before transformers is imported).

The result is deterministic: the same parameters and seed give the same
weights, so greedy sampling (``temperature=0``) in vLLM gives the same token
ids every run.  Building is idempotent: a marker file (``tiny_model.json``)
records the parameters, and a folder already built with the same parameters
is left alone.

Constraint from vLLM's CPU backend: ``hidden_size / num_heads`` (the head
dimension) must be a head size its CPU attention supports
(``CPU_ATTN_HEAD_SIZES``, as listed by vLLM 0.32's ``cpu_attn`` backend).

Use::

    from demo.tiny_model import build_tiny_llama
    model_dir = build_tiny_llama(tmp_path / "tiny")

or from the command line::

    python demo/tiny_model.py OUTDIR [--seed N] [--vocab-size N] ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

__all__ = ["build_tiny_llama", "MARKER_NAME", "SPECIAL_TOKENS", "CPU_ATTN_HEAD_SIZES"]

#: Name of the marker file written last into a finished model folder.
MARKER_NAME = "tiny_model.json"
#: Bumped when the layout of what this module writes changes.
_FORMAT_VERSION = 1

#: Head sizes vLLM 0.32's CPU attention accepts
#: (``CPUAttentionBackend.get_supported_head_sizes()``); others fail at start-up
#: with "Unsupported CPU attention configuration".
CPU_ATTN_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

#: Special tokens, in vocabulary order (ids 0..3).
SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")
_PAD, _UNK, _BOS, _EOS = SPECIAL_TOKENS

# A fixed pool of plain English words put first in the vocabulary, so that demo
# prompts tokenize to real ids instead of <unk>.  The rest of the vocabulary is
# filled with synthetic words ``w<N>``.
_WORDS = (
    "the of and to a in is it you that he was for on are with as i his they "
    "be at one have this from or had by hot word but what some we can out "
    "other were all there when up use your how said an each she which do "
    "their time if will way about many then them write would like so these "
    "her long make thing see him two has look more day could go come did "
    "number sound no most people my over know water than call first who may "
    "down side been now find any new work part take get place made live "
    "where after back little only round man year came show every good me "
    "give our under name very through just form sentence great think say "
    "help low line differ turn cause much mean before move right boy old too "
    "same tell does set three want air well also play small end put home "
    "read hand port large spell add even land here must big high such follow "
    "act why ask men change went light kind off need house picture try us "
    "again animal point mother world near build self earth father hello "
    "capital france paris future ai is of city country language model tiny "
    "red blue green quick brown fox jumps lazy dog"
).split()


def _vocabulary(vocab_size: int) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    for word in _WORDS:
        if len(vocab) >= vocab_size:
            break
        vocab.setdefault(word, len(vocab))
    n = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"w{n}", len(vocab))
        n += 1
    return vocab


def _params(seed, vocab_size, hidden_size, num_heads, num_layers) -> dict:
    return {
        "format": _FORMAT_VERSION,
        "seed": seed,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_heads": num_heads,
        "num_layers": num_layers,
    }


def _check(vocab_size, hidden_size, num_heads, num_layers) -> None:
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be > {len(SPECIAL_TOKENS)}, got {vocab_size}")
    if num_heads < 1 or num_layers < 1:
        raise ValueError("num_heads and num_layers must be >= 1")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")
    head_dim = hidden_size // num_heads
    if head_dim not in CPU_ATTN_HEAD_SIZES:
        raise ValueError(
            f"head_dim = hidden_size / num_heads = {head_dim}; vLLM's CPU attention "
            f"supports only {CPU_ATTN_HEAD_SIZES}"
        )


def build_tiny_llama(
    path,
    *,
    seed: int = 0,
    vocab_size: int = 1000,
    hidden_size: int = 128,
    num_heads: int = 4,
    num_layers: int = 2,
) -> str:
    """Write a tiny random Llama model and tokenizer into ``path``; return it as str.

    Idempotent: when ``path`` already holds a model built by this function with
    the same parameters (its marker file matches), nothing is written.
    Deterministic: the weights depend only on the parameters and ``seed``.
    """
    _check(vocab_size, hidden_size, num_heads, num_layers)
    out = Path(path).resolve()
    params = _params(seed, vocab_size, hidden_size, num_heads, num_layers)
    marker = out / MARKER_NAME
    try:
        if json.loads(marker.read_text()) == params:
            return str(out)
    except (OSError, ValueError):
        pass

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    if marker.exists():  # different parameters: invalidate before rewriting
        marker.unlink()

    vocab = _vocabulary(vocab_size)
    pad_id, unk_id, bos_id, eos_id = (vocab[t] for t in SPECIAL_TOKENS)

    # --- tokenizer -------------------------------------------------------
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=_UNK))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{_BOS} $A", pair=f"{_BOS} $A {_BOS} $B", special_tokens=[(_BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=_BOS,
        eos_token=_EOS,
        unk_token=_UNK,
        pad_token=_PAD,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))

    # --- model -----------------------------------------------------------
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    # Seed a private generator and initialise every parameter from it in a
    # fixed order: independent of the global RNG state and of how
    # transformers happens to initialise modules in this version.
    gen = torch.Generator().manual_seed(seed)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config)
    model = model.to(torch.float32).eval()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.02)
                # Make the embedding / lm_head clearly non-trivial so that the
                # greedy next token depends on the input.
                if "embed_tokens" in name or "lm_head" in name:
                    p.mul_(10.0)
    model.generation_config.do_sample = False
    model.save_pretrained(str(out), safe_serialization=True)

    # Marker last: its presence means the folder is complete.
    tmp = out / (MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, marker)
    return str(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=1000)
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--num-layers", type=int, default=2)
    a = ap.parse_args(argv)
    print(
        build_tiny_llama(
            a.outdir,
            seed=a.seed,
            vocab_size=a.vocab_size,
            hidden_size=a.hidden_size,
            num_heads=a.num_heads,
            num_layers=a.num_layers,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
