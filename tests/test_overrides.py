"""``--set KEY=VALUE`` (issue 14, item 2): overrides of ``.place`` files and imported configurations.

Golden errors: each ``tests/errors/overrides/NAME.args`` is a ``check --no-verify`` command line
(one argument per line, run from that folder) whose standard error must be ``NAME.err`` exactly,
with exit 2. The expected files were written by hand from the messages the language gives (see
``tests/errors/*.err``) and the override's position on the command line. Regenerate after a
deliberate change with ``PLACEVERIFY_UPDATE_GOLDENS=1`` and review by eye.

Costs of overridden strategies are derived by hand (bytes per parameter times the parameter count
over the sharding degree), and compared with the same file edited as text by the test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from placeverify.cli import main
from placeverify.diagnostics import Code, Diagnostic, ExitCode, PlaceError, Severity, Source, Span
from placeverify.lower import load, load_text
from placeverify.lower.overrides import Edit, Edited, parse_settings
from tests.conftest import EXAMPLES, ROOT

GOLDEN = ROOT / "tests" / "errors" / "overrides"
CASES = sorted(GOLDEN.glob("*.args"))
UPDATE = os.environ.get("PLACEVERIFY_UPDATE_GOLDENS") == "1"
IMPORTERS = ROOT / "tests" / "importers"
LLAMA3_8B = 8_030_261_248  # README: the derived parameter count


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


# ---- golden errors ------------------------------------------------------------------------------


def test_golden_cases_exist() -> None:
    assert len(CASES) >= 10
    for case in CASES:
        assert case.with_suffix(".err").exists() or UPDATE, case.name


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_golden(case: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(GOLDEN)
    args = case.read_text(encoding="utf-8").splitlines()
    code, out, err = cli("check", "--no-verify", *args)
    expected = case.with_suffix(".err")
    if UPDATE:
        expected.write_text(err, encoding="utf-8")
    assert err == expected.read_text(encoding="utf-8")
    assert code == ExitCode.INPUT_ERROR
    assert out == ""
    assert "Traceback" not in err


def test_json_error_document_points_at_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(GOLDEN)
    code, out, _ = cli("check", "--json", "--no-verify", "base.place", "--set", "mesh.dp=16",
                       "--set", "mesh.world=100")
    assert code == ExitCode.INPUT_ERROR
    [error] = json.loads(out)["errors"]
    assert error == {"severity": "error", "code": "world-mismatch", "file": "--set",
                     "message": "the mesh has 64 devices (tp 4 x dp 16) but world = 100",
                     "line": 2, "column": 12, "end_line": 2, "end_column": 15}


def test_sarif_keeps_the_file_as_location(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finding about an override has no region in the file; its text names the override."""
    monkeypatch.chdir(GOLDEN)
    code, out, _ = cli("check", "--output-format", "sarif", "--no-verify", "base.place",
                       "--set", "model.seq=0")
    assert code == ExitCode.INPUT_ERROR
    [result] = json.loads(out)["runs"][0]["results"]
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "base.place"
    assert location["region"]["startLine"] == 1  # no region of the file: line 1, as GitHub needs
    assert "--set:1:11: model.seq=0" in result["message"]["text"]


# ---- parsing the options ------------------------------------------------------------------------


def test_keys_and_values_with_their_spans() -> None:
    settings = parse_settings(["mesh.dp=16", " model.seq = 8192 ", "place.shard * replica=hsdp"])
    dp, seq, group = settings.items
    assert (dp.key, dp.value, dp.key_span, dp.value_span) == (
        "mesh.dp", "16", Span(1, 1, 1, 8), Span(1, 9, 1, 11))
    assert (seq.key, seq.value, seq.key_span, seq.value_span) == (
        "model.seq", "8192", Span(2, 2, 2, 11), Span(2, 14, 2, 18))
    assert group.parts == ("place", "shard*replica")
    assert settings.source.text == "mesh.dp=16\n model.seq = 8192 \nplace.shard * replica=hsdp"


@pytest.mark.parametrize("text", [
    "mesh.dp=16 } place ddp over x mesh {",  # a value that ends its statement
    "place.dp=zero3 over dp place ddp",  # a placement followed by more
    "model.seq=8192 # comment",  # a comment that would swallow the rest of the line
    "recompute=full microbatches = 3",
    "model=llama3_8b { seq = 1 }",
    "mesh.dp=",
    "=3",
    "mesh.dp.bandwidth.x=1",
    "place.dp)=ddp",
])
def test_malformed_overrides_are_refused_before_any_file_is_read(text: str) -> None:
    with pytest.raises(PlaceError) as raised:
        parse_settings([text])
    assert raised.value.source is not None and raised.value.source.path == "--set"
    assert all(d.span is not None and d.span.line == 1 for d in raised.value.diagnostics)


