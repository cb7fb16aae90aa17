"""The diff engine against ``git apply`` and GNU ``patch -F0`` on real history (vllm_history.py).

For every case (a commit C changing one file): the engine must turn the file at C^ into the file
at C byte for byte; then the same diff goes to the file k first-parent commits older and newer,
through the engine, ``git apply`` and ``patch -F0``, and the outcomes are tallied:

* ``agree``: the engine and both tools apply, with identical results;
* ``differ``: the engine and a tool apply, with different results (must be 0);
* ``engine only``: the engine applies what a tool refuses (must be 0 for git apply, see below);
* ``engine refuses``: a tool applies and the engine does not, by the engine's reason.

    python scripts/eval/diff_corpus.py [MIRROR] --k 5 --k 30 --limit 300 [--seed 0] [--paths vllm/]
    python scripts/eval/diff_corpus.py --synthetic         # the generated history, no mirror needed
    python scripts/eval/diff_corpus.py MIRROR --floor --k 30 --k 100 --k 300 --k 1000 --limit 400

``--mutate N`` damages each case's diff N times (a line dropped, doubled or swapped with the
next, a character of a line changed, a number of a hunk header changed) and applies the result
to the file's three versions: parse and apply may only refuse with DiffError or HunkMismatch.

``--floor`` measures the "closest fit" the engine offers for a hunk that does not apply to the
older file: is it where the hunk's lines went (within 2 lines, by difflib's alignment of the two
files), at each candidate floor of ``diffs.NEAREST_FLOOR``? That is how the floor was chosen.

``compare(case)`` is what tests/test_diff_corpus.py asserts on. The tools run in a scratch folder
with no git configuration (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))
try:
    from importpatch.rewrite import diffs
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(1, str(SCRIPTS.parents[1]))
    from importpatch.rewrite import diffs

import vllm_history  # noqa: E402

_ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}


@dataclasses.dataclass
class Outcome:
    """One diff applied to one target text by the three appliers (None: refused)."""

    commit: str
    path: str
    target: str  # "base", "older" or "newer"
    engine: str | None
    git: str | None
    patch: str | None
    why: str = ""  # the engine's refusal kind
    message: str = ""
    git_reverse: bool = False  # the engine refuses and git apply -R takes the diff back out


class Tools:
    """``git apply`` and GNU ``patch`` on a scratch copy of one file."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="diffcorpus-")
        self.has_patch = shutil.which("patch") is not None

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def _run(self, cmd: list[str], text: str, diff: str, path: str) -> str | None:
        work = Path(self.dir, "w")
        shutil.rmtree(work, ignore_errors=True)
        target = work / path
        target.parent.mkdir(parents=True)
        target.write_bytes(text.encode())
        patch_file = Path(self.dir, "d.patch")
        patch_file.write_bytes(diff.encode())
        proc = subprocess.run([*cmd, str(patch_file)], cwd=work, capture_output=True, env=_ENV)
        return target.read_bytes().decode() if proc.returncode == 0 else None

    def git_apply(self, text: str, diff: str, path: str, *options: str) -> str | None:
        """``git apply OPTIONS`` (e.g. ``-R``, ``--unidiff-zero``) of ``diff`` to ``text``."""
        return self._run(["git", "apply", "--whitespace=nowarn", *options], text, diff, path)

    def gnu_patch(self, text: str, diff: str, path: str) -> str | None:
        if not self.has_patch:
            return None
        # -f: never ask, never guess a reversed patch; -F0: no fuzz (the engine has none).
        cmd = ["patch", "-p1", "-F0", "-f", "-s", "--no-backup-if-mismatch", "-r", os.devnull,
               "-i"]
        return self._run(cmd, text, diff, path)


def engine_apply(text: str, diff: str) -> tuple[str | None, str, str]:
    """The engine's result, or None with its refusal kind and message."""
    try:
        (fp,) = diffs.parse(diff).files
        return diffs.apply(text, fp), "", ""
    except diffs.HunkMismatch as exc:
        if exc.all_applied:
            return None, "already-applied", str(exc)
        if any(f.kind == diffs.ALREADY_APPLIED for f in exc.failures):
            return None, "partly already-applied", str(exc)
        return None, exc.kind, str(exc)
    except diffs.DiffError as exc:
        return None, "diff-error", str(exc)


