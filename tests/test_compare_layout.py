"""``placeverify compare`` fits its width (issue 14, item 4): COLUMNS also off a terminal,
``--width``, wrapped / transposed / listed instead of cut, three significant digits, ``--units``.

Expected figures are the ZeRO paper's Figure 1 (Ψ = 7.5e9, N = 64, 16 bytes per parameter under
DDP: 120 GB; ZeRO-1 31.4 GB, ZeRO-2 16.6 GB, ZeRO-3 1.88 GB, at three significant digits) and
their binary conversions done by hand (120e9 / 2^30 = 111.76 GiB).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from rich.console import Console

from placeverify.report.compare import compare_columns, render_compare
from placeverify.report.layout import Column, fit
from placeverify.report.units import significant, size
from tests.conftest import EXAMPLES, ROOT

ZERO = [str(EXAMPLES / "zero-paper" / f"{n}.place") for n in ("ddp", "zero1", "zero2", "zero3")]


def compare(*args: str, columns: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PLACEVERIFY_DEBUG")}
    env["PYTHONPATH"] = str(ROOT)
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-m", "placeverify", "compare", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120, check=False)


# ---- numbers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("x", "text"), [
    (0.5, "0.500"), (0.0123, "0.0123"), (9.996, "10.0"), (99.96, "100"), (123.4, "123"),
    (1234.5, "1,234"), (0.00012, "1.20e-04"), (15.0, "15.0"), (0.0, "0")])
def test_three_significant_digits_and_every_integer_digit(x: float, text: str) -> None:
    assert significant(x) == text


@pytest.mark.parametrize(("value", "units", "text"), [
    (120_000_000_000, "auto", "120 GB"),
    (31_406_250_000, "auto", "31.4 GB"),
    (16_640_625_000, "auto", "16.6 GB"),
    (1_875_000_000, "auto", "1.88 GB"),
    (234_375_000, "auto", "234 MB"),
    (999_600_000, "auto", "1.00 GB"),  # rounds to 1000 MB: the next unit
    (21, "auto", "21 B"),
    (0, "auto", "0 B"),
    (120_000_000_000, "GiB", "112"),  # 111.76
    (1_875_000_000, "GiB", "1.75"),  # 1.746
    (234_375_000, "MiB", "224"),  # 223.5
    (1_875_000_000, "MB", "1,875"),
    (120_000_000_000, "GB", "120"),
])
def test_sizes(value: int, units: str, text: str) -> None:
    assert size(value, units) == text


# ---- layouts --------------------------------------------------------------------------------------


def _columns() -> tuple[Column, list[Column]]:
    label = Column("file", ("alpha", "beta"), "left")
    # Widths: file 5, a 7, b 7, x 6, c 13. One table: 2 + 5+7+7+6+13 + 4·2 = 48; wrapped, the
    # widest table is file + (a, b, x): 2 + 5+7+7+6 + 3·2 = 33; transposed, headers ('memory x',
    # 8) and one item (13): 2 + 8 + 13 + 2 = 25.
    columns = [Column("a", ("1.00 GB", "22.0 GB"), group="g1"),
               Column("b", ("333 MB", "4.44 GB"), group="g1"),
               Column("x", ("1x", "0.125x"), group="g1", name="memory x"),
               Column("c", ("(S*, S, S, R)", "(R, R, R, R)"), "left", "g2")]
    return label, columns


def _plain(lines: list[Any]) -> list[str]:
    return [line.plain for line in lines]


def test_one_table_when_it_fits() -> None:
    label, columns = _columns()
    layout, lines = fit(label, columns, 200)
    assert layout == "table"
    assert len(lines) == 4  # header, rule, two rows
    assert _plain(lines)[2].split("  ")[1:3] == ["alpha", "1.00 GB"]


def test_the_layouts_in_order_as_the_width_shrinks() -> None:
    label, columns = _columns()
    expected = {48: "table", 47: "wrapped", 33: "wrapped", 32: "transposed", 25: "transposed",
                24: "list"}
    for width, layout_name in expected.items():
        assert fit(label, columns, width)[0] == layout_name, width
    for width in range(60, 10, -1):
        layout, lines = fit(label, columns, width)
        if layout != "list":
            assert all(len(line) <= width for line in _plain(lines)), (width, layout)


def test_transposed_names_the_ratio_columns() -> None:
    label, columns = _columns()
    layout, lines = fit(label, columns, 32)
    assert layout == "transposed"
    assert any(line.startswith("  memory x") for line in _plain(lines))


def test_exact_table_text() -> None:
    """Header, rule and rows: two blanks between columns, numbers right-aligned."""
    label = Column("file", ("ddp", "zero3"), "left")
    columns = [Column("total", ("120 GB", "1.88 GB")), Column("x", ("1x", "0.0156x"))]
    layout, lines = fit(label, columns, 80)
    assert layout == "table"
    assert _plain(lines) == [
        "  file     total        x",
        "  " + "─" * 23,
        "  ddp     120 GB       1x",
        "  zero3  1.88 GB  0.0156x",
    ]


def _rendered(rows_document: dict[str, Any], width: int, units: str = "auto") -> str:
    buffer = io.StringIO()
    render_compare(rows_document, Console(file=buffer, width=width, highlight=False,
                                          markup=False, color_system=None), width, units)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def strategies_document() -> dict[str, Any]:
    import json

    files = sorted(str(p) for p in (EXAMPLES / "strategies").glob("*.place"))
    done = compare("--json", *files)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_no_cell_is_ever_cut(strategies_document: dict[str, Any]) -> None:
    """Every cell of the full table is in the output whole, at any width."""
    cells = {c if isinstance(c, str) else c.plain
             for col in compare_columns(strategies_document["strategies"]) for c in col.cells}
    for width in range(20, 200, 9):
        text = _rendered(strategies_document, width)
        assert "…" not in text
        for cell in cells:
            assert cell in text, (width, cell)


def test_a_peak_column_appears_when_rows_give_peak_bytes() -> None:
    """The hook for a peak-memory figure (issue 13): rows with ``peak_bytes`` get a column."""
    row = {"file": "a.place", "strategy": "a", "placement": {"dp": "(R, R, R, R)"},
           "memory": {"params": 1, "optimizer": 1, "gradients": 1, "activations": 1,
                      "buffers": 0, "total": 4}, "memory_ratio": 1.0, "traffic_bytes": 0,
           "traffic_ratio": None, "fits": None, "idle_fraction": None}
    assert "peak" not in [c.header for c in compare_columns([row])]
    columns = compare_columns([{**row, "peak_bytes": 2_500_000_000}])
    [peak] = [c for c in columns if c.header == "peak"]
    assert peak.cells == ("2.50 GB",) and peak.group == "memory"


# ---- the command ----------------------------------------------------------------------------------


def test_columns_is_honoured_when_not_a_terminal() -> None:
    done = compare(*ZERO, columns="70")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 70
    for figure in ("120 GB", "31.4 GB", "16.6 GB", "1.88 GB"):
        assert figure in done.stdout


def test_without_columns_piped_output_is_120_wide() -> None:
    done = compare(*ZERO)
    assert max(len(line) for line in done.stdout.splitlines()) <= 120
    # one table at 120: every strategy's row holds its tuple and its total
    for name, tuple_text, total in (("ddp", "(R, R, R, R)", "120 GB"),
                                    ("zero3", "(S*, S, S, R)", "1.88 GB")):
        assert any(line.split()[:1] == [name] and tuple_text in line and total in line
                   for line in done.stdout.splitlines())


def test_width_option_wins_over_columns() -> None:
    done = compare("--width", "40", *ZERO, columns="200")
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 40
    assert all(figure in done.stdout for figure in ("120 GB", "31.4 GB", "16.6 GB", "1.88 GB"))


def test_binary_units() -> None:
    done = compare("--units", "GiB", *ZERO)
    assert done.returncode == 0, done.stderr
    assert "bytes in GiB" in done.stdout.splitlines()[0]
    ddp = next(line for line in done.stdout.splitlines() if line.strip().startswith("ddp "))
    assert re.search(r"\b112\b", ddp)  # 120e9 / 2^30 = 111.76
    assert "GB" not in ddp


def test_width_below_twenty_is_a_usage_error() -> None:
    done = compare("--width", "5", *ZERO)
    assert done.returncode == 2
