"""A failed replay names the rank that failed of its own accord (issue 36, item 5).

When one rank crashes, its peers fail too, with gloo's "Connection closed by peer", and which
reaches the parent first depends on the load: a fresh-clone suite run beside a CPU hog had
``test_replay.py::test_a_failed_rank_ends_the_replay_and_leaves_no_process[fault2]`` report a
peer's error where rank 2 had crashed. Here the ranks are pipes and sentinels driven by hand, in
the orders a loaded machine gives, into the pool's collection of their answers.
"""

from __future__ import annotations

import json
import threading
import time
from multiprocessing import Pipe
from typing import Any

import pytest

from placeverify.backend import pool as pool_module
from placeverify.backend.contract import BackendFailure, FailureKind
from placeverify.backend.pool import Pool

PEER = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
        "peer [127.0.0.1]:5103")


class Rank:
    """A rank process as the pool sees it: its answer pipe and a sentinel that becomes ready
    when it ends."""

    def __init__(self) -> None:
        self.receive, self.send = Pipe(duplex=False)
        self.sentinel, self._alive = Pipe(duplex=False)
        self.exitcode: int | None = None

    def answer(self, doc: dict[str, Any]) -> None:
        self.send.send_bytes(json.dumps(doc).encode("utf-8"))

    def die(self, code: int) -> None:
        self.exitcode = code
        self.send.close()
        self._alive.close()  # the sentinel reads end of file: the process is gone

    def join(self, timeout: float | None = None) -> None:
        return None


def collect(ranks: list[Rank], events: list[tuple[float, int, str]]) -> BackendFailure:
    """Run the pool's collection while ``events`` (seconds, rank, what) happen to the ranks."""

    def drive() -> None:
        started = time.monotonic()
        for at, rank, what in events:
            time.sleep(max(0.0, started + at - time.monotonic()))
            if what == "peer":
                ranks[rank].answer({"ok": False, "rank": rank, "error": PEER})
            elif what == "own":
                ranks[rank].answer({"ok": False, "rank": rank, "error": "RuntimeError: own"})
            elif what == "ok":
                ranks[rank].answer({"ok": True, "rank": rank})
            else:
                ranks[rank].die(-9)

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        with pytest.raises(BackendFailure) as failed:
            Pool()._collect(ranks, {r: k.receive for r, k in enumerate(ranks)},  # type: ignore[arg-type]
                            {}, time.monotonic() + 30, 30, None)
    finally:
        driver.join()
    return failed.value


@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0])
def test_a_crash_seen_after_its_peers_errors_is_named(delay: float) -> None:
    ranks = [Rank() for _ in range(4)]
    failure = collect(ranks, [(0.0, 0, "peer"), (0.05, 3, "peer"), (delay, 2, "crash"),
                              (delay + 0.05, 1, "peer")])
    assert failure.kind is FailureKind.CRASH
    assert "rank 2 exited" in str(failure)


def test_an_own_error_seen_after_a_peers_is_named() -> None:
    ranks = [Rank() for _ in range(3)]
    failure = collect(ranks, [(0.0, 0, "peer"), (0.3, 1, "own"), (0.35, 2, "peer")])
    assert failure.kind is FailureKind.ERROR and "rank 1 failed: RuntimeError: own" in str(failure)


def test_an_own_failure_ends_the_collection_at_once() -> None:
    ranks = [Rank() for _ in range(3)]
    started = time.monotonic()
    failure = collect(ranks, [(0.0, 1, "crash"), (0.0, 0, "ok")])
    assert "rank 1 exited" in str(failure)
    assert time.monotonic() - started < 2  # not the grace, nor the deadline: rank 2 never answers


def test_only_peers_errors_name_the_first_after_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "FIRST_FAILURE_GRACE", 0.5)
    ranks = [Rank() for _ in range(3)]
    started = time.monotonic()
    failure = collect(ranks, [(0.0, 2, "peer"), (0.1, 0, "peer")])
    took = time.monotonic() - started
    assert failure.kind is FailureKind.ERROR and "rank 2 failed" in str(failure)
    assert 0.5 <= took < 5  # it waited the grace for an own failure, then stopped waiting
