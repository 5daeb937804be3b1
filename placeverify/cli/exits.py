"""How a command ends: its exit code, and the message of any failure (never a traceback).

:data:`EXIT_CODES` is the table ``--help`` prints; :func:`guarded` runs a command's body and turns
every failure into a message and one of those codes.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

import click

from placeverify.console import Terminated, error_console, print_errors
from placeverify.diagnostics import ExitCode, PlaceError
from placeverify.files import WriteFailed

EXIT_CODES = """\b
Exit codes:
  0  every condition proved (or nothing to verify)
  1  a condition refuted (a counterexample was found); replay: not confirmed
  2  malformed or inconsistent input, or a usage error
  3  unknown: some condition neither proved nor refuted (never reported as proved);
     replay: unknown, or unconfirmed (run on a smaller mesh where Z3's verdict
     differs from the declared mesh's)
  4  a file is missing, unreadable or not a regular file
  5  replay/measure could not run (torch missing, a rank crashed or hung);
     check --plot: matplotlib missing (the plot extra)
  6  with --require-fit: a strategy does not fit (predicted total above device_memory)
  70 internal error (a bug in placeverify; please report it)
  129 stopped by SIGHUP, after stopping rank processes and removing temporary files
  130 stopped by SIGINT (Ctrl-C), the same way
  143 stopped by SIGTERM, the same way
"""

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
        error_console().print(f"Error: {error.format_message()}", markup=False)
        code = ExitCode.INPUT_ERROR
    except KeyboardInterrupt:
        error_console().print("placeverify: interrupted", markup=False)
        code = ExitCode.INTERRUPTED
    except Terminated as stop:
        error_console().print(f"placeverify: stopped by {signal.Signals(stop.signum).name}",
                              markup=False)
        code = stop.exit_code
    except BrokenPipeError:
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
