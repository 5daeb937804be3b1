"""One rank of a replay: the process that imports torch.

Started two ways with the same code:

- by :mod:`placeverify.backend.runtime` from a forkserver that has already imported this module (and
  torch): :func:`rank_main` gets the job as a JSON string, a FileStore path in a private temporary
  folder, and a pipe it answers on with JSON (progress lines, then one result);
- by ``torchrun`` on a real cluster: ``torchrun --nproc-per-node N -m placeverify.replay.worker
  job.json --out results/`` reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``
  (``env://``) and writes ``results/rank-<r>.json``; ``python -m placeverify.replay.worker --job
  trace.json --world N > job.json`` writes the job of a trace.

Rank 0 trains the single-device reference first and broadcasts its final states and the loss
scale it chose, so the other ranks do not repeat it; then every rank trains its part, compares its
states with the reference's slices, and returns its states for the across-rank comparison. The
backend is NCCL when every rank can have its own CUDA device, gloo on CPU otherwise.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# Imported here so that a forkserver preloading this module pays for them once.
import torch.nn.functional
import torch.utils.checkpoint

from placeverify.replay.batch import Setup
from placeverify.replay.compare import UNIT_ROUNDOFF
from placeverify.replay.data import Dropout
from placeverify.replay.distributed import ProcessGroups, RankGrid
from placeverify.replay.layout import global_specs, layout_of, model_config, param_specs
from placeverify.replay.plan import RunSpec, strategy_of
from placeverify.replay.reference import sensitivity, train
from placeverify.replay.step import RankRun, groups_needed

torch.set_num_threads(1)

WARM_UP = """
strategy "replay warm-up"
model transformer { layers = 2, hidden = 64, heads = 4, vocab = 64, seq = 8, dropout = true }
precision fp32_adam
mesh { dp = 1 }
place ddp over dp
recompute full(restore_rng = true)
clip max_norm = 1.0
"""

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def build_setup(spec: RunSpec) -> Setup:
    strategy = strategy_of(spec)
    layout = layout_of(strategy)
    tokens = {(b, k): n for b, k, n in spec.tokens}
    samples = {(b, k): n for b, k, n in spec.samples}
    per_sample = max(-(-tokens[key] // samples[key]) for key in tokens)
    config = model_config(strategy, layout, per_sample)
    dtype = DTYPES[spec.dtype]
    return Setup(strategy, layout, config, param_specs(config, layout), tokens, samples,
                 spec.microbatches, spec.seed, dtype, Dropout(strategy, layout, config, dtype))


def _encode(t: torch.Tensor) -> str:
    return base64.b64encode(t.detach().cpu().contiguous().numpy().tobytes()).decode("ascii")


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    d = (a.to(b.device) - b).abs()
    if not bool(torch.isfinite(d).all()):
        return float("inf")
    return float(d.max().item())


def _fault(spec: RunSpec, rank: int, where: str) -> None:
    """Test hook (never set from a trace): make one rank crash, raise or hang, as the job's
    ``fault`` says, or ``PLACEVERIFY_REPLAY_FAULT=KIND:RANK[:WHERE]`` (the signal tests)."""
    fault = spec.fault
    if fault is None and os.environ.get("PLACEVERIFY_REPLAY_FAULT"):
        kind, _, rest = os.environ["PLACEVERIFY_REPLAY_FAULT"].partition(":")
        target, _, at = rest.partition(":")
        fault = {"kind": kind, "rank": int(target or -1), "where": at or "step"}
    if not fault or int(fault.get("rank", -1)) != rank or fault.get("where", "step") != where:
        return
    kind = fault.get("kind")
    if kind == "crash":
        os._exit(17)
    if kind == "raise":
        raise RuntimeError("injected failure")
    if kind == "hang":
        while True:
            time.sleep(3600)


def run_rank(spec: RunSpec, rank: int, world: int, timeout: float,
             progress: Callable[[str], None], store: Any = None) -> dict[str, Any]:
    """Initialise the process group, train, compare; returns this rank's result."""
    started = time.perf_counter()
    torch.set_num_threads(1)
    if world != spec.world:
        raise ValueError(f"the job's mesh has {spec.world} ranks, not {world}")
    backend, device = _join(spec, rank, world, timeout, store)
    try:
        setup = build_setup(spec)
        strategy = setup.strategy
        grid = RankGrid(strategy.mesh.names, tuple(strategy.mesh.size(a) for a in strategy.mesh.names),
                        rank)
        groups = ProcessGroups(grid)
        groups.create(groups_needed(strategy))
        _fault(spec, rank, "start")
        reference = _reference(setup, spec, rank, world, device, progress)
        run = RankRun(setup, grid, groups, reference.alpha, device,
                      progress if rank == 0 else (lambda _msg: None))
        _fault(spec, rank, "step")
        run.train(spec.steps)
        states = run.states()
        vs, worst, scale = _versus(states, run.reference_slices(reference.params,
                                                                reference.momentum))
        if world > 1:
            dist.barrier()
        return {"ok": True, "rank": rank, "coords": grid.coords, "vs_reference": vs,
                "worst": worst, "reference_scale": scale,
                "reference_sensitivity": reference.sensitivity, "dtype": spec.dtype,
                "skipped": run.skipped,
                "states": {k: [kind, _encode(v)] for k, (kind, v) in states.items()},
                "seconds": time.perf_counter() - started, "reference_seconds": reference.seconds,
                "backend": backend}
    finally:
        dist.destroy_process_group()


