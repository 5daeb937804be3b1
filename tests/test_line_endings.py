"""Line endings: '\\n', '\\r\\n' and a lone '\\r' are all line ends (issue 36, item 1).

With a lone '\\r' read as whitespace, a ``#`` comment ran on to the end of the file, every statement
after it was dropped without a word, and a written step that is refuted was replaced by the
canonical step and proved. Here every bundled example is read with each ending and must

- account for every line of code: each line that holds anything but a comment lies inside the
  span of a parsed statement (lines found by Python's own universal-newline splitting, comments
  stripped by a scanner of this file, not by the grammar);
- lower every step statement: each statement of a written step reaches the IR with its span;
- get the verdicts, obligation by obligation with their lines, of its '\\n' reading.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from placeverify.diagnostics import PlaceError, Span
from placeverify.ir.step import Backward
from placeverify.ir.strategy import Strategy
from placeverify.lower import load, load_text
from placeverify.syntax import ast
from placeverify.syntax.parser import parse_text
from placeverify.verify import verify
from tests.conftest import EXAMPLES

ENDINGS = {"lf": "\n", "crlf": "\r\n", "cr": "\r"}
FILES = sorted(EXAMPLES.rglob("*.place"))
_CODE = re.compile(r'"(?:[^"\\]|\\.)*"|#.*|[^"#]+')


def with_ending(text: str, ending: str) -> str:
    return "".join(line + ending for line in text.splitlines())


def code_lines(text: str) -> set[int]:
    """The 1-based lines that hold code (anything but blanks and a comment), by universal newlines."""
    lines = set()
    for number, line in enumerate(text.splitlines(), 1):
        code = "".join(m.group(0) for m in _CODE.finditer(line) if not m.group(0).startswith("#"))
        if code.strip():
            lines.add(number)
    return lines


def covered(spans: list[Span]) -> set[int]:
    return {line for s in spans for line in range(s.line, s.end_line + 1)}


def step_items(items: tuple[ast.StepItem, ...]) -> list[ast.StepItem]:
    """The leaf statements of a step (the bodies of 'each microbatch' and 'on microbatch' opened)."""
    out: list[ast.StepItem] = []
    for item in items:
        if isinstance(item, (ast.EachMicrobatch, ast.OnMicrobatch)):
            out.extend(step_items(item.items))
        else:
            out.append(item)
    return out


def lowered_spans(strategy: Strategy) -> set[Span]:
    step = strategy.step
    gathers = {op.gather.span for op in step.ops() if isinstance(op, Backward) and op.gather}
    return {op.span for op in step.ops()} | {w.span for w in step.waits} | {s.span for s in step.seeds} \
        | gathers


def read(path: Path, ending: str) -> str:
    return with_ending(path.read_text(encoding="utf-8"), ending)


@pytest.mark.parametrize("ending", sorted(ENDINGS))
@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_line_of_code_is_a_parsed_statement(path: Path, ending: str) -> None:
    text = read(path, ENDINGS[ending])
    file = parse_text(text, str(path))
    spans = [s.span for s in file.statements]
    assert code_lines(text) <= covered(spans)
    statements = len(file.statements)
    assert statements == len(parse_text(read(path, "\n")).statements)


@pytest.mark.parametrize("ending", sorted(ENDINGS))
@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_step_statement_is_lowered_and_verdicts_do_not_depend_on_endings(
        path: Path, ending: str) -> None:
    text = read(path, ENDINGS[ending])
    steps = [s for s in parse_text(text).statements if isinstance(s, ast.StepStmt)]
    strategy = load_text(text, str(path))
    assert strategy.step.canonical is (not steps)
    written = [i for s in steps for i in step_items(s.items) if not isinstance(i, ast.MicrobatchesStmt)]
    spans = lowered_spans(strategy)
    missing = [i for i in written if not any(_inside(sp, i.span) for sp in spans)]
    assert missing == []
    ours = verify(strategy).obligations
    reference = verify(load_text(read(path, "\n"), str(path))).obligations
    assert [(o.condition, o.claim, o.verdict, o.span) for o in ours] == \
        [(o.condition, o.claim, o.verdict, o.span) for o in reference]


def _inside(inner: Span | None, outer: Span) -> bool:
    if inner is None:
        return False
    return (outer.line, outer.column) <= (inner.line, inner.column) and \
        (inner.end_line, inner.end_column) <= (outer.end_line, outer.end_column)


def test_a_refuted_step_stays_refuted_with_cr_endings(tmp_path: Path) -> None:
    """The issue's case: the header comment of a bug file swallowed its whole step."""
    body = [line for line in (EXAMPLES / "bugs" / "ga-token-normalisation.place").read_text().splitlines()
            if not line.startswith("#")]
    for name, ending in ENDINGS.items():
        path = tmp_path / f"{name}.place"
        path.write_bytes("".join(line + ending for line in body).encode())
        strategy = load(str(path))
        assert not strategy.step.canonical, name
        assert verify(strategy).verdicts()["gradient_integrity"] == "refuted", name


def test_errors_point_at_the_same_line_and_column_with_every_ending() -> None:
    bad = "# a comment\nmodel { params = 7.5e9 }  # another\nmesh { dp = 8 }\nplace zero3 over dq\n"
    shown = set()
    for ending in ENDINGS.values():
        with pytest.raises(PlaceError) as raised:
            load_text(bad.replace("\n", ending), "x.place")
        shown.add(str(raised.value))
    assert len(shown) == 1
    (message,) = shown
    assert message.startswith("x.place:4:18: error:")
    assert "   4 | place zero3 over dq\n" in message


def test_a_string_does_not_run_past_a_lone_cr() -> None:
    with pytest.raises(PlaceError) as raised:
        load_text('strategy "open\rmodel { params = 1e9 }\rmesh { dp = 2 }\rplace ddp over dp\r', "s.place")
    assert str(raised.value).startswith("s.place:1:")


def test_a_bad_byte_is_located_with_cr_endings(tmp_path: Path) -> None:
    path = tmp_path / "bad.place"
    path.write_bytes(b"model { params = 1e9 }\rmesh { dp = 2 }\r\nplace \xff ddp over dp\r")
    with pytest.raises(PlaceError) as raised:
        load(str(path))
    assert str(raised.value).startswith(f"{path}:3:7: error: not a text file")
