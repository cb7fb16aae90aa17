"""Run every benchmark, print one markdown table, and write bench/results.json.

    python bench/run_all.py                 # all, default repetitions (~5-10 min here)
    python bench/run_all.py --scale 0.3     # fewer repetitions, a quick look
    python bench/run_all.py --only startup,calls
    python bench/run_all.py --json -        # the table only

See bench/README.md for the method. Progress goes to stderr, the table to stdout. The figures
with a numeric goal go into the JSON (scripts/release/gen_figures.py draws
docs/img/benchmarks.svg from it): those of the benchmarks run replace theirs; the others
(measured by other scripts) stay, each with the date it was measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import call_overhead  # noqa: E402
import large_module  # noqa: E402
import startup  # noqa: E402
import torch_import  # noqa: E402
from _common import ROUNDS, Row, log, table  # noqa: E402

BENCHES = {
    "startup": startup,
    "torch": torch_import,
    "large": large_module,
    "calls": call_overhead,
}
RESULTS = Path(__file__).resolve().parent / "results.json"
ABOUT = (
    "The figures of docs/benchmarks.md that have a numeric goal, one per row: value against goal "
    "(direction max: value must be at most goal; min: at least). kind ratio: a ratio of medians "
    "A/B, judged on its overhead (value - 1 against goal - 1). met: yes, no, or noise (over the "
    "goal but within the run-to-run noise). Written by bench/run_all.py ('run' says how), which "
    "replaces the figures of the benchmarks it ran and keeps the others, each with its source "
    "and the date it was measured; scripts/release/gen_figures.py draws "
    "docs/img/benchmarks.svg from it."
)


def source(name: str) -> str:
    return f"bench/{BENCHES[name].__name__}.py"


def results(measured: list[tuple[str, Row]], ran: list[str], run: dict[str, Any],
            previous: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON: the figures of ``measured`` (benchmark name, row) and, from ``previous``, those
    of the benchmarks not ``ran``; in the previous order, new figures after their source's."""
    date = run["date"]
    new: dict[str, list[dict[str, Any]]] = {}
    for name, row in measured:
        for f in row.figures:
            entry = {k: v for k, v in asdict(f).items() if k != "noise"}
            new.setdefault(source(name), []).append(
                dict(entry, met=f.met(), source=source(name), measured=date))
    replaced = {source(n) for n in ran}
    figures: list[dict[str, Any]] = []
    old = previous or {}
    for f in old.get("figures", []):
        if f["source"] in replaced:
            figures += new.pop(f["source"], [])  # at the place of the first figure it replaces
        else:
            figures.append(dict(f, measured=f.get("measured") or old.get("measured", "")))
    for entries in new.values():
        figures += entries
    return {"schema": 1, "about": ABOUT, "measured": f"{date}, {run['command']}", "run": run,
            "figures": figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="repetitions multiplier")
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated subset")
    parser.add_argument("--json", default=str(RESULTS),
                        help="where to write the results (default bench/results.json; - : none)")
    args = parser.parse_args()
    ran = args.only.split(",")
    measured: list[tuple[str, Row]] = []
    started = time.time()
    for name in ran:
        log(f"== {name}")
        measured += [(name, row) for row in BENCHES[name].run(args.scale)]
    rows = [row for _, row in measured]
    seconds = time.time() - started
    load = os.getloadavg()
    print(f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {load[0]:.1f}; {seconds:.0f} s; "
          f"scale {args.scale}. Medians of interleaved runs; A and B measured side by side.\n")
    print(table(rows))
    missed = [r.what for r in rows if r.met is False]
    if missed:
        print("\nGoals not met: " + "; ".join(missed))
    if args.json != "-":
        path = Path(args.json)
        argv = " ".join(sys.argv[1:])
        run = {
            "command": f"python bench/run_all.py {argv}".strip(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "benchmarks": ran, "scale": args.scale, "rounds": dict(ROUNDS),
            "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "load_average_at_end": [round(x, 1) for x in load],
            "seconds": round(seconds),
        }
        previous = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
        data = results(measured, ran, run, previous)
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
