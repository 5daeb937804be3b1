"""The docs site and README run as written (issue 31, "Done when"): every ``$ placeverify ...``
example of README.md and of ``docs/`` is run, each line it shows must be a line of what the
command prints today (a line ``...`` marks lines left out; ``...`` inside a line, text left out
of a long line), and it must exit with the code the example gives (``# exit N`` after the
command; none means 0). Every statement of the grammar has its
language page with a table of keys and an example, and ``mkdocs build --strict`` passes.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from placeverify.api import parse
from tests.conftest import ROOT
from tests.test_readme import shell

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
BLOCK = re.compile(r"^```[a-z]*\n(\$ .*?)^```", re.M | re.S)
EXIT = re.compile(r"\s+#\s*exit (\d+)\s*$")


@dataclass(frozen=True)
class Command:
    line: str  # what runs (bash)
    exit_code: int
    shown: tuple[str, ...]


@dataclass(frozen=True)
class Example:
    page: str
    number: int  # the block's place among the page's examples
    commands: tuple[Command, ...]


def parse_block(text: str) -> tuple[Command, ...]:
    """A block's commands: each ``$ `` line, with the lines shown under it until the next."""
    commands: list[Command] = []
    for chunk in re.split(r"^(?=\$ )", text, flags=re.M):
        if not chunk.strip():
            continue
        first, *shown = chunk.rstrip("\n").split("\n")
        match = EXIT.search(first)
        line = first[2:match.start()] if match else first[2:]
        commands.append(Command(line.strip(), int(match.group(1)) if match else 0,
                                tuple(s for s in shown if s.strip() != "...")))
    return tuple(commands)


def examples() -> list[Example]:
    """Every block of a page whose commands are placeverify's (benchmark blocks are figures,
    written by their scripts to docs/figures/ by `make figures`, not run here)."""
    out = []
    for page in PAGES:
        number = 0
        for block in BLOCK.findall(page.read_text(encoding="utf-8")):
            commands = parse_block(block)
            if all(c.line.startswith("placeverify ") for c in commands):
                number += 1
                out.append(Example(page.relative_to(ROOT).as_posix(), number, commands))
    return out


EXAMPLES = examples()


def shown_in(line: str, printed: set[str]) -> bool:
    """Is the shown ``line`` printed: as it stands, or with each ``...`` in it any text."""
    if line in printed:
        return True
    if "..." not in line:
        return False
    pattern = re.compile(".*?".join(re.escape(part) for part in line.split("...")))
    return any(pattern.fullmatch(p) for p in printed)


def test_the_pages_have_examples() -> None:
    pages = {e.page for e in EXAMPLES}
    assert "README.md" in pages
    assert {"docs/importers.md", "docs/overrides.md", "docs/ci.md", "docs/cli.md"} <= pages
    readme = [e for e in EXAMPLES if e.page == "README.md"]
    assert len(readme) >= 7  # fit, no fit, accumulation, import, imported check, search, replay
    assert any(c.exit_code != 0 for e in EXAMPLES for c in e.commands)


def test_a_block_parses_into_commands_shown_lines_and_exit_codes() -> None:
    block = "$ placeverify a   # exit 1\nx\n...\ny\n$ placeverify b\nz\n"
    assert parse_block(block) == (Command("placeverify a", 1, ("x", "y")),
                                  Command("placeverify b", 0, ("z",)))


def test_an_ellipsis_inside_a_line_stands_for_left_out_text() -> None:
    printed = {"fix: normalise by the global token count (transformers#34191)"}
    assert shown_in("fix: normalise by ... (transformers#34191)", printed)
    assert not shown_in("fix: normalise by ... (transformers#1)", printed)
    assert not shown_in("fix: normalise by the global token count", printed)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.page}#{e.number}")
