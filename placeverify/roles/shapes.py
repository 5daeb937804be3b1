"""What the roles' shape checks report through: a divisibility rule and the reporter it uses.

The rules are the ones Megatron-LM asserts; each role's checks (in its module) cite where.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from placeverify.diagnostics import Code, Span


class Reporter(Protocol):
    """Where a shape check reports an error (the lowering's context)."""

    def error(self, message: str, code: Code, span: Span | None, *notes: str) -> None: ...


def need(ctx: Reporter, what: str, value: int, by: Sequence[tuple[str, int]], at: Span,
         *notes: str) -> None:
    """``value`` must be divisible by the product of the named factors ``by``; say so if not."""
    divisor = math.prod(size for _, size in by)
    if value % divisor == 0:
        return
    if len(by) == 1:
        shown = f"{by[0][0]} ({divisor:,})"
    else:
        shown = (" x ".join(name for name, _ in by) + " ("
                 + " x ".join(f"{size:,}" for _, size in by) + f" = {divisor:,})")
    ctx.error(f"{shown} does not divide {what} ({value:,})", Code.NOT_DIVISIBLE, at, *notes)
