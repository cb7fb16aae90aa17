# my_patches/priority.py   (a folder in IMPORTPATCH_PATH, or a module of a patch package)
from importpatch import Patch

patch = Patch(
    "my-priority",                 # the name IMPORTPATCH_ENABLE uses
    requires="vllm>=0.30,<0.40",   # PEP 440, on a distribution *or* import package
    default=False,                 # True: on after pip install, no variable needed
    on_error="fail",               # or "warn": log and import the module unpatched
    doc="waiting requests with a lower priority value are scheduled first",
)

@patch.add("vllm.v1.core.sched.scheduler:Scheduler.order_waiting")
def order_waiting(self):                               # a new method (must not exist yet)
    if len(self.waiting) > 1 and hasattr(self.waiting, "extend"):  # the fcfs queue
        ordered = sorted(self.waiting, key=lambda r: (r.priority, r.arrival_time))
        self.waiting.clear()
        self.waiting.extend(ordered)

@patch.wrap("vllm.v1.core.sched.scheduler:Scheduler.schedule")
def schedule(wrapped, instance, args, kwargs):         # wrapt's signature
    instance.order_waiting()
    return wrapped(*args, **kwargs)

@patch.replace("vllm.v1.core.sched.scheduler:Scheduler.get_kv_cache_usage")
def get_kv_cache_usage(self):                          # stands in for the original method
    return round(self.kv_cache_manager.usage, 4)

@patch.wrap("vllm.v1.core.kv_cache_utils:resolve_kv_cache_block_sizes")
def log(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    print("KV cache block sizes", result, flush=True)
    return result

patch.replace("vllm.v1.engine.core:HANDSHAKE_TIMEOUT_MINS", 10)  # plain values too

@patch.transform("vllm.v1.sample.sampler")
def edit(tree):                                        # an AST transform: ast.Module -> ast.Module
    import ast
    for node in tree.body:                             # _SAMPLING_EPS = 1e-5 -> 1e-6
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["_SAMPLING_EPS"]:
            node.value = ast.Constant(1e-6)
    return tree
