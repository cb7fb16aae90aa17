"""The wrappers of ``Patch.wrap``. A Python function (a module function, a method, the function
of a staticmethod, classmethod or property) is wrapped by a generated Python function
(``wrapping``), which ``torch.compile`` traces; anything else (a class, a builtin, a callable
object) by wrapt's ``FunctionWrapper`` (it binds at each call and keeps signature,
``__wrapped__``, ``__name__``, ``__doc__``, in C) with pickling by reference to the target it
is installed at (see ``importpatch.install.objects``). wrapt's own proxies refuse to pickle
(``object proxy must define __reduce_ex__()``). Imported only where something is wrapped.
"""

from __future__ import annotations

import copyreg
import functools
from types import FunctionType

import wrapt

from importpatch.install.objects import (
    _reference,
    by_reference,
    class_by_reference,
    new_instance,
    new_instance_ex,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    _Bound = wrapt.BoundFunctionWrapper[..., Any]
    _Wrapper = wrapt.FunctionWrapper[..., Any]
else:
    _Bound, _Wrapper = wrapt.BoundFunctionWrapper, wrapt.FunctionWrapper


class _BoundTargetWrapper(_Bound):
    """A ``TargetWrapper`` bound by attribute access (wrapt makes these)."""

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        instance, parent = self._self_instance, self._self_parent
        if instance is not None:  # obj.method / Class.classmethod: as a bound method pickles
            return getattr, (instance, parent._self_target[1].rpartition(".")[2])
        return by_reference, _reference(parent._self_target, parent)

    __reduce__ = __reduce_ex__  # type: ignore[assignment]

    # As Python copies what this stands for (wrapt's proxies raise): ``Class.method`` (a
    # function) itself; a bound method the same binding, or deep, bound to a copy of the instance.
    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: Any) -> Any:
        if self._self_instance is None:
            return self
        import copy

        func, args = self.__reduce_ex__(4)
        return func(*copy.deepcopy(args, memo))

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # ``Class.method``: wrapt makes a new one at each access, so no name finds this one, and
        # cloudpickle would send a "function" it cannot find by value (the original's code,
        # unpatched): not claiming to be a function sends it through ``__reduce_ex__``.
        # Bound to an instance it is a method, as wrapt says. (A property costs nothing per call;
        # a Python ``__get__`` caching one object would cost every method call.)
        if self._self_instance is None and self._self_binding == "function":
            return type(self)
        return self.__wrapped__.__class__


class TargetWrapper(_Wrapper):
    """wrapt's ``FunctionWrapper`` that pickles by reference to the target it is installed at."""

    __bound_function_wrapper__ = _BoundTargetWrapper

    def __init__(self, wrapped: Any, wrapper: Any, target: tuple[str, str]) -> None:
        super().__init__(wrapped, wrapper)
        self._self_target = target

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return by_reference, _reference(self._self_target, self)

    __reduce__ = __reduce_ex__  # type: ignore[assignment]

    # ``copy`` keeps a function or a class itself (and so a config holding one is deep-copied
    # with it); wrapt's proxies raise "object proxy must define __deepcopy__()" instead.
    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: Any) -> Any:
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        # A class wrapped before its decorators run (decorated=False): a class decorator such as
        # @dataclass or attrs' define sets __init__, __repr__, __eq__, ... on what it is given.
        # They belong to the class; wrapt keeps a name that its proxy type also has on the proxy,
        # and the class would be built without them ("D() takes no arguments").
        if (name[:2] == "__" == name[-2:] and name not in _PROXY_NAMES
                and isinstance(self.__wrapped__, type)):
            setattr(self.__wrapped__, name, value)
        else:
            super().__setattr__(name, value)


# Names wrapt handles itself on a proxy (it sets __name__ / __qualname__ / ... on both).
_PROXY_NAMES = frozenset({"__wrapped__", "__name__", "__qualname__", "__module__", "__doc__",
                          "__annotations__", "__class__", "__dict__"})


