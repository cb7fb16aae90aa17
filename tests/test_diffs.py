"""Tests for importpatch.rewrite.diffs: parsing unified diffs and applying them to source text."""

from __future__ import annotations

import dataclasses
import pickle
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from importpatch.rewrite.diffs import (
    DiffError,
    FilePatch,
    Hunk,
    HunkMismatch,
    ParsedDiff,
    apply,
    make_diff,
    module_name,
    parse,
)

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def only_file(diff: str) -> FilePatch:
    parsed = parse(diff)
    assert len(parsed.files) == 1
    return parsed.files[0]


def patched(source: str, diff: str, **kwargs: int) -> str:
    return apply(source, only_file(diff), **kwargs)


def numbered(n: int, start: int = 1) -> str:
    return "".join(f"line {i}\n" for i in range(start, start + n))


# --------------------------------------------------------------------------- accepted forms

# Verbatim `git diff --cached` output (git 2.39): quoted non-ASCII path, CRLF file
# (git shows the '\r'), a removed final newline marker, a name with a space (git
# ends it with a tab).
GIT_OUTPUT = (
    'diff --git "a/pkg/caf\\303\\251.py" "b/pkg/caf\\303\\251.py"\n'
    "index 5fb50d3..45a6154 100644\n"
    '--- "a/pkg/caf\\303\\251.py"\n'
    '+++ "b/pkg/caf\\303\\251.py"\n'
    "@@ -1 +1 @@\n"
    "-héllo\n"
    "+hé\n"
    "diff --git a/pkg/crlf.py b/pkg/crlf.py\n"
    "index b5eff57..d5a6cc6 100644\n"
    "--- a/pkg/crlf.py\n"
    "+++ b/pkg/crlf.py\n"
    "@@ -1,3 +1,3 @@\n"
    " a\r\n"
    "-b\r\n"
    "+B\r\n"
    " c\r\n"
    "diff --git a/pkg/nonl.py b/pkg/nonl.py\n"
    "index 1b32298..b77b4eb 100644\n"
    "--- a/pkg/nonl.py\n"
    "+++ b/pkg/nonl.py\n"
    "@@ -1,2 +1,2 @@\n"
    " x\n"
    "-y\n"
    "\\ No newline at end of file\n"
    "+y\n"
    "diff --git a/pkg/sp ace.py b/pkg/sp ace.py\n"
    "index b478595..718f4d2 100644\n"
    "--- a/pkg/sp ace.py\t\n"
    "+++ b/pkg/sp ace.py\t\n"
    "@@ -1 +1 @@\n"
    "-s\n"
    "+t\n"
)


def test_real_git_output_multi_file() -> None:
    parsed = parse(GIT_OUTPUT)
    assert parsed.preamble == ""
    assert [f.path for f in parsed.files] == [
        "pkg/café.py",
        "pkg/crlf.py",
        "pkg/nonl.py",
        "pkg/sp ace.py",
    ]
    sources = {
        "pkg/café.py": ("héllo\n", "hé\n"),
        "pkg/crlf.py": ("a\r\nb\r\nc\r\n", "a\r\nB\r\nc\r\n"),
        "pkg/nonl.py": ("x\ny", "x\ny\n"),
        "pkg/sp ace.py": ("s\n", "t\n"),
    }
    for f in parsed.files:
        before, after = sources[f.path]
        assert apply(before, f) == after
    crlf = parsed.files[1].hunks[0]
    assert crlf.lines == ((" ", "a"), ("-", "b"), ("+", "B"), (" ", "c"))
    nonl = parsed.files[2].hunks[0]
    assert nonl.old_eof_no_newline and not nonl.new_eof_no_newline


# Verbatim `git format-patch --stdout`: mail headers, the lone '---' before the
# diffstat, a function-less header, and the '-- ' signature after the hunk.
FORMAT_PATCH = (
    "From 2b93a3e13676643716a5d1d2ee2d464bf2b60e25 Mon Sep 17 00:00:00 2001\n"
    "From: n <a@b>\n"
    "Subject: [PATCH] Change fn\n"
    "\n"
    "Body of message.\n"
    "---\n"
    " pkg/fn.py | 3 ++-\n"
    " 1 file changed, 2 insertions(+), 1 deletion(-)\n"
    "\n"
    "diff --git a/pkg/fn.py b/pkg/fn.py\n"
    "index 486fa8b..d0d76ce 100644\n"
    "--- a/pkg/fn.py\n"
    "+++ b/pkg/fn.py\n"
    "@@ -1,9 +1,10 @@\n"
    "+# top\n"
    " import os\n"
    " \n"
    " \n"
    " def f():\n"
    "     a = 1\n"
    "     b = 2\n"
    "-    c = 3\n"
    "+    c = 30\n"
    "     d = 4\n"
    "     return a\n"
    "-- \n"
    "2.39.5\n"
    "\n"
)
FN_OLD = "import os\n\n\ndef f():\n    a = 1\n    b = 2\n    c = 3\n    d = 4\n    return a\n"
FN_NEW = "# top\n" + FN_OLD.replace("c = 3", "c = 30")


def test_format_patch_preamble_and_signature() -> None:
    parsed = parse(FORMAT_PATCH)
    assert parsed.preamble == FORMAT_PATCH[: FORMAT_PATCH.index("diff --git")]
    assert parsed.preamble.startswith("From 2b93a3e") and parsed.preamble.endswith("\n\n")
    (f,) = parsed.files
    assert (f.old_path, f.new_path, f.module) == ("pkg/fn.py", "pkg/fn.py", "pkg.fn")
    assert apply(FN_OLD, f) == FN_NEW


# Verbatim `git diff -U0`: zero-length old ranges, omitted lengths, function context.
GIT_U0 = (
    "diff --git a/pkg/fn.py b/pkg/fn.py\n"
    "index 486fa8b..d0d76ce 100644\n"
    "--- a/pkg/fn.py\n"
    "+++ b/pkg/fn.py\n"
    "@@ -0,0 +1 @@\n"
    "+# top\n"
    "@@ -7 +8 @@ def f():\n"
    "-    c = 3\n"
    "+    c = 30\n"
)


