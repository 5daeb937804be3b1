"""A reader that goes away (``placeverify check f | head -1``) does not change the exit code: the
command ends with its own (0 proved, 1 refuted), prints nothing on standard error, and leaves no
traceback. Rich's console would exit 1 whatever the verdict; a bare ``click.echo`` would end the
command with 0 before it was done."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROVED = ROOT / "examples" / "ok" / "hsdp.place"
REFUTED = ROOT / "examples" / "bugs" / "zero1-no-allgather.place"


def closed_reader(*args: str) -> tuple[int, str]:
    """Run placeverify with its standard output a pipe whose reader is closed before it writes:
    every write meets EPIPE. Its exit code and standard error."""
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=ROOT, env=env,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              check=False)
    finally:
        os.close(write)
    return done.returncode, done.stderr


@pytest.mark.parametrize("form", [[], ["--json"], ["--output-format", "sarif"]],
                         ids=["text", "json", "sarif"])
@pytest.mark.parametrize(("path", "code"), [(PROVED, 0), (REFUTED, 1)], ids=["proved", "refuted"])
def test_check_into_a_closed_pipe_exits_with_its_verdict(path: Path, code: int,
                                                         form: list[str]) -> None:
    returncode, stderr = closed_reader("check", str(path), "-q", *form)
    assert returncode == code
    assert stderr == ""


def test_import_into_a_closed_pipe_exits_0() -> None:
    returncode, stderr = closed_reader(
        "import", "tests/importers/llama3-8b-zero3.json", "--model",
        "tests/importers/llama3-8b-config.json", "--world", "8", "--set", "model.seq=8192")
    assert (returncode, stderr) == (0, "")
