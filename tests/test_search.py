"""``placeverify search``: legality of the layouts, the screen against the full model, the
rendered ``.place`` text, and the command end to end (JSON against its shipped schema, every
layout shown proved and fitting, ``-o`` files that ``check`` reads to the same figures).

Expected values come from the rules the frameworks state (cited in placeverify/search/space.py)
and from Llama 3's published stage split, or from the full model (``check``'s), which the screen
must track; never from the screen itself."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from placeverify.api import costs, load_text
from placeverify.cost.time import step_time
from placeverify.ir.devices import device
from placeverify.ir.model import ARCHITECTURES, LLAMA3_8B, Transformer
from placeverify.ir.placement import TensorOverlap
from placeverify.search.problem import problem_from
from placeverify.search.render import place_text
from placeverify.search.screen import Screen, Setting
from placeverify.search.space import Layout, Recompute, Sharding, Space, layouts, stage_layers

ROOT = Path(__file__).resolve().parents[1]


def shown_layouts(*flags: str) -> list[dict[str, Any]]:
    """The layouts ``search --json`` shows (top and frontier) for Llama 3 8B on 16 H100, global
    batch 32 x 4096, under these flags."""
    args = [sys.executable, "-m", "placeverify", "search", "--model", "llama3_8b", "--device",
            "h100_sxm", "--devices", "16", "--global-batch", "32", "--seq", "4096", "--json",
            "-q", *flags]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    return [e["layout"] for e in (*document["top"], *document["frontier"])]


def screen_of(pb: Any) -> Screen:
    """The search's screen for a problem, as ``search`` builds it."""
    return Screen(Setting(pb.arch, pb.precision, pb.device, pb.compute_dtype,
                          float(pb.pcie_bandwidth)))


def full_seconds(text: str) -> float:
    """The full model's step time of a rendered layout."""
    strategy = load_text(text, "<layout>")
    result = step_time(strategy, costs(strategy))
    assert result is not None and result.step_seconds is not None
    return result.step_seconds


def problem(model: str, dev: str, devices: int, batch: int, seq: int, memory: str = "",
            entries: str = "", precision: str = "megatron") -> Any:
    text = (f'strategy "base"\nmodel {model} {{ {entries}seq = {seq}, micro_batch = 1 }}\n'
            f"precision {precision}\n"
            f"mesh {{\n    dp = {devices}\n    device = {dev}\n{memory}}}\nplace ddp over dp\n"
            f"microbatches = {max(1, batch // devices)}\n")
    from placeverify.api import parse
    from placeverify.diagnostics import Source

    strategy = load_text(text, "<base>")
    return problem_from(strategy, parse(Source("<base>", text)), global_batch=batch)


# ---- legality ---------------------------------------------------------------------------------


def test_llama3_405b_stages_split_as_published() -> None:
    # Llama 3 (arXiv 2407.21783) §3.3.2: 126 layers on 16 stages, one layer fewer on the
    # first and the last stage
    assert stage_layers(126, 16, 1, uneven=True) == (7, *[8] * 14, 7)
    assert stage_layers(128, 16, 1, uneven=True) is None  # even
    assert stage_layers(126, 16, 1, uneven=False) is False
    # interleaved (REFERENCE §9, Table 4 row: "interleaved pipeline with one layer fewer on the
    # first and last stages"): 4 chunks of 2 layers, 64 virtual stages, the ends 1 layer each;
    # physical stage i runs virtual stages i, i + 16, i + 32, i + 48: 7, 8 x 14, 7 again
    assert stage_layers(126, 16, 4, uneven=True) == (1, *[2] * 62, 1)
    lay = Layout(tp=8, cp=1, pp=16, v=4, ep=1, dp=128, sharding=Sharding.ZERO1, shard=128,
                 sp=True, recompute=Recompute.NONE, offload=False, b=1, m=16,
                 stages=(1, *[2] * 62, 1))
    assert lay.physical_stages() == (7, *[8] * 14, 7)
    assert stage_layers(126, 16, 4, uneven=False) is False
    assert stage_layers(127, 2, 1, uneven=True) is False  # two stages have no middle to fill


