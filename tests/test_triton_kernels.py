"""A patch to a module of ``@triton.jit`` kernels is what Triton compiles and runs.

Real Triton, real child interpreters of this test's own environment (``sys.executable``: in
``tox -e vllm`` the built wheel, torch, triton and numpy are installed there), patches activated by
the real hook (IMPORTPATCH_ENABLE + IMPORTPATCH_PATH). The kernels are the tests' own (a tmp
package ``tk``); vLLM's real kernel is in test_triton_vllm.py.

Two Triton modes are used, each for what it can show:
- ``TRITON_INTERPRET=1``: kernels are ``InterpretedFunction`` and run on CPU torch tensors (the
  interpreter needs numpy) -- the numbers a kernel computes;
- no interpreter: kernels are ``JITFunction``; decoration, ``.src`` and ``.cache_key`` need no
  GPU (a launch would) -- what Triton would compile, and its cache key.
"""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, missing

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(
        missing("triton"),
        reason="triton is not importable here (these tests run in `tox -e vllm`)",
    ),
]

KERN_PATH = "tk/kern.py"
KERN = '''\
import triton
import triton.language as tl

NOTE = "scale_kernel doubles, add_one_kernel adds one"


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 2.0, mask=mask)


@triton.jit
def add_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + 1.0, mask=mask)
'''
# Kernels behind Triton's wrappers: autotune(heuristics(jit)), and a constexpr function.
TUNED_PATH = "tk/tuned.py"
TUNED = '''\
import triton
import triton.language as tl

NOTE = "scale_kernel doubles, add_one_kernel adds one"


@triton.autotune(configs=[triton.Config({"BLOCK": 16})], key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % 16 == 0})
@triton.jit
def tuned_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 2.0, mask=mask)


@triton.constexpr_function
def double(v):
    return v * 2
'''
DOUBLE = "    tl.store(out_ptr + offs, x * 2.0, mask=mask)\n"
TRIPLE = "    tl.store(out_ptr + offs, x * 3.0, mask=mask)\n"
NOTE = 'NOTE = "scale_kernel doubles, add_one_kernel adds one"\n'
# Patched lines that make Triton read something other than the patched text for the module's code
# file (the file the code was compiled under): the original text, or nothing at all. Each replaces
# the NOTE line, so no line moves.
POISON_ORIGINAL = (
    "import linecache, sys; _f = sys._getframe().f_code.co_filename; "
    "linecache.cache[_f] = (1, None, open(__file__).readlines(), _f)\n"
)
POISON_EMPTY = (
    "import linecache, sys; _f = sys._getframe().f_code.co_filename; "
    "linecache.cache[_f] = (0, None, [], _f)\n"
)

TRANSFORM = '''\
import ast

from importpatch import Patch

patch = Patch("triple-ast")


class _Triple(ast.NodeTransformer):
    def visit_Constant(self, node):
        return ast.copy_location(ast.Constant(3.0), node) if node.value == 2.0 else node


@patch.transform("tk.kern")
def triple(tree):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "scale_kernel":
            _Triple().visit(node)
    return tree
'''

# Run in a child: imports tk.kern (through the hook when the environment asks for it) and prints
# one JSON line describing its kernels, the numbers they compute (under the interpreter), and the
# same from a process started with multiprocessing's "spawn".
PROBE = '''\
import inspect, json, linecache, multiprocessing, os, sys


def describe(kernel):
    from triton.runtime.jit import JITFunction

    fn = kernel.fn
    # under the interpreter: the JITFunction its rewriter builds from the same source
    jit = kernel if isinstance(kernel, JITFunction) else JITFunction(fn)
    out = {
        "type": type(kernel).__name__,
        "co_filename": fn.__code__.co_filename,
        "firstlineno": fn.__code__.co_firstlineno,
        "src": jit.src,
        "starting_line_number": jit.starting_line_number,
        "getsource": inspect.getsource(fn),
    }
    if isinstance(kernel, JITFunction):
        out["cache_key"] = kernel.cache_key
    return out


def numbers():
    import torch
    from tk import kern

    result = {}
    for dtype in ("float32", "float16"):
        x = torch.arange(10, dtype=getattr(torch, dtype)) - 4
        scaled, plus_one = torch.empty_like(x), torch.empty_like(x)
        kern.scale_kernel[(1,)](x, scaled, 10, BLOCK=16)
        kern.add_one_kernel[(1,)](x, plus_one, 10, BLOCK=16)
        result[dtype] = {"x": x.tolist(), "scaled": scaled.tolist(), "plus_one": plus_one.tolist()}
    return result


def spawned():
    import importpatch
    from tk import kern

    return {
        "pid": os.getpid(),
        "numbers": numbers(),
        "co_filename": kern.scale_kernel.fn.__code__.co_filename,
        "applied": [e["patch"] for e in importpatch.applied() if e["outcome"] == "applied"],
    }


def main(actions):
    import importpatch

    report = {"pid": os.getpid()}
    try:
        from tk import kern
    except ImportError as exc:
        report.update(import_error=type(exc).__name__, message=str(exc),
                      in_sys_modules="tk.kern" in sys.modules)
        print(json.dumps(report))
        return
    if "clearcache" in actions:
        linecache.clearcache()
        linecache.checkcache()
    report["kernels"] = {
        name: describe(getattr(kern, name)) for name in ("scale_kernel", "add_one_kernel")
    }
    if "dropcache" in actions:  # every linecache entry gone, ours included
        linecache.cache.clear()
    if os.environ.get("TRITON_INTERPRET") == "1":
        report["numbers"] = numbers()
    if "spawn" in actions:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            report["spawned"] = pool.apply(spawned)
    report["applied"] = [e["patch"] for e in importpatch.applied() if e["outcome"] == "applied"]
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
'''


