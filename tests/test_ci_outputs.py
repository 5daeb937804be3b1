"""CI outputs end to end (issue 14, item 3): SARIF 2.1.0, GitHub workflow commands, the JSON
documents against their shipped schemas, and ``--require-fit``.

Expectations come from outside the code under test: the SARIF 2.1.0 specification (OASIS) for the
log's structure, GitHub's "Workflow commands for GitHub Actions" for the annotation syntax and
escaping, and each example's own text for the line a result points at (found here by searching
the file for the statement). Every SARIF log is validated against the official OASIS schema,
``tests/schemas/sarif-schema-2.1.0.json`` (SARIF 2.1.0 Errata 01, OASIS Standard; the copy and its
source are described in ``tests/schemas/NOTICE.md``), and against the compact schema below, which
states the parts of the spec this output relies on that the official schema leaves optional
(GitHub code scanning needs a location with a region, fingerprints, rule descriptions).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

from placeverify.diagnostics import ExitCode, Span  # noqa: E402
from placeverify.report.findings import Finding  # noqa: E402
from placeverify.report.github import MAX_PER_KIND, escape_data, escape_property, render_github  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
GA = "examples/bugs/ga-token-normalisation.place"
NO_FIT = "examples/strategies/llama3-8b-ddp.place"  # 8B DDP on 80 GB devices: does not fit
FITS = "examples/strategies/llama3-8b-zero3.place"
SCHEMAS = ("check", "check-list", "compare")


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, encoding="utf-8", timeout=300, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done


# ---- the shipped JSON Schemas -------------------------------------------------------------------


def shipped(name: str) -> dict[str, Any]:
    """A schema as the installed package holds it (package data, not the checkout's path)."""
    text = (resources.files("placeverify") / "schemas" / f"{name}.schema.json").read_text("utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def validators() -> dict[str, Any]:
    schemas = {name: shipped(name) for name in SCHEMAS}
    registry = referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in schemas.values())
    return {name: jsonschema.Draft202012Validator(s, registry=registry) for name, s in schemas.items()}


def errors_of(validator: Any, document: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


@pytest.mark.parametrize("name", SCHEMAS)
def test_schemas_are_valid_json_schemas(name: str) -> None:
    schema = shipped(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["title"] == f"placeverify.{name}/1"


@pytest.mark.parametrize("path", sorted((ROOT / "tests" / "snapshots" / "check").glob("*.json")),
                         ids=lambda p: p.stem)
def test_every_example_snapshot_is_a_check_document(path: Path, validators: dict[str, Any]) -> None:
    """The snapshots are ``check --json`` of every example, byte for byte (test_snapshots)."""
    assert errors_of(validators["check"], json.loads(path.read_text("utf-8"))) == []


def test_check_json_of_every_example_is_a_check_list(validators: dict[str, Any]) -> None:
    done = run("check", "--json", "examples")
    document = json.loads(done.stdout)
    assert errors_of(validators["check-list"], document) == []
    examples = sorted(EXAMPLES.rglob("*.place"))
    assert [r["file"] for r in document["results"]] == [str(p.relative_to(ROOT)) for p in examples]
    assert document["exit_code"] == done.returncode == ExitCode.REFUTED  # examples/bugs
    for entry in document["results"]:
        assert errors_of(validators["check"], entry["report"]) == []
        verdicts = set(entry["report"]["verdicts"].values())
        expected = 1 if "refuted" in verdicts else 3 if "unknown" in verdicts else 0
        assert entry["exit_code"] == expected, entry["file"]


def test_the_json_shape_follows_the_command_line(validators: dict[str, Any], tmp_path: Path) -> None:
    one = json.loads(run("check", "--json", "--no-verify", FITS).stdout)
    assert one["schema"] == "placeverify.check/1"
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "s.place").write_text((ROOT / FITS).read_text("utf-8"), encoding="utf-8")
    listed = json.loads(run("check", "--json", "--no-verify", str(folder)).stdout)
    assert listed["schema"] == "placeverify.check-list/1"  # a folder is a list, even of one file
    assert len(listed["results"]) == 1
    assert errors_of(validators["check-list"], listed) == []


def test_errors_are_in_every_json_document(validators: dict[str, Any], tmp_path: Path) -> None:
    bad = "tests/errors/unknown-preset.place"
    line = next(i for i, t in enumerate((ROOT / bad).read_text("utf-8").splitlines(), 1) if "zer3" in t)
    done = run("check", "--json", "--no-verify", FITS, bad, "missing.place")
    assert done.returncode == ExitCode.READ_ERROR
    document = json.loads(done.stdout)
    assert errors_of(validators["check-list"], document) == []
    assert document["exit_code"] == ExitCode.READ_ERROR
    assert [(r["file"], r["exit_code"]) for r in document["results"]] == [
        (FITS, 0), (bad, ExitCode.INPUT_ERROR), ("missing.place", ExitCode.READ_ERROR)]
    [error] = document["results"][1]["report"]["errors"]
    assert (error["code"], error["line"]) == ("unknown-name", line)

    single = run("check", "--json", bad)
    assert single.returncode == ExitCode.INPUT_ERROR
    assert errors_of(validators["check"], json.loads(single.stdout)) == []

    compared = run("compare", "--json", "--verify", "examples/zero-paper/ddp.place", bad)
    assert compared.returncode == ExitCode.INPUT_ERROR
    document = json.loads(compared.stdout)
    assert errors_of(validators["compare"], document) == []
    assert [row["file"] for row in document["strategies"]] == ["examples/zero-paper/ddp.place"]
    assert [(e["file"], e["exit_code"]) for e in document["errors"]] == [(bad, ExitCode.INPUT_ERROR)]


def test_compare_json_of_a_folder_is_a_compare_document(validators: dict[str, Any]) -> None:
    document = json.loads(run("compare", "--json", "examples/strategies").stdout)
    assert errors_of(validators["compare"], document) == []
    assert document["errors"] == []


# ---- SARIF 2.1.0 --------------------------------------------------------------------------------

# What SARIF 2.1.0 (OASIS standard, §3.13-3.38) requires of the objects this output uses:
# sarifLog {version "2.1.0", runs}; run {tool {driver {name}}}; reportingDescriptor {id};
# result {message {text}}, level one of none/note/warning/error; region lines and columns >= 1;
# codeFlow {threadFlows: 1+}, threadFlow {locations: 1+}; partialFingerprints: string values.
REGION = {"type": "object", "required": ["startLine"], "properties": {
    k: {"type": "integer", "minimum": 1} for k in ("startLine", "startColumn", "endLine", "endColumn")}}
LOCATION = {"type": "object", "properties": {"physicalLocation": {
    "type": "object", "required": ["artifactLocation", "region"], "properties": {
        "artifactLocation": {"type": "object", "required": ["uri"],
                             "properties": {"uri": {"type": "string", "minLength": 1}}},
        "region": REGION}}, "message": {"$ref": "#/$defs/message"}}}
SARIF_STRUCTURE = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {"message": {"type": "object", "required": ["text"],
                          "properties": {"text": {"type": "string", "minLength": 1}}}},
    "type": "object", "required": ["$schema", "version", "runs"],
    "properties": {
        "version": {"const": "2.1.0"},
        "runs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["tool", "results"],
            "properties": {
                "tool": {"type": "object", "required": ["driver"], "properties": {"driver": {
                    "type": "object", "required": ["name", "rules"],
                    "properties": {"name": {"type": "string"}, "rules": {"type": "array", "items": {
                        "type": "object", "required": ["id", "shortDescription", "fullDescription"],
                        "properties": {"id": {"type": "string"},
                                       "shortDescription": {"$ref": "#/$defs/message"},
                                       "fullDescription": {"$ref": "#/$defs/message"}}}}}}}},
                "columnKind": {"enum": ["utf16CodeUnits", "unicodeCodePoints"]},
                "results": {"type": "array", "items": {
                    "type": "object", "required": ["ruleId", "level", "message", "locations",
                                                   "partialFingerprints"],
                    "properties": {
                        "ruleId": {"type": "string"},
                        "ruleIndex": {"type": "integer", "minimum": -1},
                        "level": {"enum": ["none", "note", "warning", "error"]},
                        "message": {"$ref": "#/$defs/message"},
                        "locations": {"type": "array", "minItems": 1, "items": LOCATION},
                        "partialFingerprints": {"type": "object",
                                                "additionalProperties": {"type": "string"}},
                        "codeFlows": {"type": "array", "items": {
                            "type": "object", "required": ["threadFlows"],
                            "properties": {"threadFlows": {"type": "array", "minItems": 1, "items": {
                                "type": "object", "required": ["locations"],
                                "properties": {"locations": {"type": "array", "minItems": 1, "items": {
                                    "type": "object", "required": ["location"],
                                    "properties": {"location": LOCATION}}}}}}}}}}}}}}}},
}


