"""Paths a command reads or writes that cannot be used: a full disk, a directory where a file is
wanted, a file its user may not read. Each is ``path: error: ...  [read]`` with exit 4 (README's
exit-code table: "a file is missing, unreadable or not a regular file"), never click's usage error
(exit 2), never an internal error (exit 70), and nothing half-written is left behind (issue 36,
item 6)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from placeverify.cli import main
from placeverify.diagnostics import ExitCode
from placeverify.files import WriteFailed, write_atomically

ROOT = Path(__file__).resolve().parents[1]
BUG = ROOT / "examples" / "bugs" / "missing-allreduce.place"
OK = ROOT / "examples" / "ok" / "hsdp.place"
CONFIG = ROOT / "tests" / "importers" / "llama3-70b-zero2-offload.json"
MODEL = ROOT / "tests" / "importers" / "llama3-70b-config.json"
NO_SPACE = "no space left on device"  # glibc's strerror(ENOSPC), first letter lowered


def cli(*args: str, cwd: Path = ROOT, user: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "placeverify", *args]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", *command]
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=300,
                          check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert "internal error" not in done.stderr, done.stderr
    return done


def in_process(*args: str) -> int:
    with pytest.raises(SystemExit) as stop:
        main(list(args))
    code = stop.value.code
    assert isinstance(code, int)
    return code


# ---- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs holding ``old.txt`` (4 bytes) and a filler up to the last byte."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        (disk / "old.txt").write_text("old\n", encoding="utf-8")
        with open(disk / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"x" * 512)
            except OSError:
                pass
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_check_trace_on_a_full_disk_exits_4_and_leaves_the_old_file(full_disk: Path) -> None:
    done = cli("check", "--trace", str(full_disk / "old.txt"), str(BUG))
    assert done.returncode == ExitCode.READ_ERROR, done.stderr
    assert f"{full_disk / 'old.txt'}: error: cannot write trace: {NO_SPACE}  [read]\n" in done.stderr
    assert (full_disk / "old.txt").read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "old.txt"]


def test_import_output_on_a_full_disk_exits_4_and_writes_nothing(full_disk: Path) -> None:
    out = full_disk / "out.place"
    done = cli("import", str(CONFIG), "--world", "64", "--model", str(MODEL), "--set",
               "model.seq=8192", "-o", str(out))
    assert done.returncode == ExitCode.READ_ERROR, done.stderr
    assert done.stderr.endswith(f"{out}: error: cannot write file: {NO_SPACE}  [read]\n")
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "old.txt"]


def test_a_write_that_fails_at_sync_removes_its_temporary(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The same failure in-process, where no tmpfs can be mounted: the disk fills at fsync."""
    out = tmp_path / "out.place"
    out.write_text("old\n", encoding="utf-8")

    def full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(WriteFailed) as failed:
        write_atomically("new text\n", out)
    assert failed.value.strerror == NO_SPACE
    assert isinstance(failed.value, OSError)  # callers that catch OSError still do
    assert out.read_text(encoding="utf-8") == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.place"]
    code = in_process("import", str(CONFIG), "--world", "64", "--model", str(MODEL), "--set",
                      "model.seq=8192", "-o", str(out))
    assert code == ExitCode.READ_ERROR
    assert [p.name for p in tmp_path.iterdir()] == ["out.place"]


# ---- a directory where a file is wanted -------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["check", "--trace", "{dir}", str(BUG)],
    ["check", "--no-verify", "--plot", "{dir}", str(OK)],
    ["import", str(CONFIG), "--world", "64", "--model", str(MODEL), "--set", "model.seq=8192", "-o", "{dir}"],
    ["import", str(CONFIG), "--world", "64", "--model", "{dir}"],
    ["check", str(CONFIG), "--world", "64", "--model", "{dir}"],
    ["replay", "--emit", "{dir}", "examples/bugs/missing-allreduce.place"],
], ids=["check-trace", "check-plot", "import-o", "import-model", "check-model", "replay-emit"])
def test_a_directory_as_a_file_path_is_exit_4(args: list[str], tmp_path: Path) -> None:
    folder = tmp_path / "out.png"  # a plot's suffix, so that only its being a folder is wrong
    folder.mkdir()
    done = cli(*(a.replace("{dir}", str(folder)) for a in args))
    assert done.returncode == ExitCode.READ_ERROR, done.stderr
    assert done.stderr.startswith(f"{folder}: error: "), done.stderr
    assert "directory" in done.stderr and done.stderr.endswith("  [read]\n"), done.stderr
    assert "Usage:" not in done.stderr
    if "--model" in args and args[args.index("--model") + 1] == "{dir}":
        assert done.stderr == (f"{folder}: error: cannot read file: is a directory, not a "
                               "config.json  [read]\n")
    assert list(folder.iterdir()) == []


