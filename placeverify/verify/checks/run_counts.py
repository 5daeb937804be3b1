"""Counts across steps: does each optimizer step normalise by its own window's count?

Judged in the exponent domain of :mod:`placeverify.semantics.counters` (the buffer rules run on
one window, a buffer being the set of net exponents along its paths of the counts that span
steps, ``tokens(G, run)`` and ``tokens(G, batch)``): one obligation per parameter group, refuted
at the first step where such a count, holding other steps' tokens there, reaches what a clip or
the update reads, with the exact interpreter's values (the other steps' tokens added to the
count). That the window's own step, each such count read as the step's, is right is judged by
the other obligations on its per-step projection.
"""

from __future__ import annotations

from placeverify.ir.model import ParamGroup
from placeverify.ir.step import Scope
from placeverify.ir.strategy import Strategy
from placeverify.semantics.counters import Counted, before, counted, first_run_span, windows_judged
from placeverify.semantics.schedule import Unmodelled
from placeverify.verdicts import Obligation
from placeverify.verify.checks.across_steps import Found, per_group

METHOD = "exponents of the counts across steps over the buffer rules (semantics/counters.py)"


def run_count_obligations(strategy: Strategy) -> list[tuple[Obligation, int | None]]:
    """Per parameter group: the obligation, and the window (micro-batches) of the refuted step."""
    sizes = windows_judged(strategy)
    k = len(sizes)
    span = first_run_span(strategy.step) or strategy.step.span

    def judge(group: ParamGroup) -> Found | None:
        found = counted(strategy, group)
        if found is None:
            return None
        reason = (f"{_what(found, k)}, while single-device training normalises step "
                  f"{found.step} by its own window{_exact(strategy, group, found)}")
        return Found(found.step, span, reason, "count the step's own window: write (..., step) "
                     "(reset the count at every optimizer step)", sizes[found.step - 1])

    return per_group(
        strategy, k,
        lambda group: (f"each of the {k} optimizer steps normalises the {group.value} gradients "
                       "by its own window's count (no count carries from one step to the next)"),
        judge, "asynchronous collectives with a count across optimizer steps (each window's "
        "step is judged on its outcomes; what the count adds is not)", span, METHOD)


def _what(found: Counted, k: int) -> str:
    """What the counts of the refutation take in at its step."""
    parts = []
    for (kind, axes, scope), _ in found.exponents:
        name = f"{kind.value}({', '.join([*axes, scope.value])})"
        if scope is Scope.RUN:
            earlier = list(range(1, found.step))
            parts.append(f"{name} is never reset: at step {found.step} it also counts the "
                         f"micro-batches of {_steps(earlier)}")
        else:
            others = [i for i in range(1, k + 1) if i != found.step]
            parts.append(f"{name} counts the whole batch of the {k} steps: at step {found.step} "
                         f"it also counts the micro-batches of {_steps(others)}")
    return "; ".join(parts)


def _steps(steps: list[int]) -> str:
    return f"step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}"


def _exact(strategy: Strategy, group: ParamGroup, found: Counted) -> str:
    """The exact interpreter's values at that step on a small instance (two ranks per axis with
    more than one, one token and sample per micro-batch), or nothing where it cannot run it."""
    from placeverify.semantics.groups import group_view
    from placeverify.semantics.interpreter import atoms, run, uniform_instance
    from placeverify.semantics.steps import projection

    m = windows_judged(strategy)[found.step - 1]
    window = projection(strategy, m)
    sizes = {a.name: min(a.size, 2) for a in strategy.mesh.axes}
    try:
        view = group_view(window, group)
        instance = uniform_instance(window, view, sizes, m)
        keys = atoms(view, sizes, m)
        instance = type(instance)(instance.sizes, m, instance.tokens, instance.samples,
                                  instance.grads, before(strategy, keys, instance.tokens,
                                                         instance.samples, found.step))
        result = run(window, view, instance)
    except Unmodelled:
        return ""
    wrong = result.mismatches()
    if not wrong:
        return ""
    device = wrong[0][1]
    where = ", ".join(f"{a} {c}" for a, c in device.coords.items()) or "the device"
    return (f" (one token per micro-batch: rank ({where}) consumes {device.consumed} where the "
            f"single-device gradient is {result.reference})")
