"""A replay starts under a long ``TMPDIR`` (a test runner's per-test folder, a deep scratch
path): multiprocessing puts the forkserver's Unix socket under the temporary directory, and a
socket's path is at most 107 bytes, so with a TMPDIR of 90 characters every replay used to end in
"internal error: OSError: AF_UNIX path too long" (exit 70). Found when the suite ran under
pytest-xdist, whose per-test folders are that deep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from placeverify.api import check
from placeverify.trace import write

pytestmark = pytest.mark.torch
ROOT = Path(__file__).resolve().parents[1]


def test_a_replay_under_a_long_tmpdir_runs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    verification = check(str(ROOT / "examples" / "bugs" / "zero1-no-allgather.place")).verification
    assert verification is not None and verification.trace is not None
    trace = tmp_path / "t.json"
    write(verification.trace, str(trace))
    deep = tmp_path / ("d" * 60) / ("e" * 60)  # far past 107 bytes with the socket's name
    deep.mkdir(parents=True)
    assert len(str(deep)) + len("/pymp-XXXXXXXX/listener-XXXXXXXX") > 107
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    env.update(TMPDIR=str(deep), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, "-m", "placeverify", "replay", str(trace)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert "AF_UNIX" not in done.stderr and "internal error" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the replay agrees with Z3 (refuted; the real run diverges)" in done.stdout
    assert sorted(p.name for p in deep.iterdir()) == [], "the run left files in TMPDIR"
