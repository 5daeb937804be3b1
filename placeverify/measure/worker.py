"""One rank of a measurement: ``python -m placeverify.measure.worker JOB RANK STORE OUT``.

It joins a gloo process group through a ``FileStore`` (no ports), builds the model (the same
initial weights on every rank), applies the real torch implementation named by the run spec,
trains two warm-up steps (lazy initialisation, DDP's bucket rebuild, pipeline shape inference,
optimizer state creation) and measures the third: bytes of parameters, gradients and optimizer
state held by this rank, bytes saved for backward, and every collective with its payload. The
result is written as JSON (never pickled) to OUT. The job is JSON written by the parent: one or
more run specs of the same world size, measured one after the other in the same processes.

Set ``PLACEVERIFY_MEASURE_FAULT=crash:<rank>`` or ``hang:<rank>`` to make a rank fail on purpose
(the tests check that the parent reports it and stops the other ranks), and
``PLACEVERIFY_MEASURE_DEBUG=1`` to list every tensor saved for backward in the result.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from placeverify.backend.follow import watch_parent_from_env  # noqa: E402
from placeverify.backend.processes import failure_path  # noqa: E402
from placeverify.cost.implementations.pipeline import stage_layers  # noqa: E402
from placeverify.cost.implementations.spec import Implementation, OptimizerKind, RunSpec  # noqa: E402
from placeverify.ir.placement import Schedule  # noqa: E402
from placeverify.measure.allocation import AllocationMeter  # noqa: E402
from placeverify.measure.models import TinyMlp, TinyTransformer, loss_fn  # noqa: E402
from placeverify.measure.probes import (  # noqa: E402
    CommRecorder,
    SavedTensorProbe,
    local_bytes,
    optimizer_tensors,
    storage_bytes,
    unwrap,
)

WARMUP_STEPS = 2
LEARNING_RATE = 1e-3
SLOW_DEATH_SECONDS = 8.0
STDERR_LIMIT = 2000


@dataclass
class Run:
    """A model wrapped by one implementation, and how to run one step of it."""

    module: nn.Module  # what forward is called on (the DDP wrapper, or the model itself)
    model: nn.Module  # the underlying model
    optimizer: torch.optim.Optimizer
    optimizer_state: Callable[[], dict[Any, dict[str, Any]]]
    blocks: list[nn.Module]  # the transformer layers (for attributing saved tensors)
    loss_context: Callable[[], Any]


def build_model(spec: RunSpec) -> nn.Module:
    torch.manual_seed(0)
    if spec.arch is not None:
        return TinyTransformer(spec.arch)
    assert spec.mlp is not None
    return TinyMlp(spec.mlp)


def make_optimizer(spec: RunSpec, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    if spec.optimizer is OptimizerKind.ADAM:
        return torch.optim.Adam(params, lr=LEARNING_RATE)
    momentum = 0.9 if spec.optimizer is OptimizerKind.SGD_MOMENTUM else 0.0
    return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=momentum)


def optimizer_class(spec: RunSpec) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    if spec.optimizer is OptimizerKind.ADAM:
        return torch.optim.Adam, {"lr": LEARNING_RATE}
    momentum = 0.9 if spec.optimizer is OptimizerKind.SGD_MOMENTUM else 0.0
    return torch.optim.SGD, {"lr": LEARNING_RATE, "momentum": momentum}


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The modules whose saved tensors count as 'layers': the transformer blocks, or the whole
    MLP (its GELUs are applied between its Linear modules); the loss counts as 'other'."""
    if isinstance(model, TinyMlp):
        return [model]
    layers = getattr(model, "layers", None)
    return list(layers.values()) if isinstance(layers, nn.ModuleDict) else []


def _nullcontext() -> Any:
    from contextlib import nullcontext

    return nullcontext()


