"""The licences of everything ``pip install importpatch-hook`` installs: none may be copyleft.

    python scripts/release/licenses.py [WHEEL]      (default: $TOX_PACKAGE, the wheel tox built)

Installs WHEEL, with pip's ordinary resolution from the configured index, into a fresh venv
made *without pip*, so that the venv holds exactly the base install's dependency closure
(importpatch-hook, packaging, wrapt, ...) and nothing of the tools; then ``pip-licenses
--python`` reads every distribution in it (``--with-system``: none left out) and fails on
GPL, LGPL, AGPL (any "General Public License") and on a licence it cannot read (UNKNOWN: a
closure we cannot vouch for). A control run installs the ``rebase`` extra (merge3,
GPL-2.0-or-later) into a second venv and requires the same check to fail there, so a check that
no longer sees licences cannot pass silently. Exit status 0 clean, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FAIL_ON = "GPL;LGPL;AGPL;General Public License;UNKNOWN"


def venv_with(folder: Path, requirement: str) -> Path:
    """A venv without pip at ``folder`` holding ``requirement`` and its closure; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--quiet", "--no-input", requirement], check=True)
    return python


def licences(python: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["pip-licenses", "--python", str(python), "--with-system",
                           "--from", "mixed", *extra], capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel", nargs="?", type=Path, help="default: $TOX_PACKAGE")
    args = parser.parse_args(argv)
    given = args.wheel or next((Path(p) for p in os.environ.get("TOX_PACKAGE", "").split(
        os.pathsep) if p.endswith(".whl")), None)
    if given is None:
        parser.error("no WHEEL given and no wheel in $TOX_PACKAGE")
    wheel = given.resolve()
    with tempfile.TemporaryDirectory(prefix="importpatch-licenses-") as tmp:
        base = venv_with(Path(tmp, "base"), str(wheel))
        table = licences(base, "--format", "markdown")
        print(f"pip install {wheel.name} (base install, whole closure):\n{table.stdout}")
        verdict = licences(base, "--partial-match", f"--fail-on={FAIL_ON}")
        if verdict.returncode != 0:
            print(f"FAIL: {verdict.stdout}{verdict.stderr}".strip(), file=sys.stderr)
            return 1
        control = venv_with(Path(tmp, "rebase"), f"importpatch-hook[rebase] @ {wheel.as_uri()}")
        seen = licences(control, "--partial-match", f"--fail-on={FAIL_ON}")
        if seen.returncode == 0 or "merge3" not in seen.stdout + seen.stderr:
            print("FAIL: the control install with the rebase extra (merge3, GPL-2.0-or-later) "
                  f"passed the check: it no longer sees licences\n{seen.stdout}{seen.stderr}",
                  file=sys.stderr)
            return 1
        print(f"OK: no {FAIL_ON.replace(';', ', ')} in the base install; the control with the "
              f"rebase extra is refused ({(seen.stdout + seen.stderr).strip()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