def test_an_example_prints_what_its_page_shows(example: Example, tmp_path: Path) -> None:
    if any(c.line.startswith("placeverify replay") for c in example.commands):
        pytest.importorskip("torch")  # replay (the test extras install it)
    work = tmp_path / "checkout"
    work.mkdir()
    for name in ("examples", "proofs", "tests"):  # what the commands read, as a checkout has it
        (work / name).symlink_to(ROOT / name, target_is_directory=True)
    for command in example.commands:  # in order, in one folder: a trace written is then replayed
        done = shell(command.line, work, tmp_path)
        printed = {line.rstrip() for line in (done.stderr + done.stdout).splitlines()}
        assert "Traceback" not in done.stderr, command.line
        missing = [line for line in command.shown if not shown_in(line.rstrip(), printed)]
        assert missing == [], f"{command.line}: not printed:\n" + "\n".join(missing)
        assert done.returncode == command.exit_code, (
            f"{command.line}: exit {done.returncode}, the page says {command.exit_code}")


def statements() -> list[str]:
    """The statements of grammar/placement.lark (its ``_statement`` alternatives)."""
    grammar = (ROOT / "grammar" / "placement.lark").read_text(encoding="utf-8")
    [rule] = re.findall(r"^_statement:(.*?)^\n", grammar, re.M | re.S)
    return [name.removesuffix("_stmt") for name in re.findall(r"(\w+_stmt)", rule)]


def test_every_statement_has_a_page_with_its_keys_and_an_example() -> None:
    found = statements()
    assert {"model", "precision", "mesh", "place", "step", "loss", "recompute", "offload"} <= set(found)
    for name in found:
        page = DOCS / "language" / ("step/index.md" if name == "step" else f"{name}.md")
        assert page.is_file(), f"no page for the statement '{name}'"
        text = page.read_text(encoding="utf-8")
        keyword = "loss_scale" if name == "loss_scale" else name
        assert text.startswith(f"# `{keyword}`"), page
        assert re.search(r"^\|---", text, re.M), f"{page}: no table of keys"
        blocks = re.findall(r"^```\n(.*?)^```", text, re.M | re.S)
        assert any(re.search(rf"^\s*{keyword}\b", b, re.M) for b in blocks), f"{page}: no example"


def test_every_example_of_the_language_pages_parses() -> None:
    """Each ``.place`` example of docs/language/ is text the grammar accepts (no ``$`` command)."""
    blocks = [(page, block) for page in sorted((DOCS / "language").rglob("*.md"))
              for block in re.findall(r"^```\n(.*?)^```", page.read_text(encoding="utf-8"),
                                      re.M | re.S) if not block.startswith("$")]
    assert len(blocks) >= len(statements())
    for page, block in blocks:
        assert parse(block).statements, f"{page}: an example without statements"


SECTIONS = DOCS / "figures"
INCLUDE = re.compile(r'^--8<-- "figures/([\w-]+\.md)"$', re.M)
COMMAND = re.compile(r"^Command: `\.venv/bin/python benchmarks/(\w+)\.py\b[^`]*`$", re.M)
AWAITS = re.compile(r"^Awaits `\.venv/bin/python benchmarks/(\w+)\.py [^`]*--docs\b[^`]*`", re.M)
WRITTEN = re.compile(r"^<!-- written by benchmarks/(\w+)\.py: ", re.M)


