"""Peak memory over the step (placeverify/cost/peak.py): every expected number is worked out
by hand from the model's sizes, the precision and what each implementation profile says it
holds (placeverify/ir/profiles.py cites the sources)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from placeverify.api import load_text

ROOT = Path(__file__).resolve().parents[1]

# A tiny GPT: 2 layers, hidden 64, ffn 256, vocab 100 (padded to 128), learned positions (16),
# untied output. Parameters: per layer 12h² + 13h = 50,016 (4h² attention + 4h biases, 8h² MLP +
# 5h biases, 2 LayerNorms 4h); embeddings 128·64 + 16·64 = 9,216; output 128·64 = 8,192; final
# norm 128. Written out in PARAMS below.
GPT = """strategy "peak"
model transformer {{
    layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 128, seq = 16, micro_batch = 2,
    mlp = plain, norm = layernorm, bias = true, position = learned, attention = standard,
    embeddings = untied, dropout = false
}}
precision {precision}
mesh {{ dp = 2{mesh} }}
place {place} over dp
"""
LAYER = 12 * 64 * 64 + 13 * 64
PARAMS = 2 * LAYER + 128 * 64 + 16 * 64 + 128 * 64 + 2 * 64


def check(precision: str = "fp32_adam", mesh: str = "", place: str = "ddp") -> dict:
    path = ROOT / "build" / "peak-test.place"
    path.parent.mkdir(exist_ok=True)
    path.write_text(GPT.format(precision=precision, mesh=mesh, place=place), encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "placeverify", "check", "--json", "--no-verify",
                          str(path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)["memory"]


def moment(memory: dict, name: str) -> dict:
    return next(m for m in memory["moments"] if m["moment"] == name)


def test_the_parameter_count_used_below_is_the_tools() -> None:
    strategy = load_text(GPT.format(precision="fp32_adam", mesh="", place="ddp"), "x.place")
    assert strategy.model.params == PARAMS


def test_megatron_profile_peak_is_the_device_total_at_the_end_of_forward() -> None:
    memory = check()
    assert memory["profile"] == "megatron"
    states = PARAMS * (4 + 8 + 4)
    assert memory["persistent_bytes"] == states
    assert memory["peak_at"] == "end of forward"
    assert memory["peak_bytes"] == memory["device_bytes"]["total"]
    assert moment(memory, "optimizer step")["bytes"] == states  # fused Adam: no temporaries


def test_torch_profile_adds_ddp_buckets_and_foreach_adam_temporaries() -> None:
    memory = check(mesh=", memory_profile = torch")
    # Θ 4 + Ω 8 + G 4 + DDP bucket 4 + foreach sqrt of exp_avg_sq 4 bytes per parameter
    assert moment(memory, "optimizer step")["bytes"] == PARAMS * 24
    assert memory["peak_bytes"] == PARAMS * 24
    assert memory["peak_at"] == "optimizer step"
    # gradients are freed between steps: none at the end of forward with one micro-batch
    assert "G gradients" not in moment(memory, "end of forward")["parts"]


def test_torch_cpu_profile_holds_two_temporaries_of_the_largest_parameter() -> None:
    memory = check(mesh=", memory_profile = torch_cpu")
    largest = 64 * 256  # the MLP's weight (the padded embedding is 128·64 = 8,192)
    assert moment(memory, "optimizer step")["bytes"] == PARAMS * 20 + 2 * 4 * largest


def test_deepspeed_profile_adds_the_fp32_gradient_partition_of_zero2() -> None:
    memory = check(precision="mixed_adam", mesh=", memory_profile = deepspeed", place="zero2")
    parts = moment(memory, "optimizer step")["parts"]
    assert parts["fp32 gradient partition"] == 4 * PARAMS // 2


def test_reserve_counts_against_device_memory() -> None:
    peak = PARAMS * 16 + check()["device_bytes"]["activations"] \
        + check()["device_bytes"]["outside_layers"]
    fits = check(mesh=f", device_memory = {peak} B")
    assert fits["fits"] is True and fits["headroom_bytes"] == 0
    tight = check(mesh=f", device_memory = {peak} B, reserve = 1 B")
    assert tight["fits"] is False and tight["reserve_bytes"] == 1 and tight["headroom_bytes"] == -1


@pytest.mark.parametrize("text,needle", [
    ("memory_profile = pytorch", "unknown memory profile 'pytorch'; did you mean 'torch'"),
    ("memory_profile = 3", "'memory_profile' names an implementation"),
])
def test_a_bad_profile_is_an_error_at_its_text(text: str, needle: str) -> None:
    path = ROOT / "build" / "peak-bad.place"
    path.parent.mkdir(exist_ok=True)
    path.write_text(GPT.format(precision="fp32_adam", mesh=", " + text, place="ddp"),
                    encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "placeverify", "check", str(path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert needle in out.stderr and "peak-bad.place:8:" in out.stderr and "^" in out.stderr


# ---- FSDP2's backward working set (torch profiles) -----------------------------------------
# A tiny Llama in fp32 under FSDP2 over dp = 4 (fp32_adam: Θ 4, G 4, Ω 8, A 4 bytes).
LLAMA = """strategy "fsdp2 backward"
model transformer {{
    layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 176, vocab = 128, seq = 32,
    micro_batch = 2, mlp = gated, norm = rmsnorm, bias = false, position = rotary,
    attention = flash, embeddings = untied, dropout = false
}}
precision fp32_adam
mesh {{ dp = 4, memory_profile = {profile} }}
place {place} over dp
"""
# one layer: q 64·64, k and v 64·32, o 64·64, SwiGLU 3·64·176, two RMSNorms 2·64
LLAMA_UNIT = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176 + 2 * 64
LLAMA_ROOT = 128 * 64 + 128 * 64 + 64  # embedding, output layer, final norm
LLAMA_PARAMS = 2 * LLAMA_UNIT + LLAMA_ROOT
# saved per layer in eager torch, fp32, sbh = 32·2·64: each RMSNorm its fp32 copy (4·sbh), rstd
# (4·s·b) and normalised input (4·sbh); QKV input, Q, output-projection input, MLP input 4·sbh
# each; K and V 4·sbh·2/4 each; flash log-sum-exp 4·a·s·b; SwiGLU gate, SiLU, up, product 4·s·b·f
SBH = 32 * 2 * 64
LLAMA_LAYER_ACTS = (2 * (8 * SBH + 4 * 64) + 4 * 4 * SBH + 2 * 4 * SBH // 2 + 4 * 4 * 64
                    + 4 * 4 * 64 * 176)


def llama_memory(profile: str, place: str = "fsdp") -> dict:
    path = ROOT / "build" / "peak-test-llama.place"
    path.parent.mkdir(exist_ok=True)
    path.write_text(LLAMA.format(profile=profile, place=place), encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "placeverify", "check", "--json", "--no-verify",
                          str(path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)["memory"]


def test_fsdp2_start_of_backward_holds_two_units_the_root_and_gloos_staging() -> None:
    assert LLAMA_UNIT == 46_208 and LLAMA_LAYER_ACTS == 329_216
    memory = llama_memory("torch_cpu")
    m = moment(memory, "start of backward")
    assert m["parts"] == {
        "Θ params": LLAMA_PARAMS * 4 // 4,
        "Ω optimizer": LLAMA_PARAMS * 8 // 4,
        # torch frees the gradients between steps and one micro-batch makes none before backward
        "A activations in flight": 2 * LLAMA_LAYER_ACTS,
        "root unit gathered (not resharded after forward)": LLAMA_ROOT * 4,
        "root unit's unsharded gradients (output layer, final norm)": (128 * 64 + 64) * 4,
        "activation gradient (one hidden state)": 4 * SBH,
        "last layer's unit gathered for backward, and the next prefetched": 2 * LLAMA_UNIT * 4,
        "gloo all-gather staging (one unit)": LLAMA_UNIT * 4,
    }
    assert m["bytes"] == sum(m["parts"].values())


GLOO_HELD = "start of backward, gloo still holding the last all-gather"


def test_fsdp2_on_cpu_peaks_when_gloos_worker_lets_go_of_the_last_all_gather_late() -> None:
    # ProcessGroupGloo::runLoop keeps its reference to a finished work until the end of its loop
    # iteration; FSDP2's pre-backward drops its own after the copy-out and then prefetches the
    # next unit: in the order where the worker lets go last, the last layer's all-gather output
    # (one unit, fp32) is alive beside everything the start of backward holds
    memory = llama_memory("torch_cpu")
    usual, held = moment(memory, "start of backward"), moment(memory, GLOO_HELD)
    assert held["parts"] == {
        **usual["parts"],
        "last layer's all-gather output (its last reference on gloo's worker thread)":
            LLAMA_UNIT * 4}
    assert held["bytes"] == usual["bytes"] + 46_208 * 4
    # the peak is the larger of the two orders
    assert memory["peak_at"] == GLOO_HELD and memory["peak_bytes"] == held["bytes"]


def test_no_gloo_held_moment_on_cuda_without_resharding_or_under_megatron() -> None:
    for memory in (llama_memory("torch"), llama_memory("torch_cpu", place="zero2"),
                   llama_memory("megatron")):
        assert GLOO_HELD not in {m["moment"] for m in memory["moments"]}


def test_fsdp2_backward_on_cuda_has_no_gloo_staging_and_megatron_no_such_moment() -> None:
    cuda = moment(llama_memory("torch"), "start of backward")
    assert "gloo all-gather staging (one unit)" not in cuda["parts"]
    assert cuda["parts"]["last layer's unit gathered for backward, and the next prefetched"] \
        == 2 * LLAMA_UNIT * 4
    for memory in (llama_memory("megatron"), llama_memory("torch_cpu", place="zero2")):
        assert "start of backward" not in {m["moment"] for m in memory["moments"]}


# ---- torch.distributed.pipelining under the torch profiles ----------------------------------
def pipeline_moments(schedule: str) -> dict[tuple[str, str], dict[str, int]]:
    from placeverify.cost import analyse, whole
    from placeverify.lower import load

    source = (ROOT / "examples" / "measure" / f"pipeline-{schedule}.place").read_text("utf-8")
    path = ROOT / "build" / f"peak-test-pipeline-{schedule}.place"
    path.parent.mkdir(exist_ok=True)
    path.write_text(source.replace("mesh { pp = 2 }", "mesh { pp = 2, memory_profile = torch_cpu }"),
                    encoding="utf-8")
    peak = analyse(load(str(path))).peak
    assert peak is not None and peak.profile == "torch_cpu"
    return {(m.rank, m.name): {label: whole(b) for label, b in m.parts if b} for m in peak.moments}


def test_pipelining_buffers_and_the_accumulating_backward() -> None:
    # the measure example: GPT, h = 64, ffn 256, vocab 96, seq 16, micro-batch 2, fp32, pp = 2,
    # m = 4. A hidden state is 4·2·16·64 = 8,192 bytes; the logits 4·2·16·96 = 12,288.
    moments = pipeline_moments("1f1b")
    first = moments[("first", "backward, gradients accumulating")]
    last = moments[("last", "backward, gradients accumulating")]
    # stage.py: a gradient receive buffer per micro-batch on the first stage, an activation one
    # on the last, and the last stage's outputs (logits) of every micro-batch
    assert first["pipelining gradient receive buffers (one per micro-batch)"] == 4 * 8_192
    assert "pipelining activation receive buffers (one per micro-batch)" not in first
    assert last["pipelining activation receive buffers (one per micro-batch)"] == 4 * 8_192
    assert last["pipelining stage outputs kept for the merged output"] == 4 * 12_288
    # AccumulateGrad: the largest weight (64 x 256, fp32) made before it is added, beside the
    # ffn-wide activation gradient 4·2·16·256
    for parts in (first, last):
        assert parts["a weight's gradient before it is accumulated"] == 64 * 256 * 4
        assert parts["ffn-wide activation gradient"] == 4 * 2 * 16 * 256


def test_gpipe_accumulating_backward_has_m_minus_1_micro_batches_left() -> None:
    moments = pipeline_moments("gpipe")
    for rank in ("first", "last"):
        forward = moments[(rank, "end of forward")]
        backward = moments[(rank, "backward, gradients accumulating")]
        # the second of m = 4 backwards: 3 micro-batches' activations, the first's gradients
        assert backward["A activations in flight"] * 4 == forward["A activations in flight"] * 3
        assert "G gradients" not in forward and backward["G gradients"] > 0


# ---- ZeRO-2 as FSDP2 fully_shard(reshard_after_forward=False) under the torch profiles --------
def zero2_moments(profile: str, place: str = "zero2") -> dict[str, dict[str, int]]:
    from placeverify.cost import analyse, whole
    from placeverify.lower import load

    source = (ROOT / "examples" / "measure" / "zero2.place").read_text("utf-8")
    path = ROOT / "build" / f"peak-test-zero2-{profile}.place"
    path.parent.mkdir(exist_ok=True)
    source = source.replace("place zero2 over dp", f"place {place} over dp")
    path.write_text(source.replace("mesh { dp = 3 }",
                                   f"mesh {{ dp = 3, memory_profile = {profile} }}"),
                    encoding="utf-8")
    peak = analyse(load(str(path))).peak
    assert peak is not None
    return {m.name: {label: whole(b) for label, b in m.parts} for m in peak.moments}


# The measure example's tensors (GPT, h = 64, ffn 256, vocab 96, learned positions 16, biases,
# untied output), each cut in 3 along dim 0 with FSDP2's padding to ⌈rows/3⌉:
# a layer: two LayerNorms 4·22; q, k, v, o weights 4·22·64; their biases 4·22; up 86·64 and its
# bias 86; down 22·256 and its bias 22 -> 17,052. The root: embedding 32·64, positions 6·64,
# final norm 2·22, output 32·64 -> 4,524.
Z2_LAYER_SHARD = 4 * 22 + 4 * 22 * 64 + 4 * 22 + 86 * 64 + 86 + 22 * 256 + 22
Z2_ROOT_SHARD = 32 * 64 + 6 * 64 + 2 * 22 + 32 * 64
Z2_SHARD = 2 * Z2_LAYER_SHARD + Z2_ROOT_SHARD
Z2_LAYER = 4 * (64 * 64 + 64) + 256 * 64 + 256 + 64 * 256 + 64 + 4 * 64  # real: 49,984


def test_fsdp2_zero2_holds_padded_shards_every_unit_gathered_and_the_reduce_scatter_input() -> None:
    assert Z2_LAYER_SHARD == 17_052 and Z2_SHARD == 38_628 and Z2_LAYER == 49_984
    moments = zero2_moments("torch_cpu")
    post = moments["post-backward of the last layer (FSDP2)"]
    forward = moments["end of forward"]
    assert post["Θ params (FSDP2 shards, dim 0 padded to a multiple of 3)"] == 4 * Z2_SHARD
    assert post["Ω optimizer (the first rank's shard, ⌈rows/W⌉ of each tensor)"] == 8 * Z2_SHARD
    # init_all_gather_outputs: numel * world_size of each padded shard, every unit kept from
    # forward on; post_backward reshards the layer itself before foreach_reduce
    assert forward["Θ gathered units (kept from forward to backward)"] == 4 * 3 * Z2_SHARD
    assert post["Θ gathered units (all but the last layer's, resharded)"] \
        == 4 * 3 * (Z2_SHARD - Z2_LAYER_SHARD)
    # foreach_reduce: the layer's unsharded gradients beside the padded reduce-scatter input,
    # and _chunk_cat's padded copy of every gradient (3 divides none of 64, 256 rows)
    assert post["last layer's unsharded gradients"] == 4 * Z2_LAYER
    assert post["reduce-scatter input (padded flat copy)"] == 4 * 3 * Z2_LAYER_SHARD
    assert post["_chunk_cat's padded copies (dim 0 not divisible by W)"] == 4 * 3 * Z2_LAYER_SHARD
    assert post["root unit's unsharded gradients (output layer, final norm)"] == 4 * (96 * 64 + 128)
    assert post["activation gradient (one hidden state)"] == 4 * 2 * 16 * 64
    # one of the two layers' activations is left
    assert 2 * post["A activations in flight (but the last layer's)"] \
        == forward["A activations in flight"]
    assert post["G gradients"] == 0  # freed between steps, one micro-batch
    # after the root's post-backward everything is resharded: shards and padded gradients only
    assert "Θ gathered units (kept from forward to backward)" not in moments["end of backward"]
    assert moments["end of backward"]["G gradients"] == 4 * Z2_SHARD


def test_chunk_cat_copies_only_on_cpu_and_only_what_w_does_not_divide() -> None:
    cuda = zero2_moments("torch")["post-backward of the last layer (FSDP2)"]
    assert "_chunk_cat's padded copies (dim 0 not divisible by W)" not in cuda
    assert cuda["reduce-scatter input (padded flat copy)"] == 4 * 3 * Z2_LAYER_SHARD
    # dp = 2 divides every dim 0 (96, 16, 64, 256 rows): no padding, no copies
    source = (ROOT / "examples" / "measure" / "zero2.place").read_text("utf-8")
    path = ROOT / "build" / "peak-test-zero2-dp2.place"
    path.write_text(source.replace("mesh { dp = 3 }", "mesh { dp = 2, memory_profile = torch_cpu }"),
                    encoding="utf-8")
    from placeverify.cost import analyse, whole
    from placeverify.lower import load

    peak = analyse(load(str(path))).peak
    assert peak is not None
    post = {label: whole(b) for m in peak.moments if m.name.startswith("post-backward")
            for label, b in m.parts}
    assert post["_chunk_cat's padded copies (dim 0 not divisible by W)"] == 0
    assert post["reduce-scatter input (padded flat copy)"] == 4 * Z2_LAYER
    assert post["Θ params (FSDP2 shards, dim 0 padded to a multiple of 2)"] \
        == 4 * (2 * Z2_LAYER + 96 * 64 + 16 * 64 + 128 + 96 * 64) // 2


def test_zero2_under_megatron_keeps_the_placement_figures() -> None:
    moments = zero2_moments("megatron")
    assert "post-backward of the last layer (FSDP2)" not in moments
    params = 2 * Z2_LAYER + 96 * 64 + 16 * 64 + 128 + 96 * 64  # 113,408: whole, as placed
    assert moments["end of backward"]["Θ params"] == 4 * params


@pytest.mark.parametrize("place", ["fsdp(grad_op)", "zero3(reshard_after_forward = false)"])
def test_every_fsdp2_without_resharding_is_the_same_run(place: str) -> None:
    # measure/plan.py runs (R, S, S) and (S*, S, S) without resharding as the same FSDP2 call:
    # the gathered units are counted once (not also as the placement's whole-model buffer)
    assert zero2_moments("torch_cpu", place) == zero2_moments("torch_cpu")


# ---- a bare parameter count's optimizer temporaries ------------------------------------------
BARE = """strategy "bare"
model {{ params = 103040{extra} }}
precision fp32_adam
mesh {{ dp = 2, memory_profile = {profile} }}
place ddp over dp
"""


def bare_run(profile: str, extra: str = "") -> subprocess.CompletedProcess[str]:
    path = ROOT / "build" / "peak-test-bare.place"
    path.parent.mkdir(exist_ok=True)
    path.write_text(BARE.format(profile=profile, extra=extra), encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "placeverify", "check", "--json", "--no-verify",
                           str(path)], capture_output=True, text=True, cwd=ROOT)


def bare_step(profile: str, extra: str = "") -> dict[str, int]:
    out = bare_run(profile, extra)
    assert out.returncode in (0, 1), out.stderr
    return moment(json.loads(out.stdout)["memory"], "optimizer step")["parts"]


def test_cpu_adam_temporaries_of_a_bare_count_follow_its_largest_tensor() -> None:
    # torch/optim/adam.py _single_tensor_adam: exp_avg_sq.sqrt() and its quotient, one
    # parameter at a time: two fp32 copies of the largest, a 160 x 160 weight
    parts = bare_step("torch_cpu", ", largest_tensor = 25600")
    assert parts["optimizer temporaries"] == 2 * 4 * 160 * 160
    assert parts["DDP bucket buffers"] == 4 * 103_040


def test_cpu_adam_temporaries_without_tensor_sizes_are_said_not_modelled() -> None:
    out = bare_run("torch_cpu")
    step = moment(json.loads(out.stdout)["memory"], "optimizer step")
    assert "optimizer temporaries" not in step["parts"]
    assert step["not_modelled"] == ["Adam's per-tensor temporaries (CPU): a bare parameter "
                                    "count has no tensor sizes; give model { largest_tensor = N }"]
    text = subprocess.run([sys.executable, "-m", "placeverify", "check", "--no-verify",
                           str(ROOT / "build" / "peak-test-bare.place")],
                          capture_output=True, text=True, cwd=ROOT).stdout
    assert "not modelled: Adam's per-tensor temporaries (CPU)" in text


def test_foreach_adam_temporaries_of_a_bare_count_are_the_whole_list() -> None:
    # _multi_tensor_adam: torch._foreach_sqrt(device_exp_avg_sqs), an fp32 copy of every
    # exp_avg_sq at once: 4 bytes x 103,040 (DDP: every rank updates the whole model)
    assert bare_step("torch")["optimizer temporaries"] == 4 * 103_040


@pytest.mark.parametrize("extra,needle", [
    (", largest_tensor = 200000", "largest_tensor (200,000) is more than the model's 103,040"),
    (", largest_tensor = 0", "largest_tensor"),
])
def test_a_bad_largest_tensor_is_an_error_at_its_text(extra: str, needle: str) -> None:
    out = bare_run("torch_cpu", extra)
    assert out.returncode == 2
    assert needle in out.stderr and "peak-test-bare.place:2:" in out.stderr and "^" in out.stderr


def test_largest_tensor_with_an_architecture_is_a_conflict() -> None:
    path = ROOT / "build" / "peak-bad-largest.place"
    path.parent.mkdir(exist_ok=True)
    path.write_text(GPT.format(precision="fp32_adam", mesh="", place="ddp").replace(
        "dropout = false", "dropout = false, largest_tensor = 5"), encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "placeverify", "check", str(path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "'largest_tensor' is derived from the architecture" in out.stderr


def test_the_fsdp2_moment_and_the_not_modelled_notes_fit_the_check_schema() -> None:
    import jsonschema

    schema = json.loads((ROOT / "placeverify" / "schemas" / "check.schema.json").read_text("utf-8"))
    zero2_moments("torch_cpu")  # writes both files
    bare_run("torch_cpu")
    docs = []
    for path in (ROOT / "build" / "peak-test-zero2-torch_cpu.place",
                 ROOT / "build" / "peak-test-bare.place"):
        out = subprocess.run([sys.executable, "-m", "placeverify", "check", "--json",
                              "--no-verify", str(path)], capture_output=True, text=True, cwd=ROOT)
        docs.append(json.loads(out.stdout))
    llama_memory("torch_cpu")  # writes its file
    out = subprocess.run([sys.executable, "-m", "placeverify", "check", "--json", "--no-verify",
                          str(ROOT / "build" / "peak-test-llama.place")],
                         capture_output=True, text=True, cwd=ROOT)
    docs.append(json.loads(out.stdout))
    assert docs[0]["memory"]["peak_at"] == "post-backward of the last layer (FSDP2)"
    assert any("not_modelled" in m for m in docs[1]["memory"]["moments"])
    assert docs[2]["memory"]["peak_at"] == GLOO_HELD
    for doc in docs:
        jsonschema.Draft202012Validator(schema).validate(doc)
