"""Source diffs at the import of their target, by the real import hook in a child of the wheel
venv: every failing hunk named, "already applied" for a change that is upstream (on_error="fail"
fails with it, "warn" skips with it), the Max-Offset and Unidiff-Zero headers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from coreutil import EVENTS, Lab

from importpatch.rewrite.diffs import make_diff


def module(n: int, changed: frozenset[int] = frozenset()) -> str:
    """``n`` small functions; those in ``changed`` return something else."""
    return "".join(
        f"def f{i}():\n    return {i * 10 if i in changed else i}\n\n\n" for i in range(n)
    )


OLD, NEW = module(12), module(12, frozenset({1, 5, 9}))  # hunks at lines 3, 19 and 35
TARGET = {"dpkg/__init__.py": '__version__ = "2.0"\n'}
IMPORT = f"""
    import json, importpatch.events
    try:
        import dpkg.m as m
        result = [m.f1(), m.f5(), m.f9()]
    except ImportError as exc:
        result = [type(exc).__name__, str(exc)]
    print(json.dumps([result, {EVENTS}]))
    """


def diff_file(header: str, old: str = OLD, new: str = NEW) -> str:
    return header + "\n\n" + make_diff(old, new, "dpkg/m.py")


def test_import_error_names_every_failing_hunk(lab: Lab) -> None:
    upstream = OLD.replace("def f1():", "def f1():  # moved").replace(
        "def f9():", "def f9():  # moved")
    lab.target({**TARGET, "dpkg/m.py": upstream}).patch({"three.diff": diff_file("Name: three")})
    (error_type, message), _ = lab.json(IMPORT, enable="three")
    assert error_type == "PatchError"
    assert "patch 'three' cannot apply to dpkg.m" in message and "dpkg 2.0" in message
    assert "dpkg/m.py: 2 of 3 hunks do not apply: hunk #1 " in message
    assert "; hunk #3 '@@ " in message and "hunk #2 " not in message
    assert "expected 'def f9():' but found 'def f9():  # moved'" in message


@pytest.mark.parametrize("on_error", ["fail", "warn"])
def test_a_change_already_upstream_is_named_so_warn_skips_fail_fails(
    lab: Lab, on_error: str
) -> None:
    lab.target({**TARGET, "dpkg/m.py": NEW}).patch(
        {"up.diff": diff_file(f"Name: up\nOn-Error: {on_error}")})
    result, events = lab.json(IMPORT, enable="up")
    words = ("already applied in this version (dpkg 2.0) — remove the patch or bound its "
             "Requires")
    if on_error == "fail":
        assert result[0] == "PatchError" and words in result[1], result
    else:  # imported as it is (which already has the change), the patch skipped with the reason
        assert result == [10, 50, 90]
        assert ["failed", "up", "dpkg.m", "skipped (on_error=warn)"] in events
        proc = lab.ok("import dpkg.m", enable="up", env={"IMPORTPATCH_LOG": "1"})
        assert words in proc.stderr


def test_partly_upstream_says_which_hunks(lab: Lab) -> None:
    source = OLD.replace("return 1\n", "return 10\n")  # hunk 1 is upstream, the others not
    lab.target({**TARGET, "dpkg/m.py": source.replace("def f9():", "def f9(x=0):")})
    lab.patch({"partly.diff": diff_file("Name: partly")})
    (error_type, message), _ = lab.json(IMPORT, enable="partly")
    assert error_type == "PatchError"
    assert "hunk #1 '@@ -3,7 +3,7 @@' is already applied: its new side is at line 3" in message
    assert ("hunk(s) #1 already applied in this version (dpkg 2.0) and the others not: the "
            "change is partly upstream") in message


def test_max_offset_header_lets_a_far_hunk_apply(lab: Lab) -> None:
    prefix = "".join(f"X{i} = {i}\n" for i in range(250))
    lab.target({**TARGET, "dpkg/m.py": prefix + OLD})
    lab.patch({"far.diff": diff_file("Name: far"),
               "near.diff": diff_file("Name: near\nMax-Offset: 250")})
    (error_type, message), _ = lab.json(IMPORT, enable="far")
    assert error_type == "PatchError" and "'Max-Offset: 250' in the diff's header" in message
    result, _ = lab.json(IMPORT, enable="near")
    assert result == [10, 50, 90]


def test_zero_context_diff_fails_at_declaration_unless_accepted(lab: Lab) -> None:
    u0 = "--- a/dpkg/m.py\n+++ b/dpkg/m.py\n@@ -6 +6 @@\n-    return 1\n+    return 10\n"
    lab.target({**TARGET, "dpkg/m.py": OLD})
    lab.patch({"u0.diff": f"Name: u0\n\n{u0}",
               "u0ok.diff": f"Name: u0ok\nUnidiff-Zero: yes\n\n{u0}"})
    (error_type, message), _ = lab.json(IMPORT, enable="u0")
    assert error_type == "PatchError"
    assert "git diff -U0" in message and "'Unidiff-Zero: yes'" in message
    result, _ = lab.json(IMPORT, enable="u0ok")
    assert result == [10, 5, 9]


def git_diff(tmp_path: Path, old: bytes, new: bytes) -> bytes:
    """What real ``git diff`` prints for dpkg/m.py changed from ``old`` to ``new``."""
    repo = tmp_path / "repo"
    (repo / "dpkg").mkdir(parents=True)
    (repo / "dpkg" / "m.py").write_bytes(old)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "old"]):
        subprocess.run([*git, *args], check=True)
    (repo / "dpkg" / "m.py").write_bytes(new)
    return subprocess.run([*git, "diff"], check=True, capture_output=True).stdout


def test_git_diff_of_a_file_with_a_utf8_bom_applies(lab: Lab, tmp_path: Path) -> None:
    # git diff shows the BOM as part of the first line's text; Python drops it when it decodes
    # the module, and git apply applies the diff: so must the import.
    old = "\ufeffdef f1():\n    return 1\n"
    diff = git_diff(tmp_path, old.encode(), old.replace("return 1", "return 10").encode()).decode()
    assert "-\ufeffdef f1():" not in diff and " \ufeffdef f1():" in diff  # context, with its BOM
    lab.target({**TARGET, "dpkg/m.py": old}).patch({"bom.diff": "Name: bom\n\n" + diff})
    out = lab.json("""
        import json, dpkg.m
        print(json.dumps([dpkg.m.f1(), open(dpkg.m.__file__, "rb").read(3).hex()]))
        """, enable="bom")
    assert out == [10, "efbbbf"]


def test_git_diff_of_a_latin1_file_names_the_byte_and_applies_once_reencoded(
        lab: Lab, tmp_path: Path) -> None:
    old = "# -*- coding: latin-1 -*-\ndef f1():\n    return 'café'\n"
    new = old.replace("return 'café'", "return 'crème'")
    raw = git_diff(tmp_path, old.encode("latin-1"), new.encode("latin-1"))
    (lab.targets / "dpkg").mkdir()
    (lab.targets / "dpkg" / "__init__.py").write_text("")
    (lab.targets / "dpkg" / "m.py").write_bytes(old.encode("latin-1"))
    patch_file = lab.patches / "lat.diff"
    patch_file.write_bytes(b"Name: lat\n\n" + raw)
    show = """
        import json
        try:
            import dpkg.m
            print(json.dumps(dpkg.m.f1()))
        except ImportError as exc:
            print(json.dumps(str(exc)))
        """
    message = lab.json(show, enable="lat")
    line = (b"Name: lat\n\n" + raw).split(b"\n").index("-    return 'café'".encode("latin-1")) + 1
    assert f"{patch_file}: a diff must be UTF-8 text, and byte 0xe9 on line {line} is not" \
        in message
    assert "iconv -f latin1 -t utf-8" in message
    patch_file.write_bytes(b"Name: lat\n\n" + raw.decode("latin-1").encode("utf-8"))  # iconv
    assert lab.json(show, enable="lat") == "crème"


# -- a multi-file diff is all or nothing per process ----------------------------------------------

TOY = {"toyp/__init__.py": "", "toyp/a.py": module(4), "toyp/b.py": module(4)}
TWO = make_diff(module(4), module(4, frozenset({1})), "toyp/a.py") + make_diff(
    module(4), module(4, frozenset({2})), "toyp/b.py")
DRIFTED_B = module(4).replace("return 2\n", "return 2  # upstream\n")
BOTH = """
    import json, importpatch.events
    out = []
    for name in ("toyp.a", "toyp.b"):
        try:
            m = __import__(name, fromlist=["f1"])
            out.append([m.f1(), m.f2()])
        except ImportError as exc:
            out.append([type(exc).__name__, str(exc)])
    print(json.dumps([out, {EVENTS}]))
    """.replace("{EVENTS}", EVENTS)


@pytest.mark.parametrize("on_error", ["warn", "fail"])
def test_a_diff_of_two_files_lands_whole_or_not_at_all(lab: Lab, on_error: str) -> None:
    # toyp/a.py fits, toyp/b.py drifted: git apply refuses the whole diff, so must the import.
    lab.target({**TOY, "toyp/b.py": DRIFTED_B})
    lab.patch({"two.diff": f"Name: two\nOn-Error: {on_error}\n\n" + TWO})
    where = "toyp/b.py: hunk #1 '@@ -7,7 +7,7 @@' does not apply"
    for _ in range(2):  # the second run finds a's bytecode cache entry
        (a, b), events = lab.json(BOTH, enable="two")
        if on_error == "warn":
            assert a == [1, 2] and b == [1, 2]  # neither patched
            skips = [e for e in events if e[0] == "failed"]
            assert skips == [["failed", "two", "toyp.a", "skipped (on_error=warn)"],
                             ["failed", "two", "toyp.b", "skipped (on_error=warn)"]]
            assert not [e for e in events if e[0] == "applied"]
        else:
            assert a[0] == "PatchError" and b[0] == "PatchError", (a, b)
            assert "cannot apply to toyp.a" in a[1] and where in a[1], a[1]
            assert "applied whole or not at all" in a[1]
            assert where in b[1]
    if on_error == "warn":
        proc = lab.ok("import toyp.a", enable="two")
        assert where in proc.stderr and "no file of it is patched" in proc.stderr
    # Once b is fixed, both land; a's cache entry of the refusal is not reused.
    lab.target({"toyp/b.py": module(4)})
    (a, b), _ = lab.json(BOTH, enable="two")
    assert a == [10, 2] and b == [1, 20]
    # And once b drifts again, a's cache entry of the success is not reused either.
    lab.target({"toyp/b.py": DRIFTED_B})
    (a, b), _ = lab.json(BOTH, enable="two")
    assert a != [10, 2]


def test_check_says_the_files_of_a_diff_that_apply_are_not_patched_when_another_does_not(
        lab: Lab) -> None:
    lab.target({**TOY, "toyp/b.py": DRIFTED_B})
    lab.patch({"two.diff": "Name: two\nOn-Error: warn\n\n" + TWO})
    proc = lab.run(["-m", "importpatch", "check", "two", "--json"], enable="two")
    report = json.loads(proc.stdout)
    (patch,) = report["patches"]
    a, b = patch["ops"]
    assert patch["status"] == "fail" and b["status"] == "fail"
    assert a["status"] == "fail" and a["detail"].startswith("1 hunk(s) apply; but not patched at "
                                                            "import"), a
    assert "its change to toyp.b does not apply" in a["detail"]
