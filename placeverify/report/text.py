"""The human report: placement matrix, memory per state, communication by collective, verdicts."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from placeverify.console import print_table
from placeverify.cost import CATEGORIES, Costs, whole
from placeverify.ir.model import Transformer
from placeverify.ir.placement import STATES, Overlap, Reduce, Role, Schedule, TensorOverlap
from placeverify.report import units
from placeverify.report.data import formulas_document, overrides_text, step_lines
from placeverify.report.sizes_text import declared_sizes, render_every_size, render_every_size_verdicts
from placeverify.report.styles import VERDICT_STYLE
from placeverify.report.time_text import render_time
from placeverify.result import CheckResult
from placeverify.verdicts import CONDITIONS, Verdict


def human_bytes(value: Any) -> str:
    """Decimal units, as the ZeRO paper reports them (GB = 1e9 bytes), at four significant
    digits (``--json`` has the exact figures)."""
    return units.size(value, digits=4)


def both_units(value: Any) -> str:
    """Decimal and binary: ``29.35 GB (27.33 GiB)`` (torch.cuda and nvidia-smi count in GiB);
    not in a column, so without trailing zeros (``80 GB``, as a device is written)."""
    return f"{_trimmed(human_bytes(value))} ({_trimmed(units.binary(value))})"


def _trimmed(text: str) -> str:
    number, _, unit = text.partition(" ")
    return f"{number.rstrip('0').rstrip('.') if '.' in number else number} {unit}"


def human_seconds(value: Fraction | None) -> str:
    if value is None:
        return ""
    s = float(value)
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def architecture_line(a: Transformer) -> str:
    """The architecture's sizes, on the model line."""
    heads = (f"{a.heads} heads (latent attention, kv rank {a.latent.kv_rank}"
             + (f", q rank {a.latent.q_rank}" if a.latent.q_rank else "") + ")"
             if a.latent is not None else f"{a.heads} heads ({a.kv_heads} kv"
             + (f", {a.head_dim} wide" if a.head_size else "") + ")")
    experts = (f", {a.experts} experts top-{a.top_k}"
               + (f" + {a.shared_experts} shared" if a.shared_experts else "")
               + (f" in {a.moe_layers} of the layers" if a.mixed_layers else "")
               if a.moe else "")
    return (f"{a.layers} layers, hidden {a.hidden}, {heads}, seq {a.seq}, "
            f"micro-batch {a.micro_batch}{experts}")


def render_check(result: CheckResult, console: Console, formulas: bool = False) -> None:
    s = result.strategy
    costs = result.costs
    console.print(Text(s.name, style="bold"), Text(f"  ({s.source.path})", style="dim"))
    if s.overrides:
        console.print(f"overrides: {overrides_text(s)}", style="bold")
    model = s.model
    if model.arch is None:
        console.print(f"model      {model.name}: {model.params:,} parameters (bare count)")
    else:
        console.print(f"model      {model.name}: {model.params:,} parameters; "
                      + architecture_line(model.arch))
    p = s.precision
    console.print(f"precision  {p.name}: Θ {p.params} B, Ω {p.optimizer} B, G {p.grads} B, "
                  f"A {p.activations} B per element; loss scaling {s.loss_scale}")
    policy = [f"Θ gathered in {p.gather_dtype} ({p.gathered} B)"] if p.gather_dtype else []
    policy += [f"G reduced in {p.reduce_dtype} ({p.reduced} B)"] if p.reduce_dtype else []
    if p.gather_dtype or p.compute:
        policy.append(f"matmuls in {p.matmul}")
    if policy:
        console.print("           policy: " + ", ".join(policy))
    mesh = " x ".join(f"{a.name} {a.size}" for a in s.mesh.axes)
    console.print(f"mesh       {mesh} = {s.mesh.world:,} devices")
    console.print()

    console.print(Text("placement (mode per state and mesh axis)", style="bold"))
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("state")
    for placement in s.placements:
        table.add_column(f"{placement.axis} ({placement.role.value})", justify="center")
    for state in STATES:
        table.add_row(f"{state.symbol} {state.value}",
                      *[placement.mode(state).value for placement in s.placements])
    table.add_row(Text("preset", style="dim"),
                  *[Text(_preset_label(placement), style="dim") for placement in s.placements])
    print_table(console, table)
    extras = []
    for placement in s.placements:  # per-group meshes: groups placed over an axis by their own
        for group, _ in placement.group_modes:
            extras.append(f"{group} over {placement.axis}: "
                          + ", ".join(f"{st.symbol} {placement.mode_of(st, group).value}"
                                      for st in STATES[:3]))
    split = [p.axis for p in s.placements if p.experts_split]
    if split:  # place expert over tp * ep (lower/expert_mesh.py)
        group = " x ".join([*split, *s.axes(Role.EXPERT)])
        extras.append(f"experts over {' x '.join(split)}: whole experts (expert group {group})")
    if s.recompute.kind.value != "none":
        extras.append(f"recompute {s.recompute.kind.value}"
                      + (f" (every {s.recompute.every} layers)" if s.recompute.every > 1 else "")
                      + ("" if s.recompute.restore_rng else " (RNG state not restored)"))
    if s.offloaded:
        extras.append("offloaded: " + ", ".join(sorted(x.value for x in s.offloaded)))
    if extras:
        console.print("  " + "; ".join(extras))
        console.print()

    _render_memory(costs, s.mesh.device_memory, console)
    _render_comm(costs, console)
    if costs.bubble is not None:
        idle = costs.idle()
        assert idle is not None
        vm = "v·m" if s.pipeline is not None and s.pipeline.schedule is Schedule.INTERLEAVED \
            else "m"
        console.print(f"pipeline bubble  {float(Fraction(idle)):.2%} of the step idle "
                      f"((p − 1)/({vm} + p − 1)); bubble / compute "
                      f"{float(Fraction(costs.bubble)):.2%} ((p − 1)/({vm}))")
        console.print()
    if result.time is not None:
        render_time(result.time, console)
    _render_step(result, console)
    if result.verification is not None:
        render_verification(result, console)
    if formulas and result.formulas is not None:
        _render_formulas(result.formulas, console)