def test_zero_context_diff_is_refused_unless_accepted() -> None:
    f = only_file(GIT_U0)
    top, change = f.hunks
    assert (top.old_start, top.old_len, top.new_start, top.new_len) == (0, 0, 1, 1)
    assert (change.old_start, change.old_len, change.new_start, change.new_len) == (7, 1, 8, 1)
    assert change.header == "@@ -7 +8 @@ def f():"
    # Nothing tells where a hunk without context goes (git apply would put this insertion at
    # the end of the file): refused, saying how to fix it.
    with pytest.raises(DiffError) as info:
        apply(FN_OLD, f)
    message = str(info.value)
    assert info.value.lineno == 7 and "hunk #2 '@@ -7 +8 @@ def f():'" in message
    for part in ("git diff -U0", "make the diff again with context", "Unidiff-Zero: yes"):
        assert part in message
    # Accepted explicitly: placed by its line numbers, like git apply --unidiff-zero.
    assert apply(FN_OLD, dataclasses.replace(f, unidiff_zero=True)) == FN_NEW


def test_insertion_after_a_line_with_zero_old_length() -> None:
    diff = "--- a/m.py\n+++ b/m.py\n@@ -5,0 +6,2 @@\n+new a\n+new b\n"
    expected = numbered(5) + "new a\nnew b\n" + numbered(5, 6)
    assert apply(numbered(10), dataclasses.replace(only_file(diff), unidiff_zero=True)) == expected
    # At the very end of the file too.
    diff = "--- a/m.py\n+++ b/m.py\n@@ -3,0 +4 @@\n+tail\n"
    f = dataclasses.replace(only_file(diff), unidiff_zero=True)
    assert apply(numbered(3), f) == numbered(3) + "tail\n"


def test_insertion_into_empty_file() -> None:
    diff = "--- a/m.py\n+++ b/m.py\n@@ -0,0 +1,2 @@\n+x\n+y\n"
    assert patched("", diff) == "x\ny\n"


def test_plain_unified_diff_without_git_headers() -> None:
    diff = "--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -2,3 +2,3 @@\n line 2\n-line 3\n+LINE 3\n line 4\n"
    f = only_file(diff)
    assert f.path == "pkg/m.py"
    assert patched(numbered(5), diff) == numbered(5).replace("line 3", "LINE 3")


def test_no_prefix_and_timestamps() -> None:
    no_prefix = "--- pkg/m.py\n+++ pkg/m.py\n@@ -1 +1 @@\n-line 1\n+one\n"
    assert only_file(no_prefix).path == "pkg/m.py"
    # A --no-prefix diff of a package really named 'a' keeps its name: prefixes
    # are only stripped as the a/ + b/ pair.
    package_a = "--- a/m.py\n+++ a/m.py\n@@ -1 +1 @@\n-line 1\n+one\n"
    assert only_file(package_a).path == "a/m.py"
    gnu = (
        "--- pkg/m.py.orig\t2024-01-01 00:00:00.000000000 +0000\n"
        "+++ pkg/m.py\t2024-01-02 00:00:00.000000000 +0000\n"
        "@@ -1 +1 @@\n-line 1\n+one\n"
    )
    f = only_file(gnu)
    assert (f.old_path, f.new_path, f.path) == ("pkg/m.py.orig", "pkg/m.py", "pkg/m.py")
    assert apply(numbered(1), f) == "one\n"


def test_only_one_prefix_is_stripped() -> None:
    f = only_file("--- a/a/m.py\n+++ b/b/m.py\n@@ -1 +1 @@\n-x\n+y\n")
    assert (f.old_path, f.new_path) == ("a/m.py", "b/m.py")


def test_harmless_git_extended_headers_are_ignored() -> None:
    diff = (
        "diff --git a/m.py b/m.py\n"
        "old mode 100644\n"
        "new mode 100755\n"
        "index 1111111..2222222\n"
        "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-line 1\n+one\n"
    )
    assert patched("line 1\n", diff) == "one\n"


def test_a_mode_only_section_is_listed_and_the_rest_applies() -> None:
    """git diff of a commit that edits one file and chmods another: git apply accepts it, and
    so does parse (the mode is not code: listed in ``modes``, the content patch applies)."""
    diff = (
        "diff --git a/pkg/b.py b/pkg/b.py\nold mode 100755\nnew mode 100644\n"
        "diff --git a/pkg/a.py b/pkg/a.py\nold mode 100644\nnew mode 100755\n"
        "index 1111111..2222222\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-line 1\n+one\n"
        'diff --git "a/pkg/\\303\\251 x.py" "b/pkg/\\303\\251 x.py"\nold mode 100644\n'
        "new mode 100755\n"
    )
    parsed = parse(diff)
    assert [f.path for f in parsed.files] == ["pkg/a.py"]
    assert apply("line 1\n", parsed.files[0]) == "one\n"
    assert [(m.path, m.old_mode, m.new_mode, m.only) for m in parsed.modes] == [
        ("pkg/b.py", "100755", "100644", True), ("pkg/a.py", "100644", "100755", False),
        ("pkg/\u00e9 x.py", "100644", "100755", True)]
    assert parsed.modes[0].describe() == "mode 100755 -> 100644"


@pytest.mark.parametrize(
    "diff",
    [
        pytest.param("diff --git a/p/m.py b/p/m.py\nnew file mode 100644\nindex 0000000..3e75765\n"
                     "--- /dev/null\n+++ b/p/m.py\n@@ -0,0 +1,2 @@\n+new\n+two\n", id="git"),
        pytest.param("--- /dev/null\n+++ b/p/m.py\n@@ -0,0 +1,2 @@\n+new\n+two\n", id="dev-null"),
        pytest.param(make_diff(None, "new\ntwo\n", "p/m.py"), id="make_diff"),
    ],
)
def test_a_new_file_is_a_module_the_patch_adds(diff: str) -> None:
    """A new file applies to the empty text of a module that does not exist; where the module
    exists with the same text it is already applied, with other text it does not apply."""
    [f] = parse(diff).files
    assert f.created and (f.old_path, f.path, f.module) == (None, "p/m.py", "p.m")
    assert apply("", f) == f.new_text() == "new\ntwo\n"
    with pytest.raises(HunkMismatch) as info:
        apply("new\ntwo\n", f)
    assert info.value.all_applied
    with pytest.raises(HunkMismatch) as info:
        apply("old = 1\n", f)
    assert not info.value.all_applied and "adds this module as a new file, and this version " \
        "has a module of that name with other text" in info.value.message()


