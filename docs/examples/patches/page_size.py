from importpatch import Patch

patch = Patch("my-page-size", doc="full-attention KV pages of twice the size")

@patch.subclass("vllm.v1.kv_cache_interface:FullAttentionSpec")
def full_attention_spec(Original):                     # the frozen dataclass, as the module made it
    class FullAttentionSpec(Original):
        @property
        def page_size_bytes(self):
            return 2 * super().page_size_bytes
    return FullAttentionSpec       # MLAAttentionSpec, further down the module, derives from it