def _preset_label(placement: Any) -> str:
    label = str(placement.preset)
    if placement.sequence_parallel and label != "sp":  # the sp preset says it already
        label += "+sp"
    if placement.overlap is TensorOverlap.ALL:
        label += "+overlap"
    elif placement.overlap is TensorOverlap.BACKWARD:
        label += " overlap=backward"
    if placement.reduce is Reduce.STEP:
        label += " reduce=step"
    if placement.data_overlap is not Overlap.ALL:
        label += f" overlap={placement.data_overlap.value}"
    if placement.schedule is not None:
        label += f" {placement.schedule.value}"
        if placement.chunks > 1:
            label += f" v={placement.chunks}"
        label += f" m={placement.microbatches}"
        if placement.layers is not None:
            label += " layers=" + runs(placement.layers)
    return label


def runs(counts: tuple[int, ...]) -> str:
    """A list of counts with runs shortened: ``7,8x14,7``."""
    parts: list[str] = []
    for n, group in itertools.groupby(counts):
        k = len(list(group))
        parts.append(f"{n}x{k}" if k > 2 else ",".join([str(n)] * k))
    return ",".join(parts)


def _render_ranks(costs: Costs, console: Console) -> None:
    """The per-stage table, when the pipeline stages hold different amounts."""
    rows = [(r, costs.rank_bytes(r)) for r in costs.ranks]
    if len({whole(b["total"]) for _, b in rows}) < 2:
        return
    console.print(Text("memory per pipeline stage (the fullest decides)", style="bold"))
    table = Table(box=box.SIMPLE_HEAD)
    for name in ("stage", "stages", "Θ", "Ω", "G", "A", "A outside", "buffers", "total"):
        table.add_column(name, justify="left" if name.startswith("stage") else "right")
    for rank, device in rows:
        stages = rank.kind.stages
        # a kind of several stages shows its first, the fullest (the most micro-batches in flight)
        where = str(stages[0]) if len(stages) == 1 else f"{stages[0]}-{stages[-1]} (at {stages[0]})"
        mark = " (fullest)" if rank.items == costs.memory else ""
        table.add_row(rank.kind.name + mark, where,
                      *(human_bytes(device[c]) for c in (*CATEGORIES, "total")))
    print_table(console, table)


def _render_memory(costs: Costs, capacity: int | None, console: Console) -> None:
    _render_ranks(costs, console)
    console.print(Text("memory per device" + (" (the fullest stage)" if len(costs.ranks) > 1
                                              else ""), style="bold"))
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("state")
    table.add_column("bytes", justify="right")
    table.add_column("", style="dim")
    device = costs.device_bytes()
    labels = {"params": "Θ params", "optimizer": "Ω optimizer", "gradients": "G gradients",
              "activations": "A activations", "outside_layers": "A outside the layers",
              "buffers": "buffers"}
    details: dict[str, list[str]] = {c: [] for c in CATEGORIES}
    for item in costs.memory:
        if not item.host and item.category in ("buffers", "outside_layers"):
            details[item.category].append(item.label)
    if costs.activations is not None:
        details["activations"].append(costs.activations.in_flight_rule)
    elif costs.strategy.model.arch is None:
        details["activations"].append("not modelled: the model is a bare parameter count")
    for c in CATEGORIES:
        table.add_row(labels[c], human_bytes(device[c]), "; ".join(details[c]))
    table.add_row(Text("total", style="bold"), Text(human_bytes(device["total"]), style="bold"), "")
    host = costs.host_bytes()
    if Fraction(host):
        table.add_row("host (offloaded)", human_bytes(host), "")
    print_table(console, table)
    peak = costs.peak
    if peak is not None:
        console.print(f"peak       {human_bytes(peak.bytes)} at the {peak.peak.describe()} "
                      f"(profile {peak.profile}; persistent states {human_bytes(peak.persistent)})")
        for note in dict.fromkeys(n for m in peak.moments for n in m.not_modelled):
            console.print(f"           not modelled: {note}")
    reserve = costs.strategy.mesh.reserve
    if capacity is not None:
        total = costs.needed_bytes()
        what = "peak + reserve" if reserve else "peak"
        if total <= capacity:
            console.print(f"fits       {what} {both_units(total)} of {both_units(capacity)} "
                          f"({total / capacity:.1%}); headroom {human_bytes(capacity - total)}",
                          style="green")
        else:
            console.print(f"DOES NOT FIT  {what} {both_units(total)} > {both_units(capacity)} "
                          f"device memory (over by {human_bytes(total - capacity)})",
                          style="bold red")
    console.print()


