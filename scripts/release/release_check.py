"""Build the release artifacts as a release builds them and prove the sdist stands alone.

    python scripts/release/release_check.py [--outdir DIR] [-- PYTEST ARGS]     (``tox -e release``)

1. ``python -m build``: the sdist from the checkout, then the wheel from that sdist alone
   (build unpacks the sdist and builds the wheel there: nothing of the checkout leaks in).
2. ``twine check --strict`` of both (metadata, long description renders).
3. The sdist unpacked into a fresh folder; the sdist-built wheel pip-installed here with its
   ``test`` extra; the sdist's own tests run from that folder against it (``TOX_PACKAGE``
   names the wheel, so the tests' venvs install it too). Default: tests/test_packaging.py (the
   wheel, an editable install of the unpacked sdist, the base install's closure) and the core
   tests of real child processes and landing; pytest arguments after ``--`` replace them. (The
   whole suite runs against a wheel built from the sdist in ``tox -e py310``: this step proves
   the sdist's own tests folder, kept short for CI's time.)

Exit status: the first failing step's, 0 when all pass.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TESTS = ["tests/test_packaging.py", "tests/test_core_processes.py",
                 "tests/test_core_landing.py"]


def run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=cwd, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--outdir", type=Path, help="where the artifacts go (default: temporary)")
    args = parser.parse_args(ours)
    with tempfile.TemporaryDirectory(prefix="importpatch-release-") as tmp:
        dist = (args.outdir or Path(tmp, "dist")).resolve()
        dist.mkdir(parents=True, exist_ok=True)
        for old in [*dist.glob("*.whl"), *dist.glob("*.tar.gz")]:
            old.unlink()
        # without --sdist/--wheel, build makes the sdist and then the wheel from the sdist
        rc = run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)])
        if rc:
            return rc
        (sdist,) = dist.glob("importpatch_hook-*.tar.gz")
        (wheel,) = dist.glob("importpatch_hook-*.whl")
        rc = run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)])
        if rc:
            return rc
        with tarfile.open(sdist) as tf:
            if hasattr(tarfile, "data_filter"):  # 3.10.12+, 3.11.4+: no links out, no devices
                tf.extractall(tmp, filter="data")
            else:
                tf.extractall(tmp)  # noqa: S202 (our own sdist, just built)
        tree = Path(tmp, sdist.name.removesuffix(".tar.gz"))
        rc = run([sys.executable, "-m", "pip", "install", "--quiet", "--force-reinstall",
                  f"importpatch-hook[test] @ {wheel.as_uri()}"])
        if rc:
            return rc
        tests = pytest_args or [
            str(p.relative_to(tree))
            for pattern in DEFAULT_TESTS for p in sorted(tree.glob(pattern))
        ]
        env = {**os.environ, "TOX_PACKAGE": str(wheel)}
        print(f"tests of the sdist ({tree}) against the wheel built from it ({wheel.name})")
        return run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *tests],
                   cwd=tree, env=env)


if __name__ == "__main__":
    sys.exit(main())