def git_diff(path: str, old: str, new: str, header: str = "") -> str:
    """A unified diff as ``git diff`` writes it for one file, behind an optional header."""
    body = "".join(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"a/{path}", tofile=f"b/{path}",
    ))
    assert body, "no change"
    return f"{header}diff --git a/{path} b/{path}\n{body}"


def edited(*pairs: tuple[str, str]) -> str:
    text = KERN
    for old, new in pairs:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


PATCHES = {
    # scale_kernel triples instead of doubling; no line moves
    "triple.diff": git_diff(KERN_PATH, KERN, edited((DOUBLE, TRIPLE)), "Name: triple\n"),
    # the same, plus one comment line in scale_kernel: every line below moves down by one
    "triple-shifted.diff": git_diff(
        KERN_PATH, KERN,
        edited((DOUBLE, "    # tripled by a patch\n" + TRIPLE)),
        "Name: triple-shifted\n",
    ),
    "triple_ast.py": TRANSFORM,
    "poison-original.diff": git_diff(
        KERN_PATH, KERN, edited((NOTE, POISON_ORIGINAL), (DOUBLE, TRIPLE)),
        "Name: poison-original\n",
    ),
    "tuned-poison.diff": git_diff(
        TUNED_PATH, TUNED, TUNED.replace(NOTE, POISON_ORIGINAL).replace(DOUBLE, TRIPLE),
        "Name: tuned-poison\n",
    ),
    "constexpr-poison.diff": git_diff(
        TUNED_PATH, TUNED,
        TUNED.replace(NOTE, POISON_ORIGINAL).replace("return v * 2", "return v * 3"),
        "Name: constexpr-poison\n",
    ),
    "poison-empty.diff": git_diff(
        KERN_PATH, KERN, edited((NOTE, POISON_EMPTY), (DOUBLE, TRIPLE)),
        "Name: poison-empty\n",
    ),
}


class Lab:
    """The kernel package, the patch folder and the probe, written once per module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.targets = root / "targets"
        self.patches = root / "patches"
        for rel, text in {"tk/__init__.py": "", KERN_PATH: KERN, TUNED_PATH: TUNED}.items():
            (self.targets / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.targets / rel).write_text(text, encoding="utf-8")
        self.patches.mkdir()
        for name, text in PATCHES.items():
            (self.patches / name).write_text(text, encoding="utf-8")
        self.probe = root / "probe.py"
        self.probe.write_text(PROBE, encoding="utf-8")
        self.kern = self.targets / KERN_PATH

    def run(
        self, cache: Path, *actions: str, enable: str | None = None, interpret: bool = False,
        code: str | None = None,
    ) -> dict[str, Any]:
        """Run the probe (or ``python -c code``, which prints one JSON line) in a child."""
        env: dict[str, str | None] = {
            "PYTHONPATH": str(self.targets),
            "IMPORTPATCH_CACHE_DIR": str(cache),
            "TRITON_INTERPRET": "1" if interpret else None,
            "TRITON_CACHE_DIR": str(cache / "triton"),
        }
        if enable is not None:
            env.update(IMPORTPATCH_ENABLE=enable, IMPORTPATCH_PATH=str(self.patches))
        args = [str(self.probe), *actions] if code is None else ["-c", code]
        proc = subprocess.run(
            [sys.executable, *args], env=clean_env(env), cwd=self.root,
            capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        assert lines, f"no report\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-4000:]}"
        report: dict[str, Any] = json.loads(lines[-1])
        report["stderr"] = proc.stderr
        return report


@pytest.fixture(scope="module")
def triton_lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return Lab(tmp_path_factory.mktemp("triton-lab"))


@pytest.fixture(scope="module")
def unpatched_jit(triton_lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The kernels as Triton sees them without any patch (no interpreter)."""
    report = triton_lab.run(tmp_path_factory.mktemp("cache"))
    assert report["kernels"]["scale_kernel"]["type"] == "JITFunction"
    return report


