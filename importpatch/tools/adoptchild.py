"""The child of ``importpatch adopt`` (importpatch/tools/adopt.py): runs one monkeypatch function
and says what it changed. Run as ``python -c <this file's text> MODE FUNCTION OUT [MODULES]``,
so that importpatch itself is not imported here (its modules are not what the function
changes); it imports only the standard library.

MODE ``probe``: import the function's module, call it, write the modules imported by then.
MODE ``compare``: import the function's module and the probe's modules (so their import does not
count as a change), take a snapshot of every module's globals and of the ``__dict__`` of every
class found in them, call the function, take it again, write the differences (by identity).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import traceback
import types
from typing import Any

IGNORED = {"__warningregistry__"}  # written by the warnings machinery, not by the function
# What a monkeypatch puts in a class: a function or a descriptor of one. A special name of a
# class changed to anything else is a library's own state (pydantic completing a model when a
# subclass is made: __pydantic_complete__, __signature__), not the function's doing.
CODE_TYPES = (types.FunctionType, types.BuiltinFunctionType, classmethod, staticmethod, property,
              types.MethodType, type)


def is_class(value: Any) -> bool:
    # never value.__class__ or isinstance(): a lazy proxy (openai's module attributes) would load
    # what it stands for, and the snapshot itself would change the modules
    return issubclass(type(value), type)


def class_names(cls: Any) -> tuple[Any, str]:
    """(__module__, __qualname__) read without the class's own attribute look-up."""
    module = vars(cls).get("__module__")
    try:
        qual = type.__dict__["__qualname__"].__get__(cls)
    except (TypeError, AttributeError):
        qual = ""
    return module, qual


def resolve(function: str) -> Any:
    name, _, qual = function.partition(":")
    obj = importlib.import_module(name)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def source_of(module: Any) -> str | None:
    origin = getattr(getattr(module, "__spec__", None), "origin", None)
    return origin if isinstance(origin, str) and origin.endswith(".py") else None


def snapshot() -> dict[tuple[str, str, str], tuple[Any, dict[str, Any]]]:
    """{(kind, where, qualname): (owner object, dict copy)}: kind "module" or "class"; a class
    is keyed by the module that defines it and binds it at its qualname, else "stray"."""
    out: dict[tuple[str, str, str], tuple[Any, dict[str, Any]]] = {}
    seen: set[int] = set()

    def walk(cls: type, module_name: str, qual: str) -> None:
        if id(cls) in seen:
            return
        seen.add(id(cls))
        try:
            members = dict(vars(cls))
        except TypeError:
            return
        out[("class", module_name, qual)] = (cls, members)
        for key, value in members.items():
            if is_class(value) and class_names(value) == (module_name, f"{qual}.{key}"):
                walk(value, module_name, f"{qual}.{key}")

    loaded: dict[str, Any] = dict(sys.modules)  # (not only modules: anything may be put there)
    for name, module in loaded.items():
        if not isinstance(module, types.ModuleType):
            continue
        try:
            members = dict(vars(module))
        except TypeError:
            continue
        out[("module", name, "")] = (module, members)
    for name, module in loaded.items():
        if not isinstance(module, types.ModuleType):
            continue
        for key, value in list(vars(module).items()):
            if not is_class(value):
                continue
            home, qual = class_names(value)
            if home == name and qual == key:
                walk(value, name, qual)
            elif id(value) not in seen and not (isinstance(home, str) and home in sys.modules
                                                  and "<" not in qual):
                # defined nowhere importable (made by type(), in a function, in __main__)
                seen.add(id(value))
                out[("stray", str(home), qual)] = (value, dict(vars(value)))
    return out


def differences(before: dict[tuple[str, str, str], tuple[Any, dict[str, Any]]],
                after: dict[tuple[str, str, str], tuple[Any, dict[str, Any]]]
                ) -> list[dict[str, Any]]:
    changes = []
    for key, (_, now) in after.items():
        kind, where, qual = key
        old = before.get(key)
        if old is None:
            continue  # imported or made during the call: not compared
        was = old[1]
        for name in now.keys() | was.keys():
            if name in IGNORED:
                continue
            if name not in was:
                how = "added"
                value = now[name]
                if kind == "module" and isinstance(value, types.ModuleType) and \
                        value.__name__ == f"{where}.{name}":
                    continue  # a submodule imported during the call: its parent binds it
            elif name not in now:
                how = "deleted"
            elif now[name] is not was[name]:
                how = "replaced"
            else:
                continue
            if kind != "module" and name.startswith("__") and name.endswith("__") and not any(
                    isinstance(v, CODE_TYPES) for v in (now.get(name), was.get(name))):
                continue
            module = sys.modules.get(where) if kind != "stray" else None
            changes.append({
                "kind": kind, "module": where, "qualname": f"{qual}.{name}" if qual else name,
                "how": how,
                "source": source_of(module) if module is not None else None,
                "value": type(now.get(name, was.get(name))).__name__,
            })
    return sorted(changes, key=lambda c: (c["module"], c["qualname"]))


def main() -> None:
    mode, function, out_path = sys.argv[1:4]
    result: dict[str, Any] = {"error": None, "modules": [], "imported": [], "changes": []}
    try:
        fn = resolve(function)
        if not callable(fn):
            raise TypeError(f"{function} is a {type(fn).__name__}, not a function")
        if mode == "compare":
            with open(sys.argv[4], encoding="utf-8") as f:
                for name in json.load(f):
                    with contextlib.suppress(BaseException):  # what imports, imports
                        importlib.import_module(name)
            before = snapshot()
            names = set(sys.modules)
            fn()
            result["imported"] = [m for m in sys.modules if m not in names]
            result["changes"] = differences(before, snapshot())
        else:
            fn()
        result["modules"] = list(sys.modules)
    except BaseException as exc:
        result["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        result["traceback"] = traceback.format_exc()[-4000:]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
