"""Frozen groups, LoRA / QLoRA adapters and a quantised base (issue 32, item 2).

Expected numbers are derived by hand from the frameworks' rules, never from placeverify:

- PEFT's LoRA (``peft/tuners/lora/layer.py``, ``LoraLayer.update_layer``): each targeted linear
  gets ``lora_A = nn.Linear(in_features, r, bias=False)`` and ``lora_B = nn.Linear(r,
  out_features, bias=False)``: r·in + out·r trained parameters; the base is frozen
  (``requires_grad = False``): no gradient, no optimizer state;
- bitsandbytes' NF4 (``bitsandbytes/functional.py``, ``quantize_4bit``: ``blocksize=64``, two
  4-bit codes per byte, one fp32 ``absmax`` per block; ``compress_statistics`` quantises the
  absmax with ``quantize_blockwise(absmax, blocksize=256)``: one byte per block, one fp32 absmax
  per 256 blocks, and an fp32 ``offset``); LLM.int8 one byte per weight and one fp32 scale per
  output row;
- Llama 3 8B's shapes (arXiv 2407.21783, Table 3): 32 layers, hidden 4096, 32 heads of 128, 8
  KV heads (K, V 1024 wide), SwiGLU 14336, 128256-token vocabulary, untied; 8,030,261,248
  parameters.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from placeverify.cost import analyse
from placeverify.cost.flops import training_flops_per_token
from placeverify.errors import PlaceverifyError as PlaceError
from placeverify.lower import load_text

F = Fraction
L, H, KV, FFN, V = 32, 4096, 1024, 14336, 128_256
LLAMA_PARAMS = 8_030_261_248
# (in, out) of one layer's linears
LINEARS = {"q": (H, H), "k": (H, KV), "v": (H, KV), "o": (H, H), "gate": (H, FFN),
           "up": (H, FFN), "down": (FFN, H)}
QUANTISED = L * sum(i * o for i, o in LINEARS.values())  # the layers' linear weights
assert QUANTISED == 6_979_321_856
LORA_16_ALL = L * sum(16 * (i + o) for i, o in LINEARS.values())
assert LORA_16_ALL == 41_943_040

ALL = "[q, k, v, o, gate, up, down]"


def llama(tuning: str, precision: str, mesh: str, place: str) -> str:
    return (f"model llama3_8b {{ seq = 4096, micro_batch = 1, {tuning} }}\n"
            f"precision {precision}\nmesh {{ {mesh} }}\n{place}\nloss token_mean\n")


def device(text: str) -> dict[str, Fraction]:
    costs = analyse(load_text(text))
    return {k: F(v) for k, v in costs.device_bytes().items()}


def comm(text: str) -> dict[str, Fraction]:
    costs = analyse(load_text(text))
    out: dict[str, Fraction] = {}
    for item in costs.comm:
        out[item.what] = out.get(item.what, F(0)) + F(item.bytes)
    return out


def test_lora_under_fsdp_keeps_state_for_the_adapters_only() -> None:
    text = llama(f"adapter = lora, lora_rank = 16, lora_targets = {ALL}", "bf16_adam",
                 "dp = 8", "place fsdp over dp")
    got = device(text)
    assert got["params"] == F((LLAMA_PARAMS + LORA_16_ALL) * 2, 8)  # every Θ sharded, bf16
    assert got["gradients"] == F(LORA_16_ALL * 2, 8)
    assert got["optimizer"] == F(LORA_16_ALL * 12, 8)
    moved = comm(text)
    assert moved["grads"] == F(LORA_16_ALL * 2 * 7, 8)  # reduce-scatter of the adapters only
    # the gathers still move the frozen shards: forward and backward
    assert moved["params (gather for forward)"] == F((LLAMA_PARAMS + LORA_16_ALL) * 2 * 7, 8)


def test_a_frozen_34b_model_has_no_adam_state() -> None:
    """The issue's case: a frozen model is no longer counted with Adam state and gradients."""
    text = llama("frozen = [dense, norms, embedding]", "megatron", "dp = 8", "place zero1 over dp")
    with pytest.raises(PlaceError, match="nothing is trained"):
        load_text(text)
    text = llama("frozen = [dense, embedding]", "megatron", "dp = 8", "place zero1 over dp")
    norms = L * 2 * H + H
    got = device(text)
    assert got["params"] == LLAMA_PARAMS * 2
    assert got["gradients"] == norms * 4  # Megatron's fp32 gradient buffer: trained ones only
    assert got["optimizer"] == F(norms * 12, 8)


