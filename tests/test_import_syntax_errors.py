"""A configuration that does not parse is reported at the parser's line and column, with or without
``--format``: ``path:line:col: error: not valid JSON: ...  [syntax]``, the line and a caret.

Before, a DeepSpeed JSON with a syntax error was "cannot tell the format of this file" (the format
detection swallowed the decoder's error), a TOML error had no position (the position was only in
tomllib's message, "(at line L, column C)"), and a YAML or shell file whose content names no
format was "cannot tell" whatever its syntax. Each expected line and column below is counted by
hand from the test's own text, in the comment beside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from placeverify.diagnostics import Code, PlaceError
from placeverify.importers import Options
from placeverify.importers.registry import import_file

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    name: str  # the file's name
    text: str
    fmt: str  # the --format that names the same syntax
    line: int
    column: int
    message: str  # the whole message, as printed before "  [syntax]"


CASES = [
    # line 3 is '  "zero_optimization": {"stage": 2,}': 2 spaces, the 19-character key at columns
    # 3-21, ':' 22, ' ' 23, '{' 24, '"stage"' 25-31, ':' 32, ' ' 33, '2' 34, ',' 35, '}' 36: a
    # property name was expected where the '}' is
    Case("ds.json", '{\n  "train_batch_size": 8,\n  "zero_optimization": {"stage": 2,}\n}\n',
         "deepspeed", 3, 36, "not valid JSON: Expecting property name enclosed in double quotes"),
    # a .json file is JSON even when its text holds Megatron-LM words (before, read as Megatron-LM
    # arguments): line 3 ends '8' with no ',', and the decoder wants one at the next token, the
    # '"' of line 4 after its 2-space indent, column 3
    Case("words.json", '{\n  "note": "launched by pretrain_gpt.py --hidden-size 4096",\n'
         '  "train_batch_size": 8\n  "gradient_clipping": 1.0\n}\n', "deepspeed", 4, 3,
         "not valid JSON: Expecting ',' delimiter"),
    # line 3 is 'data_parallel_shard_degree = = 4': the 26-character key, ' ' 27, '=' 28, ' ' 29,
    # the second '=' at 30, where the value should start
    Case("tt.toml", "[parallelism]\ntensor_parallel_degree = 2\ndata_parallel_shard_degree = = 4\n",
         "torchtitan", 3, 30, "not valid TOML: Invalid value"),
    # '[parallelism' is 12 characters: the missing ']' is due at column 13 (the header is broken,
    # so the content names no format: the .toml suffix says which parser)
    Case("header.toml", "[parallelism\ntensor_parallel_degree = 2\n", "torchtitan", 1, 13,
         "not valid TOML: Expected ']' at the end of a table declaration"),
    # the string never closes: tomllib stops at the end of the document, reported just after the
    # last text, line 2 'seq_len = "2048' (15 characters): column 16
    Case("end.toml", '[training]\nseq_len = "2048', "torchtitan", 2, 16,
         "not valid TOML: Unterminated string"),
    # 'distributed_type FSDP' has no ':' (so the content names no format): PyYAML (what
    # accelerate's yaml.safe_load runs) reads it as a plain scalar running on to line 2, where
    # the ':' after 'num_processes' (13 characters) at column 14 cannot follow it
    Case("acc.yaml", "distributed_type FSDP\nnum_processes: 8\n", "accelerate", 2, 14,
         "not valid YAML: mapping values are not allowed here"),
    # a Megatron-LM test configuration with no flag the detection knows: line 3 '  bar baz' is a
    # key without its ':'; PyYAML notices at the end of the text (line 4), so the error is where
    # the key it was scanning starts, after the 2-space indent: 3:3
    Case("model_config.yaml", "MODEL_ARGS:\n  --foo: 1\n  bar baz\n", "megatron", 3, 3,
         "not valid YAML: could not find expected ':' (while scanning a simple key)"),
    # 'echo "hello': the quote at column 6 never closes
    Case("run.sh", 'echo "hello\n', "megatron", 1, 6,
         "cannot read this script: this double quote is never closed"),
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "placeverify", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)


def assert_positioned(stderr: str, path: Path, line: int, column: int, message: str,
                      text: str) -> None:
    """The first line names the position and the message; then the source line and a caret
    under the column."""
    lines = stderr.splitlines()
    assert lines[0] == f"{path}:{line}:{column}: error: {message}  [syntax]", stderr
    source_line = text.split("\n")[line - 1]
    assert lines[1].split(" | ", 1)[1] == source_line, stderr
    caret = lines[2].split("| ", 1)[1]
    assert caret.index("^") == column - 1, stderr


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_cli_points_at_the_syntax_error_with_and_without_format(case: Case, tmp_path: Path) -> None:
    path = tmp_path / case.name
    path.write_text(case.text, encoding="utf-8")
    detected = run("import", str(path), "--world", "8")
    named = run("import", str(path), "--world", "8", "--format", case.fmt)
    assert detected.returncode == named.returncode == 2, (detected.stderr, named.stderr)
    assert detected.stdout == named.stdout == ""
    assert_positioned(detected.stderr, path, case.line, case.column, case.message, case.text)
    assert detected.stderr == named.stderr  # the same parser's error either way


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_import_file_raises_the_positioned_error(case: Case, tmp_path: Path) -> None:
    path = tmp_path / case.name
    path.write_text(case.text, encoding="utf-8")
    for options in (Options(world=8), Options(world=8, fmt=case.fmt)):
        with pytest.raises(PlaceError) as error:
            import_file(str(path), options)
        [diagnostic] = error.value.diagnostics
        assert diagnostic.code is Code.SYNTAX
        assert diagnostic.message == case.message
        assert diagnostic.span is not None
        assert (diagnostic.span.line, diagnostic.span.column) == (case.line, case.column)


def test_check_reports_a_configuration_syntax_error_at_its_position(tmp_path: Path) -> None:
    # check hands a .json to the importers: the same error as import's
    case = CASES[0]
    path = tmp_path / case.name
    path.write_text(case.text, encoding="utf-8")
    done = run("check", str(path), "--world", "8", "--no-verify")
    assert done.returncode == 2, done.stderr
    assert_positioned(done.stderr, path, case.line, case.column, case.message, case.text)


# ---- documents nested past the loaders' recursion -----------------------------------------------

def test_json_nested_past_the_decoders_recursion_is_an_error_at_the_bracket(tmp_path: Path) -> None:
    # '{"a":' is 5 characters a level. The root object is level 0 and levels up to 64 are read:
    # the object at level 65 is the 66th '{', at offset 65 x 5 = 325, column 326. At 70 levels
    # json.loads decodes the file and the key scanner refuses it; at 50,000 json.loads itself
    # recurses out (before, an internal error): the same error at the same bracket.
    for levels in (70, 50_000):
        path = tmp_path / f"deep{levels}.json"
        text = '{"a":' * levels + "1" + "}" * levels + "\n"
        path.write_text(text, encoding="utf-8")
        done = run("import", str(path), "--world", "8")
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines()[0] == (
            f"{path}:1:326: error: nested deeper than 64 levels  [syntax]"), done.stderr[:300]


def test_toml_nested_past_the_decoders_recursion_is_an_error_at_the_bracket(tmp_path: Path) -> None:
    # line 2 comments out three brackets; line 3 is 'x = ' then 5,000 '[': the k-th at column
    # 4 + k, the 66th (as the JSON scanner counts levels) at column 70
    path = tmp_path / "deep.toml"
    path.write_text("[training]\n# [[[ not counted\nx = " + "[" * 5000 + "]" * 5000 + "\n",
                    encoding="utf-8")
    with pytest.raises(PlaceError) as error:
        import_file(str(path), Options(world=8))
    [diagnostic] = error.value.diagnostics
    assert diagnostic.message == "nested deeper than 64 levels"
    assert diagnostic.span is not None
    assert (diagnostic.span.line, diagnostic.span.column) == (3, 70)


# ---- tomllib's position, from its attributes (Python 3.14) or its message -------------------------

class _Decoded(tomllib.TOMLDecodeError):
    """A TOMLDecodeError as Python 3.14 raises it: the bare message in ``msg`` and the position
    in ``pos``, ``lineno`` and ``colno``; here ``str()`` holds no position at all, so the position
    can only come from the attributes."""


def _decoded(msg: str, pos: int, lineno: int, colno: int) -> tomllib.TOMLDecodeError:
    error = _Decoded.__new__(_Decoded)
    Exception.__init__(error, msg)
    error.msg, error.pos, error.lineno, error.colno = msg, pos, lineno, colno  # type: ignore[attr-defined]
    return error


TOML = "[training]\nseq_len = 2048\nmax_norm = \n"


@pytest.mark.parametrize(("pos", "expected"), [
    # line 2, column 5 (offset 11 + 4 = 15): the attributes', not any the text would suggest
    (15, (2, 5)),
    # at the end of the document: just after the last text, line 3 'max_norm = ' (11
    # characters, the trailing blank kept), column 12
    (len(TOML), (3, 12)),
])
def test_a_toml_error_with_position_attributes(pos: int, expected: tuple[int, int],
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "job.toml"
    path.write_text(TOML, encoding="utf-8")
    line, column = (2, 5) if pos < len(TOML) else (4, 1)

    def loads(text: str) -> dict[str, object]:
        raise _decoded("Invalid value", pos, line, column)

    monkeypatch.setattr(tomllib, "loads", loads)  # the module positions.load_toml calls
    with pytest.raises(PlaceError) as error:
        import_file(str(path), Options(world=8))
    [diagnostic] = error.value.diagnostics
    assert diagnostic.message == "not valid TOML: Invalid value"
    assert diagnostic.span is not None
    assert (diagnostic.span.line, diagnostic.span.column) == expected


# ---- what parses but names no format is still "cannot tell" ---------------------------------------

@pytest.mark.parametrize(("name", "text"), [
    ("list.json", "[1, 2]\n"),  # valid JSON, not an object
    ("other.toml", "[foo]\na = 1\n"),  # valid TOML, no torchtitan table
    ("other.yaml", "name: x\n"),  # the YAML subset parses, no accelerate key
    ("other.sh", "echo hello\n"),  # a script with no Megatron-LM flags
])
def test_a_file_that_parses_but_names_no_format_is_still_refused(name: str, text: str,
                                                                 tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PlaceError) as error:
        import_file(str(path), Options(world=8))
    [diagnostic] = error.value.diagnostics
    assert diagnostic.span is None
    assert diagnostic.code is Code.BAD_VALUE
    assert diagnostic.message.startswith("cannot tell the format of this file")
