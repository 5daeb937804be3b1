"""Per-group meshes: a data-parallel preset placed over a product group (``place zero1 over
dp * cp``), as Megatron-LM's distributed optimizer shards over data x context ranks.

A data preset (``ddp``, ``zero1``, ``zero2``, ``zero3``, ``fsdp``) over a product ``a * b`` says
that the preset's states are reduced and sharded over the whole product: each rank of the product
group holds 1/|a * b| of every sharded state. It lowers to one column of the mode matrix per axis,
so memory, traffic and every verdict read the same per-axis IR as before:

* an axis of the product that no other statement places becomes a data axis with the preset's
  modes (``place zero1 over dp * dp2`` is ``place zero1 over dp`` and ``place zero1 over dp2``);
* an axis that a ``context`` statement places keeps its role and its activations' mode and takes
  the preset's Ω and G modes (``place context over cp`` with ``place zero1 over dp * cp`` is
  ``place context(R, S, R, S) over cp``). A preset that shards the parameters (``zero3``,
  ``fsdp``) over a context axis is not modelled (the context role holds whole layers: Θ = R);
* an expert axis in the product is not modelled: the expert column has one mode per state for
  the experts, and the dense groups' optimizer sharded along it would need a mode per group;
* a tensor or pipeline axis in the product is an error: those ranks hold different parameters,
  not copies whose states a data preset could shard.
"""

from __future__ import annotations

from dataclasses import replace

from placeverify.diagnostics import Code, Span
from placeverify.ir.placement import AxisPlacement, Mode, Role
from placeverify.lower.values import Context, at


def merge(ctx: Context, product: AxisPlacement, other: AxisPlacement) -> AxisPlacement | None:
    """The column of an axis that a data preset over a product and another statement both
    place; None (with an error) when the two do not combine."""
    where = f"'{product.preset}' over a product group (line {product.span.line})"
    if other.role is Role.CONTEXT:
        if product.modes[0] is not Mode.R:
            ctx.error(f"{where} shards the parameters over the context axis '{other.axis}': "
                      "not modelled", Code.BAD_VALUE, product.span,
                      "a context axis holds whole layers (Θ = R); shard the parameters over the "
                      "data axes only, and the optimizer state with 'zero1' or 'zero2' over the "
                      "product")
            return None
        modes = (other.modes[0], product.modes[1], product.modes[2], other.modes[3])
        return replace(other, modes=modes)
    if other.role is Role.EXPERT:
        ctx.error(f"{where} includes the expert axis '{other.axis}': not modelled",
                  Code.BAD_VALUE, product.span,
                  "the expert column has one mode per state; sharding the dense groups' "
                  "optimizer state along it needs a mode per parameter group")
        return None
    if other.role is Role.DATA:
        ctx.error(f"axis '{other.axis}' is placed twice", Code.DUPLICATE, product.span,
                  f"first placed at {at(other.span)}")
        return None
    ctx.error(f"{where} includes '{other.axis}', a {other.role.value} axis", Code.BAD_VALUE,
              product.span, "a data preset shards copies of the same parameters: its product "
                            "group has data and context axes only")
    return None


def product_placements(name: str, role: Role, modes: tuple[Mode, Mode, Mode, Mode],
                       axes: tuple[str, ...], span: Span,
                       options: dict[str, object]) -> list[AxisPlacement]:
    """One data column per axis of the product, each with the preset's modes and options."""
    return [AxisPlacement(axis, role, modes, name, span, **options)  # type: ignore[arg-type]
            for axis in axes]
