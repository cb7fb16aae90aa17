"""The package's layout keeps two rules that Python itself never reports (issue 22):

- no import cycle between importpatch modules, counting module-level and function-local imports
  (155 of them are function-local on purpose, for start-up cost), ignoring only the implicit
  import of a package's ``__init__`` (an explicit ``import importpatch`` or
  ``from importpatch import x`` counts as an edge to it, or to the submodule ``x`` when it is one);
  imports under ``if TYPE_CHECKING:`` never run and do not count;
- the code that runs inside every patched process never imports a command-line tool (``TOOLS``;
  ``__main__``, the entry of ``python -m importpatch``, is the command line too);
- the stage folders only look back (issue 30): a module in a stage folder imports only its own
  folder, the folders before it in ``STAGES`` and the shared basics; the shared basics (the
  top-level modules but the entry points, ``ENTRIES``) import no stage folder. Here imports under
  ``if TYPE_CHECKING:`` count too: an annotation that names a later stage is an arrow up the
  drawing all the same (docs/how-it-works.md, "Who may import whom").

An AST walk over ``importpatch/`` (its subfolders included), so no module is imported here; on
the code before issue 22 it printed four tangles: bindings <-> fields, objects <-> wrappers,
authoring -> check -> capture -> authoring, and one of twelve modules through
importpatch/__init__ (bytecache read ``__version__`` there, and ``enable()`` imports ``_boot``).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "importpatch"

# The command-line tools, by final module name (flat today, under importpatch/tools/ later):
# imported only by `importpatch ...`, pytest and scripts, never by the pipeline stages.
TOOLS = [
    "cli", "check", "packages", "sideeffects", "authoring", "rebase", "capture", "releases",
    "fromgit", "pytest_plugin", "pinning",
]


# The stage folders in the order they may use each other: each imports only those before it.
# "start" is the top-level start-up (START), which the integrations and tools call (enable()).
STAGES = ["discover", "rewrite", "install", "load", "start", "integrations", "tools"]
START = {"_pth", "_pth_on", "_boot", "_declared"}
# Top-level modules that expose the stages under public names (they may import any stage);
# every other top-level module is a shared basic, below all the stages.
ENTRIES = {"importpatch", "__main__", "compat", "pytest_plugin"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The module of the package that `target` names (or that holds it), or None (outside)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _edges(name: str, modules: dict[str, Path], *, annotations: bool = False) -> set[str]:
    """The modules of the package that ``name`` imports; ``annotations``: those imported under
    ``if TYPE_CHECKING:`` too."""
    tree = ast.parse(modules[name].read_text(encoding="utf-8"))
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree) if annotations else _walk(tree):
        if isinstance(node, ast.Import):
            bases = [alias.name for alias in node.names]
            for base in bases:
                hit = _resolve(base, modules)
                if hit is not None:
                    found.add(hit)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                keep = len(parts) - (node.level - 1)
                base = ".".join(parts[:keep])
                if node.module:
                    base = f"{base}.{node.module}"
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                hit = sub if sub in modules else _resolve(base, modules)
                if hit is not None:
                    found.add(hit)
    found.discard(name)
    return found


def _walk(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (imports that never run)."""
    nodes: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and _names_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return nodes


def _names_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    assert "importpatch" in modules and len(modules) > 20, sorted(modules)
    return {name: _edges(name, modules) for name in modules}


@functools.cache
def _graph_with_annotations() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _edges(name, modules, annotations=True) for name in modules}


def _folder(name: str) -> str:
    """A module's stage folder (``"start"`` for the start-up), ``"entry"`` for a public entry
    point, ``"basics"`` for the other top-level modules."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1] in STAGES:
        return parts[1]
    if parts[-1] in START:
        return "start"
    return "entry" if parts[-1] in ENTRIES else "basics"


def _backward(graph: dict[str, set[str]]) -> list[str]:
    """Every import that does not look back: a stage module importing a later stage, or a
    shared basic importing any stage."""
    rank = {stage: i for i, stage in enumerate(STAGES)}
    bad = []
    for name, targets in sorted(graph.items()):
        here = _folder(name)
        for target in sorted(targets):
            there = _folder(target)
            if there not in rank or here == "entry":
                continue
            if here == "basics" or rank[there] > rank[here]:
                bad.append(f"{name} ({here}) -> {target} ({there})")
    return bad


def _folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for name, targets in graph.items():
        here = _folder(name)
        folders.setdefault(here, set())
        folders[here] |= {_folder(t) for t in targets} - {here}
    for targets in list(folders.values()):
        for t in targets:
            folders.setdefault(t, set())
    return folders


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """One cycle through each strongly connected component of more than one module, and the
    modules of that component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [
        " -> ".join(_one_cycle(graph, set(c), c[0])) + f"  (tangle: {', '.join(c)})"
        for c in components
    ]


