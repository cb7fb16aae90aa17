"""Run every benchmark and print one markdown table (paste it into docs/benchmarks.md).

    python bench/run_all.py                 # all, default repetitions (~5-10 min here)
    python bench/run_all.py --scale 0.3     # fewer repetitions, a quick look
    python bench/run_all.py --only startup,calls

See bench/README.md for the method. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import call_overhead  # noqa: E402
import large_module  # noqa: E402
import startup  # noqa: E402
import torch_import  # noqa: E402
from _common import Row, log, table  # noqa: E402

BENCHES = {
    "startup": startup.run,
    "torch": torch_import.run,
    "large": large_module.run,
    "calls": call_overhead.run,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="repetitions multiplier")
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated subset")
    args = parser.parse_args()
    rows: list[Row] = []
    started = time.time()
    for name in args.only.split(","):
        log(f"== {name}")
        rows.extend(BENCHES[name](args.scale))
    print(f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}; {time.time() - started:.0f} s; "
          f"scale {args.scale}. Medians of interleaved runs; A and B measured side by side.\n")
    print(table(rows))
    missed = [r.what for r in rows if r.met is False]
    if missed:
        print("\nGoals not met: " + "; ".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
