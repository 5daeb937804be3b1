"""A failed measurement names the rank that failed first of its own accord (issue 36, item 5).

When one rank crashes, its peers fail too, with gloo's "Connection closed by peer"; which death
reaches the parent first depends on the load. Each rank records what it died of with the time
(the system-wide monotonic clock); the parent ranks a rank's own failure, or a death with nothing
said, above a peer's broken connection, then takes the earliest. These tests build the records
and the exit statuses by hand, in every order.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import cast

import pytest

from placeverify.backend.contract import FailureKind
from placeverify.backend.processes import _first_failure, failure_path

PEER = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        "Connection closed by peer [127.0.0.1]:62652. This is typically caused by a remote worker "
        "crashing.")
OWN = "RuntimeError: rank 1: crash injected"


class Exited:
    """A rank process that has already ended with ``code`` (None: still running)."""

    def __init__(self, pid: int, code: int | None) -> None:
        self.pid = pid
        self.code = code

    def poll(self) -> int | None:
        return self.code

    def kill(self) -> None:
        self.code = -9

    def wait(self, timeout: float | None = None) -> int | None:
        return self.code


def record(folder: Path, rank: int, error: str, at: float) -> None:
    Path(failure_path(folder / f"rank{rank}.json")).write_text(
        json.dumps({"error": error, "at": at}), encoding="utf-8")


def first(folder: Path, codes: list[int | None]) -> str:
    ranks = [Exited(10_000_000 + r, c) for r, c in enumerate(codes)]
    failure = _first_failure(folder, cast("list[subprocess.Popen[bytes]]", ranks))
    assert failure.kind is FailureKind.CRASH
    return failure.message


def test_failure_records_sit_beside_the_result() -> None:
    assert failure_path("/tmp/x/rank3.json") == "/tmp/x/rank3.failure.json"


def test_the_rank_that_crashed_is_named_not_the_peer_that_noticed(tmp_path: Path) -> None:
    # rank 1 failed at t=100; rank 0 saw its connection close at t=101; both have exited, and
    # rank 0 is the lower rank (the one the parent used to name when both were seen at once)
    record(tmp_path, 0, PEER, 101.0)
    record(tmp_path, 1, OWN, 100.0)
    message = first(tmp_path, [1, 1])
    assert message == f"rank 1 of 2 exited with status 1: {OWN}"


def test_a_peer_error_recorded_earlier_still_ranks_below_an_own_failure(tmp_path: Path) -> None:
    # clocks of two processes can disagree by a scheduling quantum: the kind of error decides
    record(tmp_path, 0, PEER, 99.0)
    record(tmp_path, 1, OWN, 100.0)
    assert first(tmp_path, [1, 1]).startswith("rank 1 of 2 exited with status 1: ")


def test_the_earliest_of_two_own_failures_is_named(tmp_path: Path) -> None:
    record(tmp_path, 0, "ValueError: late", 200.0)
    record(tmp_path, 1, "KeyError: 'early'", 150.0)
    assert first(tmp_path, [1, 1]) == "rank 1 of 2 exited with status 1: KeyError: 'early'"


def test_a_rank_killed_without_a_word_ranks_above_a_peer_error(tmp_path: Path) -> None:
    # rank 1 was killed (the kernel's OOM killer, a segfault): no record, no stderr line
    record(tmp_path, 0, PEER, 0.0)
    assert first(tmp_path, [1, -9]) == "rank 1 of 2 exited with status -9"


def test_only_peer_errors_name_the_earliest(tmp_path: Path) -> None:
    record(tmp_path, 0, PEER, 5.0)
    record(tmp_path, 1, PEER.replace("62652", "1234"), 4.0)
    assert first(tmp_path, [1, 1]).startswith("rank 1 of 2 exited with status 1: RuntimeError: [")


def test_a_failed_rank_still_dying_is_named_with_what_it_recorded(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    from placeverify.backend import processes

    monkeypatch.setattr(processes, "FIRST_FAILURE_GRACE", 0.2)
    record(tmp_path, 0, PEER, 101.0)
    record(tmp_path, 1, OWN, 100.0)  # rank 1 is still tearing down when rank 0 has exited
    assert first(tmp_path, [1, None]) == f"rank 1 of 2 failed: {OWN}"
