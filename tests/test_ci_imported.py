"""CI outputs of imported configurations (issue 33, item 4): SARIF results and GitHub annotations
name the user's own file and the line and column of the key that decided the finding, never the
generated ``.place`` text; the importer's warnings are findings too.

Each configuration is written here; the line and column a finding must point at are found by
searching that text for the key (not by asking the importers), and each warning is one the
format's reader gives for that key (cited beside it). The SARIF logs are validated against the
official SARIF 2.1.0 schema as in :mod:`tests.test_ci_outputs`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.test_ci_outputs import ROOT, check_sarif, official_validator, run

IMPORTERS = ROOT / "tests" / "importers"
LLAMA_8B = str(IMPORTERS / "llama3-8b-config.json")
MIXTRAL = str(IMPORTERS / "mixtral-8x7b-config.json")


@pytest.fixture(scope="module")
def official_sarif() -> Any:
    return official_validator()


@dataclass(frozen=True)
class Case:
    name: str  # the file's name, written in the test's folder
    text: str
    args: tuple[str, ...]
    key: str  # the key the finding is about, as the file writes it
    message: str  # what the finding says


# torchtitan/config/job_config.py has no [parallelism] weird_key: not modelled, at the key.
TOML = Case("tt.toml", '[job]\ndump_folder = "x"\n[parallelism]\ntensor_parallel_degree = 1\n'
            "weird_key = 3\n[training]\nsteps = 10\n",
            ("--model", LLAMA_8B, "--world", "8"), "weird_key", "not modelled: [parallelism] weird_key")
# accelerate's config_args.py has no top-level 'surprise'.
YAML = Case("acc.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\n"
            "num_processes: 8\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: 2\n"
            "surprise: 1\n", ("--model", LLAMA_8B, "--set", "model.seq=4096"), "surprise",
            "not modelled: surprise")
# deepspeed/runtime/constants.py has no top-level "foo".
JSON = Case("ds.json", '{\n  "train_micro_batch_size_per_gpu": 1,\n  "foo": 1,\n'
            '  "zero_optimization": {"stage": 2}\n}\n',
            ("--model", LLAMA_8B, "--world", "8", "--set", "model.seq=4096"), '"foo"',
            "not modelled: DeepSpeed key 'foo'")
# Megatron-LM arguments.py: --sequence-parallel needs tensor parallelism; with TP 1 Megatron
# turns it off (tests/importers/mixtral-8x7b-megatron.sh writes it with TP 1).
SHELL = Case("moe.sh", (IMPORTERS / "mixtral-8x7b-megatron.sh").read_text("utf-8"),
             ("--model", MIXTRAL), "--sequence-parallel", "--sequence-parallel")
CASES = (TOML, YAML, JSON, SHELL)


def position(case: Case) -> tuple[int, int]:
    """The 1-based line and column of the first place the file's text writes the key."""
    for number, line in enumerate(case.text.splitlines(), 1):
        if case.key in line:
            return number, line.index(case.key) + 1
    raise AssertionError(f"{case.key} is not in {case.name}")


def written(case: Case, folder: Path) -> None:
    (folder / case.name).write_text(case.text, encoding="utf-8")


def sarif_results(case: Case, folder: Path, *extra: str) -> tuple[dict[str, Any], list[Any]]:
    written(case, folder)
    done = run("check", "--no-verify", "--output-format", "sarif", case.name, *case.args, *extra,
               cwd=folder)
    log = json.loads(done.stdout)
    return log, log["runs"][0]["results"]


def test_importer_warnings_are_sarif_results_at_their_keys(tmp_path: Path,
                                                           official_sarif: Any) -> None:
    for case in CASES:
        folder = tmp_path / case.name.replace(".", "-")
        folder.mkdir()
        log, results = sarif_results(case, folder)
        check_sarif(log, official_sarif)
        [result] = [r for r in results if case.message in r["message"]["text"]]
        assert result["ruleId"] == "input-warning" and result["level"] == "warning"
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uri"] == case.name, case.name
        line, column = position(case)
        assert (location["region"]["startLine"], location["region"]["startColumn"]) == \
            (line, column), case.name
        uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results}
        assert not [u for u in uris if "imported" in u], case.name


def test_importer_warnings_are_github_annotations_at_their_keys(tmp_path: Path) -> None:
    for case in CASES:
        folder = tmp_path / case.name.replace(".", "-")
        folder.mkdir()
        written(case, folder)
        done = run("check", "--no-verify", "--output-format", "github", case.name, *case.args,
                   cwd=folder)
        line, column = position(case)
        [annotation] = [a for a in done.stdout.splitlines() if case.message in a]
        assert annotation.startswith(f"::warning file={case.name},line={line},col={column},"), \
            annotation
        assert "(imported)" not in done.stdout, case.name


