"""Pictures of a check and of a search: memory per rank kind, the pipeline schedule, the frontier.

Drawn with matplotlib, an optional extra (``pip install 'placeverify[plot]'``), imported only
inside the functions that draw: ``placeverify check`` without ``--plot`` never loads it
(``tests/test_layers.py``). Every function writes one file whose format its suffix names
(``.png`` or ``.svg``, :data:`FORMATS`); figures are drawn on a bare :class:`Figure`, never
through ``pyplot``, so no window opens and no global backend is chosen.

- :func:`memory_chart`: one stacked bar per rank kind of a check result (only, or first / middle
  / last pipeline stage), by category (params, optimizer, gradients, activations,
  outside_layers, buffers), with each kind's peak over the step and the device's capacity and
  capacity less the reserve as lines.
- :func:`schedule_chart`: the pipeline schedule (GPipe, 1F1B, interleaved 1F1B) as a stage × time
  Gantt chart, forward 1 unit of time per stage and backward 2 (the step-time model's ratio),
  ÷ v per model chunk; a strategy without a pipeline gets a figure that says so.
- :func:`frontier_chart`: peak memory against predicted step time for a list of
  :class:`FrontierPoint`, the Pareto frontier drawn as a line and the chosen point marked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from placeverify.cost import CATEGORIES
from placeverify.ir.placement import Schedule

if TYPE_CHECKING:
    from placeverify.ir.strategy import Strategy
    from placeverify.result import CheckResult

FORMATS = (".png", ".svg")
GB = 1e9  # the check report's unit (decimal, as device_memory = 80 GB)
GIB = 2**30

COLOURS = {"params": "#4c72b0", "optimizer": "#dd8452", "gradients": "#55a868",
           "activations": "#c44e52", "outside_layers": "#8172b3", "buffers": "#937860"}


class PlotUnavailable(Exception):
    """matplotlib is not installed (the ``plot`` extra)."""


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    """One layout in a frontier chart.

    ``label`` names it in the chart (e.g. ``"tp8 pp4 dp32 zero1"``), ``peak_bytes`` is its
    predicted peak memory per device in bytes, ``step_seconds`` its predicted step time, and
    ``on_frontier`` whether it is on the Pareto frontier of peak memory against step time (no
    other point is at most as large in both and smaller in one); the caller decides it."""

    label: str
    peak_bytes: int
    step_seconds: float
    on_frontier: bool


def check_format(path: str) -> str:
    """The format a path's suffix names (``png`` or ``svg``); ValueError for any other."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"{path}: a plot is written as .png or .svg, not "
                         f"{suffix or 'a file without a suffix'}")
    return suffix[1:]


def available() -> bool:
    """Whether matplotlib can be imported (it is, when it can: call only for a plot)."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return False
    return True


def schedule_path(path: str) -> str:
    """Where ``check --plot FILE.png`` writes the schedule: ``FILE-schedule.png``."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}-schedule{p.suffix}"))


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise PlotUnavailable("plotting needs matplotlib: pip install 'placeverify[plot]'") \
            from error
    return Figure(figsize=(width, height), layout="constrained")


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text


def _save(figure: Any, path: str) -> None:
    from matplotlib import rc_context

    fmt = check_format(path)
    # SVG: text as <text> elements (searchable, smaller), no date (the same chart, the same bytes)
    metadata = {"Date": None} if fmt == "svg" else None
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "placeverify"}):
        figure.savefig(path, format=fmt, dpi=100, metadata=metadata)


# ---- memory ------------------------------------------------------------------------------------


