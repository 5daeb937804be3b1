"""Device profiles, the mesh's ``device``/``matmul`` entries and the step-time model (issue 15).

Expected figures are written by hand from the data sheets and papers (REFERENCE §9), never by
calling the code under test: FLOPs from Narayanan et al.'s 96·B·s·l·h²(1 + s/(6h) + V/(16lh)) and
Korthikanti et al.'s 72·B·L·s·h²(1 + s/(6h) + V/(12hL)), times from α-β by hand.
"""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from dataclasses import replace
from types import ModuleType

import pytest

from placeverify.api import check_strategy, costs, estimate_time, load_text
from placeverify.cost.time import CALIBRATION, Calibration, step_time
from placeverify.diagnostics import PlaceError
from placeverify.ir.devices import devices
from tests.conftest import EXAMPLES, ROOT

GPT = ("model transformer {{ layers = {l}, hidden = {h}, heads = {a}, ffn = {f}, mlp = plain, "
       "vocab = 51200, seq = 2048, micro_batch = {b}, position = learned, norm = layernorm, "
       "bias = true, attention = standard }}")


def _text(mesh: str, places: str, model: str | None = None) -> str:
    model = model or GPT.format(l=24, h=2304, a=24, f=4 * 2304, b=16)
    return f'strategy "t"\n{model}\nprecision mixed_adam\nmesh {{\n{mesh}\n}}\n{places}\n'


# ---- device profiles ----------------------------------------------------------------------------


def test_the_five_profiles_carry_their_data_sheet_figures() -> None:
    d = devices()
    assert {"a100_80gb_sxm", "h100_sxm", "h200", "mi300x", "b200"} <= set(d)
    # REFERENCE §9: A100 312 TFLOP/s 16-bit dense, H100 SXM 989 bf16 / 1979 fp8
    assert float(d["a100_80gb_sxm"].peak("bf16") or 0) == 312e12
    assert round(float(d["h100_sxm"].peak("bf16") or 0) / 1e12) == 989
    assert round(float(d["h100_sxm"].peak("fp8") or 0) / 1e12) == 1979
    assert d["a100_80gb_sxm"].peak("fp8") is None  # Ampere has no fp8 tensor cores
    # DGX H100: NVLink 900 GB/s both ways; 8 x 400 Gb/s InfiniBand
    assert float(d["h100_sxm"].intra_node_bandwidth) == 450e9
    assert float(d["h100_sxm"].network_bandwidth) == 400e9 / 8  # 400 Gb/s = 50 GB/s
    assert d["h200"].memory_bytes == 141 * 10**9
    assert round(float(d["mi300x"].peak("bf16") or 0) / 1e12, 1) == 1307.4


def test_every_figure_names_its_source() -> None:
    for dev in devices().values():
        sources = dict(dev.sources)
        for key in ("flops", "memory_bytes", "memory_bandwidth", "intra_node_bandwidth",
                    "network_bandwidth", "gpus_per_node", "latency"):
            assert len(sources.get(key, "")) > 20, (dev.key, key)


def test_the_data_file_is_in_the_package() -> None:
    assert (ROOT / "placeverify" / "ir" / "devices.json").is_file()
    # hatch ships every file under the package folder; nothing excludes json
    assert 'packages = ["placeverify"]' in (ROOT / "pyproject.toml").read_text()


# ---- the mesh block -----------------------------------------------------------------------------


def test_links_default_by_node_boundary_and_stay_overridable() -> None:
    s = load_text(_text("dp = 4\npp = 2\ntp = 8\ndevice = h100_sxm",
                        "place ddp over dp\nplace pipeline(1f1b, microbatches = 4) over pp\n"
                        "place megatron over tp"))
    bw = {a.name: float(a.bandwidth or 0) for a in s.mesh.axes}
    # tp (innermost, 8 ranks) inside a DGX H100; pp and dp cross nodes with one rank per node
    assert bw == {"tp": 450e9, "pp": 50e9, "dp": 50e9}
    assert s.mesh.device_memory == 80 * 10**9

    s = load_text(_text("dp = 16\ntp = 2 { bandwidth = 100 GB/s }\ndevice = a100_80gb_sxm",
                        "place ddp over dp\nplace megatron over tp"))
    bw = {a.name: float(a.bandwidth or 0) for a in s.mesh.axes}
    # dp crosses nodes with 4 of its ranks in each node: 4 NICs of 25 GB/s
    assert bw == {"dp": 100e9, "tp": 100e9}


