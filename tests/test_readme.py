"""The README's quick start runs as written (issue 14, "Done when"): every command of it, from a
checkout's examples, with the exit code the README gives it. README is a one-page guide (issue 31:
at most 300 lines); its ``$ placeverify ...`` examples, and the docs', run in tests/test_docs.py.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.index("\n## ", start + 1)
    return README[start:end]


def quick_start_commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", section("Quick start"), re.S)
    [block] = [b for b in blocks if "placeverify " in b]
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def shell(command: str, cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``command`` under bash, with ``placeverify`` this checkout's (as the venv's script is)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "placeverify"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m placeverify "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PLACEVERIFY_DEBUG")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT))
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def test_the_quick_start_has_its_commands() -> None:
    assert len(quick_start_commands()) == 7


def test_the_readme_is_one_page() -> None:
    assert len(README.splitlines()) <= 300
    for heading in ("## Quick start", "## Does it fit?", "## Is my gradient accumulation right?",
                    "## Check my framework config", "## Which layout?", "## Replay a counterexample",
                    "## What is proved, and what is assumed"):
        assert f"\n{heading}\n" in README, heading


def test_the_readme_links_name_pages_that_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert len(links) > 10
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_quick_start_runs_as_written(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # replay (the test extras install it)
    work = tmp_path / "checkout"
    work.mkdir()
    for name in ("examples", "proofs"):  # what the commands read, as a fresh checkout has it
        (work / name).symlink_to(ROOT / name, target_is_directory=True)
    for command in quick_start_commands():
        done = shell(command, work, tmp_path)
        expected = 1 if "examples/bugs/" in command else 0  # the README: refutations exit 1
        # a command after '&&' never runs when the one before it exits 1 (issue 14's example)
        assert not ("&&" in command and expected != 0), command
        assert done.returncode == expected, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr
        if command.startswith("placeverify replay"):
            assert "the replay agrees with Z3 (refuted; the real run diverges)" in done.stdout
    assert (work / "t.json").is_file()

