"""Measure ``importpatch from-git`` against ``git cherry-pick`` on a run of real commits.

The commits after a release's branch point on the main line are treated as a fork's commits on
top of the release: ``from-git`` makes one patch per commit and carries them, in order, to the
release (the release branch's tree, which holds the fixes cherry-picked into it); ``git
cherry-pick`` of the same commits onto the release in a scratch clone is the reference (a
conflicting pick is aborted and the next one tried, as from-git leaves a conflicting patch out).
Per commit: clean (carried), upstream (every change already in the release), conflict, or
nothing to carry (no Python file of the package). Where both are clean, the commit's files after
git's pick and after ``git apply`` of from-git's carried patches, one by one, must be the same
text (new modules included). Exit status 1 also when they differ.

    python scripts/eval/fork_corpus.py [MIRROR] --release v0.16.0 --main main --count 25 [--json]
    python scripts/eval/fork_corpus.py MIRROR --release v0.4.3 --main moe_final --start 200fbea19 \
        --count 54 [--follow-merges] [--json]             # a fork's own commits after --start
    python scripts/eval/fork_corpus.py --synthetic [--json]     # a generated history, no mirror

``--start REV`` takes the commits after REV (a fork's own commits, whatever the release) instead
of those after the branch point of ``--release`` and ``--main``; ``--follow-merges`` takes the
range's non-merge commits in from-git's order (a fork whose own work comes in merged pull-request
branches) instead of the first-parent line, which must then end at a commit whose non-merge
ancestors in the range are exactly the first COUNT. MIRROR defaults to
$IMPORTPATCH_VLLM_MIRROR (``fetch github:jinhuang12/vllm`` brings a vLLM fork whose branch
v0.16.0 is vLLM's release branch; ``fetch github:ROCm/vllm`` ROCm's fork, measured in
docs/notes/from-git.md). Exit status 1 when from-git is clean on a
commit whose Python files git cannot pick.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if not any((Path(p) / "importpatch").is_dir() for p in sys.path[1:] if p):
    sys.path.insert(0, str(HERE.parents[1]))  # run from a checkout

from importpatch.tools import fromgit  # noqa: E402

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                          check=check, env={**os.environ, **GIT_ENV})


def synthetic(folder: str) -> tuple[str, str, str]:
    """A history: tpkg 1.0 tagged, a release branch with 3 fixes picked from main and one
    change of its own, main with 24 commits after the branch point. -> (repo, release, main)."""
    repo = os.path.join(folder, "synthetic")
    os.makedirs(os.path.join(repo, "tpkg"))
    git(folder, "init", "-q", "-b", "main", repo)

    def write(rel: str, text: str) -> None:
        path = os.path.join(repo, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def read(rel: str) -> str:
        with open(os.path.join(repo, rel)) as f:
            return f.read()

    for m in range(4):
        write(f"tpkg/m{m}.py", "".join(f"def f{i}(x):\n    return x + {i}\n\n\n"
                                       for i in range(30)))
    write("tpkg/__init__.py", "")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "release 1.0")
    git(repo, "tag", "v1.0.0")
    picked = []
    for n in range(24):
        m, i = n % 4, n
        if n % 6 == 5:  # a commit without Python
            write(f"csrc/k{n}.cu", f"// {n}\n")
        elif n == 10:  # a new module, edited again by commit 16
            write("tpkg/added.py", "def helper(x):\n    return x * 2\n")
        elif n == 16:
            write("tpkg/added.py", read("tpkg/added.py").replace("x * 2", "x * 3"))
        elif n == 20:  # a chmod beside an edit
            os.chmod(os.path.join(repo, "tpkg", "m1.py"), 0o755)
            write("tpkg/m0.py", read("tpkg/m0.py").replace(
                f"return x + {i}\n", f"return x + {i} + {n}\n", 1))
        else:
            write(f"tpkg/m{m}.py", read(f"tpkg/m{m}.py").replace(
                f"return x + {i}\n", f"return x + {i} + {n}\n", 1))
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"change {n}")
        if n in (2, 9, 15):
            picked.append(git(repo, "rev-parse", "HEAD").stdout.strip())
    git(repo, "checkout", "-q", "-b", "release-1.0", "v1.0.0")
    for sha in picked:
        git(repo, "cherry-pick", sha)
    for m, i in ((0, 4), (3, 7)):  # changed on the release branch only: conflicts
        write(f"tpkg/m{m}.py", read(f"tpkg/m{m}.py").replace(
            f"return x + {i}\n", f"return x + {i} - 1\n", 1))
    git(repo, "commit", "-qam", "release-only fixes")
    git(repo, "checkout", "-q", "main")
    return repo, "release-1.0", "main"


def stand_in_missing_blobs(clone: str, revs: list[str]) -> int:
    """A snapshot may lack large files (images): cherry-pick cannot write a tree naming a blob
    it lacks. Each missing blob of these commits' trees is stood in for by the empty blob
    (``git replace``, in the scratch clone only); none of them is a Python file."""
    blobs: set[str] = set()
    for rev in revs:
        for row in git(clone, "ls-tree", "-r", rev).stdout.splitlines():
            meta, _, path = row.partition("\t")
            if meta.split()[1] == "blob":
                blobs.add(meta.split()[2])
    checked = subprocess.run(["git", "-C", clone, "cat-file", "--batch-check"],
                             input="\n".join(sorted(blobs)) + "\n", capture_output=True,
                             text=True, check=True).stdout
    missing = [row.split()[0] for row in checked.splitlines() if row.endswith(" missing")]
    empty = subprocess.run(["git", "-C", clone, "hash-object", "-w", "--stdin"], input="",
                           capture_output=True, text=True, check=True).stdout.strip()
    for sha in missing:
        git(clone, "replace", "-f", sha, empty)
    return len(missing)


def measure(mirror: str, release: str, main: str, count: int, package: str,
            start: str | None = None, follow: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fork-corpus-") as tmp:
        clone = os.path.join(tmp, "clone")
        git(tmp, "clone", "-q", "--shared", "--bare", mirror, clone)
        rel = git(clone, "rev-parse", f"origin/{release}" if git(
            clone, "rev-parse", "--verify", "-q", f"origin/{release}", check=False
        ).returncode == 0 else release).stdout.strip()
        tip = git(clone, "rev-parse", f"origin/{main}" if git(
            clone, "rev-parse", "--verify", "-q", f"origin/{main}", check=False
        ).returncode == 0 else main).stdout.strip()
        point = git(clone, "rev-parse", f"{start}^{{commit}}").stdout.strip() if start else \
            git(clone, "merge-base", rel, tip).stdout.strip()
        if follow:  # the range's commits as from-git takes them: merges left out, topo order
            line = git(clone, "rev-list", "--reverse", "--topo-order", "--no-merges",
                       f"{point}..{tip}").stdout.split()[:count]
        else:
            line = git(clone, "rev-list", "--reverse", "--first-parent", f"{point}..{tip}"
                       ).stdout.split()[:count]
        # The fork: the commits, replayed on the branch point as a branch of their own.
        git(clone, "branch", "-f", "fork", line[-1])
        # from-git on point..X takes every non-merge commit X reaches: the run must end at X.
        if follow and git(clone, "rev-list", "--reverse", "--topo-order", "--no-merges",
                          f"{point}..{line[-1]}").stdout.split() != line:
            raise SystemExit(f"the first {count} commits after {start} are not all the "
                             f"commits {line[-1][:12]} reaches: choose --count or --main so "
                             "that the run ends at a commit of it")
        # The release as installed: its package files, with a version.
        tree = os.path.join(tmp, "release")
        os.makedirs(tree)
        archive = subprocess.run(["git", "-C", clone, "archive", rel, package],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        info = os.path.join(tree, f"{package}-0.0.0.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.0.0\n")
        report = fromgit.from_git(clone, [f"{point}..{line[-1]}"], to=tree, package=package,
                                  dry_run=True)
        by_commit = {p.commit: p for p in report.patches}
        # git cherry-pick of the same commits onto the release, a conflict aborted and skipped;
        # beside it, from-git's carried patches applied (git apply) one by one to the release.
        work, ours_tree = os.path.join(tmp, "work"), os.path.join(tmp, "ours")
        stand_in_missing_blobs(clone, [rel, *line, *(f"{c}^" for c in line)])
        git(clone, "worktree", "add", "-q", "--detach", work, rel)
        git(clone, "worktree", "add", "-q", "--detach", ours_tree, rel)
        rows = []
        for sha in line:
            p = by_commit.get(sha)
            applied_ours = ""
            if p is not None and p.status == "carried":
                done = subprocess.run(["git", "-C", ours_tree, "apply", "-"], input=p.text,
                                      capture_output=True, text=True)
                applied_ours = "" if done.returncode == 0 else done.stderr.strip()[:200]
            done = git(work, "cherry-pick", "--allow-empty", "--keep-redundant-commits", "-x",
                       sha, check=False)
            if done.returncode == 0:
                empty = git(work, "diff", "--quiet", "HEAD~1", "HEAD", check=False).returncode == 0
                g = "upstream" if empty else "clean"
                unmerged: list[str] = []
            else:
                unmerged = git(work, "diff", "--name-only", "--diff-filter=U").stdout.split()
                git(work, "cherry-pick", "--abort", check=False)
                g = "conflict"
            ours = "nothing" if p is None else {"carried": "clean"}.get(p.status, p.status)
            same: bool | None = None  # both clean: the commit's files, text for text
            if ours == "clean" and g == "clean" and p is not None:
                same = not applied_ours and all(
                    _read(work, f.target_path or f.path) == _read(ours_tree,
                                                                  f.target_path or f.path)
                    for f in p.files)
            py_conflict = any(u.startswith(package + "/") and u.endswith(".py")
                              for u in unmerged)
            rows.append({"commit": sha[:12], "subject": git(clone, "log", "-1", "--format=%s",
                                                            sha).stdout.strip()[:60],
                         "importpatch": ours, "git": g, "git_python_conflict": py_conflict,
                         "git_unmerged": unmerged,
                         "same_text": same, "apply_error": applied_ours,
                         "new_modules": sorted(f.path for f in p.files
                                               if f.detail.startswith("a new module"))
                         if p else [],
                         "not_carried": dict(p.not_carried) if p else {},
                         "hunks": p.counts() if p else {}})
    ours_c = Counter(r["importpatch"] for r in rows)
    git_c = Counter(r["git"] for r in rows)
    hunks: Counter[str] = Counter()
    for r in rows:
        hunks.update(r["hunks"])
    return {
        "release": release, "main": main, "branch_point": point[:12], "commits": len(rows),
        "importpatch": {k: ours_c.get(k, 0) for k in ("clean", "upstream", "conflict",
                                                      "nothing")},
        "cherry_pick": {k: git_c.get(k, 0) for k in ("clean", "upstream", "conflict")},
        "hunks": dict(hunks),
        "clean_where_git_conflicts": sum(1 for r in rows if r["importpatch"] == "clean"
                                         and r["git_python_conflict"]),
        "both_clean": sum(1 for r in rows if r["same_text"] is not None),
        "text_differs": [r["commit"] for r in rows if r["same_text"] is False],
        "new_modules": sum(len(r["new_modules"]) for r in rows),
        "mode_changes": sum(1 for r in rows for why in r["not_carried"].values()
                            if "a mode is not code" in why),
        "rows": rows,
    }


def _read(tree: str, rel: str) -> bytes | None:
    try:
        with open(os.path.join(tree, rel), "rb") as f:
            return f.read()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mirror", nargs="?", default=os.environ.get("IMPORTPATCH_VLLM_MIRROR"))
    ap.add_argument("--release", default="v0.16.0", help="the release branch or tag")
    ap.add_argument("--main", default="main", help="the branch holding the fork's commits")
    ap.add_argument("--start", help="the commit the fork's commits follow (default: the "
                    "merge-base of --release and --main)")
    ap.add_argument("--count", type=int, default=25)
    ap.add_argument("--follow-merges", action="store_true",
                    help="the commits are the range's non-merge commits in from-git's order "
                    "(topological; the side branches of merges included), not the first-parent "
                    "line")
    ap.add_argument("--package", default="vllm")
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.synthetic:
        with tempfile.TemporaryDirectory(prefix="fork-synth-") as tmp:
            repo, rel, main_ = synthetic(tmp)
            data = measure(repo, rel, main_, 24, "tpkg")
    else:
        if not args.mirror:
            ap.error("no MIRROR and IMPORTPATCH_VLLM_MIRROR is not set")
        data = measure(args.mirror, args.release, args.main, args.count, args.package,
                       args.start, args.follow_merges)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(f"{data['commits']} commits after {data['branch_point']}, carried onto "
              f"{data['release']}")
        print(f"{'commit':12}  {'importpatch':11}  {'cherry-pick':11}  subject")
        for r in data["rows"]:
            print(f"{r['commit']:12}  {r['importpatch']:11}  {r['git']:11}  {r['subject']}")
        print("importpatch:", data["importpatch"], " hunks:", data["hunks"])
        print("cherry-pick:", data["cherry_pick"])
        print("clean where git conflicts on Python files:", data["clean_where_git_conflicts"])
        print(f"both clean: {data['both_clean']}, file text differs: "
              f"{', '.join(data['text_differs']) or 'none'}; new modules carried: "
              f"{data['new_modules']}, mode changes noted: {data['mode_changes']}")
    return 1 if data["clean_where_git_conflicts"] or data["text_differs"] else 0


if __name__ == "__main__":
    sys.exit(main())
