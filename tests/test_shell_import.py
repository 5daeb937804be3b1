"""Launch scripts read as bash reads them (placeverify/importers/shell.py), never run.

The fixtures are written here in the shapes of Megatron-LM's published examples (arrays of
flags, ``if [[ ... ]]`` blocks that append to them, ``${1:-default}``, ``$(...)`` in commands that
do not matter, multi-line double-quoted argument strings); each expected value is worked out by
hand in its test from bash's rules (word splitting of unquoted expansions, quoted
``"${A[@]}"``, ``${NAME:-word}``) and Megatron-LM's (world = nproc x nnodes, DP = world /
(TP x PP x CP), expert groups sized in ``megatron/core/parallel_state.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from placeverify.diagnostics import PlaceError, Source
from placeverify.importers import Options
from placeverify.importers.registry import import_file
from placeverify.importers.shell import Script

MODEL = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --vocab-size 1000 "
         "--seq-length 128")


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.sh"
    path.write_text(text)
    return str(path)


def errors(path: str, **options: object) -> list[tuple[str, int, int]]:
    with pytest.raises(PlaceError) as error:
        import_file(path, Options(**options))  # type: ignore[arg-type]
    return [(d.message, d.span.line if d.span else 0, d.span.column if d.span else 0)
            for d in error.value.diagnostics]


def mesh_line(text: str, axis: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(f"{axis} ="))


# ---- command substitution is an unknown value, not an error ---------------------------------

def test_a_substitution_in_a_command_that_does_not_matter_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, 'CKPT=${1:-ckpt/run}\n'
                           'mkdir -p "$(dirname "$CKPT")" `date +%s` <(true)\n'
                           f"torchrun --nproc-per-node 4 pretrain_gpt.py {MODEL} "
                           "--tensor-model-parallel-size 2\n")
    text = import_file(path).text
    # world 4 x 1 node; DP = 4 / 2 = 2
    assert "dp = 2" in mesh_line(text, "dp") and "world = 4" in text


def test_an_unknown_node_count_is_an_error_at_the_word_that_needs_it(tmp_path: Path) -> None:
    script = ("GPUS=8\n"
              "NNODES=$(scontrol show hostnames | wc -l)\n"
              "torchrun --nproc-per-node $GPUS --nnodes $NNODES pretrain_gpt.py \\\n"
              f"    {MODEL}\n")
    path = write(tmp_path, script)
    [(message, line, column)] = errors(path)
    # the `$NNODES` of line 3: "torchrun --nproc-per-node $GPUS --nnodes " is 41 characters
    assert (line, column) == (3, 42)
    assert message.startswith("--nnodes: $NNODES is assigned from a command substitution at "
                              "line 2")
    assert "pass --world N" in message
    # --world 16 = 8 per node x 2 nodes gives it; DP = 16 / 1 = 16
    text = import_file(path, Options(world=16)).text
    assert "world = 16" in text and "dp = 16" in mesh_line(text, "dp")
    assert "--nnodes" in mesh_line(text, "world")
    # 12 is not a multiple of the 8 processes torchrun starts per node
    [(message, line, column)] = errors(path, world=12)
    assert "--world 12 is not a multiple of --nproc-per-node 8" in message
    assert (line, column) == (3, 10)


def test_positions_after_a_substitution_on_the_same_line(tmp_path: Path) -> None:
    line = ('torchrun --nproc-per-node 8 pretrain_gpt.py --save "$(pwd)/ck" '
            "--tensor-model-parallel-size $TP\n")
    path = write(tmp_path, line)
    found = errors(path)
    [(message, row, column)] = [e for e in found if e[0].startswith("--tensor")]
    assert "$TP is not assigned in this script" in message
    assert (row, column) == (1, line.index("$TP") + 1)


# ---- static conditionals ---------------------------------------------------------------------

def test_only_the_branch_a_static_test_takes_is_read(tmp_path: Path) -> None:
    # DTYPE is fp8: the first branch; N=3 -gt 2: the elif; [ "$MODE" = a ] is false: the else
    path = write(tmp_path, 'DTYPE="fp8"\nN=3\nMODE=b\nPAR=()\n'
                           'if [[ "$DTYPE" == "fp8" ]]; then\n'
                           '    PAR+=(--tensor-model-parallel-size 2)\n'
                           'else\n'
                           '    PAR+=(--tensor-model-parallel-size 4)\n'
                           'fi\n'
                           'if [ "$N" -le 2 ]; then PAR+=(--pipeline-model-parallel-size 4)\n'
                           'elif [[ $N -gt 2 && -n "$MODE" ]]; then PAR+=(--pipeline-model-parallel-size 2)\n'
                           'fi\n'
                           'if [ "$MODE" = a ]; then GPUS=4; else GPUS=16; fi\n'
                           'X=1\n[[ $MODE != b ]] && X=2\n'
                           f'torchrun --nproc-per-node $GPUS pretrain_gpt.py {MODEL} ${{PAR[@]}} '
                           '--micro-batch-size $X\n')
    text = import_file(path).text
    # world 16, TP 2, PP 2: DP = 16 / 4 = 4; the micro-batch stays 1
    assert "tp = 2" in mesh_line(text, "tp") and "pp = 2" in mesh_line(text, "pp")
    assert "dp = 4" in mesh_line(text, "dp") and "world = 16" in text
    assert "micro_batch = 1" in text


def test_an_undecided_test_that_decides_placement_is_an_error_at_the_test(tmp_path: Path) -> None:
    path = write(tmp_path, "PAR=()\n"
                           'if [ -n "$USE_TP" ]; then\n'
                           "    PAR+=(--tensor-model-parallel-size 4)\n"
                           "fi\n"
                           f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} ${{PAR[@]}}\n")
    [(message, line, column)] = errors(path)
    assert (line, column) == (2, 4)  # `[ -n "$USE_TP" ]`
    assert message.startswith("--tensor-model-parallel-size: it is given only if the test")
    assert "$USE_TP is not assigned in this script" in message
    # a scalar the branches leave different: at the test too
    path = write(tmp_path, 'if [[ $SIZE == big ]]; then TP=8; else TP=2; fi\n'
                           f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} "
                           "--tensor-model-parallel-size $TP\n")
    [(message, line, column)] = errors(path)
    assert (line, column) == (1, 4)
    assert "$TP depends on the test `[[ $SIZE == big ]]` at line 1" in message
    # Mixtral's example shape: an undecided test that only appends logging flags is fine
    path = write(tmp_path, "LOG=(--log-interval 1)\n"
                           'if [ -n "${WANDB_API_KEY}" ]; then\n'
                           "    LOG+=(--wandb-project p --wandb-exp-name e)\n"
                           "fi\n"
                           f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} ${{LOG[@]}}\n")
    text = import_file(path).text
    assert "dp = 8" in mesh_line(text, "dp")


def test_a_static_case_takes_its_arm(tmp_path: Path) -> None:
    path = write(tmp_path, 'SCALE="small"\ncase "$SCALE" in\n  big) TP=8 ;;\n  small|tiny) TP=2 ;;\n'
                           '  *) exit 1 ;;\nesac\n'
                           f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} "
                           "--tensor-model-parallel-size $TP\n")
    assert "tp = 2" in mesh_line(import_file(path).text, "tp")


def test_an_assignment_in_a_loop_is_unknown(tmp_path: Path) -> None:
    # over words only running the script gives (a loop over "$@" runs zero times without
    # --script-args: tests/test_shell_inputs.py)
    path = write(tmp_path, "TP=1\nfor a in $(cat sizes); do TP=$a; done\n"
                           f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} "
                           "--tensor-model-parallel-size $TP\n")
    [(message, line, column)] = errors(path)
    assert "the for loop at line 2" in message and (line, column) == (2, 1)


# ---- word splitting ---------------------------------------------------------------------------

def test_unquoted_array_items_split_and_quoted_ones_do_not() -> None:
    source = Source("t.sh", 'A=()\nA+=( "--fp8-format hybrid" --bf16 )\n'
                            'run ${A[@]}\nrun "${A[@]}"\nrun "${A[*]}"\nS="x  y"\nrun $S "$S"\n')
    commands = [[w.text for w in c.words] for c in Script(source).commands]
    assert commands == [["run", "--fp8-format", "hybrid", "--bf16"],
                        ["run", "--fp8-format hybrid", "--bf16"],
                        ["run", "--fp8-format hybrid --bf16"],
                        ["run", "x", "y", "x  y"]]
    # each word keeps the place where it is written: "--fp8-format" at line 2, column 7
    first = Script(source).commands[0].words[1]
    assert first.span is not None and (first.span.line, first.span.column) == (2, 7)


def test_array_items_split_into_flags_and_values(tmp_path: Path) -> None:
    path = write(tmp_path, 'PAR=( "--tensor-model-parallel-size 2" "--pipeline-model-parallel-size 2" )\n'
                           f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} ${{PAR[@]}}\n")
    text = import_file(path).text
    # 8 / (2 x 2) = 2
    assert "tp = 2" in mesh_line(text, "tp") and "dp = 2" in mesh_line(text, "dp")


# ---- defaults ---------------------------------------------------------------------------------

def test_positional_and_environment_defaults_are_taken_and_said(tmp_path: Path) -> None:
    path = write(tmp_path, 'TP=${1:-2}\nTOK=${3:-"MOCK"}\nNNODES=${SLURM_NNODES:-"2"}\n'
                           ': ${PP:=2}\n'
                           'if [[ "$TOK" == "MOCK" ]]; then V=(--vocab-size 1000); fi\n'
                           "torchrun --nproc-per-node 4 --nnodes $NNODES pretrain_gpt.py "
                           "--num-layers 4 --hidden-size 256 --num-attention-heads 8 "
                           "--seq-length 128 ${V[@]} --tensor-model-parallel-size $TP "
                           "--pipeline-model-parallel-size $PP\n")
    text = import_file(path).text
    # world 4 x 2 = 8, TP 2, PP 2: DP 2
    assert "world = 8" in text and "dp = 2" in mesh_line(text, "dp")
    world = mesh_line(text, "world")
    assert "$SLURM_NNODES unset at line 3" in world and "'2'" in world
    [header] = [line for line in text.splitlines() if line.startswith("# Assumed")]
    assert "$1 not given at line 1" in header and "$PP unset at line 4" in header
    # --world replaces the guess: 16 = 4 per node x 4 nodes, DP 16 / 4 = 4; the header keeps the
    # other assumptions only
    text = import_file(path, Options(world=16)).text
    world = mesh_line(text, "world")
    assert "world = 16" in world and "in place of the script's --nnodes" in world
    assert "dp = 4" in mesh_line(text, "dp")
    [header] = [line for line in text.splitlines() if line.startswith("# Assumed")]
    assert "SLURM_NNODES" not in header and "$1 not given" in header
    found = [m for m, _, _ in errors(path, world=6)]
    assert any("--world 6 is not a multiple of --nproc-per-node 4" in m for m in found)


def test_a_launcher_the_script_does_not_name_is_said(tmp_path: Path) -> None:
    path = write(tmp_path, f"${{LAUNCHER}} pretrain_gpt.py {MODEL}\n")
    [(message, line, column)] = errors(path)
    assert message.startswith("world size unknown: the launcher ${LAUNCHER} is not known")
    assert (line, column) == (1, 1)
    assert "dp = 8" in mesh_line(import_file(path, Options(world=8)).text, "dp")


# ---- quoting across lines, here-documents, syntax errors -------------------------------------

def test_a_multi_line_double_quoted_argument_string(tmp_path: Path) -> None:
    # T5's example shape: arguments in a double-quoted string with continuations and a quote
    # in a comment
    path = write(tmp_path, '# the "small" model\n'
                           'DIST="\n    --nproc_per_node 8 \\\n    --nnodes 1\n"\n'
                           'ARGS="\n    --tensor-model-parallel-size 4 \\\n'
                           f'    {MODEL}\n"\n'
                           "cat <<EOF\nit's a \"note\n$(not run)\nEOF\n"
                           "torchrun $DIST pretrain_gpt.py $ARGS\n")
    text = import_file(path).text
    assert "tp = 4" in mesh_line(text, "tp") and "dp = 2" in mesh_line(text, "dp")


def test_an_unclosed_quote_is_a_syntax_error_where_it_opens(tmp_path: Path) -> None:
    path = write(tmp_path, 'X=1\nY="abc\ntorchrun --nproc-per-node 8 pretrain_gpt.py\n')
    [(message, line, column)] = errors(path)
    assert message == "cannot read this script: this double quote is never closed"
    assert (line, column) == (2, 3)


# ---- expert parallelism: Megatron-core's own sizing -------------------------------------------

def test_expert_groups_that_megatron_refuses_are_its_error(tmp_path: Path) -> None:
    # world 8, TP 1, PP 4, EP 8: DP = 8 / 4 = 2; parallel_state sizes experts by ETP x EP x PP
    # = 1 x 8 x 4 = 32, which does not divide 8: Megatron-core raises, so it is not a layout
    # placeverify lacks but a config error
    path = write(tmp_path, f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} \\\n"
                           "    --num-experts 8 --pipeline-model-parallel-size 4 \\\n"
                           "    --expert-model-parallel-size 8\n")
    [(message, line, column)] = errors(path)
    assert "not divisible by ETP * EP * PP = 1 * 8 * 4 = 32" in message
    assert "not modelled" not in message and (line, column) == (3, 5)
    # world 8, CP 4, EP 4: DP = 8 / 4 = 2; ETP x EP x PP = 4 divides 8, so Megatron runs it with
    # the EP ranks taken from DP x CP = 8, which placeverify's ep axis (carved from dp) cannot
    path = write(tmp_path, f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} \\\n"
                           "    --num-experts 8 --context-parallel-size 4 \\\n"
                           "    --expert-model-parallel-size 4\n")
    [(message, line, column)] = errors(path)
    assert message.startswith("not modelled: --expert-model-parallel-size 4")


def test_the_readme_slurm_fixture() -> None:
    # tests/importers/llama3-8b-megatron-slurm.sh: NNODES from $(scontrol ...) (line 11), used
    # at line 15, column 14; with --world 32: DP = 32 / (TP 2 x PP 2) = 8, and $2's default
    # "bf16" takes the elif branch (--bf16, not --fp16 nor the fp8 flags)
    path = str(Path(__file__).parent / "importers" / "llama3-8b-megatron-slurm.sh")
    [(message, line, column)] = errors(path)
    assert (line, column) == (15, 14) and "command substitution at line 11" in message
    text = import_file(path, Options(world=32)).text
    assert "tp = 2" in mesh_line(text, "tp") and "pp = 2" in mesh_line(text, "pp")
    assert "dp = 8" in mesh_line(text, "dp") and "precision megatron" in text
    assert "fp8" not in text
    [header] = [line for line in text.splitlines() if line.startswith("# Assumed")]
    assert "$2 not given at line 7" in header and "deciding the test at line 30" in header


def test_a_sourced_file_is_a_warning_at_its_name(tmp_path: Path) -> None:
    path = write(tmp_path, f"source ./conf.sh\ntorchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}\n")
    imported = import_file(path)
    [warning] = [w for w, _ in imported.warnings if "sources" in w.message]
    assert warning.message.startswith("the script sources ./conf.sh, which placeverify does not")
    assert warning.span is not None and (warning.span.line, warning.span.column) == (1, 8)


def test_a_value_given_only_under_an_undecided_test_is_an_error(tmp_path: Path) -> None:
    # the flag is certain, its value is not; and a default reaches a value through $(( ))
    path = write(tmp_path, "PAR=(--tensor-model-parallel-size)\n"
                           'if [ -f big ]; then PAR+=(4); else PAR+=(2); fi\n'
                           "N=${NODES:-2}\nWORLD=$((4 * N))\n"
                           f"torchrun --nproc-per-node 4 --nnodes $((WORLD / 4)) pretrain_gpt.py "
                           f"{MODEL} ${{PAR[@]}}\n")
    [(message, line, column)] = errors(path)
    assert message.startswith("--tensor-model-parallel-size: its value 4: it is given only if")
    assert "`-f` tests the file system" in message and (line, column) == (2, 4)
    path = write(tmp_path, "N=${NODES:-2}\nWORLD=$((4 * N))\n"
                           f"torchrun --nproc-per-node 4 --nnodes $((WORLD / 4)) pretrain_gpt.py "
                           f"{MODEL}\n")
    text = import_file(path).text
    # 4 x (4 * 2 / 4) = 8, from $NODES's default
    assert "world = 8" in text and "$NODES unset at line 1" in mesh_line(text, "world")
