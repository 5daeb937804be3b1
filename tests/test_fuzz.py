"""Property-based fuzzing of the front end and of ``check``: random and mutated ``.place`` files.

The only exception any input may raise is :class:`PlaceError` (a diagnostic for the user), every
case must finish within a time bound, and every diagnostic must point inside the file. The inputs
are the real examples, mutated token by token (deleted, duplicated, swapped, replaced by keywords,
huge or negative numbers, unicode, deep brackets), plus random text and random bytes.

Deterministic: Hypothesis runs derandomized with its example database off, so a run is the same
run every time. A failure prints the falsifying text; paste it into a test to reproduce it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placeverify.api import check, check_strategy
from placeverify.diagnostics import PlaceError, Source
from placeverify.lower import load_text
from placeverify.syntax.source import decode_text

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
            for p in sorted(ROOT.glob("examples/**/*.place"))}
SECONDS_PER_CASE = 10.0  # a front-end case takes milliseconds; this only catches hangs
SECONDS_PER_VERIFIED_CASE = 30.0
SOLVER_MS = 2_000

# Pieces of the language and of the ways people get it wrong.
KEYWORDS = ["strategy", "model", "precision", "mesh", "place", "over", "recompute", "offload", "to",
            "loss", "microbatches", "clip", "loss_scale", "step", "backward", "each", "microbatch", "on",
            "scale", "by", "seed", "same", "differ", "group", "update", "free", "all_reduce",
            "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send", "recv", "params", "grads",
            "optimizer", "activations", "tokens", "samples", "sum", "mean", "world", "ends", "first",
            "last", "1f1b", "gpipe", "interleaved", "zero1", "zero2", "zero3", "fsdp", "hsdp", "ddp",
            "megatron", "pipeline", "context", "expert", "full", "selective", "dp", "tp", "pp", "cp",
            "ep", "R", "S", "S*", "M", "O", "true", "false", "llama3_8b", "mixtral_8x7b", "transformer"]
PUNCTUATION = ["{", "}", "(", ")", "[", "]", ",", "=", "*", "/", "|", "×", "\n", "#", '"', ":", ";", "-"]
NUMBERS = ["0", "-1", "1", "2", "3", "7", "8", "64", "0.5", "1e-9", "7.5e9", "1e30", "1e100", "1e101",
           "1e999999999", "9" * 120, "1_000_000", "2147483648", "18446744073709551617", "80 GB", "-80 GB",
           "0 GB", "25 GB/s", "1e40 PB", "5 us", "1e-300 s", '"x"', '"Θ Ω ✓ 全"']
UNICODE = ["Θ", "Ω", "µ", "全", "\u2028", "\u0085", "\x0c", "\x00", "\ufeff", "\u200b", "é", "👍", "\r"]
TOKEN = re.compile(r'#[^\n]*|"(?:[^"\\\n]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*\*?'
                   r"|[+-]?\d[\d_.eE+-]*(?:\s*[A-Za-zµ]+(?:/s)?)?|\s+|.", re.S)
VOCABULARY = KEYWORDS + PUNCTUATION + NUMBERS + UNICODE


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail (rather than hang the suite) when the body runs past ``seconds``."""
    started = time.perf_counter()
    use_alarm = hasattr(signal, "setitimer") and os.name == "posix"

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"a single case ran past {seconds} s")

    if use_alarm:
        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    assert time.perf_counter() - started < seconds


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


ALL_MUTATIONS = ("delete", "duplicate", "swap", "replace", "insert", "truncate", "nest", "repeat")
MILD_MUTATIONS = ("delete", "duplicate", "swap", "replace", "repeat")


@st.composite
def mutated_examples(draw: st.DrawFn, kinds: tuple[str, ...] = ALL_MUTATIONS, most: int = 4) -> str:
    """A real example with a few token-level mutations."""
    pieces = tokens(EXAMPLES[draw(st.sampled_from(sorted(EXAMPLES)))])
    for _ in range(draw(st.integers(1, most))):
        if not pieces:
            break
        i = draw(st.integers(0, len(pieces) - 1))
        kind = draw(st.sampled_from(kinds))
        if kind == "delete":
            del pieces[i]
        elif kind == "duplicate":
            pieces.insert(i, pieces[i])
        elif kind == "swap":
            j = draw(st.integers(0, len(pieces) - 1))
            pieces[i], pieces[j] = pieces[j], pieces[i]
        elif kind == "replace":
            pieces[i] = draw(st.sampled_from(VOCABULARY))
        elif kind == "insert":
            pieces.insert(i, draw(st.sampled_from(VOCABULARY)) + draw(st.sampled_from([" ", "", "\n"])))
        elif kind == "truncate":
            pieces = pieces[:i]
        elif kind == "nest":
            depth = draw(st.one_of(st.integers(1, 8), st.integers(30, 80)))
            opener = draw(st.sampled_from(["(", "{", "["]))
            closer = {"(": ")", "{": "}", "[": "]"}[opener]
            pieces.insert(i, opener * depth + pieces[i] + closer * draw(st.integers(0, depth)))
        else:  # repeat one statement-sized stretch many times
            j = min(len(pieces), i + draw(st.integers(1, 12)))
            pieces[i:j] = pieces[i:j] * draw(st.integers(2, 50))
    return "".join(pieces)


