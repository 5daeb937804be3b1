"""The pipeline stages of Megatron-LM arguments: virtual stages per rank (the interleaved
schedule), the layers of each stage where a flag splits them unevenly, and the ``place
pipeline(...)`` line they make (``megatron/core/transformer/transformer_block.py``,
``get_num_layers_to_build``, and ``validate_args`` in ``megatron/training/arguments.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from placeverify.diagnostics import Code
from placeverify.importers.arguments import Arguments
from placeverify.importers.common import Line, Reader
from placeverify.importers.origins import Origin, Value


@dataclass(frozen=True, slots=True)
class Stages:
    """How the arguments split the layers over the pipeline: virtual stages per rank (more
    than 1), the layers per virtual stage when the embedding and the loss count as layers, and
    the layers per stage when the end stages are given."""

    virtual: Value | None
    accounted: Value | None
    uneven: Value | None


def read_stages(args: Arguments, reader: Reader, p: int) -> Stages:
    """The stages of ``p`` pipeline ranks (each split's errors at its flag)."""
    virtual = _virtual_stages(args, reader, p)
    uneven = _uneven_stages(args, reader, p, virtual)
    accounted = _accounted_stages(args, reader, p, virtual)
    return Stages(virtual, accounted, uneven)


def pipeline_line(stages: Stages, pp: Value, m: int) -> Line:
    """``place pipeline(...) over pp`` with ``m`` micro-batches: interleaved over the virtual
    stages, else 1F1B, with the layers of each stage where a flag splits them unevenly."""
    why = "micro-batches = global / (micro x dp)"
    if stages.virtual is not None:
        vpp, accounted = stages.virtual, stages.accounted
        listed = ("" if accounted is None else
                  f", layers = [{', '.join(str(n) for n in accounted.value)}]")
        return Line(f"place pipeline(interleaved, chunks = {vpp.value}, microbatches = {m}"
                    f"{listed}) over pp", f"{vpp.origin.key}; {why}"
                    + ("" if accounted is None else f"; {accounted.origin.key}"), vpp.origin)
    split = stages.accounted if stages.accounted is not None else stages.uneven
    if split is not None:
        return Line(f"place pipeline(1f1b, microbatches = {m}, layers = "
                    f"[{', '.join(str(n) for n in split.value)}]) over pp",
                    f"{split.origin.key}; {why}", split.origin)
    return Line(f"place pipeline(1f1b, microbatches = {m}) over pp", f"{pp.origin.key}; {why}",
                pp.origin)


def _virtual_stages(args: Arguments, reader: Reader, p: int) -> Value | None:
    per_stage = args.integer("--num-layers-per-virtual-pipeline-stage")
    stages = args.integer("--num-virtual-stages-per-pipeline-rank") or \
        args.integer("--virtual-pipeline-model-parallel-size")
    if stages is not None:
        return stages if int(str(stages.value)) > 1 else None
    if per_stage is None:
        return None
    layers = args.integer("--num-layers")
    if layers is None:
        return None
    # validate_args counts the embedding and the loss as layers when the split accounts for them
    extra = sum(args.flag(name) is not None for name in (
        "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"))
    per_rank, rest = divmod(int(str(layers.value)) + extra, p)
    if rest or per_rank % int(str(per_stage.value)):
        counted = f" + {extra} (the split accounts for them)" if extra else ""
        reader.error(f"--num-layers {layers.value}{counted} / --pipeline-model-parallel-size {p} "
                     f"is not a multiple of {per_stage.value} layers per virtual stage",
                     per_stage.origin, code=Code.NOT_DIVISIBLE)
        return None
    chunks = per_rank // int(str(per_stage.value))
    return Value(chunks, per_stage.origin) if chunks > 1 else None




def _uneven_stages(args: Arguments, reader: Reader, p: int, vpp: Value | None) -> Value | None:
    """Layers per stage from --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers:
    the given end stages hold those counts, the other stages the remaining layers evenly
    (megatron/core/transformer/transformer_block.py, ``get_num_layers_to_build``, which asserts
    that the rest divides evenly over the remaining stages)."""
    first = args.integer("--decoder-first-pipeline-num-layers")
    last = args.integer("--decoder-last-pipeline-num-layers")
    given = first or last
    if given is None:
        return None
    if vpp is not None or p < 2:
        why = "with a virtual pipeline" if vpp is not None else "without pipeline stages"
        reader.error(f"not modelled: uneven pipeline stages {why}", given.origin,
                     code=Code.NOT_MODELLED)
        return None
    layers = args.integer("--num-layers")
    if layers is None:
        reader.error(f"{given.origin.key} needs --num-layers to split the other stages",
                     given.origin, code=Code.MISSING)
        return None
    rest, left = int(str(layers.value)), p
    for end in (first, last):
        if end is not None:
            rest, left = rest - int(str(end.value)), left - 1
    if (left == 0 and rest != 0) or (left > 0 and (rest <= 0 or rest % left)):
        reader.error(f"--num-layers {layers.value} leaves {rest} layers for the other {left} "
                     f"pipeline stages, not a positive multiple of {left} (Megatron-LM asserts "
                     "that the remaining layers split evenly)", given.origin,
                     code=Code.NOT_DIVISIBLE)
        return None
    middle = rest // left if left else 0
    stages = [middle] * p
    if first is not None:
        stages[0] = int(str(first.value))
    if last is not None:
        stages[-1] = int(str(last.value))
    return Value(tuple(stages), given.origin)


def _accounted_stages(args: Arguments, reader: Reader, p: int,
                      vpp: Value | None) -> Value | None:
    """Layers per virtual stage under --account-for-embedding-in-pipeline-split /
    --account-for-loss-in-pipeline-split (megatron/core/transformer/transformer_block.py,
    ``get_num_layers_to_build``): the embedding and the loss count as a layer each, L + 1 (+ 1)
    split evenly over the p · v virtual stages, and the first (last) virtual stage builds one
    transformer layer fewer; the total must divide by p and each stage's share by v."""
    emb = args.flag("--account-for-embedding-in-pipeline-split")
    loss = args.flag("--account-for-loss-in-pipeline-split")
    given = emb or loss
    if given is None or p < 2:
        return None
    flags = " and ".join(name for name, v in (("--account-for-embedding-in-pipeline-split", emb),
                                              ("--account-for-loss-in-pipeline-split", loss))
                         if v is not None)
    if args.integer("--decoder-first-pipeline-num-layers") or \
            args.integer("--decoder-last-pipeline-num-layers"):
        reader.error(f"{flags} with --decoder-first/last-pipeline-num-layers: Megatron-LM "
                     "asserts they do not combine (get_num_layers_to_build)", given.origin,
                     code=Code.CONFLICT)
        return None
    layers = args.integer("--num-layers")
    if layers is None:
        return None  # already an error: no model
    v = int(str(vpp.value)) if vpp is not None else 1
    total = int(str(layers.value)) + (emb is not None) + (loss is not None)
    said = f"--num-layers {layers.value} + {total - int(str(layers.value))} ({flags})"
    if total % p or (total // p) % v:
        over = f"pp {p}" if total % p else f"pp {p} x virtual stages {v}"
        reader.error(f"{said} = {total} does not split evenly over {over} (Megatron-LM asserts "
                     "it, get_num_layers_to_build)", given.origin, code=Code.NOT_DIVISIBLE)
        return None
    counts = [total // (p * v)] * (p * v)
    if emb is not None:
        counts[0] -= 1
    if loss is not None:
        counts[-1] -= 1
    return Value(tuple(counts), Origin(f"{said} = {total} over {p * v} virtual stages, "
                                       f"{total // (p * v)} each, one fewer at the ends",
                                       given.origin.source, given.origin.span))
