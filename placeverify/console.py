"""Terminal helpers shared by the ``placeverify`` commands: consoles and their width, error
printing, exit codes, progress, and what a termination signal does.

Both CLIs (:mod:`placeverify.cli` and :mod:`placeverify.prove.cli`) and the comparison table print
diagnostics and combine per-file outcomes into one exit code the same way; the codes and their
order are documented in ``placeverify --help`` (:data:`placeverify.cli.exits.EXITS`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import click
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.files import write_atomically as write_atomically  # the commands' one writer
from placeverify.verdicts import Verdict

PRIORITY = [ExitCode.INTERNAL_ERROR, ExitCode.READ_ERROR, ExitCode.INPUT_ERROR,
            ExitCode.BACKEND_ERROR, ExitCode.REFUTED, ExitCode.DOES_NOT_FIT, ExitCode.UNKNOWN,
            ExitCode.OK]


def worst(codes: Iterable[ExitCode]) -> ExitCode:
    """The exit code of several files: the first of :data:`PRIORITY` that any of them has."""
    codes = list(codes)
    for code in PRIORITY:
        if code in codes:
            return code
    return ExitCode.OK


def verdict_exit(verdict: Verdict) -> ExitCode:
    """The exit code of a verdict: proved 0, refuted 1, unknown 3."""
    return {Verdict.PROVED: ExitCode.OK, Verdict.REFUTED: ExitCode.REFUTED,
            Verdict.UNKNOWN: ExitCode.UNKNOWN}[verdict]


DEFAULT_WIDTH = 120  # piped output without COLUMNS
MIN_WIDTH = 20


def output_width(explicit: int | None = None) -> int:
    """The columns a table may use: ``explicit`` (``--width``), else ``COLUMNS`` (also when
    standard output is not a terminal: CI logs and pagers set it), else the terminal's width,
    else 120; at least 20."""
    if explicit is not None:
        return max(MIN_WIDTH, explicit)
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return max(MIN_WIDTH, int(columns))
    if sys.stdout.isatty():
        return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)
    return DEFAULT_WIDTH


def reader_gone() -> None:
    """The reader of standard output went away (``placeverify check f | head -1``): what is
    still to be written goes to /dev/null, so that the command ends as it would have, with its
    own exit code, and the interpreter's last flush fails on nothing."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class Output(Console):
    """Standard output: a closed pipe silences it (:func:`reader_gone`); rich's own console
    would exit 1 there, whatever the command's verdict."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        reader_gone()


def echo(text: str, nl: bool = True) -> None:
    """``text`` on standard output, to a reader that may have gone (:func:`reader_gone`)."""
    try:
        click.echo(text, nl=nl)
    except BrokenPipeError:
        reader_gone()


def console(width: int | None = None) -> Console:
    """Standard output, :func:`output_width` columns wide (``--width``, else ``COLUMNS`` also
    when piped, else the terminal's width, else 120)."""
    return Output(width=output_width(width), highlight=False, soft_wrap=False, markup=False,
                  emoji=False)


def print_table(out: Console, table: Table) -> None:
    """``table`` when it fits ``out``'s width without cutting a word, else the same cells as a
    list: one block per row, one ``header: value`` line per cell (wrapped at the width). Rich
    would otherwise shorten the cells that do not fit with an ellipsis, losing their value."""
    for column in table.columns:
        column.overflow = "ellipsis"  # measured so, a cell's minimum is its longest word
        column.no_wrap = False
    # measured at a width that clamps nothing (Measurement.get clamps the minimum to it)
    fits = Measurement.get(out, out.options.update_width(10**6), table).minimum <= out.width
    for column in table.columns:
        column.overflow = "fold"  # never an ellipsis, whatever rich decides
    if fits:
        out.print(table)
        return
    headers = [_plain(column.header) or f"column {i + 1}" for i, column in enumerate(table.columns)]
    cells = [[_plain(cell) for cell in column.cells] for column in table.columns]
    for row in range(table.row_count):
        values = [(headers[i], cells[i][row]) for i in range(len(headers))]
        first = True
        for header, value in values:
            if not value.strip():
                continue
            bullet = "- " if first else "  "
            first = False
            out.print(Text(f"  {bullet}{header}: {' '.join(value.split())}"), overflow="fold")
    out.print()


def _plain(cell: object) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return cell if isinstance(cell, str) else str(cell)


def error_console() -> Console:
    """Standard error, for diagnostics: the terminal's width, or 120 columns when piped."""
    return stderr_console(None if sys.stderr.isatty() else 120)


def stderr_console(width: int | None = None) -> Console:
    """Standard error, text as written: no markup, no highlighting, and no emoji codes (rich
    would print a diagnostic's ``path:100:5`` as a 💯 between the path and the column)."""
    return Console(stderr=True, width=width, highlight=False, soft_wrap=True, markup=False,
                   emoji=False)


def print_errors(error: PlaceError, *, pretty: bool = True) -> None:
    """Every diagnostic of ``error`` on standard error, with its source line when ``pretty``."""
    err = error_console()
    for diagnostic in error.diagnostics:
        err.print(diagnostic.render(error.source, pretty=pretty), markup=False, emoji=False)


def print_failure(message: str, *notes: str) -> None:
    """An error with no position in a file, as every command says it: ``placeverify: error:
    message``, then ``placeverify: note: ...`` for each note."""
    err = error_console()
    err.print(f"placeverify: error: {message}", markup=False)
    for note in notes:
        err.print(f"placeverify: note: {note}", markup=False)


class Terminated(BaseException):
    """Raised in the main thread by a SIGTERM or SIGHUP (:func:`stop_cleanly_on_signals`), so that
    every ``finally`` on the way out runs: rank processes are killed, temporary folders removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.exit_code = ExitCode.HANGUP if signum == signal.SIGHUP else ExitCode.TERMINATED


def _terminate(signum: int, _frame: FrameType | None) -> None:
    # Later signals are ignored: they would interrupt the clean-up the first one started.
    for each in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(each, signal.SIG_IGN)
    raise Terminated(signum)


def stop_cleanly_on_signals() -> None:
    """SIGTERM and SIGHUP raise :class:`Terminated` instead of killing the process on the spot (the
    default), as Ctrl-C raises ``KeyboardInterrupt``; the commands exit 143 and 129 (130 for
    SIGINT) after cleaning up. Installed by the commands that start processes and temporary
    folders (``replay``, ``measure``, ``check --replay``) when they start them, and left so:
    a Python handler runs only between two bytecodes, so a command with nothing to clean up
    keeps the default, which ends it at once even inside a long solver query. Only the main
    thread can install handlers; elsewhere (a library caller's worker thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return
    for each in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(each) is signal.SIG_DFL:  # an ignored SIGHUP (nohup) stays ignored
            signal.signal(each, _terminate)


SIGNAL_EXITS = ((signal.SIGTERM, ExitCode.TERMINATED), (signal.SIGHUP, ExitCode.HANGUP),
                (signal.SIGINT, ExitCode.INTERRUPTED))


def end_at_once_on_signals() -> None:
    """From here the process only runs its exit handlers (multiprocessing's, the janitor's); called
    by the ``placeverify`` script (``placeverify.__main__``) once the command has returned: a
    SIGTERM, SIGHUP or Ctrl-C now ends it at once with that signal's exit code, instead of
    raising inside a handler (Python prints that as "Exception ignored in atexit callback" and a
    traceback; a fault fuzz run under load found one). What the handlers had still to remove, the
    janitor removes: it hears the end of its pipe without ``.``. Only the handlers placeverify
    raises from are replaced: a default SIGTERM ends the process on its own, an ignored one
    (nohup) stays ignored. Output is flushed first, since ``os._exit`` flushes nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    for signum, _code in SIGNAL_EXITS:
        if signal.getsignal(signum) in (_terminate, signal.default_int_handler):
            signal.signal(signum, _end_now)


def _end_now(signum: int, _frame: FrameType | None) -> None:
    os._exit(int(dict(SIGNAL_EXITS)[signal.Signals(signum)]))


class Progress:
    """Progress of long work on standard error, so that CI logs show it too.

    On a terminal, a task (a replay, a measurement) is a transient status line, and the items of
    a loop over files show as one only when standard output is not the terminal (the reports
    are the progress otherwise). Off a terminal, plain lines: ``progress: prove 3/12
    proofs/zero.rule`` per item of a loop over more than one, ``progress: replaying ...`` per
    step of a task. ``quiet`` (``--quiet``) prints nothing.
    """

    PREFIX = "progress: "

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.lines = not sys.stderr.isatty()
        self._status: Any = None

    def _line(self, text: str) -> None:
        sys.stderr.write(self.PREFIX + text + "\n")
        sys.stderr.flush()

    def item(self, command: str, index: int, total: int, name: str) -> None:
        """Item ``index`` (1-based) of ``total`` is starting; silent for a single item."""
        if self.quiet or total < 2:
            return
        text = f"{command} {index}/{total} {name}"
        if self.lines:
            self._line(text)
        elif not sys.stdout.isatty():
            if self._status is None:
                self._status = error_console().status(text)
                self._status.start()
            else:
                self._status.update(text)

    def done(self) -> None:
        """The loop is over: the transient status line goes."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    @contextmanager
    def task(self, text: str) -> Iterator[Callable[[str], None]]:
        """A long task: ``text`` now, then each message given to the function it yields."""
        if self.quiet:
            yield lambda _message: None
        elif self.lines:
            self._line(text)
            yield self._line
        else:
            with error_console().status(text) as status:
                yield status.update
