"""Pack the Python sources of a vLLM wheel, to import them where vLLM is not installed.

    python scripts/eval/gpu_vllm_shell.py WHEEL OUT.tar.gz [--entry MODULE ...]

For ``scripts/eval/gpu_check.sh``: a GPU machine with CUDA, torch and Triton but no vLLM and no
network runs the GPU tests against vLLM's real Triton kernels. The archive holds:

- every ``.py`` file of the ``vllm`` package of the wheel (the CUDA build from PyPI), so that any
  import a test reaches, at module level or inside a function, finds vLLM's real code;
- the wheel's ``METADATA`` as ``vllm-<version>.dist-info``: vLLM's platform detection asks
  ``importlib.metadata.version("vllm")``, and importpatch judges ``Requires:`` against it;
- a stand-in module for each compiled extension that the entry modules reach through
  unconditional module-level imports (found by reading the sources: ``import
  vllm._C_stable_libtorch`` in ``vllm/platforms/cuda.py`` in 0.32). The extensions themselves
  (~650 MB, built for the torch vLLM pins) are not carried. Triton kernels need none of them; a
  stand-in has no attributes, so code that does call into one fails loudly.

Nothing is executed here: the imports are read with ``ast``. Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tarfile
import time
import zipfile
from pathlib import PurePosixPath

ENTRIES = (
    "vllm.v1.attention.ops.triton_unified_attention",
    "vllm.triton_utils",
    "vllm.platforms.cuda",  # what vllm.platforms.current_platform resolves to on a CUDA machine
)
STAND_IN = '''"""Stand-in for vLLM's compiled extension {name} (scripts/eval/gpu_check.sh omits it).

Only vLLM's Python code and its Triton kernels are available in this environment; anything
that needs this extension fails with AttributeError.
"""
'''
# Exceptions whose handlers make an import optional.
OPTIONAL = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


class Wheel:
    def __init__(self, path: str) -> None:
        self.zip = zipfile.ZipFile(path)
        self.names = set(self.zip.namelist())
        self.extensions = {  # module name -> file, for compiled extensions of the vllm package
            self._module(n): n for n in self.names
            if n.startswith("vllm/") and n.endswith(".so")
        }

    @staticmethod
    def _module(name: str) -> str:
        path = PurePosixPath(name)
        stem = path.name.split(".", 1)[0]  # _C.abi3.so -> _C
        return ".".join((*path.parent.parts, stem))

    def source_of(self, module: str) -> tuple[str, bool] | None:
        """(file name, is package) of a pure-Python module of the wheel."""
        base = module.replace(".", "/")
        if f"{base}/__init__.py" in self.names:
            return f"{base}/__init__.py", True
        if f"{base}.py" in self.names:
            return f"{base}.py", False
        return None

    def dist_info(self) -> str:
        infos = {n.split("/", 1)[0] for n in self.names if ".dist-info/" in n}
        (info,) = infos
        return info


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _catches_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    names: set[str] = set()
    for h in handlers:
        if h.type is None:
            return True
        for node in ast.walk(h.type):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
    return bool(names & OPTIONAL)


def _suppresses(items: list[ast.withitem]) -> bool:
    for item in items:
        call = item.context_expr
        if isinstance(call, ast.Call) and getattr(call.func, "attr", getattr(call.func, "id", "")) \
                == "suppress":
            return True
    return False


def module_level_imports(tree: ast.Module, module: str, is_package: bool
                         ) -> list[tuple[str, list[str], bool]]:
    """(imported module, names imported from it, optional) for each import that runs when the
    module is imported: module body, class bodies, if/try/with blocks; not function bodies,
    not ``if TYPE_CHECKING:``."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, list[str], bool]] = []

    def visit(body: list[ast.stmt], optional: bool) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((alias.name, [], optional) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                found.append((target, [a.name for a in node.names], optional))
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body, optional)
                visit(node.orelse, optional)
            elif isinstance(node, ast.Try):
                visit(node.body, optional or _catches_import_error(node.handlers))
                for handler in node.handlers:
                    visit(handler.body, optional)
                visit(node.orelse, optional)
                visit(node.finalbody, optional)
            elif isinstance(node, ast.With):
                visit(node.body, optional or _suppresses(node.items))
            elif isinstance(node, ast.ClassDef):
                visit(node.body, optional)

    visit(tree.body, False)
    return found


def closure(wheel: Wheel, entries: tuple[str, ...]) -> tuple[set[str], set[str], set[str]]:
    """(pure-Python modules, compiled extensions imported unconditionally, compiled extensions
    imported optionally) reached from ``entries`` by module-level imports."""
    seen: set[str] = set()
    needed: set[str] = set()
    optional: set[str] = set()
    todo = list(entries)
    while todo:
        module = todo.pop()
        if module in seen or not module.startswith("vllm"):
            continue
        seen.add(module)
        parent = module.rpartition(".")[0]
        if parent:
            todo.append(parent)  # importing a.b.c runs a/__init__ and a/b/__init__ first
        source = wheel.source_of(module)
        if source is None:
            continue
        file, is_package = source
        tree = ast.parse(wheel.zip.read(file), filename=file)
        for target, names, is_optional in module_level_imports(tree, module, is_package):
            for candidate in (target, *(f"{target}.{n}" for n in names)):
                if candidate in wheel.extensions:
                    (optional if is_optional else needed).add(candidate)
                elif wheel.source_of(candidate) is not None:
                    todo.append(candidate)
    modules = {m for m in seen if wheel.source_of(m) is not None}
    return modules, needed, optional - needed


def pack(wheel: Wheel, out: str, stand_ins: set[str]) -> dict[str, int]:
    sizes = {"py_files": 0, "py_bytes": 0}
    info = wheel.dist_info()
    with tarfile.open(out, "w:gz", compresslevel=9) as tar:
        def add(name: str, data: bytes) -> None:
            member = tarfile.TarInfo(name)
            member.size, member.mtime, member.mode = len(data), int(time.time()), 0o644
            tar.addfile(member, io.BytesIO(data))

        for name in sorted(wheel.names):
            if name.startswith("vllm/") and name.endswith(".py"):
                data = wheel.zip.read(name)
                add(name, data)
                sizes["py_files"] += 1
                sizes["py_bytes"] += len(data)
        for name in ("METADATA", "top_level.txt"):
            if f"{info}/{name}" in wheel.names:
                add(f"{info}/{name}", wheel.zip.read(f"{info}/{name}"))
        add(f"{info}/INSTALLER", b"importpatch scripts/eval/gpu_vllm_shell.py\n")
        for module in sorted(stand_ins):
            add(module.replace(".", "/") + ".py", STAND_IN.format(name=module).encode())
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel")
    ap.add_argument("out")
    ap.add_argument("--entry", action="append", help=f"entry modules (default: {ENTRIES})")
    args = ap.parse_args(argv)
    wheel = Wheel(args.wheel)
    entries = tuple(args.entry or ENTRIES)
    modules, needed, optional = closure(wheel, entries)
    sizes = pack(wheel, args.out, needed)
    json.dump({
        "wheel": args.wheel, "dist_info": wheel.dist_info(), "entries": list(entries),
        "module_level_closure": len(modules), "stand_ins": sorted(needed),
        "optional_extensions_left_out": sorted(optional), **sizes,
    }, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
