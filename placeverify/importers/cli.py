"""``placeverify import``, and the hook through which ``check``/``compare`` read configurations."""

from __future__ import annotations

from dataclasses import replace

from placeverify.console import echo, error_console, write_atomically
from placeverify.diagnostics import Diagnostic, ExitCode, Source
from placeverify.importers import Options
from placeverify.importers.common import Imported
from placeverify.importers.registry import import_file, load, with_given
from placeverify.ir.strategy import Strategy
from placeverify.lower.overrides import Settings, apply


def print_warnings(imported: Imported) -> None:
    print_diagnostics(imported.warnings)


def print_diagnostics(diagnostics: list[tuple[Diagnostic, Source]]) -> None:
    """Each diagnostic at its file's text, on standard error."""
    console = error_console()
    for diagnostic, source in diagnostics:
        console.print(diagnostic.render(source), markup=False, highlight=False)


def import_command(path: str, options: Options, out: str | None,
                   settings: Settings | None = None) -> ExitCode:
    """Print (or write atomically to ``out``) the .place text of a configuration file; under
    ``settings`` the text as overridden, lowered first so that a bad override is an error."""
    # The framework's consistency rules are judged on the values the overrides leave.
    imported = import_file(path, with_given(options, settings), judge=not settings)
    if settings:
        _, imported = load(path, options, settings, imported)  # every error of the overridden strategy
        edited = apply(Source(imported.path, imported.text), settings)
        imported = replace(imported, text=edited.annotated())
    print_warnings(imported)
    if out is None:
        echo(imported.text, nl=False)
        return ExitCode.OK
    write_atomically(imported.text, out)
    error_console().print(f"written to {out}", markup=False)
    return ExitCode.OK


def load_strategy(path: str, options: Options, settings: Settings | None = None) -> Strategy:
    """The strategy of a configuration file (under ``settings``), printing the import's
    warnings."""
    return load_import(path, options, settings)[0]


def load_import(path: str, options: Options,
                settings: Settings | None = None) -> tuple[Strategy, Imported]:
    """The strategy of a configuration file (under ``settings``) and its import, printing the
    import's warnings."""
    strategy, imported = load(path, options, settings)
    print_warnings(imported)
    return strategy, imported