def sarif_of(*args: str, cwd: Path = ROOT) -> tuple[dict[str, Any], int]:
    done = run("check", "--output-format", "sarif", *args, cwd=cwd)
    return json.loads(done.stdout), done.returncode


OFFICIAL_SARIF_SCHEMA = Path(__file__).parent / "schemas" / "sarif-schema-2.1.0.json"


def official_validator() -> Any:
    """The OASIS SARIF 2.1.0 schema (JSON Schema draft-04, as the standard publishes it)."""
    schema = json.loads(OFFICIAL_SARIF_SCHEMA.read_text("utf-8"))
    assert schema["id"] == SARIF_SCHEMA_URI  # the schema the log names in "$schema"
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)


@pytest.fixture(scope="module")
def official_sarif() -> Any:
    return official_validator()


SARIF_SCHEMA_URI = ("https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/"
                    "sarif-schema-2.1.0.json")


def check_sarif(log: dict[str, Any], official: Any) -> None:
    assert log["$schema"] == SARIF_SCHEMA_URI
    assert errors_of(official, log) == []
    assert errors_of(jsonschema.Draft202012Validator(SARIF_STRUCTURE), log) == []
    [run_] = log["runs"]
    rules = [r["id"] for r in run_["tool"]["driver"]["rules"]]
    assert len(set(rules)) == len(rules)
    for result in run_["results"]:
        assert rules[result["ruleIndex"]] == result["ruleId"]


