"""The wrappers of ``Patch.wrap``: wrapt's ``FunctionWrapper`` (chosen over a hand-written closure:
it keeps signature, ``__wrapped__``, ``__name__``, ``__doc__`` and the descriptor behaviour of
methods, staticmethods, classmethods and properties, in C) with pickling by reference to the
target it is installed at (see ``importpatch.objects``). wrapt's own proxies refuse to pickle
(``object proxy must define __reduce_ex__()``). Imported only where something is wrapped.
"""

from __future__ import annotations

import wrapt

from .objects import _reference, by_reference

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


class HiddenWrapper(TargetWrapper):
    """A wrapper that is a property's ``fget`` / ``fset`` / ``fdel`` or a classmethod's function.
    No name finds it (the target's name finds the property, or a bound method), so it does not
    claim to be a function: cloudpickle would otherwise send the original's code by value; it
    pickles through ``__reduce_ex__``."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self)


def wrap_object(obj: Any, wrapper: Any, module: str, qualname: str) -> Any:
    """``obj`` wrapped with ``wrapper`` (wrapt's convention), installed at ``module:qualname``;
    descriptor objects are wrapped inside, so the descriptor kind is kept."""
    target = (module, qualname)
    if isinstance(obj, staticmethod):
        return staticmethod(TargetWrapper(obj.__func__, wrapper, target))
    if isinstance(obj, classmethod):
        return classmethod(HiddenWrapper(obj.__func__, wrapper, target))
    if isinstance(obj, property):
        assert obj.fget is not None
        return property(HiddenWrapper(obj.fget, wrapper, target), obj.fset, obj.fdel, obj.__doc__)
    return TargetWrapper(obj, wrapper, target)