def function_text(text: str, name: str) -> str:
    """The ``def`` of kernel ``name`` in module text ``text``, to the end of its body, as Triton's
    ``.src`` holds it (from ``def`` on, decorators left out)."""
    start = text.index(f"def {name}(")
    end = text.find("\n\n\n", start)
    return text[start:] if end < 0 else text[start:end + 1]


def scaled(report: dict[str, Any], dtype: str) -> list[float]:
    return report["numbers"][dtype]["scaled"]


# -- what runs --------------------------------------------------------------------------------


def test_diff_to_kernel_changes_what_it_computes_here_and_in_spawned_child(
    triton_lab: Lab, tmp_path: Path
) -> None:
    original = triton_lab.run(tmp_path / "c0", interpret=True)
    report = triton_lab.run(tmp_path / "c1", "spawn", enable="triple", interpret=True)

    xs = list(range(-4, 6))
    for dtype in ("float32", "float16"):
        assert scaled(original, dtype) == [2.0 * x for x in xs]  # the unpatched kernel doubles
        assert scaled(report, dtype) == [3.0 * x for x in xs]
        assert report["numbers"][dtype]["plus_one"] == [x + 1.0 for x in xs]
    kernel = report["kernels"]["scale_kernel"]
    assert kernel["type"] == "InterpretedFunction"
    assert report["applied"] == ["triple"]

    child = report["spawned"]
    assert child["pid"] != report["pid"]
    assert child["applied"] == ["triple"]  # the hook was installed at the spawned child's start
    for dtype in ("float32", "float16"):
        assert child["numbers"][dtype]["scaled"] == [3.0 * x for x in xs]
    # the child's kernel was compiled under the same content-addressed file as the parent's
    assert child["co_filename"] == kernel["co_filename"] != str(triton_lab.kern)


def test_patched_kernel_src_is_the_patched_text_and_its_cache_key_differs(
    triton_lab: Lab, tmp_path: Path, unpatched_jit: dict[str, Any]
) -> None:
    report = triton_lab.run(tmp_path / "c", enable="triple")
    patched_text = edited((DOUBLE, TRIPLE))
    before, after = unpatched_jit["kernels"], report["kernels"]

    kernel = after["scale_kernel"]
    assert kernel["type"] == "JITFunction"
    assert kernel["src"] == function_text(patched_text, "scale_kernel")
    assert "x * 3.0" in kernel["src"] and "x * 2.0" not in kernel["src"]
    assert kernel["getsource"] == "@triton.jit\n" + kernel["src"]
    # compiled under a real file that holds the patched text; the module's own file is untouched
    assert kernel["co_filename"] != str(triton_lab.kern)
    assert Path(kernel["co_filename"]).read_text(encoding="utf-8") == patched_text
    assert triton_lab.kern.read_text(encoding="utf-8") == KERN
    assert before["scale_kernel"]["src"] == function_text(KERN, "scale_kernel")
    assert kernel["cache_key"] != before["scale_kernel"]["cache_key"]

    # the kernel the patch did not touch, below a line-count-preserving edit: same source, same
    # line, so the same cache key (its compiled binaries stay valid)
    untouched = after["add_one_kernel"]
    assert untouched["src"] == before["add_one_kernel"]["src"]
    assert untouched["starting_line_number"] == before["add_one_kernel"]["starting_line_number"]
    assert untouched["cache_key"] == before["add_one_kernel"]["cache_key"]


def test_line_shifting_diff_moves_the_kernels_below_and_changes_their_cache_keys(
    triton_lab: Lab, tmp_path: Path, unpatched_jit: dict[str, Any]
) -> None:
    report = triton_lab.run(tmp_path / "c", enable="triple-shifted")
    before, after = unpatched_jit["kernels"], report["kernels"]
    assert "# tripled by a patch" in after["scale_kernel"]["src"]
    untouched = after["add_one_kernel"]
    assert untouched["src"] == before["add_one_kernel"]["src"]
    assert untouched["starting_line_number"] == before["add_one_kernel"]["starting_line_number"] + 1
    # Triton's key includes the starting line: a kernel below an edit that adds lines recompiles
    assert untouched["cache_key"] != before["add_one_kernel"]["cache_key"]


