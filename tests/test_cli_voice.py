"""One voice (issue 31, item 4): click's own errors are placeverify's (``placeverify: error: ...``,
a hint, exit 2, never click's ``Usage: ... Error: ...`` block), and each command's ``--help``
lists only the exit codes that command can return, with one example. Goldens under
``tests/cli/``; ``PLACEVERIFY_UPDATE_GOLDENS=1`` rewrites them (say why in the commit)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "cli"
UPDATE = os.environ.get("PLACEVERIFY_UPDATE_GOLDENS") == "1"

# What each command can return, from each command module's own account of its exits (the
# docstrings of prove/cli.py, measure/cli.py, search/cli.py, replay/cli.py) and README's table;
# SIGHUP and SIGTERM are caught only by the commands that start rank processes.
EXPECTED = {
    "check": {0, 1, 2, 3, 4, 5, 6, 70, 129, 130, 143},
    "compare": {0, 1, 2, 3, 4, 6, 70, 130},
    "prove": {0, 1, 2, 3, 4, 70, 130},
    "replay": {0, 1, 2, 3, 4, 5, 70, 129, 130, 143},
    "measure": {0, 2, 4, 5, 70, 129, 130, 143},
    "search": {0, 2, 3, 4, 5, 6, 70, 130},
    "import": {0, 2, 4, 70, 130},
}

USAGE_ERRORS = {
    "no-such-option": ["check", "--no-such-option", "x.place"],
    "missing-argument": ["check"],
    "bad-value": ["check", "--timeout", "0", "x.place"],
    "no-such-command": ["no-such-command"],
    "bad-choice": ["compare", "--units", "TB", "x.place"],
    "extra-argument": ["measure", "a.place", "b.place"],
    "trace-with-two-files": ["check", "--trace", "t.json", "a.place", "b.place"],
    "json-and-sarif": ["check", "--json", "--output-format", "sarif", "x.place"],
    "search-batch-twice": ["search", "--global-batch", "8", "--batch-tokens", "8"],
}


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PLACEVERIFY_DEBUG"}
    env.update(COLUMNS="80", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden {path.relative_to(ROOT)}: run with PLACEVERIFY_UPDATE_GOLDENS=1"
    assert text == path.read_text(encoding="utf-8")


def listed_codes(help_text: str) -> set[int]:
    section = help_text.split("  Exit codes:\n", 1)[1].split("\n\n", 1)[0]
    return {int(m) for m in re.findall(r"^    (\d+) ", section, re.M)}


def example(help_text: str) -> list[str]:
    section = help_text.split("  Example:\n", 1)[1]
    return [line.strip() for line in section.splitlines() if line.strip()]


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_help_lists_only_the_codes_the_command_returns(command: str) -> None:
    done = run(command, "--help")
    assert done.returncode == 0, done.stderr
    assert listed_codes(done.stdout) == EXPECTED[command]
    first = example(done.stdout)[0]
    assert first.startswith(f"placeverify {command} ") or command == "replay", first
    golden(f"help-{command}.txt", done.stdout)


def test_the_group_help_lists_every_code() -> None:
    done = run("--help")
    assert done.returncode == 0
    assert listed_codes(done.stdout) == set().union(*EXPECTED.values())
    golden("help.txt", done.stdout)


@pytest.mark.parametrize("name", sorted(USAGE_ERRORS))
def test_usage_errors_speak_placeverify(name: str, tmp_path: Path) -> None:
    args = USAGE_ERRORS[name]
    done = run(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0].startswith("placeverify: error: "), done.stderr
    command = args[0] if args[0] in EXPECTED else None
    hint = f"placeverify {command} --help" if command else "placeverify --help"
    assert lines[1:] == [f"placeverify: note: try '{hint}'"], done.stderr
    assert "Usage:" not in done.stderr and "Error:" not in done.stderr
    golden(f"{name}.err", done.stderr)


@pytest.mark.parametrize("command", ["check", "compare", "import"])
def test_the_help_example_runs(command: str, tmp_path: Path) -> None:
    """The example of a command's --help, run in a checkout, exits with a code it lists (0)."""
    for name in ("examples", "tests", "proofs"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    lines = example(run(command, "--help").stdout)
    words = shlex.split(" ".join(line.removesuffix("\\") for line in lines))
    assert words[:2] == ["placeverify", command]
    args: list[str] = []
    for word in words[2:]:  # the shell's glob, as a user's shell expands it
        args.extend(sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob(word))
                    if "*" in word else [word])
    done = run(command, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    if command == "import":
        assert (tmp_path / "zero2.place").read_text(encoding="utf-8").startswith("#")
