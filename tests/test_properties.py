"""Property tests (Hypothesis) of the two text/tree rewriters every patched import goes through.

- The diff parser and applier against diffs written by *other* tools (``difflib.unified_diff``
  and real ``git diff``) for random source texts and random edits; tests/test_diffs.py covers
  ``make_diff`` round trips, shifts and garbage.
- The definition-site rewriter (``landing.rewrite``): random modules of top-level defs,
  assignments, re-bindings, ``if``/``else`` blocks and classes with methods, static methods,
  properties and attributes; random targets replaced. The rewritten module must behave like an
  oracle module whose target definitions were replaced *in the source text*: targets replaced,
  everything else equal, and every line number kept.
"""

from __future__ import annotations

import dataclasses
import difflib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from importpatch.discover.declare import Patch, collecting
from importpatch.install import activation
from importpatch.rewrite import transforms
from importpatch.rewrite.diffs import apply, parse

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- diffs

# Lines that look like diff syntax once prefixed ("-- a" removed is "--- a"), separators that
# str.splitlines would split on, tabs, non-ASCII, trailing spaces.
TRICKY = ["-- a/x.py", "++ b/x.py", "@@ -1 +1 @@", "\\ No newline", " ", "", "\t", "é ☃",
          "x\x0cy", "a\u2028b", "a\x1cb", "trailing  ", "def f():", "    return 1"]
LINE = st.one_of(
    st.sampled_from(TRICKY),
    st.text(st.characters(blacklist_characters="\r\n\x00", blacklist_categories=["Cs"]),
            max_size=12),
)


@st.composite
def edited(draw: Any) -> tuple[list[str], list[str]]:
    """A random source (list of lines) and the same source after random edits."""
    old = draw(st.lists(LINE, min_size=1, max_size=30))
    new = list(old)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(new)))
        kind = draw(st.sampled_from(["insert", "delete", "replace"]))
        if kind == "insert":
            new[at:at] = draw(st.lists(LINE, min_size=1, max_size=3))
        elif new:
            end = min(len(new), at + draw(st.integers(1, 3)))
            new[at:end] = draw(st.lists(LINE, max_size=3)) if kind == "replace" else []
    return old, new


@PROPERTY
@given(edited(), st.integers(0, 5), st.sampled_from(["\n", "\r\n"]), st.integers(0, 40))
def test_property_difflib_diffs_of_random_edits_apply_exactly(
    edit: tuple[list[str], list[str]], context: int, eol: str, shift: int
) -> None:
    old_lines, new_lines = edit
    assume(old_lines != new_lines)
    old = "".join(line + eol for line in old_lines)
    new = "".join(line + eol for line in new_lines)
    diff = "".join(difflib.unified_diff(
        [ln + eol for ln in old_lines],
        [ln + eol for ln in new_lines], "a/pkg/m.py", "b/pkg/m.py", n=context,
    ))
    (fp,) = parse(diff).files
    assert fp.module == "pkg.m"
    if context == 0:  # a -U0 diff is refused unless accepted (Unidiff-Zero: yes)
        fp = dataclasses.replace(fp, unidiff_zero=True)
    assert apply(old, fp) == new
    # Unrelated lines added above move every hunk; within the offset bound it still applies, as
    # long as each hunk has lines to find it by, they occur once (else "nearest" may differ) and
    # it is not bound to the start or end of the file (old side from line 1, no trailing context).
    searched = all(
        h.old_len and (context == 0 or (h.old_start > 1 and h.trailing)) for h in fp.hunks
    )
    if searched and len(set(old_lines)) == len(old_lines):
        prefix = "".join(f"# unrelated {i}{eol}" for i in range(shift))
        assert apply(prefix + old, fp) == prefix + new


GIT = shutil.which("git")


@pytest.fixture(scope="module")
def git_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if GIT is None:
        pytest.skip("git is not installed")
    repo = tmp_path_factory.mktemp("gitdiff")
    for args in (["init", "-q"], ["config", "core.autocrlf", "false"]):
        subprocess.run([GIT, *args], cwd=repo, check=True, capture_output=True)
    (repo / "pkg").mkdir()
    return repo


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(edited(), st.integers(0, 4), st.sampled_from(["\n", "\r\n"]), st.booleans(), st.booleans())
def test_property_git_diffs_of_random_edits_apply_exactly(
    git_repo: Path, edit: tuple[list[str], list[str]], context: int, eol: str,
    old_nl: bool, new_nl: bool,
) -> None:
    old_lines, new_lines = edit
    old = eol.join(old_lines) + (eol if old_nl else "")
    new = eol.join(new_lines) + (eol if new_nl else "")
    assume(old != new)
    path = git_repo / "pkg" / "m.py"
    path.write_bytes(old.encode())
    subprocess.run([GIT, "add", "pkg/m.py"], cwd=git_repo, check=True, capture_output=True)
    path.write_bytes(new.encode())
    diff = subprocess.run(
        [GIT, "-c", "core.quotepath=false", "diff", f"-U{context}", "--no-color", "--text",
         "--", "pkg/m.py"],
        cwd=git_repo, check=True, capture_output=True,
    ).stdout.decode()
    (fp,) = parse(diff).files
    if context == 0:  # a -U0 diff is refused unless accepted (Unidiff-Zero: yes)
        fp = dataclasses.replace(fp, unidiff_zero=True)
    if "\n" not in old:  # documented: a source without line endings gives new lines LF
        new = new.replace("\r\n", "\n")
    assert apply(old, fp) == new