def _render_comm(costs: Costs, console: Console) -> None:
    if not costs.comm:
        console.print("communication  none")
        console.print()
        return
    timed = any(c.seconds is not None for c in costs.comm)
    console.print(Text("communication per device per step", style="bold"))
    table = Table(box=box.SIMPLE_HEAD)
    for column, justify in (("collective", "left"), ("over", "left"), ("what", "left"),
                            ("calls", "right"), ("bytes", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    if timed:
        table.add_column("time", justify="right")
    for c in costs.comm:
        over = " x ".join(c.axes) if c.axes else "pcie"
        row = [c.op, over, c.what, f"{whole(c.calls):,}", human_bytes(c.bytes)]
        if timed:
            row.append(human_seconds(c.seconds))
        table.add_row(*row)
    table.add_row(Text("total (network)", style="bold"), "", "", "",
                  Text(human_bytes(costs.network_bytes()), style="bold"))
    print_table(console, table)
    console.print(f"  gradient and parameter traffic: {human_bytes(costs.state_bytes())}"
                  + (f"; host <-> device: {human_bytes(costs.pcie_bytes())}"
                     if Fraction(costs.pcie_bytes()) else ""))
    console.print()


def _render_step(result: CheckResult, console: Console) -> None:
    s = result.strategy
    title = "step (canonical, derived from the placement)" if s.step.canonical else "step"
    if len(s.step.windows) > 1:  # several optimizer steps (semantics/steps.py)
        console.print(Text(f"{title}, {len(s.step.windows)} optimizer steps of "
                           f"{', '.join(map(str, s.step.windows))} micro-batches", style="bold"))
    else:
        console.print(Text(f"{title}, {s.step.microbatches} micro-batch"
                           f"{'es' if s.step.microbatches != 1 else ''}", style="bold"))
    for row in step_lines(s):
        line = "" if s.step.canonical or row["line"] is None else f"{row['line']:>4}  "
        console.print(f"  {line}{row['phase']:<17} {row['op']}")
    console.print()


def render_verification(result: CheckResult, console: Console) -> None:
    verification = result.verification
    assert verification is not None
    s = result.strategy
    sized = result.every_size
    if sized is None:
        console.print(Text("verdicts", style="bold"),
                      Text(f"at {declared_sizes(s)} (the file's sizes; --every-size for every "
                           "size)", style="dim"))
        for condition in CONDITIONS:
            verdict = verification.verdict(condition)
            console.print(f"  {condition.label:<22}", Text(verdict.value, style=VERDICT_STYLE[verdict]))
    else:
        render_every_size_verdicts(result, console)
    for o in verification.obligations:
        if o.verdict is Verdict.PROVED:
            continue
        where = f"{s.source.path}:{o.span.line}:{o.span.column}" if o.span else s.source.path
        console.print()
        console.print(Text(f"{where}: {o.verdict.value}: {o.condition.label}: {o.claim}",
                           style=VERDICT_STYLE[o.verdict]))
        if o.reason:
            console.print(f"  {o.reason}")
        if o.fix:
            console.print(Text(f"  fix: {o.fix}", style="cyan"))
    if verification.trace is not None:
        console.print()
        from placeverify.report.trace_text import render_trace  # deferred: refutations only

        render_trace(verification.trace, console)
    if sized is not None:
        render_every_size(result, console)
    console.print()
    proved = sum(o.verdict is Verdict.PROVED for o in verification.obligations)
    every = "" if sized is None else f"; every size in {sized.seconds:.2f} s"
    console.print(f"{len(verification.obligations)} obligations ({proved} proved) in "
                  f"{verification.seconds:.2f} s{every}", style="dim")


def _render_formulas(costs: Costs, console: Console) -> None:
    doc = formulas_document(costs)
    console.print(Text("closed forms (SymPy)", style="bold"))
    for key, value in doc["memory"].items():
        console.print(f"  memory {key:<12} = {value}")
    if doc["host"] != "0":
        console.print(f"  host memory         = {doc['host']}")
    for item in doc["communication"]:
        over = "x".join(item["axes"]) or "pcie"
        console.print(f"  {item['op']} over {over} ({item['what']}) = {item['bytes']}")
    if doc["bubble"] is not None:
        console.print(f"  bubble / compute = {doc['bubble']}")
        console.print(f"  idle share = {doc['idle']}")
    symbols = ", ".join(f"{k} = {v:,}" if isinstance(v, int) else f"{k} = {v}"
                        for k, v in doc["symbols"].items())
    console.print(Text(f"  where {symbols}", style="dim"))
    console.print()
