"""The objects importpatch installs at a target, and how they behave outside their module: their
names, pickling, a replacement that receives the original, and a call's arguments by name.

Pickling. ``multiprocessing`` (spawn, forkserver), ``concurrent.futures`` and ``cloudpickle`` send
functions *by reference*: ``module`` + ``qualname``, resolved again in the receiving process. vLLM
starts EngineCore and its Workers that way (``Process(target=EngineCoreProc.run_engine_core)``).
So everything installed at a target pickles by reference to **the target's own module and
qualified name**, and the receiving process resolves its own, patched, object:

- a wrap of a Python function is a generated Python function named as the target (a
  classmethod's ``Class.m.__func__``, a property getter's ``Class.p.fget``: the names pickle
  resolves to that very object), so it pickles as any function does; other wraps (a class, a
  builtin, a callable object) are ``importpatch.install.wrappers.TargetWrapper`` objects (wrapt's
  ``FunctionWrapper`` with ``__reduce_ex__``, whose plain proxy refuses to pickle), bound
  wrappers alike; a wrapper bound to an instance pickles as ``getattr(instance, name)``, as a
  bound method does;
- a subclass made by ``subclass`` takes the names of the class it stands in for, in every
  patch (``take_names``): its factory makes it again wherever the patch is on;
- a function or class that a discovered patch (a file of an ``IMPORTPATCH_PATH`` folder, a
  built-in or an installed patch package) defines and installs at a target (``replace``,
  ``add``) takes the target's ``__module__``, ``__qualname__`` and ``__name__``, its methods and
  nested classes the matching ones (``adopt_names``). Pickle has no other hook for plain
  functions and classes: it looks the object up by those names and checks that it finds the same
  object. ``__code__`` is untouched, so tracebacks and ``inspect.getsource`` of a function still
  show the patch file. Objects of patches made in application code (``importpatch.enable()``)
  keep their names: a child process may not run that code, and their own names resolve there.
- an instance of a wrapped class names its class through ``class_by_reference`` (pickle saves
  a class by name, and the name finds the wrapper: "not the same object"); ``wrappers``
  registers a ``copyreg`` reducer for the class, which pickle, cloudpickle, multiprocessing and
  ``copy`` read. (The class object itself, pickled alone, still cannot be: pickle saves classes
  before it asks ``copyreg``.)
- a function installed at a property (its getter) is named ``Class.prop.fget``, which pickle can
  resolve (the original getter, named ``Class.prop``, cannot be pickled by reference at all); a
  wrapper there, or in a classmethod, does not claim to be a function (``settle``).

Invariants: nothing here runs per call but the wraps (one Python call before the wrapper;
wrapt's C proxy for the others) and the stand-in of ``replace(original=True)`` (one Python
call). cloudpickle pickles a "function" by reference only
when looking it up by name finds the very object, and otherwise sends its code by value (the
original's code, for a wrapper: silently unpatched); so a wrapper that no name finds
(``Class.method``, which wrapt binds anew at each access, a property's getter, a classmethod's
function) does not claim to be a function and pickles through ``__reduce_ex__``. (Left: the
wrapper of a method as stored, ``vars(Class)["method"]``, claims to be a function, since at the
definition site it cannot be told from a staticmethod's; cloudpickle sends that one object by
value.) ``by_reference`` is the one function an unpickler calls.
"""

from __future__ import annotations

import sys
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


# -- Pickling by reference ------------------------------------------------------------------------


def by_reference(module: str, qualname: str, attr: str | None = None) -> Any:
    """The object at ``module:qualname`` in this process (with ``attr``: that attribute of the
    object as the class stores it, e.g. a property's ``fget``, a classmethod's ``__func__``);
    unpicklers call this."""
    import importlib

    obj: Any = importlib.import_module(module)
    *owners, last = qualname.split(".")
    for part in owners:
        obj = getattr(obj, part)
    if attr is None:
        return getattr(obj, last)
    return getattr(vars(obj)[last], attr)


def class_by_reference(module: str, qualname: str) -> Any:
    """The class a wrap at ``module:qualname`` wraps in this process (the class itself where
    nothing wraps it there); unpicklers of instances of a wrapped class call this."""
    found = by_reference(module, qualname)
    inner = getattr(found, "__wrapped__", None)  # (the wrapper claims to be a class too)
    return inner if isinstance(inner, type) else found


