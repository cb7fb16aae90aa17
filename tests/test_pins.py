"""Pins and drift of Python patch operations (issue 28): ``importpatch pin`` records each target's
original beside the patch, ``check`` compares it with a release (unchanged / changed with
upstream's diff / moved / gone), the import hook warns once per process (fails closed under
IMPORTPATCH_STRICT=1) from digests cached with the compiled code, ``doctor`` and ``status`` say
so; and PEP 508 environment markers in a patch's requirement.

Real parts: the wheel venv, child interpreters, a hand-written wheel of the target's next release.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from coreutil import COMPILE_SPY, Lab, write_tree, write_wheel

V1 = """\
__version__ = "1.0"
"""
MOD_V1 = """\
class Sampler:
    def gather(self, x):
        # copy me
        y = x + 1
        return y

    def other(self):
        return 2


class Base:
    def size(self):
        return 1


class Cfg:
    a: int = 1


def helper(a):
    return a * 2


def doomed():
    return 0


def wandering():
    return 0
"""
# Release 2.0: gather gained a `with`, Sampler a method, helper only a comment and blank lines,
# doomed is gone, wandering moved to another module.
MOD_V2 = (MOD_V1.replace("        y = x + 1\n", "        with sync_allowed():\n"
                         "            y = x + 1\n")
          .replace("    def other(self):", "    def fresh(self):\n        return 3\n\n"
                   "    def other(self):")
          .replace("def helper(a):\n", "def helper(a):\n    # only a comment\n\n")
          .replace("def doomed():\n    return 0\n", "")
          .replace("def wandering():\n    return 0\n", ""))
MOVED_TO = "def wandering():\n    return 0\n"

PATCH = '''\
from importpatch import Patch

patch = Patch("pp", requires="tgt>=1.0")

@patch.replace("tgt.mod:Sampler.gather")
def gather(self, x):
    return x + 100

@patch.wrap("tgt.mod:helper")
def helper(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs) + 1

@patch.subclass("tgt.mod:Base")
def make(Original):
    class Bigger(Original):
        def size(self):
            return 2
    return Bigger

@patch.add("tgt.mod:Cfg.extra")
def extra(self):
    return 1

patch.field("tgt.mod:Cfg.b", "int", 2)

cls = Patch("cls")

@cls.replace("tgt.mod:Sampler")
class Sampler:
    def gather(self, x):
        return 0

gone = Patch("gone")

@gone.replace("tgt.mod:doomed")
def doomed():
    return 1

moved = Patch("moved")

@moved.replace("tgt.mod:wandering")
def wandering():
    return 1
'''
UNPINNED = '''\
from importpatch import Patch

loose = Patch("loose")

@loose.replace("tgt.mod:helper")
def helper(a):
    return a
'''

pytestmark = pytest.mark.lab(target={"tgt/__init__.py": V1, "tgt/mod.py": MOD_V1},
                             patch={"p.py": PATCH, "loose.py": UNPINNED})


def cli(lab: Lab, *args: str, enable: str | None = None, env: dict[str, str] | None = None
        ) -> tuple[int, str, str]:
    proc = lab.run(["-m", "importpatch", *args], enable=enable, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def pin_all(lab: Lab) -> None:
    status, out, err = cli(lab, "pin", "pp", "cls", "gone", "moved")
    assert status == 0, out + err


def upgrade(lab: Lab) -> None:
    lab.target({"tgt/__init__.py": V1.replace("1.0", "2.0"), "tgt/mod.py": MOD_V2,
                "tgt/elsewhere.py": MOVED_TO})


def normalised_digest(text: str) -> str:
    """The documented normalisation, written again here (for text without multi-line strings):
    comments (the tokenizer's) and trailing white space off, blank lines dropped."""
    import io
    import tokenize

    lines = text.splitlines()
    for tok in reversed(list(tokenize.generate_tokens(io.StringIO(text).readline))):
        if tok.type == tokenize.COMMENT:
            row, line = tok.start[0] - 1, lines[tok.start[0] - 1]
            lines[row] = line[:tok.start[1]] + line[tok.end[1]:]
    kept = [x.rstrip() for x in lines if x.strip()]
    return "sha256-2:" + hashlib.sha256(("\n".join(kept) + "\n").encode()).hexdigest()


def read_pins(lab: Lab) -> list[dict[str, str]]:
    text = (lab.patches / "p.pin.toml").read_text()
    if sys.version_info >= (3, 11):
        import tomllib

        return list(tomllib.loads(text)["pin"])
    from importpatch.rewrite.pins import parse  # 3.10: no tomllib; the project's reader

    return [p.to_dict() for p in parse(text)]


def check_json(lab: Lab, *args: str, env: dict[str, str] | None = None
               ) -> tuple[int, dict[str, object]]:
    status, out, err = cli(lab, "check", "--json", *args, env=env)
    assert out, err
    return status, json.loads(out)


def drifts(report: dict[str, object]) -> dict[tuple[str, str, str], dict[str, object]]:
    return {(p["name"], op["kind"], op["target"]): op["drift"]  # type: ignore[index]
            for p in report["patches"] for op in p["ops"]}  # type: ignore[attr-defined]


def test_pin_writes_each_python_targets_release_digest_and_text_as_toml(lab: Lab) -> None:
    pin_all(lab)
    pins = {(p["patch"], p["kind"], p["qualname"]): p for p in read_pins(lab)}
    # replace / wrap / subclass on their target; add and field on the class they go into
    assert sorted(pins) == [
        ("cls", "replace", "Sampler"), ("gone", "replace", "doomed"),
        ("moved", "replace", "wandering"), ("pp", "add", "Cfg"), ("pp", "replace",
                                                                  "Sampler.gather"),
        ("pp", "subclass", "Base"), ("pp", "wrap", "helper"),
    ]
    gather = pins[("pp", "replace", "Sampler.gather")]
    assert gather["source"] == ("def gather(self, x):\n    # copy me\n    y = x + 1\n"
                                "    return y\n")
    assert gather["digest"] == normalised_digest(gather["source"])
    assert (gather["dist"], gather["version"], gather["module"]) == ("tgt", "1.0", "tgt.mod")
    assert gather["target"] == "tgt.mod:Sampler.gather"
    # a second pin keeps the other patches' pins in the file
    status, out, err = cli(lab, "pin", "gone")
    assert status == 0, err
    assert len(read_pins(lab)) == 7


def test_check_gives_each_pinned_original_its_drift_verdict_with_upstreams_diff(lab: Lab
                                                                                 ) -> None:
    pin_all(lab)
    status, report = check_json(lab, "pp", "cls", "gone", "moved", "loose")
    assert status == 0
    assert {v["verdict"] for v in drifts(report).values() if v} == {"unchanged", "unpinned"}
    assert {p["name"]: p["drift"] for p in report["patches"]}["loose"] == "unpinned"  # type: ignore[attr-defined,index]

    upgrade(lab)
    status, report = check_json(lab, "pp", "cls", "gone", "moved", "loose")
    d = drifts(report)
    gather = d[("pp", "replace", "tgt.mod:Sampler.gather")]
    assert gather["verdict"] == "changed"
    assert (gather["pinned"], gather["against"]) == ("tgt 1.0", "tgt 2.0")
    assert "-    y = x + 1\n+    with sync_allowed():\n+        y = x + 1\n" in gather["diff"]
    assert gather["diff"].startswith("--- tgt.mod:Sampler.gather (tgt 1.0)\n"
                                     "+++ tgt.mod:Sampler.gather (tgt 2.0)\n")
    # a comment and blank lines are no drift
    assert d[("pp", "wrap", "tgt.mod:helper")]["verdict"] == "unchanged"
    assert d[("pp", "subclass", "tgt.mod:Base")]["verdict"] == "unchanged"
    # the replaced class: the member upstream added that the replacement does not define
    whole = d[("cls", "replace", "tgt.mod:Sampler")]
    assert whole["verdict"] == "changed" and whole["added"] == ["fresh"]
    assert d[("gone", "replace", "tgt.mod:doomed")]["verdict"] == "gone"
    wander = d[("moved", "replace", "tgt.mod:wandering")]
    assert wander["verdict"] == "moved"
    assert "tgt.elsewhere:wandering" in wander["candidates"]
    # the ops that still apply stay ok: drift is its own verdict, and the exit status's only
    # with --fail-on-drift (3)
    by_name = {p["name"]: p for p in report["patches"]}  # type: ignore[attr-defined]
    assert (by_name["pp"]["status"], by_name["pp"]["drift"]) == ("ok", "changed")
    status, report = check_json(lab, "pp", "cls", "--fail-on-drift")
    assert status == 3 and report["exit_status"] == 3
    status, out, _ = cli(lab, "check", "pp", "--fail-on-drift")
    assert status == 3
    assert "drift: changed: tgt.mod:Sampler.gather changed since the pin" in " ".join(out.split())
    assert "        +    with sync_allowed():" in out  # upstream's diff, unwrapped


def test_check_against_a_wheel_compares_the_pin_with_that_release(lab: Lab, tmp_path: Path
                                                                   ) -> None:
    pin_all(lab)
    wheel = write_wheel(tmp_path / "tgt-2.0-py3-none-any.whl", "tgt", "2.0",
                        {"tgt/__init__.py": V1.replace("1.0", "2.0"), "tgt/mod.py": MOD_V2,
                         "tgt/elsewhere.py": MOVED_TO}, top_level=["tgt"])
    status, report = check_json(lab, "pp", "moved", "--against", str(wheel))
    d = drifts(report)
    assert d[("pp", "replace", "tgt.mod:Sampler.gather")]["verdict"] == "changed"
    assert d[("pp", "replace", "tgt.mod:Sampler.gather")]["against"] == "tgt 2.0"
    assert d[("moved", "replace", "tgt.mod:wandering")]["candidates"] == [
        "tgt.elsewhere:wandering"]
    status, report = check_json(lab, "pp")  # the installed 1.0: as pinned
    assert drifts(report)[("pp", "replace", "tgt.mod:Sampler.gather")]["verdict"] == "unchanged"


RUN = COMPILE_SPY + """
import sys
import tgt.mod
import importpatch.events
print("gather", tgt.mod.Sampler().gather(1), "compiles", compiles,
      "drift", [e['target'] for e in importpatch.events.events() if e['how'] == 'drift'])
"""


def test_the_import_warns_once_from_the_cached_digest_and_strict_fails_closed(lab: Lab) -> None:
    pin_all(lab)
    upgrade(lab)
    cold = lab.ok(RUN, enable="pp")
    assert "compiles ['tgt.mod'] drift ['tgt.mod:Sampler.gather']" in cold.stdout
    warning = "pp: replace tgt.mod:Sampler.gather: the original tgt.mod:Sampler.gather changed"
    assert cold.stderr.count(warning) == 1, cold.stderr
    assert "gather 101" in cold.stdout  # the patch still applies
    warm = lab.ok(RUN, enable="pp")  # from the cache: no compile, the same verdict
    assert "compiles [] drift ['tgt.mod:Sampler.gather']" in warm.stdout
    assert warm.stderr.count(warning) == 1
    strict = lab.run(RUN, enable="pp", env={"IMPORTPATCH_STRICT": "1"})
    assert strict.returncode != 0
    assert "PatchError" in strict.stderr and "IMPORTPATCH_STRICT is on" in strict.stderr
    assert "gather 101" not in strict.stdout
    # pinned again on 2.0: no warning, still without compiling
    status, _, err = cli(lab, "pin", "pp")
    assert status == 0, err
    again = lab.ok(RUN, enable="pp")
    assert "compiles [] drift []" in again.stdout and warning not in again.stderr


RETIRING = '''\
from importpatch import Patch

patch = Patch("retiring", retire_if=["source contains 'sync_allowed()'", "tgt contains NOPE"])

@patch.wrap("tgt.mod:helper")
def helper(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
'''


@pytest.mark.lab(target={"tgt/__init__.py": V1, "tgt/mod.py": MOD_V1},
                 patch={"retiring.py": RETIRING})
def test_check_and_status_report_a_patchs_retire_if_on_the_installed_source(lab: Lab) -> None:
    """The patch's stated fact, read from the target's source (never run): false on 1.0, true
    once the installed release has `with sync_allowed():` (2.0)."""
    status, report = check_json(lab, "retiring")
    assert report["patches"][0]["retire"] == ""  # type: ignore[index]
    events = lab.root / "events"
    lab.ok("import tgt.mod", enable="retiring", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    status, out, err = cli(lab, "status", "--events-dir", str(events))
    assert status == 0 and "upstream already has" not in out, out + err
    upgrade(lab)
    status, report = check_json(lab, "retiring")
    said = ("upstream has this change: retire the patch (retire_if: source contains "
            "'sync_allowed()' holds in installed packages")
    assert report["patches"][0]["retire"].startswith(said)  # type: ignore[index]
    status, out, err = cli(lab, "status", "--events-dir", str(events), "--json")
    ((name, detail),) = [(r["patch"], r["detail"]) for r in json.loads(out)["retire"]]
    assert name == "retiring" and detail.startswith(said)
    status, out, err = cli(lab, "status", "--events-dir", str(events))
    assert "upstream already has (installed here): retiring: upstream has this change" in \
        " ".join(out.split())


def test_doctor_and_status_mention_drift_of_enabled_patches(lab: Lab) -> None:
    pin_all(lab)
    upgrade(lab)
    status, out, err = cli(lab, "doctor", enable="pp")
    assert "drift: pp: tgt.mod:Sampler.gather changed since the pin (tgt 1.0 -> tgt 2.0)" in \
        " ".join(out.split()), out + err
    events = lab.root / "events"
    lab.ok("import tgt.mod", enable="pp", env={"IMPORTPATCH_EVENTS_DIR": str(events)})
    status, out, err = cli(lab, "status", "--events-dir", str(events))
    assert status == 0, err
    flat = " ".join(out.split())
    assert "pinned originals that changed" in flat
    assert "pp: replace tgt.mod:Sampler.gather: the original tgt.mod:Sampler.gather changed" \
        in flat


MARKED = '''\
from importpatch import Patch

here = Patch("here", requires='tgt>=1.0; platform_machine == "{machine}"')

@here.replace("tgt.mod:doomed")
def doomed():
    return "here"

elsewhere = Patch("elsewhere", requires='tgt>=1.0; platform_machine == "no-such-machine"')

@elsewhere.replace("tgt.mod:wandering")
def wandering():
    return "elsewhere"
'''


def test_a_requirements_environment_marker_decides_like_pip(lab: Lab) -> None:
    import platform

    write_tree(lab.patches, {"marked.py": MARKED.format(machine=platform.machine())})
    out = lab.ok("import tgt.mod; print(tgt.mod.doomed(), tgt.mod.wandering())",
                 enable="here,elsewhere").stdout
    assert out.split() == ["here", "0"]
    status, report = check_json(lab, "here", "elsewhere")
    by = {p["name"]: p for p in report["patches"]}  # type: ignore[attr-defined]
    assert by["here"]["status"] == "ok"
    assert by["elsewhere"]["status"] == "skip"
    why = ('platform_machine == "no-such-machine" is false here '
           f"(platform_machine is {platform.machine()!r})")
    assert why in by["elsewhere"]["requirement"]
    status, out, err = cli(lab, "list", enable="here,elsewhere")
    assert why in " ".join(out.split()), out + err


# -- A copied-and-edited replace becomes a diff, which rebase carries -----------------------------

COPIED_V1 = '''\
class Sampler:
    @staticmethod
    def gather(logprobs, token_ids):
        top = sorted(logprobs)
        # keep the shapes symbolic
        mark(logprobs)
        mark(token_ids)
        ranks = count(logprobs, token_ids)
        return top, ranks

    def other(self, logprobs, token_ids):
        mark(logprobs)
        mark(token_ids)
        return 0
'''
# The next release puts the three lines under a `with` (vLLM 0.29's gpu_sync_allowed).
COPIED_V2 = ("sync_allowed = print\n\n\n" + COPIED_V1.replace(
    "        mark(logprobs)\n        mark(token_ids)\n        ranks = count(logprobs, token_ids)\n",
    "        with sync_allowed(first_only=True):\n            mark(logprobs)\n"
    "            mark(token_ids)\n            ranks = count(logprobs, token_ids)\n", 1))
# vllm-gaudi's pattern: the whole method copied to delete two lines.
COPY = '''\
from importpatch import Patch

patch = Patch("copied")

@patch.replace("tgt.mod:Sampler.gather")
def gather(logprobs, token_ids):
    top = sorted(logprobs)
    # keep the shapes symbolic
    ranks = count(logprobs, token_ids)
    return top, ranks
'''


@pytest.mark.lab(patch={"copied.py": COPY}, venv="rebase_venv")
def test_a_copied_replace_converts_to_a_diff_of_the_edit_that_rebase_carries(
        lab: Lab, tmp_path: Path) -> None:
    old = write_wheel(tmp_path / "tgt-1.0-py3-none-any.whl", "tgt", "1.0",
                      {"tgt/__init__.py": "", "tgt/mod.py": COPIED_V1}, top_level=["tgt"])
    new = write_wheel(tmp_path / "tgt-2.0-py3-none-any.whl", "tgt", "2.0",
                      {"tgt/__init__.py": "", "tgt/mod.py": COPIED_V2}, top_level=["tgt"])
    status, out, err = cli(lab, "pin", "copied", "--against", str(old))
    assert status == 0, out + err
    # unconverted, the copy has silently lost upstream's `with`: check says so, with the diff
    status, report = check_json(lab, "copied", "--against", str(new))
    d = drifts(report)[("copied", "replace", "tgt.mod:Sampler.gather")]
    assert d["verdict"] == "changed"
    assert "+    with sync_allowed(first_only=True):" in d["diff"]

    diffs_dir = tmp_path / "diffs"
    diffs_dir.mkdir()
    status, out, err = cli(lab, "convert", "copied", "--base", str(old), "--out",
                           str(diffs_dir))
    assert status == 0, out + err
    (made,) = diffs_dir.glob("*.diff")
    text = made.read_text()
    # just the edit, where the original is
    assert changed_lines(text) == ["-        mark(logprobs)", "-        mark(token_ids)"]
    assert "-        mark(logprobs)\n-        mark(token_ids)\n" in text
    assert "Base: tgt==1.0" in text

    env = {"IMPORTPATCH_PATH": str(diffs_dir)}
    (tmp_path / "carried").mkdir()
    rebased = tmp_path / "carried" / made.name
    status, out, err = cli(lab, "rebase", made.stem, "--base", str(old), "--to", str(new),
                           "--out", str(rebased), "--work", str(tmp_path / "work"), env=env)
    assert status == 0, out + err
    carried = rebased.read_text()
    # upstream's `with` kept (context), the two lines still deleted, the other method untouched
    assert ("         with sync_allowed(first_only=True):\n-            mark(logprobs)\n"
            "-            mark(token_ids)\n             ranks = count(logprobs, token_ids)\n"
            ) in carried
    assert changed_lines(carried) == ["-            mark(logprobs)", "-            mark(token_ids)"]
    env = {"IMPORTPATCH_PATH": str(rebased.parent)}
    status, report = check_json(lab, made.stem, "--against", str(new), env=env)
    assert report["patches"][0]["status"] == "ok"  # type: ignore[index]
    applied = lab.ok("import tgt.mod, inspect; print(inspect.getsource(tgt.mod.Sampler.gather))",
                     enable=made.stem, env={**env, "PYTHONPATH": str(_unpacked(new, tmp_path))})
    assert "with sync_allowed" in applied.stdout and "mark(" not in applied.stdout


@pytest.mark.lab(target={"tgt/__init__.py": '__version__ = "1.0"\n', "tgt/mod.py": COPIED_V1},
                 patch={"copied.py": COPY}, venv="rebase_venv")
def test_convert_base_installed_reads_this_interpreters_packages(lab: Lab) -> None:
    """``--base installed`` as ``rebase --to installed``: the original is the installed one
    (refused before, with an error naming ``--against``)."""
    status, out, err = cli(lab, "convert", "copied", "--base", "installed", "--dry-run")
    assert status == 0, out + err
    assert changed_lines(out) == ["-        mark(logprobs)", "-        mark(token_ids)"]
    assert "Base: tgt==1.0" in out


def changed_lines(diff: str) -> list[str]:
    body = diff.split("+++ b/tgt/mod.py\n")[1].splitlines()
    return [x for x in body if x[:1] in "+-" and x]


def _unpacked(wheel: Path, tmp_path: Path) -> Path:
    import zipfile

    dest = tmp_path / wheel.stem
    zipfile.ZipFile(wheel).extractall(dest)
    return dest


def test_rebase_settles_only_conflicts_where_upstream_just_reindented() -> None:
    from importpatch.tools.rebase import reindented

    base = ["    a()\n", "    b()\n", "    c()\n"]
    ours = ["    c()\n"]  # a() and b() deleted
    wrapped = ["    with x:\n", "        a()\n", "        b()\n", "        c()\n"]
    assert reindented(base, ours, wrapped) == ["    with x:\n", "        c()\n"]
    # upstream changed b() itself: a real conflict
    changed = ["    with x:\n", "        a()\n", "        b(1)\n", "        c()\n"]
    assert reindented(base, ours, changed) is None
    # upstream inserted a line between the two the patch deletes: a real conflict
    split = ["        a()\n", "    log()\n", "        b()\n", "        c()\n"]
    assert reindented(base, ours, split) is None
    # no re-indentation at all: an ordinary conflict, left to the markers
    assert reindented(base, ours, ["    z()\n", *base]) is None