def test_a_line_break_in_an_override_is_refused() -> None:
    with pytest.raises(PlaceError) as raised:
        parse_settings(["mesh.dp=16", "model.seq=1\nplace ddp over x"])
    [d] = raised.value.diagnostics
    assert d.span == Span.point(2, 12)
    assert len(raised.value.source.lines) == 2  # type: ignore[union-attr]


# ---- what the overridden strategy is ------------------------------------------------------------


GPT3 = str(EXAMPLES / "strategies" / "gpt3-175b-3d.place")


def test_mesh_model_and_placement_overrides() -> None:
    strategy = load(GPT3, parse_settings(["mesh.dp=32", "model.seq=1024", "place.dp=zero3"]))
    assert {a.name: a.size for a in strategy.mesh.axes} == {"tp": 8, "pp": 8, "dp": 32}
    assert strategy.mesh.world == 2048  # the file's 'world = 1024' follows dp
    assert strategy.model.arch is not None and strategy.model.arch.seq == 1024
    assert strategy.placement("dp").preset == "zero3"
    assert [(o.key, o.value, o.implied) for o in strategy.overrides] == [
        ("mesh.dp", "32", False), ("model.seq", "1024", False), ("place.dp", "zero3", False),
        ("mesh.world", "2048", True)]


def test_an_explicit_world_is_checked_not_followed() -> None:
    strategy = load(GPT3, parse_settings(["mesh.dp=32", "mesh.world=2048"]))
    assert strategy.mesh.world == 2048
    assert [o.implied for o in strategy.overrides] == [False, False]


def test_the_same_costs_as_the_file_edited_by_hand() -> None:
    """An override gives the strategy that editing the file gives (the text edited here)."""
    text = Path(GPT3).read_text(encoding="utf-8")
    hand = (text.replace("dp = 16 {", "dp = 32 {").replace("world = 1024", "world = 2048")
            .replace("seq = 2048", "seq = 1024").replace("place zero1 over dp", "place zero3 over dp"))
    assert hand.count("zero3") == 1
    by_hand = load_text(hand, GPT3)
    overridden = load(GPT3, parse_settings(["mesh.dp=32", "model.seq=1024", "place.dp=zero3"]))
    from placeverify.api import costs

    assert costs(overridden).device_bytes() == costs(by_hand).device_bytes()
    assert costs(overridden).network_bytes() == costs(by_hand).network_bytes()
    assert overridden.source.text == hand


@pytest.mark.parametrize(("settings", "expected_line"), [
    (["precision=megatron"], "precision megatron"),
    (["microbatches=4"], "microbatches = 4"),
    (["recompute=selective"], "recompute selective"),
    (["loss=sum"], "loss sum"),
    (["clip.max_norm=0.5"], "clip max_norm = 0.5"),
    (["offload=optimizer"], "offload optimizer"),
])
def test_a_statement_the_file_lacks_goes_on_a_new_last_line(settings: list[str],
                                                            expected_line: str) -> None:
    text = "model llama3_8b\nmesh { dp = 8 }\nplace zero2 over dp\n"
    strategy = load_text(text, "s.place", parse_settings(settings))
    assert strategy.source.text == text + expected_line + "\n"


def test_replacing_a_statement_spread_over_lines_keeps_every_line_number() -> None:
    text = ("model llama3_8b\nmesh { pp = 2, dp = 4 }\nplace pipeline(1f1b,\n"
            "    microbatches = 8) over pp\nplace zero1 over dp\n")
    strategy = load_text(text, "s.place", parse_settings(["place.pp=pipeline(gpipe, microbatches = 4)"]))
    assert strategy.source.text == ("model llama3_8b\nmesh { pp = 2, dp = 4 }\n"
                                    "place pipeline(gpipe, microbatches = 4)\n over pp\n"
                                    "place zero1 over dp\n")
    assert strategy.pipeline is not None and strategy.pipeline.microbatches == 4
    assert strategy.placement("dp").span.line == 5  # the statement after it did not move