def tp_plan(spec: RunSpec, model: nn.Module) -> dict[str, Any]:
    """Megatron's split in DTensor styles (PyTorch docs, torch.distributed.tensor.parallel)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    if spec.arch is None:
        for name in model.layers:  # type: ignore[union-attr]
            plan[f"layers.{name}"] = ColwiseParallel() if int(name) % 2 == 0 else RowwiseParallel()
        return plan
    plan["embed"] = RowwiseParallel(input_layouts=Replicate())
    for name in model.layers:  # type: ignore[union-attr]
        prefix = f"layers.{name}"
        for proj in ("q", "k", "v"):
            plan[f"{prefix}.attn.{proj}"] = ColwiseParallel()
        plan[f"{prefix}.attn.o"] = RowwiseParallel()
        if spec.arch.gated:
            plan[f"{prefix}.mlp.gate"] = ColwiseParallel()
        plan[f"{prefix}.mlp.up"] = ColwiseParallel()
        plan[f"{prefix}.mlp.down"] = RowwiseParallel()
    plan["output"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    return plan


def apply(spec: RunSpec, model: nn.Module, device: torch.device) -> Run:
    impl = spec.implementation
    blocks = blocks_of(model)
    if impl in (Implementation.DDP, Implementation.ZERO1):
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device])
        if impl is Implementation.DDP:
            opt = make_optimizer(spec, ddp.parameters())
            return Run(ddp, model, opt, lambda: opt.state, blocks, _nullcontext)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        cls, kwargs = optimizer_class(spec)
        zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=cls, **kwargs)
        return Run(ddp, model, zero, lambda: zero.optim.state, blocks, _nullcontext)

    from torch.distributed.device_mesh import init_device_mesh

    loss_context: Callable[[], Any] = _nullcontext
    if impl in (Implementation.TP, Implementation.FSDP2_TP):
        from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

        mesh = init_device_mesh(device.type, (spec.dp, spec.tp), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], tp_plan(spec, model))
        if spec.arch is not None:
            loss_context = loss_parallel
        dp_mesh = mesh["dp"]
    else:
        dp_mesh = init_device_mesh(device.type, (spec.dp,), mesh_dim_names=("dp",))
    if impl in (Implementation.FSDP2, Implementation.FSDP2_TP):
        from torch.distributed.fsdp import fully_shard

        reshard = spec.reshard_after_forward
        for block in model.layers.values():  # type: ignore[operator]
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
        if reshard:
            fully_shard(model, mesh=dp_mesh)  # the default: the root does not reshard
        else:
            fully_shard(model, mesh=dp_mesh, reshard_after_forward=False)
    opt = make_optimizer(spec, model.parameters())
    return Run(model, model, opt, lambda: opt.state, blocks, loss_context)


def batch(spec: RunSpec, data_rank: int, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic inputs and targets of one data-parallel rank."""
    g = torch.Generator().manual_seed(1000 + data_rank)
    if spec.arch is not None:
        shape = (samples, spec.arch.seq)
        x = torch.randint(0, spec.arch.vocab, shape, generator=g)
        y = torch.randint(0, spec.arch.vocab, shape, generator=g)
        return x, y
    assert spec.mlp is not None
    width = spec.mlp.width
    return (torch.randn(samples, width, generator=g), torch.randn(samples, width, generator=g))


def fault(rank: int, *, written: bool = False, dying: bool = False) -> None:
    """Fault injection for the tests: crash or hang this rank before its result is written, or
    abort it after (``abort-after-result``: as gloo's threads sometimes abort the process at its
    teardown, "terminate called without an active exception"); ``crash-slow`` crashes as
    ``crash`` does but takes :data:`SLOW_DEATH_SECONDS` to die after closing its connections, so
    that its peers' broken-connection errors end them first."""
    value = os.environ.get("PLACEVERIFY_MEASURE_FAULT", "")
    kind, _, target = value.partition(":")
    if not kind or target != str(rank):
        return
    if dying:
        if kind == "crash-slow":
            time.sleep(SLOW_DEATH_SECONDS)
        return
    if kind == "abort-after-result" and written:
        os.abort()
    if written:
        return
    if kind in ("crash", "crash-slow"):
        raise RuntimeError(f"rank {rank}: crash injected by PLACEVERIFY_MEASURE_FAULT")
    if kind == "hang":
        time.sleep(3600)


