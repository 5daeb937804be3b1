"""How a command ends: its exit code, and the message of any failure (never a traceback).

:data:`EXITS` is the one table of exit codes: what each means in general (``placeverify --help``)
and for each command that can return it (that command's ``--help``, from :func:`epilog`, with
one example). :func:`guarded` runs a command's body and turns every failure into a message and
one of those codes; :class:`Group` does the same for click's own errors (an unknown option, a
missing argument, a bad value): ``placeverify: error: ...``, a hint, exit 2.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import click

from placeverify.console import (
    Terminated,
    error_console,
    print_errors,
    print_failure,
    reader_gone,
)
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.files import WriteFailed

COMMANDS = ("check", "compare", "prove", "replay", "measure", "search", "import")
RUNS_RANKS = ("check", "replay", "measure")  # those that stop rank processes on SIGHUP/SIGTERM


@dataclass(frozen=True)
class Exit:
    """One exit code: its meaning in general, and for each command that can return it (``""``:
    the general meaning)."""

    code: ExitCode
    meaning: str  # a line break continues the meaning on an indented line
    commands: Mapping[str, str] = field(default_factory=lambda: dict.fromkeys(COMMANDS, ""))


def _only(names: Sequence[str], meaning: str = "") -> dict[str, str]:
    return dict.fromkeys(names, meaning)


_TORCH = "could not run (torch missing, a rank crashed or hung)"
_PLOT = "--plot: matplotlib missing (the plot extra)"
_FIT = "with --require-fit: a strategy does not fit (predicted total above device_memory)"
EXITS: tuple[Exit, ...] = (
    Exit(ExitCode.OK, "every condition proved (or nothing to verify)", {
        "check": "", "compare": "every file loaded (with --verify: every condition proved)",
        "prove": "every rule holds as stated", "replay": "the verifier's verdict confirmed",
        "measure": "the measurement ran (whatever the ratios)",
        "search": "a layout fits and is proved (every layout shown is both)",
        "import": "the configuration was imported"}),
    Exit(ExitCode.REFUTED, "a condition refuted (a counterexample was found); replay: not confirmed", {
        "check": "a condition refuted (a counterexample was found)",
        "compare": "with --verify: a condition refuted",
        "prove": "a claim came out opposite to its rule",
        "replay": "not confirmed (the run, or its control, disagrees with Z3)"}),
    Exit(ExitCode.INPUT_ERROR, "malformed or inconsistent input, or a usage error", {
        **_only(COMMANDS),
        "search": "malformed or inconsistent input, a usage error, or no legal layout\n"
                  "(the divisibility that failed is named)"}),
    Exit(ExitCode.UNKNOWN, "unknown: some condition neither proved nor refuted (never reported as "
         "proved);\nreplay: unknown, or unconfirmed (run on a smaller mesh where Z3's verdict\n"
         "differs from the declared mesh's)", {
             "check": "unknown: some condition neither proved nor refuted (never reported as proved)",
             "compare": "with --verify: some condition neither proved nor refuted",
             "prove": "a claim is unknown (never reported as proved)",
             "replay": "unknown, or unconfirmed (run on a smaller mesh where Z3's verdict\n"
                       "differs from the declared mesh's)",
             "search": "layouts fit but none is proved (each refuted or unknown)"}),
    Exit(ExitCode.READ_ERROR, "a file is missing, unreadable or not a regular file"),
    Exit(ExitCode.BACKEND_ERROR, "replay/measure could not run (torch missing, a rank crashed or "
         "hung);\ncheck --plot: matplotlib missing (the plot extra)", {
             "check": f"--replay {_TORCH};\n{_PLOT}", "replay": _TORCH, "measure": _TORCH,
             "search": _PLOT}),
    Exit(ExitCode.DOES_NOT_FIT, _FIT, {
        "check": "", "compare": "", "search": "no layout fits the device at its predicted peak"}),
    Exit(ExitCode.INTERNAL_ERROR, "internal error (a bug in placeverify; please report it)"),
    Exit(ExitCode.HANGUP, "stopped by SIGHUP, after stopping rank processes and removing temporary "
         "files", _only(RUNS_RANKS)),
    Exit(ExitCode.INTERRUPTED, "stopped by SIGINT (Ctrl-C), the same way", {
        **_only(COMMANDS, "stopped by SIGINT (Ctrl-C)"), **_only(RUNS_RANKS, "")}),
    Exit(ExitCode.TERMINATED, "stopped by SIGTERM, the same way", _only(RUNS_RANKS)),
)

EXAMPLES: Mapping[str, tuple[str, ...]] = {
    "check": ("placeverify check examples/zero-paper/zero3.place",),
    "compare": ("placeverify compare examples/zero-paper/*.place",),
    "prove": ("placeverify prove proofs/",),
    "replay": ("placeverify check --trace t.json examples/bugs/missing-allreduce.place",
               "placeverify replay t.json"),
    "measure": ("placeverify measure examples/measure/tp.place",),
    "search": ("placeverify search --model llama3_70b --device h100_sxm --devices 1024 "
               "--batch-tokens 16777216",),
    "import": ("placeverify import tests/importers/llama3-70b-zero2-offload.json --world 64 \\",
               "    --model tests/importers/llama3-70b-config.json --set model.seq=8192 "
               "-o zero2.place"),
}


def codes(command: str | None = None) -> list[ExitCode]:
    """The exit codes ``command`` can return (every code without one)."""
    return [e.code for e in EXITS if command is None or command in e.commands]


def _table(command: str | None) -> str:
    lines = ["\b", "Exit codes:"]
    for e in EXITS:
        if command is not None and command not in e.commands:
            continue
        meaning = (e.commands[command] if command is not None else "") or e.meaning
        first, *rest = meaning.split("\n")
        lines.append(f"  {int(e.code):<2} {first}")
        lines.extend(f"     {line}" for line in rest)
    return "\n".join(lines) + "\n"


def epilog(command: str | None = None) -> str:
    """The ``--help`` epilog of ``command`` (of the group without one): the exit codes it can
    return and, for a command, one example."""
    if command is None:
        return _table(None)
    example = "\n".join(f"  {line}" for line in EXAMPLES[command])
    return f"{_table(command)}\n\b\nExample:\n{example}\n"


EXIT_CODES = epilog()  # the whole table, as ``placeverify --help`` prints it


def _sentence(text: str) -> str:
    """click's 'No such option: --x.' as placeverify says it: 'no such option: --x'."""
    text = text.strip().removesuffix(".")
    if text[:2].istitle() and not text[:2].isupper():
        text = text[0].lower() + text[1:]
    return text


