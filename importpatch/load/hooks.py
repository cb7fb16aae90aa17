"""Other import hooks that load a targeted module: the patched module is compiled *through* them.

The patch finder stays first on ``sys.meta_path`` (``finder.MetaPath``), asks the other finders
for a targeted module's spec in their order and wraps the loader the first one returns. What that
loader would have done to the module is kept where it can be:

- ``PLAIN``: the standard source loader (``get_code`` and ``source_to_code`` of
  ``importlib``'s ``SourceLoader``), also under a hook that only wraps it (wrapt, ddtrace): the
  patch loader compiles the module itself (and caches the code).
- ``SOURCE``: a source loader with a ``get_code`` or ``source_to_code`` of its own: an AST
  transform such as typeguard's ``install_import_hook`` (also under ``pytest
  --typeguard-packages``) or ``beartype.claw``. Its own ``get_code`` is called, with, for that
  call only, the patched text as the module's source (``get_data``), the patched file's name
  (``get_filename``) and no bytecode of the package's ``__pycache__`` (``path_stats`` fails, so
  ``SourceLoader.get_code`` neither reads nor writes a ``.pyc``), and while it runs, in that
  thread, a parse or compile of that file's source hands it the patched module's tree, with its
  landings (``compile`` in builtins stands in for the call's duration: transforms parse the text
  themselves, and the landings are an AST rewrite). The code it returns must carry the landings'
  calls (checked before anything runs). Not cached: the hook's output depends on its own
  configuration.
- ``PYTEST``: pytest's assertion rewriting hook (``pytest.register_assert_rewrite``, test files,
  conftest), whose ``exec_module`` reads the file and its own ``.pyc`` itself: its
  ``rewrite_asserts`` runs on the patched tree, and the code is compiled here.
- ``OPAQUE``: any other loader (an ``exec_module`` of its own without ``get_code``): it cannot be
  handed patched code. The module is patched and executed by the patch loader without that
  loader's processing: a warning naming the hook, once per process and hook, and an ``info``
  event per module (``importpatch status``); under ``IMPORTPATCH_STRICT=1`` the import fails
  instead (``PatchError``), before the module runs. So does a ``SOURCE`` or ``PYTEST`` loader that
  fails or returns code without the landings.
"""

from __future__ import annotations

import _thread
import ast
import builtins
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType
    from typing import Any

PLAIN, SOURCE, PYTEST, OPAQUE = "plain", "source", "pytest", "opaque"  # finder.loader_kind


def describe(loader: Any, via: Any) -> str:
    """'<loader class> (found by <finder>)', for messages."""
    def name(obj: Any) -> str:
        cls = obj if isinstance(obj, type) else type(obj)
        return f"{cls.__module__}.{cls.__qualname__}"

    found = f" (found by {name(via)})" if via is not None and type(via) is not type(loader) \
        and via is not loader else ""
    return f"{name(loader)}{found}"


class CannotCompose(Exception):
    """The other hook's loader cannot compile the patched module: why."""


def carries_landings(code: CodeType, hooks_module: str) -> bool:
    """Whether ``code`` (or code nested in it) calls the activation hooks (``facts.HOOKS``
    names ``hooks_module``): the code of the patched tree, not of the original text."""
    todo = [code]
    while todo:
        current = todo.pop()
        for const in current.co_consts:
            if const == hooks_module:
                return True
            if hasattr(const, "co_consts"):
                todo.append(const)
    return False


def compile_through(kind: str, loader: Any, fullname: str, tree: ast.Module, text: str,
                    origin: str, filename: str, hooks_module: str) -> CodeType:
    """The patched module's code, made by ``loader`` (``SOURCE`` or ``PYTEST``) from ``tree``
    (the patched text's tree, landings included); raises CannotCompose."""
    try:
        if kind == PYTEST:
            code = _pytest_rewrite(loader, fullname, tree, text, origin, filename)
        else:
            code = _source_loader(loader, fullname, tree, text, origin, filename)
    except CannotCompose:
        raise
    except Exception as exc:
        raise CannotCompose(f"it failed on the patched module: {type(exc).__name__}: {exc}"
                            ) from None
    if not carries_landings(code, hooks_module):
        raise CannotCompose("the code it returned was not compiled from the patched source")
    return code


