"""Would ``unidiff`` (PyPI) do as the parser of importpatch.discover.diffparse? The cases it must
get right, and the speed, side by side with importpatch's own parser.

    python -m pip install unidiff
    python scripts/eval/unidiff_eval.py [MIRROR]  # MIRROR: vLLM history for the speed/agreement run

Each case prints what importpatch and unidiff make of it; the corpus run parses every case diff
of vllm_history.cases (k=5, 400 cases) with both, compares the old and new sides they recover
(line texts, final-newline flags) and times both (best of 5). Conclusions are in the report of
issue 13 and a comment at the top of importpatch/discover/diffparse.py's parsing section.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
try:
    from importpatch.rewrite import diffs
except ImportError:
    sys.path.insert(1, str(SCRIPTS.parents[1]))
    from importpatch.rewrite import diffs

import unidiff  # noqa: E402
import vllm_history  # noqa: E402

CASES = {
    "git-quoted-non-ascii-path": (
        'diff --git "a/pkg/caf\\303\\251.py" "b/pkg/caf\\303\\251.py"\n'
        '--- "a/pkg/caf\\303\\251.py"\n+++ "b/pkg/caf\\303\\251.py"\n'
        "@@ -1 +1 @@\n-a\n+b\n"
    ),
    "name-with-space-git-tab": (
        "diff --git a/pkg/sp ace.py b/pkg/sp ace.py\n--- a/pkg/sp ace.py\t\n"
        "+++ b/pkg/sp ace.py\t\n@@ -1 +1 @@\n-s\n+t\n"
    ),
    "no-newline-marker": (
        "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n x\n-y\n\\ No newline at end of file\n+y\n"
    ),
    "crlf-diff-text": "--- a/m.py\r\n+++ b/m.py\r\n@@ -1,3 +1,3 @@\r\n a\r\n-b\r\n+B\r\n c\r\n",
    "preamble-and-header": (
        "Name: p\nRequires: vllm>=0.10\n\nFree text.\n---\n x | 1 +\n\n"
        "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n-- \n2.39.5\n"
    ),
    "blank-context-line-eaten": "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n\n-b\n+B\n",
    "malformed-too-few-lines": "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n",
    "malformed-too-many-lines": "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n a\n-b\n+B\n c\n d\n",
    "malformed-hunk-header": "--- a/m.py\n+++ b/m.py\n@@ -x +1 @@\n-a\n+b\n",
    "file-creation": "--- /dev/null\n+++ b/m.py\n@@ -0,0 +1 @@\n+new\n",
    "rename": "diff --git a/x.py b/y.py\nsimilarity index 100%\nrename from x.py\nrename to y.py\n",
    "binary": "diff --git a/b.bin b/b.bin\nBinary files a/b.bin and b/b.bin differ\n",
    "form-feed-inside-a-line": "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\x0cb\n+c\n",
}


def ours(text: str) -> str:
    try:
        parsed = diffs.parse(text)
    except diffs.DiffError as exc:
        return f"DiffError: {exc}"
    return "; ".join(
        f"{f.path}: " + ", ".join(f"{h.header} old={h.old_lines} nonl={h.old_eof_no_newline}"
                                  for h in f.hunks)
        for f in parsed.files
    ) or "(no file)"


def theirs(text: str) -> str:
    try:
        patch = unidiff.PatchSet(text)
    except Exception as exc:  # noqa: BLE001 - any error is an answer here
        return f"{type(exc).__name__}: {exc}"
    out = []
    for f in patch:
        hunks = []
        for h in f:
            old = [line.value.rstrip("\n") for line in h.source_lines()]
            flags = [line.line_type for line in h if line.line_type == "\\"]
            hunks.append(f"@@ -{h.source_start},{h.source_length} old={old} markers={flags}")
        kinds = "added" if f.is_added_file else "removed" if f.is_removed_file else (
            "renamed" if f.is_rename else "binary" if f.is_binary_file else "modified")
        out.append(f"{f.path} ({kinds}): " + ", ".join(hunks))
    return "; ".join(out) or "(no file)"


def sides_ours(text: str) -> list[tuple[list[str], list[str], bool, bool]]:
    return [(h.old_lines, [t for tag, t in h.lines if tag != "-"], h.old_eof_no_newline,
             h.new_eof_no_newline) for f in diffs.parse(text).files for h in f.hunks]


def sides_theirs(text: str) -> list[tuple[list[str], list[str], bool, bool]]:
    out = []
    for f in unidiff.PatchSet(text):
        for h in f:
            lines = list(h)
            old = [ln.value.rstrip("\n") for ln in lines if ln.is_context or ln.is_removed]
            new = [ln.value.rstrip("\n") for ln in lines if ln.is_context or ln.is_added]
            old_nl = new_nl = False
            for prev, ln in zip(lines, lines[1:], strict=False):
                if ln.line_type == "\\":
                    old_nl = old_nl or prev.is_context or prev.is_removed
                    new_nl = new_nl or prev.is_context or prev.is_added
            out.append((old, new, old_nl, new_nl))
    return out


def interleaved_best(fns: list[object], texts: list[str], rounds: int = 5) -> list[float]:
    """Best time of each parser over ``texts``, the parsers taking turns round by round."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for text in texts:
                fn(text)  # type: ignore[operator]
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def main() -> int:
    print(f"unidiff {unidiff.VERSION}")
    for name, text in CASES.items():
        print(f"\n== {name}\n   importpatch: {ours(text)}\n   unidiff:     {theirs(text)}")
    mirror = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(vllm_history.MIRROR_ENV)
    if not mirror:
        return 0
    texts = [case.diff for case in vllm_history.cases(mirror, 5, 400)]
    same = sum(sides_ours(t) == sides_theirs(t) for t in texts)
    print(f"\ncorpus: {len(texts)} diffs, {sum(len(t) for t in texts) / 1e6:.2f} MB; "
          f"the same old/new sides and no-newline flags from both: {same}")
    a, b = interleaved_best([diffs.parse, unidiff.PatchSet], texts * 3)
    print(f"parse time, best of 5 (interleaved by round): importpatch {a * 1e3:.1f} ms, "
          f"unidiff {b * 1e3:.1f} ms, ratio unidiff/importpatch {b / a:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