def test_a_new_empty_file_has_no_hunk() -> None:
    diff = ("diff --git a/p/e/__init__.py b/p/e/__init__.py\nnew file mode 100644\n"
            "index 0000000..e69de29\n")
    assert make_diff(None, "", "p/e/__init__.py") == diff.replace("index 0000000..e69de29\n", "")
    [f] = parse(diff).files
    assert f.created and f.hunks == () and f.module == "p.e" and apply("", f) == ""


def test_a_new_file_has_one_whole_hunk() -> None:
    with pytest.raises(DiffError, match="a new file's diff"):
        parse("--- /dev/null\n+++ b/m.py\n@@ -0,0 +2 @@\n+new\n")


def test_multi_hunk_and_multi_file() -> None:
    old = numbered(30)
    new = old.replace("line 3\n", "three\n").replace("line 25\n", "")
    diff = make_diff(old, new, "pkg/a.py") + make_diff("x\n", "y\n", "pkg/b.py")
    parsed = parse(diff)
    assert [f.module for f in parsed.files] == ["pkg.a", "pkg.b"]
    assert len(parsed.files[0].hunks) == 2
    assert apply(old, parsed.files[0]) == new
    assert apply("x\n", parsed.files[1]) == "y\n"


def test_later_hunks_follow_the_offset_of_earlier_ones() -> None:
    old = numbered(100)
    new = old.replace("line 10\n", "ten\n").replace("line 90\n", "ninety\n")
    f = only_file(make_diff(old, new, "m.py"))
    # Hunk 1 moved by 20 lines, hunk 2 by 40: beyond max_offset=30 from its stated
    # position, but only 20 from where hunk 1's offset predicts it.
    extra = "".join(f"extra {i}\n" for i in range(20))
    moved = extra + old.replace("line 50\n", "line 50\n" + extra)
    expected = extra + new.replace("line 50\n", "line 50\n" + extra)
    assert apply(moved, f, max_offset=30) == expected
    with pytest.raises(HunkMismatch) as info:
        apply(moved, f, max_offset=19)
    assert info.value.hunk_index == 1


def test_no_newline_marker_on_new_side() -> None:
    diff = (
        "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n"
        " line 1\n-line 2\n+line 2\n\\ No newline at end of file\n"
    )
    f = only_file(diff)
    assert f.hunks[0].new_eof_no_newline and not f.hunks[0].old_eof_no_newline
    assert apply(numbered(2), f) == "line 1\nline 2"


def test_no_newline_marker_on_both_sides() -> None:
    diff = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n-x\n+X\n y\n\\ No newline at end of file\n"
    hunk = only_file(diff).hunks[0]
    assert hunk.old_eof_no_newline and hunk.new_eof_no_newline
    assert patched("x\ny", diff) == "X\ny"
    assert make_diff("x\ny", "X\ny", "m.py").endswith(" y\n\\ No newline at end of file\n")


def test_no_newline_marker_pins_hunk_to_end_of_file() -> None:
    diff = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-y\n\\ No newline at end of file\n+z\n"
    assert patched("y", diff) == "z\n"
    with pytest.raises(HunkMismatch) as info:
        patched("y\nmore", diff)
    assert info.value.expected == "<end of file>" and info.value.actual == "more"


def test_final_newline_state_must_agree() -> None:
    # The diff says line 2 ends with a newline; the source has none: no fuzz.
    diff = make_diff("line 1\nline 2\n", "line 1\nLINE 2\n", "m.py")
    with pytest.raises(HunkMismatch) as info:
        patched("line 1\nline 2", diff)
    assert "newline" in str(info.value)
    # And the other way round.
    diff = make_diff("a\nb", "A\nb", "m.py")
    with pytest.raises(HunkMismatch, match="no newline"):
        patched("a\nb\n", diff)


def test_crlf_source_with_lf_diff_stays_crlf() -> None:
    diff = make_diff("a\nb\nc\n", "a\nB\nnew\nc\n", "m.py")
    assert patched("a\r\nb\r\nc\r\n", diff) == "a\r\nB\r\nnew\r\nc\r\n"


def test_crlf_diff_text_applies_to_lf_source() -> None:
    diff = make_diff("a\nb\nc\n", "a\nB\nc\n", "m.py").replace("\n", "\r\n")
    assert patched("a\nb\nc\n", diff) == "a\nB\nc\n"
    assert patched("a\r\nb\r\nc\r\n", diff) == "a\r\nB\r\nc\r\n"


def test_crlf_removing_final_newline_drops_the_cr_too() -> None:
    diff = make_diff("a\r\nb\r\n", "a\r\nB", "m.py")
    assert "\\ No newline at end of file" in diff
    assert patched("a\r\nb\r\n", diff) == "a\r\nB"


def test_mixed_endings_kept_per_line_new_lines_get_dominant() -> None:
    source = "a\r\nb\nc\r\nd\r\n"
    diff = make_diff("a\nb\nc\nd\n", "a\nb\nnew\nc\nd\n", "m.py")
    assert patched(source, diff) == "a\r\nb\nnew\r\nc\r\nd\r\n"


def test_non_ascii_text() -> None:
    old = "# -*- coding: utf-8 -*-\nname = 'café'\nemoji = '🐍'\n"
    new = old.replace("café", "naïve ☃").replace("🐍", "🐍🐍")
    diff = make_diff(old, new, "pkg/ünï.py")
    assert patched(old, diff) == new
    assert only_file(diff).path == "pkg/ünï.py"


def test_form_feed_and_other_splitlines_separators_stay_inside_lines() -> None:
    old = "a = 1\x0c# page\nb = '\u2028'\n"
    new = "a = 1\x0c# page\nb = 'x\u2028'\n"
    diff = make_diff(old, new, "m.py")
    assert patched(old, diff) == new


def test_empty_context_line_without_its_space_is_accepted() -> None:
    # Editors that strip trailing whitespace turn ' ' context lines into ''.
    diff = "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n\n-b\n+B\n"
    assert patched("a\n\nb\n", diff) == "a\n\nB\n"


def test_apply_without_hunks_and_deletion_of_everything() -> None:
    assert apply("x\n", FilePatch("m.py", "m.py", ())) == "x\n"
    assert patched("a\nb\n", make_diff("a\nb\n", "", "m.py")) == ""


