"""Measure ``importpatch rebase`` side by side with ``git apply --3way`` and ``git merge-file`` on
real history: the diff of a one-file commit C (base: the file at C^) carried to the same file k
first-parent commits older and newer (``scripts/eval/vllm_history.py`` makes the cases).

For every case and target the three tools give *clean* (with an output) or *conflict*. A clean
importpatch result is **wrong** when git apply --3way reports a conflict there, or when both are
clean and the outputs differ (byte for byte). The goal: as many clean rebases as git, none wrong.

    python scripts/eval/rebase_corpus.py [MIRROR] --k 5 --k 30 --limit 300 [--seed 0] [--json]
    python scripts/eval/rebase_corpus.py --synthetic --limit 100    # a generated history, no mirror

MIRROR defaults to $IMPORTPATCH_VLLM_MIRROR (``fetch github:local-inference-lab/vllm`` brings a
fork of vLLM with its full first-parent history, see vllm_history.py). ``tox -e rebase-corpus``
runs the full measurement; the test-suite runs a small synthetic sample (tests/test_rebase.py).
Exit status 1 when importpatch gave a wrong clean result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if not any((Path(p) / "importpatch").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(1, str(HERE.parents[1]))  # run from a checkout

import vllm_history  # noqa: E402

from importpatch.rewrite import diffs  # noqa: E402
from importpatch.tools import rebase  # noqa: E402

CLEAN, CONFLICT = "clean", "conflict"
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C",
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t"}


class GitRepo:
    """A scratch repository where git applies and merges one file at a time."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.env = {**os.environ, **_GIT_ENV}
        os.makedirs(folder, exist_ok=True)
        if self.git("init", "-q").returncode != 0:
            raise RuntimeError(f"git init {folder} failed")

    def git(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["git", "-C", self.folder, *args], input=stdin,
                              capture_output=True, env=self.env)

    def write(self, rel: str, text: str) -> str:
        path = os.path.join(self.folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        return path

    def read(self, rel: str) -> str:
        with open(os.path.join(self.folder, rel), encoding="utf-8", newline="") as f:
            return f.read()

    def apply_3way(self, base: str, ours: str, theirs: str, diff: str, rel: str) -> tuple[str, str]:
        """``git apply --3way`` of ``diff`` onto ``theirs`` (base and ours blobs in the object
        store, as in the repository the diff came from); (clean|conflict, file after)."""
        for text in (base, ours):
            self.git("hash-object", "-w", "--stdin", stdin=text.encode())
        self.write(rel, theirs)
        self.git("add", "--", rel)
        patch = self.write(".patch", _with_index_line(diff, base, ours))
        proc = self.git("apply", "--3way", patch)
        after = self.read(rel)
        self.git("rm", "-q", "--cached", "-f", "--", rel)
        os.remove(os.path.join(self.folder, rel))
        return (CLEAN if proc.returncode == 0 else CONFLICT), after

    def merge_file(self, base: str, ours: str, theirs: str) -> tuple[str, str]:
        """``git merge-file -p theirs base ours``: (clean|conflict, merged text)."""
        paths = [self.write(f".mf/{n}", t) for n, t in (("t", theirs), ("b", base), ("o", ours))]
        proc = self.git("merge-file", "-p", *paths)
        out = proc.stdout.decode("utf-8", "surrogateescape")
        return (CLEAN if proc.returncode == 0 else CONFLICT), out


def _with_index_line(diff: str, base: str, ours: str) -> str:
    """``diff`` with git's ``index <pre>..<post>`` line, so --3way finds the base blob."""
    if "\nindex " in diff.split("\n@@", 1)[0]:
        return diff
    pre, post = _blob_id(base), _blob_id(ours)
    head, sep, rest = diff.partition("\n")
    return f"{head}\nindex {pre}..{post} 100644{sep}{rest}"


def _blob_id(text: str) -> str:
    import hashlib

    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclasses.dataclass
class Row:
    commit: str
    path: str
    k: int
    direction: str  # older | newer
    ours: str  # clean | conflict | error
    ours_how: str  # merged | conflict | unsupported
    git_apply: str
    merge_file: str
    same_as_git_apply: bool | None  # both clean: outputs equal
    same_as_merge_file: bool | None
    upstream_hunks: int
    seconds: float
    error: str = ""

    @property
    def wrong(self) -> bool:
        """Clean where git apply --3way conflicts, or clean with another output than git's."""
        return self.ours == CLEAN and (self.git_apply != CLEAN or not self.same_as_git_apply)


def measure(cases: Iterable[vllm_history.Case], repo: GitRepo) -> Iterator[Row]:
    for case in cases:
        try:
            parsed = diffs.parse(case.diff)
        except diffs.DiffError as exc:
            yield Row(case.commit, case.path, case.k, "-", "error", "unsupported", "-", "-",
                      None, None, 0, 0.0, str(exc))
            continue
        fp = parsed.files[0]
        for direction, theirs in (("older", case.older), ("newer", case.newer)):
            if theirs is None:
                continue
            t0 = time.perf_counter()
            try:
                merged = rebase.merge_file(case.base, theirs, fp)
                ours, how, text = (CLEAN if merged.clean else CONFLICT), merged.how, merged.text
                upstream = sum(h.status == rebase.UPSTREAM for h in merged.hunks)
                error = ""
            except rebase.NotApplicable as exc:
                ours, how, text, upstream, error = "error", "not-applicable", "", 0, str(exc)
            seconds = time.perf_counter() - t0
            g_state, g_text = repo.apply_3way(case.base, case.changed, theirs, case.diff,
                                              case.path)
            m_state, m_text = repo.merge_file(case.base, case.changed, theirs)
            yield Row(
                case.commit, case.path, case.k, direction, ours, how, g_state, m_state,
                (text == g_text) if ours == CLEAN and g_state == CLEAN else None,
                (text == m_text) if ours == CLEAN and m_state == CLEAN else None,
                upstream, seconds, error,
            )


def summary(rows: list[Row]) -> dict[str, Any]:
    def tally(sel: list[Row]) -> dict[str, Any]:
        return {
            "targets": len(sel),
            "importpatch_clean": sum(r.ours == CLEAN for r in sel),
            "importpatch_conflict": sum(r.ours == CONFLICT for r in sel),

            "git_apply_3way_clean": sum(r.git_apply == CLEAN for r in sel),
            "git_merge_file_clean": sum(r.merge_file == CLEAN for r in sel),
            "wrong_clean": sum(r.wrong for r in sel),
            "clean_where_git_apply_conflicts": sum(
                r.ours == CLEAN and r.git_apply != CLEAN for r in sel),
            "both_clean_outputs_differ": sum(r.same_as_git_apply is False for r in sel),
            "conflict_where_git_apply_clean": sum(
                r.ours != CLEAN and r.git_apply == CLEAN for r in sel),
            "clean_where_merge_file_conflicts": sum(
                r.ours == CLEAN and r.merge_file != CLEAN for r in sel),
            "outputs_differ_from_merge_file": sum(r.same_as_merge_file is False for r in sel),
            "hunks_already_upstream": sum(r.upstream_hunks for r in sel),
            "errors": sum(r.ours == "error" for r in sel),
            "seconds_total": round(sum(r.seconds for r in sel), 3),
            "seconds_max": round(max((r.seconds for r in sel), default=0.0), 3),
        }

    out: dict[str, Any] = {"all": tally(rows)}
    for k in sorted({r.k for r in rows}):
        for d in ("older", "newer"):
            sel = [r for r in rows if r.k == k and r.direction == d]
            if sel:
                out[f"k={k} {d}"] = tally(sel)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mirror", nargs="?", default=os.environ.get(vllm_history.MIRROR_ENV))
    parser.add_argument("--k", type=int, action="append", help="default: 5 and 30")
    parser.add_argument("--limit", type=int, default=200, help="commits per k")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paths", default=None, help="default vllm/ (pkg/ with --synthetic)")
    parser.add_argument("--synthetic", action="store_true",
                        help="measure on a generated history (vllm_history.synthetic_mirror)")
    parser.add_argument("--json", action="store_true", help="print rows and summary as JSON")
    parser.add_argument("--show-wrong", action="store_true", help="print each wrong case")
    args = parser.parse_args(argv)
    ks = args.k or [5, 30]
    with tempfile.TemporaryDirectory() as tmp:
        mirror = args.mirror
        paths = args.paths
        if args.synthetic:
            mirror = vllm_history.synthetic_mirror(os.path.join(tmp, "mirror.git"), 400,
                                                   args.seed)
            paths = paths or "pkg/"
        if not mirror:
            parser.error(f"give MIRROR, set ${vllm_history.MIRROR_ENV} or pass --synthetic")
        repo = GitRepo(os.path.join(tmp, "repo"))
        rows: list[Row] = []
        for k in ks:
            rows += measure(vllm_history.cases(mirror, k, args.limit, args.seed,
                                               paths if paths is not None else "vllm/"), repo)
    result = summary(rows)
    if args.json:
        print(json.dumps({"summary": result, "rows": [dataclasses.asdict(r) for r in rows]},
                         indent=1))
    else:
        keys = list(result["all"])
        width = max(len(k) for k in keys)
        cols = list(result)
        print(" " * (width + 2) + "".join(c.rjust(14) for c in cols))
        for key in keys:
            print(key.ljust(width + 2) + "".join(str(result[c][key]).rjust(14) for c in cols))
        if args.show_wrong:
            for r in rows:
                if r.wrong or r.ours == "error":
                    print(f"WRONG {r.commit[:10]} {r.path} k={r.k} {r.direction}: ours "
                          f"{r.ours}/{r.ours_how}, git apply {r.git_apply}, equal "
                          f"{r.same_as_git_apply} {r.error}")
    counts = Counter(r.wrong for r in rows)
    return 1 if counts[True] else 0


if __name__ == "__main__":
    sys.exit(main())
