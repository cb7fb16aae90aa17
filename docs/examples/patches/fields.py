from importpatch import Patch

patch = Patch("my-fields", doc="a SamplingParams field; fields of a dataclass and an Enum")

patch.field("vllm.sampling_params:SamplingParams.banned_token_ids", "list[int] | None", None)
patch.field("mypkg.config:Settings.retries", "int", 3)
patch.field("mypkg.colors:Color.PURPLE", None, 5)      # no annotation: an Enum member
patch.field("mypkg.config:Settings.timeout", default=30.0, existing=True)  # change a default