# --------------------------------------------------------------------------- offsets and mismatches


def test_offset_within_bound_applies_and_beyond_raises() -> None:
    old = numbered(20)
    diff = make_diff(old, old.replace("line 10\n", "ten\n"), "m.py")
    for shift in (1, 7, 15):
        shifted = numbered(shift, start=100) + old
        assert patched(shifted, diff, max_offset=15) == shifted.replace("line 10\n", "ten\n")
    shifted = numbered(16, start=100) + old
    with pytest.raises(HunkMismatch) as info:
        patched(shifted, diff, max_offset=15)
    assert info.value.nearest == 16 + 7 and info.value.nearest_score == 1.0
    # Lines removed before the hunk: negative offsets work too.
    assert patched(old[len("line 1\nline 2\n") :], diff, max_offset=2).count("ten\n") == 1


def test_max_offset_zero_means_stated_position_only() -> None:
    diff = make_diff("a\nb\n", "a\nB\n", "m.py")
    assert patched("a\nb\n", diff, max_offset=0) == "a\nB\n"
    with pytest.raises(HunkMismatch):
        patched("z\na\nb\n", diff, max_offset=0)
    with pytest.raises(ValueError):
        patched("a\nb\n", diff, max_offset=-1)


def test_nearest_match_wins_and_later_on_ties() -> None:
    block = "x\ny\nz\n"
    diff = "--- a/m.py\n+++ b/m.py\n@@ -4,3 +4,3 @@\n x\n-y\n+Y\n z\n"
    # Copies at lines 1 and 7: both 3 away from the stated line 4, take the later, as git apply
    # and GNU patch do (test_diff_corpus.py checks that against both).
    source = block + "p\nq\nr\n" + block
    assert patched(source, diff) == block + "p\nq\nr\n" + block.replace("y", "Y")
    # Copies at lines 2 and 9: line 2 is nearer.
    source = "p\n" + block + "q\nr\ns\n" + block
    assert patched(source, diff) == "p\n" + block.replace("y", "Y") + "q\nr\ns\n" + block


def test_mismatch_message_names_everything() -> None:
    old = numbered(40)
    new = old.replace("line 5\n", "five\n").replace("line 30\n", "thirty\n")
    f = only_file(make_diff(old, new, "pkg/m.py"))
    source = old.replace("line 29\n", "line twenty-nine\n")
    with pytest.raises(HunkMismatch) as info:
        apply(source, f)
    exc = info.value
    assert (exc.path, exc.hunk_index) == ("pkg/m.py", 2)
    assert exc.header == f.hunks[1].header == "@@ -27,7 +27,7 @@"
    assert (exc.expected, exc.line, exc.actual) == ("line 29", 29, "line twenty-nine")
    assert exc.nearest == 27 and exc.nearest_score == pytest.approx(6 / 7)
    message = str(exc)
    for part in ("pkg/m.py", "hunk #2", "@@ -27,7 +27,7 @@", "'line 29'", "line 29"):
        assert part in message
    assert "'line twenty-nine'" in message and "line 27" in message and "86%" in message
    assert "\n" not in message


def test_mismatch_past_end_of_file_and_nowhere_similar() -> None:
    diff = "--- a/m.py\n+++ b/m.py\n@@ -5,2 +5,2 @@\n-p\n+P\n q\n"
    with pytest.raises(HunkMismatch) as info:
        patched("a\nb\n", diff)
    exc = info.value
    assert (exc.expected, exc.line, exc.actual) == ("p", 5, None)
    assert exc.nearest is None and exc.nearest_score == 0.0
    assert "found end of file" in str(exc) and "no place in the source resembles" in str(exc)


def test_apply_is_all_or_nothing_and_exceptions_pickle() -> None:
    old = numbered(40)
    new = old.replace("line 5\n", "five\n").replace("line 30\n", "thirty\n")
    f = only_file(make_diff(old, new, "m.py"))
    source = old.replace("line 30\n", "gone\n")
    with pytest.raises(HunkMismatch) as info:
        apply(source, f)
    assert info.value.hunk_index == 2
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value)
    error = DiffError("boom", 3)
    assert str(pickle.loads(pickle.dumps(error))) == "diff line 3: boom"


def test_apply_speed_10k_lines_3_hunks() -> None:
    old = numbered(10_000)
    new = (
        old.replace("line 100\n", "hundred\n")
        .replace("line 5000\nline 5001\n", "x\n")
        .replace("line 9990\n", "line 9990\nadded\n")
    )
    f = only_file(make_diff(old, new, "m.py"))
    assert len(f.hunks) == 3
    shifted = numbered(50, start=20_000) + old
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        result = apply(shifted, f)
        best = min(best, time.perf_counter() - t0)
    assert result == numbered(50, start=20_000) + new
    assert best < 0.025  # typically ~0.5 ms; generous for shared CI machines


# ----------------------------------------------------------- messages that point at the fix


def head(n: int) -> str:
    return "".join(f"# head {i}\n" for i in range(n))


def test_blank_context_line_mismatch_names_the_line_found() -> None:
    old = head(10) + "def f():\n\n    return 1\n" + "".join(f"# t{i}\n" for i in range(5))
    f = only_file(make_diff(old, old.replace("return 1", "return 2"), "m.py"))
    source = old.replace("def f():\n\n", "def f():\n    x = 1\n")
    with pytest.raises(HunkMismatch) as info:
        apply(source, f)
    exc = info.value
    assert (exc.kind, exc.expected, exc.line, exc.actual) == ("mismatch", "", 12, "    x = 1")
    # Not the wording of a hunk without old-side lines ("cannot be placed before line 12").
    assert "at line 12 expected a blank line but found '    x = 1'" in str(exc)
    assert "cannot be placed" not in str(exc)


def test_exact_fit_beyond_the_window_says_so_and_how_to_allow_it() -> None:
    old = numbered(40)
    new = old.replace("line 20\n", "twenty\n")
    f = only_file(make_diff(old, new, "pkg/m.py"))
    upstream = numbered(300, start=1000)  # 300 lines added above the hunk
    with pytest.raises(HunkMismatch) as info:
        apply(upstream + old, f)
    exc = info.value
    assert (exc.kind, exc.line, exc.fit, exc.nearest) == ("beyond-window", 17, 317, 317)
    message = str(exc)
    assert "fits exactly at line 317, 300 lines away" in message
    assert "'Max-Offset: 300' in the diff's header" in message
    # The patch's own bound (the header's) is what apply uses; one line short still fails.
    assert apply(upstream + old, dataclasses.replace(f, max_offset=300)) == upstream + new
    with pytest.raises(HunkMismatch):
        apply(upstream + old, dataclasses.replace(f, max_offset=299))