# --------------------------------------------------------------------------- landing.rewrite

MOD = "fuzzmod"
PRELUDE = "TRACE = []\nREG = []\n\n\ndef trace(fn):\n    TRACE.append(fn(7))\n    return fn\n\n\n"


class Gen:
    """Builds a random module twice: as written (``original``) and with the targets' definitions
    replaced in the text (``oracle``), plus the replacement objects for the patch."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw
        self.original: list[str] = [PRELUDE]
        self.oracle: list[str] = [PRELUDE]
        self.funcs: list[str] = []
        self.vars: list[str] = []
        self.classes: list[tuple[str, list[str]]] = []
        self.targets: dict[str, Any] = {}  # qualname -> replacement
        self.kinds: dict[str, str] = {}  # qualname -> def / static / property / value
        self.carried: set[str] = set()  # targets re-bound by `+=` after the replacement landed
        self.n = 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def emit(self, original: str, oracle: str | None = None, indent: str = "") -> None:
        def ind(text: str) -> str:
            return "".join(indent + ln + "\n" if ln else "\n" for ln in text.split("\n"))

        self.original.append(ind(original))
        self.oracle.append(ind(original if oracle is None else oracle))

    def target(self, qual: str, kind: str, replacement: Any) -> bool:
        if qual in self.targets or not self.draw(st.booleans(), label=f"target {qual}"):
            return False
        self.targets[qual], self.kinds[qual] = replacement, kind
        return True

    def replacement_def(self, qual: str, params: str) -> tuple[Any, str]:
        name = qual.rpartition(".")[2]
        arg = ", x" if params.endswith("x") else ""  # never self: instances differ between runs
        text = f"def {name}({params}):\n    return ('R', {qual!r}{arg})"
        namespace: dict[str, Any] = {}
        exec(text, namespace)
        return namespace[name], text

    def func(self, indent: str = "") -> None:
        name = self.name("f")
        deco = "@trace\n" if self.draw(st.booleans(), label="decorated") else ""
        k = self.draw(st.integers(0, 9), label="k")
        original = f"{deco}def {name}(x):\n    return x + {k}"
        repl, repl_text = self.replacement_def(name, "x")
        replaced = self.target(name, "def", repl)
        self.emit(original, deco + repl_text if replaced else None, indent)
        self.funcs.append(name)

    def assign(self, indent: str = "") -> None:
        if self.vars and self.draw(st.booleans(), label="rebind"):
            name = self.draw(st.sampled_from(self.vars), label="var")
            line = f"{name} += {self.draw(st.integers(1, 9), label='inc')}"
        else:
            name = self.name("v")
            src = self.draw(st.sampled_from(["const", *(["var"] if self.vars else [])]))
            value = self.draw(st.integers(0, 99)) if src == "const" else self.vars[-1] + " * 2"
            line = f"{name} = {value}"
            self.vars.append(name)
            self.target(name, "value", 1000 + self.n)
        # `+=` is a derived re-binding: it carries the replaced value, it is not replaced again
        replaced = name in self.targets and "+=" not in line
        if name in self.targets and "+=" in line:
            self.carried.add(name)
        self.emit(line, f"{line}\n{name} = {self.targets[name]}" if replaced else None, indent)

    def klass(self) -> None:
        cname = self.name("C")
        members: list[str] = []
        self.emit(f"class {cname}:")
        self.emit('"""A class."""', indent="    ")
        for _ in range(self.draw(st.integers(1, 4), label="members")):
            kind = self.draw(st.sampled_from(["method", "static", "property", "attr"]))
            mname = self.name(kind[0])
            qual = f"{cname}.{mname}"
            k = self.draw(st.integers(0, 9))
            if kind == "attr":
                line = f"{mname} = {k}"
                replaced = self.target(qual, "value", 2000 + self.n)
                oracle = f"{line}\n{mname} = {self.targets[qual]}" if replaced else None
                self.emit(line, oracle, "    ")
            else:
                deco, params, body = {
                    "method": ("", "self, x", f"x * {k}"),
                    "static": ("@staticmethod\n", "x", f"x - {k}"),
                    "property": ("@property\n", "self", f"{k}"),
                }[kind]
                repl, repl_text = self.replacement_def(qual, params)
                replaced = self.target(qual, kind, repl)
                original = f"{deco}def {mname}({params}):\n    return {body}"
                self.emit(original, deco + repl_text if replaced else None, "    ")
            members.append(mname)
        self.classes.append((cname, members))
        self.emit("")

    def block(self) -> None:
        """One name bound differently in the two branches of an ``if``."""
        cond = self.draw(st.booleans(), label="condition")
        is_func = self.draw(st.booleans(), label="function in block")
        name = self.name("f" if is_func else "v")
        if is_func:
            repl, repl_text = self.replacement_def(name, "x")
            replaced = self.target(name, "def", repl)
        else:
            replaced = self.target(name, "value", 1000 + self.n)
        self.emit(f"if {cond}:")
        for k in (1, 2):
            if is_func:
                line = f"def {name}(x):\n    return x + {k}"
                oracle = repl_text if replaced else None
            else:
                line = f"{name} = {k}"
                oracle = f"{line}\n{name} = {self.targets[name]}" if replaced else None
            self.emit(line, oracle, "    ")
            if k == 1:
                self.emit("else:")
        (self.funcs if is_func else self.vars).append(name)

    def statement(self) -> None:
        kind = self.draw(st.sampled_from(["func", "assign", "class", "block", "use"]))
        if kind == "use" and self.funcs:
            f = self.draw(st.sampled_from(self.funcs))
            self.emit(f"REG.append({f})\nREG.append({f}(3))")
        elif kind == "class":
            self.klass()
        elif kind == "block":
            self.block()
        elif kind == "func":
            self.func()
        else:
            self.assign()


def run_plain(text: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": MOD}
    exec(compile(text, "<fuzz>", "exec", dont_inherit=True), namespace)
    return namespace


def run_patched(text: str, targets: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    with collecting():  # keep the test's Patch out of this process's registry
        patch = Patch("fuzz")
    for qual, replacement in targets.items():
        patch.replace(f"{MOD}:{qual}", replacement)
    plan = activation.ModulePlan(MOD, list(patch.ops), "<fuzz>")
    quals = sorted({activation.site_of(op)[0] for op in patch.ops} - {""})
    code, facts = transforms.compile_module(
        MOD, text, quals, activation.fact_quals(patch.ops), "<fuzz>"
    )
    plan.unseen = {q for q, fact in facts.items() if not fact.seen}
    plan.prepare(facts)
    activation.register(plan)
    namespace: dict[str, Any] = {"__name__": MOD}
    exec(code, namespace)  # the code calls activation.begin and activation.done itself
    assert plan.finished
    return namespace, plan.unseen


def behaviour(value: Any) -> Any:
    """What a value does, comparable across two executions of (nearly) the same module."""
    if isinstance(value, list):
        return [behaviour(v) for v in value]
    if isinstance(value, type):
        inst = value()
        out = {}
        for name, member in vars(value).items():
            if name.startswith("__"):
                continue
            if isinstance(member, staticmethod):
                out[name] = ("static", member.__func__(5))
            elif isinstance(member, property):
                out[name] = ("property", getattr(inst, name))
            elif callable(member):
                out[name] = ("method", getattr(inst, name)(5))
            else:
                out[name] = member
        return ("class", value.__name__, out)
    if callable(value):
        return ("function", value.__name__, value(0), value(4))
    return value


def first_lines(namespace: dict[str, Any]) -> dict[str, int]:
    lines = {}
    for name, value in namespace.items():
        for qual, obj in [(name, value), *[
            (f"{name}.{m}", getattr(v, "__func__", getattr(v, "fget", v)))
            for m, v in (vars(value).items() if isinstance(value, type) else ())
        ]]:
            code = getattr(obj, "__code__", None)
            if code is not None and code.co_filename == "<fuzz>":
                lines[qual] = code.co_firstlineno
    return lines


@PROPERTY
@given(st.data())
def test_property_rewritten_random_module_behaves_like_source_level_replacement(
    data: st.DataObject,
) -> None:
    gen = Gen(data.draw)
    for _ in range(data.draw(st.integers(1, 12), label="statements")):
        gen.statement()
    original, oracle = "".join(gen.original), "".join(gen.oracle)
    patched, unseen = run_patched(original, gen.targets)
    expected = run_plain(oracle)
    assert unseen == set()
    patched.pop("__builtins__")
    expected.pop("__builtins__")
    assert patched.keys() == expected.keys()
    for name in expected:
        if name == "trace":  # the decorator of the prelude: not callable with a number
            continue
        assert behaviour(patched[name]) == behaviour(expected[name]), (name, original, oracle)
    # Targets hold the replacement objects themselves (decorators applied on top of them).
    for qual, replacement in gen.targets.items():
        if qual in gen.carried:
            continue
        owner, _, attr = qual.rpartition(".")
        raw = vars(patched[owner])[attr] if owner else patched[attr]
        inner = {"static": "__func__", "property": "fget"}.get(gen.kinds[qual])
        assert (getattr(raw, inner) if inner else raw) is replacement, qual
    # Everything else keeps its line numbers.
    plain_lines = first_lines(run_plain(original))
    patched_lines = first_lines(patched)
    for qual, line in plain_lines.items():
        if qual not in gen.targets:
            assert patched_lines.get(qual) == line, qual
