"""Pattern removal in launch scripts, ``${NAME#pattern}``, ``##``, ``%``, ``%%`` (bash(1),
Parameter Expansion): each case is also run by bash itself, the oracle, and the launch-script
reader must agree with it character for character."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from placeverify.importers import Options
from placeverify.importers.registry import import_file
from placeverify.importers.shell_patterns import pattern_regex, strip

CASES = [
    ("--tp=2", "#", "*="), ("a=b=c", "#", "*="), ("a=b=c", "##", "*="),
    ("llama3_8b.yaml", "%", ".*"), ("a.b.c", "%", ".*"), ("a.b.c", "%%", ".*"),
    ("a.b.c", "##", "*."), ("abc", "#", "x"), ("abc", "#", ""), ("abc", "%", "?"),
    ("file-01", "%", "-[0-9][0-9]"), ("file-0a", "%", "-[0-9][0-9]"), ("abc", "#", "[!x]"),
    ("abc", "##", "*"), ("abc", "%%", "*"), ("a]b", "#", "[]]"), ("ab", "#", "[^a]"),
]


def _ours(value: str, op: str, pattern: str) -> str:
    chars = tuple((c, i, None) for i, c in enumerate(value))
    kept = strip(op, chars, pattern_regex([(c, False) for c in pattern]))
    return "".join(c for c, _, _ in kept)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash, the oracle, is not installed")
@pytest.mark.parametrize(("value", "op", "pattern"), CASES)
def test_pattern_removal_is_bashs(value: str, op: str, pattern: str) -> None:
    script = f"v='{value}'; printf '%s' \"${{v{op}{pattern}}}\""
    expected = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              check=True).stdout
    assert _ours(value, op, pattern) == expected, script


LAUNCH = """#!/bin/bash
for arg in "$@"; do
  case $arg in
    --tp=*) TP="${arg#*=}" ;;
    --pp=*) PP="${arg#*=}" ;;
  esac
done
torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size ${TP:-1} \\
  --pipeline-model-parallel-size ${PP:-1} --num-layers 32 --hidden-size 4096 \\
  --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 \\
  --micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 --bf16
"""


def test_key_value_arguments_are_split_as_bash_splits_them(tmp_path: Path) -> None:
    # --script-args '--tp=2 --pp=4': TP = "2", PP = "4": world 8 / (2 x 4) = dp 1
    path = tmp_path / "train.sh"
    path.write_text(LAUNCH)
    text = import_file(str(path), Options(script_args=("--tp=2", "--pp=4"))).text
    assert "tp = 2 " in text and "pp = 4 " in text and "dp = 1 " in text
    plain = import_file(str(path), Options()).text  # no arguments: the loop runs zero times
    assert "dp = 8 " in plain and "    tp = " not in plain and "    pp = " not in plain