def _one_cycle(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """A shortest path start -> ... -> start inside one component (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def _named(graph: dict[str, set[str]], last: str) -> str:
    (name,) = [n for n in graph if n.rpartition(".")[2] == last]
    return name


def _is_tool(name: str) -> bool:
    # `python -m importpatch` runs the command line: __main__ is its entry, not a stage.
    last = name.rpartition(".")[2]
    return ".tools." in f"{name}." or last in TOOLS or last == "__main__"


def test_graph_sees_function_local_and_relative_imports() -> None:
    """The walk itself: a cycle it cannot see it cannot report."""
    graph = _graph()
    # enable() imports _boot inside the function, relative to the package it is in.
    assert "importpatch._boot" in graph["importpatch"]
    # _pth_on imports nothing at module level: its edge to _boot is function-local.
    assert any(target.endswith("._boot") for target in graph[_named(graph, "_pth_on")])
    # _pth's only import is under its `if __name__ != ...` (the code the .pth line executes).
    assert any(target.endswith("._pth_on") for target in graph[_named(graph, "_pth")])


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (one per tangle):\n" + "\n".join(cycles)


def test_no_import_cycles_counting_annotations() -> None:
    """Imports under ``if TYPE_CHECKING:`` never run, but they are arrows in the structure
    drawing all the same (issue 36 item 6: load/finder <-> load/lookup was the last circle;
    the look-up now names the finder by shape, a Protocol)."""
    cycles = _cycles(_graph_with_annotations())
    assert not cycles, "import cycles counting annotations:\n" + "\n".join(cycles)


def test_the_stage_rule_sees_an_import_up_the_stages() -> None:
    """The rule itself, on made-up graphs: an arrow up is reported, one down is not, an entry
    point may import anything, and a shared basic imports no stage."""
    assert _backward({"importpatch.discover.a": {"importpatch.load.b"}}) == [
        "importpatch.discover.a (discover) -> importpatch.load.b (load)"]
    assert _backward({"importpatch.load.b": {"importpatch.discover.a"}}) == []
    assert _backward({"importpatch.compat": {"importpatch.tools.cli"}}) == []
    assert _backward({"importpatch._boot": {"importpatch.tools.cli"}}) == [
        "importpatch._boot (start) -> importpatch.tools.cli (tools)"]
    assert _backward({"importpatch.events": {"importpatch.rewrite.facts"}}) == [
        "importpatch.events (basics) -> importpatch.rewrite.facts (rewrite)"]
    # An annotation-only import is an edge of the annotated graph, not of the run-time one:
    # install/activation names discover/declare's Op only under TYPE_CHECKING.
    late = _named(_graph(), "late")
    assert _named(_graph(), "declare") in _graph_with_annotations()[late]
    assert set(STAGES) <= {_folder(n) for n in _graph()}, "a stage folder is gone or renamed"


def test_stage_folders_only_look_back() -> None:
    bad = _backward(_graph_with_annotations())
    assert not bad, (
        "imports that do not look back (a stage imports only stages before it in STAGES and the "
        "shared basics; move what both need below them):\n" + "\n".join(bad))


def test_no_cycle_between_folders() -> None:
    folders = _folder_graph(_graph_with_annotations())
    assert {"basics", "entry", *STAGES} <= set(folders), sorted(folders)
    cycles = _cycles(folders)
    assert not cycles, "folder-level import cycles:\n" + "\n".join(cycles)


def test_runtime_never_imports_the_tools() -> None:
    graph = _graph()
    bad = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items() if not _is_tool(name)
        for target in targets if _is_tool(target)
    )
    assert not bad, "modules that run in every patched process import a tool:\n" + "\n".join(bad)


def test_the_cache_key_producers_are_files_of_the_package() -> None:
    """``bytecache.PRODUCERS`` names the modules whose code decides the compiled code (the name
    baked into it included): a name that no longer is a file (a module moved) would hash as
    empty and let entries made by other code be reused."""
    tree = ast.parse(_modules()[_named(_graph(), "bytecache")].read_text(encoding="utf-8"))
    (names,) = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", "") for t in node.targets] == ["PRODUCERS"]]
    missing = [n for n in names if not (PACKAGE / f"{n}.py").is_file()]
    assert not missing, f"PRODUCERS names no file under importpatch/: {missing}"
    assert {"activation", "landing", "transforms"} <= {n.rpartition("/")[2] for n in names}
