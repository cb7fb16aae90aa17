"""Launchers that clear the environment (docs/deployment.md has a recipe for each): the toggles
reach the started interpreter only when passed on, in either spelling (IMPORTPATCH_* or
VLLM_IMPORTPATCH_*), and the post's VLLM_CUSTOM_PATCHES like them.

Real ``env -i`` and real ``sudo`` run the project's wheel venv; a throwaway target stands in for
vLLM (what is tested is what reaches the interpreter, not what it patches). sudo is not on every
machine: ``.ci/run`` installs it (apt-get) so CI always runs these; elsewhere they skip, saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from conftest import clean_env
from coreutil import Lab

TARGET = {"tpkg/__init__.py": "", "tpkg/mod.py": "def f():\n    return 'orig'\n"}
PATCH = {"ours.py": '''
    from importpatch import Patch
    Patch("ours").replace("tpkg.mod:f", lambda: "patched")
    '''}
READ = "import tpkg.mod; print(tpkg.mod.f())"


pytestmark = pytest.mark.lab(target=TARGET, patch=PATCH)


def toggles(lab: Lab, prefix: str = "") -> dict[str, str]:
    return {
        f"{prefix}IMPORTPATCH_ENABLE": "ours",
        f"{prefix}IMPORTPATCH_PATH": str(lab.patches),
        f"{prefix}IMPORTPATCH_CACHE_DIR": str(lab.cache),
    }


def run(argv: list[str], env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("prefix", ["", "VLLM_"])
def test_env_i_starts_clean_so_the_toggles_go_on_its_command_line(lab: Lab, prefix: str) -> None:
    python = str(lab.venv.python)
    base = [f"PYTHONPATH={lab.targets}", f"HOME={lab.root}"]
    outer = clean_env(toggles(lab, prefix))  # set in the caller: env -i drops them
    assert run(["env", "-i", *base, python, "-c", READ], env=outer) == "orig"
    passed = [f"{k}={v}" for k, v in toggles(lab, prefix).items()]
    assert run(["env", "-i", *base, *passed, python, "-c", READ]) == "patched"


def sudo() -> str:
    """sudo, usable without a password; CI (.ci/run sets CI) must have it, elsewhere skip."""
    path = shutil.which("sudo")
    why = "sudo is not installed (apt-get install sudo)" if path is None else ""
    if path is not None:
        probe = subprocess.run([path, "-n", "true"], capture_output=True, text=True)
        why = f"sudo -n is refused: {probe.stderr.strip()}" if probe.returncode else ""
    if why and os.environ.get("CI"):
        pytest.fail(f"{why}; CI must run this test (.ci/run installs sudo as root)")
    if why:
        pytest.skip(f"{why}; CI installs it and runs this test")
    assert path is not None
    return path


@pytest.mark.parametrize("prefix", ["", "VLLM_"])
def test_sudo_resets_the_environment_and_preserve_env_passes_the_toggles(
    lab: Lab, prefix: str
) -> None:
    sudo_path = sudo()
    python = str(lab.venv.python)
    env = clean_env({**toggles(lab, prefix), "PYTHONPATH": str(lab.targets)})
    # Plain sudo: env_reset drops them (PYTHONPATH too), so nothing is patched.
    plain = [sudo_path, "-n", python, "-c", f"import sys; sys.path.insert(0, {str(lab.targets)!r})"
             f"; {READ}"]
    assert run(plain, env=env) == "orig"
    names = ",".join([*toggles(lab, prefix), "PYTHONPATH"])
    assert run([sudo_path, "-n", f"--preserve-env={names}", python, "-c", READ], env=env) == (
        "patched"
    )


def test_sudo_preserve_env_passes_the_posts_variable_too(lab: Lab) -> None:
    sudo_path = sudo()
    (lab.patches / "ours.py").write_text(
        "from importpatch import Patch\n"
        "Patch('Ours').replace('tpkg.mod:f', lambda: 'patched')\n"
    )
    env = clean_env({"VLLM_CUSTOM_PATCHES": "Ours", "PYTHONPATH": str(lab.targets),
                     "IMPORTPATCH_PATH": str(lab.patches), "IMPORTPATCH_CACHE_DIR": str(lab.cache)})
    names = "VLLM_CUSTOM_PATCHES,IMPORTPATCH_PATH,IMPORTPATCH_CACHE_DIR,PYTHONPATH"
    argv = [sudo_path, "-n", f"--preserve-env={names}", str(lab.venv.python), "-c", READ]
    assert run(argv, env=env) == "patched"