def figures_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("figures", ROOT / "benchmarks" / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_figures_page_includes_every_section_and_only_those() -> None:
    page = (DOCS / "figures.md").read_text(encoding="utf-8")
    included = INCLUDE.findall(page)
    assert len(included) == len(set(included)), "a section included twice"
    assert sorted(included) == sorted(p.name for p in SECTIONS.glob("*.md"))
    assert len(included) >= 10


def section_scripts() -> list[str]:
    return sorted({p.stem.split("-")[0] for p in SECTIONS.glob("*.md")})


@pytest.mark.parametrize("path", sorted(SECTIONS.glob("*.md")), ids=lambda p: p.name)
def test_a_section_names_the_script_that_writes_it(path: Path) -> None:
    """Each section's file is ``<script>[-name].md``; its command runs that script, and the
    section is either written by it or says which ``--docs`` command it awaits."""
    text = path.read_text(encoding="utf-8")
    script = path.stem.split("-")[0]
    assert (ROOT / "benchmarks" / f"{script}.py").is_file(), path.name
    assert text.startswith("### "), f"{path.name}: a section starts with its heading"
    assert COMMAND.findall(text) == [script], f"{path.name}: one command, of {script}.py"
    marks = WRITTEN.findall(text) + AWAITS.findall(text)
    assert marks == [script], f"{path.name}: written by {script}.py, or awaiting its --docs run"
    assert re.search(r"^\| what \| figure \|$", text, re.M), path.name
    assert re.search(r"^Machine: .+\.$", text, re.M), path.name


@pytest.mark.parametrize("script", section_scripts())
def test_a_script_with_a_section_takes_docs(script: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--docs" in done.stdout and "--docs-name" in done.stdout


def test_the_writer_writes_the_same_bytes_for_the_same_figures(tmp_path: Path) -> None:
    figures = figures_module()
    rows = [("verification, per example", "median 6.9 ms, max 64 ms"), ("goal", "met")]
    facts = {"CPU cores": "2", "Python": "3.11.7"}
    argv = ["-n", "3", "--docs", "--docs-name", "quiet", "examples/ok"]
    first = figures.write_section("check_latency", "Latency", rows, name="quiet", argv=argv,
                                  facts=facts, tables=["| a |\n|---|\n| 1 |"], folder=tmp_path)
    text = first.read_bytes()
    again = figures.write_section("check_latency", "Latency", rows, name="quiet", argv=argv,
                                  facts=facts, tables=["| a |\n|---|\n| 1 |"], folder=tmp_path)
    assert again == first == tmp_path / "check_latency-quiet.md"
    assert again.read_bytes() == text
    assert [p.name for p in tmp_path.iterdir()] == ["check_latency-quiet.md"]
    lines = text.decode().splitlines()
    assert lines[0] == "### Latency"
    # the command reproduces the figures: the arguments as run, less --docs and its name
    assert "Command: `.venv/bin/python benchmarks/check_latency.py -n 3 examples/ok`" in lines
    assert "| verification, per example | median 6.9 ms, max 64 ms |" in lines
    assert lines[-1] == "Machine: CPU cores: 2; Python: 3.11.7."
    assert not re.search(r"20\d\d-\d\d|[0-9a-f]{40}", text.decode()), "a date or a commit"
    changed = figures.write_section("check_latency", "Latency", [rows[0], ("goal", "NOT met")],
                                    name="quiet", argv=argv, facts=facts, folder=tmp_path)
    assert changed.read_bytes() != text


@pytest.mark.parametrize("rows", [[], [("median", "")], [("", "0.3 s")]])
def test_the_writer_refuses_a_section_without_figures(rows: list[tuple[str, str]],
                                                      tmp_path: Path) -> None:
    figures = figures_module()
    with pytest.raises(ValueError):
        figures.write_section("prove_all", "Proofs", rows, argv=[], facts={"CPU cores": "2"},
                              folder=tmp_path)
    assert not list(tmp_path.iterdir()), "nothing written"


def test_make_figures_refreshes_every_section_that_a_script_writes() -> None:
    """Each section written by its script (not one awaiting its run) is rewritten by a line of
    the Makefile's figures targets: the same script, with --docs and the section's name."""
    make = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n\t\t", "")
    recipes = [line.split() for line in re.findall(r"^\t\$\(BIN\)/python (benchmarks/.*)$", make, re.M)]
    for path in SECTIONS.glob("*.md"):
        if WRITTEN.search(path.read_text(encoding="utf-8")) is None:
            continue
        script, _, name = path.stem.partition("-")
        assert any(r[0] == f"benchmarks/{script}.py" and "--docs" in r
                   and (r[r.index("--docs-name") + 1] if "--docs-name" in r else "") == name
                   for r in recipes), f"make figures does not write {path.name}"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    for module in ("mkdocs", "material", "mkdocs_click"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[docs]'; make test does)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    cli = (tmp_path / "site" / "cli" / "index.html").read_text(encoding="utf-8")
    for command in ("check", "compare", "prove", "replay", "measure", "import", "search"):
        assert f"placeverify {command}" in cli, f"the CLI reference lacks '{command}'"
