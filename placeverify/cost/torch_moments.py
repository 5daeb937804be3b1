"""What torch's implementations hold at the step's moments beyond the placement's states
(:mod:`placeverify.cost.peak`, under the ``torch`` and ``torch_cpu`` memory profiles).

FSDP2's gathered units, its root unit and prefetch at the start of backward, and its ZeRO-2
(``reshard_after_forward=False``) padded shards and post-backward buffers; gloo's all-gather
output held by its worker thread; ``torch.distributed.pipelining``'s receive buffers and kept
outputs; the loss's backward; eager autograd's gradient accumulation temporaries; DDP's buckets;
Adam's temporaries.
Each function cites the torch 2.13 source it follows and ``benchmarks/peak_memory.py`` the
allocations of real runs.
"""

from __future__ import annotations

from fractions import Fraction

from placeverify.cost.implementations.params import ParamTensor, transformer_params
from placeverify.cost.memory import RankMemory, kept_parameter_axes
from placeverify.ir.model import ParamGroup
from placeverify.ir.placement import Role, State
from placeverify.ir.strategy import Strategy
from placeverify.roles.queries import gathered_axes, partitions


def category_bytes(rank: RankMemory, category: str) -> Fraction:
    """The device bytes of one memory category on a rank kind."""
    return sum((Fraction(i.bytes) for i in rank.items if not i.host and i.category == category),
               Fraction(0))


def role_size(strategy: Strategy, role: Role) -> int:
    """The product of the sizes of the axes placed with ``role``."""
    size = 1
    for p in strategy.placements:
        if p.role is role:
            size *= strategy.size(p.axis)
    return size


def replicated_gradient_axes(strategy: Strategy) -> bool:
    """Whether some data axis (of size > 1) all-reduces replicated gradients (DDP's buckets)."""
    return any(p.role is Role.DATA and strategy.size(p.axis) > 1
               and not partitions(strategy, p.axis, State.GRADIENTS)
               for p in strategy.placements)


def _largest_tensor(strategy: Strategy) -> Fraction:
    """Elements of the largest single parameter tensor on a device (tensor-parallel split)."""
    arch = strategy.model.arch
    assert arch is not None
    t = 1
    for p in strategy.placements:
        if p.role is Role.TENSOR:
            t *= strategy.size(p.axis)
    largest = max(arch.largest_layer_matrix(), arch.padded_vocab(t) * arch.hidden)
    return Fraction(largest, t)


def fsdp2_resharding(strategy: Strategy, profile: str) -> bool:
    """Whether the step runs FSDP2-style gathered units that reshard after forward under a torch
    profile: a gathered (S*) axis of size > 1 whose parameters are not kept gathered."""
    if profile not in ("torch", "torch_cpu") or strategy.model.arch is None:
        return False
    axes = [a for a in gathered_axes(strategy) if strategy.size(a) > 1]
    return bool(axes) and all(strategy.placement(a).reshard_after_forward for a in axes) \
        and not set(axes) <= set(kept_parameter_axes(strategy))


def layer_unit(strategy: Strategy) -> Fraction:
    """Parameters of one layer's FSDP2 unit on a device (÷ t, experts ÷ t·ep)."""
    arch = strategy.model.arch
    assert arch is not None
    t, ep = role_size(strategy, Role.TENSOR), role_size(strategy, Role.EXPERT)
    layer = arch.layer_params()
    return (Fraction(layer[ParamGroup.DENSE], t) + layer[ParamGroup.NORMS]
            + Fraction(layer[ParamGroup.EXPERTS], t * ep))


