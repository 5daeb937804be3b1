"""The abstract syntax tree of a ``.place`` file: one class per rule of ``grammar/placement.lark``.

Nodes are plain, immutable and carry the span of the text they came from; nothing here knows
what a name means (that is lowering's job, in :mod:`placeverify.lower`). Each class is a frozen,
slotted dataclass made by :func:`~placeverify.node.node`, which builds it without
generating code (check start-up time).
"""

from __future__ import annotations

from fractions import Fraction

from placeverify.diagnostics import Span
from placeverify.node import node


@node
class Name:
    text: str
    span: Span


# ---- values ---------------------------------------------------------------------------------


@node
class NumberValue:
    text: str
    value: Fraction
    span: Span


@node
class QuantityValue:
    """A number with a unit: ``80 GB``, ``25 GB/s``, ``2 us``."""

    number: Fraction
    unit: str
    text: str
    span: Span


@node
class StringValue:
    value: str
    span: Span


@node
class NameValue:
    name: Name

    @property
    def span(self) -> Span:
        return self.name.span


@node
class StarredValue:
    """``S*`` (a name followed by a star) inside an argument list."""

    name: Name
    span: Span


@node
class ListValue:
    """``[7, 8, 8, 7]``: a bracketed list of values (a pipeline's layers per stage)."""

    items: tuple[Value, ...]
    span: Span


Value = NumberValue | QuantityValue | StringValue | NameValue | StarredValue | ListValue


# ---- blocks, calls, groups ------------------------------------------------------------------


@node
class Entry:
    key: Name
    value: Value
    span: Span


@node
class Block:
    entries: tuple[Entry, ...]
    span: Span


@node
class KeywordArg:
    key: Name
    value: Value
    span: Span


@node
class PositionalArg:
    value: Value
    span: Span


Arg = KeywordArg | PositionalArg


@node
class Call:
    name: Name
    args: tuple[Arg, ...]
    span: Span


@node
class AxisRef:
    name: Name
    span: Span


@node
class DerivedGroup:
    """``ends(pp)``: a group derived from one axis."""

    function: Name
    axis: Name
    span: Span


@node
class AxisTuple:
    names: tuple[Name, ...]
    span: Span


GroupTerm = AxisRef | DerivedGroup | AxisTuple


@node
class Group:
    terms: tuple[GroupTerm, ...]
    span: Span


# ---- placements -----------------------------------------------------------------------------


@node
class PresetPlacement:
    name: Name
    span: Span


@node
class CallPlacement:
    name: Name
    args: tuple[Arg, ...]
    span: Span


@node
class TuplePlacement:
    args: tuple[Arg, ...]
    span: Span


Placement = PresetPlacement | CallPlacement | TuplePlacement


# ---- loss / scale expressions ----------------------------------------------------------------


@node
class NumberFactor:
    value: NumberValue
    span: Span


@node
class NameFactor:
    name: Name
    span: Span


@node
class CountFactor:
    """``tokens(dp * cp, step)``: a count, summed over groups."""

    name: Name
    groups: tuple[Group, ...]
    span: Span


@node
class SizeFactor:
    """``|dp|``: the number of devices in a group."""

    group: Group
    span: Span


@node
class PowerFactor:
    """``|dp| ^ 0.5``: a group's size raised to a power."""

    group: Group
    exponent: NumberValue
    span: Span


@node
class ParenFactor:
    expr: Expr
    span: Span


Factor = NumberFactor | NameFactor | CountFactor | SizeFactor | PowerFactor | ParenFactor


@node
class Expr:
    """``first (op factor)*`` with op in ``*``, ``/``."""

    first: Factor
    rest: tuple[tuple[str, Factor], ...]
    span: Span


# ---- step statements ------------------------------------------------------------------------


@node
class Target:
    name: Name
    selectors: tuple[Name, ...]
    span: Span


@node
class MicrobatchesStmt:
    value: Value
    span: Span


@node
class BackwardStmt:
    term: Name | None  # ``backward aux: ...``: the named loss term it back-propagates
    expr: Expr
    span: Span


@node
class EachMicrobatch:
    items: tuple[StepItem, ...]
    span: Span


@node
class OnMicrobatch:
    which: Value
    items: tuple[StepItem, ...]
    span: Span


@node
class ScaleStmt:
    target: Target
    expr: Expr
    span: Span


@node
class SeedStmt:
    call: Call
    policy: Name
    group: Group
    span: Span


@node
class OpStmt:
    """``name(args) target over group``: a collective, an update, a clip, a free ...;
    ``unless`` names the flag an update is skipped on (``update params unless overflow``)."""

    name: Name
    args: tuple[Arg, ...]
    target: Target
    group: Group | None
    unless: Name | None
    span: Span


StepItem = (MicrobatchesStmt | BackwardStmt | EachMicrobatch | OnMicrobatch | ScaleStmt | SeedStmt
            | OpStmt)


# ---- top-level statements -------------------------------------------------------------------


@node
class StrategyStmt:
    name: StringValue
    span: Span


@node
class ModelStmt:
    name: Name | None
    block: Block | None
    span: Span


@node
class PrecisionStmt:
    name: Name | None
    block: Block | None
    span: Span


@node
class AxisEntry:
    name: Name
    value: Value
    block: Block | None
    span: Span


@node
class GroupEntry:
    name: Name
    group: Group
    span: Span


@node
class MeshStmt:
    entries: tuple[AxisEntry | GroupEntry, ...]
    span: Span


@node
class PlaceStmt:
    placement: Placement
    group: Group
    groups: PlaceFor | None
    span: Span


@node
class PlaceFor:
    """``for norms, embedding``: the parameter groups a per-group placement places."""

    groups: tuple[Name, ...]
    span: Span


@node
class RecomputeStmt:
    call: Call
    span: Span


@node
class OffloadStmt:
    states: tuple[Name, ...]
    device: Name | None
    span: Span


@node
class LossStmt:
    """``loss token_mean``, or a named term beside it: ``loss aux: token_mean reaches experts``."""

    term: Name | None
    call: Call
    reaches: Reaches | None
    span: Span


@node
class Reaches:
    """``reaches experts, norms``: the parameter groups a loss term's gradient reaches."""

    groups: tuple[Name, ...]
    span: Span


@node
class ClipStmt:
    entries: tuple[Entry, ...]
    span: Span


@node
class LossScaleStmt:
    kind: Name
    span: Span


@node
class UnusedStmt:
    """``unused dense, experts``: parameter groups a micro-batch may leave unused on any rank."""

    groups: tuple[Name, ...]
    span: Span


@node
class EmptyStmt:
    """``empty microbatches``: a micro-batch may hold no token of the loss's kind."""

    what: Name
    span: Span


@node
class StepStmt:
    items: tuple[StepItem, ...]
    span: Span


Statement = (StrategyStmt | ModelStmt | PrecisionStmt | MeshStmt | PlaceStmt | RecomputeStmt
             | OffloadStmt | LossStmt | MicrobatchesStmt | ClipStmt | LossScaleStmt | StepStmt
             | UnusedStmt | EmptyStmt)


@node
class File:
    statements: tuple[Statement, ...]
    span: Span