def test_unknown_device_is_a_positioned_error_with_a_suggestion() -> None:
    with pytest.raises(PlaceError) as info:
        load_text(_text("dp = 8\ndevice = h100_sxn", "place ddp over dp"))
    text = str(info.value)
    assert "unknown device 'h100_sxn'; did you mean 'h100_sxm'?" in text
    assert ":6:10:" in text  # line 6 of the text, the value's column


def test_fp8_matmuls_on_a_device_without_them_are_refused() -> None:
    with pytest.raises(PlaceError, match="no fp8 matmuls"):
        load_text(_text("dp = 8\ndevice = a100_80gb_sxm\nmatmul = fp8", "place ddp over dp"))


# ---- FLOPs against the published formulas ---------------------------------------------------------


def _narayanan(B: int, l: int, h: int, s: int = 2048, V: int = 51200) -> float:
    return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


@pytest.mark.parametrize(("l", "h", "a", "t", "b"), [(24, 2304, 24, 1, 16), (40, 6144, 48, 8, 8)])
def test_hardware_flops_match_narayanan(l: int, h: int, a: int, t: int, b: int) -> None:
    model = GPT.format(l=l, h=h, a=a, f=4 * h, b=b)
    tp = f"\ntp = {t}" if t > 1 else ""
    s = load_text(_text(f"dp = 2{tp}\ndevice = a100_80gb_sxm",
                        "place ddp over dp\n" + ("place megatron over tp\n" if t > 1 else "")
                        + "recompute full", model))
    result = step_time(s, costs(s))
    assert result is not None
    assert result.flops_per_microbatch == pytest.approx(_narayanan(b, l, h) / t, rel=1e-12)


def test_model_flops_match_korthikanti_and_ignore_recomputation() -> None:
    l, h, b = 24, 2304, 16
    model = GPT.format(l=l, h=h, a=24, f=4 * h, b=b)
    s = load_text(_text("dp = 4\ndevice = a100_80gb_sxm", "place ddp over dp\nrecompute full",
                        model))
    result = step_time(s, costs(s))
    assert result is not None
    B, sq, V = 4 * b, 2048, 51200
    expected = 72 * B * l * sq * h**2 * (1 + sq / (6 * h) + V / (12 * h * l))
    assert result.model_flops == pytest.approx(expected, rel=1e-12)
    assert result.tokens == B * sq


def test_gqa_swiglu_flops_by_hand() -> None:
    s = load_text('strategy "t"\nmodel llama3_8b { seq = 8192, micro_batch = 1, '
                  'attention = standard }\nprecision megatron\n'
                  'mesh {\ndp = 8\ndevice = h100_sxm\n}\nplace ddp over dp\nrecompute none\n')
    result = step_time(s, costs(s))
    assert result is not None
    h, f, kv, L, V, T = 4096, 14336, 8 * 128, 32, 128256, 8192
    per_token = L * (2 * h * (h + 2 * kv) + 2 * h * h + 3 * 2 * h * f + 4 * T * h) + 2 * h * V
    assert result.flops_per_microbatch == pytest.approx(3 * per_token * T, rel=1e-12)


# ---- recomputation as the sources ran it -------------------------------------------------------


def _korthikanti_model_flops(b: int, l: int, h: int, sq: int = 2048, V: int = 51200) -> float:
    """Korthikanti et al.'s model FLOPs of one micro-batch: 72·b·l·s·h²(1 + s/(6h) + V/(12hl))."""
    return 72 * b * l * sq * h**2 * (1 + sq / (6 * h) + V / (12 * h * l))


