"""Hostile output paths, traces and options: input errors (exit 2) with a clear message, never a
replaced special file, an internal error or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from placeverify.api import check
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.trace import MAX_TRACE_DEPTH, load, write

ROOT = Path(__file__).resolve().parents[1]
BUG = ROOT / "examples" / "bugs" / "missing-allreduce.place"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    return subprocess.run([sys.executable, "-m", "placeverify", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)


@pytest.fixture(scope="module")
def trace() -> object:
    verification = check(str(BUG)).verification
    assert verification is not None and verification.trace is not None
    return verification.trace


def test_a_fifo_is_never_replaced_by_a_trace(tmp_path: Path, trace: object) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(PlaceError) as err:
        write(trace, str(fifo))  # type: ignore[arg-type]
    assert err.value.exit_code == ExitCode.INPUT_ERROR
    assert "is a FIFO" in err.value.diagnostics[0].message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_device_is_never_replaced_by_a_trace(trace: object) -> None:
    with pytest.raises(PlaceError) as err:
        write(trace, "/dev/null")  # type: ignore[arg-type]
    assert "is a device" in err.value.diagnostics[0].message
    assert Path("/dev/null").is_char_device()


def test_a_directory_is_refused(tmp_path: Path, trace: object) -> None:
    with pytest.raises(PlaceError) as err:
        write(trace, str(tmp_path))  # type: ignore[arg-type]
    assert "is a directory" in err.value.diagnostics[0].message


def test_a_symlink_to_a_regular_file_writes_its_target(tmp_path: Path, trace: object) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write(trace, str(link))  # type: ignore[arg-type]
    assert link.is_symlink()
    assert json.loads(target.read_text())["schema"] == "placeverify.trace/1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_check_trace_onto_a_fifo_exits_2(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = cli("check", "--trace", str(fifo), str(BUG))
    assert done.returncode == ExitCode.INPUT_ERROR, done.stderr
    assert "is a FIFO" in done.stderr


def _trace_doc(trace: object) -> dict[str, object]:
    return trace.to_json()  # type: ignore[attr-defined, no-any-return]


def test_a_deeply_nested_trace_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PlaceError) as err:
        load(str(path))
    assert f"nested more than {MAX_TRACE_DEPTH}" in err.value.diagnostics[0].message
    assert err.value.diagnostics[0].span is not None
    done = cli("replay", str(path))
    assert done.returncode == ExitCode.INPUT_ERROR, done.stderr


@pytest.mark.parametrize("change", ["source", "tokens"])
def test_a_malformed_trace_is_an_input_error(tmp_path: Path, trace: object, change: str) -> None:
    doc = _trace_doc(trace)
    if change == "source":
        doc["source"] = 42
    else:
        rows = doc["tokens"]
        assert isinstance(rows, list) and rows
        rows[0]["tokens"] = 10**7
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlaceError) as err:
        load(str(path))
    assert change in err.value.diagnostics[0].message
    assert err.value.exit_code == ExitCode.INPUT_ERROR


def test_replay_timeout_nan_is_a_usage_error() -> None:
    done = cli("replay", "--timeout", "nan", "no-such-trace.json")
    assert done.returncode == ExitCode.INPUT_ERROR
    assert "nan" in done.stderr
