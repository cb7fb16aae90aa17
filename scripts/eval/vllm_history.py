"""Test cases from a real git history (vLLM's): one file changed by one commit, and the same file
some commits older and newer. A data generator for the diff engine's corpus tests and for 3-way
rebase measurements; it reads a git mirror and never stores any of its files.

Interface (stable; keys may be added, none renamed):

    import vllm_history                       # scripts/ on sys.path, or importlib from its path

    for case in vllm_history.cases(mirror, k=5, limit=200, seed=0, paths="vllm/"):
        case.commit   # C: a non-merge commit on the first-parent history of HEAD (full sha)
        case.path     # the one file C changes: modified (not added, deleted, renamed), *.py,
                      # under ``paths`` (a path prefix; "" for the whole repository)
        case.base     # the file at C^ (str)
        case.changed  # the file at C (str)
        case.diff     # ``git diff -U3 C^ C -- path`` with a/ b/ prefixes and git's defaults
                      # (myers, no colour, no renames), whatever the user's git config says
        case.k        # the k asked for
        case.older    # the file k first-parent commits before C^, None when it is not there
        case.newer    # the file k first-parent commits after C, None when it is not there

``mirror`` is a git directory (a bare repository, or the snapshot the ``fetch`` tool brings:
``/work/.mirror/<owner>+<name>/repo``) or a work tree. Cases come in a random order fixed by
``seed`` (the same mirror HEAD and seed give the same cases), at most ``limit`` of them; files
that are not UTF-8 and binary diffs are left out. ``eligible(mirror, paths)`` lists every
candidate commit; ``MIRROR_ENV`` names the environment variable the test-suite reads the mirror
path from (its tests skip, saying so, when it is unset).

The full ``vllm-project/vllm`` snapshot is over the ``fetch`` tool's size limit (1.1 GB; 2026-12);
forks carry the same first-parent history, e.g. ``fetch github:local-inference-lab/vllm`` (16,825
first-parent commits, 4,045 eligible single-file ``vllm/*.py`` commits; a few fork commits on top).

``synthetic_mirror(dest, commits, seed)`` writes a small generated history (Python-like files, no
vLLM text) with the shapes that make diffs hard: blank lines and brackets everywhere, repeated
blocks, headers inserted at the top, code appended at the end, files without a final newline,
multi-file and non-.py commits and merges (which ``cases`` must skip). The always-on tests use
it; it needs only git.

Command line:

    python scripts/eval/vllm_history.py [MIRROR] --k 5 --limit 20 [--seed 0] [--paths vllm/]
        [--out DIR]    write each case as DIR/NNN-<sha>/{base,changed,older,newer}.py, diff.patch
        [--jsonl]      print each case as one JSON object per line
    python scripts/eval/vllm_history.py --synthetic DIR [--commits 300] [--seed 0]

MIRROR defaults to $IMPORTPATCH_VLLM_MIRROR. Without --out/--jsonl it prints one line per case.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

MIRROR_ENV = "IMPORTPATCH_VLLM_MIRROR"

__all__ = ["MIRROR_ENV", "Case", "cases", "eligible", "synthetic_mirror"]


@dataclasses.dataclass(frozen=True)
class Case:
    commit: str
    path: str
    base: str
    changed: str
    diff: str
    k: int
    older: str | None
    newer: str | None


# Output that does not depend on the user's or the system's git configuration.
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}
_DIFF_ARGS = ["--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "-U3",
              "--diff-algorithm=myers", "--src-prefix=a/", "--dst-prefix=b/"]


def _git_base(mirror: str) -> list[str]:
    path = Path(mirror)
    git_dir = path if (path / "objects").is_dir() and (path / "HEAD").is_file() else path / ".git"
    return ["git", "-c", "safe.directory=*", "-c", "core.quotePath=false",
            f"--git-dir={git_dir}"]


def _git(mirror: str, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    proc = subprocess.run([*_git_base(mirror), *args], capture_output=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode("utf-8", "surrogateescape")


def first_parent_chain(mirror: str) -> list[str]:
    """Commits of HEAD's first-parent history, oldest first."""
    return _git(mirror, "rev-list", "--first-parent", "--reverse", "HEAD", "--").split()