def test_a_data_axis_preset_and_the_memory_it_gives() -> None:
    """ZeRO paper, Ψ = 7.5e9, fp16 mixed Adam (2 + 2 + 12 bytes): at N = 8, DDP holds 16Ψ and
    ZeRO-3 16Ψ/8; the file says N = 64 and ZeRO-3."""
    from placeverify.api import costs

    psi = 7_500_000_000
    zero3 = str(EXAMPLES / "zero-paper" / "zero3.place")
    at_eight = costs(load(zero3, parse_settings(["mesh.dp=8"]))).device_bytes()
    as_ddp = costs(load(zero3, parse_settings(["mesh.dp=8", "place.dp=ddp"]))).device_bytes()
    assert at_eight["total"] == 16 * psi // 8
    assert as_ddp["total"] == 16 * psi


def test_an_imported_configuration_with_an_override() -> None:
    """DeepSpeed ZeRO-3 on 8 ranks (tests/importers/llama3-8b-zero3.json), bf16 Adam (Θ 2, G 2,
    Ω 12 bytes), as ZeRO-1: Θ and G whole (2Ψ each), Ω split 8 ways (12Ψ/8)."""
    code, out, err = cli("check", "--json", "--no-verify", str(IMPORTERS / "llama3-8b-zero3.json"),
                         "--world", "8", "--model", str(IMPORTERS / "llama3-8b-config.json"),
                         "--set", "place.dp=zero1", "--set", "model.seq=8192")
    assert code == ExitCode.OK, err
    report = json.loads(out)
    device = report["memory"]["device_bytes"]
    assert device["params"] == 2 * LLAMA3_8B == 16_060_522_496
    assert device["optimizer"] == 12 * LLAMA3_8B // 8 == 12_045_391_872
    assert device["gradients"] == 2 * LLAMA3_8B
    assert report["overrides"] == [{"key": "place.dp", "value": "zero1", "implied": False},
                                   {"key": "model.seq", "value": "8192", "implied": False}]
    assert report["placement"]["dp"]["preset"] == "zero1"
    assert report["step"]["microbatches"] == 8  # gradient_accumulation_steps, untouched


def test_import_prints_the_overridden_text_with_the_override_named() -> None:
    code, out, _ = cli("import", str(IMPORTERS / "llama3-8b-zero3.json"), "--world", "8",
                       "--model", str(IMPORTERS / "llama3-8b-config.json"),
                       "--set", "place.dp=zero1", "--set", "mesh.device_memory=80GB",
                       "--set", "model.seq=8192")
    assert code == ExitCode.OK
    lines = out.splitlines()
    assert "place zero1 over dp".ljust(43) + " # --set place.dp=zero1" in lines
    assert "    device_memory = 80GB }".ljust(43) + " # --set mesh.device_memory=80GB" in lines
    assert not any("zero_optimization.stage 3" in line and "place" in line for line in lines)
    assert load_text(out, "imported.place").mesh.device_memory == 80 * 10**9


def test_text_report_names_the_overrides() -> None:
    code, out, _ = cli("check", "--no-verify", GPT3, "--set", "mesh.dp=32")
    assert code == ExitCode.OK
    assert out.splitlines()[1] == "overrides: mesh.dp=32, mesh.world=2048 (implied)"


def test_no_override_no_key() -> None:
    """Without --set the document keeps its shape (the snapshots are byte for byte)."""
    _, out, _ = cli("check", "--json", "--no-verify", GPT3)
    assert "overrides" not in json.loads(out)