class ClassWrapper(TargetWrapper):
    """The wrap of a class. ``__dict__`` is a copy of the class's (wrapt's is the class's own
    read-only ``mappingproxy``), as ``inspect.getattr_static`` wants: ``torch.compile`` (Dynamo)
    looks at every object so, and with the ``mappingproxy`` fails with an internal error
    ("descriptor 'get' for 'dict' objects doesn't apply to a 'mappingproxy' object"); with a dict
    a compiled caller breaks the graph at the call (the wrap runs), and under ``fullgraph=True``
    Dynamo says it cannot trace ``ClassWrapper.__call__``."""

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        return dict(vars(self.__wrapped__))


class HiddenWrapper(TargetWrapper):
    """A wrapper that is a property's ``fget`` / ``fset`` / ``fdel`` or a classmethod's function.
    No name finds it (the target's name finds the property, or a bound method), so it does not
    claim to be a function: cloudpickle would otherwise send the original's code by value; it
    pickles through ``__reduce_ex__``."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self)


class _ClassReference:
    """Stands for a wrapped class inside the pickle of one of its instances: pickle saves a class
    by its name, which finds the wrapper, not the class ("not the same object"); this pickles as
    ``class_by_reference(module, qualname)``. One per class, so a pickle holds it once."""

    __slots__ = ("cls", "target")

    def __init__(self, cls: type, target: tuple[str, str]) -> None:
        self.cls, self.target = cls, target

    def __reduce__(self) -> tuple[Any, ...]:
        return class_by_reference, self.target

    def __deepcopy__(self, memo: Any) -> type:  # copy.deepcopy of an instance: the class itself
        return self.cls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # copy.copy: not copied, called
        return self.cls(*args, **kwargs)


class _InstanceReducer:
    """``copyreg`` reducer of the instances of one wrapped class (exactly that class: a subclass
    has a name of its own). It is the instance's own reduce value with the class named by
    reference (pickle, cloudpickle, multiprocessing and ``copy`` all read
    ``copyreg.dispatch_table``)."""

    __slots__ = ("cls", "ref")

    def __init__(self, cls: type, target: tuple[str, str]) -> None:
        self.cls, self.ref = cls, _ClassReference(cls, target)

    def __call__(self, obj: Any) -> Any:
        value = obj.__reduce_ex__(4)
        if isinstance(value, str):
            return value
        func, args, *rest = value
        name = getattr(func, "__name__", "")  # copyreg's, which typeshed does not list
        if func is getattr(copyreg, name, None) and name in _NEW:
            func = _NEW[name]
        func = self.ref if func is self.cls else func
        args = tuple(self.ref if a is self.cls else a for a in args)
        return (func, args, *rest)


_NEW = {"__newobj__": new_instance, "__newobj_ex__": new_instance_ex}


def _instances_by_reference(cls: type, target: tuple[str, str]) -> None:
    if cls not in copyreg.dispatch_table:  # a reducer of its own (or ours: a second wrap) stays
        copyreg.pickle(cls, _InstanceReducer(cls, target))


def wrap_object(obj: Any, wrapper: Any, module: str, qualname: str) -> Any:
    """``obj`` wrapped with ``wrapper`` (wrapt's convention), installed at ``module:qualname``;
    descriptor objects are wrapped inside, so the descriptor kind is kept. A Python function (in
    a staticmethod or classmethod too) is wrapped by a generated Python function (``wrapping``),
    which ``torch.compile`` traces; anything else (a class, a builtin, a callable object, a bound
    method, a property's getter) by wrapt's proxy."""
    target = (module, qualname)
    in_class = "." in qualname
    if isinstance(obj, staticmethod):
        if type(obj.__func__) is FunctionType:
            return staticmethod(wrapping(obj.__func__, wrapper, module, qualname, FUNCTION))
        return staticmethod(TargetWrapper(obj.__func__, wrapper, target))
    if isinstance(obj, classmethod):
        if type(obj.__func__) is FunctionType:
            func = wrapping(obj.__func__, wrapper, module, f"{qualname}.__func__", METHOD)
            return classmethod(func)
        return classmethod(HiddenWrapper(obj.__func__, wrapper, target))
    if isinstance(obj, property):
        assert obj.fget is not None
        if type(obj.fget) is FunctionType:  # named as pickle finds it (see objects.settle)
            fget = wrapping(obj.fget, wrapper, module, f"{qualname}.fget", METHOD)
            return property(fget, obj.fset, obj.fdel, obj.__doc__)
        return property(HiddenWrapper(obj.fget, wrapper, target), obj.fset, obj.fdel, obj.__doc__)
    if type(obj) is FunctionType:
        return wrapping(obj, wrapper, module, qualname, METHOD if in_class else FUNCTION)
    if isinstance(obj, type):  # its instances would name the wrapper as their class
        _instances_by_reference(obj, target)
        return ClassWrapper(obj, wrapper, target)
    return TargetWrapper(obj, wrapper, target)


# -- Wraps of Python functions: generated Python functions ----------------------------------------
#
# wrapt's proxy claims to be the function it wraps (``__class__``, ``__code__``): torch.compile
# (Dynamo) inlines the *original's* code, so a compiled caller runs unpatched, and a wrapt proxy of
# a method bound to an instance is an object Dynamo cannot trace at all. A plain Python function
# calling the wrapper is what Dynamo inlines (and what ``replace(original=True)`` installs):
# compiled and eager run the same code. Its binding is fixed when it is made, from where it sits:
# at module level (or in a staticmethod) ``wrapper(original, None, args, kwargs)``; in a class a
# method, ``wrapper(<original bound to self>, self, args, kwargs)`` (a classmethod: bound to the
# class). A method wrap that a ``@staticmethod`` applied after the wrap turns into a staticmethod
# is made again as a function (``restaff``, from ``objects.settle``).

FUNCTION, METHOD = "function", "method"


def wrapping(original: Any, wrapper: Any, module: str, qualname: str, kind: str) -> Any:
    """A Python function calling ``wrapper`` with wrapt's arguments, named as the target (pickle
    finds it by name), with the original's ``__doc__``, ``__dict__``, ``__annotations__`` and
    ``__wrapped__`` (``inspect.signature`` shows the original's signature)."""
    # Per call this frame does only what wrapt's convention needs (issue 35): it packs the
    # arguments (``*args, **kwargs``) and calls the wrapper; a method also binds the original.
    # ``bind`` is the original's ``__get__`` taken once here: per call ``bind(self)`` is one C
    # call making the bound method, where ``original.__get__(self, type(self))`` looked up
    # ``__get__``, called ``type`` and passed two arguments (+3,007 -> +2,576 instructions a
    # call on 3.11). The original is always a Python function here, whose ``__get__`` ignores
    # the owner: the same bound method (a classmethod's function: bound to the class).
    if kind == FUNCTION:
        def call(*args: Any, **kwargs: Any) -> Any:
            return wrapper(original, None, args, kwargs)
    else:
        bind = original.__get__

        def call(self: Any, /, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            return wrapper(bind(self), self, args, kwargs)

    functools.update_wrapper(call, original)
    call.__module__, call.__qualname__ = module, qualname
    call.__name__ = qualname.rpartition(".")[2]
    call._importpatch_wrap = (kind, original, wrapper)  # type: ignore[attr-defined]
    return call


def restaff(func: Any, module: str, qualname: str) -> Any:
    """A wrap made as a method that a ``staticmethod`` now holds: the same wrap as a function."""
    made = getattr(func, "_importpatch_wrap", None)
    if made is None or made[0] != METHOD or getattr(func, "__qualname__", None) != qualname:
        return None
    # Wraps chained on one target (order): each inner one was made as a method too.
    inner = restaff(made[1], module, qualname) or made[1]
    return wrapping(inner, made[2], module, qualname, FUNCTION)