def test_no_closest_fit_made_of_blank_lines_and_brackets() -> None:
    block = "    result = compute(\n        alpha,\n    )\n\n\n"
    old = head(5) + block + "def tail():\n    pass\n" + head(3)
    f = only_file(make_diff(old, old.replace("alpha", "beta"), "m.py"))
    # Only blank lines and a lone ')' of the hunk occur in this source, many times over.
    source = "x = (\n    1,\n)\n\n\n" * 20
    with pytest.raises(HunkMismatch) as info:
        apply(source, f)
    exc = info.value
    assert exc.nearest is None and exc.nearest_score == 0.0
    assert "no place in the source resembles its old side" in str(exc)
    assert "closest fit" not in str(exc)
    # Where three of its four telling lines are (two lines lower), it gets one.
    source = head(2) + old.replace("compute(", "other(")
    with pytest.raises(HunkMismatch) as info:
        apply(source, f)
    assert (info.value.nearest, info.value.nearest_score) == (4 + 2, 0.75)


def test_every_failing_hunk_is_named_up_to_a_cap() -> None:
    old = numbered(200)
    lines = [20 * i + 10 for i in range(9)]  # 9 hunks, far apart
    new = old
    for n in lines:
        new = new.replace(f"line {n}\n", f"changed {n}\n")
    f = only_file(make_diff(old, new, "pkg/m.py"))
    assert len(f.hunks) == 9
    source = old.replace("line 11\n", "x\n").replace("line 51\n", "y\n")
    with pytest.raises(HunkMismatch) as info:
        apply(source, f)
    exc = info.value
    assert exc.hunk_count == 9 and [m.hunk_index for m in exc.failures] == [1, 3]
    message = str(exc)
    assert message.startswith("pkg/m.py: 2 of 9 hunks do not apply: hunk #1 ")
    assert "; hunk #3 '@@ -47,7 +47,7 @@' does not apply" in message and "\n" not in message
    # Seven failing hunks: five are named, the rest counted.
    for n in lines[:7]:
        source = source.replace(f"line {n + 1}\n", "z\n")
    with pytest.raises(HunkMismatch) as info:
        apply(source, f)
    assert [m.hunk_index for m in info.value.failures] == [1, 2, 3, 4, 5, 6, 7]
    message = str(info.value)
    assert "hunk #5 " in message and "hunk #6 " not in message
    assert "; and 2 more ('importpatch check' lists all)" in message
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == message and len(again.others) == 6


# -------------------------------------------------------------- placement as git and patch do


def test_hunk_at_line_1_is_anchored_to_the_start_of_the_file() -> None:
    old = "import os\nimport sys\n\n\ndef f():\n    pass\n"
    f = only_file(make_diff(old, "import re\n" + old, "m.py"))
    assert f.hunks[0].old_start == 1 and f.hunks[0].leading == 0
    # Upstream added a first line: git apply and GNU patch refuse the insertion; it must not
    # land below the new line.
    with pytest.raises(HunkMismatch) as info:
        apply("# SPDX-License-Identifier: Apache-2.0\n" + old, f)
    exc = info.value
    assert (exc.kind, exc.line, exc.fit) == ("anchored", 1, 2)
    assert "must match at the start of the file" in str(exc)
    assert apply(old, f) == "import re\n" + old


def test_hunk_without_trailing_context_is_anchored_to_the_end_of_the_file() -> None:
    old = numbered(10)
    f = only_file(make_diff(old, old + "appended = True\n", "m.py"))
    assert f.hunks[0].trailing == 0
    # Upstream appended code: the addition must not land before it.
    with pytest.raises(HunkMismatch) as info:
        apply(old + "newer = 1\n", f)
    exc = info.value
    assert (exc.kind, exc.expected, exc.line, exc.actual) == (
        "anchored", "<end of file>", 11, "newer = 1")
    assert "must end at the end of the file" in str(exc)


def test_hunk_that_changes_nothing_is_malformed() -> None:
    with pytest.raises(DiffError) as info:
        parse("--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n a\n b\n")
    assert info.value.lineno == 3 and "changes nothing" in str(info.value)


# ------------------------------------------------------------------------ already applied


def test_a_diff_whose_every_hunk_is_already_there_is_recognised() -> None:
    old = numbered(60)
    new = old.replace("line 10\n", "ten\n").replace("line 50\n", "fifty\nfifty-one\n")
    f = only_file(make_diff(old, new, "pkg/m.py"))
    with pytest.raises(HunkMismatch) as info:
        apply(numbered(5, start=100) + new, f)  # upstream, and moved by 5 lines
    exc = info.value
    assert exc.all_applied and [m.kind for m in exc.failures] == ["already-applied"] * 2
    assert [m.fit for m in exc.failures] == [12, 52]
    assert exc.message("pkg 2.0").startswith(
        "pkg/m.py: already applied in this version (pkg 2.0) — remove the patch or bound its "
        "Requires")


def test_already_applied_when_the_reversed_diff_applies_though_a_hunk_fits_elsewhere() -> None:
    old = numbered(60)
    new = old.replace("line 10\n", "ten\n").replace("line 50\n", "fifty\n")
    f = only_file(make_diff(old, new, "pkg/m.py"))
    # Upstream has the change, and also a copy of hunk 1's old lines further down, where hunk 1
    # alone would fit; git apply -R takes the whole diff back out, so it is all upstream.
    copy = "".join(f"line {i}\n" for i in range(7, 14))
    source = new.replace("line 30\n", "line 30\n" + copy)
    with pytest.raises(HunkMismatch) as info:
        apply(source, f)
    exc = info.value
    assert exc.all_applied and [m.fit for m in exc.failures] == [7, 54]