def line_of(path: str, statement: str) -> int:
    """The 1-based line of the first line of ``path`` whose code (before '#') has ``statement``."""
    lines = (ROOT / path).read_text("utf-8").splitlines()
    return next(i for i, text in enumerate(lines, 1) if statement in text.split("#")[0])


def test_the_official_schema_rejects_broken_logs(official_sarif: Any) -> None:
    """The validation can fail: logs that break SARIF 2.1.0 in ways a writer could."""
    log, _ = sarif_of(GA)
    assert errors_of(official_sarif, log) == []
    broken: list[dict[str, Any]] = []
    for change in ("version", "level", "startLine", "extra", "runs"):
        bad = json.loads(json.dumps(log))
        result = bad["runs"][0]["results"][0]
        if change == "version":
            bad["version"] = "2.1"  # SARIF §3.13.2: exactly "2.1.0"
        elif change == "level":
            result["level"] = "fatal"  # §3.27.10: none, note, warning, error
        elif change == "startLine":
            result["locations"][0]["physicalLocation"]["region"]["startLine"] = 0  # 1-based
        elif change == "extra":
            bad["runs"][0]["tool"]["driver"]["colour"] = "red"  # no additional properties
        else:
            del bad["runs"]  # required
        broken.append(bad)
    for bad in broken:
        assert errors_of(official_sarif, bad) != []


def test_sarif_of_the_examples_is_valid(official_sarif: Any) -> None:
    log, code = sarif_of("examples", "tests/errors/unknown-preset.place", "missing.place")
    check_sarif(log, official_sarif)
    assert code == ExitCode.READ_ERROR
    assert log["runs"][0]["invocations"][0]["exitCode"] == code
    rules = {r["id"] for r in log["runs"][0]["tool"]["driver"]["rules"]}
    assert rules >= {"gradient_integrity", "state_consistency", "composition_safety", "memory-fits",
                     "input-error"}
    results = log["runs"][0]["results"]
    refuted_files = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
                     for r in results if r["level"] == "error" and r["ruleId"] != "input-error"}
    assert refuted_files == {f"examples/bugs/{p.name}" for p in (EXAMPLES / "bugs").glob("*.place")}
    fingerprints = [r["partialFingerprints"]["placeverify/v1"] for r in results]
    assert len(set(fingerprints)) == len(fingerprints)


