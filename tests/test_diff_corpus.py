"""The diff engine against real git history and the real tools, ``git apply`` and GNU ``patch``.

Cases come from scripts/eval/vllm_history.py: a commit changing one ``.py`` file, its diff, and the
file k first-parent commits older and newer. Always on: a generated history (git fast-import,
no vLLM text). With ``IMPORTPATCH_VLLM_MIRROR`` pointing at a vLLM git mirror (the ``fetch``
tool's snapshot of a fork such as local-inference-lab/vllm carries vLLM's history): vLLM's own.
Both check the same promises: every diff reproduces its commit byte for byte; where the engine
and a tool both apply, the results are identical; the engine never applies what ``git apply``
refuses; and when ``git apply -R`` takes the diff back out of a file, the engine says "already
applied". GNU patch is optional on a CI machine: its comparisons skip, saying so, without it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(ROOT / "scripts" / "eval"))
import diff_corpus  # noqa: E402
import vllm_history  # noqa: E402

from importpatch.rewrite import diffs  # noqa: E402

HAS_PATCH = shutil.which("patch") is not None


@pytest.fixture(scope="module")
def tools() -> Iterator[diff_corpus.Tools]:
    t = diff_corpus.Tools()
    yield t
    t.close()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> str:
    return vllm_history.synthetic_mirror(tmp_path_factory.mktemp("hist") / "m.git", 300, seed=7)


def git(mirror: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={mirror}", *args], capture_output=True,
                          text=True, check=True).stdout


# -- the generator ---------------------------------------------------------------------------------


def test_history_cases_are_single_file_commits_of_the_first_parent_chain(synthetic: str) -> None:
    chain = git(synthetic, "rev-list", "--first-parent", "--reverse", "HEAD").split()
    merges = set(git(synthetic, "rev-list", "--merges", "HEAD").split())
    side = set(git(synthetic, "rev-list", "HEAD").split()) - set(chain)
    every = list(vllm_history.cases(synthetic, k=4, limit=1000, paths="pkg/"))
    assert len(every) == len(vllm_history.eligible(synthetic, "pkg/")) > 150
    assert merges and side  # the history has merges and side commits to skip
    cases = every[:60]  # checked one by one with git below
    for case in cases:
        assert case.commit in chain and case.commit not in merges and case.commit not in side
        i = chain.index(case.commit)
        (parent,) = git(synthetic, "log", "-1", "--format=%P", case.commit).split()
        assert parent == chain[i - 1]
        names = git(synthetic, "show", "--format=", "--name-status", case.commit).split("\n")
        assert names[0] == f"M\t{case.path}" and names[1:] == [""]
        assert case.path.startswith("pkg/") and case.path.endswith(".py")
        assert case.base == git(synthetic, "show", f"{parent}:{case.path}")
        assert case.changed == git(synthetic, "show", f"{case.commit}:{case.path}")
        assert case.diff.startswith(f"diff --git a/{case.path} b/{case.path}\n")
        older = chain[i - 1 - 4] if i >= 5 else None
        if older is None:
            assert case.older is None
        elif case.older is not None:
            assert case.older == git(synthetic, "show", f"{older}:{case.path}")
        if i + 4 < len(chain) and case.newer is not None:
            assert case.newer == git(synthetic, "show", f"{chain[i + 4]}:{case.path}")
    # Not-present files are None, not errors: new files make such cases.
    assert any(c.older is None for c in every)
    again = [c.commit for c in vllm_history.cases(synthetic, 4, 20, seed=0, paths="pkg/")]
    assert again == [c.commit for c in cases[:20]]
    other = [c.commit for c in vllm_history.cases(synthetic, 4, 20, seed=1, paths="pkg/")]
    assert other != again


# -- the corpus ----------------------------------------------------------------------------------


def check_corpus(cases: list[vllm_history.Case], tools: diff_corpus.Tools) -> dict[str, int]:
    """Assert the promises on every case; return the tally (for the failure message and -s)."""
    counts: dict[str, int] = {}

    def count(key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    for case in cases:
        for o in diff_corpus.compare(case, tools):
            where = f"{o.target} of {case.commit[:10]} {case.path}"
            if o.target == "base":
                assert o.engine == case.changed, f"the diff does not reproduce {where}"
            if o.engine is not None and o.git is not None:
                assert o.engine == o.git, f"engine and git apply differ on {where}"
                count("engine and git apply agree")
            if o.engine is not None and o.patch is not None:
                assert o.engine == o.patch, f"engine and GNU patch differ on {where}"
                count("engine and GNU patch agree")
            assert o.engine is not None or o.git is None or o.why != "", where
            if o.engine is not None and o.git is None:
                raise AssertionError(f"engine applies what git apply refuses: {where}")
            if o.engine is None:
                count(f"engine refuses: {o.why}")
                if o.git is not None:
                    count("git applies, engine refuses")
            # "Already applied" exactly when git can take the change back out (git apply -R),
            # but for the engine's window: git searches the whole file.
            if o.why == "already-applied":
                assert o.git_reverse, f"{where}: git apply -R refuses: {o.message}"
                count("already applied (git apply -R agrees)")
            elif o.git_reverse:
                (fp,) = diffs.parse(case.diff).files
                unbounded = dataclasses.replace(fp, max_offset=10**9)
                with pytest.raises(diffs.HunkMismatch) as info:
                    diffs.apply(getattr(case, o.target), unbounded)
                assert info.value.all_applied, f"{where}: {o.message}"
                count("already applied, beyond the window")
    return counts


def test_generated_history_corpus(synthetic: str, tools: diff_corpus.Tools) -> None:
    cases = [c for k in (3, 20) for c in vllm_history.cases(synthetic, k, 40, paths="pkg/")]
    counts = check_corpus(cases, tools)
    # The generated edits move, duplicate and anchor code: every kind of outcome shows up.
    assert counts["engine and git apply agree"] > 100, counts
    assert counts["already applied (git apply -R agrees)"] > 15, counts
    assert counts.get("engine refuses: anchored", 0) > 0, counts
    if HAS_PATCH:
        assert counts["engine and GNU patch agree"] > 100, counts


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get(vllm_history.MIRROR_ENV),
                    reason=f"${vllm_history.MIRROR_ENV} (a vLLM git mirror) is not set")
def test_vllm_history_corpus(tools: diff_corpus.Tools) -> None:
    mirror = os.environ[vllm_history.MIRROR_ENV]
    cases = [c for k in (5, 30) for c in vllm_history.cases(mirror, k, 100)]
    assert len(cases) == 200
    counts = check_corpus(cases, tools)
    assert counts["engine and git apply agree"] > 250, counts


# -- placement checked against the tools, case by case -------------------------------------------

TOP = "import os\nimport sys\n\n\ndef f():\n    return 1\n"
NUMBERED = "".join(f"line {i}\n" for i in range(1, 11))
U0_INSERT = "--- a/m.py\n+++ b/m.py\n@@ -3,0 +4 @@\n+inserted\n"


@dataclasses.dataclass
class Placement:
    name: str
    source: str
    diff: str
    git: bool  # does plain git apply take it
    patch: bool  # does GNU patch -F0 take it
    engine: bool


PLACEMENTS = [
    # Equal distance before and after the stated line: the later place, in all three.
    Placement("tie", "x\ny\nz\np\nq\nr\nx\ny\nz\n",
              "--- a/m.py\n+++ b/m.py\n@@ -4,3 +4,3 @@\n x\n-y\n+Y\n z\n", True, True, True),
    # An insertion at the top, and upstream added a first line: nobody puts it below that line.
    Placement("top", "# SPDX-License-Identifier: Apache-2.0\n" + TOP,
              diffs.make_diff(TOP, "import re\n" + TOP, "m.py"), False, False, False),
    # Code appended at the end, and upstream appended more: nobody puts it before that code.
    Placement("end", NUMBERED + "newer = 1\n",
              diffs.make_diff(NUMBERED, NUMBERED + "appended\n", "m.py"), False, False, False),
    # Old side from line 1 with three lines of leading context: git anchors it (match_beginning
    # is oldpos <= 1 whatever the context), GNU patch does not. The engine does as git does.
    Placement("line-1-with-context", "# SPDX\n" + NUMBERED,
              diffs.make_diff(NUMBERED, NUMBERED.replace("line 4\n", "four\n"), "m.py"),
              False, True, False),
    # One trailing context line, and lines appended after it: GNU patch anchors it to the end
    # (less trailing than leading context), git does not; the engine does as git does.
    Placement("short-trailing-context", NUMBERED + "more\n",
              diffs.make_diff(NUMBERED, NUMBERED.replace("line 9\n", "nine\n"), "m.py"),
              True, False, True),
]


@pytest.mark.parametrize("case", PLACEMENTS, ids=lambda c: c.name)
def test_placement_matches_git_apply_and_gnu_patch(
    case: Placement, tools: diff_corpus.Tools
) -> None:
    engine, why, message = diff_corpus.engine_apply(case.source, case.diff)
    git_result = tools.git_apply(case.source, case.diff, "m.py")
    assert (git_result is not None) == case.git
    assert (engine is not None) == case.engine, message
    if engine is not None and git_result is not None:
        assert engine == git_result
    if HAS_PATCH:
        patch_result = tools.gnu_patch(case.source, case.diff, "m.py")
        assert (patch_result is not None) == case.patch
        if engine is not None and patch_result is not None:
            assert engine == patch_result


def test_zero_context_diff_is_refused_where_git_would_misplace_it(
    tools: diff_corpus.Tools
) -> None:
    # Plain git apply anchors a hunk without trailing context to the end of the file: the
    # insertion "after line 3" lands after line 10. The engine refuses instead ...
    assert tools.git_apply(NUMBERED, U0_INSERT, "m.py") == NUMBERED + "inserted\n"
    engine, why, message = diff_corpus.engine_apply(NUMBERED, U0_INSERT)
    assert engine is None and why == "diff-error" and "Unidiff-Zero: yes" in message
    # ... and, accepted explicitly, places it as git apply --unidiff-zero does.
    (fp,) = diffs.parse(U0_INSERT).files
    expected = tools.git_apply(NUMBERED, U0_INSERT, "m.py", "--unidiff-zero")
    assert diffs.apply(NUMBERED, dataclasses.replace(fp, unidiff_zero=True)) == expected
    assert expected == NUMBERED.replace("line 3\n", "line 3\ninserted\n")


def test_hunk_that_changes_nothing_is_refused_by_git_too(tools: diff_corpus.Tools) -> None:
    diff = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n line 1\n line 2\n"
    assert tools.git_apply(NUMBERED, diff, "m.py") is None
    with pytest.raises(diffs.DiffError, match="changes nothing"):
        diffs.parse(diff)


# -- random files and edits against git apply ----------------------------------------------------

# Few distinct lines, so copies of a hunk's context (and ties) are common.
LINES = ["a", "b", "c", "", ")", "    pass", "d", "e"]
EDITS = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 2), st.sampled_from(LINES + ["N"])),
                 min_size=1, max_size=3)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(old=st.lists(st.sampled_from(LINES), min_size=1, max_size=30), change=EDITS,
       drift=st.lists(st.tuples(st.integers(0, 32), st.sampled_from(["x", "a", "", "b"])),
                      max_size=3))
def test_property_engine_agrees_with_git_apply_and_patch_on_drifted_sources(
    old: list[str], change: list[tuple[int, int, str]], drift: list[tuple[int, str]],
    tools: diff_corpus.Tools,
) -> None:
    new = list(old)
    for at, span, line in change:  # the patch's edit
        new[at:at + span] = [line]
    diff = diffs.make_diff("".join(f"{s}\n" for s in old), "".join(f"{s}\n" for s in new), "m.py")
    if not diff:
        return
    drifted = list(old)
    for at, line in drift:  # upstream inserted lines here and there
        drifted.insert(min(at, len(drifted)), line)
    source = "".join(f"{s}\n" for s in drifted)
    engine, _, message = diff_corpus.engine_apply(source, diff)
    if engine is None:
        return
    # Never applied where git refuses; the same text wherever a tool applies too.
    assert tools.git_apply(source, diff, "m.py") == engine, f"{diff}\n{source}"
    if HAS_PATCH:
        assert tools.gnu_patch(source, diff, "m.py") in (None, engine), f"{diff}\n{source}"