def record_failure(out_path: str, error: BaseException) -> None:
    """Write what this rank died of, and when (the system-wide monotonic clock), beside its
    result: the parent names the rank that failed first, not the peer that noticed."""
    path = Path(failure_path(out_path))
    text = json.dumps({"error": f"{type(error).__name__}: {error}"[:STDERR_LIMIT],
                       "at": time.monotonic()})
    with contextlib.suppress(OSError):
        path.with_suffix(".tmp").write_text(text, encoding="utf-8")
        path.with_suffix(".tmp").replace(path)


def param_bytes(params: Sequence[torch.Tensor]) -> tuple[int, int]:
    return sum(local_bytes(p) for p in params), storage_bytes(params)


def new_probe(excluded: Callable[[], Iterable[torch.Tensor]]) -> SavedTensorProbe:
    probe = SavedTensorProbe(excluded)
    if os.environ.get("PLACEVERIFY_MEASURE_DEBUG"):  # keep every saved tensor's shape
        probe.log = []
    return probe


def gradient_states(params: Iterable[tuple[str, nn.Parameter]],
                    states: dict[str, int]) -> list[list[Any]]:
    """Gradient bytes (local pieces, and distinct storages) into ``states``; their shapes."""
    named = [(name, p.grad) for name, p in params if p.grad is not None]
    states["grads"] = sum(local_bytes(g) for _, g in named)
    states["grads_storage"] = storage_bytes([g for _, g in named])
    return [[name, list(unwrap(g).shape), str(getattr(g, "placements", ""))] for name, g in named]


def result_document(states: dict[str, int], probe: SavedTensorProbe, recorder: CommRecorder,
                    model: nn.Module, grads: list[list[Any]], microbatches: int,
                    loss: float | None, meter: AllocationMeter) -> dict[str, Any]:
    return {
        "allocated": meter.to_json(),
        "states": states,
        "activations": {"layers": probe.by_region.get("layers", 0),
                        "other": probe.by_region.get("other", 0), "peak": probe.peak,
                        "microbatches": microbatches},
        "collectives": [r.to_json() for r in recorder.records],
        "unknown_ops": sorted(recorder.unknown),
        "params": [[name, list(unwrap(p).shape)] for name, p in model.named_parameters()],
        "grads": grads,
        "saved_log": probe.log,
        "loss": loss,
    }


def measure_data_parallel(spec: RunSpec, rank: int, meter: AllocationMeter) -> dict[str, Any]:
    """DDP, ZeRO-1, FSDP2, TP and FSDP2 x TP: one micro-batch per step."""
    run = apply(spec, build_model(spec).to(meter.device), meter.device)
    meter.start()
    samples = spec.arch.micro_batch if spec.arch is not None else spec.mlp.batch  # type: ignore[union-attr]
    x, y = (t.to(meter.device) for t in batch(spec, spec.coords(rank)["dp"], samples))
    for _ in range(WARMUP_STEPS):
        with run.loss_context():
            loss_fn(run.module(x), y).backward()
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)

    recorder = CommRecorder()
    probe = new_probe(lambda: [*run.model.parameters(), x, y])
    handles = probe.tag_layers(run.blocks)
    states: dict[str, int] = {}
    with recorder:
        with run.loss_context():
            recorder.phase = "forward"
            with meter.phase("forward"), probe.active():
                loss = loss_fn(run.module(x), y)
            if spec.implementation in (Implementation.FSDP2, Implementation.FSDP2_TP):
                states["params_after_forward"] = storage_bytes(list(run.model.parameters()))
            recorder.phase = "backward"
            with meter.phase("backward"), probe.active():
                loss.backward()
        grads = gradient_states(run.model.named_parameters(), states)
        recorder.phase = "optimizer"
        with meter.phase("optimizer"):
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
    for handle in handles:
        handle.remove()

    states["params"], states["params_storage"] = param_bytes(list(run.model.parameters()))
    states["optimizer"] = sum(local_bytes(t) for t in optimizer_tensors(run.optimizer_state()))
    if spec.implementation in (Implementation.DDP, Implementation.ZERO1):
        buckets: dict[int, int] = {}  # the reducer's flat buffers, by storage
        for r in recorder.records:
            if r.phase == "backward" and r.kind == "all_reduce" and r.storages:
                buckets[r.storages[0]] = r.payload
        states["ddp_buckets"] = sum(buckets.values())
    # what existed before the meter started: the parameters (DDP's buckets are rebuilt in the
    # first step, after the meter starts, and the construction-time ones are freed)
    meter.baseline = states["params_storage"]
    meter.stop()
    return result_document(states, probe, recorder, run.model, grads, 1,
                           float(unwrap(loss.detach())), meter)