def _source_loader(loader: Any, fullname: str, tree: ast.Module, text: str, origin: str,
                   filename: str) -> CodeType:
    data = text.encode("utf-8")
    names = {origin, filename}
    real_get_data = loader.get_data

    def get_data(path: Any) -> bytes:
        return data if path in names else real_get_data(path)

    def path_stats(path: Any) -> dict[str, Any]:
        raise OSError("importpatch: no bytecode of the package's __pycache__ for a patched module")

    def get_filename(name: Any = None) -> str:
        return filename

    overrides = {"get_data": get_data, "path_stats": path_stats, "get_filename": get_filename}
    attrs = getattr(loader, "__dict__", None)
    if not isinstance(attrs, dict):
        raise CannotCompose("its loader takes no instance attributes")
    saved = {k: attrs[k] for k in overrides if k in attrs}
    attrs.update(overrides)
    try:
        with _ParseGivesTree(names, tree):
            return type(loader).get_code(loader, fullname)  # type: ignore[no-any-return]
    finally:
        for k in overrides:
            attrs.pop(k, None)
        attrs.update(saved)


def _pytest_rewrite(loader: Any, fullname: str, tree: ast.Module, text: str, origin: str,
                    filename: str) -> CodeType:
    rewrite = sys.modules.get("_pytest.assertion.rewrite")
    rewrite_asserts = getattr(rewrite, "rewrite_asserts", None)
    if rewrite_asserts is None:
        raise CannotCompose("_pytest.assertion.rewrite.rewrite_asserts is not there")
    rewrite_asserts(tree, text.encode("utf-8"), origin, getattr(loader, "config", None))
    code = compile(tree, filename, "exec", dont_inherit=True)
    rewritten = getattr(loader, "_rewritten_names", None)  # what its resource reader looks up
    if isinstance(rewritten, dict) and "pathlib" in sys.modules:
        rewritten[fullname] = sys.modules["pathlib"].Path(origin)
    return code


# -- compile() hands the patched tree to a transform that parses the source itself --------------

_trees: dict[int, tuple[set[str], ast.Module]] = {}  # thread -> (file names, tree)
_users = 0
_real_compile: Any = None


class _ParseGivesTree:
    """While active, in this thread, ``compile(source of one of names, name, "exec", ...)`` (what
    ``ast.parse`` calls too) works on ``tree`` instead of the text: with ``PyCF_ONLY_AST`` it
    returns the tree, else the tree's code."""

    def __init__(self, names: set[str], tree: ast.Module) -> None:
        self.key = _thread.get_ident()
        self.entry = (names, tree)
        self.outer: tuple[set[str], ast.Module] | None = None  # a nested import's, in this thread

    def __enter__(self) -> None:
        global _users, _real_compile
        with _lock:
            self.outer = _trees.get(self.key)
            _trees[self.key] = self.entry
            if _users == 0:
                _real_compile = builtins.compile
                builtins.compile = _compile
            _users += 1

    def __exit__(self, *exc: Any) -> None:
        global _users
        with _lock:
            if self.outer is not None:
                _trees[self.key] = self.outer
            else:
                _trees.pop(self.key, None)
            _users -= 1
            if _users == 0 and builtins.compile is _compile:
                builtins.compile = _real_compile


_lock = _thread.allocate_lock()


def _compile(source: Any, filename: Any, mode: str, flags: int = 0, *args: Any, **kwargs: Any
             ) -> Any:
    entry = _trees.get(_thread.get_ident())
    if entry is not None and mode == "exec" and isinstance(source, (str, bytes, bytearray)):
        try:
            name: str | None = os.fsdecode(filename)
        except TypeError:
            name = None
        if name in entry[0]:
            if flags & ast.PyCF_ONLY_AST:
                return entry[1]
            return _real_compile(entry[1], filename, mode, flags, *args, **kwargs)
    return _real_compile(source, filename, mode, flags, *args, **kwargs)