def fsdp2_backward_parts(strategy: Strategy, rank: RankMemory, profile: str
                         ) -> list[tuple[str, Fraction]]:
    """What FSDP2 adds at the start of the last layer's backward, its peak while every layer's
    activations are still alive (``torch.distributed.fsdp.fully_shard``, PyTorch docs, and the
    allocations of a real run, ``benchmarks/peak_memory.py``):

    - the root unit (the embedding, the final norm and the output layer, ``fully_shard`` on the
      model itself) stays gathered from forward to the end of backward: FSDP2 does not reshard
      the root after forward (it would be gathered again at once);
    - the root's unsharded gradients made so far (the output layer's and the final norm's; the
      embedding's comes last), alive until the root's reduce-scatter at the end of backward;
    - the gradient flowing back into the last layer, one hidden state (e·b·s·h);
    - the last layer's unit, gathered again for backward, and the one before it, prefetched
      (FSDP2 prefetches one unit in backward by default);
    - ``torch_cpu``: gloo's all-gather stages the gathered unit once more while it runs (the
      CPU trace shows the transient beside the output).

    The unit's own unsharded gradients come as its activations go (each reduce-scatter runs
    after the unit's parameters are resharded), so this moment is the backward's largest when a
    layer's activations outweigh its gradients; a unit's gradients beyond its activations are
    counted too."""
    arch = strategy.model.arch
    assert arch is not None
    t = role_size(strategy, Role.TENSOR)
    pb, gb, eb = (Fraction(strategy.precision.params), Fraction(strategy.precision.grads),
                  Fraction(strategy.precision.activations))
    unit = layer_unit(strategy)
    word = Fraction(arch.padded_vocab(t) * arch.hidden, t)
    positions = Fraction(arch.position_rows * arch.hidden)  # whole on every tensor rank
    output = Fraction(0) if arch.tied_embeddings else word
    root = word + positions + output + arch.norm_params()
    root_grads = (word if arch.tied_embeddings else output) + arch.norm_params()
    sp = any(p.sequence_parallel for p in strategy.placements if p.role is Role.TENSOR)
    hidden = eb * arch.micro_batch * arch.seq * arch.hidden / (t if sp else 1) \
        / role_size(strategy, Role.CONTEXT)
    parts = [("root unit gathered (not resharded after forward)", root * pb),
             ("root unit's unsharded gradients (output layer, final norm)", root_grads * gb),
             ("activation gradient (one hidden state)", hidden),
             ("last layer's unit gathered for backward, and the next prefetched", 2 * unit * pb)]
    per_layer = category_bytes(rank, "activations") / arch.layers if arch.layers else Fraction(0)
    if unit * gb > per_layer:
        parts.append(("a unit's unsharded gradients beyond its activations", unit * gb - per_layer))
    if profile == "torch_cpu":
        parts.append(("gloo all-gather staging (one unit)", unit * pb))
    return parts


# The start of backward in the order where gloo's worker thread lets go of the last layer's
# all-gather after FSDP2 does (``torch_cpu``): a moment of the same step, not another step.
GLOO_HELD_MOMENT = "start of backward, gloo still holding the last all-gather"
GLOO_HELD_LABEL = "last layer's all-gather output (its last reference on gloo's worker thread)"


def gloo_held_parts(strategy: Strategy) -> list[tuple[str, Fraction]]:
    """``torch_cpu``: the last layer's all-gather output alive beside the next unit's prefetch,
    in the order the implementation allows when gloo's worker thread drops its reference last.

    The gloo backend runs a collective on a worker thread that keeps its reference to the work
    (and through it to the output tensor) after the work is complete: torch's
    ``ProcessGroupGloo::runLoop`` (``torch/csrc/distributed/c10d/ProcessGroupGloo.cpp``) takes
    ``auto work = std::move(workQueue_.front())``, runs it (which completes the future that
    ``wait()`` returns on) and only then, under the lock, ``workInProgress_[workerIndex].reset()``;
    the local ``work`` goes at the end of that loop iteration. FSDP2's pre-backward
    (``_fsdp_param_group.py`` line 576, torch 2.13) copies the last layer's unit out of its
    all-gather output, drops that output (line 489, ``self._all_gather_result = None  # free
    unless saved in `all_gather_state```) and prefetches the next unit (line 585,
    ``self._backward_prefetch()``), whose all-gather output and gloo's staging are allocated at
    once. When the worker thread has not yet left its loop iteration (it has not been scheduled
    since the work completed), the output is freed by the worker, after those allocations: one
    unit more at this moment. Which order happens depends on thread scheduling (CPU runs of
    ``examples/measure/zero3.place`` show both); the peak is the larger. A worker thread
    starved for longer (each of gloo's threads holding a finished work) would hold more: not
    modelled."""
    return [(GLOO_HELD_LABEL, layer_unit(strategy) * Fraction(strategy.precision.params))]