def _layer_forward(b: int, h: int, sq: int = 2048) -> float:
    """One GPT layer's forward: Narayanan's 96 less Korthikanti's 72, per layer: 24·b·s·h²(1 +
    s/(6h))."""
    return 24 * b * sq * h**2 * (1 + sq / (6 * h))


@pytest.mark.parametrize(("every", "recomputed"), [(1, 24), (2, 12), (5, 4), (30, 0)])
def test_recompute_full_every_n_reruns_every_nth_layer(every: int, recomputed: int) -> None:
    # torchtitan's selective layer checkpointing wraps the n-th, 2n-th, ... block: ⌊24 / n⌋
    l, h, b = 24, 2304, 4
    option = f"(every = {every})" if every > 1 else ""
    s = load_text(_text("dp = 2\ndevice = a100_80gb_sxm",
                        f"place ddp over dp\nrecompute full{option}",
                        GPT.format(l=l, h=h, a=24, f=4 * h, b=b)))
    result = step_time(s, costs(s))
    assert result is not None
    expected = _korthikanti_model_flops(b, l, h) + recomputed * _layer_forward(b, h)
    assert result.flops_per_microbatch == pytest.approx(expected, rel=1e-12)


def test_recompute_full_every_n_keeps_the_other_layers_activations() -> None:
    # Korthikanti et al. Table 2: sbh(34 + 5as/h) per layer kept without recomputation, 2sbh
    # (the layer's input) with full recomputation; every = 2 over 24 layers: 12 of each
    l, h, a, b, sq = 24, 2304, 24, 4, 2048
    model = GPT.format(l=l, h=h, a=a, f=4 * h, b=b).replace("bias = true", "bias = true, "
                                                             "dropout = true")
    s = load_text(_text("dp = 2", "place ddp over dp\nrecompute full(every = 2)", model))
    act = costs(s).activations
    assert act is not None
    sbh = sq * b * h
    kept = sbh * (34 + 5 * a * sq / h)
    assert float(act.kept) == pytest.approx(12 * 2 * sbh + 12 * kept, rel=1e-12)


LLAMA_FLASH = ("model transformer {{ layers = 4, hidden = 4096, heads = 32, kv_heads = 8, "
               "ffn = 14336, mlp = gated, vocab = 128256, seq = 4096, micro_batch = {b}, "
               "position = rotary, norm = rmsnorm, attention = flash }}")


def test_selective_op_reruns_every_second_matmul() -> None:
    # torchtitan's op policy (parallelize_llama.py, April 2024): of Q, K, V, O, gate, up, down
    # the 2nd, 4th and 6th outputs are not kept: K (h x kv), O (h x h), up (h x f) run again
    h, kv, f, L, V, T, b = 4096, 8 * 128, 14336, 4, 128256, 4096, 2
    s = load_text(_text("dp = 8\ndevice = a100_80gb_sxm", "place fsdp over dp\n"
                        "recompute selective_op", LLAMA_FLASH.format(b=b)))
    result = step_time(s, costs(s))
    assert result is not None
    # forward per token: projections, gated MLP, causal flash core (half of 4·T·h), output
    layer = 2 * h * (h + 2 * kv) + 2 * h * h + 3 * 2 * h * f + 4 * T * h / 2
    forward = b * T * (L * layer + 2 * h * V)
    rerun = b * T * L * 2 * (h * kv + h * h + h * f)
    assert result.flops_per_microbatch == pytest.approx(3 * forward + rerun, rel=1e-12)


def test_selective_op_keeps_the_saved_outputs() -> None:
    # per layer, e = 2 bytes: the layer input, Q, V, the attention output, the gate output and
    # the down projection's output, and flash attention's fp32 log-sum-exp per head and token
    h, kv, f, a, T, b = 4096, 8 * 128, 14336, 32, 4096, 2
    s = load_text(_text("dp = 8", "place fsdp over dp\nrecompute selective_op",
                        LLAMA_FLASH.format(b=b)).replace("mixed_adam", "megatron"))
    act = costs(s).activations
    assert act is not None
    per_token = 2 * (h + h + kv + h + f + h) + 4 * a
    assert float(act.per_layer) == pytest.approx(b * T * per_token, rel=1e-12)