def print_usage_error(error: click.UsageError) -> None:
    """A usage error, and where to look: ``placeverify: note: try 'placeverify CMD --help'``."""
    ctx = error.ctx or click.get_current_context(silent=True)  # a command's own usage errors
    where = ctx.command_path if ctx is not None else "placeverify"
    print_failure(_sentence(error.format_message()), f"try '{where} --help'")


class Group(click.Group):
    """The ``placeverify`` group: click's own errors (raised before a command's body runs) are
    printed as placeverify's (:func:`print_usage_error`, exit 2), never as click's
    ``Usage: ... Error: ...`` block; the program is ``placeverify`` however it was started."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:  # a caller that handles click's exceptions itself
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        sys.unraisablehook = interrupt_after_finalizer(sys.unraisablehook)
        try:
            code = super().main(args, prog_name or "placeverify", complete_var,
                                standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as error:
            error.show()  # the help text, as with --help, but exit 2
            code = ExitCode.INPUT_ERROR
        except click.UsageError as error:
            print_usage_error(error)
            code = ExitCode.INPUT_ERROR
        except click.ClickException as error:
            print_failure(_sentence(error.format_message()))
            code = error.exit_code
        except click.Abort:
            error_console().print("placeverify: interrupted", markup=False)
            quiet_teardown()
            keep_the_exit_code()
            code = ExitCode.INTERRUPTED
        except BrokenPipeError:  # help into a closed pipe
            reader_gone()
            code = ExitCode.OK
        sys.exit(int(code or 0))


def interrupt_after_finalizer(previous: Callable[[Any], object]) -> Callable[[Any], None]:
    """The command's ``sys.unraisablehook``: a Ctrl-C whose KeyboardInterrupt Python raised inside
    a finalizer (z3's ``AstRef.__del__``, seen in CI under load) cannot propagate from there, and
    Python would print it with a traceback and drop it. It is raised again instead: a moment
    later a thread interrupts the main thread (``_thread.interrupt_main``), whose KeyboardInterrupt
    then arrives outside the finalizer (one that lands in a finalizer again comes back here); the
    command then exits 130 with its one line. Any other unraisable goes to ``previous``."""

    def hook(unraisable: Any) -> None:
        if getattr(unraisable, "exc_type", None) is KeyboardInterrupt:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                again = threading.Timer(0.01, _thread.interrupt_main)
                again.daemon = True
                again.start()
            return
        previous(unraisable)

    return hook


def keep_the_exit_code() -> None:
    """After a Ctrl-C the command has handled, exit 130, not by SIGINT. CPython remembers a
    KeyboardInterrupt that escaped code it ran from a string (``exec(text)``: dataclasses and
    namedtuple build their methods so while a module is imported) and, at the end of ``python
    -m``, kills the process with SIGINT whatever exit code it chose (``Py_RunMain``: -2 to a
    caller's ``wait``; a fresh-clone run beside a CPU hog saw it, where a Ctrl-C 1 s in landed in
    the import). Running any string resets that memory; this one is empty and constant."""
    exec("")


def quiet_teardown() -> None:
    """After the one line that says a signal stopped the command: an object the signal left half
    built (a solver context interrupted in its constructor, in a fuzz run: "Exception ignored
    in Context.__del__ ... no attribute 'owner'") is finalized as the process exits, and its
    finalizer has nothing to tell the user."""
    sys.unraisablehook = lambda unraisable: None


def guarded(run: Callable[[], ExitCode]) -> NoReturn:
    """Run a command body; turn every failure into a message and an exit code, never a traceback."""
    try:
        code = run()
    except PlaceError as error:
        print_errors(error)
        code = error.exit_code
    except WriteFailed as failed:  # a full disk, a folder at the path: exit 4, nothing left
        print_errors(failed.error())
        code = ExitCode.READ_ERROR
    except click.UsageError as error:
        print_usage_error(error)
        code = ExitCode.INPUT_ERROR
    except KeyboardInterrupt:
        error_console().print("placeverify: interrupted", markup=False)
        quiet_teardown()
        keep_the_exit_code()
        code = ExitCode.INTERRUPTED
    except Terminated as stop:
        error_console().print(f"placeverify: stopped by {signal.Signals(stop.signum).name}",
                              markup=False)
        quiet_teardown()
        code = stop.exit_code
    except BrokenPipeError:  # a writer outside the console's and echo's care
        reader_gone()
        code = ExitCode.OK
    except Exception as error:  # a bug: say so plainly, keep the traceback for --debug
        if os.environ.get("PLACEVERIFY_DEBUG"):
            raise
        error_console().print(
            f"placeverify: internal error: {type(error).__name__}: {error}\n"
            "This is a bug in placeverify. Rerun with PLACEVERIFY_DEBUG=1 for the traceback.",
            markup=False)
        code = ExitCode.INTERNAL_ERROR
    sys.exit(int(code))