def test_a_partly_applied_diff_says_which_hunks_are_upstream() -> None:
    old = numbered(60)
    new = old.replace("line 10\n", "ten\n").replace("line 50\n", "fifty\n")
    f = only_file(make_diff(old, new, "pkg/m.py"))
    source = old.replace("line 10\n", "ten\n").replace("line 49\n", "forty-nine\n")
    with pytest.raises(HunkMismatch) as info:
        apply(source, f)
    exc = info.value
    assert not exc.all_applied
    assert [(m.hunk_index, m.kind) for m in exc.failures] == [
        (1, "already-applied"), (2, "mismatch")]
    message = exc.message("pkg 2.0")
    assert "hunk #1 '@@ -7,7 +7,7 @@' is already applied: its new side is at line 7" in message
    assert "hunk(s) #1 already applied in this version (pkg 2.0) and the others not" in message


# ------------------------------------------------------------------- unsupported and malformed


@pytest.mark.parametrize(
    ("diff", "what", "lineno"),
    [
        pytest.param(
            "diff --git a/m.py b/m.py\ndeleted file mode 100644\nindex 3e75765..0000000\n"
            "--- a/m.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-old\n",
            "file deletion",
            2,
            id="git-deleted-file",
        ),
        pytest.param(
            "--- a/m.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-old\n", "file deletion", 2, id="to-dev-null"
        ),
        pytest.param(
            "diff --git a/pkg/ren.py b/pkg/ren2.py\nsimilarity index 100%\n"
            "rename from pkg/ren.py\nrename to pkg/ren2.py\n",
            "rename",
            2,
            id="pure-rename",
        ),
        pytest.param(
            "diff --git a/x.py b/y.py\nrename from x.py\nrename to y.py\n"
            "--- a/x.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n",
            "rename",
            2,
            id="rename-with-changes",
        ),
        pytest.param(
            "diff --git a/x.py b/y.py\ncopy from x.py\ncopy to y.py\n", "copy", 2, id="copy"
        ),
        pytest.param(
            "diff --git a/b.bin b/b.bin\nindex 6c612ad..1fd7071 100644\n"
            "Binary files a/b.bin and b/b.bin differ\n",
            "binary",
            3,
            id="git-binary",
        ),
        pytest.param(
            "diff --git a/b.bin b/b.bin\nindex 6c612ad..1fd7071 100644\n"
            "GIT binary patch\nliteral 5\nMcmZ?wbYf&-00Ks7Z~y=R\n",
            "binary",
            3,
            id="git-binary-patch",
        ),
        pytest.param("Binary files a/b.bin and b/b.bin differ\n", "binary", 1, id="plain-binary"),
        pytest.param(
            "diff --cc m.py\nindex 1,2..3\n--- a/m.py\n+++ b/m.py\n@@@ -1,1 -1,1 +1,1 @@@\n",
            "combined",
            1,
            id="combined",
        ),
    ],
)
def test_unsupported_forms(diff: str, what: str, lineno: int) -> None:
    with pytest.raises(DiffError) as info:
        parse(diff)
    message = str(info.value)
    assert what in message and "not supported" in message
    assert info.value.lineno == lineno and message.startswith(f"diff line {lineno}:")


@pytest.mark.parametrize(
    ("diff", "fragment", "lineno"),
    [
        pytest.param(
            "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n",
            "diff ends inside hunk",
            3,
            id="too-few-lines",
        ),
        pytest.param(
            "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n a\n-b\n+B\n c\n",
            "more lines than its header",
            7,
            id="too-many-lines",
        ),
        pytest.param(
            "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n a\n-b\n+B\n+C\n",
            "more lines than its header",
            7,
            id="too-many-added",
        ),
        pytest.param(
            "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\ngarbage\n",
            "hunk ends early",
            5,
            id="foreign-line-in-hunk",
        ),
        pytest.param(
            "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@ \n a\n-b\n+B\ndiff --git a/n.py b/n.py\n",
            "expected '--- a/<path>'",
            8,
            id="git-header-without-files",
        ),
        pytest.param("--- a/m.py\n+++ b/m.py\n@@ -x +1 @@\n", "malformed hunk header", 3, id="bad"),
        pytest.param("--- a/m.py\n+++ b/m.py\n", "expected a hunk header", 3, id="no-hunk"),
        pytest.param("--- a/m.py\n+++ b/m.py\n a\n", "expected a hunk header", 3, id="no-hunk2"),
        pytest.param("@@ -1 +1 @@\n-a\n+b\n", "without a file header", 1, id="orphan-hunk"),
        pytest.param(
            "diff --git a/m.py b/m.py\nwhat is this\n--- a/m.py\n",
            "expected '--- a/<path>'",
            2,
            id="junk-in-git-header",
        ),
        pytest.param(
            "--- a/m.py\n+++ b/m.py\n@@ -0,1 +1 @@\n-a\n+b\n", "cannot start at line 0", 3, id="0"
        ),
        pytest.param(
            "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n"
            "-a\n\\ No newline at end of file\n-b\n+c\n+d\n",
            "before the end",
            5,
            id="marker-mid-side",
        ),
        pytest.param(
            "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n\\ No newline at end of file\n-a\n+b\n",
            "must follow a hunk line",
            4,
            id="marker-first",
        ),
        pytest.param(
            "--- a/m.py\n+++ b/m.py\n@@ -5 +5 @@\n-a\n+b\n@@ -2 +2 @@\n-c\n+d\n",
            "hunks must be in file order",
            6,
            id="out-of-order",
        ),
        pytest.param(
            "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+b\n"
            "@@ -3 +3 @@\n-c\n+d\n",
            "not the last hunk",
            3,
            id="marker-not-last-hunk",
        ),
        pytest.param(
            '--- "a/m\\q.py"\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n', "bad escape", 1, id="quote"
        ),
    ],
)
def test_malformed_diffs(diff: str, fragment: str, lineno: int) -> None:
    with pytest.raises(DiffError) as info:
        parse(diff)
    assert fragment in str(info.value)
    assert info.value.lineno == lineno, str(info.value)


def test_text_without_any_file_is_all_preamble() -> None:
    text = "Just a commit message.\n---\n not a diff\n"
    assert parse(text) == ParsedDiff(text, ())
    assert parse("") == ParsedDiff("", ())


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("path", "module"),
    [
        ("vllm/v1/core/sched/scheduler.py", "vllm.v1.core.sched.scheduler"),
        ("pkg/__init__.py", "pkg"),
        ("pkg/sub/__init__.py", "pkg.sub"),
        ("top.py", "top"),
        ("src/pkg/m.py", "src.pkg.m"),  # not stripped: the caller knows its layout
        ("pkg/_private.py", "pkg._private"),
    ],
)
def test_module_name(path: str, module: str) -> None:
    assert module_name(path) == module


