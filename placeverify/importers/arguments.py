"""A Megatron-LM argument list (``--flag [values...]``, argparse style) with the position of
every word, and the launcher words (torchrun's ``--nproc-per-node``, ``--nnodes``) split off.

Each read marks its flag used, so the importer can report every flag it did not read.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import NamedTuple

from placeverify.diagnostics import Code, Source, Span
from placeverify.importers.common import Reader
from placeverify.importers.origins import Origin, Value
from placeverify.importers.shell import NAME_SEPARATOR, Script
from placeverify.importers.shell_values import Command, Word

LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "deepspeed")
_TRAINING = re.compile(r"(^|/)(pre)?train[^/]*\.py$")


class Arguments:
    """``--flag [values...]`` words with their positions; each read marks the flag used."""

    def __init__(self, reader: Reader, words: list[Word], source: Source) -> None:
        self.reader = reader
        self.source = source
        self.flags: dict[str, tuple[Word, list[Word]]] = {}
        self.used: set[str] = set()
        self._doubted: set[str] = set()  # flags whose "given only if" error is reported
        i = 0
        while i < len(words):
            word = words[i]
            if not word.text.startswith("--"):
                self._hidden(word)
                i += 1  # a positional word (the training script's own): not an argument
                continue
            name, eq, inline = word.text.partition("=")
            values: list[Word] = [replace(word, text=inline,
                                          name=_tail(word, len(name) + 1))] if eq else []
            i += 1
            while not eq and i < len(words) and not words[i].text.startswith("--"):
                if values:
                    self._hidden(words[i])
                values.append(words[i])
                i += 1
            if name in self.flags:
                reader.warning(f"{name} is given twice; the last one counts (argparse)",
                               self.origin(self.flags[name][0]), code=Code.DUPLICATE)
            self.flags[name] = (replace(word, text=name, unresolved=None), values)

    def _hidden(self, word: Word) -> None:
        """A word only the launch gives (``"$@"``, ``$EXTRA_ARGS``), standing where no flag's
        first value is: it may expand to flags of its own, which placeverify cannot see."""
        if word.unresolved and word.text.lstrip("\"'").startswith("$"):
            self.reader.warning(f"{word.text} is only known at launch ({word.unresolved}); flags "
                                "it may expand to are not read, and a placement flag among them "
                                "would be missed", self.origin(word), code=Code.NOT_STATIC)

    def origin(self, word: Word, key: str | None = None) -> Origin:
        return Origin(key or word.text, self.source, word.span)

    def has(self, name: str) -> bool:
        """Whether the flag is given; one given only under a test placeverify cannot decide is an
        error, at the test."""
        self.used.add(name)
        if name not in self.flags:
            return False
        word = self.flags[name][0]
        if word.maybe and name not in self._doubted:
            self._doubted.add(name)
            self._undecided(name, word.maybe, word.maybe_span, word.span)
        return True

    def _undecided(self, name: str, message: str, test: Span | None, span: Span | None) -> None:
        """An error about a value that depends on what the script cannot tell: once per
        undecided test (at ``test``), however many flags it decides."""
        origin = Origin(name, self.source, test or span)
        if test is None:
            self.reader.error(f"{name}: {message}", origin, code=Code.NOT_STATIC)
        else:
            self.reader.once(test, name, message, origin, Code.NOT_STATIC)

    def unresolved(self, name: str) -> Word | None:
        """The value word of ``name`` when it is given with a value that only running the
        script would give."""
        if name not in self.flags:
            return None
        values = self.flags[name][1]
        return values[0] if len(values) == 1 and values[0].unresolved else None

    def assumed_of(self, *names: str) -> list[str]:
        """The defaults taken in the words of these flags."""
        out: dict[str, None] = {}
        for name in names:
            if name in self.flags:
                word, values = self.flags[name]
                for w in (word, *values):
                    out.update(dict.fromkeys(w.assumed))
        return list(out)

    def assumed(self) -> list[str]:
        """The defaults taken for variables the launch may set, in the words of the flags read."""
        out: dict[str, None] = {}
        for name, (word, values) in self.flags.items():
            if name in self.used:
                for w in (word, *values):
                    out.update(dict.fromkeys(w.assumed))
        return list(out)

    def flag(self, name: str) -> Value | None:
        if not self.has(name):
            return None
        word, values = self.flags[name]
        if values and values[0].unresolved:
            self.reader.error(f"{name} takes no value, but {values[0].text} follows it, which "
                              f"may be any words: {values[0].unresolved}",
                              self.origin(values[0], name), code=Code.NOT_STATIC)
        elif values:
            self.reader.error(f"{name} takes no value", self.origin(values[0], name))
        return Value(True, self.origin(word))

    def text(self, name: str, fix: str = "write the value") -> Value | None:
        if not self.has(name):
            return None
        word, values = self.flags[name]
        doubt = next((v for v in values if v.maybe and not word.maybe), None)
        if doubt is not None:
            self._undecided(name, f"its value {doubt.text}: {doubt.maybe}", doubt.maybe_span,
                            doubt.span)
            return None
        if len(values) != 1:
            self.reader.error(f"{name} takes one value", self.origin(word))
            return None
        if values[0].unresolved:
            where = values[0].unresolved_span or values[0].span
            why = values[0].unresolved
            if " " not in why:  # only the variable's name (a test configuration's ${VAR})
                why += " is not assigned in this configuration (only running it would give the value)"
            self._undecided(name, f"{why}; {fix}", values[0].unresolved_span, where)
            return None
        return Value(values[0].text, Origin(name, self.source, word.span))

    def integer(self, name: str, default: int | None = None, low: int = 1,
                fix: str = "write the number") -> Value | None:
        v = self.text(name, fix)
        if v is None:
            return None if default is None else Value(default, Origin(f"{name} (default)",
                                                                      self.source))
        try:
            number = int(str(v.value))
        except ValueError:
            self.reader.error(f"{name} takes a whole number, not '{v.value}'", v.origin)
            return None
        if number < low:
            self.reader.error(f"{name} must be at least {low}, not {number}", v.origin)
            return None
        return Value(number, v.origin)

    def real(self, name: str, default: float) -> Value:
        v = self.text(name)
        if v is None:
            return Value(default, Origin(f"{name} (default)", self.source))
        try:
            return Value(float(str(v.value)), v.origin)
        except ValueError:
            self.reader.error(f"{name} takes a number, not '{v.value}'", v.origin)
            return Value(default, v.origin)


def _tail(word: Word, cut: int) -> str:
    """The file name (:attr:`Word.name`) of ``word`` without its first ``cut`` characters (the
    ``--flag=`` of an inline value)."""
    if NAME_SEPARATOR not in word.name:
        return word.name[cut:]
    return NAME_SEPARATOR.join(word.name.split(NAME_SEPARATOR)[cut:])


class Launch(NamedTuple):
    """The training command of a script, split: the words that start it (``torchrun ...``,
    with the command that ran it from a ``bash -c`` string first: ``srun ... sh -c``), the
    Python file it runs, that file's arguments, and whether a launcher (torchrun, ``python -m
    torch.distributed.run``, ``deepspeed``) starts it."""

    launcher: list[Word]
    program: Word | None
    arguments: list[Word]
    launched: bool


def split_launch(script: Script) -> Launch:
    """The training command is the first that runs a Python file under a launcher (torchrun,
    ``python -m torch.distributed.run``, the ``deepspeed`` launcher); else the first running a
    ``pretrain*.py`` / ``train*.py``; else the first running any Python file (a data preparation
    step before the launch is passed over). A script running no Python file is an argument
    file: every word of every command is an argument."""
    found: list[tuple[Command, int, bool]] = []
    for command in script.commands:
        texts = [w.text for w in command.words]
        py = next((i for i, t in enumerate(texts) if t.endswith(".py") and " " not in t), None)
        if py is None or texts[0] in ("echo", "printf"):
            continue
        launcher = any(t.endswith(LAUNCHERS) or t in LAUNCHERS for t in texts[:py])
        found.append((command, py, launcher))
    if found:
        command, py, launcher = next(
            (f for f in found if f[2]), None) or next(
            (f for f in found if _TRAINING.search(f[0].words[f[1]].text)), None) or found[0]
        words = list(command.words)
        return Launch([*command.via, *words[:py]], words[py], words[py + 1:], launcher)
    return Launch([], None, [w for c in script.commands for w in c.words], False)
