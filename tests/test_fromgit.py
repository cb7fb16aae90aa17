"""``importpatch from-git REPO REVS``: commits of a real git repository (made here, with real
``git``) turned into ordered diff patches and carried to a toy distribution's release with the
3-way merge of ``importpatch rebase``; the carried patches then patch that distribution in a
spawned interpreter with the installed hook. With ``IMPORTPATCH_VLLM_MIRROR`` naming a vLLM git
history, a run of its commits is carried too (scripts/eval/fork_corpus.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Venv, clean_env

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
CORE = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(40))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True, env={**os.environ, **GIT_ENV}).stdout


def commit(repo: Path, message: str, edits: dict[str, tuple[str, str] | str]) -> None:
    """Edit files (path -> (old, new) replaced once, or the whole new text) and commit."""
    for rel, change in edits.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(change, tuple):
            text = path.read_text()
            assert change[0] in text, (rel, change)
            path.write_text(text.replace(change[0], change[1], 1))
        else:
            path.write_text(change)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)


@pytest.fixture
def fork(tmp_path: Path) -> Path:
    """A repository: release v1.4.0 of tpkg, then a fork's commits of every kind."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, "release 1.4.0", {"tpkg/__init__.py": '__version__ = "1.4.0"\n',
                                   "tpkg/core.py": CORE, "tpkg/sub/__init__.py": "",
                                   "tpkg/sub/engine.py": "def step():\n    return 1\n",
                                   "setup.py": "setup()\n", "tests/test_core.py": "x = 1\n"})
    git(repo, "tag", "v1.4.0")
    commit(repo, "Fork: three", {"tpkg/core.py": ("x + 3\n", "x + 3  # fork\n"),
                                 "csrc/kernel.cu": "// a kernel\n",
                                 "tests/test_core.py": ("x = 1", "x = 2")})
    commit(repo, "Fork: thirty and the engine",
           {"tpkg/core.py": ("x + 30\n", "x + 300\n"),
            "tpkg/sub/engine.py": ("return 1", "return 2"), "setup.py": ("()", "(name='t')")})
    commit(repo, "Fork: ten", {"tpkg/core.py": ("x + 10\n", "x - 10\n")})
    commit(repo, "Fix twenty (merged upstream since)",
           {"tpkg/core.py": ("x + 20\n", "x + 20 + 0\n"), "tpkg/new.py": "y = 1\n"})
    commit(repo, "Fork: three again", {"tpkg/core.py": ("x + 3  # fork\n", "x + 33\n")})
    return repo


def release_tree(root: Path, version: str, core: str) -> Path:
    """A toy distribution tpkg ``version`` laid out as installed (dist-info included)."""
    (root / "tpkg" / "sub").mkdir(parents=True)
    (root / "tpkg" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    (root / "tpkg" / "core.py").write_text(core)
    (root / "tpkg" / "sub" / "__init__.py").write_text("")
    (root / "tpkg" / "sub" / "engine.py").write_text("def step():\n    return 1\n")
    info = root / f"tpkg-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tpkg\nVersion: {version}\n")
    (info / "top_level.txt").write_text("tpkg\n")
    (info / "RECORD").write_text("")
    return root


def upstream_core() -> str:
    """Release 1.5.0's core.py: lines added at the top, f10 changed, the f20 fix merged."""
    return "# 1.5.0\n" + CORE.replace("x + 10\n", "x + 10 + 0\n").replace(
        "x + 20\n", "x + 20 + 0\n")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "patches").mkdir()
    return clean_env({"IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"),
                      "XDG_DATA_HOME": str(tmp_path / "data"),
                      "IMPORTPATCH_PATH": str(tmp_path / "patches"), "NO_COLOR": "1"})