def compare(case: vllm_history.Case, tools: Tools) -> list[Outcome]:
    out = []
    for name in ("base", "older", "newer"):
        text = getattr(case, name)
        if text is None:
            continue
        result, why, message = engine_apply(text, case.diff)
        git = tools.git_apply(text, case.diff, case.path)
        gnu = tools.gnu_patch(text, case.diff, case.path)
        back = result is None and tools.git_apply(text, case.diff, case.path, "-R") is not None
        out.append(Outcome(case.commit, case.path, name, result, git, gnu, why, message, back))
    return out


def nearest_quality(case: vllm_history.Case) -> list[tuple[float, bool]]:
    """(score, right place?) of the closest fit offered for each mismatching hunk of
    ``case.diff`` on ``case.older``, offered whatever its score."""
    if case.older is None:
        return []
    (fp,) = diffs.parse(case.diff).files
    floor, diffs.NEAREST_FLOOR = diffs.NEAREST_FLOOR, 0.0
    try:
        diffs.apply(case.older, fp)
        return []
    except diffs.HunkMismatch as exc:
        failures = [f for f in exc.failures if f.kind == diffs.MISMATCH]
    finally:
        diffs.NEAREST_FLOOR = floor
    # Where each base line is in the older file, where difflib can tell.
    matcher = difflib.SequenceMatcher(
        None, case.base.split("\n"), case.older.split("\n"), autojunk=False
    )
    moved = {i + t: j + t for i, j, size in matcher.get_matching_blocks() for t in range(size)}
    rows = []
    for f in failures:
        hunk = fp.hunks[f.hunk_index - 1]
        start = hunk.old_start - 1
        truth = next((moved[start + t] - t for t in range(hunk.old_len) if start + t in moved),
                     None)
        right = f.nearest is not None and truth is not None and abs(f.nearest - 1 - truth) <= 2
        rows.append((f.nearest_score, right))
    return rows


def floor_table(rows: list[tuple[float, bool]]) -> list[str]:
    right = sum(ok for _, ok in rows)
    lines = [f"{len(rows)} mismatching hunks; the best-scored place is the right one for {right}"]
    for floor in (0.0, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6):
        shown = [ok for score, ok in rows if score >= floor]
        good = sum(shown)
        lines.append(f"  floor {floor:.2f}: offered {len(shown):5d}, right {good:5d} "
                     f"(precision {good / max(len(shown), 1):.2f}, "
                     f"recall {good / max(right, 1):.2f})")
    return lines


def mutations(diff: str, count: int, seed: int) -> list[str]:
    """``count`` damaged copies of ``diff`` (see the docstring)."""
    import random

    rng = random.Random(seed)
    lines = diff.split("\n")
    out = []
    for _ in range(count):
        copy = list(lines)
        i = rng.randrange(len(copy))
        how = rng.randrange(5)
        if how == 0:
            del copy[i]
        elif how == 1:
            copy.insert(i, copy[i])
        elif how == 2 and i + 1 < len(copy):
            copy[i], copy[i + 1] = copy[i + 1], copy[i]
        elif how == 3 and copy[i]:
            j = rng.randrange(len(copy[i]))
            copy[i] = copy[i][:j] + rng.choice(" -+@\\\t0x") + copy[i][j + 1:]
        else:
            headers = [k for k, line in enumerate(copy) if line.startswith("@@ ")]
            if headers:
                k = rng.choice(headers)
                copy[k] = re.sub(r"\d+", lambda m: str(int(m.group()) + rng.randint(-3, 3)),
                                 copy[k], count=rng.randint(1, 4))
        out.append("\n".join(copy))
    return out


def mutate_case(case: vllm_history.Case, count: int, seed: int) -> collections.Counter[str]:
    """Apply ``count`` damaged diffs to the case's files; any other exception propagates."""
    seen: collections.Counter[str] = collections.Counter()
    texts = [t for t in (case.base, case.older, case.newer) if t is not None]
    for diff in mutations(case.diff, count, seed):
        try:
            files = diffs.parse(diff).files
        except diffs.DiffError:
            seen["malformed"] += 1
            continue
        for fp in files:
            for text in texts:
                try:
                    diffs.apply(text, fp)
                    seen["applies"] += 1
                except diffs.HunkMismatch as exc:
                    assert str(exc) and exc.failures
                    seen["does not apply"] += 1
                except diffs.DiffError:
                    seen["refused (no context)"] += 1
    return seen


