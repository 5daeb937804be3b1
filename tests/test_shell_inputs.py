"""Launch scripts read as they are run (issue 33, item 3): ``--env NAME=VALUE`` and
``--script-args`` (placeverify/importers/shell_inputs.py), loops over the script's arguments, a
value every branch agrees on, one error per undecided test, and a file whose flags no command runs.

Each expected value is worked out by hand from the fixture and bash's rules (bash(1): "Special
Parameters" for ``$#`` and ``"$@"``, "shift [n]", "Compound Commands" for ``case``, ``while`` and
``for name in word``) and Megatron-LM's (world = nproc x nnodes, DP = world / (TP x PP x CP)).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from placeverify.diagnostics import Code, PlaceError, Source
from placeverify.importers import Options
from placeverify.importers.registry import import_file
from placeverify.importers.shell import Script
from placeverify.importers.shell_inputs import Inputs

ROOT = Path(__file__).resolve().parent.parent
MODEL = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --vocab-size 1000 "
         "--seq-length 128")
LAUNCH = f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.sh"
    path.write_text(text)
    return str(path)


NO_OPTIONS = Options()


def failure(path: str, options: Options = NO_OPTIONS) -> PlaceError:
    with pytest.raises(PlaceError) as error:
        import_file(path, options)
    return error.value


def errors(path: str, options: Options = NO_OPTIONS) -> list[tuple[str, int, int]]:
    return [(d.message, d.span.line if d.span else 0, d.span.column if d.span else 0)
            for d in failure(path, options).diagnostics]


def mesh(text: str, axis: str) -> str:
    """``axis = N`` as the strategy's title says it (tp and pp are there even when 1)."""
    title = next(line for line in text.splitlines() if line.startswith("strategy "))
    if axis == "world":
        return next(line.split("#")[0].strip() for line in text.splitlines()
                    if line.strip().startswith("world ="))
    return next(part.strip(' "') for part in title.split(",") if part.strip().startswith(axis))


# ---- 1. --env and --script-args decide tests and values -------------------------------------

def test_env_decides_a_test_and_the_error_without_it_names_the_option(tmp_path: Path) -> None:
    path = write(tmp_path, 'if [[ "$SIZE" == big ]]; then TP=4; else TP=2; fi\n'
                           f"{LAUNCH} --tensor-model-parallel-size $TP\n")
    [(message, line, column)] = errors(path)
    assert (line, column) == (1, 4)  # `[[ "$SIZE" == big ]]`
    assert "$SIZE is not assigned in this script" in message and "give --env SIZE=VALUE" in message
    # SIZE=big: the then branch, TP 4, DP 8 / 4 = 2; SIZE=small: the else, TP 2, DP 4
    text = import_file(path, Options(env=(("SIZE", "big"),))).text
    assert (mesh(text, "tp"), mesh(text, "dp")) == ("tp = 4", "dp = 2")
    assert "# The script read as run with --env SIZE=big" in text
    text = import_file(path, Options(env=(("SIZE", "small"),))).text
    assert (mesh(text, "tp"), mesh(text, "dp")) == ("tp = 2", "dp = 4")


def test_an_env_value_stands_where_it_is_used(tmp_path: Path) -> None:
    line = f"torchrun --nproc-per-node 4 --nnodes $NODES pretrain_gpt.py {MODEL}\n"
    path = write(tmp_path, line)
    # NODES=3: world 4 x 3 = 12, DP 12
    text = import_file(path, Options(env=(("NODES", "3"),))).text
    assert mesh(text, "world") == "world = 12" and mesh(text, "dp") == "dp = 12"
    # the word 3 points at `$NODES`: after "torchrun --nproc-per-node 4 --nnodes " (37 chars)
    word = Script(Source(path, line), Inputs(env=(("NODES", "3"),))).commands[0].words[4]
    assert word.text == "3" and word.span is not None
    assert (word.span.line, word.span.column) == (1, 38)


def test_script_args_give_positional_parameters(tmp_path: Path) -> None:
    path = write(tmp_path, 'if [ $# -lt 2 ]; then echo "usage: $0 TP PRECISION"; exit 1; fi\n'
                           "TP=$1\n"
                           'case "$2" in bf16) P=--bf16 ;; fp16) P=--fp16 ;; esac\n'
                           f"torchrun --nproc-per-node 8 pretrain_gpt.py $P {MODEL} "
                           "--tensor-model-parallel-size $TP --pipeline-model-parallel-size "
                           "${3:-2}\n")
    found = errors(path)
    assert any("$1 is an argument of the script" in m and "give --script-args" in m
               for m, _, _ in found)
    # 4 bf16: TP 4, --bf16 (precision megatron), $3 not given: PP 2; DP = 8 / (4 x 2) = 1
    text = import_file(path, Options(script_args=("4", "bf16"))).text
    assert (mesh(text, "tp"), mesh(text, "pp"), mesh(text, "dp")) == ("tp = 4", "pp = 2",
                                                                      "dp = 1")
    assert "precision megatron" in text
    # one argument: `$# -lt 2` holds and the script exits before any command
    assert "world size unknown" in errors(path, Options(script_args=("4",)))[0][0]