@pytest.mark.parametrize(
    "path", ["pkg/m.pyi", "pkg/m.so", "README.md", "__init__.py", "my-pkg/m.py", "pkg//m.py", ".py"]
)
def test_module_name_rejects(path: str) -> None:
    with pytest.raises(DiffError):
        module_name(path)


def test_make_diff_format() -> None:
    assert make_diff("same\n", "same\n", "m.py") == ""
    diff = make_diff("a\nb", "a\nc\n", "pkg/m.py")
    assert diff == (
        "diff --git a/pkg/m.py b/pkg/m.py\n"
        "--- a/pkg/m.py\n"
        "+++ b/pkg/m.py\n"
        "@@ -1,2 +1,2 @@\n"
        " a\n"
        "-b\n"
        "\\ No newline at end of file\n"
        "+c\n"
    )
    quoted = make_diff("a\n", "b\n", 'we"ird\\.py')
    assert quoted.startswith('diff --git "a/we\\"ird\\\\.py" "b/we\\"ird\\\\.py"\n')
    assert only_file(quoted).path == 'we"ird\\.py'


def test_hunk_is_frozen() -> None:
    hunk = Hunk(1, 1, 1, 1, "@@ -1 +1 @@", (("-", "a"), ("+", "b")), False, False)
    with pytest.raises(AttributeError):
        hunk.old_start = 2  # type: ignore[misc]
    assert hunk.old_lines == ["a"]


# --------------------------------------------------------------------------- properties

ALPHABET = ["a", "b", "c", "", "    x = 1", "é ☃", "\tdef f():", "\x0c"]
EOLS = st.sampled_from(["\n", "\r\n"])


def join(lines: list[str], eol: str, final_newline: bool) -> str:
    text = eol.join(lines)
    return text + eol if lines and final_newline else text


@PROPERTY
@given(
    a=st.lists(st.sampled_from(ALPHABET), max_size=15),
    b=st.lists(st.sampled_from(ALPHABET), max_size=15),
    a_nl=st.booleans(),
    b_nl=st.booleans(),
    eol=EOLS,
)
def test_property_make_diff_then_apply_round_trips(
    a: list[str], b: list[str], a_nl: bool, b_nl: bool, eol: str
) -> None:
    old, new = join(a, eol, a_nl), join(b, eol, b_nl)
    diff = make_diff(old, new, "pkg/m.py")
    if old == new:
        assert diff == ""
        return
    result = apply(old, only_file(diff))
    if "\n" not in old:
        # A source without any line ending has no style to keep: new lines get LF.
        assert result == new.replace("\r\n", "\n")
    else:
        assert result == new


DISTINCT = [f"v{i}" for i in range(10)] + ["", "é"]


# Distinct lines around the edited part keep every hunk away from the file's start and end, so
# no hunk is anchored there and each one is searched (anchored hunks have their own property).
HEAD = [f"# head {i}" for i in range(4)]
TAIL = [f"# tail {i}" for i in range(4)]


@PROPERTY
@given(
    a=st.lists(st.sampled_from(DISTINCT), max_size=12, unique=True),
    b=st.lists(st.sampled_from(DISTINCT), max_size=12),
    eol=EOLS,
    max_offset=st.sampled_from([0, 1, 5, 40, 200]),
    data=st.data(),
)
def test_property_shift_within_bound_applies_beyond_raises(
    a: list[str], b: list[str], eol: str, max_offset: int, data: st.DataObject
) -> None:
    # `a` has distinct lines, so each hunk's old side occurs exactly once and
    # "nearest match" cannot pick a different copy.
    assume(a != b)
    old, new = join(HEAD + a + TAIL, eol, True), join(HEAD + b + TAIL, eol, True)
    f = only_file(make_diff(old, new, "pkg/m.py"))

    def shifted(text: str, k: int) -> str:  # k unrelated lines after the first line
        first, rest = text.split(eol, 1)
        return first + eol + "".join(f"# unrelated {i}{eol}" for i in range(k)) + rest

    k = data.draw(st.integers(0, max_offset), label="k")
    assert apply(shifted(old, k), f, max_offset=max_offset) == shifted(new, k)

    k = max_offset + 1 + data.draw(st.integers(0, 3), label="extra")
    with pytest.raises(HunkMismatch) as info:
        apply(shifted(old, k), f, max_offset=max_offset)
    exc = info.value
    stated = f.hunks[0].old_start
    assert exc.hunk_index == 1 and exc.kind == "beyond-window"
    assert exc.fit == exc.nearest == stated + k and exc.nearest_score == 1.0
    assert f"'Max-Offset: {k}'" in str(exc)


@PROPERTY
@given(
    a=st.lists(st.sampled_from(DISTINCT), min_size=1, max_size=12, unique=True),
    b=st.lists(st.sampled_from(DISTINCT), max_size=12),
    a_nl=st.booleans(),
    b_nl=st.booleans(),
    eol=EOLS,
)
def test_property_anchored_hunks_refuse_a_new_first_or_last_line(
    a: list[str], b: list[str], a_nl: bool, b_nl: bool, eol: str
) -> None:
    # Short files: hunks reach line 1 or the last line, so git apply anchors them there
    # (match_beginning / match_end) and a line added above / below must make them fail.
    old, new = join(a, eol, a_nl), join(b, eol, b_nl)
    assume(old != new)
    f = only_file(make_diff(old, new, "pkg/m.py"))
    first, last = f.hunks[0], f.hunks[-1]
    extra = f"# added{eol}"
    if first.old_start <= 1:
        with pytest.raises(HunkMismatch) as info:
            apply(extra + old, f)
        assert info.value.kind in ("anchored", "already-applied")
    if last.trailing == 0 and old.endswith(eol):
        with pytest.raises(HunkMismatch) as info:
            apply(old + extra, f)
        assert info.value.kind in ("anchored", "already-applied")
    assert apply(old, f) == (new if "\n" in old else new.replace("\r\n", "\n"))


