"""Where a finding is in the user's own files, once for SARIF and GitHub annotations.

A ``.place`` file is checked as written: a span is in that file. A framework configuration is
checked through the ``.place`` text its importer produced (:mod:`placeverify.importers`), so a
span is in that generated text, which the user never sees and CI cannot annotate. The importer
keeps, for each generated line, the key it came from (:attr:`Imported.origins`): a span on such
a line is that key's span in its file (the configuration, or the ``--model`` config the key is
in). A span on a generated line without a written key (a line placeverify derived, such as the
``mesh {`` line or a world size no single key gives, or a framework default the file does not
write), and a finding without a span, point at the configuration file itself with no span: a
SARIF region of line 1, a file-level GitHub annotation; the message then quotes the generated
line. Never at the nearest line that has a key: that key did not decide it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from placeverify.diagnostics import Span

if TYPE_CHECKING:
    from placeverify.importers.common import Imported


@dataclass(frozen=True, slots=True)
class Place:
    """A file, as the user named it, and a span in it (None: the whole file)."""

    path: str
    span: Span | None
    via: str = ""  # for a span moved out of generated text: that text's line, as a note


@dataclass(frozen=True, slots=True)
class Locator:
    """Maps spans of the checked text to the user's files (see the module docstring)."""

    path: str  # the file checked, as the user named it
    imported: Imported | None = None

    def place(self, span: Span | None) -> Place:
        """Where ``span`` (in the checked text) is for the user."""
        imported = self.imported
        if imported is None:
            return Place(self.path, span)
        if span is None:
            return Place(imported.path, None)
        via = imported.where(span.line)
        origin = imported.origins.get(span.line)
        if origin is None or origin.span is None:
            return Place(imported.path, None, via)
        return Place(origin.source.path, origin.span, f"{via} (from {origin.key})")

    def line(self, line: int) -> tuple[str, int]:
        """The file and line of a line of the checked text (a trace row's): line 1 of the
        configuration when that line has no origin."""
        found = self.place(Span(line, 1, line, 2))
        return found.path, found.span.line if found.span is not None else 1
