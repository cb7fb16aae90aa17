from importpatch import Patch

patch = Patch("my-reasoner", requires="vllm>=0.30",
              doc="vLLM knows the reasoning parser my-reasoner (docs/examples/myparsers)")


# vllm.reasoning registers vLLM's own parsers by name; ours joins them in every process, right
# after that package ran, and vLLM imports our class only where it makes a parser.
@patch.after_import("vllm.reasoning")
def register(reasoning):
    reasoning.ReasoningParserManager.register_lazy_module(
        "my-reasoner", "myparsers.reasoner", "MyReasoner")