def test_a_refutation_points_at_its_statement_with_the_counterexample_as_code_flow(
        official_sarif: Any) -> None:
    log, code = sarif_of(GA)
    check_sarif(log, official_sarif)
    assert code == ExitCode.REFUTED
    [result] = [r for r in log["runs"][0]["results"] if r["level"] == "error"]
    assert result["ruleId"] == "gradient_integrity"
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == GA
    backward = line_of(GA, "backward mean")
    column = (ROOT / GA).read_text("utf-8").splitlines()[backward - 1].index("backward") + 1
    assert location["region"]["startLine"] == backward
    assert location["region"]["startColumn"] == column
    assert location["region"]["endColumn"] == column + len("backward mean")  # exclusive (SARIF §3.30.7)
    assert "fix:" in result["message"]["text"]
    steps = result["codeFlows"][0]["threadFlows"][0]["locations"]
    lines = [s["location"]["physicalLocation"]["region"]["startLine"] for s in steps]
    # microbatches = 2 in the counterexample: backward twice, then the statements after the loop,
    # then what the optimizer consumes (at the refuted statement)
    assert lines == [backward, backward, line_of(GA, "scale grads"), line_of(GA, "all_reduce"),
                     line_of(GA, "update params"), backward]
    assert "3/2" in steps[-1]["location"]["message"]["text"]  # consumed (README's example)
    assert "5/4" in steps[-1]["location"]["message"]["text"]  # the single-device gradient


def test_fingerprints_ignore_lines_and_runs(tmp_path: Path) -> None:
    text = (ROOT / GA).read_text("utf-8")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "bug.place").write_text(text, encoding="utf-8")
    (tmp_path / "b" / "bug.place").write_text("# moved down two lines\n\n" + text, encoding="utf-8")

    def refuted(cwd: Path) -> tuple[str, int]:
        log, _ = sarif_of("bug.place", cwd=cwd)
        [r] = [r for r in log["runs"][0]["results"] if r["level"] == "error"]
        region = r["locations"][0]["physicalLocation"]["region"]
        return r["partialFingerprints"]["placeverify/v1"], region["startLine"]

    first, line = refuted(tmp_path / "a")
    assert refuted(tmp_path / "a") == (first, line)
    assert refuted(tmp_path / "b") == (first, line + 2)


def test_an_input_error_is_a_result_at_its_position(official_sarif: Any) -> None:
    bad = "tests/errors/unknown-preset.place"
    log, code = sarif_of(bad)
    check_sarif(log, official_sarif)
    assert code == ExitCode.INPUT_ERROR
    [result] = log["runs"][0]["results"]
    assert (result["ruleId"], result["level"]) == ("input-error", "error")
    line = line_of(bad, "zer3")
    column = (ROOT / bad).read_text("utf-8").splitlines()[line - 1].index("zer3") + 1
    region = result["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": line, "startColumn": column, "endLine": line,
                      "endColumn": column + len("zer3")}


def test_memory_that_does_not_fit_is_a_result() -> None:
    log, code = sarif_of("--no-verify", NO_FIT)
    assert code == ExitCode.OK
    [result] = log["runs"][0]["results"]
    assert (result["ruleId"], result["level"]) == ("memory-fits", "warning")
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == line_of(NO_FIT, "mesh")
    log, code = sarif_of("--no-verify", "--require-fit", NO_FIT)
    assert code == ExitCode.DOES_NOT_FIT
    assert [r["level"] for r in log["runs"][0]["results"]] == ["error"]


# ---- GitHub workflow commands -------------------------------------------------------------------


COMMAND = re.compile(r"^::(error|warning|notice) ((?:[A-Za-z]+=[^,:]*)(?:,[A-Za-z]+=[^,:]*)*)::(.*)$")


def unescape(value: str) -> str:
    for escaped, plain in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        value = value.replace(escaped, plain)
    return value


def test_escaping_follows_the_runner() -> None:
    assert escape_data("100% done\r\nnext: a, b") == "100%25 done%0D%0Anext: a, b"
    assert escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    assert escape_data("%0A") == "%250A"  # an escape sequence in the text stays literal


def finding(level: str, n: int) -> Finding:
    return Finding("gradient_integrity", level, f"dir,with:odd/f{n}.place",  # type: ignore[arg-type]
                   Span(n + 1, 3, n + 1, 9), "gradient integrity refuted", f"claim {n}\n100% wrong",
                   f"id{n}")


