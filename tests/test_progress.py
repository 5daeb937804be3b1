"""Progress of long work on standard error, also off a terminal (issue 14, item 6): plain
``progress: ...`` lines in CI logs, none with ``--quiet``, none for a single file.

Every command here runs as a subprocess with its standard error a pipe, as in CI.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from placeverify.console import Progress
from tests.conftest import EXAMPLES, ROOT

ZERO = [f"examples/zero-paper/{n}.place" for n in ("ddp", "zero3")]
RULES = ["proofs/01-dp-equal-means.rule", "proofs/02-zero1-equals-dp.rule"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def progress_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("progress: ")]


def test_check_of_several_files_says_which_file_it_is_on() -> None:
    done = run("check", "--no-verify", "--json", *ZERO)
    assert done.returncode == 0, done.stderr
    assert progress_lines(done.stderr) == [f"progress: check 1/2 {ZERO[0]}",
                                           f"progress: check 2/2 {ZERO[1]}"]


def test_quiet_and_single_files_print_no_progress() -> None:
    assert progress_lines(run("check", "--no-verify", "--quiet", *ZERO).stderr) == []
    assert progress_lines(run("check", "--no-verify", "-q", *ZERO).stderr) == []
    assert progress_lines(run("check", "--no-verify", ZERO[0]).stderr) == []


def test_errors_are_not_silenced_by_quiet(tmp_path: object) -> None:
    done = run("check", "--no-verify", "--quiet", ZERO[0], "missing.place")
    assert "missing.place: error: cannot read file: no such file  [read]" in done.stderr


def test_compare_and_configuration_files() -> None:
    config = str(ROOT / "tests" / "importers" / "llama3-70b-fsdp.toml")
    done = run("compare", "--world", "64", ZERO[0], config)
    assert done.returncode == 0, done.stderr
    assert progress_lines(done.stderr) == [f"progress: compare 1/2 {ZERO[0]}",
                                           f"progress: compare 2/2 {config}"]


def test_prove_of_several_rule_files() -> None:
    done = run("prove", *RULES)
    assert done.returncode == 0, done.stderr
    assert progress_lines(done.stderr) == [f"progress: prove 1/2 {RULES[0]}",
                                           f"progress: prove 2/2 {RULES[1]}"]
    assert progress_lines(run("prove", "--quiet", *RULES).stderr) == []


def test_a_task_off_a_terminal_is_a_line_per_message(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", err)
    progress = Progress()
    with progress.task("replaying on 2 processes") as say:
        say("replaying the trace on 2 processes: step 1/3")
    progress.item("check", 1, 1, "only.place")  # a single item: nothing
    assert err.getvalue() == ("progress: replaying on 2 processes\n"
                              "progress: replaying the trace on 2 processes: step 1/3\n")
    err.truncate(0)
    err.seek(0)
    with Progress(quiet=True).task("replaying") as say:
        say("step 1/3")
    assert err.getvalue() == ""


def test_replay_reports_its_progress(tmp_path: object) -> None:
    pytest.importorskip("torch")
    from pathlib import Path

    trace = Path(str(tmp_path)) / "t.json"
    bug = EXAMPLES / "bugs" / "sum-without-average.place"
    assert run("check", "--trace", str(trace), str(bug)).returncode == 1
    done = run("replay", "--json", str(trace))
    lines = progress_lines(done.stderr)
    assert lines and lines[0].startswith("progress: replaying on ")
    assert any("step" in line for line in lines[1:]), done.stderr
    assert progress_lines(run("replay", "--json", "--quiet", str(trace)).stderr) == []