def test_a_finding_on_a_line_no_key_gave_points_at_the_file(tmp_path: Path,
                                                             official_sarif: Any) -> None:
    """``fit not checked`` is about the generated ``mesh {`` line, which no single key gives: it
    points at the configuration itself (SARIF region line 1, a file-level annotation), and its
    message quotes the generated line."""
    case = TOML
    log, results = sarif_results(case, tmp_path, "--require-fit")
    check_sarif(log, official_sarif)
    [fit] = [r for r in results if r["ruleId"] == "memory-fits"]
    location = fit["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == case.name
    assert location["region"] == {"startLine": 1}
    assert "in the imported strategy, line" in fit["message"]["text"]
    done = run("check", "--no-verify", "--require-fit", "--output-format", "github", case.name,
               *case.args, cwd=tmp_path)
    [note] = [a for a in done.stdout.splitlines() if a.startswith("::notice file=")]
    assert note.startswith(f"::notice file={case.name},title="), note


@dataclass(frozen=True)
class Statement:
    fixture: str  # in tests/importers
    args: tuple[str, ...]  # world, model, overrides
    kind: str  # the obligation, of the statement the key produced
    key: str  # the key, as the fixture writes it


# Each obligation is about one generated statement, which one key produced: the clip statement
# DeepSpeed's gradient_clipping, torchtitan's [training] max_norm and Megatron's --clip-grad give,
# the recompute statement accelerate's fsdp_activation_checkpointing gives.
STATEMENTS = (
    Statement("llama3-70b-fsdp.toml", ("--world", "64"), "clip", "max_norm"),
    Statement("llama3-8b-zero3.json", ("--world", "8", "--model", LLAMA_8B, "--set",
                                       "model.seq=4096"), "clip", '"gradient_clipping"'),
    Statement("llama3-8b-fsdp2-accelerate.yaml", ("--model", LLAMA_8B, "--set", "model.seq=4096"),
              "recompute", "fsdp_activation_checkpointing"),
    Statement("gpt3-175b-megatron.sh", (), "clip", "--clip-grad"),
)


def refuted_outcomes(statement: Statement) -> tuple[list[Any], str]:
    """The check of a fixture, its obligation of ``kind`` refuted (the verification proves it:
    which statement a refutation is at is what is tested, not the verifier), and its path."""
    from placeverify.api import check, overrides
    from placeverify.diagnostics import ExitCode
    from placeverify.importers import Options
    from placeverify.report.outcome import Outcome
    from placeverify.verdicts import Verdict

    args = dict(zip(statement.args[::2], statement.args[1::2], strict=True))
    options = Options(args.get("--model"), int(args["--world"]) if "--world" in args else None)
    settings = overrides([args["--set"]]) if "--set" in args else None
    path = str((IMPORTERS / statement.fixture).relative_to(ROOT))
    result = check(path, imports=options, settings=settings)
    assert result.verification is not None and result.imported is not None
    obligations = tuple(
        replace(o, verdict=Verdict.REFUTED, reason="refuted here") if o.kind.value == statement.kind
        else o for o in result.verification.obligations)
    assert any(o.verdict is Verdict.REFUTED for o in obligations), statement
    changed = replace(result, verification=replace(result.verification, obligations=obligations))
    return [Outcome(path, ExitCode.REFUTED, result=changed)], path


def test_an_obligation_points_at_the_key_its_statement_came_from(official_sarif: Any) -> None:
    from placeverify.diagnostics import ExitCode
    from placeverify.report.findings import findings
    from placeverify.report.github import render_github
    from placeverify.report.sarif import sarif_log

    for statement in STATEMENTS:
        outcomes, path = refuted_outcomes(statement)
        text = (ROOT / path).read_text("utf-8")
        case = Case(path, text, (), statement.key, "")
        line, column = position(case)
        found = findings(outcomes)
        log = sarif_log(found, ExitCode.REFUTED)
        check_sarif(log, official_sarif)
        refuted = [r for r in log["runs"][0]["results"] if r["level"] == "error"]
        assert refuted, statement
        for result in refuted:
            location = result["locations"][0]["physicalLocation"]
            assert location["artifactLocation"]["uri"] == path, statement
            assert (location["region"]["startLine"], location["region"]["startColumn"]) == \
                (line, column), statement
        errors = [a for a in render_github(found, outcomes, ExitCode.REFUTED).splitlines()
                  if a.startswith("::error ")]
        assert errors and all(a.startswith(f"::error file={path},line={line},col={column},")
                              for a in errors), (statement, errors)


def test_a_trace_row_line_is_its_keys_line_or_the_files_first() -> None:
    """Code-flow rows (:func:`placeverify.report.sarif.code_flow`) take their lines from the
    locator: the generated ``clip`` line is torchtitan's ``[training] max_norm`` key; the
    generated ``mesh {`` line has no key: line 1 of the configuration."""
    from placeverify.importers import Options
    from placeverify.importers.registry import import_file
    from placeverify.report.locate import Locator

    path = str((IMPORTERS / "llama3-70b-fsdp.toml").relative_to(ROOT))
    imported = import_file(path, Options(world=64))
    generated = imported.text.splitlines()
    clip = next(i for i, line in enumerate(generated, 1) if line.startswith("clip "))
    mesh = next(i for i, line in enumerate(generated, 1) if line.startswith("mesh {"))
    where = Locator(f"{path} (imported)", imported)
    key_line, _ = position(Case(path, (ROOT / path).read_text("utf-8"), (), "max_norm", ""))
    assert where.line(clip) == (path, key_line)
    assert where.line(mesh) == (path, 1)
