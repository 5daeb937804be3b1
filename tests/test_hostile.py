"""Hostile output paths, traces and options: a clear message with its documented exit (4 for a
path that cannot be written, 2 for a malformed trace or option), never a replaced special file,
an internal error or a hang."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    assert err.value.exit_code == ExitCode.READ_ERROR
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


def test_check_trace_onto_a_fifo_exits_4(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = cli("check", "--trace", str(fifo), str(BUG))
    assert done.returncode == ExitCode.READ_ERROR, done.stderr
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


# ---- traces that are no counterexample of their own source: input errors, not "VERIFIER BUG" ----


def _edited_trace(tmp_path: Path, bug: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    verification = check(str(ROOT / "examples" / "bugs" / bug)).verification
    assert verification is not None and verification.trace is not None
    doc = verification.trace.to_json()
    edit(doc)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


def _plan_error(path: Path) -> tuple[str, int, int]:
    """The input error planning a replay of the trace at ``path`` raises: message, line, column."""
    from placeverify.replay.plan import plan_from_trace

    with pytest.raises(PlaceError) as err:
        plan_from_trace(load(str(path)), world=None, steps=1)
    assert err.value.exit_code == ExitCode.INPUT_ERROR
    (diagnostic,) = err.value.diagnostics
    assert diagnostic.code == "trace" and diagnostic.span is not None
    assert err.value.source.path == str(path)
    return diagnostic.message, diagnostic.span.line, diagnostic.span.column


def _key_at(path: Path, key: str) -> tuple[int, int]:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith(f'  "{key}":'):
            return number, 3
    raise AssertionError(key)


def _equal_tokens(doc: dict[str, Any]) -> None:
    for row in doc["tokens"]:
        row["tokens"] = 2


def _one_microbatch(doc: dict[str, Any]) -> None:
    doc["microbatches"] = 1
    for key in ("tokens", "samples", "gradients"):
        doc[key] = [row for row in doc[key] if row["microbatch"] == 0]


def _source_fixed(doc: dict[str, Any]) -> None:  # the accumulation normalised by the global count
    doc["source"] = doc["source"].replace("backward mean ", "backward sum / tokens(dp, step) ") \
        .replace("    scale grads by 1 / microbatches\n", "")


def _source_with_fewer_microbatches(doc: dict[str, Any]) -> None:
    doc["source"] = doc["source"].replace("microbatches = 4", "microbatches = 1")


def _larger_mesh(doc: dict[str, Any]) -> None:
    doc["mesh"] = {"dp": 2}  # the rows still hold dp 0 only


@pytest.mark.parametrize(("edit", "key", "words"), [
    (_equal_tokens, "tokens", "token counts are all equal (2 each)"),
    (_one_microbatch, "microbatches", "with its step's 4 micro-batches it does not"),
    (_source_fixed, "source", "the trace is no counterexample of its source"),
    (_source_with_fewer_microbatches, "microbatches",
     "the trace has 2 micro-batches but its source's step has 1"),
    (_larger_mesh, "tokens", "token rows do not fit its mesh (dp = 2 with 2 micro-batches)"),
])
def test_a_loss_normaliser_trace_that_shows_no_divergence_is_an_input_error(
        tmp_path: Path, edit: Callable[[dict[str, Any]], None], key: str, words: str) -> None:
    # ga-token-normalisation: a per-micro-batch mean is wrong only for unequal token counts
    path = _edited_trace(tmp_path, "ga-token-normalisation.place", edit)
    message, line, column = _plan_error(path)
    assert words in message
    assert (line, column) == _key_at(path, key)


def test_a_trace_whose_source_z3_proves_at_its_mesh_is_an_input_error(tmp_path: Path) -> None:
    def gather(doc: dict[str, Any]) -> None:  # the missing parameter all-gather put back
        doc["source"] = re.sub(r"    update params .*\n", "    update params\n"
                               "    all_gather params over dp\n", doc["source"])

    path = _edited_trace(tmp_path, "zero1-no-allgather.place", gather)
    assert "all_gather params" in json.loads(path.read_text())["source"]
    message, line, column = _plan_error(path)
    assert message.startswith("Z3 proves the trace's source at the trace's own mesh (dp = 2 with "
                              "1 micro-batch)")
    assert (line, column) == _key_at(path, "source")


@pytest.mark.parametrize("bug", sorted(p.name for p in (ROOT / "examples" / "bugs").glob("*.place")))
def test_every_bundled_trace_is_a_counterexample_of_its_source(bug: str, tmp_path: Path) -> None:
    from placeverify.replay.plan import plan_from_trace

    path = _edited_trace(tmp_path, bug, lambda doc: None)
    plan = plan_from_trace(load(str(path)), world=None, steps=1)
    assert plan.expect.verdict.value == "refuted" or plan.resized, bug


def test_replay_of_a_trace_with_equal_counts_exits_2(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    path = _edited_trace(tmp_path, "ga-token-normalisation.place", _equal_tokens)
    done = cli("replay", str(path))
    assert done.returncode == ExitCode.INPUT_ERROR, done.stdout + done.stderr
    line, column = _key_at(path, "tokens")
    assert done.stderr.startswith(f"{path}:{line}:{column}: error: the trace's token counts are "
                                  "all equal")
    assert done.stderr.splitlines()[0].endswith("  [trace]")
    assert "VERIFIER BUG" not in done.stdout + done.stderr and done.stdout == ""


@pytest.mark.parametrize(("key", "value"), [("source", 42), ("mesh", {"dp": 0}),
                                            ("microbatches", 0), ("kind", "no-such-kind"),
                                            ("tokens", "many")])
def test_a_malformed_trace_key_is_pointed_at(tmp_path: Path, trace: object, key: str,
                                             value: object) -> None:
    doc = _trace_doc(trace)
    doc[key] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc, indent=2))
    with pytest.raises(PlaceError) as err:
        load(str(path))
    (diagnostic,) = err.value.diagnostics
    assert diagnostic.span is not None
    assert (diagnostic.span.line, diagnostic.span.column) == _key_at(path, key)


@pytest.mark.parametrize(("edit", "key", "words"), [
    (_equal_tokens, "tokens", "token counts are all equal (2 each)"),
    (_source_fixed, "source", "the trace is no counterexample of its source"),
    (_source_with_fewer_microbatches, "microbatches",
     "the trace has 2 micro-batches but its source's step has 1"),
])
def test_emit_refuses_what_replay_refuses(tmp_path: Path, edit: Callable[[dict[str, Any]], None],
                                          key: str, words: str) -> None:
    # `replay --emit` writes a reproducer of the trace: one the trace does not witness would
    # reproduce nothing, so it is the same positioned input error, and no script is written
    path = _edited_trace(tmp_path, "ga-token-normalisation.place", edit)
    out = tmp_path / "repro.py"
    done = cli("replay", str(path), "--emit", str(out))
    assert done.returncode == ExitCode.INPUT_ERROR, done.stdout + done.stderr
    line, column = _key_at(path, key)
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"{path}:{line}:{column}: error: ") and words in first, done.stderr
    assert not out.exists() and "Traceback" not in done.stderr


def test_emit_writes_the_reproducer_of_an_unedited_trace(tmp_path: Path) -> None:
    path = _edited_trace(tmp_path, "ga-token-normalisation.place", lambda doc: None)
    out = tmp_path / "repro.py"
    done = cli("replay", str(path), "--emit", str(out))
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert out.read_text().startswith("#")


def test_a_replay_whose_reference_training_blows_up_is_never_a_verifier_bug(
        tmp_path: Path) -> None:
    # ga-token-normalisation's replay model diverges numerically between 70 and 80 steps of
    # SGD (lr 0.05, momentum 0.9); at 100 steps its states may overflow (torch's reductions are
    # not bit-reproducible across thread counts, so whether they do varies from run to run).
    # Overflowing states leave the replay unable to decide: unknown (exit 3). States that stay
    # finite are judged against the tolerance the run's own sensitivity gives: the buggy run
    # diverges, the control stays within it (exit 0). Never "VERIFIER BUG".
    pytest.importorskip("torch")
    path = _edited_trace(tmp_path, "ga-token-normalisation.place", lambda doc: None)
    done = cli("replay", str(path), "--steps", "100")
    text = " ".join(done.stdout.split())  # the report wraps at the console's width
    assert "VERIFIER BUG" not in text
    assert done.returncode in (ExitCode.OK, ExitCode.UNKNOWN), done.stdout + done.stderr
    if done.returncode == ExitCode.UNKNOWN:
        assert "numerically unstable over 100 steps" in text
        assert done.stdout.rstrip().splitlines()[-1].startswith("  unknown in ")
    else:
        assert "the replay agrees with Z3 (refuted; the real run diverges)" in text
        assert "the control agrees with Z3 (proved; the real run matches)" in text
