"""pytest plugin for patch authors (registered through the ``pytest11`` entry point).

``importpatch_run`` (fixture) runs a snippet in a fresh interpreter (``sys.executable``, a real
child process, so the start-up hook of this environment installs the patches) with the named
patches enabled and its own events folder::

    def test_my_patch(importpatch_run):
        r = importpatch_run("import tpkg.mod as m; result = m.f()", enable=["my-patch"])
        assert r.returncode == 0, r.stderr
        assert r.result == 42                      # the snippet's ``result``, through JSON
        assert [e["patch"] for e in r.applied] == ["my-patch"]

The child finds patches where this environment does (``IMPORTPATCH_PATH``, as
``assert_applies_cleanly`` does, plus ``path=``; installed patch packages); which patches are on is
only ``enable``. A name of ``enable`` that no patch of the child has fails the test (the snippet
would run unpatched).

``.events`` holds the events of that process and of every process it started (they inherit
``IMPORTPATCH_EVENTS_DIR``), oldest first; ``.processes`` the ``started`` line of each process
where the hook was active (``importpatch status`` draws the tree from them). Where
``importpatch.pth`` is not installed for ``sys.executable`` (a checkout on ``PYTHONPATH``), the
snippet's driver installs the hook itself before the snippet runs; processes the snippet starts
are then not patched.

``assert_applies_cleanly(name, against=None)`` runs ``importpatch check`` in this process
(nothing is imported) and fails with the report when the patch would not apply.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

# Runs in the child: the hook first (unless the .pth already installed it); the names of
# ``enable`` (argv[3]) that no patch of the child has, as JSON to argv[4] (the snippet would run
# unpatched); then the snippet as __main__, then ``result`` as JSON to the file named by argv[2].
_DRIVER = """\
import json, runpy, sys
if "importpatch._boot" not in sys.modules:
    import importpatch._boot
    importpatch._boot.start()
from importpatch.discover import catalog; from importpatch import config
known = {e.name for e in catalog.load(config.read())}
with open(sys.argv[4], "w", encoding="utf-8") as f:
    json.dump([n for n in json.loads(sys.argv[3]) if n not in known and n != "all"], f)
ns = runpy.run_path(sys.argv[1], run_name="__main__")
if "result" in ns:
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(ns["result"], f)
"""


@dataclasses.dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    result: Any
    events: list[dict[str, Any]]
    processes: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def applied(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["outcome"] == "applied"]


def read_events(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every patch event in ``folder`` (all processes), oldest first; a line that is not an event
    raises (the processes have finished). The ``started`` lines are ``read_processes``'."""
    from importpatch.events import read

    return [e for e in read(folder, strict=True)[0] if e["outcome"] != "started"]


def read_processes(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The ``started`` line of every process where the hook was active, oldest first."""
    from importpatch.events import read

    return [e for e in read(folder, strict=True)[0] if e["outcome"] == "started"]


def _child_env(
    enable: Sequence[str], events_dir: Path, env: Mapping[str, str | None] | None,
    path: Sequence[str | os.PathLike[str]] | None,
) -> dict[str, str]:
    # Which patches are on, and where events go, are the run's own; where patches and the cache
    # are stay the environment's (assert_applies_cleanly reads the same IMPORTPATCH_PATH).
    out = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("IMPORTPATCH_", "VLLM_IMPORTPATCH_"))
        or k.partition("IMPORTPATCH_")[2] in _KEPT
    }
    out["IMPORTPATCH_ENABLE"] = ",".join(enable)
    out["IMPORTPATCH_EVENTS_DIR"] = str(events_dir)
    if path:
        from importpatch import config

        extra = os.pathsep.join(os.fspath(p) for p in path)
        out[config.PATH] = os.pathsep.join(filter(None, [config.get(os.environ, config.PATH),
                                                         extra]))
        out.pop(config.VLLM_PREFIX + config.PATH, None)  # merged above: no "both set" warning
    for key, value in (env or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    here = str(Path(__file__).resolve().parent.parent.parent)
    if here not in _site_dirs():  # a checkout: let the child import this importpatch
        out["PYTHONPATH"] = os.pathsep.join(filter(None, [out.get("PYTHONPATH"), here]))
    return out


_KEPT = ("PATH", "CACHE_DIR", "NO_CACHE")


def _site_dirs() -> set[str]:
    from importpatch.sites import site_packages

    return {str(Path(d).resolve()) for d, _ in site_packages()}


@pytest.fixture
def importpatch_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., RunResult]:
    """``run(code, *, enable, env=None, path=None, timeout=120) -> RunResult``."""
    base = tmp_path_factory.mktemp("importpatch_run")
    counter = iter(range(1 << 30))

    def run(
        code: str,
        *,
        enable: Sequence[str],
        env: Mapping[str, str | None] | None = None,
        path: Sequence[str | os.PathLike[str]] | None = None,
        timeout: float = 120,
    ) -> RunResult:
        if isinstance(enable, str):
            raise TypeError("enable= takes a list of patch names, e.g. enable=['my-patch']")
        work = base / f"run{next(counter)}"
        events_dir = work / "events"
        events_dir.mkdir(parents=True)
        snippet, result_file = work / "snippet.py", work / "result.json"
        unknown_file = work / "unknown.json"
        snippet.write_text(textwrap.dedent(code), encoding="utf-8")
        proc = subprocess.run(
            [sys.executable, "-c", _DRIVER, str(snippet), str(result_file),
             json.dumps(list(enable)), str(unknown_file)],
            env=_child_env(enable, events_dir, env, path), capture_output=True, text=True,
            timeout=timeout, cwd=work,
        )
        unknown = json.loads(unknown_file.read_text(encoding="utf-8")) \
            if unknown_file.exists() else []
        if unknown:  # the snippet ran without them: a test of "it works" would pass unpatched
            folders = _child_env(enable, events_dir, env, path).get("IMPORTPATCH_PATH", "")
            pytest.fail(
                f"importpatch_run: enable={unknown!r}: no patch of that name in the child "
                f"(IMPORTPATCH_PATH={folders!r}; pass path=[folder], or install the patch "
                f"package); its stderr:\n{proc.stderr}", pytrace=False)
        result = None
        if result_file.exists():
            result = json.loads(result_file.read_text(encoding="utf-8"))
        return RunResult(proc.returncode, proc.stdout, proc.stderr, result, read_events(events_dir),
                         read_processes(events_dir))

    return run


def assert_applies_cleanly(
    name: str, *, against: str | os.PathLike[str] | None = None,
    path: Sequence[str | os.PathLike[str]] | None = None,
) -> None:
    """Fail (AssertionError with the check report) unless patch ``name`` would apply to the
    installed packages, or to ``against`` (a wheel, sdist, source tree or site-packages).
    ``path``: extra patch folders, as ``IMPORTPATCH_PATH``."""
    from importpatch.tools import check

    environ = dict(os.environ)
    if path:
        extra = os.pathsep.join(os.fspath(p) for p in path)
        current = environ.get("IMPORTPATCH_PATH")
        environ["IMPORTPATCH_PATH"] = os.pathsep.join(filter(None, [current, extra]))
    report = check.run([name], None if against is None else os.fspath(against), environ)
    if report.exit_status != 0:
        raise AssertionError(_explain(report))


def _explain(report: Any) -> str:
    from importpatch.tools.cli import Style, check_lines

    lines = [f"against: {report.against.label}"]
    for p in report.patches:
        lines += check_lines(p, Style(None))
    return "\n".join(lines)
