"""Megatron-LM's data axis: DDP, the distributed optimizer (ZeRO-1), torch FSDP2 or Megatron-FSDP,
with the overlap that --overlap-grad-reduce and --overlap-param-gather give."""

from __future__ import annotations

from placeverify.diagnostics import Code
from placeverify.importers import megatron_fsdp
from placeverify.importers.arguments import Arguments
from placeverify.importers.common import Line, Reader
from placeverify.importers.origins import Origin, Value


def data_placement(args: Arguments, reader: Reader, fsdp2: Value | None,
                    dist_opt: Value | None) -> Line:
    """Megatron-LM's data axis: torch FSDP2, the distributed optimizer (ZeRO-1) or DDP, with the
    overlap its flags give."""
    fsdp = megatron_fsdp.flag(args)
    if fsdp is not None:
        args.used.update({"--overlap-grad-reduce", "--overlap-param-gather"})
        return megatron_fsdp.placement(args, reader, fsdp)
    overlap_on = data_overlap(args, reader, dist_opt is not None)
    if fsdp2 is not None:
        return Line("place fsdp over dp", "--use-torch-fsdp2", fsdp2.origin)
    if dist_opt is not None:
        return Line(f"place zero1{overlap_on.value} over dp",
                    f"--use-distributed-optimizer; {overlap_on.origin.key}", dist_opt.origin)
    return Line(f"place ddp{overlap_on.value} over dp",
                f"no --use-distributed-optimizer; {overlap_on.origin.key}", overlap_on.origin)


def data_overlap(args: Arguments, reader: Reader, dist_opt: bool) -> Value:
    """The data axis's overlap option from --overlap-grad-reduce / --overlap-param-gather, both
    off by default (``DistributedDataParallelConfig``): without the first, the gradients are
    reduced after the last backward, nothing overlapped; with it alone, the distributed
    optimizer's parameter all-gather still runs after the update. validate_args asserts the
    second only with the first and the distributed optimizer."""
    grads = args.flag("--overlap-grad-reduce")
    params = args.flag("--overlap-param-gather")
    if params is not None and (grads is None or not dist_opt):
        need = "--overlap-grad-reduce" if grads is None else "--use-distributed-optimizer"
        reader.error(f"--overlap-param-gather without {need}: Megatron-LM asserts it "
                     "(validate_args)", params.origin, code=Code.BAD_VALUE)
    if grads is None:
        return Value("(overlap = none)",
                     Origin("no --overlap-grad-reduce: gradients reduced after the backward",
                            reader.source, None))
    if params is None and dist_opt:
        return Value("(overlap = grads)", Origin(
            "--overlap-grad-reduce, no --overlap-param-gather: parameters gathered after the "
            "update", grads.origin.source, grads.origin.span))
    return Value("", Origin("--overlap-grad-reduce" + (" + --overlap-param-gather" if dist_opt
                                                        else ""),
                            grads.origin.source, grads.origin.span))
