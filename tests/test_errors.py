"""Golden tests of every class of bad input (issue 2, section 5).

Each ``tests/errors/NAME.place`` is checked with ``placeverify check NAME.place`` (run from that
folder) and must print exactly ``NAME.err`` on stderr, nothing on stdout, and exit with 2. The
expected files are the product: review every change to them by eye. To regenerate them after a
deliberate change of wording::

    PLACEVERIFY_UPDATE_GOLDENS=1 .venv/bin/python -m pytest tests/test_errors.py

Inputs that cannot live in the repository (a 10 MB file, a missing or unreadable path, a folder)
are built in a temporary folder by the tests at the bottom, with their expected text inline.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from placeverify.cli import main
from placeverify.diagnostics import Code, ExitCode, PlaceError
from placeverify.lower import load, load_text
from placeverify.syntax.source import MAX_FILE_BYTES

GOLDEN = Path(__file__).parent / "errors"
CASES = sorted(GOLDEN.glob("*.place"))
UPDATE = os.environ.get("PLACEVERIFY_UPDATE_GOLDENS") == "1"

# Every code a .place file can earn; 'read' and 'too-large' are tested below (they need files the
# repository cannot hold). Warnings and the codes of other commands are not errors of a file.
FILE_ERROR_CODES = {Code.SYNTAX, Code.EMPTY_FILE, Code.NOT_TEXT, Code.TOO_DEEP, Code.UNKNOWN_NAME,
                    Code.DUPLICATE, Code.BAD_VALUE, Code.NOT_DIVISIBLE, Code.WORLD_MISMATCH,
                    Code.MISSING, Code.CONFLICT}


def check(*args: str) -> tuple[int, str, str]:
    """``placeverify check ARGS`` in this process: (exit code, stdout, stderr)."""
    result = CliRunner().invoke(main, ["check", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_golden_cases_exist() -> None:
    assert len(CASES) >= 60
    for case in CASES:
        assert case.with_suffix(".err").exists() or UPDATE, f"{case.name} has no .err file"
    orphans = {p.stem for p in GOLDEN.glob("*.err")} - {p.stem for p in CASES}
    assert not orphans, f".err files without a .place: {sorted(orphans)}"


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_golden(case: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(GOLDEN)
    code, out, err = check(case.name)
    expected_file = case.with_suffix(".err")
    if UPDATE:
        expected_file.write_text(err, encoding="utf-8")
    expected = expected_file.read_text(encoding="utf-8")
    assert err == expected
    assert code == ExitCode.INPUT_ERROR
    assert out == ""
    assert "Traceback" not in err


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_library_raises_the_same_diagnostics(case: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI prints what the library raises: PlaceError, rendered the same way."""
    monkeypatch.chdir(GOLDEN)
    with pytest.raises(PlaceError) as raised:
        load(case.name)
    assert raised.value.exit_code == ExitCode.INPUT_ERROR
    assert str(raised.value) + "\n" == case.with_suffix(".err").read_text(encoding="utf-8")


def test_every_error_class_has_a_golden() -> None:
    codes = set()
    for expected in GOLDEN.glob("*.err"):
        codes.update(re.findall(r"  \[([a-z-]+)\]$", expected.read_text(encoding="utf-8"), re.M))
    assert {c.value for c in FILE_ERROR_CODES} <= codes


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_carets_point_into_the_file(case: Path) -> None:
    """Each excerpt repeats a real line of the file (or the readable prefix of a binary one)."""
    expected = case.with_suffix(".err").read_text(encoding="utf-8").splitlines()
    raw = case.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    for index, line in enumerate(expected):
        match = re.match(r"^ *(\d+) \| (.*)$", line)
        if match is None:
            continue
        number, shown = int(match[1]), match[2]
        caret = expected[index + 1]
        assert re.match(r"^ +\| *\^+$", caret), f"no caret under line {number} of {case.name}"
        source_line = lines[number - 1].replace("\t", "    ")
        shown_plain = shown.replace("…", "")
        readable = re.sub(r"[\x00-\x1f\x7f\ufffd]", "\ufffd", source_line)
        assert shown_plain.replace("\ufffd", "") in readable.replace("\ufffd", ""), (
            f"{case.name}: the excerpt of line {number} is not that line")


# ---- inputs built at test time -----------------------------------------------------------------