def nf4_scales(double: bool) -> int:
    total = 0
    for i, o in LINEARS.values():
        blocks = i * o // 64  # every Llama matrix is a multiple of 64 · 256 elements
        total += blocks + 4 * (blocks // 256) + 4 if double else 4 * blocks
    return L * total


@pytest.mark.parametrize("base, scales", [("nf4", nf4_scales(False)), ("nf4_dq", nf4_scales(True)),
                                          ("int8", L * sum(4 * o for _, o in LINEARS.values()))])
def test_qlora_under_fsdp_stores_the_base_quantised(base: str, scales: int) -> None:
    packed = QUANTISED if base == "int8" else QUANTISED // 2
    text = llama(f"adapter = qlora, lora_rank = 16, lora_targets = {ALL}, base_dtype = {base}",
                 "bf16_adam", "dp = 8", "place fsdp over dp")
    rest = LLAMA_PARAMS - QUANTISED + LORA_16_ALL  # embedding, output layer, norms, adapters
    got = device(text)
    # the packed weights are sharded like Θ; the scales are kept whole on every rank
    assert got["params"] == F(rest * 2 + packed, 8) + scales
    assert got["gradients"] == F(LORA_16_ALL * 2, 8)
    moved = comm(text)
    assert moved["params (gather for forward)"] == F((rest * 2 + packed) * 7, 8)


def test_qlora_defaults_to_nf4() -> None:
    nf4 = llama(f"adapter = qlora, lora_rank = 16, lora_targets = {ALL}", "bf16_adam", "dp = 8",
                "place fsdp over dp")
    assert device(nf4)["params"] == F((LLAMA_PARAMS - QUANTISED + LORA_16_ALL) * 2
                                      + QUANTISED // 2, 8) + nf4_scales(False)


def test_lora_under_deepspeed_zero2_gathers_only_the_updated_adapters() -> None:
    text = llama("adapter = lora, lora_rank = 8, lora_targets = [q, v]", "deepspeed_bf16",
                 "dp = 4", "place zero2 over dp")
    lora = L * 8 * ((H + H) + (H + KV))
    got = device(text)
    assert got["params"] == (LLAMA_PARAMS + lora) * 2  # ZeRO-2: Θ whole on every rank
    assert got["gradients"] == F(lora * 2, 4)
    assert got["optimizer"] == F(lora * 12, 4)
    moved = comm(text)
    assert moved["grads"] == F(lora * 2 * 3, 4)
    assert moved["params"] == F(lora * 2 * 3, 4)  # the all-gather after the update


def test_lora_under_zero3_gathers_the_frozen_shards() -> None:
    text = llama("adapter = lora, lora_rank = 8, lora_targets = [q, v]", "deepspeed_bf16",
                 "dp = 4", "place zero3 over dp")
    lora = L * 8 * ((H + H) + (H + KV))
    got = device(text)
    assert got["params"] == F((LLAMA_PARAMS + lora) * 2, 4)
    assert got["optimizer"] == F(lora * 12, 4)


# a small Megatron-style run: 4 layers, hidden 64, 4 heads, ffn 256 (plain MLP), vocab 128
SMALL = """model transformer {{
    layers = 4, hidden = 64, heads = 4, ffn = 256, vocab = 128, seq = 32, micro_batch = 1,
    mlp = plain, norm = layernorm, bias = false, embeddings = untied, position = rotary, {tuning}
}}
precision megatron
mesh {{ pp = 2, tp = 2 }}
place pipeline(1f1b, microbatches = 4) over pp
place tp over tp
"""


def test_frozen_embedding_under_tensor_and_pipeline_parallelism() -> None:
    """Megatron-LM's partial fine-tuning: the first stage's embedding keeps Θ only."""
    costs = analyse(load_text(SMALL.format(tuning="frozen = [embedding]")))
    layer_dense = 4 * 64 * 64 + 2 * 64 * 256  # attention and MLP matrices, split over tp
    layer_norms = 2 * 2 * 64  # two LayerNorms, weight and bias, whole on every tp rank
    by_kind = {r.kind.name: {k: F(v) for k, v in costs.rank_bytes(r).items()} for r in costs.ranks}
    first = by_kind["first"]
    embedding = 128 * 64 // 2
    assert first["params"] == 2 * (2 * layer_dense // 2 + 2 * layer_norms + embedding)
    assert first["gradients"] == 4 * (2 * layer_dense // 2 + 2 * layer_norms)
    assert first["optimizer"] == 12 * (2 * layer_dense // 2 + 2 * layer_norms)
    last = by_kind["last"]
    output, final = 128 * 64 // 2, 2 * 64
    assert last["gradients"] == 4 * (2 * layer_dense // 2 + 2 * layer_norms + output + final)


def test_fine_tune_flops_skip_the_frozen_weight_gradients() -> None:
    """Forward 2 FLOPs per weight per token; backward 2 for the input gradient of every matmul
    and 2 for the weight gradient of a trained one (the attention core 4·s·q forward, twice that
    backward, PaLM App. B); an adapter's two matmuls are trained (6 per parameter)."""
    lora = load_text(llama("adapter = lora, lora_rank = 16, lora_targets = [q, v]", "bf16_adam",
                           "dp = 8", "place fsdp over dp")).model
    layer_weights = sum(i * o for i, o in LINEARS.values())
    core = 4 * 4096 * H
    output = H * V
    adapters = 16 * ((H + H) + (H + KV))
    forward = L * (2 * layer_weights + core) + 2 * output + L * 2 * adapters
    backward = L * (2 * layer_weights + 2 * core) + 2 * output + L * 4 * adapters
    assert training_flops_per_token(lora) == forward + backward
    full = load_text(llama("", "bf16_adam", "dp = 8", "place fsdp over dp")).model
    assert training_flops_per_token(full) == 3 * (L * (2 * layer_weights + core) + 2 * output)


@pytest.mark.parametrize("tuning, message", [
    ("lora_rank = 8", "describes an adapter"),
    ("adapter = lora, lora_rank = 8", "needs 'lora_targets'"),
    ("adapter = lora, lora_rank = 8, lora_targets = [q, wq]", "unknown LoRA target 'wq'"),
    ("adapter = lora, lora_rank = 8, lora_targets = [q, q]", "named twice"),
    ("base_dtype = nf4", "'frozen' must name dense"),
    ("frozen = [dense, adapters]", "unknown frozen group 'adapters'"),
    ("frozen = all", "nothing is trained"),
])
def test_fine_tune_keys_are_checked(tuning: str, message: str) -> None:
    with pytest.raises(PlaceError, match=message):
        load_text(llama(tuning, "bf16_adam", "dp = 8", "place fsdp over dp"))


def test_adapters_split_over_tensor_parallel_ranks_are_not_modelled() -> None:
    with pytest.raises(PlaceError, match="not modelled"):
        load_text(SMALL.format(tuning="adapter = lora, lora_rank = 4, lora_targets = [q]"))


# ---- verification: a frozen group receives no update ---------------------------------------

FROZEN_STEP = """model transformer {{
    layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 96, seq = 16, micro_batch = 1,
    frozen = [embedding]
}}
precision fp32_adam
mesh {{ dp = 2 }}
place ddp over dp
loss sample_mean
step {{
    backward sum / samples(dp, step)
    {reduce}
    {update}
}}
"""


def verdicts(text: str) -> tuple[dict[str, str], list[tuple[int, str]]]:
    from placeverify.api import check_strategy

    result = check_strategy(load_text(text, "frozen.place"))
    assert result.verification is not None
    refuted = [(o.span.line if o.span else 0, o.kind.value) for o in result.verification.obligations
               if o.verdict.value == "refuted"]
    return result.verification.verdicts(), refuted


def test_a_step_that_updates_a_frozen_group_is_refuted_there() -> None:
    got, refuted = verdicts(FROZEN_STEP.format(reduce="all_reduce(sum) grads over dp",
                                               update="update params[dense, embedding]"))
    assert got["gradient_integrity"] == "refuted"
    assert refuted == [(12, "frozen")]


def test_a_reduction_of_a_frozen_groups_gradient_is_refuted_there() -> None:
    got, refuted = verdicts(FROZEN_STEP.format(
        reduce="all_reduce(sum) grads[dense, norms, embedding] over dp", update="update params"))
    assert got["gradient_integrity"] == "refuted"
    assert refuted == [(11, "frozen")]


def test_the_same_step_on_the_trained_groups_is_proved() -> None:
    got, refuted = verdicts(FROZEN_STEP.format(reduce="all_reduce(sum) grads[dense, norms] over dp",
                                               update="update params"))
    assert set(got.values()) == {"proved"} and refuted == []


def test_forgetting_the_adapters_reduction_is_refuted_for_the_adapters() -> None:
    text = llama("adapter = lora, lora_rank = 8, lora_targets = [q, v]", "bf16_adam", "dp = 4",
                 "place ddp over dp") + "step {\n    backward sum / tokens(dp, step)\n" \
        "    all_reduce(sum) grads[dense] over dp\n    update params\n}\n"
    got, refuted = verdicts(text)
    assert got["gradient_integrity"] == "refuted" and got["state_consistency"] == "refuted"
    assert (8, "frozen") in refuted  # the frozen dense group reduced (line 8)
    assert any(kind == "coefficient" for _, kind in refuted)  # the adapters never reduced


# ---- importers: Megatron-LM's multimodal freezing flags ---------------------------------------
# examples/multimodal/multimodal_args.py in NVIDIA/Megatron-LM adds --freeze-LM, --freeze-ViT
# (store_true) and --vision-model-type (default clip).

MULTIMODAL = """torchrun --nproc_per_node 8 examples/multimodal/train.py \\
    --tensor-model-parallel-size 4 --num-layers 4 --hidden-size 256 \\
    --num-attention-heads 8 --vocab-size 1000 --seq-length 128 --micro-batch-size 1 \\
    --global-batch-size 8 --bf16 --use-distributed-optimizer \\
    {flags}
"""


def test_a_frozen_language_model_is_not_counted_with_adam_state(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from placeverify.diagnostics import PlaceError as ImportError_
    from placeverify.importers.registry import import_file

    script = tmp_path / "train.sh"
    script.write_text(MULTIMODAL.format(flags="--freeze-LM --freeze-ViT --vision-model-type clip"))
    with pytest.raises(ImportError_) as error:
        import_file(str(script))
    [d] = [d for d in error.value.diagnostics if d.severity.value == "error"]
    assert "--freeze-LM freezes the whole language model" in d.message
    assert "the vision projection)" in d.message  # --freeze-ViT: the encoder is frozen too
    assert d.span is not None and (d.span.line, d.span.column) == (5, 5)


def test_a_vision_encoder_beside_a_trained_language_model_is_one_warning(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from placeverify.importers.registry import import_file

    script = tmp_path / "train.sh"
    script.write_text(MULTIMODAL.format(flags="--freeze-ViT --vision-model-type clip"))
    imported = import_file(str(script))
    messages = [w.message for w, _ in imported.warnings]
    assert sum("vision encoder (clip)" in m and "Θ only, --freeze-ViT" in m for m in messages) == 1
    assert not any("does not read this argument" in m and ("--freeze" in m or "--vision" in m)
                   for m in messages)


def test_search_refuses_a_fine_tune_rather_than_ranking_full_training() -> None:
    from placeverify.search.problem import problem_from

    text = llama(f"adapter = lora, lora_rank = 16, lora_targets = {ALL}", "bf16_adam",
                 "dp = 8, device = h100_sxm", "place fsdp over dp")
    with pytest.raises(PlaceError, match="search does not model fine-tunes"):
        problem_from(load_text(text), None)


def test_the_reproducer_refuses_a_fine_tune(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The emitted torchrun script's tiny model trains every parameter and has no adapters."""
    from placeverify.api import check
    from placeverify.replay.emit import emit_script
    from placeverify.replay.emit_step import EmitRefused
    from placeverify.trace import load, write

    result = check("examples/bugs/lora-adapters-not-reduced.place")
    assert result.verification is not None and result.verification.trace is not None
    path = tmp_path / "lora.json"
    write(result.verification.trace, str(path))
    with pytest.raises(EmitRefused, match="a fine-tune"):
        emit_script(load(str(path)), trace_path=str(path))
