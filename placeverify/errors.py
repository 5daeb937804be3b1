"""The one root of placeverify's own exceptions, so a caller can catch them all.

Derived from it: :class:`placeverify.diagnostics.PlaceError` (rendered diagnostics: parse,
lowering, rule and trace errors), :class:`placeverify.trace.TraceError` (a malformed trace
document, turned into a PlaceError by :func:`placeverify.trace.load`),
:class:`placeverify.semantics.schedule.Unmodelled` (a
statement a backend does not model) and :class:`placeverify.replay.layout.Unsupported` (a
strategy the torch replay cannot run).
"""

from __future__ import annotations


class PlaceverifyError(Exception):
    """Base of every error placeverify raises on purpose."""