def run_cli(*args: str, env: dict[str, str], rc: int = 0,
            python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([python, "-m", "importpatch", *args], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    return proc


def statuses(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["name"], p["status"]) for p in report["patches"]]


def test_a_fork_becomes_ordered_patches_carried_to_the_next_release(
    fork: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    target = release_tree(tmp_path / "t150", "1.5.0", upstream_core())
    out = run_cli("from-git", str(fork), "v1.4.0..HEAD", "--to", str(target), "--name", "fork",
                  "--json", env=env, rc=1)  # one conflict: exit status 1
    report = json.loads(out.stdout)
    assert report["package"] == "tpkg" and report["base"] == "tpkg==1.4.0"
    assert report["target"] == "tpkg==1.5.0"
    assert statuses(report) == [("fork-0001-fork-three", "carried"),
                                ("fork-0002-fork-thirty-and-the-engine", "carried"),
                                ("fork-0003-fork-ten", "conflict"),
                                ("fork-0004-fix-twenty-merged-upstream-since", "carried"),
                                ("fork-0005-fork-three-again", "carried")]
    p1, p2, p3, p4, p5 = report["patches"]
    assert p1["not_carried"] == {"csrc/kernel.cu": "not a Python file",
                                 "tests/test_core.py": "outside the package tpkg/"}
    assert p2["not_carried"] == {"setup.py": "outside the package tpkg/"}
    assert p4["not_carried"] == {}  # its new module is carried (its fix is upstream)
    assert [(f["path"], f["how"], f["detail"]) for f in p4["files"]] == [
        ("tpkg/core.py", "upstream", ""), ("tpkg/new.py", "merged", "a new module")]
    assert [h["status"] for f in p2["files"] for h in f["hunks"]] == ["applied", "applied"]
    assert p3["hunks"]["conflict"] == 1 and p4["hunks"]["upstream"] == 1

    patches = Path(env["IMPORTPATCH_PATH"])
    assert sorted(os.listdir(patches)) == [f"{p['name']}.diff" for p in (p1, p2, p3, p4, p5)]
    head = (patches / f"{p1['name']}.diff").read_text().split("diff --git", 1)[0]
    assert head.startswith("Name: fork-0001-fork-three\nBase: tpkg==1.5.0\n"
                           "Requires: tpkg>=1.5,<1.6\nDefault: off\nSummary: Fork: three\n")
    # The conflict keeps its as-made diff (Base: the release it sits on, inert on 1.5) ...
    made = (patches / f"{p3['name']}.diff").read_text()
    assert "Base: tpkg==1.4.0\nRequires: tpkg>=1.4,<1.5\n" in made
    # ... and leaves git's markers in rebase's work folder, naming both sides and the base.
    merged = Path(p3["files"][0]["work_file"]).read_text()
    assert ("<<<<<<< tpkg==1.5.0\n    return x + 10 + 0\n||||||| " in merged
            and "=======\n    return x - 10\n>>>>>>> fork-0003-fork-ten (your change)\n" in merged)

    # The carried patches, in name order, are a chain real git applies to the release
    # (a checkout of 1.5.0): f3 ends as the last commit left it, the conflict left out.
    checkout = tmp_path / "checkout"
    (checkout / "tpkg" / "sub").mkdir(parents=True)
    (checkout / "tpkg" / "core.py").write_text(upstream_core())
    (checkout / "tpkg" / "sub" / "engine.py").write_text("def step():\n    return 1\n")
    git(checkout, "init", "-q")
    for p in (p1, p2, p4, p5):
        git(checkout, "apply", str(patches / f"{p['name']}.diff"))
    assert (checkout / "tpkg" / "new.py").read_text() == "y = 1\n"  # the new module
    core = (checkout / "tpkg" / "core.py").read_text()
    assert "x + 33\n" in core and "x + 300\n" in core and "x + 10 + 0\n" in core
    assert core.count("x + 20 + 0\n") == 1  # the upstream fix is not made twice
    assert (checkout / "tpkg" / "sub" / "engine.py").read_text().endswith("return 2\n")

    # Resolving the conflict and saving writes the carried diff over the as-made one.
    Path(p3["files"][0]["work_file"]).write_text(
        (target / "tpkg" / "core.py").read_text().replace("x + 10 + 0\n", "x - 10 + 0\n"))
    run_cli("save", p3["name"], env=env)
    saved = (patches / f"{p3['name']}.diff").read_text()
    assert "Base: tpkg==1.5.0\n" in saved and "+    return x - 10 + 0\n" in saved


def test_carried_patches_patch_the_installed_release_in_a_spawned_process(
    fork: Path, tmp_path: Path, env: dict[str, str], rebase_venv: Venv
) -> None:
    site = release_tree(tmp_path / "site", "1.5.0", upstream_core())
    env = {**env, "PYTHONPATH": str(site)}
    py = str(rebase_venv.python)  # carrying merges 3-way: the rebase extra (merge3)
    report = json.loads(run_cli("from-git", str(fork), "v1.4.0..HEAD~1", "--name", "fork",
                                "--json", env=env, rc=1, python=py).stdout)
    assert report["target"] == "tpkg==1.5.0"  # the installed release (default --to)
    names = [p["name"] for p in report["patches"] if p["status"] == "carried"]
    assert len(names) == 3  # the third adds tpkg.new
    code = ("import multiprocessing as mp, tpkg.core as c, tpkg.sub.engine as e\n"
            "def child(q): import tpkg.core as c; q.put(c.f30(0))\n"
            "if __name__ == '__main__':\n"
            "    ctx = mp.get_context('spawn'); q = ctx.Queue(); p = ctx.Process(target=child,"
            " args=(q,)); p.start(); print(c.f3(0), c.f30(0), e.step(), q.get()); p.join()\n")
    script = tmp_path / "run.py"
    script.write_text(code)
    plain = subprocess.run([py, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert plain.stdout.split() == ["3", "30", "1", "30"], plain.stderr
    on = subprocess.run([py, str(script)], capture_output=True, text=True, timeout=120,
                        env={**env, "IMPORTPATCH_ENABLE": ",".join(names)})
    assert on.stdout.split() == ["3", "300", "2", "300"], on.stderr  # spawned child too


def test_squash_commits_and_no_carry(fork: Path, tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "one.diff"
    report = json.loads(run_cli("from-git", str(fork), "v1.4.0..HEAD", "--squash", "--to",
                                "none", "--name", "all", "--out", str(out), "--json",
                                env=env).stdout)
    assert statuses(report) == [("all", "made")]
    text = out.read_text()
    assert text.startswith("Name: all\nBase: tpkg==1.4.0\nRequires: tpkg>=1.4,<1.5\n")
    # The squashed diff, made against the tag, is what git applies to a checkout of the tag.
    checkout = tmp_path / "checkout"
    git(fork, "worktree", "add", "-q", str(checkout), "v1.4.0")
    git(checkout, "apply", str(out))
    assert (checkout / "tpkg" / "core.py").read_text() == (fork / "tpkg" / "core.py").read_text()
    # Commits named one by one (not a range), written as made.
    second = git(fork, "rev-parse", "HEAD~3").strip()
    report = json.loads(run_cli("from-git", str(fork), "HEAD~4", second, "--to", "none",
                                "--json", env=env).stdout)
    assert [p["name"] for p in report["patches"]] == ["repo-0001-fork-three",
                                                      "repo-0002-fork-thirty-and-the-engine"]
    assert {p["status"] for p in report["patches"]} == {"made"}


@pytest.mark.parametrize("case", ["not-a-repo", "unknown-rev", "dirty", "no-python", "empty",
                                  "no-package"])
def test_bad_input_is_one_line_and_changes_nothing(
    case: str, fork: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    target = release_tree(tmp_path / "t150", "1.5.0", upstream_core())
    repo, revs = str(fork), ["v1.4.0..HEAD"]
    if case == "not-a-repo":
        repo = str(tmp_path / "t150")
    elif case == "unknown-rev":
        revs = ["v1.4.0..no-such-branch"]
    elif case == "dirty":
        (fork / "tpkg" / "core.py").write_text("dirty\n")
    elif case == "no-python":
        commit(fork, "docs only", {"README.md": "hi\n", "csrc/kernel.cu": ("kernel", "kernels")})
        revs = ["HEAD~1..HEAD"]
    elif case == "empty":
        revs = ["HEAD..HEAD"]
    else:
        revs = ["v1.4.0..HEAD", "--package", "nosuch"]
    before = git(fork, "status", "--porcelain") if case != "not-a-repo" else ""
    proc = run_cli("from-git", repo, *revs, "--to", str(target), env=env, rc=2)
    error = [line for line in proc.stderr.splitlines() if line.startswith("importpatch: error")]
    assert len(error) == 1 and proc.stdout == "", proc.stderr
    expected = {"not-a-repo": "is not a git repository", "unknown-rev": "'no-such-branch'",
                "dirty": "has uncommitted changes (tpkg/core.py)",
                "no-python": "no Python file changes in HEAD~1..HEAD (1 commits; "
                             "changed: README.md, csrc/kernel.cu)",
                "empty": "the range HEAD..HEAD has no commits",
                "no-package": "no Python file under nosuch/ changes"}[case]
    assert expected in error[0]
    assert os.listdir(env["IMPORTPATCH_PATH"]) == []
    assert not Path(env["XDG_DATA_HOME"]).exists()
    if case != "not-a-repo":
        assert git(fork, "status", "--porcelain") == before


def test_fork_corpus_script_on_a_synthetic_history(tmp_path: Path) -> None:
    """scripts/eval/fork_corpus.py's tallies against git cherry-pick, on a generated history (the
    same script runs on vLLM's history with IMPORTPATCH_VLLM_MIRROR)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "eval" / "fork_corpus.py"),
                           "--synthetic", "--json"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **GIT_ENV})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    ours, cherry = data["importpatch"], data["cherry_pick"]
    assert data["commits"] >= 20
    assert sum(ours.values()) == data["commits"]
    assert ours["upstream"] >= 1 and ours["conflict"] >= 1 and ours["nothing"] >= 1
    # On this history git and from-git agree on every commit (no Python: git picks it clean).
    assert (ours["clean"] + ours["nothing"], ours["upstream"], ours["conflict"]) == (
        cherry["clean"], cherry["upstream"], cherry["conflict"])
    # Never clean where git conflicts on the same commit.
    assert data["clean_where_git_conflicts"] == 0
    # Where both are clean, the same file text (a new module and its later edit included), and
    # the chmod beside an edit noted, not a crash.
    assert data["both_clean"] >= 10 and data["text_differs"] == []
    assert data["new_modules"] == 1 and data["mode_changes"] == 1


@pytest.mark.skipif(not os.environ.get("IMPORTPATCH_VLLM_MIRROR"),
                    reason="IMPORTPATCH_VLLM_MIRROR (a vLLM git history) is not set")
def test_fork_corpus_on_vllm_history() -> None:
    mirror = os.environ["IMPORTPATCH_VLLM_MIRROR"]
    has = subprocess.run(["git", "-C", mirror, "rev-parse", "--verify", "-q", "v0.16.0"],
                         capture_output=True)
    if has.returncode != 0:
        pytest.skip(f"{mirror} has no v0.16.0 (fetch github:jinhuang12/vllm has vLLM's branch)")
    script = ROOT / "scripts" / "eval" / "fork_corpus.py"
    proc = subprocess.run([sys.executable, str(script), "--json"],
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, **GIT_ENV})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["commits"] >= 20 and data["clean_where_git_conflicts"] == 0


# -- issue 29: mode changes, missing objects, the base, a module that became a package -----------


def chmod_fork(tmp_path: Path) -> Path:
    """pkg/a.py and an executable pkg/b.py, tag v1.0; one commit edits a.py and chmods b.py -x
    (and a.py +x: a mode change beside a content change)."""
    repo = tmp_path / "chmod"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, "release 1.0", {"pkg/__init__.py": "", "pkg/a.py": CORE,
                                 "pkg/b.py": "#!/usr/bin/env python\nprint('b')\n"})
    (repo / "pkg" / "b.py").chmod(0o755)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "b is a script")
    git(repo, "tag", "v1.0")
    (repo / "pkg" / "b.py").chmod(0o644)
    (repo / "pkg" / "a.py").chmod(0o755)
    commit(repo, "Edit a, b is no script", {"pkg/a.py": ("x + 3\n", "x + 333\n")})
    return repo


def pkg_tree(root: Path, core: str = CORE) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "a.py").write_text(core)
    (root / "pkg" / "b.py").write_text("#!/usr/bin/env python\nprint('b')\n")
    return root


@pytest.mark.parametrize("squash", [False, True])
def test_a_chmod_beside_an_edit_is_noted_and_the_edit_carried(
    squash: bool, tmp_path: Path, env: dict[str, str]
) -> None:
    repo = chmod_fork(tmp_path)
    target = pkg_tree(tmp_path / "target", "# newer\n" + CORE)
    out = tmp_path / "out"
    out.mkdir()
    more = ["--squash"] if squash else []
    proc = run_cli("from-git", str(repo), "v1.0..HEAD", "--to", str(target), "--package", "pkg",
                   "--out", str(out), "--name", "fork", *more, "--json", env=env)
    [p] = json.loads(proc.stdout)["patches"]
    assert p["status"] == "carried", p
    assert p["not_carried"] == {
        "pkg/b.py": "only its mode 100755 -> 100644 (a mode is not code)",
        "pkg/a.py": "its mode 100644 -> 100755 (a mode is not code; its content is carried)"}
    assert [f["path"] for f in p["files"]] == ["pkg/a.py"]
    checkout = tmp_path / "checkout"
    pkg_tree(checkout, "# newer\n" + CORE)
    git(checkout, "init", "-q")
    git(checkout, "apply", p["out"])
    assert "x + 333\n" in (checkout / "pkg" / "a.py").read_text()
    text = run_cli("from-git", str(repo), "v1.0..HEAD", "--to", str(target), "--package", "pkg",
                   "--dry-run", *more, env=env).stdout
    assert "not carried: pkg/b.py (only its mode 100755 -> 100644 (a mode is not code))" in text


def test_a_saved_git_diff_with_a_chmod_section_is_a_patch(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """``git diff`` of that commit (a mode-only section for b.py) saved as a patch: check
    applies its content, and the installed hook patches the module (git apply accepts it too)."""
    repo = chmod_fork(tmp_path)
    diff = git(repo, "diff", "v1.0", "HEAD")
    assert diff.endswith("diff --git a/pkg/b.py b/pkg/b.py\nold mode 100755\nnew mode 100644\n")
    patches = Path(env["IMPORTPATCH_PATH"])
    (patches / "chmodded.diff").write_text("Name: chmodded\n" + diff)
    site = pkg_tree(tmp_path / "site")
    check = run_cli("check", "chmodded", "--against", str(site), "--json", env=env)
    [result] = json.loads(check.stdout)["patches"]
    assert result["status"] == "ok" and [op["module"] for op in result["ops"]] == ["pkg.a"]
    code = "import pkg.a; print(pkg.a.f3(0))"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        env={**env, "PYTHONPATH": str(site), "IMPORTPATCH_ENABLE": "chmodded"})
    assert on.stdout.split() == ["333"], on.stderr


def missing_objects(clone: Path) -> set[str]:
    listed = git(clone, "rev-list", "--objects", "--all", "--missing=print")
    return {line[1:] for line in listed.split() if line.startswith("?")}


def test_a_missing_object_is_named_with_how_to_fetch_it(
    fork: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    """A partial clone (--filter=blob:none): from-git reads the blobs of the package's files
    only (git fetches those lazily, the rest stays missing); with its remote gone, the object
    from-git needs is named with the fetch command (exit 2, not 'a bug in importpatch')."""
    git(fork, "config", "uploadpack.allowFilter", "true")
    clone = tmp_path / "partial.git"
    git(tmp_path, "clone", "-q", "--bare", "--filter=blob:none", f"file://{fork}", str(clone))
    kernel = git(fork, "rev-parse", "HEAD:csrc/kernel.cu").strip()
    core = git(fork, "rev-parse", "v1.4.0:tpkg/core.py").strip()  # the first commit's parent
    assert {kernel, core} <= missing_objects(clone)
    args = ("from-git", str(clone), "v1.4.0..HEAD", "--to", "none", "--json")

    moved = fork.with_name("moved")
    fork.rename(moved)  # the promisor remote is gone
    proc = run_cli(*args, env=env, rc=2)
    error = [line for line in proc.stderr.splitlines() if line.startswith("importpatch: error")]
    assert len(error) == 1 and proc.stdout == "" and "internal error" not in proc.stderr
    assert (f"tpkg/core.py at {git(moved, 'rev-parse', 'HEAD~5').strip()[:12]}: object {core} "
            f"is missing from {clone} (a partial clone: its promisor remote 'origin' did not "
            "give it)") in error[0]
    assert f"hint: fetch it where 'origin' is reachable: git -C {clone} fetch origin {core}" in (
        proc.stderr)
    assert os.listdir(env["IMPORTPATCH_PATH"]) == []

    moved.rename(fork)  # back: git fetches what from-git reads, and only that
    report = json.loads(run_cli(*args, env=env).stdout)
    assert len(report["patches"]) == 5
    assert core not in missing_objects(clone) and kernel in missing_objects(clone)


def test_a_shallow_clone_says_how_to_deepen_it(
    fork: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "2", f"file://{fork}", str(shallow))
    for revs, said in ((["v1.4.0..HEAD"], "unknown revision 'v1.4.0'"),
                       (["HEAD~1"], "has no parent")):
        proc = run_cli("from-git", str(shallow), *revs, "--to", "none", env=env, rc=2)
        assert f"{said}" in proc.stderr and "(a shallow clone: its history stops early)" in (
            proc.stderr), proc.stderr
        assert f"hint: git -C {shallow} fetch --unshallow (or --deepen=N)" in proc.stderr
    assert len(json.loads(run_cli("from-git", str(shallow), "HEAD", "--to", "none", "--json",
                                  env=env).stdout)["patches"]) == 1


def test_the_base_is_the_upstream_release_the_fork_sits_on(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """upstream: v1.0 on main, v1.1 on a release branch (a fix picked onto it); a fork of v1.1
    (remote 'upstream') tags its own v0.1.0 on its first commit. git describe of the range
    start names the fork's tag; the base is v1.1, and the report says how it was found."""
    up = tmp_path / "upstream"
    up.mkdir()
    git(up, "init", "-q", "-b", "main")
    commit(up, "release 1.0", {"tpkg/__init__.py": "", "tpkg/core.py": CORE})
    git(up, "tag", "v1.0")
    commit(up, "main goes on", {"tpkg/core.py": ("x + 1\n", "x + 1 + 0\n")})
    git(up, "checkout", "-q", "-b", "release-1.1", "v1.0")
    commit(up, "fix for 1.1", {"tpkg/core.py": ("x + 2\n", "x + 2 + 0\n")})
    git(up, "tag", "-a", "v1.1", "-m", "1.1")
    git(up, "checkout", "-q", "main")
    commit(up, "main goes on again", {"tpkg/core.py": ("x + 5\n", "x + 5 + 0\n")})
    fork = tmp_path / "fork"
    git(tmp_path, "clone", "-q", "-o", "upstream", "-b", "v1.1", str(up), str(fork))
    git(fork, "checkout", "-q", "-b", "fork")
    commit(fork, "Fork 1", {"tpkg/core.py": ("x + 3\n", "x + 33\n")})
    git(fork, "tag", "v0.1.0")  # the fork's own version
    commit(fork, "Fork 2", {"tpkg/core.py": ("x + 4\n", "x + 44\n")})
    assert git(fork, "describe", "--tags", "--abbrev=0", "v0.1.0").strip() == "v0.1.0"
    run = ("from-git", str(fork), "v0.1.0..HEAD", "--to", "none", "--json")
    report = json.loads(run_cli(*run, env=env).stdout)
    assert report["base"] == "tpkg==1.1", report.get("base_how")
    assert report["base_how"].startswith(
        "release tags of the remote 'upstream': the range start ")
    assert " is untagged; v1.1 is the nearest release, 1 commit(s) away" in report["base_how"]
    written = Path(env["IMPORTPATCH_PATH"]) / report["patches"][0]["name"]
    assert "Base: tpkg==1.1\nRequires: tpkg>=1.1,<1.2\n" in written.with_suffix(".diff").read_text()
    # --base chooses: a tag, NAME==VERSION; a word that is neither is refused.
    for given, base in (("v1.0", "tpkg==1.0"), ("tpkg==1.0.5", "tpkg==1.0.5")):
        report = json.loads(run_cli(*run, "--dry-run", "--base", given, env=env).stdout)
        assert report["base"] == base and report["base_how"].startswith("--base")
    proc = run_cli(*run, "--dry-run", "--base", "latest", env=env, rc=2)
    assert "--base latest: neither NAME==VERSION" in proc.stderr
    text = " ".join(run_cli(*run[:-1], "--dry-run", env=env).stdout.split())
    assert " base: release tags of the remote 'upstream': the range start " in text


def test_each_patch_gets_the_base_its_own_commit_sits_on(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A range across releases (issue 37 item 4): v1.0, a fix, v1.1 on the next commit, then
    12 commits with no tag. Each patch's Base is its own parent's release: 1.0 for the first,
    1.1 for those after v1.1, and a parent that is no release says so, naming the nearest one
    and how many commits away it is (here 11 for the last), never passed off as that release."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, "release 1.0", {"tpkg/__init__.py": "", "tpkg/core.py": CORE})
    git(repo, "tag", "v1.0")
    commit(repo, "fix one", {"tpkg/core.py": ("x + 1\n", "x + 1 + 0\n")})
    commit(repo, "release 1.1", {"tpkg/core.py": ("x + 2\n", "x + 2 + 0\n")})
    git(repo, "tag", "v1.1")
    for i in range(3, 15):
        commit(repo, f"work {i}", {"tpkg/core.py": (f"x + {i}\n", f"x + {i} + 0\n")})
    run = ("from-git", str(repo), "v1.0..HEAD", "--to", "none", "--name", "up")
    report = json.loads(run_cli(*run, "--json", env=env).stdout)
    assert report["base"] == "tpkg==1.0" and report["base_how"].endswith("the range start is v1.0")
    got = [(p["base"], p["base_distance"]) for p in report["patches"]]
    assert got[0] == ("tpkg==1.0", 0)  # its parent is v1.0
    assert got[2] == ("tpkg==1.1", 0)  # its parent is v1.1
    assert got[3:] == [("tpkg==1.1", k) for k in range(1, 12)]  # v1.1 plus k commits
    last = report["patches"][-1]
    assert " is untagged; v1.1 is the nearest release, 11 commit(s) away" in last["base_how"]
    patches = Path(env["IMPORTPATCH_PATH"])
    heads = [(patches / f"{p['name']}.diff").read_text().split("diff --git")[0]
             for p in report["patches"]]
    assert "Base: tpkg==1.0\n" in heads[0] and "Base: tpkg==1.1\n" in heads[2]
    assert "Base: tpkg==1.1\nRequires: tpkg>=1.1,<1.2\n" in heads[-1]
    text = " ".join(run_cli(*run, "--dry-run", env=env).stdout.split())
    assert (f"{last['name']} ({last['commit'][:12]}): made (not carried) base tpkg==1.1: "
            "release tags: the commit's parent ") in text
    assert "is untagged; v1.1 is the nearest release, 11 commit(s) away" in text


def test_a_module_that_became_a_package_is_named_as_the_target_has_it(
    fork: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    """tpkg/core.py of the fork is tpkg/core/__init__.py in release 1.5.0: the carried diffs
    name that file (git apply on the target works, a later commit's edit lands on top) and the
    report says what moved."""
    target = release_tree(tmp_path / "t150", "1.5.0", upstream_core())
    core = target / "tpkg" / "core.py"
    (target / "tpkg" / "core").mkdir()
    core.rename(target / "tpkg" / "core" / "__init__.py")
    out = tmp_path / "out"
    out.mkdir()
    report = json.loads(run_cli("from-git", str(fork), "v1.4.0..HEAD", "--to", str(target),
                                "--name", "fork", "--out", str(out), "--json", env=env,
                                rc=1).stdout)
    assert statuses(report)[0] == ("fork-0001-fork-three", "carried")
    p1, p2, _, _, p5 = report["patches"]
    [f1] = p1["files"]
    assert f1["path"] == "tpkg/core.py" and f1["target_path"] == "tpkg/core/__init__.py"
    assert f1["detail"] == ("tpkg/core.py is tpkg/core/__init__.py in tpkg==1.5.0: the module "
                            "became a package")
    text = " ".join(run_cli("from-git", str(fork), "v1.4.0..HEAD", "--to", str(target),
                            "--dry-run", env=env, rc=1).stdout.split())  # lines are wrapped
    assert " tpkg/core.py: merged (tpkg/core.py is tpkg/core/__init__.py in tpkg==1.5.0" in text
    checkout = tmp_path / "checkout"
    (checkout / "tpkg" / "core").mkdir(parents=True)
    (checkout / "tpkg" / "core" / "__init__.py").write_text(upstream_core())
    (checkout / "tpkg" / "sub").mkdir()
    (checkout / "tpkg" / "sub" / "engine.py").write_text("def step():\n    return 1\n")
    git(checkout, "init", "-q")
    for p in (p1, p2, p5):
        assert "diff --git a/tpkg/core/__init__.py b/tpkg/core/__init__.py\n" in Path(
            p["out"]).read_text()
        git(checkout, "apply", p["out"])
    moved = (checkout / "tpkg" / "core" / "__init__.py").read_text()
    assert "x + 33\n" in moved and "x + 300\n" in moved


# -- issue 29 item 3: new modules ------------------------------------------------------------------

HELPER = "def g():\n    return 42\n"


@pytest.fixture
def adding_fork(tmp_path: Path) -> Path:
    """v1.4.0, then: a commit adding tpkg/helper.py, a new package tpkg/sub/newpkg (an empty
    __init__.py and mod.py), a data file, deleting tpkg/sub/engine.py and making core use the
    helper; a second commit editing the new helper."""
    repo = tmp_path / "adding"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, "release 1.4.0", {"tpkg/__init__.py": '__version__ = "1.4.0"\n',
                                   "tpkg/core.py": CORE, "tpkg/sub/__init__.py": "",
                                   "tpkg/sub/engine.py": "def step():\n    return 1\n"})
    git(repo, "tag", "v1.4.0")
    (repo / "tpkg" / "sub" / "engine.py").unlink()
    commit(repo, "Add a helper", {
        "tpkg/helper.py": HELPER, "tpkg/sub/newpkg/__init__.py": "",
        "tpkg/sub/newpkg/mod.py": "from tpkg.helper import g\n\nVALUE = g() + 1\n",
        "tpkg/data.json": "{}\n",
        "tpkg/core.py": ("    return x + 3\n", "    from tpkg.helper import g\n    return g()\n")})
    commit(repo, "Helper says 43", {"tpkg/helper.py": ("return 42", "return 43")})
    return repo


def test_from_git_carries_new_modules_in_commit_order(
    adding_fork: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    target = release_tree(tmp_path / "t150", "1.5.0", upstream_core())
    (target / "tpkg" / "sub" / "engine.py").unlink()
    report = json.loads(run_cli("from-git", str(adding_fork), "v1.4.0..HEAD", "--to", str(target),
                                "--name", "add", "--json", env=env).stdout)
    assert statuses(report) == [("add-0001-add-a-helper", "carried"),
                                ("add-0002-helper-says-43", "carried")]
    p1, p2 = report["patches"]
    assert p1["not_carried"] == {"tpkg/data.json": "not a Python file",
                                 "tpkg/sub/engine.py": "a deleted module (a patch cannot delete "
                                                       "a module)"}
    assert [(f["path"], f["how"], f["detail"]) for f in p1["files"]] == [
        ("tpkg/core.py", "merged", ""), ("tpkg/helper.py", "merged", "a new module"),
        ("tpkg/sub/newpkg/__init__.py", "merged", "a new module"),
        ("tpkg/sub/newpkg/mod.py", "merged", "a new module")]
    first, second = (Path(p["out"]).read_text() for p in (p1, p2))
    assert ("diff --git a/tpkg/helper.py b/tpkg/helper.py\nnew file mode 100644\n"
            "--- /dev/null\n+++ b/tpkg/helper.py\n@@ -0,0 +1,2 @@\n") in first
    assert "--- a/tpkg/helper.py\n+++ b/tpkg/helper.py\n" in second  # an edit on top of it

    # git applies the chain to a checkout of the release: the new files as the fork has them.
    checkout = tmp_path / "checkout"
    (checkout / "tpkg" / "sub").mkdir(parents=True)
    (checkout / "tpkg" / "core.py").write_text(upstream_core())
    git(checkout, "init", "-q")
    for p in (p1, p2):
        git(checkout, "apply", p["out"])
    for rel in ("tpkg/helper.py", "tpkg/sub/newpkg/mod.py", "tpkg/sub/newpkg/__init__.py"):
        assert (checkout / rel).read_text() == (adding_fork / rel).read_text(), rel

    # The hook adds the modules, in a spawned child too; status names them; check passes.
    names = ",".join(p["name"] for p in (p1, p2))
    env = {**env, "PYTHONPATH": str(target), "IMPORTPATCH_EVENTS_DIR": str(tmp_path / "ev")}
    script = tmp_path / "run.py"
    script.write_text(
        "import multiprocessing as mp\n"
        "def child(q):\n"
        "    import tpkg.core, tpkg.sub.newpkg.mod as m; q.put((tpkg.core.f3(0), m.VALUE))\n"
        "if __name__ == '__main__':\n"
        "    import tpkg.core, tpkg.helper, inspect\n"
        "    ctx = mp.get_context('spawn'); q = ctx.Queue()\n"
        "    p = ctx.Process(target=child, args=(q,)); p.start(); got = q.get(); p.join()\n"
        "    print(tpkg.core.f3(0), *got, inspect.getsource(tpkg.helper.g).split()[-1])\n")
    on = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        timeout=120, env={**env, "IMPORTPATCH_ENABLE": names})
    assert on.stdout.split() == ["43", "43", "44", "43"], on.stderr
    status = run_cli("status", "--events-dir", str(tmp_path / "ev"), env=env).stdout
    assert "applied add-0001-add-a-helper -> tpkg.helper (new-module)" in status
    assert "applied add-0002-helper-says-43 -> tpkg.helper (source-diff)" in status
    assert "applied add-0001-add-a-helper -> tpkg.sub.newpkg.mod (new-module)" in status
    checked = json.loads(run_cli("check", names.replace(",", " ").split()[0], "--against",
                                 str(target), "--json", env=env).stdout)["patches"][0]
    assert checked["status"] == "ok", checked
    assert "adds module tpkg.helper (a new file, 2 lines)" in [o["detail"] for o in
                                                              checked["ops"]]
    off = subprocess.run([sys.executable, "-c", "import tpkg.helper"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert "No module named 'tpkg.helper'" in off.stderr  # off: the module does not exist

    # A release that gained the same helper: that file is already upstream; check says so.
    newer = release_tree(tmp_path / "t160", "1.6.0", upstream_core())
    (newer / "tpkg" / "helper.py").write_text(HELPER)
    again = json.loads(run_cli("from-git", str(adding_fork), "v1.4.0..HEAD", "--to", str(newer),
                               "--name", "add", "--dry-run", "--json", env=env).stdout)
    assert [(f["path"], f["how"]) for f in again["patches"][0]["files"]][1] == (
        "tpkg/helper.py", "upstream")
    assert "+++ b/tpkg/helper.py" not in again["patches"][0].get("text", "")
    checked = json.loads(run_cli("check", p1["name"], "--against", str(newer), "--json",
                                 env=env, rc=1).stdout)["patches"][0]
    assert [o["status"] for o in checked["ops"] if o["target"] == "tpkg.helper"] == [
        "already-applied"]
    # rebase carries the new module too: already upstream in 1.6.0.
    rebased = json.loads(run_cli("rebase", p1["name"], "--base", str(target), "--to", str(newer),
                                 "--dry-run", "--json", env=env).stdout)
    assert [(f["path"], [h["status"] for h in f["hunks"]]) for f in rebased["files"]][1] == (
        "tpkg/helper.py", ["upstream"])
    assert "tpkg/helper.py" not in rebased["diff"] and "tpkg/sub/newpkg/mod.py" in rebased["diff"]


def test_a_renamed_module_is_carried_under_its_new_name(tmp_path: Path, env: dict[str, str]
                                                        ) -> None:
    """A fork commit renames a module and imports it by the new name (ROCm's db65e588e renames
    ``morflot_llm.py`` to ``fast_sync_llm.py`` and ``vllm/__init__.py`` imports it): the new
    name is a module the patch adds, so the carried patch imports what it adds; the old module
    stays (a patch cannot delete one), and the report says so."""
    repo = tmp_path / "renaming"
    repo.mkdir()
    git(repo, "init", "-q")
    old = "def go():\n    return 'old'\n" + CORE
    commit(repo, "release 1.0", {"pkg/__init__.py": "", "pkg/a.py": CORE})
    git(repo, "tag", "v1.0")
    commit(repo, "Add the engine", {"pkg/engine.py": old,
                                    "pkg/a.py": ("x + 3\n", "x + 3  # engine\n")})
    git(repo, "mv", "pkg/engine.py", "pkg/fast_engine.py")
    commit(repo, "Rename the engine", {"pkg/fast_engine.py": old.replace("'old'", "'fast'"),
                                       "pkg/__init__.py": "from pkg.fast_engine import go\n"})
    target = tmp_path / "target"
    (target / "pkg").mkdir(parents=True)
    (target / "pkg" / "__init__.py").write_text("")
    (target / "pkg" / "a.py").write_text("# newer\n" + CORE)
    out = tmp_path / "out"
    out.mkdir()
    report = json.loads(run_cli("from-git", str(repo), "v1.0..HEAD", "--to", str(target),
                                "--package", "pkg", "--name", "ren", "--out", str(out),
                                "--json", env=env).stdout)
    assert statuses(report) == [("ren-0001-add-the-engine", "carried"),
                                ("ren-0002-rename-the-engine", "carried")]
    second = report["patches"][1]
    assert second["not_carried"] == {
        "pkg/engine.py": "renamed to pkg/fast_engine.py: the old module stays (a patch cannot "
                         "delete a module)"}
    assert [(f["path"], f["detail"]) for f in second["files"]] == [
        ("pkg/__init__.py", ""), ("pkg/fast_engine.py", "a new module")]
    # git applies the chain to the target: the renamed module as the fork has it, imported.
    git(target, "init", "-q")
    for p in report["patches"]:
        git(target, "apply", p["out"])
    assert (target / "pkg" / "fast_engine.py").read_text() == (
        repo / "pkg" / "fast_engine.py").read_text()
    ran = subprocess.run([sys.executable, "-c", "import pkg; print(pkg.go())"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(target)})
    assert ran.stdout.strip() == "fast", ran.stderr
