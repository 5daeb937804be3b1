"""The check report's byte figures: four significant digits, the device's memory and the peak
that "fits" compares also in binary units (issue 33, item 5); ``--json`` keeps the exact bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import pytest

from placeverify.report.text import both_units, human_bytes
from tests.conftest import ROOT


@pytest.mark.parametrize(("value", "shown"), [
    (Fraction(234_375_000), "234.4 MB"),          # ZeRO-3 Θ of 7.5B over 64 ranks, 2 B each
    (1_406_250_000, "1.406 GB"),
    (14_765_625_000, "14.77 GB"),
    (44_296_875_000, "44.30 GB"),                 # a column: the trailing zero kept
    (999_960_000, "1.000 GB"),                    # rounds up into the next prefix
    (Fraction(63, 4), "16 B"),                    # below a kilobyte: whole bytes
    (0, "0 B"),
])
def test_human_bytes_has_four_significant_digits(value: int | Fraction, shown: str) -> None:
    assert human_bytes(value) == shown


def test_the_device_line_names_both_units() -> None:
    # 80e9 bytes / 2^30 = 74.505806 GiB; 41,355,815,000 / 2^30 = 38.5155 GiB
    assert both_units(80 * 10**9) == "80 GB (74.51 GiB)"
    assert both_units(41_355_815_000) == "41.36 GB (38.52 GiB)"
    assert both_units(2**40) == "1.1 TB (1 TiB)"  # 1,099,511,627,776 bytes


def test_the_report_rounds_and_the_json_keeps_the_exact_bytes() -> None:
    path = ROOT / "examples" / "zero-paper" / "zero3.place"
    run = [sys.executable, "-m", "placeverify", "check", str(path)]
    text = subprocess.run(run, capture_output=True, text=True, check=False).stdout
    # ZeRO paper, Figure 1: Ψ = 7.5B, N = 64, ZeRO-3 (pos+g+p): (2 + 2 + 12) Ψ / N = 1.875 GB
    assert "  total                  1.875 GB" in text
    assert "Ω optimizer            1.406 GB" in text  # 12 Ψ / 64 = 1,406,250,000 B
    done = subprocess.run([*run, "--json"], capture_output=True, text=True, check=False)
    document = json.dumps(json.loads(done.stdout))
    assert "1406250000" in document
