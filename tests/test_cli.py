"""The ``placeverify`` command end to end, through real processes: exit codes, --help, --json,
--trace, several files at once. No run may print a Python traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from placeverify.api import check
from placeverify.diagnostics import ExitCode, PlaceError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "errors"
SCRIPT = Path(sys.executable).parent / "placeverify"
ENTRY_POINTS = {"script": [str(SCRIPT)], "module": [sys.executable, "-m", "placeverify"]}


def run(*args: str, entry: str = "script", cwd: Path = ROOT,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run placeverify in a fresh process; fail on any traceback."""
    if entry == "script" and not SCRIPT.exists():
        pytest.skip(f"no console script beside {sys.executable} (placeverify is not installed)")
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    done = subprocess.run([*ENTRY_POINTS[entry], *args], cwd=cwd, env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=timeout, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert "Traceback" not in done.stdout, done.stdout
    assert "internal error" not in done.stderr, done.stderr
    return done


def files_in(folder: str) -> list[Path]:
    return sorted((EXAMPLES / folder).glob("*.place"))


# ---- exit codes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_exit_0_when_proved(entry: str) -> None:
    done = run("check", "examples/zero-paper/zero3.place", entry=entry)
    assert done.returncode == ExitCode.OK, done.stderr
    assert "proved" in done.stdout
    assert done.stderr == ""


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_exit_1_when_refuted(entry: str) -> None:
    done = run("check", "examples/bugs/missing-allreduce.place", entry=entry)
    assert done.returncode == ExitCode.REFUTED, done.stderr
    assert "refuted" in done.stdout


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_exit_2_on_bad_input(entry: str) -> None:
    """The subprocess prints exactly the golden text the in-process tests check."""
    done = run("check", "unknown-axis.place", entry=entry, cwd=GOLDEN)
    assert done.returncode == ExitCode.INPUT_ERROR
    assert done.stderr == (GOLDEN / "unknown-axis.err").read_text(encoding="utf-8")
    assert done.stdout == ""


@pytest.mark.parametrize("case", ["syntax-unclosed-block", "syntax-wide-characters", "binary-junk",
                                  "number-out-of-range", "too-deep", "not-divisible-heads"])
def test_golden_errors_are_the_same_in_a_real_process(case: str) -> None:
    done = run("check", f"{case}.place", cwd=GOLDEN)
    assert done.returncode == ExitCode.INPUT_ERROR
    assert done.stderr == (GOLDEN / f"{case}.err").read_text(encoding="utf-8")


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_exit_4_on_a_missing_file(entry: str, tmp_path: Path) -> None:
    done = run("check", "nowhere.place", entry=entry, cwd=tmp_path)
    assert done.returncode == ExitCode.READ_ERROR
    assert done.stderr == "nowhere.place: error: cannot read file: no such file  [read]\n"


def test_exit_4_on_a_folder_without_place_files(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = run("check", "empty", cwd=tmp_path)
    assert done.returncode == ExitCode.READ_ERROR
    assert "no .place files under empty" in done.stderr


@pytest.mark.parametrize("args", [["check"], ["check", "--no-such-option", "x.place"],
                                  ["check", "--timeout", "0", "x.place"], ["no-such-command"]])
def test_usage_errors_exit_2(args: list[str]) -> None:
    done = run(*args)
    assert done.returncode == ExitCode.INPUT_ERROR
    assert done.stderr.startswith("placeverify: error: "), done.stderr
    assert "Usage:" not in done.stderr  # click's block is placeverify's one voice (test_cli_voice.py)


def test_trace_with_several_files_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run([str(SCRIPT), "check", "--trace", str(tmp_path / "t.json"),
                           "examples/bugs/missing-allreduce.place", "examples/ok/hsdp.place"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == ExitCode.INPUT_ERROR
    assert "internal error" not in done.stderr


def test_every_ok_example_exits_0() -> None:
    """One process for the folder; the JSON documents give each file's verdicts."""
    done = run("check", "--json", "examples/ok")
    assert done.returncode == ExitCode.OK, done.stderr
    documents = [r["report"] for r in json.loads(done.stdout)["results"]]
    assert [Path(d["file"]).name for d in documents] == [p.name for p in files_in("ok")]
    for document in documents:
        assert set(document["verdicts"].values()) == {"proved"}, document["file"]


@pytest.mark.slow
@pytest.mark.parametrize("path", files_in("bugs"), ids=lambda p: p.stem)
def test_every_bug_example_exits_1(path: Path) -> None:
    """One process per file, as a user runs it (verdicts are checked in depth elsewhere)."""
    done = run("check", "--json", str(path.relative_to(ROOT)))
    assert done.returncode == ExitCode.REFUTED, done.stderr
    assert "refuted" in json.loads(done.stdout)["verdicts"].values()


@pytest.mark.parametrize("name", ["ok/hsdp.place", "bugs/zero1-no-allgather.place",
                                  "strategies/llama3-405b-4d.place"])
def test_single_files_exit_with_their_verdict(name: str) -> None:
    done = run("check", f"examples/{name}")
    assert done.returncode == (ExitCode.REFUTED if name.startswith("bugs/") else ExitCode.OK)


def test_several_files_at_once_report_each_and_exit_with_the_worst() -> None:
    done = run("check", "--no-verify", "examples/zero-paper/ddp.place", "examples/zero-paper/zero3.place")
    assert done.returncode == ExitCode.OK
    assert "examples/zero-paper/ddp.place" in done.stdout
    assert "examples/zero-paper/zero3.place" in done.stdout
    mixed = run("check", "examples/ok/hsdp.place", "examples/bugs/missing-allreduce.place",
                "tests/errors/unknown-preset.place")
    assert mixed.returncode == ExitCode.INPUT_ERROR  # input error outranks a refutation
    assert "examples/ok/hsdp.place" in mixed.stdout
    assert "refuted" in mixed.stdout
    assert "tests/errors/unknown-preset.place:4:7: error: unknown placement preset 'zer3'" in mixed.stderr


# ---- help ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--help"], ["check", "--help"], ["-h"]])
def test_help_lists_the_exit_codes(args: list[str]) -> None:
    done = run(*args)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert "  Exit codes:" in lines
    for code in ExitCode:
        assert any(line.strip().startswith(f"{int(code)} ") for line in lines), f"exit code {int(code)}"


def test_version() -> None:
    done = run("--version", entry="module")
    assert done.returncode == 0
    assert done.stdout.startswith("placeverify, version ")


# ---- --json -------------------------------------------------------------------------------------


def check_document_shape(document: dict[str, Any]) -> None:
    """The shape issue 2 names, with byte counts as integers."""
    assert isinstance(document["file"], str)
    assert isinstance(document["strategy"], str)
    assert document["mesh"]
    assert all(isinstance(k, str) and type(v) is int for k, v in document["mesh"].items())
    device = document["memory"]["device_bytes"]
    assert set(device) >= {"params", "optimizer", "gradients", "activations", "outside_layers",
                           "buffers", "total"}
    assert all(type(device[k]) is int and device[k] >= 0 for k in device)
    assert device["total"] == sum(device[k] for k in ("params", "optimizer", "gradients", "activations",
                                                      "outside_layers", "buffers"))
    assert type(document["memory"]["host_bytes"]) is int
    communication = document["communication"]
    assert type(communication["bytes_per_step"]) is int
    for collective in communication["collectives"]:
        assert isinstance(collective["op"], str)
        assert isinstance(collective["axes"], list) and all(isinstance(a, str) for a in collective["axes"])
        assert set(collective["axes"]) <= set(document["mesh"])
        assert type(collective["bytes"]) is int and type(collective["count"]) is int
    assert isinstance(document["verdicts"], dict)
    assert all(v in {"proved", "refuted", "unknown"} for v in document["verdicts"].values())


def test_json_shape_of_one_file() -> None:
    done = run("check", "--json", "examples/zero-paper/zero3.place")
    assert done.returncode == ExitCode.OK
    document = json.loads(done.stdout)
    check_document_shape(document)
    assert document["file"] == "examples/zero-paper/zero3.place"
    assert document["mesh"] == {"dp": 64}
    assert document["memory"]["device_bytes"]["total"] == 1_875_000_000  # ZeRO paper, Figure 1
    assert set(document["verdicts"]) == {"gradient_integrity", "state_consistency", "composition_safety"}


def test_json_of_every_example_has_the_shape() -> None:
    done = run("check", "--json", "--no-verify", "examples")
    assert done.returncode == ExitCode.OK
    documents = [r["report"] for r in json.loads(done.stdout)["results"]]
    assert len(documents) == len(list(EXAMPLES.rglob("*.place")))
    for document in documents:
        check_document_shape(document)
        assert document["verdicts"] == {}  # not verified


def test_json_lists_errors_beside_reports() -> None:
    done = run("check", "--json", "--no-verify", "examples/zero-paper/ddp.place",
               "tests/errors/unknown-preset.place", "missing.place")
    assert done.returncode == ExitCode.READ_ERROR
    listing = json.loads(done.stdout)
    assert (listing["schema"], listing["exit_code"]) == ("placeverify.check-list/1", ExitCode.READ_ERROR)
    good, bad, missing = (r["report"] for r in listing["results"])
    assert [r["exit_code"] for r in listing["results"]] == [0, ExitCode.INPUT_ERROR, ExitCode.READ_ERROR]
    check_document_shape(good)
    assert bad["file"] == "tests/errors/unknown-preset.place"
    assert [(e["code"], e["line"], e["column"]) for e in bad["errors"]] == [("unknown-name", 4, 7)]
    assert missing == {"schema": "placeverify.check/1", "placeverify": good["placeverify"],
                       "file": "missing.place", "errors": [{
                           "severity": "error", "code": "read",
                           "message": "cannot read file: no such file", "file": "missing.place"}]}


# ---- --trace ------------------------------------------------------------------------------------


def test_trace_is_valid_json(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    done = run("check", "--trace", str(out), "examples/bugs/missing-allreduce.place")
    assert done.returncode == ExitCode.REFUTED
    trace = json.loads(out.read_text(encoding="utf-8"))
    assert trace["schema"] == "placeverify.trace/1"
    assert trace["file"] == "examples/bugs/missing-allreduce.place"
    assert trace["source"] == (EXAMPLES / "bugs/missing-allreduce.place").read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]  # no temporary file left


def test_trace_of_a_proved_file_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    done = run("check", "--trace", str(out), "examples/ok/hsdp.place")
    assert done.returncode == ExitCode.OK
    assert "no counterexample to write" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_trace_into_a_missing_folder_is_a_write_error(tmp_path: Path) -> None:
    out = tmp_path / "no" / "such" / "trace.json"
    done = run("check", "--trace", str(out), "examples/bugs/missing-allreduce.place")
    assert done.returncode == ExitCode.READ_ERROR
    assert "cannot write trace" in done.stderr
    assert not (tmp_path / "no").exists()


def test_trace_onto_a_folder_is_refused(tmp_path: Path) -> None:
    done = run("check", "--trace", str(tmp_path), "examples/bugs/missing-allreduce.place")
    assert done.returncode == ExitCode.READ_ERROR
    assert "is a directory" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_failed_trace_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing is atomic: a failure half way leaves the previous trace and no temporary file."""
    from placeverify import trace

    out = tmp_path / "trace.json"
    out.write_text('{"old": true}\n', encoding="utf-8")
    refuted = check(str(EXAMPLES / "bugs/missing-allreduce.place")).verification
    assert refuted is not None and refuted.trace is not None

    def explode(fd: int) -> None:  # the disk fills as the text is synced
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", explode)
    with pytest.raises(PlaceError) as failed:
        trace.write(refuted.trace, str(out))
    assert failed.value.exit_code == ExitCode.READ_ERROR
    assert str(failed.value) == (f"{out}: error: cannot write trace: no space left on device  [read]")
    assert json.loads(out.read_text(encoding="utf-8")) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]
