"""Two requests, one engine: the first bans token 147 through the patched SamplingParams field.

    VLLM_CPU_KVCACHE_SPACE=1 IMPORTPATCH_PATH=docs/examples/patches \
    IMPORTPATCH_ENABLE=per-request-banned-tokens python docs/examples/per_request.py MODEL
"""

import json
import sys

from vllm import LLM, SamplingParams

if __name__ == "__main__":  # vLLM spawns its EngineCore and Worker: they import this file
    llm = LLM(model=sys.argv[1], enforce_eager=True, dtype="float32", max_model_len=256)
    prompt = "the capital of france is"
    banned = SamplingParams(temperature=0, max_tokens=6, banned_token_ids=[147])
    plain = SamplingParams(temperature=0, max_tokens=6)
    outs = llm.generate([prompt, prompt], [banned, plain], use_tqdm=False)
    print(json.dumps([list(o.outputs[0].token_ids) for o in outs]))
