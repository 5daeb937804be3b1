"""Every command's text output fits ``--width`` / ``COLUMNS`` (issue 14, item 4), also off a
terminal, and loses nothing: a table that does not fit is listed, never cut with an ellipsis.

The wide report (no width constraint) is the reference: the narrow one must hold the same
numbers, each whole, and no line wider than asked. Widths are counted in terminal cells.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from rich.cells import cell_len

from placeverify.diagnostics import ExitCode
from tests.conftest import ROOT

GPT3 = "examples/strategies/gpt3-175b-3d.place"  # pipeline stages, long communication rows
GA = "examples/bugs/ga-token-normalisation.place"  # a counterexample trace table
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")  # a unit may wrap to the next line; a number may not


def check(*args: str, columns: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PLACEVERIFY_DEBUG")}
    env["PYTHONPATH"] = str(ROOT)
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-m", "placeverify", "check", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def widest(text: str) -> int:
    return max(cell_len(line) for line in text.splitlines())


def numbers(text: str) -> list[str]:
    """The figures of a report, less the verification's run time (which varies)."""
    text = re.sub(r"obligations \(.*\) in [\d.]+ s", "", text)
    return sorted(NUMBER.findall(text))


@pytest.fixture(scope="module")
def wide() -> dict[str, str]:
    return {path: check("--width", "400", path).stdout for path in (GPT3, GA)}


@pytest.mark.parametrize("path", [GPT3, GA])
@pytest.mark.parametrize("columns", ["60", "80", "100"])
def test_check_follows_columns_off_a_terminal(path: str, columns: str,
                                              wide: dict[str, str]) -> None:
    done = check(path, columns=columns)
    assert done.returncode in (ExitCode.OK, ExitCode.REFUTED), done.stderr
    assert widest(done.stdout) <= int(columns)
    assert "…" not in done.stdout
    assert numbers(done.stdout) == numbers(wide[path])  # the same figures, none cut


def test_width_option_wins_over_columns(wide: dict[str, str]) -> None:
    done = check("--width", "70", GPT3, columns="300")
    assert widest(done.stdout) <= 70 < widest(wide[GPT3])
    assert numbers(done.stdout) == numbers(wide[GPT3])


def test_piped_default_is_120_columns() -> None:
    done = check(GPT3)
    assert 100 < widest(done.stdout) <= 120
    assert "…" not in done.stdout


def test_a_table_too_wide_is_listed() -> None:
    # (29.346262 GB, printed at four significant digits: the learned position table is whole on
    # every tensor rank, as in Megatron-LM) the per-stage memory table has nine columns of
    # 'dd.dd GB' figures: it cannot fit 60
    done = check(GPT3, columns="60")
    lines = done.stdout.splitlines()
    start = lines.index("memory per pipeline stage (the fullest decides)")
    assert lines[start + 1] == "  - stage: first (fullest)"  # p - i in flight: stage 0 the most
    assert "    total: 29.35 GB" in lines[start + 1:start + 12]