def test_search_output_dir_onto_a_file_is_exit_4(tmp_path: Path) -> None:
    taken = tmp_path / "layouts"
    taken.write_text("a file\n", encoding="utf-8")
    done = cli("search", "--model", "llama3_8b", "--device", "h100_sxm", "--devices", "8",
               "--global-batch", "8", "--seq", "2048", "--top", "1", "-o", str(taken), "-q")
    assert done.returncode == ExitCode.READ_ERROR, done.stderr
    assert "Usage:" not in done.stderr
    assert taken.read_text(encoding="utf-8") == "a file\n"


# ---- a file its user may not read -------------------------------------------------------------


def test_an_unreadable_file_is_exit_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """As root every file is readable, so the refusal is played in-process: ``os.access`` and
    opening the file say 'permission denied', as they do for a user without the read bit."""
    locked = tmp_path / "locked.place"
    shutil.copy(OK, locked)
    real_access, real_open = os.access, pathlib.Path.open

    def access(path: Any, mode: int, *args: Any, **kwargs: Any) -> bool:
        return False if Path(path) == locked else real_access(path, mode, *args, **kwargs)

    def open_(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(pathlib.Path, "open", open_)
    assert in_process("check", "--no-verify", str(locked)) == ExitCode.READ_ERROR
    assert capsys.readouterr().err == f"{locked}: error: cannot read file: permission denied  [read]\n"


@pytest.fixture
def nobody() -> None:
    """Skip unless this process can run placeverify as the user nobody (root, setpriv, and an
    interpreter and checkout that user may read)."""
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to run as the user nobody")
    probe = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                            sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                            "import placeverify.cli"], capture_output=True, text=True, check=False,
                           cwd="/")
    if probe.returncode != 0:
        pytest.skip(f"the user nobody cannot run {sys.executable} with placeverify: "
                    f"{probe.stderr.strip()[-200:]}")


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder every user may search (pytest's own tmp_path sits under a root-only one)."""
    folder = Path(tempfile.mkdtemp(prefix="placeverify-paths-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.mark.usefixtures("nobody")
def test_an_unreadable_file_is_exit_4_for_a_user_without_the_read_bit(open_folder: Path) -> None:
    locked = open_folder / "locked.place"
    shutil.copy(OK, locked)
    locked.chmod(0o000)
    done = cli("check", "--no-verify", str(locked), cwd=open_folder, user="nobody")
    assert done.returncode == ExitCode.READ_ERROR, done.stderr
    assert done.stderr == f"{locked}: error: cannot read file: permission denied  [read]\n"


@pytest.mark.usefixtures("nobody")
def test_a_file_in_a_folder_its_user_may_not_search_is_exit_4(open_folder: Path) -> None:
    closed = open_folder / "closed"
    closed.mkdir(mode=0o700)
    shutil.copy(OK, closed / "x.place")
    for args in (["check", "--no-verify", str(closed / "x.place")],
                 ["check", "--json", "--no-verify", str(closed / "x.place")],
                 ["compare", str(closed / "x.place")]):
        done = cli(*args, cwd=open_folder, user="nobody")
        assert done.returncode == ExitCode.READ_ERROR, (args, done.stderr)
        assert done.stderr == f"{closed / 'x.place'}: error: cannot read file: permission denied  [read]\n"


@pytest.mark.usefixtures("nobody")
def test_an_unreadable_model_config_and_an_unwritable_folder_are_exit_4(open_folder: Path) -> None:
    locked = open_folder / "config.json"
    shutil.copy(MODEL, locked)
    locked.chmod(0o000)
    done = cli("import", str(CONFIG), "--world", "64", "--model", str(locked), cwd=open_folder,
               user="nobody")
    assert done.returncode == ExitCode.READ_ERROR, done.stderr
    assert done.stderr.startswith(f"{locked}: error: "), done.stderr
    assert "permission denied" in done.stderr
    # open_folder is root's: nobody may not create the trace's temporary file there
    trace = open_folder / "t.json"
    done = cli("check", "--trace", str(trace), str(BUG), cwd=open_folder, user="nobody")
    assert done.returncode == ExitCode.READ_ERROR, done.stderr
    assert done.stderr.endswith(f"{trace}: error: cannot write trace: permission denied  [read]\n")
    assert sorted(p.name for p in open_folder.iterdir()) == ["config.json"]


def test_a_signal_right_after_the_temporary_file_is_made_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A termination signal whose handler raises just after the temporary file exists (before
    its name reached the writer: a fault fuzz run once found ``.trace.json.*.tmp`` left after a
    SIGTERM) leaves no file behind."""
    import os as os_module

    from placeverify.files import write_atomically as write

    class Stopped(BaseException):
        pass

    real_open = os_module.open

    def open_then_stop(*args: object, **kwargs: object) -> int:
        fd = real_open(*args, **kwargs)  # type: ignore[arg-type]
        os_module.close(fd)
        raise Stopped

    monkeypatch.setattr(os_module, "open", open_then_stop)
    with pytest.raises(Stopped):
        write("{}", tmp_path / "trace.json")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
