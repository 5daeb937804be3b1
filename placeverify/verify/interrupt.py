"""Ctrl-C during verification is never lost.

Two ways a SIGINT used to vanish (issue 36, item 3; seen in a fresh-clone suite run under load):
Z3 puts its own SIGINT handler in place of Python's for each call (its ``ctrl_c`` parameter), and
a call it cancels that is not a solver query (a simplification, a tactic) returns as if nothing
happened; and Python raises KeyboardInterrupt at the next bytecode, which may be inside a
finalizer (z3's ``AstRef.__del__``), where it is printed as ignored and dropped.

So Z3 leaves SIGINT to Python (:func:`leave_ctrl_c_to_python`: the interrupt is raised when the
running call returns, within its time limit), and during a verification SIGINT also sets a flag
(:func:`handling`) that every budget checkpoint and every query reads (:func:`raise_if_pending`):
an interrupt swallowed where it was raised is raised again at the next one. One raised inside a
finalizer is not printed either (:func:`_quiet_unraisable`, a CI run showed z3's ``__del__``
traceback on stderr before the one-line ``placeverify: interrupted``): it is pending, not lost.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_pending = False


def leave_ctrl_c_to_python() -> None:
    """Z3 installs no SIGINT handler of its own (a global parameter: every context after this)."""
    import z3  # the verify layer's solver; deferred so that this module costs nothing to import

    z3.set_param("ctrl_c", False)


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _pending
    _pending = True
    raise KeyboardInterrupt


def _quiet_unraisable(previous: object) -> object:
    """A ``sys.unraisablehook`` that drops a KeyboardInterrupt raised where Python cannot
    propagate it (a finalizer), since :data:`_pending` raises it again; any other goes on to
    ``previous``."""

    def hook(unraisable: object) -> None:
        if _pending and getattr(unraisable, "exc_type", None) is KeyboardInterrupt:
            return
        previous(unraisable)  # type: ignore[operator]

    return hook


@contextmanager
def handling() -> Iterator[None]:
    """Within the block, a SIGINT raises KeyboardInterrupt and is remembered until raised again
    at a checkpoint. Only in the main thread and only over Python's own handler: a caller that
    set its own keeps it."""
    global _pending
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    _pending = False
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _quiet_unraisable(previous_hook)  # type: ignore[assignment]
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = previous_hook
        _pending = False


def raise_if_pending() -> None:
    """Raise KeyboardInterrupt if a SIGINT arrived since :func:`handling` began and its own
    raise was lost."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt
