"""A signal that comes while the process runs its exit handlers (after the command has decided
its exit code) ends it at once with the signal's code, never with a traceback (issue 36: a fault
fuzz run under load printed ``placeverify.console.Terminated: 15`` from an exit handler)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STOPPING = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def default_dispositions() -> None:
    """In the child: the signals at their defaults, whatever the suite was started under (a
    background job of a non-interactive shell ignores SIGINT, nohup ignores SIGHUP, and an ignored
    signal stays ignored across exec, which placeverify leaves so on purpose)."""
    for each in STOPPING:
        signal.signal(each, signal.SIG_DFL)

PROGRAM = textwrap.dedent("""
    import atexit, sys, time
    import placeverify.cli
    from placeverify.__main__ import run
    from placeverify.cli.exits import guarded
    from placeverify.console import stop_cleanly_on_signals
    from placeverify.diagnostics import ExitCode

    def body():
        stop_cleanly_on_signals()  # as replay and measure do
        def slow_handler():  # an exit handler still at work (a janitor, a pool shutting down)
            open(sys.argv[1], "w").close()
            time.sleep(20)
        atexit.register(slow_handler)
        print("the report")
        return ExitCode.OK

    placeverify.cli.main = lambda: guarded(body)  # the placeverify script, with this command
    run()
""")


@pytest.mark.parametrize(("name", "code"), [("SIGTERM", 143), ("SIGHUP", 129), ("SIGINT", 130)])
def test_a_signal_during_the_exit_handlers_ends_the_process_quietly(tmp_path: Path, name: str,
                                                                    code: int) -> None:
    ready = tmp_path / "in-exit-handlers"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PLACEVERIFY_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, str(ready)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_dispositions)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), "the exit handler never ran"
        started = time.monotonic()
        proc.send_signal(signal.Signals[name])
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert time.monotonic() - started < 10  # at once, not after the handler's 20 s
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert stdout == "the report\n"  # flushed before the handlers ran


def test_a_command_run_inside_another_program_leaves_its_signal_handlers_alone() -> None:
    """A library caller (a test runner, click's CliRunner) runs the command in its own process:
    its Ctrl-C stays Python's KeyboardInterrupt (the suite once skipped a test for this)."""
    from placeverify.cli.exits import guarded
    from placeverify.diagnostics import ExitCode

    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever
    try:                                                # the suite was started under
        with pytest.raises(SystemExit) as stop:
            guarded(lambda: ExitCode.OK)
        assert stop.value.code == 0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)