def fsdp2_zero2_world(strategy: Strategy, profile: str) -> int:
    """W, the data-parallel size over which torch runs FSDP2's
    ``fully_shard(reshard_after_forward=False)`` under a torch profile: torch has no other
    ZeRO-2, and ``measure``'s plan runs ``zero2`` (R, S, S) and ``fsdp`` / ``zero3`` with
    ``reshard_after_forward = false`` (S*, S, S) so. Data axes of size > 1 that shard the
    gradients and keep the parameters whole or gathered from forward to backward. 1 where this
    does not apply or is not modelled (tensor, pipeline, expert or context axes of size > 1,
    experts, latent attention, or a step that keeps the gathered parameters after the update as written)."""
    arch = strategy.model.arch
    if profile not in ("torch", "torch_cpu") or arch is None or arch.moe \
            or arch.latent is not None:
        return 1
    if any(p.role is not Role.DATA and strategy.size(p.axis) > 1 for p in strategy.placements):
        return 1
    world = 1
    for p in strategy.placements:
        if (p.role is Role.DATA and strategy.size(p.axis) > 1
                and partitions(strategy, p.axis, State.GRADIENTS)
                and not partitions(strategy, p.axis, State.PARAMS)):
            world *= strategy.size(p.axis)
        elif (p.role is Role.DATA and strategy.size(p.axis) > 1
                and p.axis in gathered_axes(strategy) and not p.reshard_after_forward):
            if p.axis in kept_parameter_axes(strategy):
                return 1
            world *= strategy.size(p.axis)
    return world


