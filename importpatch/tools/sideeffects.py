"""What a declaration does besides declaring: ``importpatch check`` warns about it.

A patch file (or a patch package's module) runs during discovery — in the first Python process
after a change, whatever it is (pip too) —, in ``importpatch list`` and ``check``, and at the first
import of a target in every process. Its module-level code must only declare patches: import
what a replacement needs inside the replacement. While ``check`` runs declarations it records,
per declaration:

- modules it imported (directly, or through helpers), other than the standard library,
  importpatch and its own dependencies: ``import torch`` at the top of a patch file costs seconds
  in every process that runs it (``check`` also reads a patch file's module-level imports from its
  text, since a module imported by an earlier declaration is not imported again);
- what Python's audit hooks report (PEP 578): files opened for writing, removed or renamed,
  folders made, network connections and name look-ups, programs started.

Only the ``check`` process installs the audit hook (it cannot be removed, and costs a call per
audited event); nothing of this runs elsewhere. A declaration that imports a module a patch
targets is an error, not a warning (importpatch/discover/catalog.py).
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

# importpatch and its dependencies (pyproject.toml): importing them is not the declaration's doing.
OWN = frozenset({"importpatch", "wrapt", "packaging", "merge3", "__future__"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
LISTED = 5  # actions listed per kind of side effect, then "and N more"


class Watcher:
    """Records what each declaration does while ``watching()`` is active."""

    def __init__(self) -> None:
        self.stack: list[tuple[str, set[str]]] = []
        self.imports: dict[str, list[str]] = {}
        self.actions: dict[str, list[str]] = {}

    def begin(self, source: str) -> None:
        self.stack.append((source, set(sys.modules)))

    def end(self, source: str) -> None:
        _, before = self.stack.pop()
        new = [m for m in sys.modules if m not in before]
        found = self.imports.setdefault(source, [])
        for top in dict.fromkeys(m.partition(".")[0] for m in new):
            if not _allowed(top) and top not in found:
                found.append(top)

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.stack:
            return
        what = _describe(event, args)
        if what:
            actions = self.actions.setdefault(self.stack[-1][0], [])
            if what not in actions:
                actions.append(what)

    def warnings(self, source: str, file: str | None) -> list[str]:
        """The warnings for one declaration (``file``: its patch file, read for its imports)."""
        out = []
        imported = list(self.imports.get(source, []))
        for top in static_imports(file) if file else []:
            if top not in imported:
                imported.append(top)
        if source.startswith("entry point "):  # its own package is no import of the declaration
            own = source.partition(" = ")[2].partition(":")[0].strip().partition(".")[0]
            imported = [top for top in imported if top != own]
        if imported:
            out.append(
                f"its module-level code imports {', '.join(imported)}: a declaration runs in "
                "discovery (the first Python process after a change, pip included), `list`, "
                "`check` and at the first import of a target; import what a replacement needs "
                "inside the replacement")
        actions = self.actions.get(source, [])
        if actions:
            shown = "; ".join(actions[:LISTED])
            more = f"; and {len(actions) - LISTED} more" if len(actions) > LISTED else ""
            out.append(f"its module-level code does more than declare: {shown}{more} (it runs "
                       "wherever the declaration runs: keep module level to declarations)")
        return out


def _allowed(top: str) -> bool:
    return top in OWN or top in sys.stdlib_module_names or top.startswith("_")


def _path(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _describe(event: str, args: tuple[Any, ...]) -> str:
    """A side effect worth a warning, in words; "" for everything else."""
    if event == "open":
        path, mode, flags = (args + (None, None, None))[:3]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        if not writes or isinstance(path, int):
            return ""
        text = _path(path)
        # Python's own bytecode writes for what the declaration imported, and /dev/null.
        if "__pycache__" in text or text.endswith(".pyc") or text.startswith("/dev/"):
            return ""
        return f"writes {text}"
    if event in ("os.remove", "os.rmdir", "shutil.rmtree"):
        return f"removes {_path(args[0])}"
    if event == "os.rename":
        return f"renames {_path(args[0])}"
    if event == "os.mkdir":
        return f"makes the folder {_path(args[0])}"
    if event == "socket.connect":
        return f"connects to {args[1]!r}"
    if event == "socket.getaddrinfo":
        return f"looks up {args[0]!r}"
    if event == "urllib.Request":
        return f"requests {args[0]}"
    if event == "subprocess.Popen":
        argv = args[1]
        shown = " ".join(map(_path, argv)) if isinstance(argv, (list, tuple)) else _path(argv)
        return f"runs {shown[:80]}"
    if event in ("os.system", "os.posix_spawn", "os.exec", "os.spawn"):
        return f"runs {_path(args[0])[:80]}"
    if event == "os.fork":
        return "forks"
    return ""


def static_imports(file: str) -> list[str]:
    """Top-level packages that a patch file's module-level code imports (absolute imports outside
    function bodies), not allowed ones."""
    try:
        with open(file, "rb") as f:
            tree = ast.parse(f.read(), file)
    except (OSError, SyntaxError, ValueError):
        return []
    found: list[str] = []

    def visit(nodes: Iterable[ast.AST]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue  # runs when called, not when the declaration runs
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.orelse)
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            for name in names:
                top = name.partition(".")[0]
                if not _allowed(top) and top not in found:
                    found.append(top)
            visit(ast.iter_child_nodes(node))

    visit(tree.body)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``: a block that never runs."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


_watcher: Watcher | None = None
_hooked = False


def _hook(event: str, args: tuple[Any, ...]) -> None:
    watcher = _watcher
    if watcher is not None:
        watcher.audit(event, args)


@contextmanager
def watching() -> Iterator[Watcher]:
    """Record what declarations run by the catalog do, while the block runs."""
    global _watcher, _hooked
    from importpatch.discover import catalog

    if not _hooked:
        sys.addaudithook(_hook)
        _hooked = True
    watcher = Watcher()
    _watcher = catalog.watcher = watcher
    try:
        yield watcher
    finally:
        _watcher = catalog.watcher = None


# -- side effects in code that vLLM runs compiled ------------------------------------------------
#
# vLLM compiles its model's forward with torch.compile (``@support_torch_compile``): every module
# of vllm/model_executor/models and /layers that the forward reaches is traced by Dynamo, and so is
# a patch's replacement or wrap of a function there. Tensor code traces as it runs eagerly; a call
# to the outside world does not: Dynamo stops on it (``Unsupported: Failed to trace builtin
# operator open``: vLLM does not start compiled) or runs it once, at trace time, and never again
# (a compiled artifact loaded from the cache never runs it). Code under ``if not
# torch.compiler.is_compiling():`` is left out of the trace and is not reported.
COMPILED_MODULES = ("vllm.model_executor.models.", "vllm.model_executor.layers.")
_CALLS = {"open": "opens a file", "print": "prints", "input": "reads standard input",
          "breakpoint": "stops in the debugger"}
_MODULE_CALLS = {"time": "reads the clock", "os": "reads the environment or the file system",
                 "logging": "logs", "subprocess": "starts a program", "socket": "uses the network",
                 "random": "draws a Python random number", "json": "reads or writes JSON"}
_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}


def runs_compiled(modules: Iterable[str]) -> bool:
    """Whether a target in one of ``modules`` (candidates of one op) runs inside vLLM's compiled
    model forward."""
    return any(m.startswith(COMPILED_MODULES) for m in modules)


def compiled_side_effects(fn: Any) -> list[tuple[int, str]]:
    """(line, what) for each call in ``fn``'s body that does something other than compute: file,
    print, clock, environment, logging. Code under a test of ``is_compiling()`` is skipped."""
    import inspect
    import textwrap

    try:
        lines, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return []
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _tests_compiling(node.test):
            return  # both branches: one is left out of the trace, the other is the guard's own
        if isinstance(node, ast.Call):
            what = _call_effect(node.func)
            if what:
                found.append((first + node.lineno - 1, what))
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in tree.body:
        body = stmt.body if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) else [stmt]
        for node in body:
            visit(node)
    return found


def _call_effect(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return _CALLS.get(func.id, "")
    if isinstance(func, ast.Attribute):
        root = func.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name):
            if root.id in _MODULE_CALLS:
                return f"{_MODULE_CALLS[root.id]} ({ast.unparse(func)})"
            if func.attr in _LOG_METHODS and "log" in root.id.lower():
                return f"logs ({ast.unparse(func)})"
            if root.id == "sys" and func.attr in ("write", "flush"):
                return f"writes to a stream ({ast.unparse(func)})"
    return ""


def _tests_compiling(test: ast.expr) -> bool:
    return any(isinstance(n, (ast.Attribute, ast.Name))
               and (getattr(n, "attr", None) or getattr(n, "id", None)) in (
                   "is_compiling", "is_dynamo_compiling", "is_torchdynamo_compiling")
               for n in ast.walk(test))


def compiled_warnings(ops: Iterable[Any], trees: dict[int, Any] | None = None) -> list[str]:
    """``check``'s warnings for the replacements and wraps of ``ops`` that run compiled.
    ``trees``: the parsed source of each op's target module, by ``id(op)``: a target that the
    module registers as a torch custom op (vLLM's ``direct_register_custom_op(op_func=...)``) is
    a body Dynamo calls as one opaque op and never traces, so it gets no warning."""
    from importpatch.install.unreached import custom_op_body

    out = []
    for op in ops:
        if op.kind not in ("replace", "wrap", "add", "subclass") or not runs_compiled(op.modules):
            continue
        tree = (trees or {}).get(id(op))
        if tree is not None and op.qualname and custom_op_body(tree, op.qualname):
            continue
        fn = op.obj
        if isinstance(fn, (staticmethod, classmethod)):
            fn = fn.__func__
        if not callable(fn) or isinstance(fn, type):
            continue
        effects = compiled_side_effects(fn)
        if not effects:
            continue
        file = getattr(getattr(fn, "__code__", None), "co_filename", "?")
        shown = "; ".join(f"line {line}: {what}" for line, what in effects[:LISTED])
        more = f"; and {len(effects) - LISTED} more" if len(effects) > LISTED else ""
        out.append(
            f"{op.target} runs inside vLLM's compiled model (torch.compile traces "
            f"{op.modules[0]}), and the {op.kind} in {os.path.basename(file)} does more than "
            f"compute: {shown}{more}. Dynamo cannot trace such a call (vLLM then fails to start "
            "compiled) or runs it once, when it traces, never on later calls or from a cached "
            "artifact: put it under `if not torch.compiler.is_compiling():`, or move it out of "
            "the model's forward")
    return out
