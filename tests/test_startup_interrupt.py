"""A Ctrl-C while the command loads (before the command's own handler runs) is one line and
exit 130, as one during the work is (issue 36's fault campaign saw a KeyboardInterrupt traceback
from a SIGINT in the first ~0.3 s of any command)."""

from __future__ import annotations

import importlib.abc
import signal
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType

import pytest

import placeverify.__main__ as entry


class _InterruptedLoad(importlib.abc.MetaPathFinder):
    """Raises KeyboardInterrupt when ``placeverify.cli`` is looked up: the interrupt arrives in
    the middle of loading the command, deterministically."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if name == "placeverify.cli":
            raise KeyboardInterrupt
        return None


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """The script's run() ends by making SIGINT, SIGTERM and SIGHUP end the process at once
    (console.end_at_once_on_signals): in the test process that would outlive the test, and a
    later test of the same worker found SIGINT not Python's own handler (a fresh-clone run
    skipped test_solver_interrupt's finalizer test so). Each test puts back what was there."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


@pytest.fixture
def interrupted_load() -> Iterator[None]:
    saved = {k: v for k, v in sys.modules.items()
             if k == "placeverify.cli" or k.startswith("placeverify.cli.")}
    for k in saved:
        del sys.modules[k]
    finder = _InterruptedLoad()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(saved)


def test_an_interrupt_while_the_command_loads_is_exit_130(interrupted_load: None,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        entry.run()
    assert stop.value.code == 130
    err = capsys.readouterr().err
    assert err == "placeverify: interrupted\n"


def test_the_script_runs_the_command(capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["placeverify", "--version"])
    with pytest.raises(SystemExit) as stop:
        entry.run()
    assert stop.value.code == 0
    assert "placeverify" in capsys.readouterr().out
