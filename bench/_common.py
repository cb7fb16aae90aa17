"""Shared machinery of the benchmarks: real venvs, child processes, interleaved A/B timing.

Method (every benchmark): the variants being compared run *interleaved* (A B C, B C A, ...) for
``reps`` rounds in one run, each sample in a fresh child process unless stated; the table shows
medians and the ratio (or difference) of the medians. Absolute times depend on the machine; the
ratios are the result. Venvs live under ``$IMPORTPATCH_BENCH_DIR`` (default
``<tmp>/importpatch-bench``) and are reused while the project's sources are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(
    os.environ.get("IMPORTPATCH_BENCH_DIR") or Path(tempfile.gettempdir()) / "importpatch-bench"
)
VLLM_PYTHON = Path("/work/venvs/vllm/bin/python")


def clean_env(extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """os.environ without IMPORTPATCH_*, PYTHONPATH and PYTHONDONTWRITEBYTECODE, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("IMPORTPATCH_", "VLLM_IMPORTPATCH_"))
        and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
    }
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _sources_digest() -> str:
    h = hashlib.sha256()
    for path in sorted([*ROOT.glob("importpatch/**/*.py"), *ROOT.glob("bootstrap/*"),
                        ROOT / "pyproject.toml", ROOT / "hatch_build.py"]):
        h.update(str(path.relative_to(ROOT)).encode() + path.read_bytes())
    return h.hexdigest()[:16]


def project_wheel() -> Path:
    """The project wheel, built from the checkout (cached by a digest of its sources)."""
    out = BENCH_DIR / "wheel" / _sources_digest()
    wheels = sorted(out.glob("importpatch_hook-*.whl"))
    if wheels:
        return wheels[0]
    out.mkdir(parents=True, exist_ok=True)
    try:
        import build  # noqa: F401

        cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)]
    except ImportError:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(ROOT)]
    subprocess.run(cmd, check=True, capture_output=True, env=clean_env())
    return sorted(out.glob("importpatch_hook-*.whl"))[0]


@dataclass
class Venv:
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def run(self, code: str, env: Mapping[str, str | None] | None = None,
            args: Sequence[str] = ()) -> str:
        proc = subprocess.run([str(self.python), "-c", code, *args], env=clean_env(env),
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.python} -c ... failed:\n{proc.stderr}")
        return proc.stdout


def venv(name: str, *pip_args: str, wheel: Path | None = None) -> Venv:
    """A venv with ``pip_args`` installed once, and the project ``wheel`` (re)installed when it
    changed. ``wheel=None``: the project is not installed there."""
    path = BENCH_DIR / "venvs" / name
    marker = path / ".bench-installed"
    wanted = json.dumps(list(pip_args))
    if not marker.exists() or json.loads(marker.read_text())["args"] != wanted:
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, env=clean_env())
        if pip_args:
            _pip(path, "install", "-q", *pip_args)
        marker.write_text(json.dumps({"args": wanted, "wheel": None}))
    state = json.loads(marker.read_text())
    have = state["wheel"]
    if wheel is not None and have != str(wheel):
        _pip(path, "install", "-q", "--no-deps", "--force-reinstall", str(wheel))
    elif wheel is None and have is not None:
        _pip(path, "uninstall", "-q", "-y", "importpatch-hook")
    state["wheel"] = None if wheel is None else str(wheel)
    marker.write_text(json.dumps(state))
    return Venv(path)


def _pip(path: Path, *args: str) -> None:
    subprocess.run([str(path / "bin" / "python"), "-m", "pip", "--disable-pip-version-check",
                    *args], check=True, env=clean_env(), capture_output=True, timeout=1800)


def spawn(cmd: Sequence[str], env: Mapping[str, str]) -> dict[str, float]:
    """Wall seconds and the child's CPU seconds (user + system) of one child process."""
    with tempfile.TemporaryFile() as errf:  # a file, not a pipe: wait4 must not block on it
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(cmd), env=dict(env), stdout=subprocess.DEVNULL, stderr=errf)
        _, status, usage = os.wait4(proc.pid, 0)  # wait4: the child's own CPU time too
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        errf.seek(0)
        err = errf.read()
    if proc.returncode != 0 or err:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}):\n{err.decode()}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime}


def measure(child: str, env: Mapping[str, str], python: Path, *args: str) -> dict[str, float]:
    """Run ``child`` code (with ``args``) that prints a JSON dict of numbers; return it."""
    proc = subprocess.run([str(python), "-c", child, *args], env=dict(env), capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0 or proc.stderr:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr}")
    out: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def interleave(variants: Mapping[str, Callable[[], Mapping[str, float]]], reps: int,
               warmup: int = 1) -> dict[str, dict[str, list[float]]]:
    """Run every variant ``reps`` times, rotating the order each round; per variant, per metric,
    the list of samples. ``warmup`` rounds are run first and dropped."""
    names = list(variants)
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for r in range(warmup + reps):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            result = variants[name]()
            if r >= warmup:
                for metric, value in result.items():
                    samples[name].setdefault(metric, []).append(value)
    return samples


ROUNDS: dict[str, int] = {}  # what each benchmark ran, by name: bench/results.json records it


def rounds(name: str, default: int, least: int, scale: float) -> int:
    """``default`` rounds times ``scale``, at least ``least``; recorded in ROUNDS under ``name``."""
    ROUNDS[name] = n = max(least, int(default * scale))
    return n


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


@dataclass
class Figure:
    """A row's figure with a numeric goal, as ``bench/results.json`` keeps it (one entry of its
    ``figures``; scripts/release/gen_figures.py draws them). ``kind`` "ratio": a ratio of
    medians, judged on its overhead; "absolute": a number in ``unit``. ``direction`` "max": the
    value must be at most ``goal``; "min": at least. ``noise``: how far over the goal still counts
    as noise."""

    label: str
    kind: str
    value: float
    goal: float
    direction: str = "max"
    unit: str = ""
    noise: float = 0.0  # over the goal by at most this: "noise", not "no"

    def met(self) -> str:
        over = self.value - self.goal if self.direction == "max" else self.goal - self.value
        return "yes" if over <= 0 else "noise" if over <= self.noise else "no"


@dataclass
class Row:
    """One line of the results table."""

    what: str
    a: str  # "label: value"
    b: str
    result: str
    goal: str
    met: bool | None  # None: report only
    notes: list[str] = field(default_factory=list)
    # where the goal is numeric: the figure(s) that go into bench/results.json
    figures: list[Figure] = field(default_factory=list)


def instructions(cmd: Sequence[str], env: Mapping[str, str], runs: int = 1) -> int | None:
    """Instructions ``cmd`` executes (valgrind's callgrind, ``I refs``; the median of ``runs``),
    with a fixed hash seed so dict and set layouts repeat from run to run: deterministic to about
    100k instructions a process, so load does not move it. None without valgrind."""
    import re

    if shutil.which("valgrind") is None:
        return None
    counts = []
    for _ in range(runs):
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd],
            env=dict(env, PYTHONHASHSEED="0"), capture_output=True, text=True, check=True,
            timeout=1800)
        m = re.search(r"refs:\s*([\d,]+)", proc.stderr)
        if m is None:
            return None
        counts.append(int(m.group(1).replace(",", "")))
    return sorted(counts)[len(counts) // 2]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| measurement | A | B | result | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        met = "report" if r.met is None else ("yes" if r.met else "**no**")
        lines.append(f"| {r.what} | {r.a} | {r.b} | {r.result} | {r.goal} | {met} |")
    return "\n".join(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
