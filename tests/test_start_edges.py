"""Edges of the start and of a refused target (issue 34, items 7 and "small edges"): a source
diff for a C-extension module, a request of thousands of unknown names or missing folders, and
what coverage.py sees of a patched module."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from conftest import Venv
from coreutil import EVENTS, Lab

# A diff whose header names math.py: math is a C extension here (lib-dynload) or built in.
MATH_DIFF = """\
--- a/math.py
+++ b/math.py
@@ -1,1 +1,1 @@
-x = 1
+x = 2
"""


def _math_is(lab: Lab) -> tuple[str, str]:
    """(origin, what importpatch calls it) of math in this interpreter, asked with nothing on."""
    origin = lab.ok("import math; print(math.__spec__.origin)", enable=None).stdout.strip()
    return origin, ("a built-in module" if origin == "built-in" else "a C extension")


def test_a_source_diff_for_a_c_extension_is_said_and_pip_keeps_working(lab: Lab) -> None:
    lab.patch({"mathdiff.diff": MATH_DIFF})
    origin, what = _math_is(lab)
    # The first run builds the index (discovery imports math before the hook); the later ones
    # start warm, with math imported through the finder: there the refusal's own message used to
    # import importlib.metadata -> random -> "from math import pi" of the half-loaded math.
    for _ in range(3):
        proc = lab.run(["-m", "pip", "--version"], enable="mathdiff")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("pip "), proc.stdout
        assert "partially initialized" not in proc.stderr, proc.stderr
    proc = lab.ok(f"import math, importpatch.events; print(math.pi); print({EVENTS})",
                  enable="mathdiff")
    pi, events = proc.stdout.splitlines()
    assert pi == "3.141592653589793"
    said = (f"importpatch: warning: patch mathdiff: the diff {lab.patches / 'mathdiff.diff'} "
            f"targets math, which is {what} (origin: {origin}), not Python source: a source diff "
            "cannot apply to it")
    assert said in proc.stderr, proc.stderr
    assert "math is imported unpatched (set IMPORTPATCH_STRICT=1" in proc.stderr, proc.stderr
    assert ["missing", "mathdiff", "math", "target-module"] in json.loads(
        events.replace("'", '"')), events
    # Under strict mode the import of math fails closed, naming the patch and the file.
    strict = lab.run("import math", enable="mathdiff", env={"IMPORTPATCH_STRICT": "1"})
    last = strict.stderr.strip().splitlines()[-1]
    assert strict.returncode == 1
    assert last.startswith("importpatch.errors.PatchError: importpatch: patch 'mathdiff' cannot "
                           f"apply to math ({origin})"), strict.stderr
    assert f"which is {what}" in last and "IMPORTPATCH_STRICT is on" in last, last


def test_a_refused_c_extension_target_fails_closed_naming_the_patch(lab: Lab) -> None:
    # A Python-level patch of a C extension is refused (the loader needs .py source): the import
    # fails closed, and the refusal's message is made without importing anything.
    lab.patch({"rm.py": """
        from importpatch import Patch
        Patch("rm").replace("math:sqrt", lambda x: 0.0)
        """})
    origin, what = _math_is(lab)
    for _ in range(3):  # cold, then warm (math imported through the finder)
        proc = lab.run("import math", enable="rm")
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        if proc.returncode == 0:
            continue  # the cold run: discovery imported math before the hook
        assert "partially initialized" not in proc.stderr, proc.stderr
        assert last == (f"importpatch.errors.PatchError: importpatch: patch 'rm' cannot apply to "
                        f"math ({origin}), math version unknown: math is {what}: only modules "
                        f"loaded from .py source can be patched (origin: {origin})"), proc.stderr
        break
    else:
        raise AssertionError("math was never imported through the finder")


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("importpatch: warning: ")]


def test_ten_thousand_unknown_names_are_one_short_line(lab: Lab) -> None:
    # 25 known patches (more than the 20 the line lists) and 10,000 names no patch has.
    lab.patch({f"k{i:02}.py": f"""
        from importpatch import Patch
        Patch("known-{i:02}").replace("tpkg.mod:f", lambda: 1)
        """ for i in range(25)})
    names = [f"nm{i}" for i in range(10_000)]
    proc = lab.ok("pass", enable=",".join(names))
    (line,) = [w for w in _warnings(proc.stderr) if "unknown patch name" in w]
    listed = sorted(names)[:10]
    assert line.startswith(f"importpatch: warning: unknown patch name(s) {', '.join(listed)} in "
                           "IMPORTPATCH_ENABLE, and 9,990 more; known: "), line[:300]
    known = line.partition("; known: ")[2].split(", ")
    # the first 20 known names (25 of the folder's and the built-in ones), then how many more
    assert len(known) == 21 and known[:20] == sorted(known[:20]) and "known-00" in known, known
    more = known[-1].split()
    assert more[0] == "and" and int(more[1]) >= 5 and more[2:] == ["more"], known
    assert len(line) < 1_000, len(line)
    assert len(proc.stderr) < 2_000, len(proc.stderr)


def test_three_thousand_missing_folders_are_one_line(lab: Lab) -> None:
    lab.target({"tpkg/__init__.py": "", "tpkg/mod.py": "def f():\n    return 'orig'\n"})
    lab.patch({"p.py": """
        from importpatch import Patch
        Patch("p").replace("tpkg.mod:f", lambda: "patched")
        """})
    missing = [f"nope{i}" for i in range(3_000)]  # relative (to the run's folder): one variable
    # of 3,000 absolute paths would pass the kernel's 128 KiB limit for one
    path = ":".join([*missing, str(lab.patches)])
    proc = lab.ok("import tpkg.mod as m; print(m.f())", enable="p",
                  env={"IMPORTPATCH_PATH": path})
    assert proc.stdout.split() == ["patched"]  # the folder that exists still counts
    assert _warnings(proc.stderr) == [
        f"importpatch: warning: IMPORTPATCH_PATH: 3,000 entries: "
        f"{', '.join(repr(p) for p in missing[:5])}, and 2,995 more are not folders"
    ], proc.stderr[:2000]
    # One missing folder keeps its own line's wording.
    one = lab.ok("pass", enable="p", env={"IMPORTPATCH_PATH": f"{missing[0]}:{lab.patches}"})
    assert _warnings(one.stderr) == [
        f"importpatch: warning: IMPORTPATCH_PATH: {missing[0]!r} is not a folder"], one.stderr


def test_many_malformed_names_are_one_line(lab: Lab) -> None:
    bad = [f"x{i}!" for i in range(2_000)]
    proc = lab.ok("pass", enable=" ".join(bad))
    assert _warnings(proc.stderr) == [
        f"importpatch: warning: IMPORTPATCH_ENABLE: 2,000 entries: ignored "
        f"{', '.join(repr(b) for b in bad[:5])}, and 1,995 more (a patch name has letters, "
        "digits, - _ .)"], proc.stderr[:2000]


# A module whose function f is replaced and whose last statement is a function never called.
COVERED = {
    "tpkg/__init__.py": "",
    "tpkg/mod.py": '''\
        """A module."""
        import functools


        @functools.lru_cache(
            maxsize=None,
        )
        def f():
            value = "orig"
            return value


        def never_called():
            x = 1
            y = x + 1
            return y
        ''',
}
F_BODY, NEVER_BODY = {9, 10}, {14, 15, 16}


def test_coverage_reports_only_the_lines_of_a_patched_module_that_ran(
    venv_factory: Callable[..., Venv], built_wheel: Path, tmp_path: Path
) -> None:
    venv = venv_factory(str(built_wheel), "coverage", name="coverage-lines")
    lab = Lab(venv, tmp_path).target(COVERED)
    lab.patch({"p.py": """
        from importpatch import Patch
        Patch("p").replace("tpkg.mod:f", lambda: "patched")
        """})
    (tmp_path / "run.py").write_text("import tpkg.mod as m\nprint(m.f())\n")

    def executed(enable: str | None) -> tuple[str, set[int]]:
        data = tmp_path / f"cov-{enable}"
        env = {"COVERAGE_FILE": str(data)}
        proc = lab.ok(["-m", "coverage", "run", "--include=*/tpkg/mod.py", "run.py"],
                      enable=enable, env=env)
        report = lab.ok(["-m", "coverage", "json", "-q", "-o", "-"], enable=None, env=env)
        (lines,) = [f["executed_lines"] for f in json.loads(report.stdout)["files"].values()]
        return proc.stdout.strip(), set(lines)

    out, unpatched = executed(None)
    assert out == "orig" and unpatched >= F_BODY and not unpatched & NEVER_BODY, unpatched
    for _ in range(2):  # compiled, then from importpatch's bytecode cache
        out, patched = executed("p")
        assert out == "patched"
        # f's body never ran (it is replaced), nor never_called's: not reported, and every
        # other line is the same as unpatched
        assert patched == unpatched - F_BODY, (sorted(patched), sorted(unpatched))