def test_every_layout_obeys_the_frameworks_rules() -> None:
    arch = LLAMA3_8B  # 32 heads, 8 KV heads, 32 layers, seq 8192
    seen = list(layouts(arch, 64, 128, 8, Space()))
    assert seen
    for lay in seen:
        assert lay.tp * lay.cp * lay.pp * lay.ep * lay.dp == 64
        assert arch.heads % lay.tp == 0 and arch.kv_heads % lay.tp == 0 and lay.tp <= 8
        assert lay.cp == 1 or arch.seq % (2 * lay.cp) == 0
        assert lay.b * lay.m * lay.dp * lay.ep == 128
        if lay.v > 1:
            assert lay.pp > 2 and lay.m % lay.pp == 0
        if lay.stages is None:
            assert arch.layers % (lay.pp * lay.v) == 0
        else:  # uneven: only the first and last virtual stages differ, by at most the middle's
            st = lay.stages
            assert sum(st) == arch.layers and len(st) == lay.pp * lay.v
            assert len(set(st[1:-1])) == 1 and 1 <= min(st[0], st[-1]) <= st[1]
        # one data-parallel rank: no sharding, or ZeRO-Offload's zero2 over an axis of one
        assert (lay.sharding is Sharding.NONE) == (lay.dp == 1 and not lay.offload)
        assert lay.dp > 1 or lay.sharding in (Sharding.NONE, Sharding.ZERO2)
        assert not lay.offload or lay.sharding in (Sharding.ZERO2, Sharding.ZERO3)
        assert not lay.sp or lay.tp > 1
    # Megatron-LM's GPT-3-style 3D layout is among them: t = 8, p = 4, d = 2, ZeRO-1
    assert any(lay.tp == 8 and lay.pp == 4 and lay.dp == 2 and lay.sharding is Sharding.ZERO1
               and lay.sp and lay.recompute is Recompute.SELECTIVE for lay in seen)
    assert len(seen) == len(set(seen))


def test_tensor_parallelism_that_splits_kv_heads_is_not_enumerated() -> None:
    arch = LLAMA3_8B  # 8 KV heads: t = 16 would split a KV head
    assert all(lay.tp <= 8 for lay in layouts(arch, 64, 64, 16, Space()))


# ---- the screen tracks the full model ---------------------------------------------------------


@pytest.mark.parametrize("model, dev, devices, batch, seq, entries, overlap", [
    ("llama3_8b", "h100_sxm", 64, 256, 8192, "", TensorOverlap.NONE),
    ("gpt3_175b", "a100_80gb_sxm", 512, 1024, 2048, "", TensorOverlap.NONE),
    ("mixtral_8x7b", "h100_sxm", 64, 256, 4096, "", TensorOverlap.NONE),
    # heads narrower than h / a
    ("llama3_8b", "h100_sxm", 64, 256, 8192, "head_dim = 96, ", TensorOverlap.NONE),
    # Megatron-LM's layers (overlap = backward), dense and MoE
    ("gpt3_175b", "a100_80gb_sxm", 512, 1024, 2048, "", TensorOverlap.BACKWARD),
    ("mixtral_8x7b", "h100_sxm", 64, 256, 4096, "", TensorOverlap.BACKWARD),
])
def test_screen_agrees_with_the_full_model(model: str, dev: str, devices: int, batch: int,
                                           seq: int, entries: str,
                                           overlap: TensorOverlap) -> None:
    _screen_agrees(problem(model, dev, devices, batch, seq, entries=entries), overlap)


@pytest.mark.parametrize("precision", ["torchtitan_bf16", "accelerate_fsdp_bf16",
                                       "bf16_adam { reduce = fp32 }"])
