# my_patches/hello.py
import importpatch
from importpatch import Patch

patch = Patch("hello-sampler", doc="print the shape of every batch of logits sampled")

@patch.wrap("vllm.v1.sample.sampler:Sampler.forward")
def forward(wrapped, instance, args, kwargs):          # wrapt's signature
    # vLLM calls self.sampler(logits=..., sampling_metadata=...): by keyword, so not args[0]
    logits = importpatch.bind(wrapped, args, kwargs).arguments["logits"]
    print("sampling logits", tuple(logits.shape), flush=True)
    return wrapped(*args, **kwargs)
