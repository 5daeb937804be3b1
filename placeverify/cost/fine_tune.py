"""Costs of a fine-tune: frozen groups, trained adapters and a quantised base
(``docs/language/model.md``).

- A frozen group keeps its parameters Θ only: no gradient G, no optimizer state Ω (PEFT and
  Megatron-LM set ``requires_grad = False``; the optimizer is built over trained parameters, and
  DeepSpeed's and Megatron's gradient buffers hold only those), and no gradient reduction.
- A quantised base stores the layers' linear weights packed (:meth:`Transformer.quantised_bytes`:
  bitsandbytes' NF4 codes two to a byte, int8 one) beside their scales. The packed weights are
  sharded and all-gathered like Θ (FSDP and ZeRO-3 with ``bnb_4bit_quant_storage``); the scales
  (``Params4bit.quant_state``, ``Int8Params.SCB``) are not parameters the sharding flattens, so
  every rank keeps them whole. The rest of the frozen model stays in Θ's stored dtype.
- Adapters are a group like any other: Θ, G and Ω in the precision's dtypes, reduced over the
  data axes.
"""

from __future__ import annotations

from placeverify.cost.domain import Domain, Num
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import State
from placeverify.ir.strategy import Strategy


def counted(strategy: Strategy, state: State, held: dict[ParamGroup, Num]) -> dict[ParamGroup, Num]:
    """The groups a state has elements of: every held group's Θ, the trained groups' G and Ω."""
    if state is State.PARAMS or not strategy.model.frozen:
        return held
    return {g: n for g, n in held.items() if g not in strategy.model.frozen}


def quantised(d: Domain, strategy: Strategy) -> Num | None:
    """Elements of the quantised layer weights (of the dense group), None without a quantised
    base. Adapters and a quantised base sit on data and context axes only
    (``lower.fine_tune.check_fine_tune``), so these are the whole model's."""
    arch = strategy.model.arch
    if strategy.model.base_dtype is None or arch is None:
        return None
    return d.sym("Ψ_q", arch.quantised_elements())


def packed_bytes(d: Domain, strategy: Strategy) -> tuple[Num, Num]:
    """(the quantised weights' packed bytes, their scales' bytes), whole model."""
    arch = strategy.model.arch
    base = strategy.model.base_dtype
    assert arch is not None and base is not None
    packed, scales = arch.quantised_bytes(base)
    return d.sym(f"B_{base}", packed), d.sym(f"B_{base}_scales", scales)


def stored_params(d: Domain, strategy: Strategy, held: dict[ParamGroup, Num]
                  ) -> dict[ParamGroup, Num]:
    """Θ elements in the stored dtype: the held groups less the quantised weights."""
    q = quantised(d, strategy)
    if q is None:
        return held
    return {**held, ParamGroup.DENSE: held[ParamGroup.DENSE] - q}


def gathered_payload(d: Domain, strategy: Strategy, params: dict[ParamGroup, Num],
                     applies: set[ParamGroup], after_update: bool, per_element: Num) -> Num:
    """Bytes one rank's share of a parameter collective moves: the groups it applies to in
    ``per_element`` bytes, the quantised weights packed. After the update (ZeRO-1/2's
    all-gather of updated shards) only the trained groups moved."""
    frozen = strategy.model.frozen if after_update else frozenset()
    chosen = {g: n for g, n in stored_params(d, strategy, params).items()
              if g in applies and g not in frozen}
    payload: Num = 0
    for n in chosen.values():
        payload = payload + n * per_element
    if quantised(d, strategy) is not None and ParamGroup.DENSE in applies and \
            ParamGroup.DENSE not in frozen:
        packed, _ = packed_bytes(d, strategy)
        payload = payload + packed
    return payload
