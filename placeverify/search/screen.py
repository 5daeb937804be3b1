"""The screen: a layout's peak memory and step time in closed form, in floats, in microseconds.

It follows the cost model (:mod:`placeverify.cost`) term by term, in the megatron memory profile
and for the canonical step of each layout, but without building a strategy: no parsing, no step,
no exact rationals. The layer's saved tensors (:func:`placeverify.cost.activations.saved_tensors`)
and FLOPs (:func:`placeverify.cost.flops.layer_flops`) are the cost model's own functions, called
with floats; what is restated here is the bookkeeping (which state is split by which axis, which
collective runs how often). The screen only chooses which layouts reach the full model
(:mod:`placeverify.search.run`); ``tests/test_search.py`` holds it within a stated tolerance of
the full model on random layouts, and ``benchmarks/search.py`` prints the largest deviation
among the finalists of each search.

Deliberately left out (small next to what is kept, and counted by the full model): the scalar
all-reduces of token counts and norms, the vocab-parallel cross-entropy's all-reduces, the
embedding group's gradient all-reduce, and the implementation profiles' extras (DDP buckets,
optimizer temporaries) of other memory profiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from placeverify.cost.activations import LayerShape, per_layer_bytes, saved_tensors
from placeverify.cost.calibration import CALIBRATION, Calibration
from placeverify.cost.exposure import outlasting, queued, unit_passes
from placeverify.cost.flops import column_flops, ffn_width, layer_flops, output_flops
from placeverify.cost.time import fsdp_units, pace
from placeverify.ir.devices import Device, intra_node, ranks_per_node
from placeverify.ir.model import ParamGroup, Transformer
from placeverify.ir.placement import TensorOverlap
from placeverify.ir.precision import Precision
from placeverify.ir.profiles import layer_kernels
from placeverify.search.space import Layout, Recompute, Sharding


@dataclass(frozen=True, slots=True)
class Estimate:
    peak_bytes: float  # the fullest rank at its peak (megatron profile), before the reserve
    step_seconds: float


@dataclass(frozen=True, slots=True)
class Setting:
    """What every layout of one search shares."""

    arch: Transformer
    precision: Precision
    device: Device
    matmul: str
    pcie_bandwidth: float  # host <-> device bytes per second (offload)
    cal: Calibration = CALIBRATION


class Screen:
    """Estimates for the layouts of one setting; sub-results shared by many layouts are cached."""

    def __init__(self, setting: Setting) -> None:
        self.s = setting
        arch = setting.arch
        prec = setting.precision
        self.P, self.G = float(prec.params), float(prec.grads)
        # Θ as gathered, G as reduced (ir/precision.py: the dtypes check counts them in)
        self.P_gathered, self.G_reduced = float(prec.gathered), float(prec.reduced)
        self.O, self.E = float(prec.optimizer), float(prec.activations)
        self.layer = arch.layer_params()
        self.groups = arch.group_params()
        self.unit = float(arch.largest_unit_params())
        peak = setting.device.peak(setting.matmul)
        if peak is None:
            raise ValueError(f"device '{setting.device.key}' has no {setting.matmul} matmuls")
        self.rate = float(peak) * setting.cal.eta_max(setting.device.compute_key, setting.matmul)
        self.hbm = float(setting.device.memory_bandwidth)
        self._per_layer = lru_cache(maxsize=None)(self._activation_per_layer)
        self._flops = lru_cache(maxsize=None)(self._microbatch_flops)
        self._links_of = lru_cache(maxsize=None)(self._axis_links)
        self._elements = lru_cache(maxsize=None)(self._elements_of)

    # ---- memory ---------------------------------------------------------------------------

    def _activation_per_layer(self, b: int, t: int, sp: bool, c: int, rc: Recompute
                              ) -> tuple[float, float]:
        """(bytes kept per layer per micro-batch, the recompute working set)."""
        arch = self.s.arch
        shape = LayerShape(s=float(arch.seq), b=float(b), h=float(arch.hidden),
                           a=float(arch.heads), kv=float(arch.kv_heads),
                           f=float(arch.expert_ffn or arch.ffn), e=self.E,
                           k=float(arch.top_k) if arch.moe else 1.0,
                           head=float(arch.head_dim) if arch.head_size else None)
        saved = saved_tensors(arch, shape, layer_kernels("megatron"))
        full = float(per_layer_bytes(saved, float(t), sp, float(c), drop_core=False))
        if rc is Recompute.FULL:
            return self.E * arch.seq * b * arch.hidden / ((t if sp else 1) * c), full
        return float(per_layer_bytes(saved, float(t), sp, float(c),
                                     drop_core=rc is Recompute.SELECTIVE)), 0.0

    def _stage_elements(self, lay: Layout, layers: int, first: bool, last: bool) -> float:
        """Parameter elements a device of this stage holds before data-parallel sharding."""
        return self._elements(lay.tp, lay.ep, layers, first, last)

    def _elements_of(self, t: int, ep: int, layers: int, first: bool, last: bool) -> float:
        arch = self.s.arch
        per = self.layer
        dense = per[ParamGroup.DENSE] * layers / t
        norms = per[ParamGroup.NORMS] * layers
        experts = per[ParamGroup.EXPERTS] * layers / (t * ep)
        word = arch.padded_vocab(t) * arch.hidden / t
        extra = 0.0
        if first:
            extra += word + arch.position_rows * arch.hidden
        if last:  # the final norm, and the output layer (or the tied embedding's copy)
            extra += arch.norm_params() + (0.0 if first and arch.tied_embeddings else word)
        return dense + norms + experts + extra

    def memory(self, lay: Layout) -> float:
        arch = self.s.arch
        kinds = self._stage_kinds(lay)
        shard = lay.shard if lay.sharding is Sharding.HSDP else lay.dp
        split_p = shard if lay.sharding in (Sharding.ZERO3, Sharding.HSDP) else 1
        split_g = shard if lay.sharding in (Sharding.ZERO2, Sharding.ZERO3, Sharding.HSDP) else 1
        split_o = 1 if lay.sharding in (Sharding.NONE, Sharding.DDP) else shard
        per_layer, working = self._per_layer(lay.b, lay.tp, lay.sp, lay.cp, lay.recompute)
        first_in_flight = self._in_flight(lay, 0)
        tokens = arch.seq * lay.b / lay.cp
        hshard = lay.tp if lay.sp else 1
        vocab = arch.padded_vocab(lay.tp)
        gather = (self.unit * self.P_gathered / lay.tp
                  if lay.sharding in (Sharding.ZERO3, Sharding.HSDP) else 0.0)
        # ZeRO-3 / FSDP full shard: the layers' backward on gathered units whose gradients are
        # reduce-scattered unit by unit, unless the step keeps the gradient unsharded (cost/peak.py)
        zero3 = bool(gather) and shard > 1 and not lay.reduce_step
        per = self.layer
        layer_unit = (per[ParamGroup.DENSE] / lay.tp + per[ParamGroup.NORMS]
                      + per[ParamGroup.EXPERTS] / (lay.tp * lay.ep))
        best = 0.0
        for layers, first, last, stage in kinds:
            in_flight = self._in_flight(lay, stage)
            n = self._stage_elements(lay, layers, first, last)
            acts = per_layer * layers * in_flight
            states = n * self.P / split_p
            if not lay.offload:
                states += n * self.G / split_g + n * self.O / split_o
            if lay.reduce_step:  # the unsharded gradient accumulating: a chunk's, or the stage's
                held = self._stage_elements(lay, self._chunk_layers(lay, stage), first, last) \
                    if lay.chunk_ordered else n
                states += held * self.G
            mask = tokens * arch.hidden / hshard * first_in_flight if first and arch.dropout \
                else 0.0
            logits16 = self.E * tokens * vocab / lay.tp if last and self.E != 4 else 0.0
            outside = mask
            if last:
                outside += 2 * self.E * tokens * arch.hidden / hshard + logits16
                outside += 4 * tokens * vocab / lay.tp
            base = states + acts
            best = max(best, base + outside + gather)  # end of forward: no working set
            if zero3 or working:  # the backward of the last layer (its working set rebuilt)
                unit = layer_unit * (self.P_gathered + self.G) if zero3 else 0.0
                best = max(best, base + mask + (0.0 if zero3 else gather) + unit + working)
            if zero3 and last:  # the backward of the output layer
                out = vocab * arch.hidden / lay.tp * (self.P_gathered + self.G)
                best = max(best, base + outside - logits16 + out)
        return best

    def _chunk_layers(self, lay: Layout, stage: int) -> int:
        """The most layers one model chunk of ``stage`` holds
        (:func:`placeverify.roles.pipeline.chunk_layers`)."""
        if lay.stages is None:
            return self.s.arch.layers // (lay.pp * lay.v)
        return max(lay.stages[c * lay.pp + stage] for c in range(lay.v))

    @staticmethod
    def _in_flight(lay: Layout, stage: int) -> float:
        """Micro-batches in flight on ``stage``, as
        :func:`placeverify.cost.activations.stage_in_flight` counts them."""
        p = lay.pp
        if p == 1:
            return 1.0
        if lay.v > 1:
            return min((p * (lay.v + 1) - 2 * stage - 1) / lay.v, float(lay.m))
        return float(min(lay.m, p - stage))

    def _stage_kinds(self, lay: Layout) -> Sequence[tuple[int, bool, bool, int]]:
        """(layers, first, last, stage) per distinct stage kind, each at its fullest stage (the
        kind's first: in-flight counts never grow with the stage index). The space's uneven
        stages give every middle stage the same layers."""
        layers = self.s.arch.layers
        if lay.pp == 1:
            return [(layers, True, True, 0)]
        if lay.stages is None:
            each = layers // lay.pp
            kinds = [(each, True, False, 0), (each, False, True, lay.pp - 1)]
            return kinds + ([(each, False, False, 1)] if lay.pp > 2 else [])
        st = lay.physical_stages()
        assert st is not None
        return _uneven_kinds(st)

    # ---- time -----------------------------------------------------------------------------

    def _microbatch_flops(self, b: int, t: int, c: int, stages: tuple[int, ...] | int, pp: int,
                          rc: Recompute) -> tuple[float, float, int, float, float]:
        """(forward FLOPs, extra recompute FLOPs, layers, the linear layers' GEMM FLOPs of
        forward, backward and recomputation) of one micro-batch on the slowest stage, with fused
        attention's slow FLOPs folded in as the step-time model counts them, and the bubble in
        that stage's micro-batch times before interleaving.
        ``stages``: L / p for each of ``pp`` even stages (the last with the output layer, as the
        step-time model counts them), else the listed layers, of which the stage with the most
        work sets the pace (:func:`placeverify.cost.time.pace`)."""
        arch, cal = self.s.arch, self.s.cal
        tokens = b * arch.seq / c
        flash = arch.attention == "flash"
        layer, core = layer_flops(arch, tokens, arch.seq, t, flash)
        per_extra = layer if rc is Recompute.FULL else (
            core if rc is Recompute.SELECTIVE else 0.0)
        output = output_flops(arch, tokens, t)
        counts = (stages,) * pp if isinstance(stages, int) else stages
        slowest, idle = pace(counts, 3 * layer + per_extra, 3 * output)
        layers, out = counts[slowest], (output if slowest == len(counts) - 1 else 0.0)
        forward = layers * layer + out
        slow = layers * core * (1 / cal.attention_efficiency - 1) if flash else 0.0
        gemms = 3 * (forward - layers * core) + (layers * (layer - core)
                                                 if rc is Recompute.FULL else 0.0)
        return (forward + slow, layers * per_extra + (slow if rc is not Recompute.NONE else 0.0),
                layers, gemms, idle)

    def _links(self, lay: Layout) -> dict[str, tuple[float, float]]:
        """(bandwidth, latency) per axis, as the mesh's device profile gives them."""
        return self._links_of(_order_of(lay))

    def _axis_links(self, axes: tuple[tuple[str, int], ...]) -> dict[str, tuple[float, float]]:
        dev = self.s.device
        sizes = tuple(n for _, n in axes)
        out = {}
        for i, (name, _n) in enumerate(axes):
            inside = intra_node(sizes, i, dev.gpus_per_node)
            share = ranks_per_node(sizes, i, dev.gpus_per_node)
            bw = float(dev.intra_node_bandwidth) if inside else min(
                float(dev.intra_node_bandwidth), share * float(dev.network_bandwidth))
            lat = float(dev.intra_node_latency if inside else dev.network_latency)
            out[name] = (bw * self.s.cal.link_efficiency, lat)
        return out

    def time(self, lay: Layout) -> float:
        arch, cal = self.s.arch, self.s.cal
        fwd_flops, extra, layers, gemms, idle = self._flops(
            lay.b, lay.tp, lay.cp, lay.physical_stages() or arch.layers // lay.pp, lay.pp,
            lay.recompute)
        tokens = lay.b * arch.seq / lay.cp
        flash = arch.attention == "flash"
        scores = 0.0 if flash else (cal.score_passes * lay.b * arch.heads * (arch.seq / lay.cp)
                                    * arch.seq / lay.tp)
        hidden = (cal.hidden_passes * tokens * arch.hidden / (lay.tp if lay.sp else 1)
                  + cal.ffn_passes * tokens * ffn_width(arch) / lay.tp)
        mem_layer = (scores + hidden) * self.E / self.hbm
        mem_extra = layers * mem_layer if lay.recompute is Recompute.FULL else (
            layers * scores * self.E / self.hbm if lay.recompute is Recompute.SELECTIVE else 0.0)
        t_fwd = fwd_flops / self.rate + layers * mem_layer
        t_bwd = (2 * fwd_flops + extra) / self.rate + 2 * layers * mem_layer + mem_extra
        links = self._links(lay)
        m = lay.m
        refwd = 1 if lay.recompute is Recompute.FULL else 0
        bsh = lay.b * arch.seq * arch.hidden * self.E / lay.cp
        exposed_mb = 0.0  # per micro-batch, exposed
        if lay.tp > 1:
            bw, lat = links["tp"]
            n = lay.tp
            if lay.sp:
                count = (6 + 2 * refwd) + (4 + 2 * refwd)
                tensor = layers * count * (bsh * (n - 1) / n / bw + lat * (n - 1))
            else:
                count = 4 + 2 * refwd
                tensor = layers * count * (2 * bsh * (n - 1) / n / bw + lat * 2 * (n - 1))
            if lay.tp_overlap is TensorOverlap.ALL:
                # overlapped with the linear layers' GEMMs (cost/exposure.py: overlapped)
                exposed_mb += outlasting(tensor, gemms / self.rate, cal.tp_overlap)
            elif lay.tp_overlap is TensorOverlap.BACKWARD:
                # two of each kind the backward issues per layer, beside the column-parallel
                # layers' input- and weight-gradient GEMMs (cost/flops.py: column_flops)
                # (one of each kind for an MoE layer: only its QKV projection's)
                beside = tensor * (1 if arch.moe else 2) / count * (2 if lay.sp else 1)
                window = 2 * layers * column_flops(arch, tokens, lay.tp) / self.rate
                exposed_mb += tensor - beside + outlasting(beside, window, cal.backward_overlap)
            else:
                exposed_mb += tensor
        if lay.cp > 1:
            bw, lat = links["cp"]
            n = lay.cp
            width = arch.hidden * (arch.kv_heads / arch.heads) if not arch.head_size \
                else arch.kv_dim  # K and V: kv_heads heads of head_dim
            kv = 2 * lay.b * arch.seq * width * self.E / lay.tp
            exposed_mb += layers * (3 + refwd) * (kv * (n - 1) / n / bw + lat * (n - 1))
        if lay.ep > 1 and arch.moe:
            bw, lat = links["ep"]
            n = lay.ep
            moved = bsh * arch.top_k / (lay.tp if lay.sp else 1)
            exposed_mb += layers * (4 + 2 * refwd) * (moved * (n - 1) / n / bw + lat * (n - 1))
        if lay.pp > 1:
            bw, lat = links["pp"]
            exposed_mb += 2 * lay.v * (bsh / (lay.tp if lay.sp else 1) / bw + lat)
        data, waited_mb = self._data_seconds(lay, links, layers, t_fwd, t_bwd)
        t_mb = t_fwd + t_bwd + exposed_mb + waited_mb
        bubble = 0.0 if lay.pp <= 1 else idle / lay.v * t_mb
        return m * t_mb + bubble + data + self._optimizer_seconds(lay, layers)

    def _local_elements(self, lay: Layout, layers: int) -> float:
        """Parameter elements of the slowest stage's device before data sharding."""
        kinds = self._stage_kinds(lay)
        return max(self._stage_elements(lay, n, f, la) for n, f, la, _ in kinds)

    def _model_share(self, lay: Layout) -> float:
        """Parameter elements per device as the communication model counts them: the whole
        model split by the tensor, pipeline and expert axes (unpadded vocabulary)."""
        groups = self.groups
        t, p = lay.tp, lay.pp
        positions = self.s.arch.position_rows * self.s.arch.hidden  # whole on every tp rank
        # listed stages: the layers' groups follow the stage with the most layers
        stages = lay.physical_stages()
        share = self.s.arch.layers / max(stages) if stages else p
        return (groups[ParamGroup.DENSE] / (t * share) + groups[ParamGroup.NORMS] / share
                + (groups[ParamGroup.EMBEDDING] - positions) / (t * p) + positions / p
                + groups[ParamGroup.EXPERTS] / (t * share * lay.ep))

    def _data_seconds(self, lay: Layout, links: dict[str, tuple[float, float]], layers: int,
                      t_fwd: float, t_bwd: float) -> tuple[float, float]:
        """Exposed data-parallel traffic of the canonical step, in the step-time model's overlap
        classes: gathers for forward behind each micro-batch's forward; reductions in the loop
        and gathers for backward behind its backward; reductions after the loop behind the last
        backward; the all-gather after a sharded update behind the next forward; the token-count
        all-reduce and host transfers exposed. With ``dp_wait`` (``overlap = none``) nothing is
        hidden: what runs in the loop lengthens every micro-batch (cost/exposure.py: waits). Returns
        (seconds added to the step, seconds added to every micro-batch)."""
        local = self._model_share(lay)
        grads, params = local * self.G_reduced, local * self.P_gathered
        m = lay.m

        sizes = dict(_order_of(lay))

        def ring(axes: list[str], payload: float, all_reduce: bool, calls: int = 1) -> float:
            axes = [a for a in axes if a in links]
            if not axes or payload == 0:
                return 0.0
            n = 1
            for a in axes:
                n *= sizes[a]
            bw = min(links[a][0] for a in axes)
            lat = max(links[a][1] for a in axes)
            steps = 2 * (n - 1) if all_reduce else n - 1
            return steps / n * payload / bw + lat * steps * calls

        data = ["replica", "shard"] if lay.sharding is Sharding.HSDP else ["dp"]
        counts = ring([*data, "ep", "cp"], 16.0, True)  # the global token count
        loop_fwd = loop_bwd = scatter = post = following = by_chunk = 0.0
        kind = lay.sharding
        if kind in (Sharding.NONE, Sharding.DDP):
            post = ring(["dp", "cp"], grads, True)
        elif kind is Sharding.ZERO1:
            post = ring(["dp"], grads, False) + ring(["cp"], grads / lay.dp, True)
            following = ring(["dp"], params, False)
        elif kind is Sharding.ZERO2:
            scatter = ring(["dp"], grads, False)
            post = ring(["cp"], grads / lay.dp, True)
            following = ring(["dp"], params, False)
        elif kind in (Sharding.ZERO3, Sharding.HSDP):
            shard = "dp" if kind is Sharding.ZERO3 else "shard"
            units = fsdp_units(layers)  # calls: each unit's collective with its ring latency
            gather = ring([shard], params, False, units)
            loop_fwd = gather
            scatter = ring([shard], grads, False, units)
            loop_bwd = gather
            rest = ["cp"] if kind is Sharding.ZERO3 else ["replica", "cp"]
            post = ring(rest, grads / lay.shard, True, units)
        if lay.reduce_step and lay.chunk_ordered:
            # each chunk reduced after its last micro-batch, behind the later chunks' backward
            # (cost/exposure.py: reduced_by_chunk); HSDP's replica all-reduce with it
            by_chunk = scatter
            if kind is Sharding.HSDP and lay.cp == 1:
                by_chunk, post = by_chunk + post, 0.0
            scatter = 0.0
        if m == 1 or lay.reduce_step:  # the reductions after the loop
            post += scatter
        else:
            loop_bwd += scatter
        per_mb = 0.0
        if lay.dp_wait:
            per_mb = loop_fwd + loop_bwd
            exposed = post + following + by_chunk + counts
        else:
            share = self.s.cal.data_overlap
            fsdp = kind in (Sharding.ZERO3, Sharding.HSDP)  # unit by unit (cost/exposure.py)
            exposed = counts + outlasting(following, t_fwd, share) + (
                unit_passes(loop_fwd, loop_bwd, loop_bwd - loop_fwd, post, t_fwd, t_bwd, share,
                            fsdp_units(layers), m) if fsdp else
                m * outlasting(loop_fwd, t_fwd, share) + m * outlasting(loop_bwd, t_bwd, share)
                + outlasting(post, t_bwd, share))
            if by_chunk:
                exposed += queued(by_chunk, lay.v, m * t_bwd, share)
        if lay.offload:
            split = lay.shard if kind is Sharding.HSDP else lay.dp
            kept, stored = local * self.G, local * self.P  # the host copies move them as kept
            exposed += (kept / split * m + stored / split) / self.s.pcie_bandwidth
        return exposed, per_mb

    def _optimizer_seconds(self, lay: Layout, layers: int) -> float:
        if self.O == 0 or lay.offload:
            return 0.0
        split = 1 if lay.sharding in (Sharding.NONE, Sharding.DDP) else (
            lay.shard if lay.sharding is Sharding.HSDP else lay.dp)
        elements = self._local_elements(lay, layers) / split
        touched = elements * (2 * self.O + self.G + self.P)
        return touched / (self.hbm * self.s.cal.memory_efficiency)

    def estimate(self, lay: Layout) -> Estimate:
        return Estimate(self.memory(lay), self.time(lay))


@lru_cache(maxsize=1024)
def _uneven_kinds(st: tuple[int, ...]) -> tuple[tuple[int, bool, bool, int], ...]:
    """The stage kinds of listed physical stages: the first, the last, and the middle stage
    with the most layers (the earliest of them)."""
    kinds = [(st[0], True, False, 0), (st[-1], False, True, len(st) - 1)]
    if len(st) > 2:
        middle = max(range(1, len(st) - 1), key=lambda i: (st[i], -i))
        kinds.append((st[middle], False, False, middle))
    return tuple(kinds)


def axis_order(lay: Layout) -> list[tuple[str, int]]:
    """The mesh axes of a layout, outermost first (:func:`_axis_order`)."""
    return list(_order_of(lay))


def _order_of(lay: Layout) -> tuple[tuple[str, int], ...]:
    return _axis_order(lay.pp, lay.sharding is Sharding.HSDP, lay.dp, lay.shard, lay.ep, lay.cp,
                       lay.tp)


@lru_cache(maxsize=4096)
def _axis_order(pp: int, hsdp: bool, dp: int, shard: int, ep: int, cp: int,
                tp: int) -> tuple[tuple[str, int], ...]:
    """The mesh axes of a layout, outermost first (the last varies fastest, so tensor
    parallelism is inside a node): Megatron-LM's default rank order tp-cp-ep-dp-pp, innermost
    first (``megatron/core/parallel_state.py``, ``order="tp-cp-ep-dp-pp"``). Axes of size 1 are
    left out."""
    axes: list[tuple[str, int]] = [("pp", pp)]
    if hsdp:
        axes += [("replica", dp // shard), ("shard", shard)]
    else:
        axes.append(("dp", dp))
    axes += [("ep", ep), ("cp", cp), ("tp", tp)]
    return tuple((n, k) for n, k in axes if k > 1)
