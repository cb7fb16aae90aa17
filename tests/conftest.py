"""Shared fixtures for the importpatch test-suite.

Everything here works on REAL installs: the project wheel is built once per
session and installed with pip into a fresh virtual environment, and tests run
child interpreters of that environment.  Nothing is mocked.

Plain helpers (importable from test modules as ``from conftest import ...``):

* ``ROOT``                      -- the checkout root (parent of ``tests/``)
* ``clean_env(env=None)``       -- os.environ minus ``IMPORTPATCH_*``,
                                   ``PYTHONDONTWRITEBYTECODE`` and ``PYTHONPATH``, with
                                   HOME and XDG_CACHE_HOME in a temporary folder of the
                                   current test (pip's cache stays the real one), and
                                   ``env`` applied on top (``None`` deletes)
* ``need(module)``              -- import ``module`` or skip; a failure instead where
                                   ``IP_TESTS_REQUIRE`` names it (``tox -e vllm``)
* ``make_venv(path, *pip_args)``-- ``python -m venv path`` + ``pip install *pip_args``
                                   -> ``Venv``
* ``build_wheel(outdir)``       -- build the project wheel, return its path
* ``free_port()``               -- a free TCP port on 127.0.0.1

Fixtures:

* ``built_wheel`` (session)     -> Path of the project wheel
* ``wheel_venv`` (session)      -> Venv with the wheel installed
* ``venv_factory`` (session)    -> ``make(*pip_args, name=None) -> Venv`` under a tmp dir
* ``target_pkg``                -> ``make(files: dict[str, str]) -> Path``
* ``free_port`` (fixture form)  -> int
* ``package_index``             -> ``package_index.Index``: a package index on 127.0.0.1
                                   serving one release (tests/package_index.py)
* ``lab``                       -> ``coreutil.Lab`` in tmp_path on ``wheel_venv``, holding the
                                   targets and patches that the test module's (or test's)
                                   ``lab`` marker names (see the fixture)
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from coreutil import Lab
    from package_index import Index

ROOT = Path(__file__).resolve().parent.parent
DIST_NAME = "importpatch-hook"
WHEEL_PREFIX = DIST_NAME.replace("-", "_") + "-"

# Variables never inherited by child interpreters: the IMPORTPATCH_ prefix is
# the library's own configuration namespace; PYTHONDONTWRITEBYTECODE would hide
# bytecode-cache behaviour; an inherited PYTHONPATH could make a child import
# the checkout instead of the installed wheel (pass PYTHONPATH via ``env``).
_DROPPED_PREFIXES = ("IMPORTPATCH_",)
_DROPPED_NAMES = ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")

PIP_TIMEOUT = 900

# No test reads or writes the real ~/.cache or $XDG_CACHE_HOME: children get a HOME of the
# current test (the session's outside a test), and pip keeps using the real download cache.
_REAL_PIP_CACHE = os.environ.get("PIP_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "pip")
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="importpatch-tests-home-"))
_test_home: list[Path] = []  # the current test's HOME (set by the autouse fixture below)

# Names of modules (vllm, triton, ray) whose absence fails a test instead of skipping it; set by
# `tox -e vllm`, where they must be installed. Not an IMPORTPATCH_ name: children inherit it.
REQUIRE_VAR = "IP_TESTS_REQUIRE"


def need(module: str, reason: str = "") -> object:
    """``pytest.importorskip(module)``, except that it fails where REQUIRE_VAR names it."""
    required = os.environ.get(REQUIRE_VAR, "").replace(",", " ").split()
    if module in required and importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not importable, and {REQUIRE_VAR} says it must be here")
    return pytest.importorskip(module, reason=reason or f"needs {module} (tox -e vllm)")


def missing(*modules: str) -> bool:
    """For skipif marks: whether one of ``modules`` is missing (a failure where REQUIRE_VAR
    names it: the test is then not skipped and fails on its import)."""
    required = os.environ.get(REQUIRE_VAR, "").replace(",", " ").split()
    return any(importlib.util.find_spec(m) is None and m not in required for m in modules)


def current_home() -> Path:
    return _test_home[-1] if _test_home else _SESSION_HOME


def clean_env(env: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """Return a copy of os.environ fit for a child interpreter.

    Every ``IMPORTPATCH_*`` variable, ``PYTHONDONTWRITEBYTECODE`` and
    ``PYTHONPATH`` are removed, HOME and XDG_CACHE_HOME point into the current
    test's temporary folder (PIP_CACHE_DIR at the real pip cache), then ``env``
    is applied on top (a value of ``None`` removes that variable).
    """
    home = current_home()
    out = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_DROPPED_PREFIXES) and k not in _DROPPED_NAMES
    }
    out.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), PIP_CACHE_DIR=_REAL_PIP_CACHE)
    for k, v in (env or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = str(v)
    return out


@dataclass(frozen=True)
class Venv:
    """A virtual environment made with ``python -m venv``."""

    path: Path
    python: Path
    site_packages: Path

    @property
    def bin_dir(self) -> Path:
        return self.python.parent

    def script(self, name: str) -> Path:
        """Path of a console script installed in this venv (e.g. ``importpatch``)."""
        return self.bin_dir / name

    def run(
        self,
        args_or_code: str | Sequence[str | os.PathLike[str]],
        *,
        env: Mapping[str, str | None] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = 120,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python -c CODE`` (str) or ``python *ARGS`` (sequence) in this venv."""
        if isinstance(args_or_code, str):
            cmd = [str(self.python), "-c", args_or_code]
        else:
            cmd = [str(self.python), *(os.fspath(a) for a in args_or_code)]
        return subprocess.run(
            cmd,
            env=clean_env(env),
            cwd=cwd,
            timeout=timeout,
            check=check,
            capture_output=True,
            text=True,
        )

    def pip(self, *args: str, timeout: float = PIP_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """``python -m pip *args`` in this venv; raises with pip's output on failure."""
        proc = self.run(["-m", "pip", *args], timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(
                f"pip {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc


def _venv_python(path: Path) -> Path:
    if os.name == "nt":  # pragma: no cover - the project targets Linux
        return path / "Scripts" / "python.exe"
    return path / "bin" / "python"


def make_venv(
    path: str | os.PathLike[str], *pip_args: str, python: str | os.PathLike[str] | None = None
) -> Venv:
    """Create a venv at ``path`` from ``python`` (default: sys.executable).

    If ``pip_args`` are given, runs ``pip install *pip_args`` in it (dependencies
    come from the configured package index).  Returns a ``Venv``.
    """
    path = Path(path)
    base = os.fspath(python) if python is not None else sys.executable
    subprocess.run(
        [base, "-m", "venv", str(path)],
        env=clean_env(),
        check=True,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT,
    )
    py = _venv_python(path)
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        env=clean_env(),
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    venv = Venv(path=path, python=py, site_packages=Path(site))
    if pip_args:
        venv.pip("install", "--disable-pip-version-check", "-q", *pip_args)
    return venv


def build_wheel(outdir: str | os.PathLike[str]) -> Path:
    """Build the project wheel from ROOT into ``outdir`` and return its path."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    try:
        import build  # noqa: F401

        cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(ROOT)]
    except ImportError:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(outdir), str(ROOT)]
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=PIP_TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"wheel build failed:\n{proc.stdout}\n{proc.stderr}")
    wheels = sorted(outdir.glob(f"{WHEEL_PREFIX}*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {outdir}, found {wheels}")
    return wheels[0]


def _tox_wheel() -> Path | None:
    """The wheel tox built for this run (``package = wheel`` sets TOX_PACKAGE)."""
    for item in os.environ.get("TOX_PACKAGE", "").split(os.pathsep):
        p = Path(item) if item else None
        if p and p.suffix == ".whl" and p.name.startswith(WHEEL_PREFIX) and p.is_file():
            return p
    return None


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _home_of_this_test(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every child of this test gets a HOME (and XDG_CACHE_HOME) of its own: no stamp, index or
    cache entry left by another test (or by a real user) can change what this test sees."""
    home = tmp_path_factory.mktemp("home")
    _test_home.append(home)
    yield home
    _test_home.remove(home)


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project wheel, built once per session (or the one tox just built)."""
    outdir = tmp_path_factory.mktemp("wheel")
    tox_whl = _tox_wheel()
    if tox_whl is not None:
        return Path(shutil.copy2(tox_whl, outdir / tox_whl.name))
    return build_wheel(outdir)


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory, built_wheel: Path) -> Venv:
    """A fresh venv (from sys.executable) with the built wheel pip-installed."""
    return make_venv(tmp_path_factory.mktemp("wheel-venv") / "venv", str(built_wheel))


@pytest.fixture(scope="session")
def rebase_venv(tmp_path_factory: pytest.TempPathFactory, built_wheel: Path) -> Venv:
    """A fresh venv with the built wheel and its ``rebase`` extra (merge3, which ``rebase`` and
    ``from-git``'s carrying need): ``pip install 'importpatch-hook[rebase]'``."""
    return make_venv(tmp_path_factory.mktemp("rebase-venv") / "venv",
                     f"importpatch-hook[rebase] @ {built_wheel.resolve().as_uri()}")


@pytest.fixture(scope="session")
def venv_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Venv]:
    """``make(*pip_args, name=None) -> Venv``: extra venvs under a session tmp dir."""
    counter = itertools.count()

    def make(*pip_args: str, name: str | None = None) -> Venv:
        base = tmp_path_factory.mktemp(name or f"venv{next(counter)}")
        return make_venv(base / "venv", *pip_args)

    return make


@pytest.fixture
def target_pkg(tmp_path: Path) -> Callable[[Mapping[str, str]], Path]:
    """``make(files) -> dir``: write a throwaway package tree, return its root.

    ``files`` maps relative paths to contents (dedented), e.g.
    ``{"tpkg/__init__.py": "", "tpkg/mod.py": "def f(): return 1"}``.
    Put the returned dir on a child's PYTHONPATH.
    """
    counter = itertools.count()

    def make(files: Mapping[str, str]) -> Path:
        root = tmp_path / f"targets{next(counter)}"
        root.mkdir()
        for rel, content in files.items():
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(textwrap.dedent(content), encoding="utf-8")
        return root

    return make


@pytest.fixture(name="free_port")
def free_port_fixture() -> int:
    return free_port()


@pytest.fixture
def package_index(tmp_path: Path) -> Iterator[Index]:
    """A package index on 127.0.0.1 serving a release of ``tpkg-cpu`` (tests/package_index.py)."""
    from package_index import serve_release

    served = serve_release(tmp_path)
    yield served
    served.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "lab(target=None, patch=None, venv='wheel_venv'): what the `lab` fixture holds")
    config.addinivalue_line(
        "markers", "one_python: the outcome does not depend on the interpreter's version "
                   "(ONE_PYTHON in tests/conftest.py); tox runs it on Python 3.11 only")


# Test files whose outcome cannot depend on the interpreter's version: text merges (difflib,
# merge3, git), downloads and caches of release files, the repository's own files (layout, docs
# paths, benchmark results, the compat matrix), nothing that parses or runs Python source of a
# patch. CI runs them once (py311, the vLLM env's Python), the other pyXY envs deselect them
# (`-m "not one_python"`), which saves ~2 minutes an env. Anything that tokenizes, parses,
# compiles or imports patched code (pins, fields, from-git's AST checks, the start) stays on all.
ONE_PYTHON = {
    "test_rebase.py", "test_rebase_wrong_clean.py", "test_releases.py", "test_layout.py",
    "test_docs_paths.py", "test_bench_results.py", "test_compat_matrix.py", "test_drift.py",
    "test_diff_corpus.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in ONE_PYTHON:
            item.add_marker(pytest.mark.one_python)


@pytest.fixture
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Lab:
    """A ``coreutil.Lab`` in ``tmp_path``: target packages and patch files, run by the
    interpreter of a real venv. A test module says what it holds with a marker, e.g.
    ``pytestmark = pytest.mark.lab(target=TARGET, patch=PATCH)`` (a test's own marker wins):
    ``target`` / ``patch`` map relative paths to file texts (``coreutil.write_tree``); ``venv``
    names the fixture of the venv to run in (default ``wheel_venv``). No marker: an empty lab."""
    from coreutil import Lab

    mark = request.node.get_closest_marker("lab")
    opts = dict(mark.kwargs) if mark is not None else {}
    venv = request.getfixturevalue(opts.pop("venv", "wheel_venv"))
    made = Lab(venv, tmp_path).target(opts.pop("target", {})).patch(opts.pop("patch", {}))
    if opts or (mark is not None and mark.args):
        raise TypeError(f"lab marker: unknown arguments {mark.args if mark else ()} {opts}")
    return made