def _join(spec: RunSpec, rank: int, world: int, timeout: float,
          store: Any) -> tuple[str, torch.device]:
    """Join the run's process group: NCCL when every rank can have its own CUDA device, gloo on
    CPU otherwise; through ``store`` (a FileStore) or, under torchrun, ``env://``."""
    backend = spec.backend or ("nccl" if torch.cuda.is_available()
                               and torch.cuda.device_count() >= world else "gloo")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    kwargs: dict[str, Any] = {"backend": backend, "rank": rank, "world_size": world,
                              "timeout": datetime.timedelta(seconds=timeout)}
    if store is not None:
        kwargs["store"] = store
    else:
        kwargs["init_method"] = "env://"
    dist.init_process_group(**kwargs)
    return backend, device


@dataclass(frozen=True)
class Reference:
    """The single-device reference's final states, as every rank holds them after rank 0's
    broadcast, and (on rank 0) how long it took and how far rounding moves it."""

    alpha: float
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    seconds: float = 0.0
    sensitivity: float = 0.0


def _reference(setup: Setup, spec: RunSpec, rank: int, world: int, device: torch.device,
               progress: Callable[[str], None]) -> Reference:
    """Rank 0 trains the reference (and its sensitivity to rounding) and broadcasts its loss
    scale and final states in one flat tensor; the other ranks receive them."""
    specs = global_specs(setup.specs)
    seconds = sensitivity_found = 0.0
    if rank == 0:
        progress("single-device reference")
        t0 = time.perf_counter()
        ref = train(setup, spec.steps)
        seconds = time.perf_counter() - t0
        sensitivity_found = sensitivity(setup, spec.steps, ref, UNIT_ROUNDOFF[spec.dtype])
        flat = torch.cat([torch.tensor([ref.alpha], dtype=setup.dtype)]
                         + [ref.params[s.name].reshape(-1) for s in specs]
                         + [ref.momentum[s.name].reshape(-1) for s in specs])
    else:
        size = 1 + 2 * sum(int(torch.Size(s.shape).numel()) for s in specs)
        flat = torch.empty(size, dtype=setup.dtype)
    flat = flat.to(device)
    if world > 1:
        dist.broadcast(flat, src=0)
    params: dict[str, torch.Tensor] = {}
    momentum: dict[str, torch.Tensor] = {}
    offset = 1
    for target in (params, momentum):
        for s in specs:
            n = int(torch.Size(s.shape).numel())
            target[s.name] = flat[offset:offset + n].view(s.shape)
            offset += n
    return Reference(float(flat[0].item()), params, momentum, seconds, sensitivity_found)


def _versus(states: dict[str, tuple[str, torch.Tensor]], expected: dict[str, torch.Tensor]
            ) -> tuple[dict[str, float], dict[str, str], float]:
    """Per state kind, the largest difference from the reference's slices and the state that
    holds it; and the largest reference value (the tolerance's scale)."""
    vs: dict[str, float] = {"params": 0.0, "optimizer": 0.0}
    worst: dict[str, str] = {}
    scale = 0.0
    for key, (kind, value) in states.items():
        d = _max_abs(value, expected[key])
        if kind not in worst or d > vs[kind]:
            worst[kind] = key
            vs[kind] = max(vs[kind], d)
        if expected[key].numel():
            scale = max(scale, float(expected[key].abs().max().item()))
    return vs, worst, scale


def warm_up() -> None:
    """Run one tiny step on one rank without a process group, so that torch's lazy imports
    (``torch.utils.checkpoint`` pulls in dynamo: ~1 s) happen once in the forkserver, not in
    every rank of every replay."""
    spec = RunSpec("warm-up", WARM_UP, "<warm-up>", {"dp": 1}, 1, False, [((0,), 0, 2)],
                   [((0,), 0, 2)], steps=1)
    setup = build_setup(spec)
    strategy = setup.strategy
    grid = RankGrid(strategy.mesh.names, (1,), 0)
    groups = ProcessGroups(grid)
    groups.create(groups_needed(strategy))
    train(setup, 1)
    RankRun(setup, grid, groups, 1.0, torch.device("cpu"), lambda _msg: None).train(1)


# ---- forkserver children --------------------------------------------------------------------------


def rank_main(job: str, rank: int, world: int, store_path: str, conn: Any, main_pid: int,
              timeout: float) -> None:
    """Entry point of a rank started by :mod:`placeverify.backend.runtime` (which has already
    put it in its own process group and made it follow the parent)."""

    def send(doc: dict[str, Any]) -> None:
        conn.send_bytes(json.dumps(doc).encode("utf-8"))

    try:
        spec = RunSpec.from_json(job)
        store = dist.FileStore(store_path, world)  # type: ignore[attr-defined]
        result = run_rank(spec, rank, world, timeout, lambda msg: send({"progress": msg}), store)
        send(result)
    except BaseException as error:  # reported to the parent, which decides what to say
        send({"ok": False, "rank": rank, "error": f"{type(error).__name__}: {error}",
              "unsupported": type(error).__name__ == "Unsupported",
              "traceback": traceback.format_exc()})
    finally:
        try:
            conn.close()
        finally:
            os._exit(0)


# ---- torchrun ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m placeverify.replay.worker",
                                     description="Run one rank of a replay job (torchrun), or "
                                                 "write the job of a trace.")
    parser.add_argument("job", help="a job JSON file (from --job), or with --job a trace")
    parser.add_argument("--out", default=".", help="folder for rank-<r>.json results")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--job", dest="make_job", action="store_true",
                        help="read a trace and print the job to run")
    parser.add_argument("--world", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.make_job:
        from placeverify.replay.plan import plan_from_trace
        from placeverify.trace import load

        plan = plan_from_trace(load(args.job), world=args.world, steps=args.steps)
        print(plan.main.to_json())
        return 0
    spec = RunSpec.from_json(Path(args.job).read_text(encoding="utf-8"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    result = run_rank(spec, rank, world, args.timeout, lambda msg: None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
