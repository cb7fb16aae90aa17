"""Never wrong-clean (issue 37 item 1): a rebase or from-git carry is clean only where its result
is what git's 3-way merge gives, or where it is shown right (the change present exactly once,
nothing upstream removed added back); otherwise it is a conflict with both sides.

The corpus is built of base/ours/upstream triples modelled on vLLM code (the model runner's
``load_model``, the sampler's ``forward`` and ``gather_logprobs``), each family in every
placement of its blank lines and blocks, since those placements are what the line alignment
trips on:

(a) the change is already in the target and upstream wrapped the region in ``try:``;
(b) the same with an ``if``;
(c) the commit wraps lines in an ``if`` and upstream put another ``if`` there (where they are the
    same lines, upstream later replaced the commit's ``if``: nesting one in the other re-adds the
    line upstream removed), with and without upstream dropping a line;
(d) upstream genuinely re-indented the lines (a ``with``, vLLM 0.29's ``gpu_sync_allowed``), the
    change not in the target yet: it must still merge, the edit applied re-indented (the
    vllm-gaudi case; its end-to-end test is tests/test_pins.py's
    test_a_copied_replace_converts_to_a_diff_of_the_edit_that_rebase_carries);
(v) a real one found in vLLM's history (``test_vllm_history_reindents_are_never_wrong_clean``
    mines such pairs with IMPORTPATCH_VLLM_MIRROR): #13269's change, which #13578 put under an
    ``if`` and kept the old line under its ``else``.

Every verdict is compared with real ``git merge-file`` (and ``git apply --3way`` in a repository
for the clean ones) run here; ``rebase`` and ``from-git`` are run through the command line on
(a).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import clean_env

from importpatch.rewrite import diffs
from importpatch.tools import rebase

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


@dataclasses.dataclass(frozen=True)
class Case:
    family: str  # a | b | c | d
    name: str
    base: str
    ours: str
    theirs: str
    want: str  # noop | merge | conflict | either (clean or conflict, judged by the oracle)
    expected: str = ""  # the right merged text, where the family knows it
    once: tuple[str, ...] = ()  # lines (stripped) the clean result must hold exactly once
    gone: tuple[str, ...] = ()  # lines (stripped) upstream removed: never back in the result


def _ind(lines: list[str]) -> list[str]:
    return ["    " + x if x else x for x in lines]


# -- (a), (b): vllm/v1/worker/gpu_model_runner.py load_model, the change already upstream ------

_RUNNER_HEAD = '''class GPUModelRunner:

    def load_model(self) -> None:
        logger.info("Starting to load model %s...", self.model_config.model)
'''
_RUNNER_BODY = ["        with DeviceMemoryProfiler() as m:",
                "            self.model = get_model(vllm_config=self.vllm_config)"]
_RUNNER_TAIL = '''        self.model_memory_usage = m.consumed_memory
        logger.info("Model loading took %.4f GiB", self.model_memory_usage / GiB_bytes)

    def get_model(self) -> nn.Module:
        return self.model
'''
_CALL = "        self.maybe_setup_kv_connector()"
_WRAPS = {
    "a": (["        try:"], ["        except torch.cuda.OutOfMemoryError as e:",
                             '            raise RuntimeError("out of memory loading") from e']),
    "b": (['        if self.load_config.load_format != "dummy":'], []),
}


def _runner(lines: list[str]) -> str:
    return _RUNNER_HEAD + "".join(x + "\n" for x in lines) + _RUNNER_TAIL


def family_ab(family: str) -> Iterator[Case]:
    head, tail = _WRAPS[family]
    for blanks in (1, 2, 3):
        for block in ([_CALL], [_CALL, ""], ["", _CALL], ["", _CALL, ""]):
            for at in range(blanks + 1):
                base = [""] * blanks + _RUNNER_BODY
                ours = base[:at] + block + base[at:]
                for lo in range(at + 1):
                    theirs = ours[:lo] + head + _ind(ours[lo:]) + tail
                    yield Case(family, f"{family}-blanks{blanks}-block{len(block)}"
                               f"{'b' if block[0] == '' else 'c'}-at{at}-wrap{lo}",
                               _runner(base), _runner(ours), _runner(theirs), "either",
                               expected=_runner(theirs), once=(_CALL.strip(),))


# -- (c): vllm/v1/sample/sampler.py forward, an `if` where the commit put one -------------------

_SAMPLER_HEAD = '''class Sampler(nn.Module):

    def forward(self, logits, sampling_metadata):
'''
_STEPS = ["        logits = self.apply_allowed_token_ids(logits, sampling_metadata)",
          "        logits = self.apply_bad_words(logits, sampling_metadata)",
          "        logits = self.apply_logits_processors(logits, sampling_metadata)",
          "        logits = self.apply_penalties(logits, sampling_metadata)"]
_SAMPLER_TAIL = '''        sampled = self.sample(logits, sampling_metadata)
        return sampled

    def compute_logprobs(self, logits):
        return logits.log_softmax(dim=-1, dtype=torch.float32)
'''
OURS_IF = "        if sampling_metadata.bad_words_token_ids:"
THEIRS_IF = "        if not sampling_metadata.no_penalties:"


def _sampler(lines: list[str]) -> str:
    return _SAMPLER_HEAD + "".join(x + "\n" for x in lines) + _SAMPLER_TAIL


def family_c() -> Iterator[Case]:
    for i, j in itertools.combinations(range(len(_STEPS) + 1), 2):
        ours = _STEPS[:i] + [OURS_IF] + _ind(_STEPS[i:j]) + _STEPS[j:]
        for p, q in itertools.combinations(range(len(_STEPS) + 1), 2):
            for drop in [None, *range(p, q)]:
                inner = [x for k, x in enumerate(_STEPS[p:q], p) if k != drop]
                theirs = _STEPS[:p] + [THEIRS_IF] + _ind(inner) + _STEPS[q:]
                gone = () if drop is None else (_STEPS[drop].strip(),)
                # Upstream's `if` in the very place of the commit's (the same lines): it
                # replaced the commit's `if`; only a person can say how the two combine.
                want = "conflict" if (i, j) == (p, q) else "either"
                yield Case("c", f"c-ours{i}:{j}-theirs{p}:{q}-drop{drop}", _sampler(_STEPS),
                           _sampler(ours), _sampler(theirs), want,
                           once=(OURS_IF.strip(), THEIRS_IF.strip()), gone=gone)


# -- (d): vllm/v1/sample/sampler.py gather_logprobs, upstream's `with` (the vllm-gaudi case) ----

_GATHER_HEAD = '''class Sampler(nn.Module):

    def gather_logprobs(self, logprobs, num_logprobs, token_ids):
        assert token_ids.dtype == torch.int64
        topk_logprobs, topk_indices = torch.topk(logprobs, num_logprobs, dim=-1)
'''
_GATHER = ["        token_ids = token_ids.unsqueeze(-1)",
           "        token_logprobs = logprobs.gather(-1, token_ids)",
           "        token_ranks = batched_count_greater_than(logprobs, token_logprobs)"]
_GATHER_TAIL = '''        indices = torch.cat((token_ids, topk_indices), dim=1)
        logprobs = torch.cat((token_logprobs, topk_logprobs), dim=1)
        return LogprobsTensors(indices, logprobs, token_ranks)
'''
_WITH = "        with gpu_sync_allowed(first_only=True):"
_CAST = "        token_logprobs = token_logprobs.to(torch.float32)"
_EDITS = {
    "deletes-two-lines": lambda ls: [ls[2]],
    "deletes-the-first": lambda ls: ls[1:],
    "edits-one-line": lambda ls: [ls[0], ls[1].replace("token_ids)", "token_ids).float()"), ls[2]],
    "adds-a-line": lambda ls: [ls[0], ls[1], _CAST, ls[2]],
}


def _gather(lines: list[str]) -> str:
    return _GATHER_HEAD + "".join(x + "\n" for x in lines) + _GATHER_TAIL


def family_d() -> Iterator[Case]:
    for name, edit in _EDITS.items():
        yield Case("d", f"d-{name}", _gather(_GATHER), _gather(edit(_GATHER)),
                   _gather([_WITH, *_ind(_GATHER)]), "merge",
                   expected=_gather([_WITH, *_ind(edit(_GATHER))]), once=(_WITH.strip(),))


# -- (v): a real one. vLLM #13269 (5ae9f26a5, "Fix device ordinal for multi-node spec decode")
# changed the sampler's init_tensors rank; #13578 (8c755c3b6, a few hours later) put it under
# `if model_parallel_is_initialized():` and kept the old line in the `else:`. Carrying #13269
# onto 8c755c3b6, the old rules made the change a second time, in the `else` (git conflicts).
# Excerpts of vllm/spec_decode/spec_decode_worker.py at 5ae9f26a5^, 5ae9f26a5 and 8c755c3b6.

_SPEC_BASE = (
    'from vllm.config import ParallelConfig, SpeculativeConfig, VllmConfig\n'
    'from vllm.distributed.communication_op import (broadcast_tensor_dict,\n'
    '                                               tensor_model_parallel_gather)\n'
    'from vllm.logger import init_logger\n'
    '\n'
    '\n'
    'class SpecDecodeWorker(LoraNotSupportedWorkerBase):\n'
    '\n'
    '    def load_model(self) -> None:\n'
    '        if self._enable_lm_head_weight_load:\n'
    '            # NOTE(Shangming): gather lm_head weight when tp enabled\n'
    '            target_lm_head_weight: torch.Tensor = tensor_model_parallel_gather(\n'
    '                self.scorer_worker.model_runner.model_runner.model.lm_head.\\\n'
    '                    weight.data,\n'
    '                    dim=0,\n'
    '            )\n'
    '\n'
    '            self.proposer_worker.maybe_load_lm_head_weight(\n'
    '                target_lm_head_weight)\n'
    '\n'
    '        self._metrics.init_tensors(self.rank, device_type=self.device)\n'
    '        self.spec_decode_sampler.init_tensors(self.rank,\n'
    '                                              device_type=self.device)\n'
    '\n'
    '        scorer_cls: Type[SpeculativeScorer]\n'
    '        if self.disable_mqa_scorer:\n'
    '            scorer_cls = BatchExpansionTop1Scorer\n'
    '            logger.info("[Speculative Decoding] Use batch "\n'
)
_PAD = " " * 46  # the continuation indent of both statements
_SPEC_OURS = _SPEC_BASE.replace(
    "(broadcast_tensor_dict,\n", f"(broadcast_tensor_dict,\n {_PAD}get_tp_group,\n", 1).replace(
    f"init_tensors(self.rank,\n{_PAD}", f"init_tensors(get_tp_group().local_rank,\n{_PAD}", 1)
_SPEC_THEIRS = (
    'from vllm.config import ParallelConfig, SpeculativeConfig, VllmConfig\n'
    'from vllm.distributed.communication_op import (broadcast_tensor_dict,\n'
    '                                               get_tp_group,\n'
    '                                               tensor_model_parallel_gather)\n'
    'from vllm.distributed.parallel_state import model_parallel_is_initialized\n'
    'from vllm.logger import init_logger\n'
    '\n'
    '\n'
    'class SpecDecodeWorker(LoraNotSupportedWorkerBase):\n'
    '\n'
    '    def load_model(self) -> None:\n'
    '        if self._enable_lm_head_weight_load:\n'
    '            # NOTE(Shangming): gather lm_head weight when tp enabled\n'
    '            target_lm_head_weight: torch.Tensor = tensor_model_parallel_gather(\n'
    '                self.scorer_worker.model_runner.model_runner.model.lm_head.\\\n'
    '                    weight.data,\n'
    '                    dim=0,\n'
    '            )\n'
    '\n'
    '            self.proposer_worker.maybe_load_lm_head_weight(\n'
    '                target_lm_head_weight)\n'
    '\n'
    '        self._metrics.init_tensors(self.rank, device_type=self.device)\n'
    '        if model_parallel_is_initialized():\n'
    '            self.spec_decode_sampler.init_tensors(get_tp_group().local_rank,\n'
    '                                                  device_type=self.device)\n'
    '        else:\n'
    '            self.spec_decode_sampler.init_tensors(self.rank,\n'
    '                                                  device_type=self.device)\n'
    '\n'
    '        scorer_cls: Type[SpeculativeScorer]\n'
    '        if self.disable_mqa_scorer:\n'
    '            scorer_cls = BatchExpansionTop1Scorer\n'
    '            logger.info("[Speculative Decoding] Use batch "\n'
)


def family_v() -> Iterator[Case]:
    yield Case("v", "v-vllm-13269-onto-8c755c3b6", _SPEC_BASE, _SPEC_OURS, _SPEC_THEIRS,
               "conflict")


CORPUS = [*family_ab("a"), *family_ab("b"), *family_c(), *family_d(), *family_v()]


# -- git ---------------------------------------------------------------------------------------


def git_merge_file(tmp: Path, case: Case) -> tuple[bool, str]:
    """Real ``git merge-file`` (diff3 style) of the case: (clean, text)."""
    for name, text in (("theirs", case.theirs), ("base", case.base), ("ours", case.ours)):
        (tmp / name).write_text(text)
    done = subprocess.run(["git", "merge-file", "-p", "--diff3", "theirs", "base", "ours"],
                          cwd=tmp, capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    assert 0 <= done.returncode < 128, done.stderr
    return done.returncode == 0, done.stdout


def git_apply_3way(tmp: Path, case: Case) -> tuple[bool, str]:
    """Real ``git apply --3way`` of the commit's diff (``git diff --full-index``, so the base
    blob is known and the 3-way merge runs) onto the target, in a repository: (clean, the file
    after)."""
    repo = tmp / "repo"
    repo.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              env={**os.environ, **GIT_ENV})

    run("init", "-q")
    (repo / "vllm").mkdir()
    (repo / "vllm" / "m.py").write_text(case.base)
    run("add", "-A")
    run("commit", "-qm", "base")
    (repo / "vllm" / "m.py").write_text(case.ours)
    run("commit", "-qam", "the commit")
    (tmp / "p.diff").write_text(run("diff", "--full-index", "HEAD~1", "HEAD").stdout)
    run("reset", "-q", "--hard", "HEAD~1")
    (repo / "vllm" / "m.py").write_text(case.theirs)
    run("commit", "-qam", "upstream")
    done = run("apply", "--3way", str(tmp / "p.diff"))
    return done.returncode == 0, (repo / "vllm" / "m.py").read_text()


def merged(case: Case) -> rebase.FileMerge:
    fp = diffs.parse(diffs.make_diff(case.base, case.ours, "vllm/m.py")).files[0]
    return rebase.merge_file(case.base, case.theirs, fp, rebase.Labels("target", "base", "patch"))


def keys(text: str) -> collections.Counter[str]:
    return collections.Counter(x.strip() for x in text.splitlines())


def verdict(fm: rebase.FileMerge, theirs: str) -> str:
    if not fm.clean:
        return "conflict"
    return "noop" if fm.text == theirs else "merge"


# -- the corpus ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_no_wrong_clean_merge_in_the_corpus(case: Case, tmp_path: Path) -> None:
    fm = merged(case)
    got = verdict(fm, case.theirs)
    git_clean, git_text = git_merge_file(tmp_path, case)
    if case.want != "either":
        assert got == case.want, (case.name, fm.text)
    if got == "conflict":
        # both sides, and the base, for a person to settle
        assert fm.conflicts and "<<<<<<< target" in fm.text and ">>>>>>> patch" in fm.text
        assert "||||||| base" in fm.text and "=======" in fm.text
        assert all(h.status in (rebase.CONFLICT, rebase.APPLIED, rebase.UPSTREAM)
                   for h in fm.hunks)
        return
    counts = keys(fm.text)
    for line in case.once:  # the change (and upstream's block) present exactly once
        assert counts[line] == 1, (case.name, line, fm.text)
    for line in case.gone:  # nothing upstream removed is back
        assert counts[line] == keys(case.theirs)[line], (case.name, line, fm.text)
    if case.expected:
        assert fm.text == case.expected, case.name
    if git_clean:  # where git merges, the result is git's
        assert fm.text == git_text, case.name
    if case.family in "ab":  # the target already has the change: nothing to do
        assert got == "noop" and all(h.status == rebase.UPSTREAM for h in fm.hunks), case.name


def test_corpus_counts_and_agreement_with_git(tmp_path: Path) -> None:
    """The whole corpus at once: how many cases, verdicts, and agreement with git (the numbers
    the report of issue 37 quotes). Wrong-clean is 0; every clean result that git also merges
    is git's text; where git conflicts and importpatch merges, only (d) (re-indent only,
    importpatch's one rule beyond git) and adjacent blocks of (c) merge."""
    tally: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for n, case in enumerate(CORPUS):
        folder = tmp_path / str(n)
        folder.mkdir()
        fm = merged(case)
        git_clean, git_text = git_merge_file(folder, case)
        got = verdict(fm, case.theirs)
        same = "git-conflict" if not git_clean else (
            "= git" if fm.clean and fm.text == git_text else "git clean, differs")
        tally[(case.family, got, same)] += 1
    counts = {f"{f} {v} ({s})": n for (f, v, s), n in sorted(tally.items())}
    print(json.dumps(counts, indent=1))
    assert len(CORPUS) == sum(tally.values()) == 76 + 76 + 300 + 4 + 1
    # (a), (b): 11 of 76 placements each merge as the target unchanged (the old rules made a
    # second copy of the change in every one of them); the rest conflict, as git does.
    for f in "ab":
        assert tally[(f, "noop", "git-conflict")] == 11
        assert tally[(f, "conflict", "git-conflict")] == 65
        assert not any(k[0] == f and k[1] == "merge" for k in tally)
    assert tally[("d", "merge", "git-conflict")] == 4
    assert tally[("v", "conflict", "git-conflict")] == 1
    assert tally[("c", "merge", "= git")] == 22 and tally[("c", "merge", "git-conflict")] == 20
    assert not any(s == "git clean, differs" and v != "conflict" for (_, v, s) in tally)