def test_screen_agrees_under_a_mixed_precision_policy(precision: str) -> None:
    # Θ gathered and G reduced in other dtypes than they are kept in: the screen counts them
    # as the full model does (ir/precision.py)
    _screen_agrees(problem("llama3_8b", "h100_sxm", 64, 256, 8192, precision=precision),
                   TensorOverlap.NONE)


def _screen_agrees(pb: Any, overlap: TensorOverlap) -> None:
    screen = screen_of(pb)
    every = list(layouts(pb.arch, pb.devices, pb.global_batch, pb.device.gpus_per_node,
                         Space(tp_overlap=overlap)))
    rng = random.Random(7)
    for lay in rng.sample(every, 40):
        strategy = load_text(place_text(pb, lay), "<layout>")
        full = costs(strategy)
        st = step_time(strategy, full)
        assert st is not None and st.step_seconds is not None and full.peak is not None
        est = screen.estimate(lay)
        assert est.peak_bytes == pytest.approx(float(full.peak.bytes), rel=0.03), lay.label()
        assert est.step_seconds == pytest.approx(st.step_seconds, rel=0.03), lay.label()


@pytest.mark.parametrize("v, stages", [(4, (1, *[2] * 62, 1)), (2, (3, *[4] * 30, 3))])
def test_screen_agrees_on_uneven_interleaved_stages(v: int, stages: tuple[int, ...]) -> None:
    # Llama 3 405B's 126 layers on 16 interleaved stages: the screen reads the physical stages
    # (7, 8 x 14, 7 for v = 4; 3 + 4 = 7 ... for v = 2) as the full model does
    pb = problem("llama3_405b", "h100_sxm", 16384, 2048, 8192)
    screen = screen_of(pb)
    lay = Layout(tp=8, cp=1, pp=16, v=v, ep=1, dp=128, sharding=Sharding.ZERO1, shard=128,
                 sp=True, recompute=Recompute.NONE, offload=False, b=1, m=16, stages=stages)
    text = place_text(pb, lay)
    assert f"chunks = {v}" in text and "layers = [" + ", ".join(map(str, stages)) + "]" in text
    strategy = load_text(text, "<layout>")
    full = costs(strategy)
    st = step_time(strategy, full)
    assert st is not None and st.step_seconds is not None and full.peak is not None
    est = screen.estimate(lay)
    assert est.peak_bytes == pytest.approx(float(full.peak.bytes), rel=0.03)
    assert est.step_seconds == pytest.approx(st.step_seconds, rel=0.03)


# ---- the rendered text ------------------------------------------------------------------------


def test_rendered_text_is_the_layout() -> None:
    pb = problem("llama3_70b", "h100_sxm", 256, 512, 8192)
    lay = Layout(tp=8, cp=2, pp=4, v=5, ep=1, dp=4, sharding=Sharding.HSDP, shard=2, sp=True,
                 recompute=Recompute.SELECTIVE, offload=False, b=2, m=64)
    strategy = load_text(place_text(pb, lay), "<layout>")
    assert strategy.model.arch == pb.arch_for(2)
    assert {a.name: a.size for a in strategy.mesh.axes} == {
        "pp": 4, "replica": 2, "shard": 2, "cp": 2, "tp": 8}
    assert strategy.mesh.names[-1] == "tp"  # innermost: inside a node
    presets = {p.axis: p.preset for p in strategy.placements}
    assert presets == {"pp": "pipeline", "replica": "hsdp", "shard": "hsdp", "cp": "context",
                       "tp": "megatron"}
    pipe = strategy.pipeline
    assert pipe is not None and pipe.chunks == 5 and strategy.microbatches == 64
    assert strategy.placement("tp").sequence_parallel
    assert strategy.recompute.kind.value == "selective"


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_model_text_gives_back_every_bundled_model(name: str) -> None:
    from placeverify.search.render import model_text

    arch: Transformer = ARCHITECTURES[name]
    changed = arch.__class__(**{**{f: getattr(arch, f) for f in arch.__dataclass_fields__},
                                "micro_batch": 4, "seq": 1024, "dropout": not arch.dropout})
    for a in (arch, changed):
        text = f"{model_text(name, a)}\nmesh {{ dp = 2 }}\nplace ddp over dp\n"
        assert load_text(text).model.arch == a