def tally(outcomes: list[Outcome]) -> dict[str, collections.Counter[str]]:
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for o in outcomes:
        row = counts[o.target]
        row["targets"] += 1
        e, g, p = o.engine is not None, o.git is not None, o.patch is not None
        row[f"engine {'applies' if e else 'refuses'}"] += 1
        row[f"git {'applies' if g else 'refuses'}"] += 1
        row[f"patch {'applies' if p else 'refuses'}"] += 1
        if e and g and p and o.engine == o.git == o.patch:
            row["all three apply, identical"] += 1
        if e and g and o.engine != o.git:
            row["DIFFER from git"] += 1
        if e and p and o.engine != o.patch:
            row["DIFFER from patch"] += 1
        if e and not g:
            row["engine applies, git refuses"] += 1
        if e and not p:
            row["engine applies, patch refuses"] += 1
        if not e and not g and not p:
            row["all three refuse"] += 1
        if not e and (g or p):
            row[f"engine refuses ({o.why}), {'git' if g else 'patch'} applies"] += 1
        if not e:
            row[f"engine refusal: {o.why}"] += 1
        if o.git_reverse:
            row["git apply -R applies (the change is there)"] += 1
        if o.git_reverse != (o.why == "already-applied"):
            row["DISAGREE with git apply -R on already-applied"] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mirror", nargs="?", default=os.environ.get(vllm_history.MIRROR_ENV))
    parser.add_argument("--k", type=int, action="append")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paths", default="vllm/")
    parser.add_argument("--synthetic", action="store_true", help="use a generated history")
    parser.add_argument("--show", type=int, default=3, help="examples to print per finding")
    parser.add_argument("--mutate", type=int, default=0, metavar="N",
                        help="damage each diff N times; only DiffError/HunkMismatch may come out")
    parser.add_argument("--floor", action="store_true",
                        help="measure the closest-fit floor instead (see the docstring)")
    args = parser.parse_args(argv)
    tools = Tools()
    mirror, paths = args.mirror, args.paths
    if args.synthetic:
        mirror = vllm_history.synthetic_mirror(Path(tools.dir, "mirror.git"), 400, args.seed)
        paths = "pkg/"
    if not mirror:
        parser.error(f"give MIRROR, set ${vllm_history.MIRROR_ENV} or use --synthetic")
    try:
        if args.floor:
            rows = [row for k in args.k or [30, 100, 300, 1000]
                    for case in vllm_history.cases(mirror, k, args.limit, args.seed, paths)
                    for row in nearest_quality(case)]
            print("\n".join(floor_table(rows)))
            return 0
        if args.mutate:
            seen: collections.Counter[str] = collections.Counter()
            for n, case in enumerate(vllm_history.cases(mirror, (args.k or [5])[0], args.limit,
                                                        args.seed, paths)):
                seen += mutate_case(case, args.mutate, args.seed + n)
            print(f"{sum(seen.values())} applications of damaged diffs, no other exception: "
                  + ", ".join(f"{v} {k}" for k, v in sorted(seen.items())))
            return 0
        for k in args.k or [5, 30]:
            outcomes: list[Outcome] = []
            n = 0
            for case in vllm_history.cases(mirror, k, args.limit, args.seed, paths):
                n += 1
                outcomes += compare(case, tools)
            print(f"k={k}: {n} cases")
            for target, row in sorted(tally(outcomes).items()):
                print(f"  {target}:")
                for key, value in sorted(row.items()):
                    print(f"    {value:6d}  {key}")
            shown: collections.Counter[str] = collections.Counter()
            for o in outcomes:
                bad = (o.engine is not None and ((o.git is not None and o.engine != o.git)
                                                 or o.git is None))
                if bad and shown["bad"] < args.show:
                    shown["bad"] += 1
                    print(f"  ! {o.target} {o.commit[:10]} {o.path}: engine applies; "
                          f"git {'differs' if o.git is not None else 'refuses'}")
    finally:
        tools.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
