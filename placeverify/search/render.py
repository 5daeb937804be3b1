"""A layout as a ``.place`` file: what ``search`` evaluates with the full model and ``-o`` writes.

The text is an ordinary strategy (no ``step`` block: the canonical step of the presets is what
is verified), so that ``placeverify check`` on a written file gives exactly the figures and
verdicts ``search`` printed for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from placeverify.ir.model import ARCHITECTURES, Transformer
from placeverify.ir.placement import TensorOverlap
from placeverify.search.problem import Problem
from placeverify.search.screen import axis_order
from placeverify.search.space import Layout, Recompute, Sharding

# Transformer field -> (model key, how its value is written)
_WORDS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "gated": ("mlp", lambda v: "gated" if v else "plain"),
    "tied_embeddings": ("embeddings", lambda v: "tied" if v else "untied"),
    "bias": ("bias", lambda v: "true" if v else "false"),
    "dropout": ("dropout", lambda v: "true" if v else "false"),
    "head_size": ("head_dim", str),
    "qkv_bias": ("qkv_bias", lambda v: "true" if v else "false"),
    "qk_norm": ("qk_norm", lambda v: "true" if v else "false"),
    "sandwich_norm": ("sandwich_norm", lambda v: "true" if v else "false"),
}


LAYER_KIND_FIELDS = ("latent", "shared_experts", "dense_layers", "moe_every")


def model_text(name: str, arch: Transformer) -> str:
    """``model NAME { ... }`` giving exactly ``arch``: a bundled model with the fields that
    differ from it, or ``transformer`` with every field."""
    base = ARCHITECTURES.get(name)
    entries = []
    for f in fields(Transformer):
        value = getattr(arch, f.name)
        if base is not None and getattr(base, f.name) == value and f.name not in ("seq",
                                                                                    "micro_batch"):
            continue
        if f.name == "head_size" and not value:
            continue  # the default width, hidden / heads
        if f.name in LAYER_KIND_FIELDS and value == f.default:
            continue  # Llama's layers (search refuses the others: problem.py)
        assert f.name != "latent", "search refuses latent attention (problem.py)"
        key, write = _WORDS.get(f.name, (f.name, str))
        entries.append(f"{key} = {write(value)}")
    head = name if base is not None else "transformer"
    return f"model {head} {{ " + ", ".join(entries) + " }"


def place_text(problem: Problem, lay: Layout) -> str:
    """The ``.place`` text of one layout of a problem."""
    arch = problem.arch_for(lay.b)
    lines = [f"# placeverify search: {problem.title} on {lay.devices} x {problem.device.key}, "
             f"global batch {problem.global_batch} x {arch.seq} tokens",
             f'strategy "{lay.label()}"', "", model_text(problem.model_name, arch),
             problem.precision_text, "", "mesh {"]
    lines += [f"    {name} = {size}" for name, size in axis_order(lay)]
    if lay.dp == 1 and lay.sharding is not Sharding.NONE:  # ZeRO-Offload over one rank
        lines.append("    dp = 1")
    if lay.devices == 1:
        lines.append("    world = 1")
    lines.append(f"    device = {problem.device.key}")
    lines += [f"    {line}" for line in problem.mesh_lines(lay.offload)]
    lines += ["}", ""]
    if lay.tp > 1:
        options = (["sequence_parallel"] if lay.sp else []) + (
            ["overlap = true"] if lay.tp_overlap is TensorOverlap.ALL else
            ["overlap = backward"] if lay.tp_overlap is TensorOverlap.BACKWARD else [])
        lines.append(f"place megatron({', '.join(options)}) over tp" if options
                     else "place megatron over tp")
    if lay.cp > 1:
        lines.append("place context over cp")
    if lay.ep > 1:
        lines.append("place expert over ep")
    if lay.pp > 1:
        options = (["interleaved", f"chunks = {lay.v}"] if lay.v > 1 else ["1f1b"])
        options.append(f"microbatches = {lay.m}")
        if lay.stages is not None:
            options.append("layers = [" + ", ".join(str(n) for n in lay.stages) + "]")
        lines.append(f"place pipeline({', '.join(options)}) over pp")
    elif lay.m > 1:
        lines.append(f"microbatches = {lay.m}")
    written = [o for o, on in (("reduce = step", lay.reduce_step),
                               ("overlap = none", lay.dp_wait)) if on]
    once = f"({', '.join(written)})" if written else ""
    if lay.sharding is Sharding.HSDP:
        lines.append(f"place hsdp{once} over shard * replica")
    elif lay.sharding is not Sharding.NONE:
        lines.append(f"place {lay.sharding.value}{once} over dp")
    if lay.offload:
        lines.append("offload optimizer, gradients to cpu")
    lines.append(f"recompute {lay.recompute.value}" if lay.recompute is not Recompute.NONE
                 else "recompute none")
    lines += problem.tail
    return "\n".join(lines) + "\n"