def test_recompute_options_are_checked() -> None:
    with pytest.raises(PlaceError, match="'every = N' is recompute full's"):
        load_text(_text("dp = 2", "place ddp over dp\nrecompute selective(every = 2)"))
    with pytest.raises(PlaceError, match="every must be at least 1"):
        load_text(_text("dp = 2", "place ddp over dp\nrecompute full(every = 0)"))
    with pytest.raises(PlaceError, match="not modelled: selective_op"):
        load_text('strategy "t"\nmodel mixtral_8x7b { seq = 4096, micro_batch = 1 }\n'
                  "precision megatron\nmesh {\ndp = 8\n}\nplace ddp over dp\n"
                  "recompute selective_op\n")


def test_pipeline_scatter_gather_sends_a_tensor_shard() -> None:
    # Narayanan et al. 2021 §4.1: each of the t ranks sends b·s·h/t over the pipeline link and
    # the receiving stage all-gathers the b·s·h over its tensor ranks
    l, h, b, m, t = 24, 2304, 1, 8, 4
    def comm(option: str) -> dict[tuple[str, str], float]:
        s = load_text(_text(f"pp = 2\ntp = {t}",
                            f"place pipeline(1f1b, microbatches = {m}{option}) over pp\n"
                            "place megatron over tp\nrecompute none",
                            GPT.format(l=l, h=h, a=24, f=4 * h, b=b)))
        return {(i.op, ",".join(i.axes)): float(i.bytes) for i in costs(s).comm
                if "boundary" in i.what or i.op == "send"}
    bsh = b * 2048 * h * 2  # fp16 activations
    assert comm("") == {("send", "pp"): 2 * m * bsh}
    assert comm(", scatter_gather = true") == {("send", "pp"): 2 * m * bsh / t,
                                               ("all_gather", "tp"): 2 * m * bsh * (t - 1) / t}


def test_fp8_runs_attention_at_the_16_bit_rate_and_pays_for_casts() -> None:
    # Transformer Engine leaves fp8 attention off (DelayedScaling fp8_dpa = False): the flash
    # core at 989.4 TFLOP/s x η, the other matmuls at 1978.9; casts: bytes per GEMM input
    # element (2h + h + f per token per layer forward), once forward, twice backward, at HBM rate
    h, kv, f, L, V, T, b = 4096, 8 * 128, 14336, 4, 128256, 4096, 1
    text = _text("dp = 8\ndevice = h100_sxm\nmatmul = fp8", "place ddp over dp\nrecompute none",
                 LLAMA_FLASH.format(b=b)).replace("mixed_adam", "megatron")
    s = load_text(text)
    gemm = b * T * (L * (2 * h * (h + 2 * kv) + 2 * h * h + 3 * 2 * h * f) + 2 * h * V)
    core = b * T * L * 4 * T * h / 2
    r8, r16 = 1978.9e12 * 0.5, 989.4e12 * 0.5
    result = step_time(s, costs(s), PLAIN)
    assert result is not None
    assert result.compute_seconds == pytest.approx(3 * gemm / r8 + 3 * core / r16, rel=1e-9)
    casts = replace(PLAIN, fp8_cast_bytes=4.0)
    result = step_time(s, costs(s), casts)
    assert result is not None
    cast_seconds = 3 * L * 4.0 * b * T * (2 * h + h + f) / 3350e9
    assert result.compute_seconds == pytest.approx(3 * gemm / r8 + 3 * core / r16 + cast_seconds,
                                                   rel=1e-9)


# ---- the step-time model ----------------------------------------------------------------------------

PLAIN = Calibration(efficiency=(("default", 0.5),), score_passes=0.0, hidden_passes=0.0,
                    attention_efficiency=1.0, link_efficiency=1.0, fp8_cast_bytes=0.0,
                    memory_efficiency=1.0)


@pytest.mark.parametrize(("gbps", "share"), [(1, 1.0), (1000, 1.0), (1, 0.8), (1000, 0.8),
                                             (30, 0.8), (30, 1.0)])
