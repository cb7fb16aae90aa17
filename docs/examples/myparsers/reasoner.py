"""A reasoning parser of your own: the model's whole answer is content (no reasoning)."""

import os

from vllm.reasoning import ReasoningParser


class MyReasoner(ReasoningParser):
    def __init__(self, tokenizer, *args, **kwargs):
        super().__init__(tokenizer, *args, **kwargs)
        print(f"MyReasoner made in process {os.getpid()}", flush=True)

    def is_reasoning_end(self, input_ids):
        return True  # no reasoning: a structured output's grammar applies from the first token

    def extract_content_ids(self, input_ids):
        return input_ids

    def extract_reasoning(self, model_output, request):
        return None, model_output

    def extract_reasoning_streaming(self, previous_text, current_text, delta_text,
                                    previous_token_ids, current_token_ids, delta_token_ids):
        return None
