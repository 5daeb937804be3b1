"""Edits of a ``.place`` file's text that need its parse: swap or remove the ``step`` block.

Used with :func:`placeverify.ir.render.step_text` to write out the canonical step of a file so
that it can be read, edited and mutated like a written one (``benchmarks/soundness.py``).
"""

from __future__ import annotations

from placeverify.diagnostics import Source, Span
from placeverify.syntax import ast
from placeverify.syntax.parser import parse_source


def replace_step(text: str, step: str | None) -> str:
    """A file's text with its ``step`` block replaced by ``step`` (a whole ``step { ... }``
    block), or removed when ``step`` is None; a file without one gets ``step`` appended."""
    file = parse_source(Source("<text>", text))
    blocks = [s for s in file.statements if isinstance(s, ast.StepStmt)]
    if not blocks:
        return text if step is None else text.rstrip("\n") + "\n\n" + step
    start, end = span_offsets(text, blocks[0].span)
    return text[:start] + ("" if step is None else step.rstrip("\n")) + text[end:]


def span_offsets(text: str, span: Span) -> tuple[int, int]:
    """The span's start and (exclusive) end as offsets into ``text``."""
    starts = [0]
    for line in text.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    return starts[span.line - 1] + span.column - 1, starts[span.end_line - 1] + span.end_column - 1
