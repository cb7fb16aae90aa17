"""LLM(..., reasoning_parser="my-reasoner"): a structured output through the parser.

    python docs/examples/reason.py MODEL_DIR
"""

import sys

from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams

if __name__ == "__main__":  # (vLLM spawns its processes)
    llm = LLM(model=sys.argv[1], reasoning_parser="my-reasoner", enforce_eager=True,
              dtype="float32", max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=4,
                            structured_outputs=StructuredOutputsParams(choice=["paris", "france"]))
    (out,) = llm.generate(["the capital of france is"], params, use_tqdm=False)
    print(f"answer: {out.outputs[0].text}")