def test_git_apply_3way_agrees_on_the_clean_cases(tmp_path: Path) -> None:
    """``git apply --3way`` (in a repository with the base blob) gives the same text wherever it
    and importpatch both merge cleanly; of importpatch's clean cases, it merges the ones
    ``git merge-file`` merges (the 22 of (c)) and conflicts on the others."""
    compared = conflicts = 0
    for n, case in enumerate(CORPUS):
        fm = merged(case)
        if not fm.clean:
            continue
        folder = tmp_path / str(n)
        folder.mkdir()
        clean, text = git_apply_3way(folder, case)
        if clean:
            assert fm.text == text, case.name
            compared += 1
        else:
            conflicts += 1
    assert (compared, conflicts) == (22, 11 + 11 + 20 + 4)


# -- the rule's parts ------------------------------------------------------------------------------


def test_unproven_names_a_second_copy_and_a_line_upstream_removed() -> None:
    (a,) = [c for c in CORPUS if c.name == "a-blanks2-block2c-at1-wrap0"]
    twice = a.theirs.replace(_CALL + "\n", _CALL + "\n" + _CALL + "\n", 1)
    assert "the target already has the change" in rebase.unproven(a.base, a.ours, a.theirs, twice)
    assert rebase.unproven(a.base, a.ours, a.theirs, a.theirs) == ""
    base, theirs = "a\nb\nc\n", "a\nc\n"
    assert "which upstream removed" in rebase.unproven(base, "a\nb\nc\nd\n", theirs,
                                                        "a\nb\nc\nd\n")
    assert rebase.unproven(base, "a\nb\nc\nd\n", theirs, "a\nc\nd\n") == ""