# ---- the command ------------------------------------------------------------------------------


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, encoding="utf-8", timeout=600,
                          check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_search_end_to_end(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "layouts"
    done = run("search", "--model", "llama3_8b", "--device", "h100_sxm", "--devices", "16",
               "--global-batch", "64", "--top", "3", "--json", "-q", "-o", str(out))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    schema = json.loads((resources.files("placeverify") / "schemas" / "search.schema.json")
                        .read_text("utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    assert not errors, errors
    assert len(doc["top"]) == 3
    capacity = device("h100_sxm").memory_bytes  # type: ignore[union-attr]
    shown = doc["top"] + doc["frontier"]
    for entry in shown:
        assert entry["verdict"] == "proved" and entry["needed_bytes"] <= capacity
        lay = entry["layout"]
        assert lay["tp"] * lay["cp"] * lay["pp"] * lay["ep"] * lay["dp"] == 16
        assert lay["micro_batch"] * lay["microbatches"] * lay["dp"] * lay["ep"] == 64
    times = [e["step_seconds"] for e in doc["top"]]
    assert times == sorted(times)
    front = doc["frontier"]
    for a, b in itertools.pairwise(front):  # by memory up, time strictly down
        assert a["needed_bytes"] <= b["needed_bytes"] and a["step_seconds"] > b["step_seconds"]
    # the fastest shown is as fast as the frontier's fastest: both are the best that fits
    assert doc["top"][0]["step_seconds"] == pytest.approx(front[-1]["step_seconds"])
    # a written layout checked on its own gives what search printed for it
    first = doc["top"][0]
    checked = run("check", "--json", first["file"])
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["time"]["step_seconds"] == pytest.approx(first["step_seconds"], rel=1e-9)
    assert report["memory"]["peak_bytes"] == first["peak_bytes"]


@pytest.mark.parametrize("width", [120, 60, 40])
def test_search_text_fits_the_width_without_cutting_a_number(width: int) -> None:
    # The tables follow --width like check and compare (report/layout.py): a narrow terminal
    # gets them wrapped, transposed or listed, and every figure the JSON has for the fastest
    # layout appears whole in the text.
    args = ["--model", "llama3_8b", "--device", "h100_sxm", "--devices", "16",
            "--global-batch", "64", "--top", "2", "-q"]
    doc = json.loads(run("search", *args, "--json").stdout)
    done = run("search", *args, "--width", str(width))
    assert done.returncode == 0, done.stderr
    tables = done.stdout.split("fastest layouts", 1)[1].split("not shown", 1)[0]
    rows = [line for line in tables.splitlines()[1:] if not line.startswith("Pareto frontier")]
    assert rows and max(len(line) for line in rows) <= width  # the titles are prose
    first = doc["top"][0]
    # three significant digits, a trailing zero kept ("3.90 s")
    assert first["label"] in tables and f"{first['step_seconds']:#.3g}".rstrip(".") + " s" in tables
    assert f"{first['needed_bytes'] / 1e9:#.3g}".rstrip(".") + " GB" in tables  # the last column


def test_search_tries_only_the_shardings_asked_for() -> None:
    # --sharding zero1 (Megatron-LM's distributed optimizer): every layout shown, top and
    # frontier, shards only the optimizer over its data-parallel ranks (or has none)
    args = ["--model", "llama3_8b", "--device", "h100_sxm", "--devices", "16",
            "--global-batch", "64", "--top", "3", "-q", "--json"]
    every = json.loads(run("search", *args).stdout)
    shown = lambda doc: doc["top"] + doc["frontier"]  # noqa: E731
    assert {e["layout"]["sharding"] for e in shown(every)} - {"zero1"}  # others win by default
    only = json.loads(run("search", *args, "--sharding", "zero1").stdout)
    assert only["top"] and {e["layout"]["sharding"] for e in shown(only)} <= {"zero1", "none"}
    assert only["counts"]["candidates"] < every["counts"]["candidates"]


def test_search_says_when_nothing_fits(tmp_path: Path) -> None:
    base = tmp_path / "tiny.place"
    base.write_text('strategy "405B on 8 GPUs"\nmodel llama3_405b { seq = 8192, micro_batch = 1 }\n'
                    "precision megatron\nmesh {\n    dp = 8\n    device = h100_sxm\n"
                    "    device_memory = 80 GB\n}\nplace ddp over dp\n", encoding="utf-8")
    done = run("search", str(base), "-q", "--no-offload")
    assert done.returncode == 6, done.stdout + done.stderr
    assert "no layout fits" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "llama3_8b", "--device", "h999", "--devices", "8", "--global-batch", "8"],
     "unknown device 'h999'"),
    (["--model", "llama3_8b", "--device", "h100_sxm"], "needs --model, --device and --devices"),
    (["--model", "llama3_8b", "--device", "h100_sxm", "--devices", "8", "--global-batch", "8",
      "--plot", "frontier.txt"], "--plot writes .png or .svg"),
])
def test_search_bad_input(args: list[str], message: str) -> None:
    # the search is fast on this small problem: an error must come before any output
    done = run("search", *args, "-q")
    assert done.returncode == 2
    assert message in done.stderr