DIFFISH = st.sampled_from(
    [
        "diff --git a/m.py b/m.py",
        "--- a/m.py",
        "+++ b/m.py",
        "--- /dev/null",
        "@@ -1,2 +1,2 @@",
        "@@ -1 +1 @@ def f():",
        "@@ -0,0 +1 @@",
        "@@ -2,0 +3,2 @@",
        "@@@ -1 -1 +1 @@@",
        " a",
        "-a",
        "+b",
        "",
        "\\ No newline at end of file",
        "index 1111111..2222222 100644",
        "new file mode 100644",
        "old mode 100644",
        "rename from x",
        "-- ",
        "Binary files a and b differ",
        '--- "a/\\303\\251.py"',
        '+++ "b/\\303',
    ]
)


def check_parse_is_total(text: str) -> None:
    try:
        parsed = parse(text)
    except DiffError:
        return
    assert isinstance(parsed, ParsedDiff)
    for f in parsed.files:
        assert f.hunks
        for hunk in f.hunks:
            assert sum(tag != "+" for tag, _ in hunk.lines) == hunk.old_len
            assert sum(tag != "-" for tag, _ in hunk.lines) == hunk.new_len
        for source in ("", "a\nb\n", "a\r\nb", "b\n" * 5):
            try:
                assert isinstance(apply(source, f), str)
            except (HunkMismatch, DiffError) as exc:  # DiffError: a hunk without context
                assert str(exc)


@PROPERTY
@given(st.text())
def test_property_garbage_parses_or_raises_diff_error(text: str) -> None:
    check_parse_is_total(text)


@PROPERTY
@given(st.lists(st.one_of(DIFFISH, st.text(max_size=8)), max_size=25), EOLS)
def test_property_diff_like_soup_parses_or_raises_diff_error(lines: list[str], eol: str) -> None:
    check_parse_is_total(eol.join(lines))


HEADER = "diff --git a/m.py b/m.py\nindex 1111111..2222222 100644\n--- a/m.py\n+++ b/m.py\n"
HUNKISH = st.sampled_from(
    [" a", " b", "-a", "-b", "+a", "+c", "", "\\ No newline at end of file", "-- ", "x"]
    + ["@@ -1,2 +1,2 @@", "@@ -3 +3,0 @@", "@@ -2,0 +3 @@ f", "--- a/n.py", "+++ b/n.py"]
)


@PROPERTY
@given(st.lists(HUNKISH, max_size=20), EOLS)
def test_property_hunk_like_soup_parses_or_raises_diff_error(lines: list[str], eol: str) -> None:
    check_parse_is_total(HEADER.replace("\n", eol) + eol.join(["@@ -1,2 +1,2 @@", *lines]))


@PROPERTY
@given(st.text())
def test_property_garbage_after_file_header_raises(garbage: str) -> None:
    assume(not garbage.startswith("@@"))
    with pytest.raises(DiffError):
        parse(HEADER + garbage)


@PROPERTY
@given(
    st.lists(
        st.text(min_size=1).filter(lambda s: s[0] not in " +-\\\r\n" and "\n" not in s),
        max_size=5,
    )
)
def test_property_garbage_after_hunk_header_raises(garbage: list[str]) -> None:
    with pytest.raises(DiffError):
        parse(HEADER + "@@ -1,2 +1,2 @@\n" + "\n".join(garbage))


# ----------------------------------------------- placement where git apply and GNU patch differ


def test_the_previous_offset_is_carried_as_gnu_patch_does_not_git() -> None:
    # Upstream added 50 lines at the top, and a copy of hunk 2's old side 24 lines below hunk 2's
    # stated line. GNU patch carries hunk 1's offset (+50) to hunk 2 and finds its lines 7 away
    # from there, where they moved; git apply starts hunk 2 at its own stated line and takes the
    # nearer copy. The engine carries the offset, as GNU patch does.
    import sys

    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "scripts" / "eval"))
    import diff_corpus

    old = numbered(200)
    new = old.replace("line 10\n", "ten\n").replace("line 100\n", "hundred\n")
    diff = make_diff(old, new, "pkg/m.py")
    copy = "".join(f"line {i}\n" for i in range(97, 104))
    source = numbered(50, start=1000) + old.replace("line 70\n", "line 70\n" + copy)
    ours = apply(source, only_file(diff))
    assert ours == numbered(50, start=1000) + new.replace("line 70\n", "line 70\n" + copy)
    tools = diff_corpus.Tools()
    try:
        git = tools.git_apply(source, diff, "pkg/m.py")
        gnu = tools.gnu_patch(source, diff, "pkg/m.py")
    finally:
        tools.close()
    assert git is not None and git != ours  # git changed the copy
    assert git.count("hundred\n") == 1 and git.index("hundred") < ours.index("hundred")
    if not tools.has_patch:
        pytest.skip("GNU patch is not installed: the engine matched, git's differing was checked")
    assert gnu == ours


def test_already_applied_is_seen_beyond_the_window_when_the_reversed_diff_applies() -> None:
    # git apply -R searches the whole file: a change that is upstream, 400 lines below where
    # the diff says, is "already applied", not a mismatch.
    old = numbered(60)
    new = old.replace("line 10\n", "ten\n").replace("line 50\n", "fifty\n")
    f = only_file(make_diff(old, new, "pkg/m.py"))
    with pytest.raises(HunkMismatch) as info:
        apply(numbered(400, start=1000) + new, f)
    exc = info.value
    assert exc.all_applied and [m.fit for m in exc.failures] == [407, 447]
    assert "already applied in this version" in exc.message()


def test_a_hunk_that_fits_only_before_the_previous_one_says_where() -> None:
    old = numbered(100)
    new = old.replace("line 10\n", "ten\n").replace("line 50\n", "fifty\n")
    f = only_file(make_diff(old, new, "pkg/m.py"))
    # Upstream moved lines 41-60 to the top: hunk 2's old side is now before hunk 1's place.
    lines = old.splitlines(keepends=True)
    source = "".join(lines[40:60] + lines[:40] + lines[60:])
    with pytest.raises(HunkMismatch) as info:
        apply(source, f)
    exc = info.value
    assert (exc.hunk_index, exc.kind, exc.fit) == (2, "order", 7)
    text = exc.describe()
    assert "within 200 lines" not in text
    assert "its old side fits exactly at line 7, 60 lines before" in text, text
    assert "the previous hunk" in text
