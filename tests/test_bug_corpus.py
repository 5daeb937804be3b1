"""The corpus of real bugs, ``examples/bugs/README.md`` (issue 12, "Gather your own corpus").

The table there is the claim: one row per public report, its file, whether the bug is expressible,
and the conditions ``check`` refutes it on. These tests hold the folder to it: every expressible
row's file exists with its fixed twin and is refuted on exactly the listed conditions, every bug
file is in the README, links name the report their text names, and the totals line counts the
rows. Only a row marked ``landing`` (a file written on another branch) may lack its file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import pytest

from placeverify.api import check
from placeverify.verdicts import Verdict
from tests.conftest import EXAMPLES, example_files

README = EXAMPLES / "bugs" / "README.md"
CONDITIONS = {"integrity": "gradient_integrity", "consistency": "state_consistency",
              "composition": "composition_safety"}
CONSTRUCTS = {f"construct {k}" for k in range(1, 8)} | {"other"}
LINK = re.compile(r"\[([\w.-]+/[\w.-]+)#(\d+)\]\(https://github\.com/([\w.-]+/[\w.-]+)/"
                  r"(issues|pull)/(\d+)\)")


@dataclass(frozen=True)
class Row:
    number: int
    report: str
    link_repo: str
    link_number: str
    file: str | None
    expressible: str
    refuted: frozenset[str]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(text: str, header: str) -> list[list[str]]:
    lines = text.splitlines()
    start = lines.index(header)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line))
    return rows


@cache
def corpus() -> tuple[Row, ...]:
    text = README.read_text(encoding="utf-8")
    rows = []
    for cells in _table(text, "| # | report | file | mechanism | expressible | refuted |"):
        number, report, file, _, expressible, refuted = cells
        link = LINK.fullmatch(report)
        assert link is not None, report
        name = file.strip("`") if file != "—" else None
        conditions = frozenset() if refuted == "—" else \
            frozenset(CONDITIONS[c.strip()] for c in refuted.split(","))
        rows.append(Row(int(number), f"{link.group(1)}#{link.group(2)}", link.group(3),
                        link.group(5), name, expressible, conditions))
    return tuple(rows)


def illustrative() -> dict[str, frozenset[str]]:
    text = README.read_text(encoding="utf-8")
    return {cells[0].strip("`"): frozenset(CONDITIONS[c.strip()] for c in cells[2].split(","))
            for cells in _table(text, "| file | mechanism | refuted |")}


@cache
def refuted(name: str) -> frozenset[str]:
    verification = check(str(EXAMPLES / "bugs" / f"{name}.place")).verification
    assert verification is not None
    assert Verdict.UNKNOWN.value not in verification.verdicts().values()
    return frozenset(c for c, v in verification.verdicts().items() if v == Verdict.REFUTED.value)


def test_rows_are_numbered_and_each_report_appears_once() -> None:
    rows = corpus()
    assert [r.number for r in rows] == list(range(1, len(rows) + 1))
    assert len({r.report for r in rows}) == len(rows)
    assert len(rows) >= 40


def test_each_link_names_the_report_its_text_names() -> None:
    for row in corpus():
        repo, number = row.report.split("#")
        assert (row.link_repo, row.link_number) == (repo, number), row


def test_expressible_rows_say_how_and_the_others_say_what_is_missing() -> None:
    for row in corpus():
        if row.expressible == "yes":
            assert row.file is not None and row.refuted, row
        elif row.expressible.startswith("landing: "):
            construct, branch = row.expressible.removeprefix("landing: ").split(", branch ")
            assert construct in CONSTRUCTS and branch, row
            assert row.file is not None and row.refuted, row
        else:
            assert row.expressible.startswith("no: "), row
            need = row.expressible.removeprefix("no: ").split(" (")[0]
            assert need in CONSTRUCTS, row
            assert row.file is None and not row.refuted, row


def test_every_bug_file_is_in_the_readme_once_as_a_report_or_a_textbook_case() -> None:
    files = {p.stem for p in example_files("bugs")}
    reported = {r.file for r in corpus() if r.expressible == "yes"}
    landing = {r.file for r in corpus() if r.expressible.startswith("landing")}
    textbook = set(illustrative())
    assert not reported & textbook and not landing & (reported | textbook)
    assert reported | textbook <= files  # written here: they exist
    assert files <= reported | landing | textbook  # and nothing else is in the folder


@pytest.mark.parametrize("name", sorted({r.file for r in corpus() if r.expressible == "yes"
                                         and r.file is not None}))
def test_an_expressible_rows_file_is_refuted_on_the_listed_conditions(name: str) -> None:
    listed = {r.refuted for r in corpus() if r.file == name}
    assert len(listed) == 1, f"rows of {name} disagree on its conditions"
    assert (EXAMPLES / "bugs" / f"{name}.place").is_file()
    assert (EXAMPLES / "ok" / f"{name}-fixed.place").is_file(), f"{name} has no fixed twin"
    assert refuted(name) == listed.pop()


@pytest.mark.parametrize("name", sorted(illustrative()))
def test_a_textbook_file_is_refuted_on_the_listed_conditions(name: str) -> None:
    assert refuted(name) == illustrative()[name]


@pytest.mark.parametrize("row", [r for r in corpus() if r.expressible.startswith("landing")],
                         ids=lambda r: r.report)
def test_a_landing_rows_file_is_checked_once_it_exists(row: Row) -> None:
    path = EXAMPLES / "bugs" / f"{row.file}.place"
    if not path.is_file():
        branch = row.expressible.split("branch ")[-1]
        pytest.skip(f"{row.file} lands with branch {branch}")
    assert row.refuted <= refuted(str(row.file))


def test_the_totals_line_counts_the_rows() -> None:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"\*\*Totals:\*\* (\d+) bugs; (\d+) expressible \(([\d.]+)%\): (\d+) refuted "
                      r"by (\d+) files in this folder, (\d+) landing; (\d+) not expressible "
                      r"today\.", text)
    assert match is not None
    n, expressible, percent, yes, files, landing, no = match.groups()
    rows = corpus()
    written = [r for r in rows if r.expressible == "yes"]
    landed = [r for r in rows if r.expressible.startswith("landing")]
    assert int(n) == len(rows)
    assert int(yes) == len(written) and int(landing) == len(landed)
    assert int(files) == len({r.file for r in written})
    assert int(expressible) == len(written) + len(landed)
    assert int(no) == len(rows) - int(expressible)
    assert percent == f"{100 * int(expressible) / len(rows):.1f}"
