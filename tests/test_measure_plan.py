"""``placeverify measure`` without torch: which implementation a placement maps to, the input
errors for placements that have none (pointing at the line), a missing torch (exit 5), and the
rendering of a comparison."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from placeverify.backend import processes
from placeverify.cost.implementations import predict
from placeverify.cost.implementations.spec import Implementation, OptimizerKind
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.ir.placement import Schedule
from placeverify.lower import load
from placeverify.measure import cli as measure_cli
from placeverify.measure.compare import compare, comparison_document
from placeverify.measure.plan import plan

ROOT = Path(__file__).resolve().parents[1]
MEASURE = ROOT / "examples" / "measure"

TINY = """model transformer {
    layers = 2, hidden = 32, heads = 4, ffn = 64, vocab = 40, seq = 8, micro_batch = 2,
    norm = layernorm, position = learned
}
precision fp32_adam
"""


def write(tmp_path: Path, body: str, name: str = "s.place") -> str:
    path = tmp_path / name
    path.write_text('strategy "t"\n' + body, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(("name", "implementation", "world", "reshard"), [
    ("ddp", Implementation.DDP, 2, True),
    ("ddp-mlp", Implementation.DDP, 2, True),
    ("zero1", Implementation.ZERO1, 3, True),
    ("zero2", Implementation.FSDP2, 3, False),
    ("zero3", Implementation.FSDP2, 3, True),
    ("fsdp-llama", Implementation.FSDP2, 4, True),
    ("tp", Implementation.TP, 2, True),
    ("fsdp-tp", Implementation.FSDP2_TP, 4, True),
    ("pipeline-gpipe", Implementation.PIPELINE, 2, True),
    ("pipeline-1f1b", Implementation.PIPELINE, 2, True),
])
def test_examples_map_to_implementations(name: str, implementation: Implementation, world: int,
                                         reshard: bool) -> None:
    spec = plan(load(str(MEASURE / f"{name}.place"))).spec
    assert spec.implementation is implementation
    assert spec.world == world
    assert spec.reshard_after_forward is reshard
    assert spec.optimizer is OptimizerKind.ADAM


def test_pipeline_options_come_from_the_placement() -> None:
    spec = plan(load(str(MEASURE / "pipeline-1f1b.place"))).spec
    assert (spec.pp, spec.microbatches, spec.schedule) == (2, 4, Schedule.ONE_F_ONE_B)


def test_a_bare_parameter_count_runs_an_mlp_with_a_note() -> None:
    measured = plan(load(str(MEASURE / "ddp-mlp.place")))
    assert measured.spec.arch is None and measured.spec.mlp is not None
    # 4 layers of w² + w parameters closest to 100,000 with w a multiple of 8: w = 160 gives
    # 4 · 25,760 = 103,040; w = 152 gives 92,960.
    assert measured.spec.mlp.width == 160
    assert any("MLP" in note for note in measured.notes)


def bare(tmp_path: Path, model: str, mesh: str = "mesh { dp = 2 }\nplace ddp over dp\n") -> Any:
    return plan(load(write(tmp_path, f"model {{ {model} }}\nprecision fp32_adam\n{mesh}")))


def test_largest_tensor_sets_the_mlps_width_and_the_count_its_layers(tmp_path: Path) -> None:
    # 160² = 25,600 is the weight; 103,040 / (25,600 + 160) = 4 layers: what ddp-mlp.place says
    measured = plan(load(str(MEASURE / "ddp-mlp.place")))
    assert (measured.spec.mlp.width, measured.spec.mlp.depth) == (160, 4)
    assert any("largest tensor 25,600" in note for note in measured.notes)
    # 200² = 40,000; 1,000,000 / (40,000 + 200) = 24.9 -> 25 layers, 1,005,000 parameters
    wide = bare(tmp_path, "params = 1000000, largest_tensor = 40000")
    assert (wide.spec.mlp.width, wide.spec.mlp.depth) == (200, 25)
    assert wide.spec.mlp.params() == 1_005_000
    # the same count with a smaller largest tensor runs more, narrower layers (without
    # largest_tensor it would be 4 x Linear(160, 160)): widths are multiples of 8, 96² = 9,216
    # is nearer 10,000 than 104² = 10,816; 103,040 / (9,216 + 96) = 11.07 -> 11 layers
    narrow = bare(tmp_path, "params = 103040, largest_tensor = 10000")
    assert (narrow.spec.mlp.width, narrow.spec.mlp.depth) == (96, 11)
    assert any("largest_tensor = 10,000" in note and "largest tensor 9,216" in note
               for note in narrow.notes)


def test_a_largest_tensor_too_small_for_the_count_is_an_error_at_the_model(
        tmp_path: Path) -> None:
    # 8² = 64 is the nearest weight; 20,000,000 / 72 = 277,778 layers
    with pytest.raises(PlaceError) as caught:
        bare(tmp_path, "params = 20000000, largest_tensor = 64")
    diagnostic = caught.value.diagnostics[0]
    assert "needs 277,778 layers of Linear(8, 8)" in diagnostic.message
    assert diagnostic.span is not None and diagnostic.span.line == 2


def test_a_non_fp32_precision_is_noted() -> None:
    strategy = load(str(ROOT / "examples" / "zero-paper" / "zero1.place"))
    with pytest.raises(PlaceError):  # 64 devices and 7.5e9 parameters: too large
        plan(strategy)


@pytest.mark.parametrize(("body", "line", "words"), [
    (TINY + "mesh { tp = 2 }\nplace megatron(sequence_parallel) over tp\n", 8,
     "sequence parallelism"),
    (TINY + "mesh { dp = 2 }\nplace ddp over dp\nrecompute full\n", 9, "recomputation"),
    (TINY + "mesh { dp = 16 }\nplace ddp over dp\n", 7, "16 devices"),
    (TINY + "mesh { dp = 2 }\nplace zero3 over dp\noffload optimizer\n", 8, "offloading"),
    (TINY + "mesh { dp = 2, tp = 2 }\nplace megatron over tp\nplace ddp over dp\n", 9,
     "'ddp' with tensor parallelism"),
    (TINY.replace("position = learned", "position = learned, embeddings = tied")
     + "mesh { tp = 2 }\nplace megatron over tp\n", 2, "tied embeddings with tensor parallelism"),
    ('model llama3_8b { seq = 128 }\nprecision fp32_adam\nmesh { dp = 2 }\nplace ddp over dp\n',
     2, "too large"),
])
def test_placements_without_a_torch_implementation_point_at_their_line(
        tmp_path: Path, body: str, line: int, words: str) -> None:
    with pytest.raises(PlaceError) as caught:
        plan(load(write(tmp_path, body)))
    diagnostic = caught.value.diagnostics[0]
    assert words in diagnostic.message
    assert diagnostic.span is not None and diagnostic.span.line == line
    assert caught.value.exit_code is ExitCode.INPUT_ERROR


def capture() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=140, highlight=False, markup=False), buffer


def test_measure_file_reports_input_errors_with_exit_2(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, TINY + "mesh { tp = 2 }\nplace megatron(sequence_parallel) over tp\n")
    console, out = capture()
    code = measure_cli.measure_file(path, as_json=False, timeout=10, console=console)
    assert code is ExitCode.INPUT_ERROR
    err = capsys.readouterr().err
    assert f"{path}:8:1: error: sequence parallelism" in err
    assert out.getvalue() == ""


def test_measure_file_without_torch_exits_5(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(processes, "torch_available", lambda: False)
    console, _ = capture()
    code = measure_cli.measure_file(str(MEASURE / "ddp.place"), as_json=True, timeout=10,
                                    console=console)
    assert code is ExitCode.BACKEND_ERROR
    err = capsys.readouterr().err
    assert "torch is not installed" in err and "Traceback" not in err


def synthetic_results(spec: Any, *, skew: int = 0) -> list[dict[str, Any]]:
    """Worker results that report exactly the predictions (plus ``skew`` bytes of parameters on
    rank 0): a stand-in for a real run, to test the comparison and its rendering."""
    results = []
    for p in predict(spec):
        states = dict(p.states)
        if p.rank == 0:
            states["params"] += skew
        collectives = []
        for c in p.comm:
            share, rest = divmod(c.payload, c.calls)
            for index in range(c.calls):
                collectives.append({"phase": c.phase, "kind": c.op, "op": c.op,
                                    "payload": share + (rest if index == 0 else 0),
                                    "group_size": c.group_size,
                                    "group_ranks": list(range(spec.world)), "peer": None})
        results.append({"rank": p.rank, "states": states, "collectives": collectives,
                        "activations": {**p.activations, "microbatches": 1}})
    return results


def test_the_comparison_marks_every_row_and_renders(tmp_path: Path) -> None:
    strategy = load(str(MEASURE / "zero1.place"))
    measured = plan(strategy)
    comparison = compare(strategy, measured, synthetic_results(measured.spec), 1.0)
    assert comparison.ok
    document = comparison_document(comparison)
    json.dumps(document)
    assert document["schema"] == "placeverify.measure/1"
    assert {row["section"] for row in document["rows"]} == {"model state", "activations",
                                                           "communication"}
    # the optimizer state is uneven over ranks, so it gets one row per rank
    assert [r["rank"] for r in document["rows"] if r["key"] == "optimizer"] == ["0", "1", "2"]
    console, out = capture()
    measure_cli.render(comparison, console)
    text = out.getvalue()
    assert "optimizer broadcast dp" in text and "1.000" in text and "DIFFERS" not in text

    skewed = compare(strategy, measured, synthetic_results(measured.spec, skew=4), 1.0)
    assert not skewed.ok
    row = next(r for r in skewed.rows if r.key == "params" and r.rank == "0")
    assert row.predicted == row.measured - 4 and not row.ok
    console, out = capture()
    measure_cli.render(skewed, console)
    assert "DIFFERS" in out.getvalue()


def test_wire_bytes_of_a_reduce_scatter_under_gloo() -> None:
    strategy = load(str(MEASURE / "zero3.place"))
    measured = plan(strategy)
    comparison = compare(strategy, measured, synthetic_results(measured.spec), 1.0)
    row = next(r for r in comparison.rows if r.key == "backward.reduce_scatter.dp")
    payload = row.measured
    # a ring reduce-scatter over 3 ranks sends 2/3 of the payload per device; gloo runs it as an
    # all-reduce of the full input, which sends 2 · 2/3
    assert row.ring_bytes == round(payload * 2 / 3)
    assert row.wire_op == "all_reduce" and row.wire_bytes == round(payload * 4 / 3)
    gather = next(r for r in comparison.rows if r.key == "forward.all_gather.dp")
    assert gather.wire_op == "all_gather" and gather.wire_bytes == gather.ring_bytes
