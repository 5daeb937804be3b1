"""Memory a user can launch on (issue 13): layout fixes, ZeRO-Offload, the bubble's label, the
fullest pipeline stage, activations outside the layers, sequence-parallel re-gather traffic.

Every expected number is derived here by hand from the cited source, never by calling the cost
model on another input.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from placeverify.cost import analyse
from placeverify.diagnostics import PlaceError
from placeverify.ir.placement import Mode, State
from placeverify.lower import load_text

F = Fraction
PSI = 7_500_000_000  # a bare parameter count: no architecture, no gather unit


# ---- 1. hsdp honours the order the group is written in ---------------------------------------

HSDP = """model {{ params = 7.5e9 }}
mesh {{ {mesh} }}
place hsdp over {group}
"""


@pytest.mark.parametrize("mesh", ["shard = 8, replica = 4", "replica = 4, shard = 8"])
def test_hsdp_shards_over_the_first_named_axis(mesh: str) -> None:
    s = load_text(HSDP.format(mesh=mesh, group="shard * replica"))
    assert s.placement("shard").mode(State.PARAMS) is Mode.S_STAR
    assert s.placement("replica").mode(State.PARAMS) is Mode.R
    device = analyse(s).device_bytes()
    # mixed_adam: Θ 2, G 2, Ω 12 bytes per parameter, all sharded over the 8 shard ranks only
    assert device["params"] == F(2 * PSI, 8)
    assert device["optimizer"] == F(12 * PSI, 8)
    assert device["gradients"] == F(2 * PSI, 8)


def test_hsdp_written_the_other_way_shards_over_replica() -> None:
    s = load_text(HSDP.format(mesh="shard = 8, replica = 4", group="replica * shard"))
    assert s.placement("replica").mode(State.PARAMS) is Mode.S_STAR
    assert analyse(s).device_bytes()["params"] == F(2 * PSI, 4)


@pytest.mark.parametrize("group", ["world", "both", "(shard, replica)"])
def test_hsdp_over_a_group_that_hides_the_order_is_rejected(group: str) -> None:
    mesh = "replica = 4, shard = 8, group both = shard * replica"
    with pytest.raises(PlaceError) as raised:
        load_text(HSDP.format(mesh=mesh, group=group))
    text = str(raised.value)
    assert "shard axis first" in text
    assert ":3:17:" in text or "3:17" in text
