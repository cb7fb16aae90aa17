"""Run real vLLM (offline ``LLM``, default multiprocess mode) on the tiny model; print one JSON line.

Used by the demo, the end-to-end tests and the start-up benchmark. Patches are switched on by the
environment only (``IMPORTPATCH_ENABLE``...): this script contains no patching code, which is the
point — a user's program does not change either.

    python demo/generate.py --model DIR [--max-tokens 8] [--priorities 3,1,4] [--blocker]
        [--max-num-seqs N] [--prompt TEXT ...]

Prints ``RESULT: {"pid": ..., "tokens": [[...]], "texts": [...], "ready_s": ..., "first_token_s": ...}``.
``--blocker`` submits one long request first (so that the engine is busy while the others arrive:
the order in which they are then scheduled is the scheduler's choice, not arrival order).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

PROMPTS = [
    "the capital of france is",
    "hello world my name is",
    "the quick brown fox jumps over the lazy dog",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--prompt", action="append", dest="prompts")
    ap.add_argument("--priorities", default="")
    ap.add_argument("--blocker", action="store_true")
    ap.add_argument("--max-num-seqs", type=int, default=None)
    args = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    t0 = time.monotonic()
    from vllm import LLM, SamplingParams

    extra = {"max_num_seqs": args.max_num_seqs} if args.max_num_seqs else {}
    llm = LLM(
        model=args.model, enforce_eager=True, dtype="float32", max_model_len=256,
        disable_log_stats=False, **extra,
    )
    t_ready = time.monotonic()
    prompts = args.prompts or PROMPTS
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    priorities = [int(p) for p in args.priorities.split(",") if p.strip()] or None
    if args.blocker:
        # Keep the engine busy with one long request; the rest queue up behind it.
        engine = llm.llm_engine
        engine.add_request(
            "blocker", "the blocker request", SamplingParams(temperature=0, max_tokens=48,
                                                            ignore_eos=True), priority=-100,
        )
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params, priority=(priorities or [0] * 99)[i])
        finished: dict[str, list[int]] = {}
        texts: dict[str, str] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = list(out.outputs[0].token_ids)
                    texts[out.request_id] = out.outputs[0].text
        tokens = [finished[str(i)] for i in range(len(prompts))]
        text_list = [texts[str(i)] for i in range(len(prompts))]
    else:
        outs = llm.generate(prompts, params, use_tqdm=False, priority=priorities)
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        text_list = [o.outputs[0].text for o in outs]
    t_done = time.monotonic()
    result = {
        "pid": os.getpid(),
        "tokens": tokens,
        "texts": text_list,
        "ready_s": round(t_ready - t0, 3),
        "first_token_s": round(t_done - t0, 3),
    }
    print("RESULT: " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":  # vLLM spawns its processes: the guard is required
    sys.exit(main())
