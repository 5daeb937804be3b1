"""``placeverify replay trace.json --emit repro.py``: standalone reproducers, run under torchrun.

Each case goes the user's way: ``check --trace`` on a bundled bug, ``replay --emit``, then the
emitted script under ``torchrun --standalone --nproc-per-node N`` (gloo) in a subprocess, which
must print a divergence for the buggy step, a match for the fixed one, and exit 0 (reproduced;
torchrun ends cleanly, no rank reported failed). The script
must import only torch and the standard library (read with ``ast``). Refused layouts and
statements exit 2 and name the statement.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from placeverify.replay.emit import emit_script
from placeverify.replay.emit_step import COLLECTIVES, EMITTERS, EmitRefused
from placeverify.trace import load

ROOT = Path(__file__).resolve().parents[1]
HAS_TORCH = importlib.util.find_spec("torch") is not None
ALLOWED_IMPORTS = {"hashlib", "math", "os", "sys", "fractions", "torch"}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PLACEVERIFY_DEBUG", "MASTER_ADDR",
                                                          "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = str(ROOT)
    env["OMP_NUM_THREADS"] = "1"
    return env


def placeverify(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, encoding="utf-8", timeout=300,
                          check=False)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def emitted(tmp_path: Path, bug: str, *extra: str) -> tuple[Path, int]:
    """check --trace, then replay --emit: the script and the processes it needs."""
    trace = tmp_path / f"{bug}.json"
    done = placeverify("check", f"examples/bugs/{bug}.place", "--trace", str(trace))
    assert done.returncode == 1, done.stdout + done.stderr
    script = tmp_path / f"{bug}.py"
    done = placeverify("replay", str(trace), "--emit", str(script), *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    match = re.search(r"--nproc-per-node (\d+)", done.stdout)
    assert match, done.stdout
    return script, int(match.group(1))


def imported_modules(text: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            out.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("__import__", "eval",
                                                                             "exec"):
            raise AssertionError(f"dynamic import or evaluation at line {node.lineno}")
    return out


def torchrun(script: Path, processes: int, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", str(processes), str(script)],
                          cwd=script.parent, env={k: v for k, v in _env().items()
                                                  if k != "PYTHONPATH"},
                          capture_output=True, text=True, encoding="utf-8", timeout=timeout,
                          check=False)


CASES = [
    # (bug, extra emit options): accumulation normalisation, a missing all-reduce, a wrong
    # scale (a sum of local means: dp times too large), ZeRO-1 without its parameter gather
    pytest.param("ga-token-normalisation", ("--world", "2"), id="ga-token-normalisation"),
    pytest.param("missing-allreduce", (), id="missing-allreduce"),
    pytest.param("sum-without-average", (), id="wrong-scale"),
    pytest.param("zero1-no-allgather", (), id="zero1-no-allgather"),
]


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize(("bug", "extra"), CASES)
def test_the_emitted_script_reproduces_the_bug_under_torchrun(tmp_path: Path, bug: str,
                                                             extra: tuple[str, ...]) -> None:
    script, processes = emitted(tmp_path, bug, *extra)
    text = script.read_text(encoding="utf-8")
    assert imported_modules(text) <= ALLOWED_IMPORTS, imported_modules(text)
    assert "placeverify" not in imported_modules(text)
    assert f"examples/bugs/{bug}.place" in text and "placeverify.trace/1" in text
    assert 2 <= processes <= 4
    done = torchrun(script, processes)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "FAILED" not in done.stderr and "Failures:" not in done.stderr, done.stderr
    assert re.search(r"^buggy: (diverges by|replicas differ by) [0-9.e+-]+; fixed: matches",
                     out, re.M), out
    assert "REPRODUCED: the buggy step diverges" in out
    ranks = re.findall(r"^rank (\d+) \(", out, re.M)
    assert ranks == [str(r) for r in range(processes)], out


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_the_documented_torchrun_command_ends_cleanly_when_the_bug_reproduces(
        tmp_path: Path) -> None:
    """The command ``replay --emit`` prints, run as printed: exit 0 and no failed rank."""
    trace = tmp_path / "t.json"
    assert placeverify("check", "examples/bugs/missing-allreduce.place", "--trace",
                       str(trace)).returncode == 1
    done = placeverify("replay", str(trace), "--emit", "repro.py", cwd=tmp_path)
    command = re.search(r"run: (torchrun .*)$", done.stdout.strip(), re.M)
    assert done.returncode == 0 and command, done.stdout + done.stderr
    words = command.group(1).split()
    assert words[:2] == ["torchrun", "--standalone"] and words[-1] == "repro.py", words
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", *words[1:]],
                         cwd=tmp_path, env={k: v for k, v in _env().items() if k != "PYTHONPATH"},
                         capture_output=True, text=True, encoding="utf-8", timeout=240,
                         check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "REPRODUCED: the buggy step diverges" in ran.stdout
    assert "FAILED" not in ran.stderr and "Failures:" not in ran.stderr, ran.stderr


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_the_script_refuses_the_wrong_number_of_processes(tmp_path: Path) -> None:
    script, processes = emitted(tmp_path, "missing-allreduce")
    assert processes == 2
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs 2 processes" in done.stderr and "--nproc-per-node 2" in done.stderr


def test_a_refused_statement_exits_2_and_names_it(tmp_path: Path) -> None:
    trace = tmp_path / "seed.json"
    done = placeverify("check", "examples/bugs/dropout-seed-data-parallel.place", "--trace",
                       str(trace))
    assert done.returncode == 1
    out = tmp_path / "repro.py"
    done = placeverify("replay", str(trace), "--emit", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "line 18: 'seed dropout(sharded) same over dp'" in done.stderr, done.stderr
    assert not out.exists()


def test_a_refused_layout_names_the_placement(tmp_path: Path) -> None:
    trace = tmp_path / "tp.json"
    assert placeverify("check", "examples/bugs/clip-norm-tensor-parallel.place", "--trace",
                       str(trace)).returncode == 1
    with pytest.raises(EmitRefused, match=r"line \d+: 'place megatron over tp' \(tensor axis"):
        emit_script(load(str(trace)), trace_path=str(trace))


def test_one_emitter_per_statement_kind() -> None:
    from placeverify.ir.step import Backward, Clip, Collective, Free, Scale, Update

    assert set(EMITTERS) == {Backward, Collective, Scale, Clip, Free, Update}
    assert {k.value + " " + t for k, t in COLLECTIVES} >= {
        "all_reduce grads", "reduce_scatter grads", "all_gather grads", "all_gather params",
        "broadcast params", "all_reduce overflow"}


def _trace_of(tmp_path: Path, bug: str) -> Any:
    trace = tmp_path / f"{bug}.json"
    assert placeverify("check", f"examples/bugs/{bug}.place", "--trace", str(trace)).returncode == 1
    return load(str(trace))


def test_the_step_is_straight_line_code_with_its_source_lines(tmp_path: Path) -> None:
    text = emit_script(_trace_of(tmp_path, "ga-token-normalisation"), trace_path="t.json",
                       world=2)
    buggy = text[text.index("def buggy_step"):text.index("def fixed_step")]
    fixed = text[text.index("def fixed_step"):]
    # the micro-batches are unrolled; each backward divides by its own micro-batch's tokens
    assert "# line 15: backward mean (micro-batch 0)" in buggy
    assert "run.backward(t, 1, Fraction(1) / tokens[1])" in buggy
    assert "factor = float(Fraction(1) / MICROBATCHES)" in buggy
    assert 'all_reduce(run.full["dense"], (\'dp\',), "mean")' in buggy
    # the fixed step normalises by the global token count of the step
    assert "tokens_dp_step = count(\"tokens\", ('dp',), True)" in fixed
    assert "Fraction(1) / tokens_dp_step[0]" in fixed
    assert 'all_reduce(run.full["dense"], (\'dp\',), "sum")' in fixed
    compile(text, "repro.py", "exec")
