"""The abstract syntax tree of a ``.place`` file: one class per rule of ``grammar/placement.lark``.

Nodes are plain, immutable and carry the span of the text they came from; nothing here knows
what a name means (that is lowering's job, in :mod:`placeverify.lower`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from placeverify.diagnostics import Span


@dataclass(frozen=True, slots=True)
class Name:
    text: str
    span: Span


# ---- values ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NumberValue:
    text: str
    value: Fraction
    span: Span


@dataclass(frozen=True, slots=True)
class QuantityValue:
    """A number with a unit: ``80 GB``, ``25 GB/s``, ``2 us``."""

    number: Fraction
    unit: str
    text: str
    span: Span


@dataclass(frozen=True, slots=True)
class StringValue:
    value: str
    span: Span


@dataclass(frozen=True, slots=True)
class NameValue:
    name: Name

    @property
    def span(self) -> Span:
        return self.name.span


@dataclass(frozen=True, slots=True)
class StarredValue:
    """``S*`` (a name followed by a star) inside an argument list."""

    name: Name
    span: Span


Value = NumberValue | QuantityValue | StringValue | NameValue | StarredValue


# ---- blocks, calls, groups ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    key: Name
    value: Value
    span: Span


@dataclass(frozen=True, slots=True)
class Block:
    entries: tuple[Entry, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class KeywordArg:
    key: Name
    value: Value
    span: Span


@dataclass(frozen=True, slots=True)
class PositionalArg:
    value: Value
    span: Span


Arg = KeywordArg | PositionalArg


@dataclass(frozen=True, slots=True)
class Call:
    name: Name
    args: tuple[Arg, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class AxisRef:
    name: Name
    span: Span


@dataclass(frozen=True, slots=True)
class DerivedGroup:
    """``ends(pp)``: a group derived from one axis."""

    function: Name
    axis: Name
    span: Span


@dataclass(frozen=True, slots=True)
class AxisTuple:
    names: tuple[Name, ...]
    span: Span


GroupTerm = AxisRef | DerivedGroup | AxisTuple


@dataclass(frozen=True, slots=True)
class Group:
    terms: tuple[GroupTerm, ...]
    span: Span


# ---- placements -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PresetPlacement:
    name: Name
    span: Span


@dataclass(frozen=True, slots=True)
class CallPlacement:
    name: Name
    args: tuple[Arg, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class TuplePlacement:
    args: tuple[Arg, ...]
    span: Span


Placement = PresetPlacement | CallPlacement | TuplePlacement


# ---- loss / scale expressions ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NumberFactor:
    value: NumberValue
    span: Span


@dataclass(frozen=True, slots=True)
class NameFactor:
    name: Name
    span: Span


@dataclass(frozen=True, slots=True)
class CountFactor:
    """``tokens(dp * cp, step)``: a count, summed over groups."""

    name: Name
    groups: tuple[Group, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class SizeFactor:
    """``|dp|``: the number of devices in a group."""

    group: Group
    span: Span


@dataclass(frozen=True, slots=True)
class ParenFactor:
    expr: Expr
    span: Span


Factor = NumberFactor | NameFactor | CountFactor | SizeFactor | ParenFactor


@dataclass(frozen=True, slots=True)
class Expr:
    """``first (op factor)*`` with op in ``*``, ``/``."""

    first: Factor
    rest: tuple[tuple[str, Factor], ...]
    span: Span


# ---- step statements ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    name: Name
    selectors: tuple[Name, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class MicrobatchesStmt:
    value: Value
    span: Span


@dataclass(frozen=True, slots=True)
class BackwardStmt:
    expr: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class EachMicrobatch:
    items: tuple[StepItem, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class OnMicrobatch:
    which: Value
    items: tuple[StepItem, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ScaleStmt:
    target: Target
    expr: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class SeedStmt:
    call: Call
    policy: Name
    group: Group
    span: Span


@dataclass(frozen=True, slots=True)
class OpStmt:
    """``name(args) target over group``: a collective, an update, a clip, a free ..."""

    name: Name
    args: tuple[Arg, ...]
    target: Target
    group: Group | None
    span: Span


StepItem = (MicrobatchesStmt | BackwardStmt | EachMicrobatch | OnMicrobatch | ScaleStmt | SeedStmt
            | OpStmt)


# ---- top-level statements -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StrategyStmt:
    name: StringValue
    span: Span


@dataclass(frozen=True, slots=True)
class ModelStmt:
    name: Name | None
    block: Block | None
    span: Span


@dataclass(frozen=True, slots=True)
class PrecisionStmt:
    name: Name | None
    block: Block | None
    span: Span


@dataclass(frozen=True, slots=True)
class AxisEntry:
    name: Name
    value: Value
    block: Block | None
    span: Span


@dataclass(frozen=True, slots=True)
class GroupEntry:
    name: Name
    group: Group
    span: Span


@dataclass(frozen=True, slots=True)
class MeshStmt:
    entries: tuple[AxisEntry | GroupEntry, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class PlaceStmt:
    placement: Placement
    group: Group
    span: Span


@dataclass(frozen=True, slots=True)
class RecomputeStmt:
    call: Call
    span: Span


@dataclass(frozen=True, slots=True)
class OffloadStmt:
    states: tuple[Name, ...]
    device: Name | None
    span: Span


@dataclass(frozen=True, slots=True)
class LossStmt:
    call: Call
    span: Span


@dataclass(frozen=True, slots=True)
class ClipStmt:
    entries: tuple[Entry, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class LossScaleStmt:
    kind: Name
    span: Span


@dataclass(frozen=True, slots=True)
class StepStmt:
    items: tuple[StepItem, ...]
    span: Span


Statement = (StrategyStmt | ModelStmt | PrecisionStmt | MeshStmt | PlaceStmt | RecomputeStmt
             | OffloadStmt | LossStmt | MicrobatchesStmt | ClipStmt | LossScaleStmt | StepStmt)


@dataclass(frozen=True, slots=True)
class File:
    statements: tuple[Statement, ...]
    span: Span