def new_instance(cls: Any, *args: Any) -> Any:
    """``copyreg.__newobj__`` under another name: pickle insists that that one's first argument
    *is* the instance's class, and an instance of a wrapped class names it by reference (``cls``
    is the class once unpickled; ``copy.copy`` passes the reference itself, ``.cls``)."""
    cls = cls if isinstance(cls, type) else cls.cls
    return cls.__new__(cls, *args)


def new_instance_ex(cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``copyreg.__newobj_ex__`` under another name (see ``new_instance``)."""
    cls = cls if isinstance(cls, type) else cls.cls
    return cls.__new__(cls, *args, **kwargs)


def _reference(target: tuple[str, str], obj: Any) -> tuple[str, ...]:
    """Arguments of ``by_reference`` for ``obj`` installed at ``target``: the part of a property
    or classmethod it is, when that is where it sits (looked up without running descriptors, in
    the module as it is now)."""
    module, qualname = target
    raw: Any = sys.modules.get(module)
    for part in qualname.split("."):
        raw = getattr(raw, "__dict__", {}).get(part)
    for attr in _PARTS.get(type(raw), ()):
        if getattr(raw, attr) is obj:
            return (module, qualname, attr)
    return (module, qualname)


_PARTS = {property: ("fget", "fset", "fdel"), classmethod: ("__func__",)}


def settle(obj: Any, module: str, qualname: str, named: set[int]) -> Any:
    """``obj``, what a class body bound at ``module:qualname``, with what importpatch installed
    *inside* a property or classmethod made picklable by reference: a replacement function (id in
    ``named``) inside a property is named ``Class.prop.fget``, which pickle resolves; a wrapper
    becomes a ``HiddenWrapper`` (see ``importpatch.install.wrappers``). Anything else is returned as
    it is."""
    # no wrapper exists before it is imported
    wrappers = sys.modules.get("importpatch.install.wrappers")
    if type(obj) is staticmethod:
        made = None if wrappers is None else wrappers.restaff(obj.__func__, module, qualname)
        return obj if made is None else staticmethod(made)
    parts = _PARTS.get(type(obj))
    if parts is None:
        return obj
    values: dict[str, Any] = {}
    rebuilt = False
    for attr in parts:
        func = getattr(obj, attr)
        if hasattr(func, "_importpatch_wrap") and getattr(
                func, "__qualname__", None) == qualname:  # a wrap (a Python function)
            func.__qualname__ = f"{qualname}.{attr}"
        elif wrappers is not None and type(func) is wrappers.TargetWrapper:
            func = wrappers.HiddenWrapper(func.__wrapped__, func._self_wrapper, (module, qualname))
            rebuilt = True
        elif type(obj) is property and id(func) in named and getattr(
                func, "__qualname__", None) == qualname:
            func.__qualname__ = f"{qualname}.{attr}"
        values[attr] = func
    if not rebuilt:
        return obj
    if type(obj) is classmethod:
        return classmethod(values["__func__"])
    return property(values["fget"], values["fset"], values["fdel"], obj.__doc__)


# -- Names of objects defined by patches -----------------------------------------------------------


def adopt_names(obj: Any, module: str, qualname: str, home: str | None) -> None:
    """Give ``obj`` — a function, class, staticmethod, classmethod or property defined in module
    ``home`` (the patch's declaration) — the names of the target it is installed at, so that it
    pickles by reference to the target. Objects from anywhere else keep their names."""
    if home is None:
        return
    if isinstance(obj, (staticmethod, classmethod)):
        adopt_names(obj.__func__, module, qualname, home)
    elif isinstance(obj, property):
        for attr in ("fget", "fset", "fdel"):
            func = getattr(obj, attr)
            if func is not None:
                _rename(func, module, f"{qualname}.{attr}", qualname.rpartition(".")[2], home)
    elif isinstance(obj, (types.FunctionType, type)):
        _rename(obj, module, qualname, qualname.rpartition(".")[2], home)


def _rename(obj: Any, module: str, qualname: str, name: str, home: str) -> None:
    if getattr(obj, "__module__", None) != home or not isinstance(
            obj, (types.FunctionType, type)):
        return
    old = obj.__qualname__
    try:
        obj.__module__, obj.__qualname__, obj.__name__ = module, qualname, name
    except (AttributeError, TypeError):  # a class of a C extension keeps its names
        return
    if isinstance(obj, type):  # its methods and nested classes: Target.method, ...
        for attr, member in list(vars(obj).items()):
            inner = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            if isinstance(member, property):
                adopt_names(member, module, f"{qualname}.{attr}", home)
            elif getattr(inner, "__qualname__", None) == f"{old}.{attr}":
                _rename(inner, module, f"{qualname}.{attr}", attr, home)


def take_names(cls: type, module: str, qualname: str) -> None:
    """Give a subclass made by ``Patch.subclass`` (wherever its factory defined it, in any
    patch) the names of the class it stands in for, its methods and nested classes the matching
    ones: it is made afresh at the target in every process where the patch is on, so pickling by
    reference to the target finds it there."""
    _rename(cls, module, qualname, qualname.rpartition(".")[2], cls.__module__)


def name_home(patch: Any) -> str | None:
    """The module whose objects take their target's names: the declaration module of a patch
    found by discovery (None for patches made in application code, see the module docstring)."""
    return patch.defined_in if patch.discovered else None


# -- replace(original=True) -----------------------------------------------------------------------


def stand_in(original: Any, replacement: Callable[..., Any], module: str, qualname: str
             ) -> Callable[..., Any]:
    """A function calling ``replacement(original, *args, **kwargs)``, to be installed at
    ``module:qualname`` where ``original`` was, and named so. A plain function, so it binds as a
    method and takes the original's decorators as the original did; ``__wrapped__`` is the
    original (its signature is the one callers see)."""
    if isinstance(original, (staticmethod, classmethod)):  # decorated=True: the function inside
        original = original.__func__
    if not callable(original):
        raise TypeError(f"the original is a {type(original).__name__}, not callable")

    def call(*args: Any, **kwargs: Any) -> Any:
        return replacement(original, *args, **kwargs)

    call.__wrapped__ = original  # type: ignore[attr-defined]
    call.__doc__ = getattr(replacement, "__doc__", None) or getattr(original, "__doc__", None)
    call.__module__, call.__qualname__ = module, qualname
    call.__name__ = qualname.rpartition(".")[2]
    return call


# -- bind(): a call's arguments by parameter name ------------------------------------------------


class Arguments:
    """A call's arguments by parameter name, in parameter order, defaults filled in (like
    ``inspect.BoundArguments`` after ``apply_defaults()``). ``args`` and ``kwargs`` rebuild a
    call from ``arguments``, after you changed some: ``wrapped(*bound.args, **bound.kwargs)``."""

    __slots__ = ("arguments", "_shape")

    arguments: dict[str, Any]
    _shape: _Shape

    def __init__(self, arguments: dict[str, Any], shape: _Shape) -> None:
        self.arguments = arguments
        self._shape = shape

    def __getitem__(self, name: str) -> Any:
        return self.arguments[name]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
        return f"<Arguments ({inner})>"

    @property
    def args(self) -> tuple[Any, ...]:
        shape, arguments = self._shape, self.arguments
        out = tuple(arguments[n] for n in shape.positional)
        return out + tuple(arguments[shape.varargs]) if shape.varargs else out

    @property
    def kwargs(self) -> dict[str, Any]:
        shape, arguments = self._shape, self.arguments
        out = {n: arguments[n] for n in shape.keyword}
        if shape.varkw:
            out.update(arguments[shape.varkw])
        return out


class _Shape:
    __slots__ = ("positional", "varargs", "keyword", "varkw")

    def __init__(self, positional: tuple[str, ...], varargs: str | None,
                 keyword: tuple[str, ...], varkw: str | None) -> None:
        self.positional, self.varargs, self.keyword, self.varkw = (
            positional, varargs, keyword, varkw)



# (id of a code object, leading parameters bound already) -> (the code object, its binder). By
# id: a code object's own hash reads its whole content.
_binders: dict[tuple[int, int], tuple[Any, Any]] = {}
_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08


def _binder(code: types.CodeType, skip: int, defaults: tuple[Any, ...] | None,
            kwdefaults: dict[str, Any] | None, qualname: str) -> Any:
    """A function with ``code``'s parameters and defaults that returns the ``Arguments`` of a call
    (without the first ``skip`` parameters, a bound method's ``self``): Python itself binds the
    call, at C speed, with Python's own error for a call that does not fit. Made once per code
    object (and per defaults: a function made by a factory has its own); ``bind`` looks it up."""
    names = code.co_varnames
    n, kw = code.co_argcount, code.co_kwonlyargcount
    positional, keyword = names[:n], names[n:n + kw]
    rest = list(names[n + kw:])
    varargs = rest.pop(0) if code.co_flags & _CO_VARARGS else None
    varkw = rest.pop(0) if code.co_flags & _CO_VARKEYWORDS else None
    first_default = n - len(defaults or ())
    params = [f"{p}=None" if i >= first_default else p for i, p in enumerate(positional)]
    if code.co_posonlyargcount:
        params.insert(code.co_posonlyargcount, "/")
    if varargs or keyword:
        params.append(f"*{varargs or ''}")
    params += [f"{p}=None" if p in (kwdefaults or {}) else p for p in keyword]
    if varkw:
        params.append(f"**{varkw}")
    every = [*positional[skip:], *([varargs] if varargs else []), *keyword,
             *([varkw] if varkw else [])]
    body = ", ".join(f"{p!r}: {p}" for p in every)
    namespace: dict[str, Any] = {
        "_new": object.__new__, "_Arguments": Arguments,
        "_shape": _Shape(positional[skip:], varargs, keyword, varkw),
    }
    # The helpers are globals of the binder; a parameter of the same name would shadow one.
    exec(f"def bind({', '.join(params)}):\n"
         f"    _a = _new(_Arguments)\n"
         f"    _a.arguments = {{{body}}}\n"
         f"    _a._shape = _shape\n"
         f"    return _a\n", namespace)
    binder = namespace["bind"]
    # Named as the original, so a call that does not fit fails with the call's own message.
    code_names = {"co_name": code.co_name}
    if hasattr(code, "co_qualname"):  # Python 3.11+
        code_names["co_qualname"] = code.co_qualname
    binder.__code__ = binder.__code__.replace(**code_names)
    # Python 3.10 names the function in the message by its __qualname__, 3.11+ by co_qualname.
    binder.__name__, binder.__qualname__ = code.co_name, getattr(code, "co_qualname", qualname)
    binder.__defaults__, binder.__kwdefaults__ = defaults, kwdefaults
    _binders[(id(code), skip)] = (code, binder)
    return binder


def bind(func: Any, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None
         ) -> Arguments:
    """The arguments of the call ``func(*args, **kwargs)`` by parameter name, defaults filled
    in: in a wrap, ``bind(wrapped, args, kwargs).arguments["kv_cache_spec"]``. ``wrapped`` of a
    method is bound (``self`` is not among the arguments, as with ``inspect.signature``). A call
    that does not fit the signature raises ``TypeError`` as the call itself would."""
    kind = type(func)
    if kind is types.FunctionType:  # the common cases first: no attribute look-ups that fail
        prefix: tuple[Any, ...] = ()
        target = func
    elif kind is types.MethodType:
        prefix, target = (func.__self__,), func.__func__
    else:
        prefix, target = (), func
        wrapt = sys.modules.get("wrapt")  # no wrapt proxy exists before it is imported
        if wrapt is not None and kind is wrapt.PartialCallableObjectProxy:
            # wrapt: a method called through its class, the instance bound in front
            prefix, target = func._self_args, func.__wrapped__
        inner = getattr(target, "__func__", None)  # a wrapt proxy of a bound method
        if inner is not None and getattr(target, "__self__", None) is not None:
            prefix, target = (target.__self__, *prefix), inner
    code = getattr(target, "__code__", None)
    if type(code) is not types.CodeType:
        return _bind_slowly(func, args, kwargs or {})
    found = _binders.get((id(code), len(prefix)))
    if found is not None and found[0] is code and found[1].__defaults__ is target.__defaults__ \
            and found[1].__kwdefaults__ is target.__kwdefaults__:
        binder = found[1]
    else:
        binder = _binder(code, len(prefix), target.__defaults__, target.__kwdefaults__,
                         getattr(target, "__qualname__", code.co_name))
    if kwargs:
        return binder(*prefix, *args, **kwargs)  # type: ignore[no-any-return]
    return binder(*prefix, *args)  # type: ignore[no-any-return]


def _bind_slowly(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Arguments:
    """Any other callable (a builtin, a partial, a callable object): through ``inspect``."""
    import inspect

    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    params = inspect.signature(func).parameters.values()
    kinds = inspect.Parameter
    shape = _Shape(
        tuple(p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY,
                                                   kinds.POSITIONAL_OR_KEYWORD)),
        next((p.name for p in params if p.kind == kinds.VAR_POSITIONAL), None),
        tuple(p.name for p in params if p.kind == kinds.KEYWORD_ONLY),
        next((p.name for p in params if p.kind == kinds.VAR_KEYWORD), None),
    )
    return Arguments(dict(bound.arguments), shape)
