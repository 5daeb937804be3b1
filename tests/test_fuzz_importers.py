"""The importers' fuzzer (``benchmarks/fuzz_importers.py``), a short run: mutated configuration
files (the importers' own fixtures, with shell, YAML, TOML and JSON fragments inserted, spans
deleted and copied) must each give a diagnostic or an import, never a traceback. Two inputs that
once were tracebacks are kept as cases."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from placeverify.diagnostics import PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import import_file

ROOT = Path(__file__).resolve().parents[1]


def test_a_short_fuzz_run_finds_no_traceback() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fuzz_importers.py"),
                          "--count", "400", "--seed", "11"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failures" in run.stdout


@pytest.mark.parametrize(("name", "text", "fmt"), [
    # accelerate's fsdp_version not a number: int() raised ValueError
    ("a.yaml", "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_version: ${X}2\n"
               "  fsdp_reshard_after_forward: true\n", "accelerate"),
    # 'MODEL_ARGS' and its colon on two lines: detection and reader disagreed (StopIteration)
    ("m.yaml", "MODEL_ARGS\n:\n  --num-layers: 2\n", None),
])
def test_inputs_that_once_were_tracebacks_are_diagnostics(tmp_path: Path, name: str, text: str,
                                                          fmt: str | None) -> None:
    path = tmp_path / name
    path.write_text(text)
    model = str(ROOT / "tests" / "importers" / "llama3-8b-config.json")
    try:
        imported = import_file(str(path), Options(model, 8, fmt))
    except PlaceError as error:  # the file's fault, said at its text
        assert error.diagnostics
    else:  # or read as something it can be: a launch script's words
        assert imported.text.startswith("# Imported by placeverify")
