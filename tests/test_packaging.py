"""The wheel and the installs it makes: real builds, real pip, real venvs."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import PIP_TIMEOUT, ROOT, Venv, clean_env, make_venv

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
    assert "importpatch = importpatch.tools.cli:main" in eps
    assert "[vllm.general_plugins]" in eps
    assert "importpatch = importpatch.integrations.vllm_plugin:activate" in eps
    assert "[pytest11]" in eps
    assert "importpatch = importpatch.tools.pytest_plugin" in eps


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


# -- Release artifacts: licence, typing marker, one version, the base install's closure ---------


def _version_in_package() -> str:
    """``__version__`` as importpatch/_version.py states it (the version's one source)."""
    tree = ast.parse((ROOT / "importpatch" / "_version.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [
            "__version__"
        ]:
            return str(ast.literal_eval(node.value))
    raise AssertionError("no __version__ = ... in importpatch/_version.py")


def _metadata_fields(text: str) -> dict[str, list[str]]:
    """The header fields of a METADATA / PKG-INFO file (before the description)."""
    fields: dict[str, list[str]] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(": ")
        if sep and not line.startswith(" "):
            fields.setdefault(key, []).append(value)
    return fields


def _wheel_metadata(wheel: Path) -> tuple[str, zipfile.ZipFile]:
    zf = zipfile.ZipFile(wheel)
    dist_info = next(n.split("/")[0] for n in zf.namelist() if ".dist-info/" in n)
    return dist_info, zf


@pytest.fixture(scope="module")
def built_sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's sdist, built from ROOT as a release builds it."""
    outdir = tmp_path_factory.mktemp("sdist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(outdir), str(ROOT)],
        env=clean_env(), capture_output=True, text=True, timeout=PIP_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (sdist,) = outdir.glob("importpatch_hook-*.tar.gz")
    return sdist


def test_wheel_carries_license_and_spdx_metadata(built_wheel: Path) -> None:
    dist_info, zf = _wheel_metadata(built_wheel)
    with zf:
        fields = _metadata_fields(zf.read(f"{dist_info}/METADATA").decode())
        license_text = zf.read(f"{dist_info}/licenses/LICENSE").decode()
    assert license_text == (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert fields["License-Expression"] == ["Apache-2.0"]
    assert fields["License-File"] == ["LICENSE"]
    # PEP 639: an SPDX expression, never a licence classifier beside it
    assert not [c for c in fields.get("Classifier", []) if c.startswith("License ::")]


def test_sdist_carries_license_changelog_and_metadata(built_sdist: Path) -> None:
    with tarfile.open(built_sdist) as tf:
        top = tf.getnames()[0].split("/")[0]
        names = set(tf.getnames())
        license_file = tf.extractfile(f"{top}/LICENSE")
        pkg_info = tf.extractfile(f"{top}/PKG-INFO")
        assert license_file is not None and pkg_info is not None
        license_text = license_file.read().decode()
        fields = _metadata_fields(pkg_info.read().decode())
    assert license_text == (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert f"{top}/CHANGELOG.md" in names
    assert f"{top}/importpatch/py.typed" in names
    assert fields["License-Expression"] == ["Apache-2.0"]
    assert fields["License-File"] == ["LICENSE"]
    assert fields["Version"] == [_version_in_package()]
    assert top == f"importpatch_hook-{_version_in_package()}"


def test_wheel_is_typed_versioned_and_described(built_wheel: Path) -> None:
    dist_info, zf = _wheel_metadata(built_wheel)
    with zf:
        names = zf.namelist()
        fields = _metadata_fields(zf.read(f"{dist_info}/METADATA").decode())
    assert "importpatch/py.typed" in names  # PEP 561: mypy reads the package's annotations
    assert "Typing :: Typed" in fields["Classifier"]
    # one source for the version: the package's __version__, which the wheel's metadata repeats
    assert fields["Version"] == [_version_in_package()]
    assert dist_info == f"importpatch_hook-{_version_in_package()}.dist-info"
    # no project URLs until a public repository exists: none may point to a placeholder
    assert "Project-URL" not in fields, fields.get("Project-URL")
    assert fields["Description-Content-Type"] == ["text/markdown"]


def test_version_has_one_source(wheel_venv: Venv) -> None:
    # pyproject.toml states no version of its own: the build reads the package's __version__
    project = (ROOT / "pyproject.toml").read_text(encoding="utf-8").split("\n[project]\n")[1]
    project = project.split("\n[", 1)[0]
    assert not [line for line in project.splitlines() if line.startswith("version")], project
    assert 'dynamic = ["version"]' in project
    proc = wheel_venv.run(
        "import importlib.metadata as m, importpatch\n"
        "print(m.version('importpatch-hook'), importpatch.__version__)"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [_version_in_package()] * 2


def test_base_install_closure_has_no_merge3(wheel_venv: Venv) -> None:
    """`pip install importpatch-hook` brings only permissively licensed code: merge3 (GPL) is the
    ``rebase`` extra, outside the closure of the base install's requirements."""
    code = (
        "import importlib.metadata as m, json\n"
        "from packaging.requirements import Requirement\n"
        "seen, todo = set(), ['importpatch-hook']\n"
        "extras = {}\n"
        "while todo:\n"
        "    name = todo.pop()\n"
        "    if name in seen: continue\n"
        "    seen.add(name)\n"
        "    for r in map(Requirement, m.requires(name) or []):\n"
        "        if r.marker is None or r.marker.evaluate({'extra': ''}):\n"
        "            todo.append(r.name.lower().replace('_', '-'))\n"
        "        elif name == 'importpatch-hook':\n"
        "            extras.setdefault(r.name, []).append(str(r.marker))\n"
        "print(json.dumps([sorted(seen), extras]))\n"
    )
    proc = wheel_venv.run(code)
    assert proc.returncode == 0, proc.stderr
    closure, extras = json.loads(proc.stdout)
    assert closure == ["importpatch-hook", "packaging", "wrapt"], closure
    assert extras["merge3"] == ['extra == "rebase"', 'extra == "test"'], extras
    proc = wheel_venv.run("import merge3")
    assert proc.returncode == 1 and "No module named 'merge3'" in proc.stderr, proc.stderr


def test_rebase_without_merge3_prints_the_install_command(wheel_venv: Venv, tmp_path: Path) -> None:
    """The base install's ``importpatch rebase`` refuses before anything else (even an unknown
    patch name) with exit status 3 and the exact command that installs the extra here."""
    env = {"IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"), "IMPORTPATCH_PATH": str(tmp_path)}
    for argv in (["rebase", "no-such-patch", "--to", str(tmp_path)],
                 ["rebase", "no-such-patch", "--to", "installed", "--json"]):
        proc = wheel_venv.run([wheel_venv.script("importpatch"), *argv], env=env)
        assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
        assert proc.stdout == ""
        error, hint = proc.stderr.splitlines()
        assert error.startswith("importpatch: error: 'importpatch rebase' needs merge3 "), error
        assert "GPL-2.0-or-later" in error and "No module named 'merge3'" in error, error
        assert hint == (f"hint: install the rebase extra: {wheel_venv.python} -m pip install "
                        "'importpatch-hook[rebase]'"), hint
    # from-git carries commits with the same merge: the same refusal, before the repository is
    # read; with --to none (the patches as made, no merge) it does not need merge3
    argv = ["from-git", str(tmp_path / "no-repo"), "HEAD", "--name", "x"]
    proc = wheel_venv.run([wheel_venv.script("importpatch"), *argv], env=env)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    error, hint = proc.stderr.splitlines()
    assert error.startswith("importpatch: error: 'importpatch from-git' needs merge3 "), error
    assert hint.endswith(f"{wheel_venv.python} -m pip install 'importpatch-hook[rebase]'"), hint
    proc = wheel_venv.run([wheel_venv.script("importpatch"), *argv, "--to", "none"], env=env)
    assert proc.returncode == 2 and "is not a folder" in proc.stderr, (proc.returncode, proc.stderr)


def test_rebase_extra_installs_merge3(rebase_venv: Venv, tmp_path: Path) -> None:
    """``pip install 'importpatch-hook[rebase]'`` brings merge3, and ``rebase`` goes past the
    check to its own work (here: an unknown patch name, exit 2)."""
    proc = rebase_venv.run("import importlib.metadata as m; print(m.version('merge3'))")
    assert proc.returncode == 0, proc.stderr
    env = {"IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"), "IMPORTPATCH_PATH": str(tmp_path)}
    proc = rebase_venv.run([rebase_venv.script("importpatch"), "rebase", "no-such-patch", "--to",
                            "installed"], env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    error = "importpatch: error: unknown patch name: no-such-patch"
    assert proc.stderr.startswith(error), proc.stderr
