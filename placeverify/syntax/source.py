"""Reading a ``.place`` file defensively: UTF-8 text of bounded size, or a clear error.

Every failure (missing, a folder, a FIFO, unreadable, too large, binary, invalid UTF-8) becomes a
:class:`~placeverify.diagnostics.PlaceError` that names the file and, for bad bytes, points at the
line and column of the first one.
"""

from __future__ import annotations

from pathlib import Path

from placeverify.diagnostics import (
    Code,
    Diagnostic,
    ExitCode,
    PlaceError,
    Severity,
    Source,
    Span,
    normalise_newlines,
)

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a strategy is a page of text; larger input is refused at once



def read_source(path: str | Path) -> Source:
    """Read a file as a :class:`Source`, refusing missing, unreadable, huge or binary files."""
    name = str(path)
    p = Path(path)
    try:
        if not p.exists():
            raise _read_error(name, "no such file")
        if p.is_dir():
            raise _read_error(name, "is a directory, not a .place file")
        if not p.is_file():  # a FIFO, socket or device: reading could block or never end
            raise _read_error(name, "not a regular file")
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise PlaceError([Diagnostic(
                Severity.ERROR,
                f"file is {size:,} bytes; placeverify reads at most {MAX_FILE_BYTES:,} bytes",
                Code.TOO_LARGE)], Source(name, ""))
        with p.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except PermissionError:
        raise _read_error(name, "permission denied") from None
    except OSError as err:
        raise _read_error(name, err.strerror or "cannot be read") from None
    if len(data) > MAX_FILE_BYTES:  # grew while we looked
        raise PlaceError([Diagnostic(Severity.ERROR, f"file is larger than {MAX_FILE_BYTES:,} bytes",
                                     Code.TOO_LARGE)], Source(name, ""))
    return Source(name, decode_text(name, data))


def _read_error(name: str, why: str) -> PlaceError:
    return PlaceError([Diagnostic(Severity.ERROR, f"cannot read file: {why}", Code.READ)],
                      Source(name, ""), ExitCode.READ_ERROR)


def decode_text(name: str, data: bytes) -> str:
    """Decode UTF-8 (a BOM is allowed); NUL bytes or invalid UTF-8 mean 'not a text file'."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    bad = data.find(b"\x00")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = err.start if bad < 0 else min(bad, err.start)
        text = data[:bad].decode("utf-8", errors="replace")
    if bad >= 0:
        prefix = normalise_newlines(data[:bad].decode("utf-8", errors="replace"))
        line = prefix.count("\n") + 1
        column = len(prefix) - (prefix.rfind("\n") + 1) + 1
        shown = Source(name, prefix)
        notes: tuple[str, ...] = ()
        if data[bad] == 0:
            message = "not a text file: it contains a NUL byte (0x00)"
        else:
            message = f"not a text file: byte 0x{data[bad]:02x} is not valid UTF-8"
            notes = ("a .place file is UTF-8 text; save it as UTF-8",)
        raise PlaceError([Diagnostic(Severity.ERROR, message, Code.NOT_TEXT,
                                     Span.point(line, column), notes)], shown)
    return text