def eligible(mirror: str, paths: str = "vllm/") -> list[tuple[str, str]]:
    """(commit, path) of every non-merge first-parent commit that modifies exactly one file, a
    ``*.py`` under ``paths``; newest first."""
    log = _git(mirror, "log", "--first-parent", "--no-renames", "--name-status",
               "--format=%x00%H %P", "HEAD", "--")
    found: list[tuple[str, str]] = []
    for record in log.split("\0")[1:]:
        head, *rest = record.strip("\n").split("\n")
        shas = head.split()
        changes = [line.split("\t") for line in rest if line]
        if len(shas) != 2 or len(changes) != 1:
            continue  # a merge or a root commit, or not exactly one file
        status, *names = changes[0]
        path = names[0] if names else ""
        if status == "M" and path.endswith(".py") and path.startswith(paths):
            found.append((shas[0], path))
    return found


class _Blobs:
    """``git cat-file --batch``: file contents by ``rev:path``, one process for all reads."""

    def __init__(self, mirror: str) -> None:
        env = {**os.environ, **_GIT_ENV}
        self.proc = subprocess.Popen(
            [*_git_base(mirror), "cat-file", "--batch"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )

    def read(self, rev: str, path: str) -> bytes | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{rev}:{path}\n".encode())
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        if len(header) != 3 or header[1] != b"blob":
            return None  # "<rev:path> missing" (or a tree, a submodule)
        size = int(header[2])
        data = self.proc.stdout.read(size)
        self.proc.stdout.read(1)  # the newline after the contents
        return data

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def cases(
    mirror: str, k: int, limit: int, seed: int = 0, paths: str = "vllm/"
) -> Iterator[Case]:
    """Up to ``limit`` cases, in an order fixed by ``seed``; see the module docstring."""
    if k < 0 or limit < 0:
        raise ValueError("k and limit must be >= 0")
    chain = first_parent_chain(mirror)
    where = {sha: i for i, sha in enumerate(chain)}
    todo = eligible(mirror, paths)
    random.Random(seed).shuffle(todo)
    blobs = _Blobs(mirror)
    made = 0
    try:
        for commit, path in todo:
            if made >= limit:
                return
            i = where[commit]
            base = _text(blobs.read(f"{commit}^", path))
            changed = _text(blobs.read(commit, path))
            if base is None or changed is None:
                continue
            diff = _git(mirror, "diff", *_DIFF_ARGS, f"{commit}^", commit, "--", path)
            if "\n@@ " not in diff or "\nBinary files " in diff:
                continue  # a mode-only change, or git took the file for binary
            older = _text(blobs.read(chain[i - 1 - k], path)) if i - 1 - k >= 0 else None
            newer = _text(blobs.read(chain[i + k], path)) if i + k < len(chain) else None
            made += 1
            yield Case(commit, path, base, changed, diff, k, older, newer)
    finally:
        blobs.close()


# -- a generated history for tests that must run without the mirror -------------------------------


def _function(rng: random.Random, n: int) -> list[str]:
    """A Python-like function full of the lines that make hunks ambiguous."""
    name = f"f{n}"
    body = [f"def {name}(x, y=None):", f'    """Step {n}."""']
    for _ in range(rng.randint(1, 5)):
        kind = rng.random()
        if kind < 0.3:
            body += ["    if x:", f"        return (x + {rng.randint(0, 9)})", ""]
        elif kind < 0.5:
            body += ["    result = call(", "        x,", "        y,", "    )"]
        elif kind < 0.7:
            body += ["    for item in items:", "        pass", ""]
        else:
            body.append(f"    y = {name}_helper(x, {rng.randint(0, 99)})")
    body += ["    return y", "", ""]
    return body


def _edit(rng: random.Random, lines: list[str], serial: int) -> list[str]:
    """One upstream-style edit: change, insert, delete, a header at the top, code at the end."""
    lines = list(lines)
    kind = rng.random()
    at = rng.randrange(len(lines) + 1)
    if kind < 0.25 and lines:
        span = rng.randint(1, 3)
        lines[at:at + span] = [f"    z = {serial}  # changed", *(["    )"] * rng.randint(0, 1))]
    elif kind < 0.45:
        lines[at:at] = _function(rng, serial)
    elif kind < 0.6 and len(lines) > 4:
        del lines[at:at + rng.randint(1, 6)]
    elif kind < 0.7:
        lines[0:0] = [f"# SPDX-License-Identifier: Apache-2.0 ({serial})", ""]
    elif kind < 0.8:
        lines += _function(rng, serial)
    elif kind < 0.88 and lines:
        lines[0] = f"import mod{serial}"
    elif lines:
        lines[-1] = f"VERSION = {serial}"
    return lines


def synthetic_mirror(dest: str | os.PathLike[str], commits: int = 300, seed: int = 0) -> str:
    """Write a generated bare repository at ``dest`` (with ``git fast-import``, in well under a
    second) and return its path, for ``cases(path, ..., paths="pkg/")``."""
    rng = random.Random(seed)
    files: dict[str, list[str]] = {
        f"pkg/{name}.py": [line for n in range(rng.randint(4, 12)) for line in _function(rng, n)]
        for name in ("core", "utils", "sched", "sample", "sub/attn")
    }
    no_newline: set[str] = set()
    stream: list[bytes] = []

    def blob(path: str) -> bytes:
        text = "\n".join(files[path]) + ("" if path in no_newline else "\n")
        data = text.encode()
        return f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n"

    def commit(mark: int, message: str, changes: list[str], parent: int | None,
               branch: str = "refs/heads/main", merge: int | None = None) -> None:
        when = 1_700_000_000 + mark * 60
        msg = message.encode()
        stream.append(
            f"commit {branch}\nmark :{mark}\n"
            f"author Gen <gen@example.invalid> {when} +0000\n"
            f"committer Gen <gen@example.invalid> {when} +0000\n"
            f"data {len(msg)}\n".encode() + msg + b"\n"
        )
        if parent is not None:
            stream.append(f"from :{parent}\n".encode())
        if merge is not None:
            stream.append(f"merge :{merge}\n".encode())
        stream.extend(blob(path) if path in files else f"D {path}\n".encode() for path in changes)
        stream.append(b"\n")

    commit(1, "initial", sorted(files), None)
    files["NOTES.txt"] = ["notes"]
    head = 1
    mark = 2
    for serial in range(commits):
        roll = rng.random()
        py = sorted(p for p in files if p.endswith(".py"))
        if roll < 0.7:
            path = rng.choice(py)
            files[path] = _edit(rng, files[path], serial) or ["pass"]
            if rng.random() < 0.05:
                no_newline ^= {path}
            changed = [path]
        elif roll < 0.8:
            changed = rng.sample(py, 2)
            for path in changed:
                files[path] = _edit(rng, files[path], serial) or ["pass"]
        elif roll < 0.88:
            files["NOTES.txt"].append(f"note {serial}")
            changed = ["NOTES.txt"]
        elif roll < 0.94:
            # A side branch merged back: its commit is not on the first-parent chain, the merge
            # is; cases() must skip both.
            side = rng.choice(py)
            files[side] = _edit(rng, files[side], serial) or ["pass"]
            commit(mark, f"side {serial}", [side], head, branch="refs/heads/side")
            commit(mark + 1, f"merge {serial}", [side], head, merge=mark)
            head, mark = mark + 1, mark + 2
            continue
        else:
            path = f"pkg/new{serial}.py"
            files[path] = _function(rng, serial)
            changed = [path]
        commit(mark, f"change {serial}", changed, head)
        head, mark = mark, mark + 1

    dest = os.fspath(dest)
    env = {**os.environ, **_GIT_ENV}
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", dest], check=True, env=env)
    subprocess.run(["git", f"--git-dir={dest}", "fast-import", "--quiet"],
                   input=b"".join(stream), check=True, env=env)
    return dest


# -- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mirror", nargs="?", default=os.environ.get(MIRROR_ENV),
                        help=f"git directory or work tree (default: ${MIRROR_ENV})")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paths", default="vllm/", help="path prefix of the files (default vllm/)")
    parser.add_argument("--out", type=Path, help="write each case's files under this folder")
    parser.add_argument("--jsonl", action="store_true", help="one JSON object per case")
    parser.add_argument("--synthetic", type=Path, metavar="DIR",
                        help="write a generated repository at DIR instead (paths under pkg/)")
    parser.add_argument("--commits", type=int, default=300, help="with --synthetic")
    args = parser.parse_args(argv)
    if args.synthetic:
        print(synthetic_mirror(args.synthetic, args.commits, args.seed))
        return 0
    if not args.mirror:
        parser.error(f"give MIRROR or set ${MIRROR_ENV}")
    for n, case in enumerate(cases(args.mirror, args.k, args.limit, args.seed, args.paths)):
        if args.jsonl:
            print(json.dumps(dataclasses.asdict(case)))
        elif args.out:
            folder = args.out / f"{n:03d}-{case.commit[:10]}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "diff.patch").write_text(case.diff, newline="")
            for name in ("base", "changed", "older", "newer"):
                text = getattr(case, name)
                if text is not None:
                    (folder / f"{name}.py").write_text(text, newline="")
            (folder / "case.json").write_text(json.dumps(
                {"commit": case.commit, "path": case.path, "k": case.k}) + "\n")
        else:
            print(f"{case.commit[:10]} {case.path} base={len(case.base.splitlines())} "
                  f"older={'-' if case.older is None else 'yes'} "
                  f"newer={'-' if case.newer is None else 'yes'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