def test_ten_megabyte_file_is_refused_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    line = "place zero3 over dp   # the same line again and again\n"
    Path("huge.place").write_text(line * (10_000_000 // len(line) + 1), encoding="utf-8")
    size = Path("huge.place").stat().st_size
    started = time.perf_counter()
    code, out, err = check("huge.place")
    elapsed = time.perf_counter() - started
    assert err == (f"huge.place: error: file is {size:,} bytes; placeverify reads at most "
                   f"{MAX_FILE_BYTES:,} bytes  [too-large]\n")
    assert code == ExitCode.INPUT_ERROR
    assert out == ""
    assert elapsed < 2.0


def test_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = check("no-such-strategy.place")
    assert err == "no-such-strategy.place: error: cannot read file: no such file  [read]\n"
    assert code == ExitCode.READ_ERROR
    assert out == ""


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    locked = Path("locked.place")
    locked.write_text("model { params = 7.5e9 }\nmesh { dp = 8 }\nplace zero3 over dp\n")
    locked.chmod(0)
    try:
        try:
            locked.read_bytes()
        except PermissionError:
            pass
        else:  # root (or a file system without permissions) reads it anyway
            pytest.skip("chmod 000 does not deny reads here (running as root?)")
        code, out, err = check("locked.place")
    finally:
        locked.chmod(0o644)
    assert err == "locked.place: error: cannot read file: permission denied  [read]\n"
    assert code == ExitCode.READ_ERROR
    assert out == ""


def test_permission_denied_even_as_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same path as chmod 000, for runs where root can read everything: open() refuses."""
    monkeypatch.chdir(tmp_path)
    Path("locked.place").write_text("model { params = 7.5e9 }\n")
    real_open = Path.open

    def refuse(self: Path, *args: object, **kwargs: object) -> object:
        if self.name == "locked.place":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", refuse)
    code, out, err = check("locked.place")
    assert err == "locked.place: error: cannot read file: permission denied  [read]\n"
    assert code == ExitCode.READ_ERROR
    assert out == ""


def test_directory_through_the_library(tmp_path: Path) -> None:
    folder = tmp_path / "strategy.place"
    folder.mkdir()
    with pytest.raises(PlaceError) as raised:
        load(str(folder))
    assert raised.value.exit_code == ExitCode.READ_ERROR
    assert str(raised.value) == (f"{folder}: error: cannot read file: is a directory, not a .place "
                                 "file  [read]")


def test_directory_without_place_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("empty-folder").mkdir()
    code, out, err = check("empty-folder")
    assert code == ExitCode.READ_ERROR
    assert "no .place files under empty-folder" in err
    assert err.rstrip().endswith("[read]")
    assert out == ""


def test_missing_and_good_files_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worst outcome decides the exit code; the good file is still reported."""
    monkeypatch.chdir(tmp_path)
    Path("good.place").write_text("model { params = 7.5e9 }\nmesh { dp = 8 }\nplace zero3 over dp\n")
    Path("bad.place").write_text("model { params = 7.5e9 }\nmesh { dp = 8 }\nplace zer3 over dp\n")
    code, out, err = check("--no-verify", "good.place", "missing.place", "bad.place")
    assert code == ExitCode.READ_ERROR  # a read error outranks an input error
    assert "missing.place: error: cannot read file: no such file  [read]" in err
    assert "bad.place:3:7: error: unknown placement preset 'zer3'; did you mean 'zero3'?" in err
    assert "good.place" in out


def test_too_many_errors_are_counted_not_listed() -> None:
    text = "model { params = 7.5e9 }\nmesh { dp = 8 }\n" + "place zero3 over dp\n" * 500
    with pytest.raises(PlaceError) as raised:
        load_text(text, "many.place")
    diagnostics = raised.value.diagnostics
    assert len(diagnostics) == 51
    assert diagnostics[-1].message == "449 more errors not shown (placeverify lists the first 50)"
    assert str(raised.value).endswith("many.place: note: 449 more errors not shown (placeverify "
                                      "lists the first 50)  [too-many-errors]")


def test_json_output_of_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.chdir(tmp_path)
    Path("typo.place").write_text("model { params = 7.5e9 }\nmesh { dp = 8 }\nplace zer3 over dp\n")
    code, out, _ = check("--json", "typo.place")
    assert code == ExitCode.INPUT_ERROR
    document = json.loads(out)
    assert document["file"] == "typo.place"
    [error] = document["errors"]
    assert error == {"severity": "error", "code": "unknown-name", "file": "typo.place",
                     "message": "unknown placement preset 'zer3'; did you mean 'zero3'?",
                     "line": 3, "column": 7, "end_line": 3, "end_column": 11,
                     "notes": [error["notes"][0]]}
    assert error["notes"][0].startswith("presets: ")


def test_a_diagnostic_at_line_100_prints_its_line_number(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # rich reads ':100:' as an emoji code unless told not to: the location must stay text
    lines = ['strategy "s"', "model { params = 1e9 }", "precision mixed_adam",
             "mesh {", "    dp = 2", "}"] + ["# padding"] * 93 + ["place nonsense over dp"]
    (tmp_path / "t.place").write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, out, err = check("t.place")
    assert code == ExitCode.INPUT_ERROR and out == ""
    assert err.startswith("t.place:100:7: error:"), err
    assert "\N{HUNDRED POINTS SYMBOL}" not in err
    # an import's warnings go through the same console
    script = ["#!/bin/bash"] + ["# padding"] * 98 + [
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
        "--micro-batch-size 1 --global-batch-size 8 --bf16 --vocab-size 1000 --no-such-flag"]
    (tmp_path / "run.sh").write_text("\n".join(script) + "\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["import", "run.sh"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert "run.sh:100:" in result.stderr and "\N{HUNDRED POINTS SYMBOL}" not in result.stderr


@pytest.mark.parametrize(("word", "meant"), [
    ("Gbps", ["Gb/s"]), ("GBps", ["GB/s"]), ("gbps", ["Gb/s", "GB/s"]), ("Tbps", ["Tb/s"]),
    ("gb", ["GB", "Gb"]), ("mb", ["MB"]), ("gib", ["GiB"]), ("usec", ["us"]), ("msec", ["ms"]),
    ("μs", ["µs"]), ("seconds", ["s"]), ("dp", []), ("experts", []),
])
def test_a_unit_the_grammar_does_not_know_gets_the_units_it_may_mean(word: str, meant: list[str]) -> None:
    # the grammar's units (grammar/placement.lark QUANTITY): B..PiB, Gb, Tb, ns, us, µs, ms, s
    from placeverify.syntax.errors import unit_suggestions

    assert unit_suggestions(word) == meant


def test_a_number_and_a_name_that_is_no_unit_keeps_the_syntax_error() -> None:
    with pytest.raises(PlaceError) as raised:
        load_text("model { params = 1e9 }\nmesh { dp = 2 { bandwidth = 100 fast } }\nplace ddp over dp\n",
                  "x.place")
    assert "unexpected '}'; expected '='" in str(raised.value)
