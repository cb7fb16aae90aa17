"""An architecture of your own: vLLM's Llama, saying where it is built."""

import os

from vllm.model_executor.models.llama import LlamaForCausalLM


class MyLlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix=""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        print(f"MyLlamaForCausalLM built in process {os.getpid()}", flush=True)
