"""The wheel and the installs it makes: real builds, real pip, real venvs."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

from conftest import ROOT, Venv, make_venv

PTH_LINE = (ROOT / "bootstrap" / "importpatch.pth").read_text(encoding="utf-8").strip()
START_LINE = (ROOT / "bootstrap" / "importpatch.start").read_text(encoding="utf-8").strip()


def _wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_wheel_has_bootstrap_files_at_root(built_wheel: Path) -> None:
    names = _wheel_names(built_wheel)
    assert "importpatch.pth" in names
    assert "importpatch.start" in names
    with zipfile.ZipFile(built_wheel) as zf:
        assert zf.read("importpatch.pth").decode().strip() == PTH_LINE
        assert zf.read("importpatch.start").decode().strip() == START_LINE


def test_wheel_ships_builtin_patches_and_package(built_wheel: Path) -> None:
    names = _wheel_names(built_wheel)
    assert "importpatch/__init__.py" in names
    assert any(n.startswith("importpatch/_builtin_patches/") for n in names), names
    # every file of the repo's patches/ folder is there, under its new name
    for src in (ROOT / "patches").rglob("*"):
        if src.is_file() and "__pycache__" not in src.parts:
            rel = src.relative_to(ROOT / "patches").as_posix()
            assert f"importpatch/_builtin_patches/{rel}" in names


def test_wheel_excludes_dev_folders(built_wheel: Path) -> None:
    names = _wheel_names(built_wheel)
    for n in names:
        top = n.split("/", 1)[0]
        assert top not in {"tests", "bench", "demo", "docs", "patches", "bootstrap"}, n
        assert "__pycache__" not in n, n
    tops = {n.split("/", 1)[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert tops - dist_info == {"importpatch", "importpatch.pth", "importpatch.start"}


def test_wheel_metadata(built_wheel: Path) -> None:
    with zipfile.ZipFile(built_wheel) as zf:
        dist_info = next(n.split("/")[0] for n in zf.namelist() if ".dist-info/" in n)
        meta = zf.read(f"{dist_info}/METADATA").decode()
        eps = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert "Name: importpatch-hook" in meta
    assert "Requires-Python: >=3.10" in meta
    assert "importpatch = importpatch.cli:main" in eps
    assert "[vllm.general_plugins]" in eps
    assert "importpatch = importpatch.vllm_plugin:activate" in eps
    assert "[pytest11]" in eps
    assert "importpatch = importpatch.pytest_plugin" in eps


def test_venv_site_packages_has_pth(wheel_venv: Venv) -> None:
    pth = wheel_venv.site_packages / "importpatch.pth"
    assert pth.is_file()
    assert pth.read_text(encoding="utf-8").strip() == PTH_LINE
    assert (wheel_venv.site_packages / "importpatch.start").is_file()
    assert (wheel_venv.site_packages / "importpatch" / "_builtin_patches").is_dir()


def test_venv_basic_commands_work(wheel_venv: Venv) -> None:
    proc = wheel_venv.run("pass")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    proc = wheel_venv.run(["-m", "pip", "--version"])
    assert proc.returncode == 0, proc.stderr
    assert "pip" in proc.stdout


def test_editable_install_puts_pth_in_site_packages(tmp_path: Path) -> None:
    venv = make_venv(tmp_path / "editable-venv", "-e", str(ROOT))
    pth = venv.site_packages / "importpatch.pth"
    assert pth.is_file(), sorted(p.name for p in venv.site_packages.iterdir())
    assert pth.read_text(encoding="utf-8").strip() == PTH_LINE
    assert (venv.site_packages / "importpatch.start").is_file()
    # the package itself is imported from the checkout
    proc = venv.run("import importpatch; print(importpatch.__file__)")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve() == (ROOT / "importpatch" / "__init__.py").resolve()
    # the checkout's path entry is processed before our .pth (sorted names), so
    # `import importpatch._boot` in the .pth can find the package
    path_pths = [
        p.name
        for p in venv.site_packages.glob("*.pth")
        if p.name != "importpatch.pth" and str(ROOT) in p.read_text(encoding="utf-8")
    ]
    assert path_pths and all(name < "importpatch.pth" for name in path_pths), path_pths


def test_finder_installed_exactly_once_when_enabled(wheel_venv: Venv, tmp_path: Path) -> None:
    # A finder exists only while an enabled patch targets something: give it one. The .pth
    # line runs twice in a venv (site.venv and site.main); the second run must not add a finder.
    (tmp_path / "one.py").write_text(
        "from importpatch import Patch\nPatch('one').replace('some_target.mod:f', None)\n"
    )
    proc = wheel_venv.run(
        "import sys; print([type(f).__name__ for f in sys.meta_path])",
        env={
            "IMPORTPATCH_ENABLE": "all",
            "IMPORTPATCH_PATH": str(tmp_path),
            "IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"),
        },
    )
    assert proc.returncode == 0, proc.stderr
    names = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert names.count("PatchFinder") == 1, (names, proc.stderr)


def test_nothing_imported_without_env(wheel_venv: Venv) -> None:
    first = wheel_venv.run("pass")  # finds no patch on by default and writes the stamp
    assert first.returncode == 0 and first.stderr == "", first.stderr
    proc = wheel_venv.run("import sys; print('importpatch' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", (proc.stdout, proc.stderr)
    assert proc.stderr == "", proc.stderr
