"""``@node``: frozen, slotted dataclasses built without generated code, for the AST and the step IR.

``dataclass(frozen=True, slots=True)`` compiles six methods for every class (``__init__``,
``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``) and computes a signature
for its docstring: about 0.4 ms a class, some 25 ms for the 59 classes of
:mod:`placeverify.syntax.ast` and :mod:`placeverify.ir.step`, paid by every ``placeverify check``
before it reads a file. ``@node`` makes the same class — a dataclass (``dataclasses.fields``,
``replace`` and ``asdict`` work), slotted, frozen, built from its fields in order (defaults
allowed, no factories), compared, hashed, printed and pickled field by field exactly as
``dataclass(frozen=True, slots=True)`` would — with one written copy of those methods shared by
every class. ``tests/test_node.py`` holds every such class to a ``dataclass(frozen=True,
slots=True)`` twin.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import MISSING, FrozenInstanceError
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    names: tuple[str, ...] = cls.__match_args__
    if kwargs or len(args) != len(names):
        args = _arguments(cls, names, args, kwargs)
    for name, value in zip(names, args, strict=True):
        object.__setattr__(self, name, value)


def _arguments(cls: Any, names: tuple[str, ...], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Every field's value, from keywords and defaults after the positional ones."""
    if len(args) > len(names):
        raise TypeError(f"{cls.__qualname__}() takes {len(names)} arguments ({len(args)} given)")
    defaults: tuple[Any, ...] = cls._node_defaults
    values = list(args)
    for name, default in zip(names[len(args):], defaults[len(args):], strict=True):
        if name in kwargs:
            values.append(kwargs.pop(name))
        elif default is not MISSING:
            values.append(default)
        else:
            raise TypeError(f"{cls.__qualname__}() missing argument {name!r}")
    if kwargs:
        raise TypeError(f"{cls.__qualname__}() got unexpected arguments {sorted(kwargs)}")
    return tuple(values)


def _repr(self: Any) -> str:
    cls = type(self)
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in cls.__match_args__)
    return f"{cls.__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        return self._node_values(self) == self._node_values(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(self._node_values(self))


def _setattr(self: Any, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _getstate(self: Any) -> list[Any]:
    return list(self._node_values(self))


def _setstate(self: Any, state: list[Any]) -> None:
    for name, value in zip(type(self).__match_args__, state, strict=True):
        object.__setattr__(self, name, value)


_METHODS: dict[str, Callable[..., Any]] = {
    "__init__": _init, "__repr__": _repr, "__eq__": _eq, "__hash__": _hash,
    "__setattr__": _setattr, "__delattr__": _delattr,
    "__getstate__": _getstate, "__setstate__": _setstate,
}


def _values_getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The tuple of a node's field values (what ``dataclass`` compares and hashes)."""
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return attrgetter(*names)


@dataclass_transform(frozen_default=True)
def node(cls: type[T]) -> type[T]:
    """A frozen, slotted dataclass of ``cls``'s annotated fields, in order."""
    annotations = inspect.get_annotations(cls)
    defaults = tuple(cls.__dict__.get(name, MISSING) for name in annotations)
    assert annotations, f"{cls.__name__}: a node has fields"
    assert not any(isinstance(d, dataclasses.Field) for d in defaults), \
        f"{cls.__name__}: a node's defaults are plain values (no field(), no factories)"
    required = [d is MISSING for d in defaults]
    assert required == sorted(required, reverse=True), \
        f"{cls.__name__}: a field without a default follows one with a default"
    if not cls.__doc__:  # dataclass's own default, without computing a signature
        shown = (_parameter(n, t, d) for (n, t), d in zip(annotations.items(), defaults, strict=True))
        cls.__doc__ = f"{cls.__name__}({', '.join(shown)})"
    cls = dataclasses.dataclass(init=False, repr=False, eq=False, slots=True)(cls)
    methods = {**_METHODS, "_node_values": staticmethod(_values_getter(tuple(annotations))),
               "_node_defaults": defaults}
    for name, method in methods.items():
        setattr(cls, name, method)
    return cls


def _parameter(name: str, annotation: Any, default: Any) -> str:
    """One parameter as ``inspect.signature`` prints it (annotations are strings here)."""
    return f"{name}: {annotation!r}" + ("" if default is MISSING else f" = {default!r}")