def test_search_draws_its_frontier(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    picture = tmp_path / "frontier.svg"
    done = run("search", "--model", "llama3_8b", "--device", "h100_sxm", "--devices", "16",
               "--global-batch", "64", "-q", "--plot", str(picture))
    assert done.returncode == 0, done.stderr
    import xml.etree.ElementTree as ET

    root = ET.fromstring(picture.read_text("utf-8"))
    assert root.tag.endswith("svg")
    assert "step time" in picture.read_text("utf-8").lower()


def _search_benchmark() -> Any:
    import importlib.util
    spec = importlib.util.spec_from_file_location("search_bench", ROOT / "benchmarks" / "search.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_search_benchmark_breakdown_splits_the_step_time() -> None:
    """``benchmarks/search.py --breakdown``: the terms add up to the step time, and the bubble
    is the interleaved schedule's idle compute: the other stages' work, in micro-batches of the
    last stage's compute (which carries the output layer), over v — Narayanan et al. 2021
    §2.2.2's (p - 1) / v for equal stages."""
    from placeverify.search.run import evaluate

    bench = _search_benchmark()
    _name, pb, published, _every, _spaces = bench.gpt3_175b()  # t8 p16 d8 ddp, m = 192
    screen = screen_of(pb)
    hsdp = Layout(tp=8, cp=1, pp=1, v=1, ep=1, dp=128, sharding=Sharding.HSDP, shard=8,
                  sp=True, recompute=Recompute.FULL, offload=False, b=1, m=12)
    for lay in (published, hsdp):
        e = evaluate(pb, lay, screen.estimate(lay))
        assert e is not None
        terms = bench.terms(e)
        assert set(terms) == set(bench.TERMS)
        assert sum(terms.values()) == pytest.approx(e.step_seconds, rel=1e-12)
        # GPT-3 175B per micro-batch (b = 1), FLOPs ∝ 1/t on every stage: a layer's forward
        # 24sh² + 4s²h (Narayanan et al. 2021, Appendix), run 3 times (forward, backward) and
        # once more with full recomputation (Narayanan et al.'s 4x), or only the attention
        # core's 4s²h again with selective recomputation (unfused softmax); the output layer
        # 2shV (V = 50,257 padded to 51,200) 3 times on the last stage, never recomputed
        h, s, vocab = 12288, 2048, 51200
        forward = 24 * s * h**2 + 4 * s**2 * h
        layer = (4 * forward if lay.recompute is Recompute.FULL
                 else 3 * forward + 4 * s**2 * h)  # (no bubble at pp = 1)
        held = 96 // lay.pp
        slowest = held * layer + 3 * 2 * s * h * vocab
        idle = (lay.pp - 1) * held * layer / slowest / lay.v * terms["compute"] / lay.m
        assert terms["bubble"] == pytest.approx(idle, rel=1e-9, abs=1e-12)
        assert terms["cp"] == terms["ep"] == 0.0 and terms["data"] > 0
        st = step_time(e.strategy, e.costs)
        assert st is not None
        # every collective over a data axis (dp, or HSDP's replica and shard) is "data"
        data = sum(sec for label, sec in st.exposed
                   if {"dp", "replica", "shard"} & set(label.split(" * ")))
        assert terms["data"] == pytest.approx(data, rel=1e-12)
    assert published.pp == 16 and published.v == 1 and published.m == 192
    assert published.recompute is Recompute.FULL


def test_one_device_searches_zero_offload() -> None:
    """Llama 3 8B on one H100: Adam's model states alone, 16 bytes a parameter
    (16 x 8,030,261,248 = 128.5 GB), do not fit in 80 GB; ZeRO-Offload on one device (the
    optimizer and the gradients in host memory, Ren et al. 2021) does, and is what search shows;
    with --no-offload nothing fits (exit 6)."""
    args = ["--model", "llama3_8b", "--device", "h100_sxm", "--devices", "1", "--global-batch",
            "8", "--seq", "4096", "-q", "--json"]
    done = run("search", *args)
    assert done.returncode == 0, done.stderr
    shown = [e["layout"] for e in json.loads(done.stdout)["top"]]
    assert shown and all(lay["offload"] and lay["dp"] == 1 and lay["sharding"] == "zero2"
                         for lay in shown)
    assert run("search", *args, "--no-offload").returncode == 6


def test_a_hugging_face_config_is_a_model_for_search(tmp_path: Path) -> None:
    """``search --model config.json`` without a FILE: Llama 3 8B's config.json searches as the
    bundled llama3_8b does (same layouts, same step times); without --seq it is refused, at
    max_position_embeddings, which is the longest sequence the model takes, not the one
    training uses (it decides what fits), and is never taken for it."""
    config = str(ROOT / "tests" / "importers" / "llama3-8b-config.json")
    flags = ["--device", "h100_sxm", "--devices", "8", "--global-batch", "64", "-q", "--json"]
    from_config = run("search", "--model", config, "--seq", "4096", *flags)
    bundled = run("search", "--model", "llama3_8b", "--seq", "4096", *flags)
    assert from_config.returncode == bundled.returncode == 0, from_config.stderr
    top = [(e["label"], e["step_seconds"]) for e in json.loads(from_config.stdout)["top"]]
    assert top == [(e["label"], e["step_seconds"]) for e in json.loads(bundled.stdout)["top"]]
    unsized = run("search", "--model", config, *flags)
    assert unsized.returncode == 2 and unsized.stdout == ""
    assert "llama3-8b-config.json:11:3: error: no sequence length" in unsized.stderr
    assert "give the training sequence length with --seq N" in unsized.stderr
    # the problem is named by its file, not by the model statement's "transformer"
    assert json.loads(from_config.stdout)["problem"]["model"] == "llama3-8b-config.json"
    assert json.loads(bundled.stdout)["problem"]["model"] == "llama3_8b"
    data = json.loads(Path(config).read_text(encoding="utf-8"))
    del data["max_position_embeddings"]
    bare = tmp_path / "config.json"
    bare.write_text(json.dumps(data), encoding="utf-8")
    refused = run("search", "--model", str(bare), *flags)
    assert refused.returncode == 2 and "with --seq N" in refused.stderr
    assert "Traceback" not in refused.stderr
