"""``python -m placeverify`` and the ``placeverify`` script.

Loading the command takes a few hundred milliseconds; a Ctrl-C in that window, before the
command's own handler runs, is the same one-line ``placeverify: interrupted`` and exit 130 as
one during the work, never a traceback. Once the command has its exit code, a signal during the
exit handlers ends the process at once (:func:`placeverify.console.end_at_once_on_signals`):
installed here, in the process that runs the script, never by a library caller of the command.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # diagnostics.ExitCode.INTERRUPTED, not imported: the window is the import


def run() -> None:
    try:
        from placeverify.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("placeverify: interrupted\n")
        sys.unraisablehook = lambda unraisable: None  # what the signal left half built
        exec("")  # exit 130, not by SIGINT: placeverify.cli.exits.keep_the_exit_code
        raise SystemExit(INTERRUPTED) from None
    try:
        main()
    finally:  # the command has its exit code; only the exit handlers are left to run
        from placeverify.console import end_at_once_on_signals

        end_at_once_on_signals()


if __name__ == "__main__":
    run()
