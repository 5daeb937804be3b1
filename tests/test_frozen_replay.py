"""A step that updates a frozen group is refuted by a rule over its statements
(verify/checks/frozen.py); a run that keeps the group frozen computes the fine-tune's values
(torch's optimizers skip a parameter whose grad is None), so the replay must not call the
refutation a verifier bug: it says the refutation is not replayed and judges the rest."""

from __future__ import annotations

from placeverify.api import check_strategy
from placeverify.lower import load_text
from placeverify.replay.plan import plan_from_strategy

TEXT = """strategy "s"
model transformer {
    layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 96, seq = 16, micro_batch = 1,
    frozen = [embedding]
}
precision fp32_adam
mesh { dp = 2 }
place ddp over dp
loss sample_mean
step {
    backward sum / samples(dp, step)
    all_reduce(sum) grads over dp
    update params[dense, embedding]
}
"""


def test_the_replay_judges_the_values_and_names_the_rule_it_cannot_replay() -> None:
    strategy = load_text(TEXT, "frozen.place")
    known = check_strategy(strategy).verification
    assert known is not None and known.overall().value == "refuted"
    plan = plan_from_strategy(strategy, known=known)
    assert plan.expect.verdict.value == "proved"  # every obligation about computed values
    [note] = [n for n in plan.notes if n.startswith("not replayed")]
    assert "line 13 (frozen)" in note
