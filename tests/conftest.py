"""Shared fixtures: paths to the repository's examples."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def example_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (EXAMPLES / folder).glob("*.place"))


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Text output follows COLUMNS (README "CLI reference"): tests that compare text set it
    themselves, so the width of the shell that runs them changes nothing."""
    monkeypatch.delenv("COLUMNS", raising=False)