def test_reindented_refuses_a_patch_that_reindents_the_lines_upstream_reindented() -> None:
    base = ["    a()\n", "    b()\n"]
    ours = ["    if x:\n", "        a()\n", "    b()\n"]
    theirs = ["    if y:\n", "        a()\n", "    b()\n"]
    assert rebase.reindented(base, ours, theirs) is None
    # the gaudi shape still settles: the patch deletes a line upstream re-indented
    assert rebase.reindented(base, ["    b()\n"], ["    with y:\n", "        a()\n",
                                                   "        b()\n"]) == [
        "    with y:\n", "        b()\n"]


def test_without_git_no_case_is_wrong_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where git is not installed, the check still runs where a second copy can come from (a
    region ``reindented`` settled, or a line of the patch upstream added too): no case of the
    corpus is clean and wrong; (a) and (b) are the target unchanged or a conflict, (d) merges."""
    monkeypatch.setattr(rebase, "git_merge", lambda *a: None)
    tally: collections.Counter[str] = collections.Counter()
    for case in CORPUS:
        fm = merged(case)
        got = verdict(fm, case.theirs)
        tally[got] += 1
        if case.want != "either":
            assert got == case.want, case.name
        if got == "conflict":
            continue
        counts = keys(fm.text)
        assert all(counts[line] == 1 for line in case.once), case.name
        assert all(counts[line] == keys(case.theirs)[line] for line in case.gone), case.name
        if case.expected:
            assert fm.text == case.expected, case.name
    (a,) = [c for c in CORPUS if c.name == "a-blanks2-block2c-at1-wrap0"]
    assert verdict(merged(a), a.theirs) == "noop"
    assert tally["noop"] == 22 and tally["merge"] == 4 + 42


# -- through the command line ----------------------------------------------------------------------


def _tree(root: Path, version: str, text: str) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "m.py").write_text(text)
    info = root / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (info / "top_level.txt").write_text("vllm\n")
    (info / "RECORD").write_text("")
    return root


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "patches").mkdir()
    return clean_env({"IMPORTPATCH_CACHE_DIR": str(tmp_path / "cache"),
                      "XDG_DATA_HOME": str(tmp_path / "data"),
                      "IMPORTPATCH_PATH": str(tmp_path / "patches"), "NO_COLOR": "1"})


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "importpatch", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_rebase_and_from_git_of_a_change_upstream_has_reindented(
        tmp_path: Path, env: dict[str, str]) -> None:
    (a,) = [c for c in CORPUS if c.name == "a-blanks2-block2c-at1-wrap0"]
    old = _tree(tmp_path / "old", "0.10.0", a.base)
    new = _tree(tmp_path / "new", "0.11.0", a.theirs)
    patches = Path(env["IMPORTPATCH_PATH"])
    (patches / "kv.diff").write_text(
        "Name: kv\nBase: vllm==0.10.0\nRequires: vllm>=0.10,<0.11\n\n"
        + diffs.make_diff(a.base, a.ours, "vllm/m.py"))
    done = _cli("rebase", "kv", "--base", str(old), "--to", str(new), "--out",
                str(tmp_path / "kv-carried.diff"), "--work", str(tmp_path / "work"), "--json",
                env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    (hunk,) = report["files"][0]["hunks"]
    assert hunk["status"] == "upstream" and "re-indented" in hunk["detail"], hunk
    assert report["diff"] == ""  # nothing to carry: no second copy of the change
    assert not (tmp_path / "kv-carried.diff").exists()

    repo = tmp_path / "repo"
    repo.mkdir()
    run = lambda *x: subprocess.run(["git", "-C", str(repo), *x], check=True,  # noqa: E731
                                    capture_output=True, env={**os.environ, **GIT_ENV})
    run("init", "-q")
    (repo / "vllm").mkdir()
    (repo / "vllm" / "__init__.py").write_text("")
    (repo / "vllm" / "m.py").write_text(a.base)
    run("add", "-A")
    run("commit", "-qm", "release 0.10.0")
    run("tag", "v0.10.0")
    (repo / "vllm" / "m.py").write_text(a.ours)
    run("commit", "-qam", "Set up the KV connector before loading")
    done = _cli("from-git", str(repo), "v0.10.0..HEAD", "--to", str(new), "--name", "fork",
                "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    (patch,) = json.loads(done.stdout)["patches"]
    assert patch["status"] == "upstream", patch
    assert patch["files"][0]["hunks"][0]["status"] == "upstream"
    assert not list(patches.glob("fork-*.diff"))


def test_rebase_of_a_genuine_reindent_merges_and_says_git_conflicts_there(
        tmp_path: Path, env: dict[str, str]) -> None:
    """(d) through the command line: the edit is carried into upstream's `with`, once, and the
    report says that git conflicts on this file (the one merge to review)."""
    (d,) = [c for c in CORPUS if c.name == "d-adds-a-line"]
    old = _tree(tmp_path / "old", "0.28.0", d.base)
    new = _tree(tmp_path / "new", "0.29.0", d.theirs)
    (Path(env["IMPORTPATCH_PATH"]) / "cast.diff").write_text(
        "Name: cast\nBase: vllm==0.28.0\nRequires: vllm>=0.28,<0.29\n\n"
        + diffs.make_diff(d.base, d.ours, "vllm/m.py"))
    out = tmp_path / "cast-carried.diff"
    done = _cli("rebase", "cast", "--base", str(old), "--to", str(new), "--out", str(out),
                "--work", str(tmp_path / "work"), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("vllm/m.py: 3-way merge, clean (git merge-file conflicts; the change is there once "
            "and nothing upstream removed is back)") in " ".join(done.stdout.split())
    carried = out.read_text()
    assert "+            token_logprobs = token_logprobs.to(torch.float32)\n" in carried
    body = carried.split("+++ b/vllm/m.py\n")[1].splitlines()
    assert [x for x in body if x[:1] in "+-"] == [  # one line added, nothing else
        "+            token_logprobs = token_logprobs.to(torch.float32)"]
    assert diffs.apply(d.theirs, diffs.parse(carried).files[0]) == d.expected


# -- vLLM's own history (IMPORTPATCH_VLLM_MIRROR) --------------------------------------------------


def mined_reindents(mirror: str, commits: int, window: int) -> Iterator[tuple[str, str, str]]:
    """(C, D, path) of vLLM's first-parent history: D re-indents (into a new ``try``/``if``/
    ``with``/``for``) at least two lines, most of whose text one-file commit C, at most
    ``window`` commits earlier, added: the change already in the target, re-indented."""
    def git(*args: str) -> str:
        return subprocess.run(["git", f"--git-dir={mirror}", *args], capture_output=True,
                              text=True, errors="replace", check=True).stdout

    chain = git("rev-list", "--first-parent", "-n", str(commits), "HEAD", "--", "vllm/").split()
    chain.reverse()
    changed: dict[str, dict[str, tuple[list[str], list[str]]]] = {}
    for sha in chain:
        files: dict[str, tuple[list[str], list[str]]] = {}
        cur = None
        for line in git("diff-tree", "-p", "-U0", "--no-renames", sha, "--", "vllm/").splitlines():
            if line.startswith("+++ "):
                cur = line[6:] if line.startswith("+++ b/") and line.endswith(".py") else None
                if cur:
                    files[cur] = ([], [])
            elif cur and line[:1] in "+-" and not line.startswith(("+++", "---")):
                files[cur][0 if line[0] == "+" else 1].append(line[1:])
        changed[sha] = files
    for i, d in enumerate(chain):
        for path, (plus, minus) in changed[d].items():
            added = {x.strip() for x in plus if x.strip()}
            moved = {x.strip() for x in minus if x.strip() in added and x not in plus}
            if len(moved) < 2 or not any(x.strip().startswith(("try:", "if ", "with ", "for "))
                                         for x in plus):
                continue
            for c in chain[max(0, i - window):i]:
                if list(changed[c]) != [path]:
                    continue
                new = [x.strip() for x in changed[c][path][0] if x.strip()]
                if new and sum(x in moved for x in new) >= max(1, len(new) // 2):
                    yield c, d, path


@pytest.mark.skipif(not os.environ.get("IMPORTPATCH_VLLM_MIRROR"),
                    reason="IMPORTPATCH_VLLM_MIRROR (a vLLM git history) is not set")
def test_vllm_history_reindents_are_never_wrong_clean(tmp_path: Path) -> None:
    mirror = os.environ["IMPORTPATCH_VLLM_MIRROR"]

    def show(rev: str, path: str) -> str:
        return subprocess.run(["git", f"--git-dir={mirror}", "show", f"{rev}:{path}"],
                              capture_output=True, text=True, check=True).stdout

    cases = list(mined_reindents(mirror, int(os.environ.get("IMPORTPATCH_MINE_COMMITS", "3000")),
                                 200))
    assert cases, "no commit of the history re-indents an earlier commit's lines"
    tally: collections.Counter[str] = collections.Counter()
    for n, (c, d, path) in enumerate(cases):
        case = Case("vllm", f"{c[:10]}-{d[:10]}", show(f"{c}^", path), show(c, path),
                    show(d, path), "either")
        folder = tmp_path / str(n)
        folder.mkdir()
        fm = merged(case)
        git_clean, git_text = git_merge_file(folder, case)
        if fm.clean and not (git_clean and fm.text == git_text):
            # importpatch merges where git does not, or otherwise: it must be shown right
            assert rebase.unproven(case.base, case.ours, case.theirs, fm.text) == "", case.name
        tally[f"{verdict(fm, case.theirs)} (git {'clean' if git_clean else 'conflict'})"] += 1
    print(dict(tally))