# ---- 3. the argument loop -----------------------------------------------------------------------

LOOPS = {
    "while-double": 'while [[ $# -gt 0 ]]; do\n  case $1 in\n    --tp) TP=$2; shift ;;\n'
                    '    --pp) PP=$2; shift ;;\n  esac\n  shift\ndone\n',
    "while-single": 'while [ "$#" -gt 0 ]; do\n  case "$1" in\n    --tp) TP="$2"; shift 2 ;;\n'
                    '    --pp) PP="$2"; shift 2 ;;\n    *) shift ;;\n  esac\ndone\n',
    "for": 'NEXT=\nfor arg in "$@"; do\n  case $NEXT in tp) TP=$arg ;; pp) PP=$arg ;; esac\n'
           '  NEXT=\n  case $arg in --tp) NEXT=tp ;; --pp) NEXT=pp ;; esac\ndone\n',
}


@pytest.mark.parametrize("shape", sorted(LOOPS))
def test_the_argument_loop_runs_over_the_script_args(tmp_path: Path, shape: str) -> None:
    path = write(tmp_path, "TP=1\nPP=1\n" + LOOPS[shape] +
                 f"{LAUNCH} --tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP\n")
    # no arguments: the loop (line 3) runs zero times, TP = PP = 1, DP = 8; said in the header
    text = import_file(path).text
    assert (mesh(text, "tp"), mesh(text, "dp")) == ("tp = 1", "dp = 8")
    kind, line = ("for", 4) if shape == "for" else ("while", 3)  # after `NEXT=` for `for`
    assert f"no arguments given to the script, so the {kind} loop at line {line} runs zero " \
        "times" in text
    # --tp 2 --pp 2 (and a word the loop passes over): TP 2, PP 2, DP = 8 / 4 = 2
    text = import_file(path, Options(script_args=("--tp", "2", "--seed", "--pp", "2"))).text
    assert (mesh(text, "tp"), mesh(text, "pp"), mesh(text, "dp")) == ("tp = 2", "pp = 2",
                                                                      "dp = 2")
    assert "runs zero times" not in text


# ---- 2. a value every branch agrees on -----------------------------------------------------

def test_a_flag_every_arm_of_a_case_sets_alike_is_decided(tmp_path: Path) -> None:
    path = write(tmp_path, 'case "$MODEL" in\n'
                           "  7b) TP=2; NL=32 ;;\n"
                           "  13b) TP=2; NL=40 ;;\n"
                           "  *) TP=2; NL=24 ;;\n"
                           "esac\n"
                           "torchrun --nproc-per-node 8 pretrain_gpt.py --hidden-size 256 "
                           "--num-attention-heads 8 --vocab-size 1000 --seq-length 128 "
                           "--tensor-model-parallel-size $TP --num-layers $NL\n")
    # TP is 2 whichever arm runs (the `*` arm leaves no way past the case); NL is not known
    [(message, line, column)] = errors(path)
    assert message.startswith("--num-layers: $NL depends on the case statement at line 1")
    assert (line, column) == (1, 1) and "give --env MODEL=VALUE" in message
    # MODEL=13b: the second arm, 40 layers; TP 2 again
    text = import_file(path, Options(env=(("MODEL", "13b"),))).text
    assert "layers = 40" in text and mesh(text, "tp") == "tp = 2"