def test_at_most_ten_of_each_kind_then_a_notice_and_a_summary() -> None:
    found = [finding("error", n) for n in range(13)] + [finding("warning", n) for n in range(4)]
    lines = render_github(found, [], ExitCode.REFUTED).splitlines()
    kinds = [m.group(1) for m in map(COMMAND.match, lines) if m]
    assert kinds.count("error") == MAX_PER_KIND == 10
    assert kinds.count("warning") == 4
    assert kinds.count("notice") == 1
    assert "3 errors" in next(line for line in lines if line.startswith("::notice"))
    assert not lines[-1].startswith("::")
    first = COMMAND.match(lines[0])
    assert first is not None
    props = dict(p.split("=", 1) for p in first.group(2).split(","))
    assert unescape(props["file"]) == "dir,with:odd/f0.place"
    assert (props["line"], props["col"], props["endLine"], props["endColumn"]) == ("1", "3", "1", "9")
    assert unescape(props["title"]) == "placeverify: gradient integrity refuted"
    assert unescape(first.group(3)) == "claim 0\n100% wrong"


def test_github_output_of_the_examples() -> None:
    done = run("check", "--output-format", "github", "--require-fit", "examples", "missing.place")
    assert done.returncode == ExitCode.READ_ERROR
    lines = done.stdout.splitlines()
    commands = [COMMAND.match(line) for line in lines[:-1]]
    assert all(commands), [line for line, m in zip(lines, commands, strict=False) if not m]
    kinds = [m.group(1) for m in commands if m]
    assert kinds.count("error") == 10  # 24 refuted bug examples, 3 that do not fit, one missing file
    assert kinds.count("warning") <= 10
    [notice] = [unescape(m.group(3)) for m in commands if m and "not shown" in m.group(3)]
    assert re.search(r"\b\d+ errors\b", notice)
    assert kinds.count("notice") == 10  # 9 'fit not checked' notes (no device_memory), the count
    n = len(list(EXAMPLES.rglob("*.place"))) + 1
    assert lines[-1].startswith(f"placeverify: {n} files: ")
    assert "1 input error" in lines[-1] and "do not fit" in lines[-1] and lines[-1].endswith("exit 4")
    for m in commands:
        assert m is not None
        props = dict(p.split("=", 1) for p in m.group(2).split(","))
        if "line" in props:
            assert (ROOT / unescape(props["file"])).is_file()
            assert int(props["line"]) >= 1


def test_compare_verify_has_the_ci_formats(official_sarif: Any) -> None:
    done = run("compare", "--verify", "--output-format", "github", "examples/zero-paper/ddp.place", GA)
    assert done.returncode == ExitCode.REFUTED
    [error] = [line for line in done.stdout.splitlines() if line.startswith("::error")]
    assert f"file={GA},line={line_of(GA, 'backward mean')}," in error
    done = run("compare", "--verify", "--output-format", "sarif", "examples/zero-paper/ddp.place", GA)
    log = json.loads(done.stdout)
    check_sarif(log, official_sarif)
    assert [r["ruleId"] for r in log["runs"][0]["results"]] == ["gradient_integrity"]


# ---- --require-fit ------------------------------------------------------------------------------


def test_require_fit_fails_a_strategy_that_does_not_fit() -> None:
    assert run("check", "--no-verify", NO_FIT).returncode == ExitCode.OK
    done = run("check", "--no-verify", "--require-fit", NO_FIT)
    assert done.returncode == ExitCode.DOES_NOT_FIT == 6
    assert "DOES NOT FIT" in done.stdout
    assert run("check", "--no-verify", "--require-fit", FITS).returncode == ExitCode.OK
    # a refutation outranks it; it outranks unknown (README's exit-code order)
    assert run("check", "--require-fit", NO_FIT, GA).returncode == ExitCode.REFUTED
    compared = run("compare", "--require-fit", FITS, NO_FIT)
    assert compared.returncode == ExitCode.DOES_NOT_FIT


def test_exit_code_6_is_documented() -> None:
    help_text = run("check", "--help").stdout
    assert re.search(r"^\s*6\s+with --require-fit", help_text, re.M)
    documented = (ROOT / "docs" / "exit-codes.md").read_text("utf-8")
    assert re.search(r"^\| 6 \| .*does not fit", documented, re.M)


def test_json_and_another_output_format_is_a_usage_error() -> None:
    done = run("check", "--json", "--output-format", "sarif", GA)
    assert done.returncode == ExitCode.INPUT_ERROR
    assert done.stdout == ""
