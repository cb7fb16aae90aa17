"""The statement alignment of a copied function with its original (importpatch/tools/align.py):
what ``convert`` diffs and what ``check`` calls retired (issue 37.3, 37.5). In-process, no
child: the real-release cases are in tests/test_convert_copies.py and tests/test_retire.py."""

from __future__ import annotations

import ast
import textwrap

import pytest

from importpatch.discover.declare import (
    DeclarationError,
    Patch,
    collecting,
    patch_from_diff_file,
    retire_condition,
)
from importpatch.rewrite import diffs
from importpatch.tools import align

ORIGINAL = '''\
import torch


class Sampler:
    @staticmethod
    def gather(
        logprobs: torch.Tensor,
        token_ids: torch.Tensor,
    ) -> tuple:
        """Gather the top logprobs.

        Args:
          logprobs: a long description
          token_ids: another one
        """
        # Find the top values.
        top = torch.topk(logprobs, 3)
        # The ranks: symbolic sizes.
        with sync_allowed():
            mark(logprobs)
            ranks = count(logprobs, token_ids)
        if top is None:
            # nothing to do
            return None
        return top, ranks
'''


def edited(copy: str, original: str = ORIGINAL, qual: str = "Sampler.gather"
           ) -> tuple[align.Alignment, str]:
    tree = ast.parse(original)
    cls = tree.body[1]
    assert isinstance(cls, ast.ClassDef)
    base = next(n for n in cls.body if isinstance(n, ast.FunctionDef)
                and n.name == qual.rpartition(".")[2])
    copy_fn = align.function_of(ast.parse(copy))
    assert copy_fn is not None
    lines = original.splitlines(keepends=True)
    made = align.align(lines, base, copy.splitlines(keepends=True), copy_fn)
    return made, diffs.make_diff(original, "".join(made.apply(lines)), "m.py")


def changes(diff: str) -> list[str]:
    return [x for x in diff.splitlines() if x[:1] in ("+", "-") and not x.startswith(("+++",
                                                                                        "---"))]


def test_a_shortened_docstring_and_dropped_comments_are_not_the_edit() -> None:
    made, diff = edited('''\
def gather(logprobs, token_ids):
    """Gather."""
    top = torch.topk(logprobs, 3)
    with sync_allowed():
        ranks = count(logprobs, token_ids)
    if top is None:
        return None
    return top, ranks
''')
    # only the deleted call, inside the with; the docstring, comments and def lines stay
    assert changes(diff) == ["-            mark(logprobs)"]
    assert not made.signature_changed and made.kept > 0.8


def test_renamed_locals_are_the_originals_and_written_back_with_its_names() -> None:
    made, diff = edited('''\
def gather(lp, ids):
    t = torch.topk(lp, 3)
    with sync_allowed():
        mark(lp)
        r = count(lp, ids)
    log(r)
    if t is None:
        return None
    return t, r
''')
    assert made.renamed == {"lp": "logprobs", "ids": "token_ids", "t": "top", "r": "ranks"}
    assert changes(diff) == ["+        log(ranks)"]


def test_a_changed_signature_rewrites_the_def_lines_only() -> None:
    made, diff = edited('''\
def gather(logprobs, token_ids, k=3):
    top = torch.topk(logprobs, k)
    with sync_allowed():
        mark(logprobs)
        ranks = count(logprobs, token_ids)
    if top is None:
        return None
    return top, ranks
''')
    assert made.signature_changed
    assert changes(diff) == [
        "-    def gather(", "-        logprobs: torch.Tensor,", "-        token_ids: torch.Tensor,",
        "-    ) -> tuple:", "+    def gather(logprobs, token_ids, k=3):",
        "-        top = torch.topk(logprobs, 3)", "+        top = torch.topk(logprobs, k)"]
    assert '"""Gather the top logprobs.' in diff  # context: the docstring is kept


def test_a_changed_header_of_a_block_changes_that_line_and_keeps_its_body() -> None:
    _, diff = edited('''\
def gather(logprobs, token_ids):
    top = torch.topk(logprobs, 3)
    with sync_allowed():
        mark(logprobs)
        ranks = count(logprobs, token_ids)
    if top is None or not ranks:
        return None
    return top, ranks
''')
    assert changes(diff) == ["-        if top is None:", "+        if top is None or not ranks:"]
    assert "             # nothing to do\n" in diff  # the comment in its body stays


def test_an_inserted_statement_goes_after_the_one_before_it_with_its_own_comment() -> None:
    _, diff = edited('''\
def gather(logprobs, token_ids):
    top = torch.topk(logprobs, 3)
    # mine: check the shape
    check(top)
    with sync_allowed():
        mark(logprobs)
        ranks = count(logprobs, token_ids)
    if top is None:
        return None
    return top, ranks
''')
    assert changes(diff) == ["+        # mine: check the shape", "+        check(top)"]
    assert "         top = torch.topk(logprobs, 3)\n+        # mine" in diff


def test_rename_text_leaves_attributes_alone() -> None:
    assert align.rename_text("x = a.x + x\n", {"x": "y"}) == "y = a.x + y\n"


def test_edit_made_and_dropped_compare_the_edit_with_a_release() -> None:
    base = align.function_of(ast.parse(textwrap.dedent('''\
        def f(self):
            a()
            b()
            return 1
        ''')))
    copy = align.function_of(ast.parse("def f(self):\n    a()\n    return 1\n"))
    has_it = align.function_of(ast.parse("def f(self):\n    a()\n    c()\n    return 1\n"))
    lacks_it = align.function_of(ast.parse("def f(self):\n    a()\n    b()\n    c()\n"
                                           "    return 1\n"))
    assert base is not None and copy is not None and has_it is not None and lacks_it is not None
    made = align.align([x + "\n" for x in ast.unparse(base).splitlines()], base,
                       ast.unparse(copy).splitlines(keepends=True), copy)
    assert align.edit_made(made, base, has_it)  # b() is gone upstream too
    assert not align.edit_made(made, base, lacks_it)
    # c() came since the base, and the copy does not have it
    release = "def f(self):\n    a()\n    c()\n    return 1\n".splitlines(keepends=True)
    assert align.dropped(base, copy, has_it, {}, release) == ["c()"]


def test_retire_if_is_a_fact_about_the_source_checked_when_declared() -> None:
    assert retire_condition("source contains _set_kv_fetch_stage(") == (
        "source", "_set_kv_fetch_stage(")
    assert retire_condition("vllm.v1.sample.sampler contains 'a  b'") == (
        "vllm.v1.sample.sampler", "a  b")
    assert retire_condition("contains x") is None
    with collecting():  # not into the process's registry of API patches
        assert Patch("p", retire_if="source contains x").retire_if == ("source contains x",)
        with pytest.raises(DeclarationError, match="retire_if"):
            Patch("p-bad", retire_if="when upstream fixes it")
        diff = patch_from_diff_file("d.diff", "Retire-If: source contains fixed()\n"
                                    "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert diff.retire_if == ("source contains fixed()",)
