"""The janitor removes the folders a placeverify process registered when it is killed outright."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from placeverify.backend.janitor import serve

ROOT = Path(__file__).resolve().parents[1]


def test_serve_keeps_what_is_registered_and_not_released() -> None:
    lines = "+/a\n+/b\n-/a\n+/c\n\n+\n!123\n!456\n~123\n!1\n!x\n"
    left = serve(io.StringIO(lines))
    assert left.folders == {"/b", "/c"}
    assert left.ranks == {456}  # 1 (init) and words are never process ids to kill


def test_serve_keeps_the_servers_whose_children_die_with_them() -> None:
    left = serve(io.StringIO("^300\n^301\n!5\n~301\n^1\n"))
    assert left.servers == {300}
    assert left.ranks == {5}
    assert serve(io.StringIO("^300\n.\n")).servers == set()


def test_a_clean_exit_hands_back_the_processes_but_not_the_folders() -> None:
    """After ``.`` the exit handlers have stopped the ranks; a folder still registered is one a
    cleanup cut short left behind, removed at the end of file."""
    assert serve(io.StringIO("+/a\n+/b\n-/b\n!7\n.\n")).folders == {"/a"}
    assert serve(io.StringIO("+/a\n!7\n^8\n.\n")).ranks == set()
    assert serve(io.StringIO("+/a\n^8\n.\n")).servers == set()


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


def test_a_folder_a_clean_exit_left_behind_is_removed_before_the_process_ends(
        tmp_path: Path) -> None:
    """A SIGTERM inside a run's ``finally`` cuts its folder's removal short, and the process
    then exits through its handlers (a fault fuzz run under load once left a
    ``placeverify-replay-*`` folder so): the janitor removes it, before the process is gone."""
    kept, gone = run_child(tmp_path, "")
    assert not gone.exists()  # no wait: removed before the child's exit returned
    assert kept.is_dir()


def test_a_kill_during_multiprocessings_exit_handlers_leaves_nothing_registered(
        tmp_path: Path) -> None:
    """A SIGKILL while multiprocessing's exit finalizers run, before the one that removes its
    temporary folder (the forkserver's, priority -100), still leaves the janitor that folder: the
    janitor hears ``.`` only after them (a fault fuzz run once found a ``pymp-*`` folder left)."""
    marker = tmp_path / "handlers-ran"
    program = textwrap.dedent(f"""
        import multiprocessing.util, os, signal
        from placeverify.backend import janitor
        folder = multiprocessing.util.get_temp_dir()
        janitor.register(folder)
        print(folder, flush=True)
        def kill():
            open({str(marker)!r}, "w").write(str(os.path.isdir(folder)))
            os.kill(os.getpid(), signal.SIGKILL)
        multiprocessing.util.Finalize(None, kill, exitpriority=-50)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    child = subprocess.run([sys.executable, "-c", program], env=env, timeout=60,
                           capture_output=True, text=True)
    assert child.returncode == -9
    folder = Path(child.stdout.strip())
    assert folder.parent == tmp_path and folder.name.startswith("pymp-")
    assert marker.read_text() == "True"  # the kill came before multiprocessing removed it
    assert wait_gone(folder)


def test_a_clean_exit_removes_multiprocessings_folder_and_ends_the_janitor(tmp_path: Path) -> None:
    program = textwrap.dedent("""
        import multiprocessing.util
        from placeverify.backend import janitor
        folder = multiprocessing.util.get_temp_dir()
        janitor.register(folder)
        print(folder, janitor._JANITOR._process.pid, flush=True)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    child = subprocess.run([sys.executable, "-c", program], env=env, timeout=60,
                           capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    assert child.stderr == ""
    folder, pid = child.stdout.split()
    assert not Path(folder).exists()
    with pytest.raises(ProcessLookupError):  # close() waited for it
        os.kill(int(pid), 0)


def test_a_killed_process_leaves_no_rank_running(tmp_path: Path) -> None:
    """A rank the janitor watches is killed when the process that started it is killed outright,
    even one that would run on for minutes (a rank blocked in native code runs no handler)."""
    pid_file = tmp_path / "pid"
    run_child(tmp_path, f"""
        import subprocess, sys
        rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(rank.pid))
        janitor.watch(rank.pid)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 20
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def test_a_killed_process_leaves_no_server_and_no_child_of_it(tmp_path: Path) -> None:
    """A server the janitor knows of (the replay's forkserver) is killed with every process it
    forked, even one this process was never told of (a Ctrl-C between the fork and the handle)."""
    pids = tmp_path / "pids"
    run_child(tmp_path, f"""
        import subprocess, sys, time
        server = subprocess.Popen([sys.executable, "-c",
            "import subprocess, sys, time; "
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
            "open({str(pids)!r}, 'w').write(str(child.pid)); time.sleep(300)"])
        while not (os.path.exists({str(pids)!r}) and open({str(pids)!r}).read()):
            time.sleep(0.05)
        janitor.serve_ranks(server.pid)
        open({str(pids)!r}, "a").write(" " + str(server.pid))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    child, server = (int(word) for word in pids.read_text().split())
    deadline = time.monotonic() + 20
    while (_running(child) or _running(server)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child)
    assert not _running(server)


def test_a_folder_not_removed_whole_stays_registered(tmp_path: Path) -> None:
    """``remove`` forgets a folder only once it is gone: one that a process still writes into
    (rmtree with ignore_errors leaves it) is removed by the janitor at exit."""
    folder = tmp_path / "busy"
    kept, gone = run_child(tmp_path, f"""
        import shutil
        os.mkdir({str(folder)!r})
        janitor.register({str(folder)!r})
        real = shutil.rmtree
        shutil.rmtree = lambda path, ignore_errors=False: None  # as if a rank wrote on
        janitor.remove({str(folder)!r})
        shutil.rmtree = real
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert wait_gone(folder)
    assert wait_gone(gone) and kept.is_dir()