def test_a_flag_every_branch_appends_alike_is_decided_in_any_order(tmp_path: Path) -> None:
    path = write(tmp_path, "PAR=(--seq-length 128)\n"
                           "if [ -f big ]; then\n"
                           "  PAR+=(--tensor-model-parallel-size 2 --num-layers 48)\n"
                           "else\n"
                           "  PAR+=(--num-layers 24 --tensor-model-parallel-size 2)\n"
                           "fi\n"
                           "torchrun --nproc-per-node 8 pretrain_gpt.py --hidden-size 256 "
                           "--num-attention-heads 8 --vocab-size 1000 ${PAR[@]}\n")
    # --tensor-model-parallel-size 2 on both branches: decided; --num-layers 48 or 24: not
    [(message, line, column)] = errors(path)
    assert message.startswith("--num-layers: it is given only if the test `[ -f big ]`")
    assert (line, column) == (2, 4)
    # the branches differ in a flag placeverify does not read: TP 2 whichever runs, DP 8 / 2
    path = write(tmp_path, "PAR=(--seq-length 128 --num-layers 4)\n"
                           "if [ -f big ]; then\n"
                           "  PAR+=(--tensor-model-parallel-size 2 --log-interval 1)\n"
                           "else\n"
                           "  PAR+=(--log-interval 10 --tensor-model-parallel-size 2)\n"
                           "fi\n"
                           "torchrun --nproc-per-node 8 pretrain_gpt.py --hidden-size 256 "
                           "--num-attention-heads 8 --vocab-size 1000 ${PAR[@]}\n")
    text = import_file(path).text
    assert (mesh(text, "tp"), mesh(text, "dp")) == ("tp = 2", "dp = 4")


# ---- 4. one error per undecided test ---------------------------------------------------------

def test_one_undecided_test_is_one_error(tmp_path: Path) -> None:
    path = write(tmp_path, "if [ -f big ]; then\n"
                           "  PP=4; NL=24; HS=1024; NH=16\n"
                           "else\n"
                           "  PP=2; NL=48; HS=2048; NH=32\n"
                           "fi\n"
                           "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers $NL "
                           "--hidden-size $HS --num-attention-heads $NH --seq-length 128 "
                           "--vocab-size 1000 --pipeline-model-parallel-size $PP\n")
    [diagnostic] = failure(path).diagnostics
    assert diagnostic.span is not None
    assert (diagnostic.span.line, diagnostic.span.column, diagnostic.span.end_column) == (1, 4, 14)
    assert "`-f` tests the file system" in diagnostic.message
    # the four flags the test decides, the one read first named in the message (the launch's
    # parallel sizes are read before the model), the others in the note
    assert diagnostic.message.startswith("--pipeline-model-parallel-size: $PP depends on")
    assert diagnostic.notes == ("the same test also decides --num-layers, --hidden-size, "
                                "--num-attention-heads",)


# ---- 5. flags kept in a variable no command uses ---------------------------------------------

def test_flags_no_command_uses_are_no_training_command(tmp_path: Path) -> None:
    path = write(tmp_path, "# the launch was left out\n"
                           'GPT_ARGS="--num-layers 24 --hidden-size 1024 --num-attention-heads 16"\n'
                           "export DATA=/data\n"
                           'echo "ready"\n')
    [diagnostic] = failure(path).diagnostics
    assert diagnostic.message.startswith("no training command in this file: $GPT_ARGS holds")
    assert diagnostic.code is Code.MISSING and diagnostic.span is not None
    assert (diagnostic.span.line, diagnostic.span.column, diagnostic.span.end_column) == (2, 1, 9)


# ---- the command line ------------------------------------------------------------------------

def test_the_options_on_the_command_line(tmp_path: Path) -> None:
    path = write(tmp_path, "TP=1\n" + LOOPS["while-double"] + 'if [ "$FAST" = 1 ]; then '
                 "MB=4; else MB=1; fi\n"
                 f"{LAUNCH} --tensor-model-parallel-size $TP --micro-batch-size $MB\n")

    def placeverify(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)

    done = placeverify("import", path, "--env", "FAST=1", "--script-args", "--tp 4")
    assert done.returncode == 0, done.stderr
    # TP 4 from the loop, micro-batch 4 from FAST=1; DP = 8 / 4 = 2
    assert "tp = 4" in done.stdout and "micro_batch = 4" in done.stdout
    assert "dp = 2" in done.stdout
    done = placeverify("import", path, "--env", "1FAST=1")
    assert done.returncode == 2 and "'1FAST=1' is not NAME=VALUE" in done.stderr
    done = placeverify("import", path, "--script-args", "'--tp 4")
    assert done.returncode == 2 and "a quote is never closed" in done.stderr


def test_a_function_has_its_own_arguments(tmp_path: Path) -> None:
    # bash(1), FUNCTIONS: "the positional parameters are set to the arguments of the function
    # call" and restored after it: TP is the call's 4, not the script's argument; PP its $1, 2
    path = write(tmp_path, "set_tp() { TP=$1; }\nset_tp 4\nPP=$1\n"
                           f"{LAUNCH} --tensor-model-parallel-size $TP "
                           "--pipeline-model-parallel-size $PP\n")
    # 8 / (4 x 2) = 1
    text = import_file(path, Options(script_args=("2",))).text
    assert (mesh(text, "tp"), mesh(text, "pp"), mesh(text, "dp")) == ("tp = 4", "pp = 2",
                                                                      "dp = 1")
