"""The measured-figures page: each benchmark writes its own section of it.

A benchmark run with ``--docs`` ends by calling :func:`write_section`, which writes
``docs/figures/<script>.md`` (or ``<script>-NAME.md`` with ``--docs-name NAME``, for the figures
of a run with other arguments): a heading, the command that reproduces the figures, the figures as a
table, any tables the script prints, and the facts of the machine that matter. It overwrites that
one file only. The text depends on the figures and the machine only (no dates, no commits), so a
rerun that measures the same figures writes the same bytes. ``docs/figures.md`` includes the
sections (``pymdownx.snippets``); ``make figures`` runs every benchmark with ``--docs``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ROOT / "docs" / "figures"
PYTHON = ".venv/bin/python"
NAME = re.compile(r"[a-z0-9][a-z0-9-]*")

Figure = tuple[str, str]
"""One row of a section: what was measured, and the figure."""


def add_docs_flag(parser: argparse.ArgumentParser) -> None:
    """``--docs`` (off by default, so a benchmark never edits the tree unasked) and
    ``--docs-name``."""
    parser.add_argument("--docs", action="store_true",
                        help="also write these figures to docs/figures/<script>.md (the "
                             "Measured figures page)")
    parser.add_argument("--docs-name", default="", metavar="NAME",
                        help="with --docs, write docs/figures/<script>-NAME.md instead (the "
                             "figures of a run with other arguments)")


def section_path(script: str, name: str = "", folder: Path = SECTIONS) -> Path:
    if name and not NAME.fullmatch(name):
        raise ValueError(f"--docs-name {name!r}: use lower-case letters, digits and '-'")
    return folder / (f"{script}-{name}.md" if name else f"{script}.md")


def command(script: str, argv: Sequence[str]) -> str:
    """The command that reproduces the figures: the script and the arguments it ran with, less
    ``--docs`` and ``--docs-name`` (which only write them down)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--docs-name":
            skip = True
        elif arg != "--docs" and not arg.startswith("--docs-name="):
            kept.append(arg)
    return shlex.join([PYTHON, f"benchmarks/{script}.py", *kept])


def machine(*, torch: bool = False, device: str | None = None, load: bool = False) -> dict[str, str]:
    """The facts of this machine that the figures depend on: cores and Python always, torch's
    version (read from its metadata, not imported) and the device where a benchmark runs torch,
    and the load average where timings are the figures (other jobs slow them down)."""
    facts = {"CPU cores": str(os.cpu_count()), "Python": platform.python_version(),
             "system": f"{platform.system()} {platform.machine()}"}
    if torch:
        try:
            facts["torch"] = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            facts["torch"] = "not installed"
    if device is not None:
        facts["device"] = device
    if load and hasattr(os, "getloadavg"):
        facts["load average at the end (1, 5, 15 min)"] = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return facts


def section(script: str, title: str, cmd: str, figures: Sequence[Figure],
            facts: Mapping[str, str], tables: Sequence[str] = (), notes: Sequence[str] = (),
            awaits: str | None = None) -> str:
    """The Markdown of one section. ``awaits`` (a command) marks a section whose figures were
    written by hand and await that command."""
    if not figures:
        raise ValueError(f"{script}: a section needs at least one figure")
    for what, figure in figures:
        if not what.strip() or not figure.strip():
            raise ValueError(f"{script}: a figure without a name or a value: {(what, figure)!r}")
    lines = [f"### {title}", ""]
    if awaits is not None:
        lines += [f"Awaits `{awaits}`: the figures below were written by hand, not by the script.", ""]
    else:
        lines += [f"<!-- written by benchmarks/{script}.py: run the command below with --docs to "
                  "refresh it; do not edit by hand -->", ""]
    lines += [f"Command: `{cmd}`", "", "| what | figure |", "|---|---|"]
    lines += [f"| {_cell(what)} | {_cell(figure)} |" for what, figure in figures]
    for block in [*tables, *notes]:
        lines += ["", block.strip("\n")]
    lines += ["", "Machine: " + "; ".join(f"{k}: {v}" for k, v in facts.items()) + "."]
    return "\n".join(lines) + "\n"


def write_section(script: str, title: str, figures: Sequence[Figure], *, name: str = "",
                  argv: Sequence[str] | None = None, facts: Mapping[str, str] | None = None,
                  tables: Sequence[str] = (), notes: Sequence[str] = (),
                  folder: Path = SECTIONS) -> Path:
    """Write ``<folder>/<script>[-name].md`` and return its path. ``argv`` defaults to this
    process's arguments, ``facts`` to :func:`machine`."""
    text = section(script, title, command(script, sys.argv[1:] if argv is None else argv),
                   figures, machine() if facts is None else facts, tables, notes)
    path = section_path(script, name, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {_shown(path)}", file=sys.stderr)
    return path


def _cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|")


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
