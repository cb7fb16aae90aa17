from importpatch import Patch

patch = Patch("my-model", requires="vllm>=0.30",
              doc="vLLM serves the architecture MyLlamaForCausalLM (docs/examples/mymodels)")


# In every process that imports vLLM's model registry (LLM() or the API server, the EngineCore,
# the Worker, the registry's own inspection subprocess), right after the module ran: before any
# code of vLLM reads the registry or copies it. The class is given by name, so vLLM imports it
# only where a model of it is built.
@patch.after_import("vllm.model_executor.models.registry")
def register(registry):
    registry.ModelRegistry.register_model(
        "MyLlamaForCausalLM", "mymodels.my_llama:MyLlamaForCausalLM")
