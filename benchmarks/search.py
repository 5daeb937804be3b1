"""``placeverify search`` on two published runs: speed, and where the published layout ranks.

    .venv/bin/python benchmarks/search.py

For each run it prints the legal layouts screened, the screening rate (layouts per second),
the total time with the frontier verified, the largest screen-vs-full-model deviation among the
finalists, the top five, and the published layout under the full model with its rank among the
layouts that fit: the goal is the published layout, or one predicted within 5% of it, in the
top five.

Runs (the published layout as this project reads the source):

- Llama 3 405B on 16,384 H100 SXM, 16M-token batches of sequence 8,192 (2,048 sequences):
  "The Llama 3 Herd of Models" (arXiv 2407.21783) Table 4: t = 8, cp = 1, p = 16, d = 128, 16
  sequences per data-parallel group (b = 1, m = 16), bf16, no activation checkpointing; "FSDP
  without resharding after forward" with "FP32 gradient accumulation during backward computation
  over multiple micro-batches" (§3.3.2) written ``zero2(reduce = step)`` (parameters gathered
  once per step, gradients accumulated unsharded and reduce-scattered once, per model chunk);
  an interleaved pipeline with one layer fewer on the first and the last stage, so that "the
  first model chunk on the first stage has only the embedding, and the last model chunk on the
  last stage has only output projection and loss calculation" (§3.3.2): a model chunk held one
  of 126 + 2 layers, 128 chunks over p = 16 is v = 8, and the 126 layers are 0, 1 x 126, 0 over
  the 128 virtual stages (as ``benchmarks/step_time.py`` reads the same rows).
- GPT-3 175B on 1,024 A100 80GB, batch 1,536 sequences of 2,048, fp16: the run Megatron-LM's
  README published with its launch script (NVIDIA/Megatron-LM at 152aab304d, 2021-01-11:
  "With full global batch size of 1536 on 1024 A100 GPUs, each iteration takes around 32
  seconds"; ``examples/pretrain_gpt3_175B.sh``: 128 nodes x 8 srun tasks, t = 8, p = 16, so
  d = 8, micro-batch 1, m = 192, ``--fp16`` with fp16 gradients, ``--checkpoint-activations``,
  the row ``megatron-lm-2021`` of ``benchmarks/step_time.py``). That Megatron-LM ran plain 1F1B
  (no interleaving yet), waited for every tensor-parallel collective (the async all-reduce came
  in 2021-08) and all-reduced the gradients after the whole forward-backward (``train_step``
  after ``forward_backward_func``, default ``--DDP-impl local``): ``ddp(overlap = none)``. The
  search's layouts run Megatron-LM's tensor-parallel layers of today
  (``LinearWithGradAccumulationAndAsyncCommunication``: ``overlap = backward``,
  ``search --tp-overlap-backward``), except over the run's own software.

Each run is searched over every layout the language has, then over the choices that run's
own software offered, so that the published layout is ranked against the layouts its authors
could have launched:

- GPT-3 (Megatron-LM of 2021-01): DDP whose all-reduce waits for the backward (``search
  --no-data-overlap``), 1F1B, full or no recomputation, no sequence or context parallelism
  (2022, 2023), every tensor-parallel collective waited for;
- Llama 3: the FSDP family (``zero2`` for "FSDP without resharding after forward", ``zero3``
  for resharding, ``hsdp`` for hybrid sharding), every other degree open (the paper uses context
  parallelism for long sequences).

GPT-3 is searched twice more: over Megatron-LM of 2022 (Korthikanti et al., arXiv 2205.05198:
interleaving, sequence parallelism, selective recomputation, the backward overlap; DDP still
waited for) and over what Megatron-LM offered once it had its distributed optimizer (ZeRO-1,
``zero1``) and overlapped its data-parallel traffic (2023): DDP or ``zero1``, no context
parallelism. In a pipeline the search reduces ZeRO-2/3 and HSDP gradients once a step
(``reduce = step``), as the pipeline runtimes do (docs/search.md).

The goal line is printed for every search; only the first (every layout) is the issue's goal as
written.

``--breakdown N`` also prints, for the N fastest layouts that fit (full model; each marked
``proved`` when the search verified it, ``-`` when it did not need to) and for the published
layout, where the step time goes: compute, the pipeline bubble's idle compute, the exposed
communication per axis (tensor, context, pipeline, expert, data: every collective over a data
axis, with its share of the bubble), the host, and the optimizer step, which add up to the step
time; then the published layout minus the fastest, term by term (docs/search.md). For
Llama 3 it adds the published degrees with ZeRO-1 in place of ZeRO-2, and whether they fit.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402  (benchmarks/figures.py: the Measured figures page)

from placeverify.api import load_text, parse  # noqa: E402
from placeverify.cost.time import step_time  # noqa: E402
from placeverify.diagnostics import Source  # noqa: E402
from placeverify.ir.placement import TensorOverlap  # noqa: E402
from placeverify.search.problem import Problem, problem_from  # noqa: E402
from placeverify.search.run import Evaluated, SearchResult, evaluate, search  # noqa: E402
from placeverify.search.screen import Screen, Setting  # noqa: E402
from placeverify.search.space import Layout, Recompute, Sharding, Space, stage_layers  # noqa: E402


def problem(model: str, dev: str, devices: int, batch: int, seq: int,
            precision: str = "megatron") -> Problem:
    text = (f'strategy "base"\nmodel {model} {{ seq = {seq}, micro_batch = 1 }}\n'
            f"precision {precision}\nmesh {{\n    dp = {devices}\n    device = {dev}\n}}\n"
            "place ddp over dp\n")
    return problem_from(load_text(text, "<base>"), parse(Source("<base>", text)),
                        global_batch=batch)


Run = tuple[str, Problem, Layout, Space, list[tuple[str, Space]]]


def llama3_405b() -> Run:
    pb = problem("llama3_405b", "h100_sxm", 16384, 2048, 8192)
    stages = stage_layers(126, 16, 8, uneven=True)
    assert isinstance(stages, tuple)
    published = Layout(tp=8, cp=1, pp=16, v=8, ep=1, dp=128, sharding=Sharding.ZERO2, shard=128,
                       sp=True, recompute=Recompute.NONE, offload=False, b=1, m=16,
                       stages=stages, reduce_step=True)
    own = Space(shardings=(Sharding.ZERO2, Sharding.ZERO3, Sharding.HSDP))
    return ("Llama 3 405B, 16,384 x H100, 16M tokens x 8192", pb, published, Space(),
            [("the run's own choices: the FSDP family (zero2, zero3, hsdp)", own)])


def gpt3_175b() -> Run:
    """The run of Megatron-LM's README (module docstring): fp16 with fp16 gradients."""
    pb = problem("gpt3_175b", "a100_80gb_sxm", 1024, 1536, 2048, precision="mixed_adam")
    backward = TensorOverlap.BACKWARD  # Megatron-LM's tensor-parallel layers (module docstring)
    published = Layout(tp=8, cp=1, pp=16, v=1, ep=1, dp=8, sharding=Sharding.DDP, shard=8,
                       sp=False, recompute=Recompute.FULL, offload=False, b=1, m=192,
                       dp_wait=True)
    every = Space(tp_overlap=backward)
    own = Space(shardings=(Sharding.DDP,), max_cp=1, max_v=1, data_overlap=False,
                sequence_parallel=(False,), recomputes=(Recompute.NONE, Recompute.FULL))
    korthikanti = Space(shardings=(Sharding.DDP,), max_cp=1, data_overlap=False,
                        tp_overlap=backward)
    later = Space(shardings=(Sharding.DDP, Sharding.ZERO1), max_cp=1, tp_overlap=backward)
    return ("GPT-3 175B, 1,024 x A100 80GB, batch 1536 x 2048, fp16", pb, published, every,
            [("the run's own choices: Megatron-LM of 2021-01: DDP waiting for its all-reduce, "
              "1F1B, full or no recomputation, no sequence or context parallelism, every "
              "tensor-parallel collective waited for", own),
             ("Megatron-LM of 2022 (Korthikanti et al.): that, with interleaving, sequence "
              "parallelism, selective recomputation and the backward overlap", korthikanti),
             ("Megatron-LM with its distributed optimizer: DDP or zero1, no context "
              "parallelism", later)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--breakdown", type=int, default=0, metavar="N",
                        help="print the step-time terms of the N fastest layouts that fit and "
                             "of the published layout (default: 0, none)")
    figures.add_docs_flag(parser)
    args = parser.parse_args()
    found: list[figures.Figure] = []
    for name, pb, published, every, spaces in (llama3_405b(), gpt3_175b()):
        screen = Screen(Setting(pb.arch, pb.precision, pb.device, pb.compute_dtype,
                                float(pb.pcie_bandwidth)))
        mine = evaluate(pb, published, screen.estimate(published))
        zero1 = replace(published, sharding=Sharding.ZERO1, reduce_step=False)
        variant = (evaluate(pb, zero1, screen.estimate(zero1))
                   if published.sharding is Sharding.ZERO2 else None)
        print(f"== {name}")
        for title, space in [("every layout", every), *spaces]:
            started = time.perf_counter()
            result = search(pb, space, top=5)
            wall = time.perf_counter() - started
            s = result.seconds
            print(f"  -- {title}")
            print(f"  {result.candidates:,} legal layouts screened in {s['screen']:.2f} s: "
                  f"{result.rate:,.0f} layouts/s")
            print(f"  {result.finalists} finalists under the full model in {s['evaluate']:.2f} s; "
                  f"{len(result.verdicts)} verified in {s['verify']:.2f} s; total {wall:.2f} s "
                  f"(frontier: {len(result.frontier)} layouts, all proved)")
            peak_dev, time_dev = result.screen_deviation
            print(f"  screen vs full model among the finalists: peak within "
                  f"{100 * peak_dev:.2f}%, step time within {100 * time_dev:.2f}%")
            for rank, e in enumerate(result.top, 1):
                print(f"  {rank}. {e.label:52s} {e.step_seconds:8.3f} s  "
                      f"{e.needed_bytes / 1e9:6.1f} GB  MFU {100 * (e.mfu or 0):.1f}%")
            figure = (f"{result.candidates:,} legal layouts screened at {result.rate:,.0f} per "
                      f"second; {wall:.2f} s with the frontier verified")
            if mine is None:
                print(f"  published layout {published.label()}: rejected by the language")
                found.append((f"{name}: {title}", f"{figure}; the published layout is rejected"))
                continue
            figure += "; " + ranked(result, mine, published)
            found.append((f"{name}: {title}", figure))
            if args.breakdown:
                breakdown(result, mine, args.breakdown, variant)
    if args.docs:
        figures.write_section("search", "`placeverify search` on two published runs", found,
                              name=args.docs_name, facts=figures.machine(load=True))
    return 0


def ranked(result: SearchResult, own: Evaluated, published: Layout) -> str:
    """Where the published layout ranks, and whether the goal holds (printed, and returned in
    short)."""
    faster = sum(1 for e in result.evaluated if e.step_seconds < own.step_seconds)
    best = result.top[0].step_seconds if result.top else float("nan")
    near = [e for e in result.top if abs(e.step_seconds / own.step_seconds - 1) <= 0.05]
    print(f"  published {published.label()}: {own.step_seconds:.3f} s, "
          f"{own.needed_bytes / 1e9:.1f} GB, fits {own.fits}; rank {faster + 1} among the "
          f"finalists that fit; top-1 is {100 * (own.step_seconds / best - 1):+.1f}% faster")
    print(f"  goal (published or one within 5% of it in the top 5): "
          f"{'met' if faster < 5 or near else 'NOT met'} "
          f"({len(near)} of the top 5 within 5%)")
    return (f"the published layout ranks {faster + 1} ({own.step_seconds:.3f} s); goal "
            f"{'met' if faster < 5 or near else 'NOT met'} ({len(near)} of the top 5 within 5%)")


TERMS = ("compute", "bubble", "tp", "cp", "pp", "ep", "data", "host", "optimizer")
DATA_AXES = {"dp", "replica", "shard"}


def terms(e: Evaluated) -> dict[str, float]:
    """Where one layout's step time goes, in seconds; the terms add up to the step time.

    ``bubble`` is the pipeline's idle compute time, (p - 1) / v micro-batches of compute; the
    per-micro-batch communication (tensor, context, expert, pipeline) is under its axis with its
    own share of the bubble, as the step-time model reports it. A collective over a data axis
    (alone or with the context axis: the gradient reduction over dp x cp) is ``data``; another
    group of several axes is counted under its first axis."""
    st = step_time(e.strategy, e.costs)
    assert st is not None and st.step_seconds is not None and st.compute_seconds is not None
    out = dict.fromkeys(TERMS, 0.0)
    for label, seconds in st.exposed:
        axes = label.split(" * ")
        key = "data" if DATA_AXES.intersection(axes) else axes[0]
        if key not in TERMS:
            raise ValueError(f"an exposed-communication label this breakdown does not know: {label}")
        out[key] += seconds
    out["compute"] = st.compute_seconds
    out["optimizer"] = st.optimizer_seconds or 0.0
    out["bubble"] = st.step_seconds - sum(out.values())
    return out


def breakdown(result: SearchResult, own: Evaluated, n: int,
              variant: Evaluated | None = None) -> None:
    """The terms of the ``n`` fastest layouts that fit, of the published one and of a variant
    of it (the published degrees with ZeRO-1), and the published layout minus the fastest,
    term by term."""
    print(f"  step-time terms, seconds (the {n} fastest that fit, and the published layout; "
          "bubble: its idle compute; each axis: its exposed communication)")
    head = " ".join(f"{t:>9s}" for t in TERMS)
    print(f"    {'layout':52s} {'step':>7s} {head} {'peak GB':>8s}  verified")
    rows = [(e, result.verdicts.get(e.label, "-")) for e in result.evaluated[:n]]
    extra = [] if variant is None else [(variant, f"zero1 variant, fits {variant.fits}")]
    for e, verdict in [*rows, (own, "published"), *extra]:
        t = terms(e)
        cells = " ".join(f"{t[k]:9.3f}" for k in TERMS)
        print(f"    {e.label:52s} {e.step_seconds:7.3f} {cells} {e.needed_bytes / 1e9:8.1f}  "
              f"{verdict}")
    if result.evaluated:
        best, mine = terms(result.evaluated[0]), terms(own)
        cells = " ".join(f"{mine[k] - best[k]:+9.3f}" for k in TERMS)
        gap = own.step_seconds - result.evaluated[0].step_seconds
        print(f"    {'published minus the fastest':52s} {gap:+7.3f} {cells}")


if __name__ == "__main__":
    sys.exit(main())