def test_compare_applies_the_overrides_to_every_file() -> None:
    files = [str(EXAMPLES / "zero-paper" / f"{n}.place") for n in ("ddp", "zero3")]
    code, out, _ = cli("compare", "--json", *files, "--set", "mesh.dp=8")
    assert code == ExitCode.OK
    document = json.loads(out)
    psi = 7_500_000_000
    assert document["overrides"] == ["mesh.dp=8"]
    assert [r["memory"]["total"] for r in document["strategies"]] == [16 * psi, 16 * psi // 8]
    assert all(r["overrides"] == [{"key": "mesh.dp", "value": "8", "implied": False}]
               for r in document["strategies"])


def test_the_trace_holds_the_overridden_text(tmp_path: Path) -> None:
    """The replay lowers the trace's source again: it must be the strategy that was checked."""
    from placeverify.trace import load as load_trace

    bug = str(EXAMPLES / "bugs" / "sum-without-average.place")
    trace = tmp_path / "t.json"
    code, _, _ = cli("check", "--trace", str(trace), bug, "--set", "model.params=1e9")
    assert code == ExitCode.REFUTED
    source = load_trace(str(trace)).source
    assert "model { params = 1e9 }" in source
    assert load_text(source).model.params == 10**9


# ---- the way back from the edited text ----------------------------------------------------------


def test_positions_after_a_multi_line_edit_map_back() -> None:
    """Original: line 3 'place pipeline(1f1b,' / line 4 '    microbatches = 8) over pp'; the
    placement (3:7 to 4:22) replaced by 'gpipe' on line 3: ' over pp' now starts line 4."""
    settings = parse_settings(["place.pp=gpipe"])
    edited = Edited(Source("s.place", ""), settings, "")
    edited.edits.append(Edit(settings.items[0], 3, 7, 4, 22, "gpipe", 0))
    assert edited.back(3, 1) == ((3, 1), None)  # before the edit
    pos, hit = edited.back(3, 8)  # the 'p' of 'gpipe'
    assert pos == (3, 7) and hit is not None and hit[1] == 1
    assert edited.back(4, 2) == ((4, 23), None)  # 'over' moved from column 23 to 2
    assert edited.back(5, 4) == ((5, 4), None)  # later lines are untouched


def test_diagnostics_point_at_the_override_or_at_the_file() -> None:
    """'mesh { dp = 8 }': the override replaces '8' (2:13) by '16'; a warning about the mesh
    statement stays in the file (own source, the file's columns), one about the value goes to
    --set:1:9."""
    original = Source("s.place", "model llama3_8b\nmesh { dp = 8 }\n")
    settings = parse_settings(["mesh.dp=16"])
    edited = Edited(original, settings, "model llama3_8b\nmesh { dp = 16 }\n")
    edited.edits.append(Edit(settings.items[0], 2, 13, 2, 14, "16", 0))
    about_mesh = Diagnostic(Severity.WARNING, "w", Code.COST, Span(2, 1, 2, 17))
    mapped = edited.diagnostic(about_mesh, own_source=True)
    assert mapped.source is settings.source  # the span contains the edit: the override's
    about_name = Diagnostic(Severity.ERROR, "e", Code.COST, Span(2, 8, 2, 10))
    mapped = edited.diagnostic(about_name, own_source=True)
    assert (mapped.source, mapped.span) == (original, Span(2, 8, 2, 10))
    assert mapped.notes == ("checked with --set mesh.dp=16",)
    about_value = Diagnostic(Severity.ERROR, "e", Code.COST, Span(2, 13, 2, 15))
    mapped = edited.diagnostic(about_value)
    assert (mapped.source, mapped.span) == (settings.source, Span(1, 9, 1, 11))
    assert mapped.render(original).splitlines() == [
        "--set:1:9: error: e  [cost]", "   1 | mesh.dp=16", "     |         ^^"]


def _report(path: str, *settings: str) -> dict[str, Any]:
    args = [a for s in settings for a in ("--set", s)]
    _, out, _ = cli("check", "--json", "--no-verify", path, *args)
    return json.loads(out)  # type: ignore[no-any-return]


def test_schema_valid_with_overrides() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    referencing = pytest.importorskip("referencing")
    schemas = {n: json.loads((ROOT / "placeverify" / "schemas" / f"{n}.schema.json").read_text())
               for n in ("check", "compare")}
    registry = referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in schemas.values())
    validator = jsonschema.Draft202012Validator(schemas["check"], registry=registry)
    assert list(validator.iter_errors(_report(GPT3, "mesh.dp=32"))) == []
    _, out, _ = cli("compare", "--json", GPT3, "--set", "mesh.dp=32")
    compare = jsonschema.Draft202012Validator(schemas["compare"], registry=registry)
    assert list(compare.iter_errors(json.loads(out))) == []


def test_the_replay_control_of_an_overridden_bug_file_is_the_canonical_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixed twin fixes the bug file as written; under --set the control is the canonical
    step of the overridden placement (the twin stays the control of the file as written)."""
    from placeverify.api import check as check_file
    from placeverify.replay.plan import plan_from_strategy

    monkeypatch.chdir(ROOT)
    bug = "examples/bugs/zero1-no-allgather.place"
    as_written = check_file(bug)
    overridden = check_file(bug, settings=parse_settings(["model.params=1e9"]))
    assert plan_from_strategy(as_written.strategy, known=as_written.verification
                              ).control_origin == "examples/ok/zero1-no-allgather-fixed.place"
    plan = plan_from_strategy(overridden.strategy, known=overridden.verification)
    assert plan.control_origin == "canonical step"