def measure_pipeline(spec: RunSpec, rank: int, meter: AllocationMeter) -> dict[str, Any]:
    """torch.distributed.pipelining with a manual split (one stage per rank). Point-to-point ops
    are put in the forward phase when they carry activations (toward the next stage) and in the
    backward phase when they carry gradients (toward the previous one)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    model = build_model(spec)
    stage_index, stages = rank, spec.pp
    first, last = stage_index == 0, stage_index == stages - 1
    model.keep_stage(stage_layers(spec, stage_index), first, last)  # type: ignore[operator]
    model.to(meter.device)
    stage = PipelineStage(model, stage_index, stages, meter.device)
    schedule_class = ScheduleGPipe if spec.schedule is Schedule.GPIPE else Schedule1F1B
    schedule = schedule_class(stage, n_microbatches=spec.microbatches, loss_fn=loss_fn)
    opt = make_optimizer(spec, model.parameters())
    meter.start()
    micro = spec.arch.micro_batch if spec.arch is not None else spec.mlp.batch  # type: ignore[union-attr]
    x, y = (t.to(meter.device) for t in batch(spec, 0, micro * spec.microbatches))
    losses: list[torch.Tensor] = []

    def step() -> None:
        losses.clear()
        if first:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()

    for _ in range(WARMUP_STEPS):
        step()
        opt.step()
        opt.zero_grad(set_to_none=True)

    recorder = CommRecorder()
    probe = new_probe(lambda: [*model.parameters(), x, y])
    handles = probe.tag_layers(blocks_of(model))
    states: dict[str, int] = {}
    with recorder:
        recorder.phase = "step"
        with meter.phase("step"), probe.active():
            step()
        grads = gradient_states(model.named_parameters(), states)
        recorder.phase = "optimizer"
        with meter.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    for handle in handles:
        handle.remove()
    for r in recorder.records:
        if r.kind in ("send", "recv") and r.peer is not None:
            toward_next = r.peer > rank
            forward = toward_next if r.kind == "send" else not toward_next
            r.phase = "forward" if forward else "backward"

    states["params"], states["params_storage"] = param_bytes(list(model.parameters()))
    states["optimizer"] = sum(local_bytes(t) for t in optimizer_tensors(opt.state))
    meter.baseline = states["params_storage"]
    meter.stop()
    loss = float(sum(float(v) for v in losses)) if losses else None
    return result_document(states, probe, recorder, model, grads, spec.microbatches, loss, meter)


def main(argv: list[str]) -> int:
    """Run every spec of the job file in turn (they share one world size) on this rank."""
    watch_parent_from_env()
    job_path, rank_text, store_path, out_path = argv
    rank = int(rank_text)
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    specs = [RunSpec.from_json(data) for data in job["specs"]]
    world = specs[0].world
    torch.set_num_threads(1)
    imported = time.perf_counter()
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(job["timeout"])))
    device = torch.device(job.get("device", "cpu"))
    if device.type == "cuda":  # every rank on one GPU (gloo takes CUDA tensors; NCCL refuses)
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    try:
        fault(rank)
        runs = []
        for spec in specs:
            began = time.perf_counter()
            meter = AllocationMeter(device, enabled=bool(job.get("peak", False)))
            if spec.implementation is Implementation.PIPELINE:
                result = measure_pipeline(spec, rank, meter)
            else:
                result = measure_data_parallel(spec, rank, meter)
            result["rank"] = rank
            result["seconds"] = {"run": time.perf_counter() - began}
            runs.append(result)
        document = {"rank": rank, "import_seconds": imported - STARTED, "runs": runs}
        tmp = Path(out_path + ".tmp")
        tmp.write_text(json.dumps(document), encoding="utf-8")
        tmp.replace(out_path)
        fault(rank, written=True)
    except BaseException as error:
        record_failure(out_path, error)
        raise
    finally:
        dist.destroy_process_group()
        fault(rank, dying=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
