"""A `replay` or `measure` stopped by a signal leaves no temporary folder and no rank process.

Each test starts the real command in a subprocess with a private TMPDIR and a rank that hangs on
purpose (so that the run is certainly still going), waits until the rank processes exist, signals
the parent, and then looks for every process that carries the test's marker in its environment
and for anything left in the TMPDIR. SIGTERM, SIGHUP and SIGINT are turned into a clean shutdown
with exit codes 143, 129 and 130; after SIGKILL (nothing runs in the parent) the ranks notice that
their parent is gone, remove the run's folders and exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from placeverify.api import check
from placeverify.trace import write

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")]

ROOT = Path(__file__).resolve().parents[1]
BUG = ROOT / "examples" / "bugs" / "missing-allreduce.place"
MEASURE = ROOT / "examples" / "measure" / "ddp.place"
WORKER = "placeverify.measure.worker"
FORKSERVER = "multiprocessing.forkserver"


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    verification = check(str(BUG)).verification
    assert verification is not None and verification.trace is not None
    path = tmp_path_factory.mktemp("trace") / "t.json"
    write(verification.trace, str(path))
    return path


def marked(marker: str) -> dict[int, tuple[int, str]]:
    """Every live process whose environment holds ``marker``: pid -> (parent pid, command)."""
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() not in (entry / "environ").read_bytes():
                continue
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if stat[0] != "Z":
            found[int(entry.name)] = (int(stat[1]), command)
    return found


def replay_ranks(processes: dict[int, tuple[int, str]]) -> list[int]:
    """A replay's ranks: the children of its forkserver."""
    servers = {pid for pid, (_, command) in processes.items() if FORKSERVER in command}
    return [pid for pid, (parent, _) in processes.items() if parent in servers]


def measure_ranks(processes: dict[int, tuple[int, str]]) -> list[int]:
    return [pid for pid, (_, command) in processes.items() if WORKER in command]


