"""Launch scripts that hide their command in a string (``srun ... bash -c "$LAUNCHER $CMD"``),
write a configuration from a here-document (``cat <<EOT > $config_json``) or take the node count
from their ``#SBATCH`` header: the shapes of BigScience's Megatron-DeepSpeed Slurm scripts.

Every expected word, offset and text is worked out by hand from bash's rules: a double-quoted
string keeps its blanks and drops ``\\`` before ``$``; the child shell of ``bash -c`` splits the
string into words and removes the quotes inside it; an unquoted here-document delimiter expands
``$NAME`` in the body, a quoted one does not, ``<<-`` drops the leading tabs.
"""

from __future__ import annotations

from placeverify.diagnostics import Source
from placeverify.importers.shell import Script


def read(text: str) -> Script:
    return Script(Source("job.slurm", text))


def training(script: Script) -> list[str]:
    return next([w.text for w in c.words] for c in script.commands
                if any(w.text.endswith(".py") for w in c.words))


# ---- bash -c -------------------------------------------------------------------------------

LAUNCH = ('ARGS=" \\\n'
          "    --pp-partition-method 'type:transformer|embedding' \\\n"
          '    --num-layers 70 \\\n'
          '    "\n'
          'export LAUNCHER="python -u -m torch.distributed.run \\\n'
          '    --nproc_per_node 8 \\\n'
          '    "\n'
          'export CMD="pretrain_gpt.py $ARGS"\n'
          'srun --wait=60 --jobid $SLURM_JOB_ID bash -c "$LAUNCHER --node_rank \\$SLURM_PROCID '
          '$CMD" 2>&1 | tee -a main_log.txt\n')


def test_bash_c_runs_its_string_as_commands() -> None:
    words = training(read(LAUNCH))
    # the child shell removes the single quotes the double-quoted ARGS kept: one word
    assert words == ["python", "-u", "-m", "torch.distributed.run", "--nproc_per_node", "8",
                     "--node_rank", "$SLURM_PROCID", "pretrain_gpt.py", "--pp-partition-method",
                     "type:transformer|embedding", "--num-layers", "70"]


def test_a_word_of_the_string_points_where_it_was_written() -> None:
    script = read(LAUNCH)
    command = next(c for c in script.commands if any(w.text == "70" for w in c.words))
    seventy = next(w for w in command.words if w.text == "70")
    regex = next(w for w in command.words if w.text.startswith("type:"))
    assert seventy.span is not None and regex.span is not None
    # "    --num-layers 70 \" is line 3: '7' at column 18; on line 2 the quote the child shell
    # removes is column 27 (4 blanks, 21 characters of flag, a blank), so the word starts at 28
    assert (seventy.span.line, seventy.span.column) == (3, 18)
    assert (regex.span.line, regex.span.column) == (2, 28)


def test_an_escaped_dollar_is_the_child_shells_variable() -> None:
    command = next(c for c in read(LAUNCH).commands if any(w.text == "70" for w in c.words))
    rank = next(w for w in command.words if w.text == "$SLURM_PROCID")
    assert rank.unresolved is not None and "SLURM_PROCID" in rank.unresolved


def test_an_unknown_value_inside_the_string_is_never_reread_as_shell() -> None:
    # MASTER's value is not known; its text, a command substitution with blanks and a pipe, must
    # stay one unknown word, not become commands or words of the child shell
    script = read('MASTER=$(scontrol show hostnames "$NODES" | head -n 1)\n'
                  'bash -c "torchrun --rdzv_endpoint $MASTER:6000 train.py --x 1"\n')
    words = next(c.words for c in script.commands if any(w.text == "train.py" for w in c.words))
    endpoint = words[2]
    assert [w.text for w in words][3:] == ["train.py", "--x", "1"]
    assert endpoint.unresolved is not None and "command substitution" in endpoint.unresolved
    assert endpoint.text.endswith(":6000")
    assert not any(w.text in ("head", "scontrol") for c in script.commands for w in c.words)


def test_the_child_shells_assignments_do_not_reach_the_script() -> None:
    script = read('bash -c "TP=2"\necho $TP\n')
    echo = next(c for c in script.commands if c.words[0].text == "echo")
    assert echo.words[1].unresolved is not None  # TP is not assigned by the script itself


def test_bash_without_c_is_an_ordinary_command() -> None:
    script = read("bash run.sh --x 1\n")
    assert [w.text for w in script.commands[0].words] == ["bash", "run.sh", "--x", "1"]


# ---- here-documents -------------------------------------------------------------------------

def test_a_here_document_is_the_file_the_script_writes() -> None:
    text = ('MBS=2\nconfig_json="./ds_config.$SLURM_JOB_ID.json"\n'
            'cat <<EOT > $config_json\n{\n  "train_micro_batch_size_per_gpu": $MBS\n}\nEOT\n'
            'echo --deepspeed_config ${config_json}\n')
    script = read(text)
    echo = next(c for c in script.commands if c.words[0].text == "echo")
    written = script.files[echo.words[2].name]  # the same name, though $SLURM_JOB_ID is unknown
    assert written.text.text == '{\n  "train_micro_batch_size_per_gpu": 2\n}\n'
    assert written.line == 3 and written.by is None
    # the expanded 2 stands where MBS was assigned: offset 4 of the text ("MBS=2")
    two = next(o for c, o, _ in written.text.chars if c == "2")
    assert two == 4


def test_a_quoted_delimiter_keeps_the_body_as_written_and_dash_strips_tabs() -> None:
    script = read("X=1\ncat > a.json <<'EOF'\n{\"x\": $X}\nEOF\ncat <<-EOF > b.txt\n\t\tv=$X\n\tEOF\n")
    assert script.files["a.json"].text.text == '{"x": $X}\n'
    assert script.files["b.txt"].text.text == "v=1\n"


def test_a_file_another_command_writes_is_known_to_exist_but_not_its_text() -> None:
    script = read('sed "s/SIZE/8/" template.json > ds_config.json\n')
    written = script.files["ds_config.json"]
    assert written.by == "`sed`" and written.text.text == ""


# ---- #SBATCH ----------------------------------------------------------------------------------

def test_sbatch_nodes_give_slurm_nnodes_as_an_assumption() -> None:
    script = read("#!/bin/bash\n#SBATCH --job-name=x\n#SBATCH --nodes=48   # all of them\n"
                  "#SBATCH -N 3\nNNODES=$SLURM_NNODES\n"
                  "torchrun --nnodes $NNODES --nproc_per_node 8 train.py\n")
    nnodes = training(script)[2]
    word = next(w for c in script.commands for w in c.words if w.text == nnodes)
    # the last directive sbatch reads wins: -N 3 (line 4)
    assert nnodes == "3" and word.unresolved is None
    assert word.assumed and "#SBATCH at line 4" in word.assumed[0]


def test_sbatch_lines_after_the_first_command_are_comments() -> None:
    script = read("echo start\n#SBATCH --nodes=4\ntorchrun --nnodes $SLURM_NNODES train.py\n")
    word = training(script)[2]
    assert word == "$SLURM_NNODES"


def test_dash_strips_tabs_from_a_quoted_body_too() -> None:
    # <<- drops the leading tabs whatever the quoting; a tab inside a line stays
    script = read("cat <<-'EOF' > c.txt\n\t\ta\tb\n\tc\n\tEOF\n")
    assert script.files["c.txt"].text.text == "a\tb\nc\n"
