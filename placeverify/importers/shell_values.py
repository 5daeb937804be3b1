"""The values a launch script's reader keeps (:mod:`placeverify.importers.shell`): expanded
words and commands, values whose parts may be unknown (with why, and where an undecided test
decides them), the files the script writes, and the table of variables."""

from __future__ import annotations

from dataclasses import dataclass, field

from placeverify.diagnostics import Span


@dataclass(frozen=True, slots=True)
class Word:
    """One word of a command, after expansion. ``unresolved`` says why its value is not known
    (``unresolved_span``: where that is decided, when not at the word: an undecided test);
    ``maybe`` says why the word is given only under a test placeverify cannot decide;
    ``assumed`` names the defaults taken for variables the launch may set."""

    text: str
    span: Span | None
    unresolved: str | None = None
    unresolved_span: Span | None = None
    maybe: str | None = None
    maybe_span: Span | None = None
    assumed: tuple[str, ...] = ()
    name: str = ""  # the word as a file name: see :func:`_file_name`


@dataclass(frozen=True, slots=True)
class Command:
    words: tuple[Word, ...]
    line: int
    # the command that ran this one's ``bash -c`` string, up to the shell (``srun -l ... sh -c``)
    via: tuple[Word, ...] = ()


@dataclass(frozen=True, slots=True)
class Sbatch:
    """One whole-number option of the script's ``#SBATCH`` lines (its long name) and where."""

    option: str
    value: int
    span: Span


@dataclass(frozen=True, slots=True)
class Unknown:
    """Why a value is not known from the text; ``at``: the offsets of an undecided test."""

    reason: str
    at: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Doubt:
    """An undecided test (or a loop, a case): what it is, why undecided, where."""

    what: str
    why: str
    at: tuple[int, int]

    def unknown(self, name: str) -> Unknown:
        return Unknown(f"${name} depends on {self.what}, which placeverify cannot decide "
                       f"({self.why})", self.at)

    def given_only_if(self) -> Unknown:
        return Unknown(f"it is given only if {self.what} holds, which placeverify cannot "
                       f"decide ({self.why})", self.at)


Char = tuple[str, int, Unknown | None]  # a character, its source offset (-1: none), and why it
# stands for a value not known (the text of ``$(...)`` or ``$X`` where it is used)


@dataclass(frozen=True, slots=True)
class Text:
    """An expanded value; ``whole``: why the whole value is not known (a variable the branches
    of an undecided test leave different)."""

    chars: tuple[Char, ...] = ()
    whole: Unknown | None = None
    maybe: Unknown | None = None
    assumed: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return "".join(c for c, _, _ in self.chars)

    def problem(self) -> Unknown | None:
        return self.whole or next((u for _, _, u in self.chars if u is not None), None)

    def key(self) -> tuple[str, Unknown | None, Unknown | None]:
        return self.text, self.problem(), self.maybe


Value = Text | tuple[Text, ...] | None  # a scalar, an array, or unset by the script


@dataclass(frozen=True, slots=True)
class Written:
    """A file the script writes from a here-document: its text (characters with their source
    offsets) and the line of the command."""

    text: Text
    line: int
    maybe: Unknown | None = None
    by: str | None = None  # a command placeverify does not run wrote it (``sed ... > FILE``)


@dataclass
class State:
    values: dict[str, Value] = field(default_factory=dict)
    exited: bool = False

    def copy(self) -> State:
        return State(dict(self.values), self.exited)


@dataclass(frozen=True, slots=True)
class Piece:
    chars: tuple[Char, ...]
    split: bool  # from an unquoted expansion: blanks separate words
    maybe: Unknown | None = None
    assumed: tuple[str, ...] = ()


BREAK = Piece((), False)  # between the items of "${A[@]}": a word ends
