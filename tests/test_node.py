"""``@node`` (placeverify/node.py) builds the AST and step-IR classes without generated code (start-up
time); each must behave as the ``dataclass(frozen=True, slots=True)`` it stands for, here a twin
made from its fields: built positionally, by keyword and from defaults, compared, hashed, printed,
frozen, copied and pickled the same way, and still a dataclass for ``fields`` and ``replace``."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from placeverify.ir import step
from placeverify.syntax import ast

NODE_CLASSES = sorted((c for module in (ast, step) for c in vars(module).values()
                       if isinstance(c, type) and dataclasses.is_dataclass(c)
                       and c.__module__ == module.__name__), key=lambda c: c.__qualname__)


def test_the_node_classes_are_found() -> None:
    assert len(NODE_CLASSES) >= 59 and ast.File in NODE_CLASSES and step.Step in NODE_CLASSES


def _twin(cls: type) -> type:
    fields = dataclasses.fields(cls)
    spec = [(f.name, f.type) if f.default is dataclasses.MISSING
            else (f.name, f.type, dataclasses.field(default=f.default)) for f in fields]
    return dataclasses.make_dataclass(cls.__name__, spec, frozen=True, slots=True)


@pytest.mark.parametrize("cls", NODE_CLASSES, ids=lambda c: c.__qualname__)
def test_a_node_class_behaves_as_a_frozen_slotted_dataclass(cls: type) -> None:
    fields = dataclasses.fields(cls)
    twin = _twin(cls)
    values = [f"{f.name} value" for f in fields]
    changed = [*values[:-1], "changed"]
    mine, theirs = cls(*values), twin(*values)
    assert repr(mine) == repr(theirs)
    assert hash(mine) == hash(theirs)
    assert mine == cls(**{f.name: v for f, v in zip(fields, values, strict=True)})
    assert (mine == cls(*changed)) is (theirs == twin(*changed)) is False
    assert hash(cls(*changed)) == hash(twin(*changed))
    assert mine.__eq__(theirs) is NotImplemented and mine != theirs
    assert cls.__match_args__ == twin.__match_args__
    assert tuple(cls.__slots__) == tuple(twin.__slots__) and not hasattr(mine, "__dict__")
    attempts: list[Callable[[object], None]] = [
        lambda o: setattr(o, fields[0].name, 1), lambda o: delattr(o, fields[0].name)]
    for attempt in attempts:
        with pytest.raises(dataclasses.FrozenInstanceError) as raised_mine:
            attempt(mine)
        with pytest.raises(dataclasses.FrozenInstanceError) as raised_theirs:
            attempt(theirs)
        assert str(raised_mine.value) == str(raised_theirs.value)
    with pytest.raises(AttributeError):  # (3.11's slotted dataclass raises TypeError here)
        mine.extra = 1
    assert pickle.loads(pickle.dumps(mine)) == mine
    assert copy.deepcopy(mine) == mine and copy.copy(mine) == mine
    assert dataclasses.replace(mine, **{fields[-1].name: "changed"}) == cls(*changed)
    assert dataclasses.astuple(mine) == dataclasses.astuple(theirs)
    assert dataclasses.asdict(mine) == dataclasses.asdict(theirs)
    if cls.__doc__.startswith(cls.__name__ + "("):  # no docstring of its own: dataclass's
        assert cls.__doc__ == twin.__doc__
    with pytest.raises(TypeError):
        cls(*values, "extra")
    with pytest.raises(TypeError):
        cls(*values[:-1], **{fields[-1].name: "x", "extra": 1})


@pytest.mark.parametrize("cls", NODE_CLASSES, ids=lambda c: c.__qualname__)
def test_a_node_class_fills_defaults_and_refuses_missing_fields(cls: type) -> None:
    fields = dataclasses.fields(cls)
    twin = _twin(cls)
    required = [f for f in fields if f.default is dataclasses.MISSING]
    values: list[Any] = [f"{f.name} value" for f in required]
    mine, theirs = cls(*values), twin(*values)
    assert repr(mine) == repr(theirs) and hash(mine) == hash(theirs)
    assert [getattr(mine, f.name) for f in fields] == [getattr(theirs, f.name) for f in fields]
    if required:
        with pytest.raises(TypeError):
            cls(*values[:-1])
        with pytest.raises(TypeError):
            twin(*values[:-1])


def test_defaults_are_the_declared_ones() -> None:
    clip = step.Clip(1, step.Group(("dp",)), True, None)
    assert clip.target == step.Target(step.TargetKind.GRADS)
    assert step.Term(step.TermKind.NUMBER).number == 1
    assert (step.Clip.__doc__ or "").startswith("Clip(max_norm: 'Fraction'")