def random_token_text() -> st.SearchStrategy[str]:
    separators = st.sampled_from([" ", "\n", "", "  ", "\t"])
    return st.lists(st.tuples(st.sampled_from(VOCABULARY), separators), max_size=60).map(
        lambda parts: "".join(a + b for a, b in parts))


PLACE_TEXT = st.one_of(mutated_examples(), random_token_text(), st.text(max_size=300))
FRONT_END = settings(max_examples=int(os.environ.get("PLACEVERIFY_FUZZ_EXAMPLES", 600)),
                     derandomize=True, database=None, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def assert_diagnostics_point_inside(error: PlaceError, text: str) -> None:
    """Every diagnostic renders, and its span lies within the file (or just past its end)."""
    rendered = str(error)
    assert error.diagnostics
    assert "Traceback" not in rendered
    lines = Source("x", text).lines if error.source is None else error.source.lines
    for diagnostic in error.diagnostics:
        if diagnostic.span is None:
            continue
        span = diagnostic.span
        assert 1 <= span.line <= span.end_line <= len(lines) + 1, (diagnostic, len(lines))
        assert span.column >= 1
        if span.line == span.end_line:
            assert span.end_column >= span.column


@FRONT_END
@given(PLACE_TEXT)
def test_front_end_raises_only_place_errors(text: str) -> None:
    with time_limit(SECONDS_PER_CASE):
        try:
            load_text(text, "fuzz.place")
        except PlaceError as error:
            assert_diagnostics_point_inside(error, text)


@FRONT_END
@given(st.one_of(st.binary(max_size=400), mutated_examples().map(lambda t: t.encode("utf-8")).flatmap(
    lambda data: st.integers(0, len(data)).map(lambda i: data[:i] + b"\xff\x00\xc3" + data[i:]))))
def test_bytes_are_decoded_or_refused(data: bytes) -> None:
    with time_limit(SECONDS_PER_CASE):
        try:
            text = decode_text("fuzz.place", data)
            load_text(text, "fuzz.place")
        except PlaceError as error:
            assert error.source is not None
            assert_diagnostics_point_inside(error, error.source.text)


@settings(max_examples=int(os.environ.get("PLACEVERIFY_FUZZ_VERIFIED", 40)), derandomize=True,
          database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_examples(MILD_MUTATIONS, most=2), st.booleans())
def test_check_with_and_without_verification(text: str, verify: bool) -> None:
    """The whole of ``check`` (costs, and Z3 when verifying) on mutated files."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.place"
        path.write_text(text, encoding="utf-8")
        with time_limit(SECONDS_PER_VERIFIED_CASE):
            try:
                result = check(str(path), verify_conditions=verify, timeout_ms=SOLVER_MS)
            except PlaceError as error:
                assert_diagnostics_point_inside(error, text)
                return
        assert (result.verification is not None) == verify


SUBPROCESS_CASES = {
    "repeated-placements": "model { params = 7.5e9 }\nmesh { dp = 8 }\n" + "place zero3 over dp\n" * 300,
    "huge-exponent": EXAMPLES["examples/zero-paper/zero3.place"].replace("7.5e9", "1e999999999"),
    "deep-brackets": EXAMPLES["examples/zero-paper/zero3.place"].replace("over dp",
                                                                        "over " + "(" * 500 + "dp"),
    "missing-brace": EXAMPLES["examples/strategies/llama3-405b-4d.place"].replace("}", "", 1),
    "bom-comment-separator": "\ufeff# only a comment \u2028 and a separator\n",
    "reversed": "".join(reversed(EXAMPLES["examples/ok/hsdp.place"])),
}


@pytest.mark.parametrize("name", sorted(SUBPROCESS_CASES))
def test_mutations_through_a_real_process(name: str, tmp_path: Path) -> None:
    path = tmp_path / "fuzz.place"
    path.write_text(SUBPROCESS_CASES[name], encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "placeverify", "check", str(path)], capture_output=True,
                          text=True, encoding="utf-8", errors="replace", timeout=60, check=False,
                          env={k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"})
    assert done.returncode in (0, 1, 2, 3), done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


@FRONT_END
@given(mutated_examples())
def test_rendering_is_stable(text: str) -> None:
    """Rendering the same error twice gives the same text (no state leaks between parses)."""
    outcomes = []
    for _ in range(2):
        try:
            load_text(text, "fuzz.place")
            outcomes.append("ok")
        except PlaceError as error:
            outcomes.append(str(error))
    assert outcomes[0] == outcomes[1]


SLOW_WITNESS = """\
model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 4, seq = 10000000 }
precision megatron
mesh { dp = 2, cp = 2 }
place sp over dp
place context over cp
loss microbatch_mean

step {
    microbatches = 1024
    backward sum / tokens(cp) * |cp| / microbatches
    scale grads by 1 / |dp * cp|
    all_reduce(sum) grads over dp * cp
    update params
}
"""


def test_many_microbatches_are_verified_in_bounded_time() -> None:
    strategy = load_text(SLOW_WITNESS, "slow.place")
    with time_limit(5.0):
        check_strategy(strategy, verify_conditions=True, timeout_ms=SOLVER_MS)