def test_ddp_reduction_hides_behind_the_backward(gbps: int, share: float) -> None:
    """The all-reduce after the loop hides behind the last backward; what outlasts it is
    exposed, and at least the share 1 - data_overlap of it."""
    l, h, b = 24, 2304, 16
    s = load_text(_text(f"dp = 2 {{ bandwidth = {gbps} GB/s, latency = 1 ns }}\n"
                        "device = a100_80gb_sxm", "place ddp over dp\nrecompute none",
                        GPT.format(l=l, h=h, a=24, f=4 * h, b=b)))
    result = step_time(s, costs(s), replace(PLAIN, data_overlap=share))
    assert result is not None and result.step_seconds is not None
    rate = 312e12 * 0.5
    sq, V = 2048, 51200  # Korthikanti's model FLOPs (no recomputation) are 3 x forward
    forward = 72 * b * l * sq * h**2 * (1 + sq / (6 * h) + V / (12 * h * l)) / 3 / rate
    backward = 2 * forward
    grads = 2 * s.model.params  # fp16 gradients
    allreduce = 2 * (2 - 1) / 2 * grads / (gbps * 1e9)
    exposed = max(allreduce * (1 - share), allreduce - backward)
    assert result.compute_seconds == pytest.approx(forward + backward, rel=1e-9)
    assert dict(result.exposed).get("dp", 0.0) == pytest.approx(exposed, rel=1e-6, abs=1e-7)
    optimizer = s.model.params * (2 * 12 + 2 + 2) / 2039e9
    assert result.step_seconds == pytest.approx(forward + backward + exposed + optimizer,
                                                rel=1e-6)


