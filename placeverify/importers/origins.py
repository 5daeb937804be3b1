"""Where a value of a configuration file came from: the key as the user wrote it, and its span.

The lowest module of the importers: the plan every importer builds (:mod:`.common`) and the
frameworks' consistency rules (:mod:`.rules`) both name values by their origin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placeverify.diagnostics import Source, Span


@dataclass(frozen=True, slots=True)
class Origin:
    """The key a value came from: its name as the user wrote it, and where."""

    key: str
    source: Source
    span: Span | None = None


@dataclass(frozen=True, slots=True)
class Value:
    """A value read from a configuration file, with its origin."""

    value: Any
    origin: Origin