def _padded_rows(tensors: list[ParamTensor], world: int) -> int:
    """Elements of one rank's FSDP2 storage for ``tensors``: dim 0 padded to a multiple of
    ``world`` and cut in ``world`` (``_fsdp_param.py``: ``_sharded_param_data`` is the padded
    chunk; the first rank's real shard is all of it, ``torch.chunk``'s ⌈rows/W⌉)."""
    total = 0
    for t in tensors:
        rest = t.numel // t.shape[0]
        total += -(-t.shape[0] // world) * rest
    return total


def fsdp2_zero2_parts(strategy: Strategy, rank: RankMemory, world: int, profile: str
                      ) -> dict[str, list[tuple[str, Fraction]]]:
    """What FSDP2 with ``reshard_after_forward=False`` holds on its fullest rank (the first: every
    shard ⌈rows/W⌉), torch 2.13's ``_fully_shard`` (one unit per layer and the root, as
    ``placeverify measure`` wraps them):

    - ``states``: the parameters as padded shards (``_sharded_param_data``), the optimizer's state
      as ``zeros_like`` of the first rank's real shard (the same size), the sharded gradients as
      the reduce-scatter's padded output;
    - ``gathered``: every unit's unsharded parameters, kept from its forward to its post-backward
      (``FSDPParam.init_all_gather_outputs``: ``numel * world_size`` of the padded shard);
    - ``post_backward``: at the last layer's post-backward (its peak, every other layer's
      activations still alive) the unit has resharded first (``_fsdp_param_group.py``
      ``post_backward``: ``if self.reshard_after_backward: self.reshard()`` before
      ``foreach_reduce``), so every other unit is still gathered; ``foreach_reduce``
      (``_fsdp_collectives.py``) holds the unit's unsharded gradients (``unsharded_grads``,
      cleared only after the copy-in) beside the reduce-scatter input, a new flat buffer of the
      padded size (``reduce_scatter_comm.allocate((reduce_scatter_input_numel,))``), and on CPU
      ``_chunk_cat`` copies each gradient whose dim 0 W does not divide into a padded tensor
      before the cat (``torch/_decomp/decompositions.py`` ``_pad_chunk``:
      ``aten.constant_pad_nd`` when ``pad_along_dim != tensor_size[dim]``; CUDA has its own
      kernel, none counted); the root's unsharded gradients made so far (output layer, final
      norm) and the gradient flowing into the layer before (one hidden state)."""
    arch = strategy.model.arch
    assert arch is not None
    pb, gb = Fraction(strategy.precision.params), Fraction(strategy.precision.grads)
    ob = Fraction(strategy.precision.optimizer)
    tensors = transformer_params(arch)
    shard = _padded_rows(tensors, world)
    last = [t for t in tensors if t.unit == f"layers.{arch.layers - 1}"]
    unit_real = sum(t.numel for t in last)
    unit_padded = world * _padded_rows(last, world)
    copied = world * _padded_rows([t for t in last if t.shape[0] % world], world)
    output = Fraction(0) if arch.tied_embeddings else Fraction(arch.vocab * arch.hidden)
    root_grads = (Fraction(arch.vocab * arch.hidden) if arch.tied_embeddings else output) \
        + arch.norm_params()
    per_layer = category_bytes(rank, "activations") / arch.layers if arch.layers else Fraction(0)
    return {
        "states": [(f"Θ params (FSDP2 shards, dim 0 padded to a multiple of {world})",
                    shard * pb),
                   ("Ω optimizer (the first rank's shard, ⌈rows/W⌉ of each tensor)",
                    shard * ob)],
        "grads": [("G gradients (padded reduce-scatter outputs)", shard * gb)],
        "gathered": [("Θ gathered units (kept from forward to backward)", world * shard * pb)],
        "gathered_but_last": [("Θ gathered units (all but the last layer's, resharded)",
                               (world * shard - unit_padded) * pb)],
        "post_backward": [
            ("A activations in flight (but the last layer's)",
             category_bytes(rank, "activations") - per_layer),
            ("root unit's unsharded gradients (output layer, final norm)", root_grads * gb),
            ("activation gradient (one hidden state)", _hidden_bytes(strategy)),
            ("last layer's unsharded gradients", unit_real * gb),
            ("reduce-scatter input (padded flat copy)", unit_padded * gb),
            *([("_chunk_cat's padded copies (dim 0 not divisible by W)", copied * gb)]
              if profile == "torch_cpu" else [])],
    }


def _hidden_bytes(strategy: Strategy) -> Fraction:
    """One micro-batch's hidden state on a device: e·b·s·h (÷ t under sequence parallelism,
    ÷ cp)."""
    arch = strategy.model.arch
    assert arch is not None
    sp = any(p.sequence_parallel for p in strategy.placements if p.role is Role.TENSOR)
    return (Fraction(strategy.precision.activations) * arch.micro_batch * arch.seq * arch.hidden
            / (role_size(strategy, Role.TENSOR) if sp else 1) / role_size(strategy, Role.CONTEXT))


def torch_pipelining_buffers(strategy: Strategy, rank: RankMemory) -> list[tuple[str, Fraction]]:
    """What ``torch.distributed.pipelining`` keeps on a stage for the whole step (torch 2.13,
    ``pipelining/stage.py``): a receive buffer per micro-batch for the activations
    (``_prepare_forward_infra``: ``args_recv_info[chunk] = self._create_act_recv_info()`` for
    each of the m micro-batches, a ``_make_tensor_from_meta`` buffer) on every stage but the
    first, and one for the gradients (``_prepare_backward_infra``, ``grad_recv_info[mb_index]``)
    on every stage but the last; and on the last stage each micro-batch's output, the logits
    (``if self.is_last and save_forward_output: self.output_chunks.append(output)``), kept for
    the merged output until the next step clears them (``clear_runtime_states``). One of those
    logits is the outside-the-layers "logits" item already (16-bit activations)."""
    pipe = strategy.pipeline
    arch = strategy.model.arch
    if pipe is None or strategy.size(pipe.axis) == 1 or arch is None:
        return []
    m = strategy.microbatches
    hidden = _hidden_bytes(strategy)
    parts: list[tuple[str, Fraction]] = []
    if not rank.kind.first:
        parts.append(("pipelining activation receive buffers (one per micro-batch)", m * hidden))
    if not rank.kind.last:
        parts.append(("pipelining gradient receive buffers (one per micro-batch)", m * hidden))
    if rank.kind.last:
        e = Fraction(strategy.precision.activations)
        t = role_size(strategy, Role.TENSOR)
        logits = e * arch.micro_batch * arch.seq * arch.padded_vocab(t) / t \
            / role_size(strategy, Role.CONTEXT)
        kept = m if e == 4 else m - 1  # with 16-bit activations one is counted outside the layers
        parts.append(("pipelining stage outputs kept for the merged output", kept * logits))
    return parts


LOSS_BACKWARD_MOMENT = "backward of the loss"


def loss_backward_parts(strategy: Strategy) -> list[tuple[str, Fraction]]:
    """What torch's cross-entropy makes in its backward beside the log-probabilities its
    forward saved (the outside-the-layers "fp32 logits for the loss" item), one micro-batch's
    b·s·V/t fp32 elements each (÷ cp), before the output layer's backward frees them.

    ``F.cross_entropy`` is ``log_softmax`` then ``nll_loss`` (torch 2.13
    ``aten/src/ATen/native/LossNLL.cpp``, ``cross_entropy_loss_symint``); ``_log_softmax`` saves
    its result (``tools/autograd/derivatives.yaml``: ``_log_softmax_backward_data(grad,
    result, dim, self.scalar_type())``). In backward ``nll_loss_backward`` makes a new
    gradient of the input's size (``TORCH_IMPL_FUNC(nll_loss_backward_out_cpu)``: ``grad_input
    .zero_()``, then the targets' entries), and ``_log_softmax_backward_data`` a new tensor of
    that size (``SoftMax.cpp``, ``log_softmax_backward_cpu_out``) while its input gradient and
    the saved result are alive: two more (the CPU runs of ``benchmarks/peak_memory.py`` on
    ``benchmarks/models`` peak there).

    Under DTensor tensor parallelism the loss runs in ``loss_parallel`` (the measure worker's
    plan: a vocabulary-parallel output layer); ``_nll_loss_and_log_softmax_backward``
    (``torch/distributed/tensor/parallel/loss.py``) does both backwards at once, ``grad_input =
    torch.zeros_like(x)`` and ``(grad_input + torch.exp(x)) * grad_output``: the zeros, the exp
    and the sum, or the zeros, the sum and the product, alive together: three of the local
    shard (``_log_softmax_backward_handler`` returns its input, ``.to`` the same dtype)."""
    arch = strategy.model.arch
    assert arch is not None
    t = role_size(strategy, Role.TENSOR)
    logits = Fraction(4 * arch.micro_batch * arch.seq * arch.padded_vocab(t), t) \
        / role_size(strategy, Role.CONTEXT)
    if t > 1:
        return [("loss_parallel's zero gradient (zeros_like)", logits),
                ("the sum with exp of the log-probabilities", logits),
                ("its product with the output gradient", logits)]
    return [("nll_loss's input gradient", logits),
            ("log_softmax's input gradient", logits)]


def accumulation_temporaries(strategy: Strategy) -> list[tuple[str, Fraction]]:
    """A backward that adds into existing gradients (eager torch's ``AccumulateGrad``) makes each
    weight's gradient in a new tensor first: one weight of the layer's largest matrix (h × ffn,
    ÷ t) in the gradient dtype, beside the ffn-wide activation gradient being propagated
    (e·b·s·ffn, ÷ t, ÷ cp) at the MLP's backward."""
    arch = strategy.model.arch
    assert arch is not None
    t = role_size(strategy, Role.TENSOR)
    ffn = arch.expert_ffn or arch.ffn
    weight = Fraction(arch.largest_layer_matrix(), t) \
        * strategy.precision.grads
    flowing = Fraction(strategy.precision.activations) * arch.micro_batch * arch.seq * ffn / t \
        / role_size(strategy, Role.CONTEXT)
    return [("a weight's gradient before it is accumulated", weight),
            ("ffn-wide activation gradient", flowing)]


def adam_temporaries(strategy: Strategy, profile: str, elements: Fraction
                     ) -> tuple[Fraction, tuple[str, ...]]:
    """The optimizer step's temporaries under a torch profile, for ``elements`` of the
    optimizer's partition, and what cannot be sized."""
    temporaries = Fraction(0)
    if profile == "torch":
        # foreach Adam, an fp32 sqrt of every exp_avg_sq at once (torch 2.13 torch/optim/adam.py
        # line 762, _multi_tensor_adam: ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)``,
        # then divided and added into in place): sized by the whole list, known for a bare count
        temporaries = 4 * elements
    unsized: tuple[str, ...] = ()
    if profile == "torch_cpu" and elements and strategy.model.arch is None:
        # a bare count's tensors are unknown unless the user gives the largest one
        if strategy.model.largest_tensor is None:
            unsized = ("Adam's per-tensor temporaries (CPU): a bare parameter count has no "
                       "tensor sizes; give model { largest_tensor = N }",)
        else:
            temporaries = 2 * 4 * Fraction(strategy.model.largest_tensor,
                                           role_size(strategy, Role.TENSOR))
    elif profile == "torch_cpu" and elements:
        # two temporaries of the largest parameter: torch 2.13 torch/optim/adam.py line 544,
        # _single_tensor_adam (CPU tensors are not foreach: optimizer.py
        # _default_to_fused_or_foreach), ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt)``
        temporaries = 2 * 4 * _largest_tensor(strategy)
    return temporaries, unsized