def memory_chart(result: CheckResult, path: str) -> None:
    """Per-rank-kind memory of a check result, stacked by category, in GB (10⁹ bytes)."""
    costs = result.costs
    mesh = result.strategy.mesh
    ranks = costs.ranks
    names = [r.kind.name for r in ranks] or ["device"]
    stacks = ([{c: float(costs.rank_bytes(r)[c]) / GB for c in CATEGORIES} for r in ranks]
              or [{c: float(costs.device_bytes()[c]) / GB for c in CATEGORIES}])
    peaks: dict[str, float] = {}
    if costs.peak is not None:
        for moment in costs.peak.moments:
            peaks[moment.rank] = max(peaks.get(moment.rank, 0.0), float(moment.total) / GB)

    figure = _figure(max(6.5, 3.5 + 1.3 * len(names)), 4.5)
    ax = figure.add_subplot()
    xs = list(range(len(names)))
    bottoms = [0.0] * len(names)
    for category in CATEGORIES:
        heights = [stack[category] for stack in stacks]
        if not any(heights):
            continue
        ax.bar(xs, heights, 0.6, bottom=bottoms, label=category, color=COLOURS[category])
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for x, name in zip(xs, names, strict=True):
        if name in peaks:
            ax.hlines(peaks[name], x - 0.4, x + 0.4, colors="black", linewidth=2)
            ax.annotate(f"peak {peaks[name]:.3g}", (x, peaks[name]), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8)
    if mesh.device_memory is not None:
        capacity = mesh.device_memory / GB
        ax.axhline(capacity, color="black", linestyle="--", linewidth=1,
                   label=f"device memory {capacity:.3g} GB")
        if mesh.reserve:
            usable = (mesh.device_memory - mesh.reserve) / GB
            ax.axhline(usable, color="grey", linestyle=":", linewidth=1,
                       label=f"less the reserve {usable:.3g} GB")
    ax.set_xticks(xs, [n if n in ("only", "device") else f"{n} stage" for n in names])
    ax.set_ylabel("GB per device (10⁹ bytes)")
    ax.set_title(_wrap(f"memory per device: {result.strategy.name}", 60), fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(figure, path)


# ---- the pipeline schedule ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Op:
    """One forward or backward of one micro-batch on one model chunk of one stage."""

    stage: int
    chunk: int  # model chunk on the stage (0 unless interleaved)
    microbatch: int
    backward: bool
    start: float
    end: float


def stage_orders(schedule: Schedule, p: int, m: int, v: int) -> list[list[tuple[bool, int, int]]]:
    """The order in which each stage runs its work: (backward?, chunk, micro-batch).

    GPipe: every forward, then every backward. 1F1B (Narayanan et al. 2021 §2.2.1): stage s runs
    min(p - s - 1, m) warm-up forwards, then one forward and one backward in turn, then the
    remaining backwards. Interleaved (Megatron-LM's ``forward_backward_pipelining_with_
    interleaving``): virtual micro-batch k is chunk (k // p) mod v of micro-batch
    (k // (p v)) p + k mod p, backwards in the mirrored chunk order; (p - s - 1)·2 + (v - 1)·p
    warm-up forwards."""
    orders: list[list[tuple[bool, int, int]]] = []
    for s in range(p):
        if schedule is Schedule.GPIPE:
            orders.append([(False, 0, i) for i in range(m)] + [(True, 0, i) for i in range(m)])
            continue
        if schedule is Schedule.INTERLEAVED and v > 1:
            total = m * v

            def virtual(k: int, backward: bool) -> tuple[bool, int, int]:
                chunk = (k // p) % v
                mb = (k // (p * v)) * p + k % p
                return (backward, v - 1 - chunk if backward else chunk, mb)

            warmup = min(total, (p - s - 1) * 2 + (v - 1) * p)
        else:
            total = m

            def virtual(k: int, backward: bool) -> tuple[bool, int, int]:
                return (backward, 0, k)

            warmup = min(m, p - s - 1)
        order = [virtual(k, False) for k in range(warmup)]
        for i in range(total - warmup):
            order.append(virtual(warmup + i, False))
            order.append(virtual(i, True))
        order.extend(virtual(k, True) for k in range(total - warmup, total))
        orders.append(order)
    return orders


def simulate(schedule: Schedule, p: int, m: int, v: int = 1) -> list[Op]:
    """Run each stage's order as soon as its input is there: a forward after the previous
    virtual stage's forward of the same micro-batch, a backward after the next one's backward
    (the last virtual stage's after its own forward). Forward takes 1/v, backward 2/v."""
    chunks = v if schedule is Schedule.INTERLEAVED else 1
    orders = stage_orders(schedule, p, m, chunks)
    fwd, bwd = 1.0 / chunks, 2.0 / chunks
    last = p * chunks - 1
    done: dict[tuple[bool, int, int], float] = {}  # (backward, virtual stage, mb) -> end
    free = [0.0] * p
    position = [0] * p
    ops: list[Op] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while position[s] < len(orders[s]):
                backward, chunk, mb = orders[s][position[s]]
                vstage = chunk * p + s
                dep: tuple[bool, int, int] | None = None
                if backward:
                    dep = (False, last, mb) if vstage == last else (True, vstage + 1, mb)
                elif vstage > 0:
                    dep = (False, vstage - 1, mb)
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done[dep] if dep is not None else 0.0)
                end = start + (bwd if backward else fwd)
                done[(backward, vstage, mb)] = end
                free[s] = end
                ops.append(Op(s, chunk, mb, backward, start, end))
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError(f"the {schedule.value} order deadlocks for p = {p}, m = {m}, v = {v}")
    return ops


def _note(strategy: Strategy, note: str, path: str) -> str:
    figure = _figure(6, 1.5)
    figure.text(0.5, 0.5, _wrap(f"{strategy.name}: {note}", 70), ha="center", va="center")
    _save(figure, path)
    return note


def schedule_chart(strategy: Strategy, path: str) -> str | None:
    """The pipeline schedule of a strategy as a stage × time chart; returns None, or a note
    when there is nothing to draw (no pipeline: the figure says so too)."""
    pipeline = strategy.pipeline
    p = strategy.size(pipeline.axis) if pipeline is not None else 1
    if pipeline is None or p < 2:
        return _note(strategy, "no pipeline: every device runs every layer of each micro-batch "
                     "in turn", path)
    schedule = pipeline.schedule or Schedule.ONE_F_ONE_B
    m = strategy.microbatches
    v = pipeline.chunks if schedule is Schedule.INTERLEAVED else 1
    if v > 1 and m % p:
        return _note(strategy, f"not drawn: the interleaved order groups micro-batches by p, "
                     f"and m = {m} is not a multiple of p = {p}", path)
    ops = simulate(schedule, p, m, v)
    span = max(op.end for op in ops)
    busy = sum(op.end - op.start for op in ops)
    idle = 1 - busy / (span * p)

    figure = _figure(min(18.0, 4 + 0.12 * len(ops) / p), 1.2 + 0.45 * p)
    ax = figure.add_subplot()
    groups: dict[tuple[int, bool, int], list[tuple[float, float]]] = {}
    for op in ops:
        groups.setdefault((op.stage, op.backward, op.chunk), []).append((op.start, op.end - op.start))
    for s in range(p):
        for backward in (False, True):
            for chunk in range(v):
                bars = groups.get((s, backward, chunk), [])
                if not bars:
                    continue
                shade = 0.35 + 0.65 * (chunk + 1) / v
                colour = (0.8 * shade, 0.2, 0.2) if backward else (0.2, 0.4 * shade, 0.9 * shade)
                label = None
                if s == 0:
                    label = ("backward" if backward else "forward") + (
                        f", chunk {chunk}" if v > 1 else "")
                ax.broken_barh(bars, (s - 0.4, 0.8), facecolors=[colour], edgecolor="white",
                               linewidth=0.5 if len(ops) <= 400 else 0, label=label)
    if len(ops) <= 400:
        for op in ops:
            ax.text((op.start + op.end) / 2, op.stage, str(op.microbatch), ha="center",
                    va="center", fontsize=6, color="white")
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.set_xlim(0, span)
    ax.set_xlabel("time (forward of one micro-batch on one stage = 1)")
    name = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B",
            Schedule.INTERLEAVED: "interleaved 1F1B"}[schedule]
    ax.set_title(f"pipeline schedule: {name}, p = {p}, m = {m}" + (f", v = {v}" if v > 1 else "")
                 + f"; idle {idle:.1%}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(figure, path)
    return None


# ---- the frontier ------------------------------------------------------------------------------


def frontier_chart(points: list[FrontierPoint], chosen: FrontierPoint | None, path: str,
                   capacity: int | None = None, reserve: int = 0) -> None:
    """Write :func:`frontier_figure` to ``path``."""
    _save(frontier_figure(points, chosen, capacity, reserve), path)


def frontier_figure(points: list[FrontierPoint], chosen: FrontierPoint | None,
                    capacity: int | None = None, reserve: int = 0) -> Any:
    """Peak memory (GB, as the check report) against predicted step time (s): every point, the
    frontier as a line through its points in order of memory, each frontier point numbered (its
    label in the key beside the axes: numbers, not labels, sit by the points, placed so that no
    two overlap each other or a point), the chosen point marked, and the device's memory (the
    ``capacity`` that "fits" compares the peak plus the ``reserve`` with) as a vertical line."""
    figure = _figure(9, 4.5)
    ax = figure.add_subplot()
    others = [q for q in points if not q.on_frontier]
    front = sorted((q for q in points if q.on_frontier), key=lambda q: (q.peak_bytes,
                                                                        q.step_seconds))
    if others:
        ax.scatter([q.peak_bytes / GB for q in others], [q.step_seconds for q in others],
                   s=12, color="#999999", label="other layouts")
    if front:
        ax.plot([q.peak_bytes / GB for q in front], [q.step_seconds for q in front], "-o",
                color="#4c72b0", markersize=5, label="Pareto frontier")
    if chosen is not None:
        ax.scatter([chosen.peak_bytes / GB], [chosen.step_seconds], s=160, marker="*",
                   color="#c44e52", zorder=3, label=f"chosen: {chosen.label}")
    if capacity is not None:
        ax.axvline(capacity / GB, color="black", linestyle="--", linewidth=1,
                   label=f"device memory {capacity / GB:.4g} GB ({capacity / GIB:.4g} GiB)")
    what = "peak + reserve" if reserve else "peak memory"
    ax.set_xlabel(f"{what} per device (GB, 10⁹ bytes)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("layouts: peak memory and step time", fontsize=10)
    if points or chosen is not None or capacity is not None:
        ax.legend(fontsize=8, loc="upper right")
    if front:
        figure.get_layout_engine().set(rect=(0, 0, 0.64, 1))  # the key to the right of the axes
        figure.text(0.65, 0.5, _number_points(figure, ax, front), fontsize=7, family="monospace",
                    ha="left", va="center")
    return figure


Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in display pixels

# Where a point's number may go, in points from the point: near first, then farther out.
_OFFSETS = [(dx * r, dy * r) for r in (5, 10, 16, 24) for dx, dy in
            ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))]


def _number_points(figure: Any, ax: Any, front: list[FrontierPoint]) -> str:
    """Number the frontier points on the axes, each number where it overlaps no other number,
    marker or the legend (the first free place of :data:`_OFFSETS`); the key: number, label,
    peak and step time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas: Any = FigureCanvasAgg(figure)
    canvas.draw()  # lay the axes out first: the places are in display coordinates
    renderer = canvas.get_renderer()
    xy = [(q.peak_bytes / GB, q.step_seconds) for q in front]
    taken: list[Box] = [(x - 4, y - 4, x + 4, y + 4) for x, y in ax.transData.transform(xy)]
    legend = ax.get_legend()
    if legend is not None:
        e = legend.get_window_extent(renderer)
        taken.append((e.x0, e.y0, e.x1, e.y1))
    width = max(len(q.label) for q in front)
    lines = ["frontier: peak, step time"]
    for number, (q, point) in enumerate(zip(front, xy, strict=True), start=1):
        lines.append(f"{number:>2}  {q.label:<{width}}  {q.peak_bytes / GB:>6.4g} GB  "
                     f"{q.step_seconds:>5.3g} s")
        for dx, dy in _OFFSETS:
            text = ax.annotate(str(number), point, xytext=(dx, dy), textcoords="offset points",
                               fontsize=7, ha="left" if dx >= 0 else "right",
                               va="bottom" if dy >= 0 else "top")
            text.set_in_layout(False)  # the axes stay where the places were computed
            e = text.get_window_extent(renderer)
            box = (e.x0, e.y0, e.x1, e.y1)
            if not any(_overlap(box, other) for other in taken) or (dx, dy) == _OFFSETS[-1]:
                break
            text.remove()
        taken.append(box)
    return "\n".join(lines)


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
