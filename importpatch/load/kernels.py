"""Triton kernels of a patched module must be built from the patched text; checked after exec.

Triton never compiles the Python code object of a ``@triton.jit`` function: it reads the
function's *source text* by file name (``inspect.getsourcelines`` -> ``linecache``) and compiles
that. publish.py makes the patched text the one that is read (the code is compiled under a real,
content-addressed file holding it). This module checks, once the patched module has executed,
that every kernel defined in it really carries that text, and raises ``PatchError`` otherwise
(the import then fails: no module whose kernels would silently run unpatched code remains).

What "the text Triton has" is, per kind of object (triton 3.x; read from triton 3.9's source):

- ``JITFunction`` / ``ConstexprFunction`` (``JITCallable``): ``raw_src`` and
  ``starting_line_number`` are read once, at decoration; ``.src`` (from ``def`` on, dedented) is
  what is compiled, and ``cache_key`` is sha256 over ``.src``, the keys of the jitted functions
  it calls, ``starting_line_number`` and constexpr globals (not the file name).
- ``InterpretedFunction`` (``TRITON_INTERPRET=1``): nothing is read at decoration. At the first
  launch its ``FunctionRewriter`` calls ``inspect.getsourcelines`` and runs *that* text; if the
  source cannot be read it silently runs the plain Python function instead. So the check reads
  the source now, the way the rewriter will, and then pins it: it asks the kernel to do its
  rewrite now (``InterpretedFunction.rewrite``, cached per function for the process), so nothing
  that happens to ``linecache`` or to files later can change what runs. (The rewrite adds the
  interpreter's globals to the module's namespace, as the first launch would have.)
- ``Autotuner`` / ``Heuristics`` (``@triton.autotune``, ``@triton.heuristics``) are unwrapped
  through ``.fn`` to the kernel inside.

Expected text: the patched text's lines from the function's ``co_firstlineno`` (its first
decorator), cut to the block ``inspect`` would take. Only kernels whose function was compiled from
this module's code (same ``co_filename``) are checked; kernels imported from elsewhere are that
module's business. Kernels made later (inside a function, by a factory) cannot be checked here.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import textwrap
import types

from importpatch.errors import PatchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

_MAX_WRAPPERS = 8  # Autotuner(Heuristics(JITFunction(fn))) ... is at most a few deep


def source_lines(text: str) -> list[str]:
    """Lines of ``text`` the way ``linecache`` reads a file (universal newlines: only ``\\n``,
    ``\\r\\n`` and ``\\r`` end a line; a form feed or ``\\u2028`` inside a line does not)."""
    return io.StringIO(text, newline=None).readlines()


def _is_triton(obj: Any) -> bool:
    return type(obj).__module__.partition(".")[0] == "triton"


def unwrap(obj: Any) -> tuple[Any, types.FunctionType] | None:
    """``(kernel, python function)`` for a Triton kernel object (or an autotune/heuristics wrapper
    of one), else None. ``kernel`` is the innermost Triton object, the one that holds the source."""
    kernel = obj
    for _ in range(_MAX_WRAPPERS):
        if not _is_triton(kernel):
            return None
        fn = getattr(kernel, "fn", None)
        if isinstance(fn, types.FunctionType):
            return kernel, fn
        kernel = fn
    return None


def iter_kernels(module: types.ModuleType, code_filename: str | None = None) -> Iterator[
    tuple[str, Any, types.FunctionType]
]:
    """``(name, kernel, function)`` for each Triton kernel bound at module level (or as a class
    attribute one level down) whose function was compiled under ``code_filename`` (default: any
    function whose ``__module__`` is this module)."""
    seen: set[int] = set()

    def candidates() -> Iterator[tuple[str, Any]]:
        for name, value in list(vars(module).items()):
            yield name, value
            if isinstance(value, type) and value.__module__ == module.__name__:
                for attr, inner in list(vars(value).items()):
                    yield f"{name}.{attr}", inner

    for name, value in candidates():
        found = unwrap(value)
        if found is None:
            continue
        kernel, fn = found
        if id(kernel) in seen:
            continue
        if code_filename is not None:
            if fn.__code__.co_filename != code_filename:
                continue
        elif getattr(fn, "__module__", None) != module.__name__:
            continue
        seen.add(id(kernel))
        yield name, kernel, fn


def expected_lines(lines: list[str], fn: types.FunctionType) -> list[str]:
    """The block of ``lines`` (universal-newline lines of the patched text) that ``inspect``
    gives for ``fn``: from its first line (first decorator) to the end of its body."""
    start = fn.__code__.co_firstlineno - 1
    if start < 0 or start >= len(lines):
        return []
    try:
        return list(inspect.getblock(lines[start:]))
    except Exception:
        return []


def _triton_view(kernel: Any, fn: types.FunctionType) -> tuple[list[str], int, str | None]:
    """(raw source lines, first line number, compiled ``.src`` or None) as this kernel holds them
    now (JITCallable) or will read them at its first launch (InterpretedFunction).
    Raises OSError when the source cannot be read."""
    raw = getattr(kernel, "raw_src", None)
    start = getattr(kernel, "starting_line_number", None)
    src = getattr(kernel, "src", None)
    if isinstance(raw, list) and isinstance(start, int):
        return list(raw), start, src if isinstance(src, str) else None
    lines, lnum = inspect.getsourcelines(fn)
    return list(lines), lnum, src if isinstance(src, str) else None


def _pin(kernel: Any) -> None:
    """Interpreter kernels: do the first-launch rewrite now, from the text just checked."""
    rewrite = getattr(kernel, "rewrite", None)
    if callable(rewrite) and hasattr(type(kernel), "rewritten_fn"):
        # if it raises, the launch raises the same error, as it would have without the patch
        with contextlib.suppress(Exception):
            rewrite()


def check_kernels(
    module: types.ModuleType, patched_text: str, patches: list[str],
    code_filename: str | None = None,
) -> int:
    """Fail closed when a Triton kernel of ``module`` does not carry the patched text. Returns the
    number of kernels checked."""
    lines = source_lines(patched_text)
    file = getattr(module, "__file__", None)
    checked = 0
    for name, kernel, fn in iter_kernels(module, code_filename):
        kind = type(kernel).__name__

        def fail(what: str, name: str = name, kind: str = kind) -> PatchError:
            return PatchError(
                ",".join(patches), module.__name__,
                f"Triton kernel {name!r} ({kind}) {what}; Triton would not run the patched "
                "kernel", file=file,
            )

        expected = expected_lines(lines, fn)
        if not expected:
            raise fail(f"starts at line {fn.__code__.co_firstlineno}, outside the patched text")
        try:
            raw, start, src = _triton_view(kernel, fn)
        except (OSError, TypeError) as exc:
            raise fail(f"has unreadable source ({exc})") from None
        if raw != expected or start != fn.__code__.co_firstlineno:
            raise fail(
                "carries source that is not the patched text ("
                + _first_difference(raw, start, expected, fn.__code__.co_firstlineno) + ")"
            )
        if src is not None and src.strip() not in textwrap.dedent("".join(expected)):
            raise fail("has a .src that is not the patched text")
        _pin(kernel)
        checked += 1
    return checked


def _first_difference(got: list[str], got_start: int, want: list[str], want_start: int) -> str:
    if got_start != want_start:
        return f"it starts at line {got_start}, the function at line {want_start}"
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"line {got_start + i} reads {a.strip()!r}, the patched text {b.strip()!r}"
    return f"{len(got)} lines where the patched text has {len(want)}"