def until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def default_signals() -> None:
    # A test run started in the background inherits an ignored SIGINT (and nohup an ignored
    # SIGHUP); an ignored signal stays ignored across exec, so restore the defaults.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def stop_midway(args: list[str], ranks: Callable[[dict[int, tuple[int, str]]], list[int]],
                signum: int, tmp_path: Path, world: int = 2) -> tuple[int, str,
                                                                      dict[int, tuple[int, str]],
                                                                      list[str]]:
    """Run the command, signal it once ``world`` of its ranks exist; its exit code, stderr, the
    marked processes left and the TMPDIR's entries left."""
    temporary = short_tmpdir()
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    env.update(TMPDIR=str(temporary), PLACEVERIFY_SIGNAL_TEST=marker,
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               PLACEVERIFY_REPLAY_FAULT="hang:1", PLACEVERIFY_MEASURE_FAULT="hang:1",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-m", "placeverify", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_signals)
    try:
        started = until(lambda: len(ranks(marked(marker))) >= world, 120)
        assert started, f"the ranks did not start: {marked(marker)}"
        assert any(temporary.iterdir()), "the run made no temporary folder"
        os.kill(proc.pid, signum)
        _, stderr = proc.communicate(timeout=60)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    until(lambda: not marked(marker) and not any(temporary.iterdir()), 15)
    left = sorted(p.name for p in temporary.iterdir())
    shutil.rmtree(temporary, ignore_errors=True)
    return proc.returncode, stderr.decode(), marked(marker), left


def short_tmpdir() -> Path:
    """A TMPDIR short enough for the forkserver's socket path. Under a long one (pytest's
    numbered folders grow: pytest-127/popen-gw1/... is one byte too long) the replay puts its
    socket folder in /tmp instead (backend/pool.py:short_socket_folder), where a test that looks
    for leftovers in its TMPDIR would not see them."""
    return Path(tempfile.mkdtemp(prefix="pvsig-", dir="/tmp"))


def test_a_replay_killed_while_its_ranks_start_leaves_nothing_behind(trace_file: Path,
                                                                     tmp_path: Path) -> None:
    # Killed as soon as the first rank exists: the second may not exist yet, or may not yet run
    # any placeverify code (the janitor, not the ranks, removes the folders then).
    returncode, _, processes, left = stop_midway(
        ["replay", str(trace_file), "--timeout", "120"], replay_ranks, signal.SIGKILL, tmp_path,
        world=1)
    assert returncode == -9
    assert left == []
    assert processes == {}


def test_a_replay_killed_as_its_server_starts_leaves_nothing_behind(
        trace_file: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Killed the moment multiprocessing makes its socket folder (pymp-*), before any rank: the
    # janitor already runs and has the folder (a fault fuzz run once found it left behind).
    temporary = short_tmpdir()
    request.addfinalizer(lambda: shutil.rmtree(temporary, ignore_errors=True))
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    env.update(TMPDIR=str(temporary), PLACEVERIFY_SIGNAL_TEST=marker,
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),  # torch's cache, kept by design
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-m", "placeverify", "replay", str(trace_file),
                             "--timeout", "120"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=default_signals)
    try:
        seen = until(lambda: any(p.name.startswith("pymp-") for p in temporary.iterdir()), 120)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert seen, "the replay made no socket folder"
    until(lambda: not marked(marker) and not any(temporary.iterdir()), 15)
    assert sorted(p.name for p in temporary.iterdir()) == []
    assert marked(marker) == {}


CODES = {"SIGTERM": 143, "SIGINT": 130, "SIGHUP": 129, "SIGKILL": -9}


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP", "SIGKILL"])
def test_a_signalled_replay_leaves_nothing_behind(trace_file: Path, tmp_path: Path,
                                                  name: str) -> None:
    signum = signal.Signals[name]
    returncode, stderr, processes, left = stop_midway(
        ["replay", str(trace_file), "--timeout", "120"], replay_ranks, signum, tmp_path)
    assert left == []
    assert processes == {}
    assert returncode == CODES[name], stderr
    assert "Traceback" not in stderr
    if name != "SIGKILL":
        assert stderr.strip().splitlines()[-1] == (
            "placeverify: interrupted" if name == "SIGINT" else f"placeverify: stopped by {name}")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGKILL"])
def test_a_signalled_measurement_leaves_nothing_behind(tmp_path: Path, name: str) -> None:
    pytest.importorskip("torch")
    returncode, stderr, processes, left = stop_midway(
        ["measure", str(MEASURE), "--timeout", "120"], measure_ranks, signal.Signals[name],
        tmp_path)
    assert left == []
    assert processes == {}
    assert returncode == CODES[name], stderr
    assert "Traceback" not in stderr


def test_a_signalled_check_replay_leaves_nothing_behind(tmp_path: Path) -> None:
    returncode, stderr, processes, left = stop_midway(
        ["check", "--replay", str(BUG)], replay_ranks, signal.SIGTERM, tmp_path, world=4)
    assert left == []
    assert processes == {}
    assert returncode == CODES["SIGTERM"], stderr
    assert stderr.strip().splitlines()[-1] == "placeverify: stopped by SIGTERM"


def test_a_check_without_processes_keeps_the_default_sigterm(tmp_path: Path) -> None:
    # a Python handler would wait for the solver query under way (up to 10 s) before running
    slow = tmp_path / "slow.place"
    slow.write_text("\n".join([
        'strategy "a reduction inside 128 micro-batches"', "model gpt3_175b { micro_batch = 1 }",
        "mesh { dp = 2 }", "place fsdp over dp", "loss microbatch_mean", "step {",
        "    microbatches = 128", "    each microbatch {", "        backward sum / tokens(dp, step)",
        "        all_reduce(mean) grads over dp", "    }", "    reduce_scatter(sum) grads over dp",
        "    update params", "}", ""]))
    proc = subprocess.Popen([sys.executable, "-m", "placeverify", "check", "--timeout", "60",
                             str(slow)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=default_signals)
    time.sleep(3)
    assert proc.poll() is None, "the check finished before it could be signalled"
    os.kill(proc.pid, signal.SIGTERM)
    started = time.monotonic()
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert time.monotonic() - started < 2
