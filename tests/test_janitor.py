"""The janitor removes the folders a placeverify process registered when it is killed outright."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from placeverify.backend.janitor import serve

ROOT = Path(__file__).resolve().parents[1]


def test_serve_keeps_what_is_registered_and_not_released() -> None:
    lines = "+/a\n+/b\n-/a\n+/c\n\n+\n"
    assert serve(io.StringIO(lines)) == {"/b", "/c"}


def test_a_clean_exit_hands_the_folders_back() -> None:
    assert serve(io.StringIO("+/a\n+/b\n.\n")) == set()
    assert serve(io.StringIO("+/a\n.\n+/c\n")) == {"/c"}


def run_child(tmp_path: Path, body: str) -> tuple[Path, Path]:
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    for folder in (kept, gone):
        folder.mkdir()
        (folder / "file").write_text("x")
    program = textwrap.dedent(f"""
        import os, signal
        from placeverify.backend import janitor
        janitor.register({str(gone)!r})
        janitor.register({str(kept)!r})
        janitor.release({str(kept)!r})
    """) + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.run([sys.executable, "-c", program], env=env, timeout=60)
    assert child.returncode in (0, -9)
    return kept, gone


def wait_gone(path: Path, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def test_a_killed_process_leaves_nothing_registered(tmp_path: Path) -> None:
    kept, gone = run_child(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)\n")
    assert wait_gone(gone)
    assert kept.is_dir()


def test_a_clean_exit_is_left_to_its_own_handlers(tmp_path: Path) -> None:
    kept, gone = run_child(tmp_path, "")
    assert gone.is_dir() and kept.is_dir()
