"""A table that fits a width without cutting a cell: one table, or its column groups in turn,
or transposed, or a list.

Cells are never truncated, wrapped or ellipsised (a number cut short is a wrong number). Given
``width`` columns the first of these that fits is printed:

1. **table**: one row per item, every column;
2. **wrapped**: the columns split at their groups into several tables, each repeating the
   label column (the file);
3. **transposed**: one row per column, one column per item (items in chunks that fit);
4. **list**: each item, then one ``header  value`` line per column — which fits any width
   that holds its longest line.

The rows are plain strings or :class:`rich.text.Text` (for a style); widths are terminal cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

Cell = str | Text
GAP = 2  # blanks between columns
INDENT = 2  # blanks before every table line


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its header, its cells (one per item), alignment and group (the columns a
    wrapped layout keeps together)."""

    header: str
    cells: tuple[Cell, ...]
    align: Literal["left", "right"] = "right"
    group: str = ""
    name: str = ""  # the header where it stands alone (transposed, list): 'memory x' for 'x'

    @property
    def long(self) -> str:
        return self.name or self.header

    @property
    def width(self) -> int:
        return max([cell_len(self.header), *(cell_len(_plain(c)) for c in self.cells)])


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def table_width(columns: Sequence[Column]) -> int:
    return INDENT + sum(c.width for c in columns) + GAP * (len(columns) - 1)


def table_lines(columns: Sequence[Column], rule: bool = True) -> list[Text]:
    """The lines of one table: header, a rule under it, one line per item."""
    widths = [c.width for c in columns]
    rows = len(columns[0].cells) if columns else 0

    def line(cells: Sequence[Cell], style: str = "") -> Text:
        out = Text(" " * INDENT)
        for index, (column, cell, width) in enumerate(zip(columns, cells, widths, strict=True)):
            if index:
                out.append(" " * GAP)
            pad = " " * (width - cell_len(_plain(cell)))
            piece = cell if isinstance(cell, Text) else Text(cell, style=style)
            if column.align == "right":
                out.append(pad)
                out.append_text(piece)
            else:
                out.append_text(piece)
                if index < len(columns) - 1:
                    out.append(pad)
        return out

    lines = [line([c.header for c in columns], "bold")]
    if rule:
        lines.append(Text(" " * INDENT + "─" * (table_width(columns) - INDENT)))
    lines.extend(line([c.cells[i] for c in columns]) for i in range(rows))
    return lines


def groups(columns: Sequence[Column]) -> list[list[Column]]:
    """Consecutive columns of the same group."""
    out: list[list[Column]] = []
    for column in columns:
        if out and out[-1][0].group == column.group:
            out[-1].append(column)
        else:
            out.append([column])
    return out


def wrapped(label: Column, columns: Sequence[Column], width: int) -> list[list[Column]] | None:
    """Tables of whole column groups, each with the label first, packed in order; None when a
    group does not fit with the label."""
    tables: list[list[Column]] = []
    current: list[Column] = [label]
    for group in groups(columns):
        if table_width([label, *group]) > width:
            return None
        if table_width([*current, *group]) > width:
            tables.append(current)
            current = [label]
        current.extend(group)
    tables.append(current)
    return tables


def transposed(label: Column, columns: Sequence[Column], width: int) -> list[list[Column]] | None:
    """The table turned: a header column, then one column per item (in chunks that fit); None
    when a single item does not fit beside the headers."""
    headers = Column("", tuple(c.long for c in columns), "left")
    items = [Column(_plain(label.cells[i]), tuple(c.cells[i] for c in columns))
             for i in range(len(label.cells))]
    chunks: list[list[Column]] = []
    current: list[Column] = [headers]
    for item in items:
        if table_width([headers, item]) > width:
            return None
        if len(current) > 1 and table_width([*current, item]) > width:
            chunks.append(current)
            current = [headers]
        current.append(item)
    chunks.append(current)
    return chunks


def listing(label: Column, columns: Sequence[Column]) -> list[Text]:
    """Each item, then ``header  value`` per column: the layout of last resort."""
    key_width = max((cell_len(c.long) for c in columns), default=0)
    out: list[Text] = []
    for i, name in enumerate(label.cells):
        out.append(Text(_plain(name), style="bold"))
        for c in columns:
            line = Text(" " * INDENT + c.long + " " * (key_width - cell_len(c.long) + GAP))
            cell = c.cells[i]
            line.append_text(cell if isinstance(cell, Text) else Text(cell))
            out.append(line)
    return out


Layout = Literal["table", "wrapped", "transposed", "list"]


def fit(label: Column, columns: Sequence[Column], width: int) -> tuple[Layout, list[Text]]:
    """The lines of the first layout that fits ``width``, and which it is."""
    if table_width([label, *columns]) <= width:
        return "table", table_lines([label, *columns])
    tables = wrapped(label, columns, width)
    if tables is not None:
        return "wrapped", _joined([table_lines(t) for t in tables])
    chunks = transposed(label, columns, width)
    if chunks is not None:
        return "transposed", _joined([table_lines(c) for c in chunks])
    return "list", listing(label, columns)


def _joined(blocks: list[list[Text]]) -> list[Text]:
    out: list[Text] = []
    for block in blocks:
        if out:
            out.append(Text(""))
        out.extend(block)
    return out


def print_lines(console: Console, lines: Sequence[Text]) -> None:
    """Lines as they are: the console neither wraps nor crops them."""
    for line in lines:
        console.print(line, soft_wrap=True, overflow="ignore", crop=False)