def test_ast_transform_of_kernel_is_what_triton_compiles_and_runs(
    triton_lab: Lab, tmp_path: Path, unpatched_jit: dict[str, Any]
) -> None:
    jit = triton_lab.run(tmp_path / "c0", enable="triple-ast")
    interp = triton_lab.run(tmp_path / "c1", enable="triple-ast", interpret=True)
    before, after = unpatched_jit["kernels"], jit["kernels"]
    src = after["scale_kernel"]["src"]
    assert "x * 3.0" in src and "x * 2.0" not in src
    assert Path(after["scale_kernel"]["co_filename"]).read_text(encoding="utf-8").count(src) == 1
    assert after["scale_kernel"]["cache_key"] != before["scale_kernel"]["cache_key"]
    # statements the transform did not touch keep their text and lines
    assert after["add_one_kernel"]["cache_key"] == before["add_one_kernel"]["cache_key"]
    assert scaled(interp, "float32") == [3.0 * x for x in range(-4, 6)]


# -- what later linecache calls do ------------------------------------------------------------


@pytest.mark.parametrize("where", ["published-file", "no-cache-folder"])
def test_clearing_linecache_after_import_does_not_bring_back_the_original_kernel(
    triton_lab: Lab, tmp_path: Path, where: str
) -> None:
    cache = tmp_path / "c"
    if where == "no-cache-folder":
        # a group-writable cache folder is refused: no published file, the code is compiled
        # under the module's real path and a linecache entry carries the patched text
        cache.mkdir()
        cache.chmod(0o777)
    report = triton_lab.run(cache, "clearcache", "dropcache", enable="triple", interpret=True)
    kernel = report["kernels"]["scale_kernel"]
    if where == "no-cache-folder":
        assert kernel["co_filename"] == str(triton_lab.kern)
    else:
        assert kernel["co_filename"] != str(triton_lab.kern)
    # read after linecache.clearcache() + checkcache(): still the patched text
    assert "x * 3.0" in kernel["getsource"]
    assert "x * 3.0" in kernel["src"]
    # first launched after every linecache entry was dropped: still the patched kernel (the
    # hook had the interpreter read the kernel's source at import)
    assert scaled(report, "float32") == [3.0 * x for x in range(-4, 6)]


# -- failing closed ---------------------------------------------------------------------------


@pytest.mark.parametrize("interpret", [False, True], ids=["jit", "interpreter"])
def test_kernel_that_reads_the_original_text_fails_the_import(
    triton_lab: Lab, tmp_path: Path, interpret: bool
) -> None:
    report = triton_lab.run(tmp_path / "c", enable="poison-original", interpret=interpret)
    assert report["import_error"] == "PatchError"
    message = report["message"]
    assert "poison-original" in message and "'scale_kernel'" in message
    assert "not the patched text" in message
    assert "x * 2.0" in message and "x * 3.0" in message  # what Triton read, what it should have
    assert report["in_sys_modules"] is False  # no module with unpatched kernels remains


IMPORT_TUNED = """
import json
try:
    import tk.tuned as m
    print(json.dumps({"src": m.tuned_kernel.fn.fn.src}))
except ImportError as exc:
    print(json.dumps({"import_error": type(exc).__name__, "message": str(exc)}))
"""


@pytest.mark.parametrize(
    ("patch", "kernel"),
    [
        ("tuned-poison", "'tuned_kernel' (JITFunction)"),
        ("constexpr-poison", "'double' (ConstexprFunction)"),
    ],
)
def test_kernels_behind_autotune_heuristics_and_constexpr_function_are_checked_too(
    triton_lab: Lab, tmp_path: Path, patch: str, kernel: str
) -> None:
    unpatched = triton_lab.run(tmp_path / "c0", code=IMPORT_TUNED)
    assert "x * 2.0" in unpatched["src"]  # Autotuner -> Heuristics -> JITFunction
    report = triton_lab.run(tmp_path / "c1", enable=patch, code=IMPORT_TUNED)
    assert report["import_error"] == "PatchError"
    assert kernel in report["message"] and "not the patched text" in report["message"]


def test_kernel_whose_source_is_unreadable_fails_the_import_under_the_interpreter(
    triton_lab: Lab, tmp_path: Path
) -> None:
    # Left alone, the interpreter would find no source at the first launch and silently run the
    # Python function without its rewrite.
    report = triton_lab.run(tmp_path / "c", enable="poison-empty", interpret=True)
    assert report["import_error"] == "PatchError"
    assert "'scale_kernel'" in report["message"] and "unreadable source" in report["message"]
    assert report["in_sys_modules"] is False


def test_patches_are_valid_git_diffs(triton_lab: Lab) -> None:
    """The .diff files above apply with ``git apply`` too (when git is here): they are the
    format users produce, not one only importpatch reads."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    for name in ("triple.diff", "triple-shifted.diff", "poison-original.diff"):
        work = triton_lab.root / f"apply-{name}"
        (work / "tk").mkdir(parents=True)
        (work / KERN_PATH).write_text(KERN, encoding="utf-8")
        proc = subprocess.run(
            [git, "apply", "--check", str(triton_lab.patches / name)], cwd=work,
            capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode == 0, proc.stderr

