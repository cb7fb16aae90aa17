from importpatch import Patch

patch = Patch("my-tool-parser", requires="vllm>=0.30",
              doc="vLLM knows the tool-call parser echo-tool (docs/examples/myparsers)")


# vllm.tool_parsers registers vLLM's own parsers by name, and `vllm serve` checks
# --tool-call-parser against that table before it loads the model: ours joins it in every
# process, right after the package ran; vLLM imports our class only where it makes a parser.
@patch.after_import("vllm.tool_parsers")
def register(tool_parsers):
    tool_parsers.ToolParserManager.register_lazy_module(
        "echo-tool", "myparsers.echo_tool", "EchoToolParser")