def test_tensor_collectives_are_exposed_and_the_bubble_scales_them() -> None:
    l, h, b, p, m = 24, 2304, 1, 4, 8
    s = load_text(_text("pp = 4 { bandwidth = 1000 TB/s, latency = 1 ns }\n"
                        "tp = 2 { bandwidth = 100 GB/s, latency = 1 ns }\ndevice = a100_80gb_sxm",
                        f"place pipeline(1f1b, microbatches = {m}) over pp\n"
                        "place megatron over tp\nrecompute none",
                        GPT.format(l=l, h=h, a=24, f=4 * h, b=b)))
    result = step_time(s, costs(s), PLAIN)
    assert result is not None and result.bubble_seconds is not None
    assert result.compute_seconds is not None
    # per micro-batch: 4 all-reduces of b·s·h fp16 elements per layer on this stage's 6 layers,
    # and one for the vocab-parallel embedding's output
    tp_mb = (4 * (l // p) + 1) * 2 * (1 / 2) * (b * 2048 * h * 2) / 100e9
    t_mb = result.compute_seconds / m + tp_mb
    # the bubble is the other stages' work in the last stage's micro-batch times: 6 layers of
    # 24sh² + 4s²h forward FLOPs each (Narayanan et al. 2021, Appendix) on every stage, and the
    # output layer's 2shV on the last, which sets the pace (all ÷ t, forward and backward alike)
    seq, vocab = 2048, 51200
    layer = 24 * seq * h**2 + 4 * seq**2 * h
    held = l // p
    others = (p - 1) * held * layer / (held * layer + 2 * seq * h * vocab)
    assert others < p - 1
    assert result.bubble_seconds == pytest.approx(others * t_mb, rel=1e-3)


def test_mfu_follows_palm() -> None:
    s = load_text(_text("dp = 8\ndevice = h100_sxm", "place ddp over dp\nrecompute full"))
    result = step_time(s, costs(s))
    assert result is not None and result.step_seconds is not None and result.mfu is not None
    assert result.mfu == pytest.approx(result.model_flops / (result.step_seconds * 8 * 989.4e12))
    assert result.tokens_per_second == pytest.approx(result.tokens / result.step_seconds)


def test_time_appears_only_with_a_device_or_links() -> None:
    bare = load_text(_text("dp = 8", "place ddp over dp"))
    assert estimate_time(bare) is None
    assert check_strategy(bare, verify_conditions=False).time is None
    linked = load_text(_text("dp = 8 { bandwidth = 25 GB/s }", "place ddp over dp"))
    time = estimate_time(linked)
    assert time is not None and time.step_seconds is None  # no device: no compute time
    assert any("no device profile" in n for n in time.notes)


def test_check_json_has_the_time_section(tmp_path: object) -> None:
    path = ROOT / "examples" / "strategies" / "llama3-8b-ddp.place"
    text = path.read_text().replace("mesh {", "mesh {\n    device = h100_sxm", 1)
    file = tmp_path / "t.place"  # type: ignore[operator]
    file.write_text(text)
    out = subprocess.run([sys.executable, "-m", "placeverify", "check", str(file), "--json",
                          "--no-verify"], capture_output=True, text=True, cwd=ROOT, check=False)
    doc = json.loads(out.stdout)
    time = doc["time"]
    assert time["step_seconds"] > 0 and time["tokens_per_second"] > 0 and 0 < time["mfu"] < 1
    assert set(time["breakdown"]) == {"compute_seconds", "exposed_communication_seconds",
                                      "bubble_seconds", "optimizer_seconds"}
    plain = subprocess.run([sys.executable, "-m", "placeverify", "check", str(file),
                            "--no-verify"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert "step time" in plain.stdout and "MFU" in plain.stdout
    assert EXAMPLES.is_dir()


# ---- the published-runs benchmark -------------------------------------------------------------------


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("step_time_bench",
                                                  ROOT / "benchmarks" / "step_time.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


def test_benchmark_rows_have_narayanans_flops() -> None:
    bench = _benchmark()
    rows = [r for r in bench.narayanan_rows() if " p1 " in r.label]
    for row in random.Random(15).sample(rows, 3):
        values = next(v for v in bench.NARAYANAN if row.label.startswith(f"{v[0]}B "))
        _, _, h, l, t, _, n, B, mb, _, _ = values
        s = load_text(row.text)
        result = step_time(s, costs(s))
        assert result is not None
        m = B // ((n // t) * mb)
        assert result.flops_per_microbatch * m * n == pytest.approx(_narayanan(B, l, h), rel=1e-9)


def test_benchmark_held_out_error_with_the_shipped_constants() -> None:
    bench = _benchmark()
    rows = bench.all_rows()
    assert len(rows) >= 30 and len({r.source for r in rows}) >= 5
    loaded = [(r, s, costs(s)) for r in rows for s in [load_text(r.text)]]
    held = [x for x in loaded if not x[0].calibrate]
    median, worst = bench.summary(held, CALIBRATION)
    assert median <= 0.10 and worst <= 0.25
    assert replace(CALIBRATION) == CALIBRATION


def test_megatron_bridge_row_is_the_published_run() -> None:
    """Megatron-Bridge 25.11, DGX-H100: LLAMA3.1_405B on 1,024 GPUs, GBS 512, MBS 1, sequence
    8,192, TP 8, PP 8, CP 2, VP 8, 292 tokens/s/GPU; held out, written as the recipe ran."""
    bench = _benchmark()
    (row,) = bench.megatron_bridge_rows()
    assert not row.calibrate and row.source == "megatron-bridge"
    assert row.measured == pytest.approx(512 * 8192 / (292 * 1024), rel=1e-12)  # 14.03 s
    s = load_text(row.text)
    sizes = {a.name: a.size for a in s.mesh.axes}
    assert sizes == {"dp": 1024 // (8 * 8 * 2), "pp": 8, "cp": 2, "tp": 8}
    assert s.microbatches == 512 // 8  # GBS / (MBS x data-parallel replicas)
    assert s.mesh.matmul == "fp8" and s.precision.grads_dtype == "bf16"  # grad_reduce_in_fp32 off
    assert s.pipeline is not None and s.pipeline.chunks == 8


def test_bloom_row_is_the_published_run() -> None:
    """bigscience-workshop/bigscience train/tr11-176B-ml: TP 4, PP 12 on 384 A100 (DP 8), MBS 2,
    GBS 2,048, the step its log printed (105.22 s); BLOOM's paper gives 176,247M parameters."""
    bench = _benchmark()
    (row,) = bench.bloom_rows()
    assert not row.calibrate and row.source == "bloom" and row.measured == 105.22
    s = load_text(row.text)
    assert {a.name: a.size for a in s.mesh.axes} == {"pp": 12, "dp": 8, "tp": 4}
    assert s.microbatches == 2048 // (8 * 2)
    assert s.model.params // 1_000_000 == 176_247
    assert s.pipeline is not None and s.pipeline.layers == (5, *[6] * 10, 5)
    from placeverify.ir.placement import Overlap

    assert s.placement("dp").data_overlap is Overlap.NONE


def test_narayanan_rows_reduce_as_the_papers_scripts_ran() -> None:
    """examples/sc21/run_table_1.sh (NVIDIA/Megatron-LM de7dc40f88): DDP=local for the pipelined
    rows (39B to 1T), whose train_step all-reduces after forward_backward_func; DDP=torch for
    1.7B, 3.6B, 7.5B and 18B (no pipeline), PyTorch's DDP reducing during the last backward."""
    from placeverify.ir.placement import Overlap

    torch_ddp = {"1.7B", "3.6B", "7.5B", "18.4B"}
    rows = _benchmark().narayanan_rows()
    assert {r.label.split()[0] for r in rows} >= torch_ddp
    for row in rows:
        expected = Overlap.ALL if row.label.split()[0] in torch_ddp else Overlap.NONE
        assert load_text(row.text).placement("dp").data_overlap is expected, row.label


def test_megatron_gpt3_2021_row_is_the_published_run() -> None:
    """Megatron-LM's README of 2021-01 (152aab304d): GPT-3 175B, global batch 1,536 on 1,024
    A100, "each iteration takes around 32 seconds resulting in 138 teraFLOPs per GPU", with
    its launch script: TP 8, PP 16 (DP 8), micro-batch 1, --fp16, --checkpoint-activations."""
    from placeverify.ir.placement import Overlap

    (row,) = [r for r in _benchmark().all_rows() if r.source == "megatron-lm-2021"]
    assert not row.calibrate
    flops = 96 * 1536 * 2048 * 96 * 12288**2 * (1 + 2048 / (6 * 12288)
                                                  + 51200 / (16 * 96 * 12288))
    assert row.measured == pytest.approx(flops / (138e12 * 1024), rel=1e-12)
    assert abs(row.measured - 32) < 0.5  # "around 32 seconds"
    s = load_text(row.text)
    assert {a.name: a.size for a in s.mesh.axes} == {"dp": 8, "pp": 16, "tp": 8}
    assert s.microbatches == 1536 // 8 and s.precision.grads_dtype == "fp16"
    assert s.pipeline is not None and s.pipeline.chunks == 1
    assert s.placement("dp").data_overlap is Overlap.NONE


def test_a100_40gb_runs_its_matmuls_as_the_80gb_part() -> None:
    """The A100 40GB SXM is the same GA100 chip with other memory (data sheet: 40GB HBM2,
    1,555 GB/s; 312 TFLOP/s bf16 for both): its η_max is the fitted a100_80gb_sxm one, its HBM
    bandwidth its own; the H100 96GB at 500 W (torchtitan's benchmarks page: 96GB HBM2e,
    2.4 TB/s) runs as the H100 SXM."""
    d = devices()
    small, large = d["a100_40gb_sxm"], d["a100_80gb_sxm"]
    assert small.compute_key == "a100_80gb_sxm" and large.compute_key == "a100_80gb_sxm"
    assert small.memory_bytes == 40 * 10**9 and float(small.memory_bandwidth) == 1555e9
    assert small.peak("bf16") == large.peak("bf16")
    assert d["h100_96gb_500w"].compute_key == "h100_sxm"
    assert float(d["h100_96gb_500w"].memory_bandwidth) == 2400e9
    s = load_text(_text("dp = 8\ndevice = a100_40gb_sxm", "place ddp over dp"))
    result = step_time(s, costs(s))
    assert result is not None and result.efficiency == CALIBRATION.eta_max("a100_80gb_sxm", "bf16")
