"""A tool-call parser of your own: every answer is a call of the request's first tool, with the
model's text as its argument ``text`` (a model trained to call tools would be parsed here)."""

import json
import os

from vllm.entrypoints.generate.base.protocol import (
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.tool_parsers.abstract_tool_parser import ToolParser


class EchoToolParser(ToolParser):
    def __init__(self, tokenizer, *args, **kwargs):
        super().__init__(tokenizer, *args, **kwargs)
        print(f"EchoToolParser made in process {os.getpid()}", flush=True)

    def extract_tool_calls(self, model_output, request):
        if not request.tools:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[],
                                                content=model_output)
        name = request.tools[0].function.name
        call = FunctionCall(name=name, arguments=json.dumps({"text": model_output}))
        return ExtractedToolCallInformation(tools_called=True, tool_calls=[ToolCall(function=call)],
                                            content=None)
