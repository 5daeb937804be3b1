"""What a launch script is given when it runs: its environment and its arguments.

``placeverify import/check --env NAME=VALUE --script-args "ARG ..."`` say them; the reader of
:mod:`placeverify.importers.shell` then takes ``$NAME``, ``$1``, ``$#``, ``"$@"`` and ``shift`` as
bash would with them, and decides the tests, ``case`` arms and loops that depend on them.
Without them, a value the script does not assign stays unknown, and the message says which option
gives it (:func:`not_assigned`, :func:`argument`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
GIVEN = -2  # the source offset of a character given on the command line (placed where it is used)
POSITIONAL = ("#", "@", "*")  # with $1, $2, ...: the script's arguments, as bash names them


@dataclass(frozen=True, slots=True)
class Inputs:
    """The environment variables (``--env``) and the arguments (``--script-args``; None: not
    given, so not known) a script is read with."""

    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] | None = None

    def describe(self) -> str:
        """The options as given, for the header of the imported text ('' without any)."""
        parts = [f"--env {name}={shlex.quote(value)}" for name, value in self.env]
        if self.args is not None:
            parts.append("--script-args " + shlex.quote(shlex.join(self.args)))
        return " ".join(parts)


NO_INPUTS = Inputs()


def parse_env(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``NAME=VALUE`` pairs (a later one for a name wins, as in ``env``); raises ValueError naming
    the text that is not one."""
    out: dict[str, str] = {}
    for text in texts:
        name, eq, value = text.partition("=")
        if not eq or not _NAME.fullmatch(name):
            raise ValueError(f"'{text}' is not NAME=VALUE (NAME: letters, digits and _, not "
                             "starting with a digit)")
        out[name] = value
    return tuple(out.items())


def parse_args(texts: Iterable[str]) -> tuple[str, ...]:
    """The script's arguments: each text split into words as a shell splits a command line
    (quotes group, nothing is expanded or run); raises ValueError for an unclosed quote."""
    words: list[str] = []
    for text in texts:
        try:
            words.extend(shlex.split(text))
        except ValueError:
            raise ValueError(f"cannot split '{text}' into words: a quote is never closed") from None
    return tuple(words)


def not_assigned(name: str) -> str:
    """Why ``$name`` (a variable the script does not assign) is not known, and what gives it."""
    return (f"${name} is not assigned in this script (only running it would give the value; "
            f"give --env {name}=VALUE)")


def argument(name: str) -> str:
    """Why ``$1`` / ``$#`` / ``$@`` is not known, and what gives it."""
    if name.isdigit():
        return (f"${name} is an argument of the script (only running it would give the value; "
                "give --script-args)")
    return f"${name} is set from the script's arguments when it runs (give --script-args)"


def shifted(values: dict[str, Any], count: int) -> bool:
    """``shift count`` on the positional parameters in ``values`` (``"@"`` holds them, a tuple):
    False when there are fewer than ``count`` (bash then leaves them and fails)."""
    current = values.get("@")
    assert isinstance(current, tuple)
    if count > len(current):
        return False
    for k in range(len(current)):
        values.pop(str(k + 1), None)
    rest = current[count:]
    values["@"] = values["*"] = rest
    for k, item in enumerate(rest):
        values[str(k + 1)] = item
    return True
