"""The docs' preset table and the data table ``placeverify/ir/presets.py`` state the same facts.

The expected values are parsed from docs/language/place.md (the page of `place`), not from the code: each
row's names and aliases, role, axis count, modes (Θ, Ω, G, A), and options (their names, kinds,
words, defaults and bare forms).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from placeverify.ir.placement import Mode, Role
from placeverify.ir.presets import PRESETS, TABLE, OptionKind, PresetSpec

PAGE = Path(__file__).resolve().parents[1] / "docs" / "language" / "place.md"  # the docs page of `place`
HEADER = "| preset | role | axes | (Θ, Ω, G, A) | options |"
TUPLE = re.compile(r"\(([RSMO*]+(?:, [RSMO*]+){3})\)")
OPTION = re.compile(r"`(\w+) = ([^`]+)`")


@dataclass
class Row:
    names: list[str]
    role: str
    axes: int
    modes: list[tuple[str, ...]]
    options: dict[str, list[str]]
    bare: list[str]
    defaults: dict[str, str] = field(default_factory=dict)


def _cells(line: str) -> list[str]:
    """A table row's cells, as Markdown reads them: a | inside `code` or escaped as \\| is text."""
    cells: list[str] = []
    cell, code, escaped = "", False, False
    for char in line.strip():
        if char == "|" and not code and not escaped:
            cells.append(cell)
            cell = ""
            continue
        escaped = char == "\\" and not escaped
        code = code != (char == "`")
        cell += char
    cells.append(cell)
    return [c.strip().replace("\\|", "|") for c in cells[1:-1]]


def readme_rows() -> list[Row]:
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2
    rows: list[Row] = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        name, role, axes, modes, options = _cells(line)
        option_words = {key: [w.strip() for w in value.split("|")]
                        for key, value in OPTION.findall(options)}
        defaults = dict(re.findall(r"`(\w+) = [^`]+` \(default `([^`]+)`\)", options))
        rows.append(Row(names=re.findall(r"`(\w+)`", name), role=role,
                        axes=int(axes.split()[0]),
                        modes=[tuple(m.split(", ")) for m in TUPLE.findall(modes)],
                        options=option_words, bare=re.findall(r"`\w+\((\w+)\)`", options),
                        defaults=defaults))
    return rows


ROWS = readme_rows()


def test_the_readme_table_lists_every_preset_name_once() -> None:
    names = [n for row in ROWS for n in row.names]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(PRESETS)
    assert [row.names[0] for row in ROWS] == [spec.name for spec in TABLE]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.names[0])
def test_a_preset_is_what_the_readme_says(row: Row) -> None:
    spec: PresetSpec = PRESETS[row.names[0]]
    assert spec.name == row.names[0]
    assert list(spec.aliases) == row.names[1:]
    assert spec.role is Role(row.role)
    assert spec.axes == row.axes
    assert spec.modes == tuple(Mode(m) for m in row.modes[0])
    assert set(spec.options) == set(row.options)
    for key, words in row.options.items():
        option = spec.options[key]
        if words == ["true", "false"]:
            assert option.kind is OptionKind.BOOL
        elif len(words) == 1 and len(words[0]) == 1:  # a letter: `microbatches = m`
            assert option.kind is OptionKind.INT
        elif len(words) == 1 and words[0].startswith("["):  # a list: `layers = [l, ...]`
            assert option.kind is OptionKind.INTS
        else:
            assert option.kind is OptionKind.CHOICE
            assert set(option.choices) == set(words)
        if key in row.defaults:
            assert str(option.default) == row.defaults[key]
        else:
            assert option.default is None
    for word in row.bare:
        assert word in spec.positional, word


def test_sequence_parallelism_shards_the_activations_of_a_tensor_axis() -> None:
    for row in ROWS:
        if "sequence_parallel" in row.options:
            assert row.modes[-1] == ("S", "S", "S", "S")


def test_the_option_values_the_readme_equates_with_presets_are_rewrites() -> None:
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    rewrites = {(row.names[0], value): preset for row in ROWS
                for line in lines if line.startswith(f"| `{row.names[0]}`")
                for value, preset in re.findall(r"`(\w+)` is `(\w+)`", line)}
    assert rewrites == {("fsdp", "no_shard"): "ddp", ("fsdp", "hybrid"): "hsdp"}
    for (name, value), preset in rewrites.items():
        assert PRESETS[name].rewrite[value].preset == preset
    # "grad_op keeps the parameters gathered from forward to backward"
    assert PRESETS["fsdp"].rewrite["grad_op"].options == {"reshard_after_forward": False}
