"""Writing the files a command is asked for: atomically, and only over a regular file.

Every file placeverify writes (``check --trace``, ``import -o``, ``search -o``, ``replay --emit``)
goes through :func:`write_atomically`: the text goes to a temporary file in the target's folder,
is flushed and synced, and is renamed over the target, so a reader never sees half a file and an
old one is never lost; on any failure (a full disk, a missing folder, no permission) the
temporary file is removed. Only a regular file is written: a symlink to one is followed and its
target replaced; a directory, a FIFO, a socket or a device at the path is refused, never
replaced. A failure is :class:`WriteFailed`, an ``OSError`` whose :meth:`WriteFailed.error` is
the diagnostic the commands print, exit 4 (a file that cannot be read or written).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from placeverify.diagnostics import Code, Diagnostic, ExitCode, PlaceError, Severity, Source


class WriteFailed(OSError):
    """``path`` could not be written, for ``reason``; nothing half-written was left behind.
    ``strerror`` is the reason, as for any ``OSError``."""

    def __init__(self, path: str, reason: str, what: str = "file") -> None:
        super().__init__(reason)
        self.strerror = reason
        self.path = path
        self.reason = reason
        self.what = what

    def error(self) -> PlaceError:
        """``path: error: cannot write <what>: <reason>  [read]``, exit 4."""
        return PlaceError([Diagnostic(Severity.ERROR, f"cannot write {self.what}: {self.reason}",
                                      Code.READ)], Source(self.path, ""), ExitCode.READ_ERROR)


def reason(err: OSError) -> str:
    """Why ``err`` happened, as a diagnostic says it: ``no space left on device``."""
    text = err.strerror or str(err) or type(err).__name__
    return text[:1].lower() + text[1:]


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def target(path: str | Path, what: str = "file") -> Path:
    """The file a write to ``path`` replaces (a symlink's target), after checking that it is a
    regular file or nothing yet, in an existing folder; otherwise :class:`WriteFailed`."""
    name = str(path)
    where = Path(path)
    try:
        if where.is_symlink() or where.exists():
            where = where.resolve()
            mode = where.stat().st_mode
            if not stat.S_ISREG(mode):
                raise WriteFailed(name, f"{name} is {_kind(mode)}; give the path of a regular file",
                                  what)
        folder = where.parent if str(where.parent) else Path(".")
        if not folder.is_dir():
            raise WriteFailed(name, f"no folder {folder}" if not folder.exists()
                              else f"{folder} is not a folder", what)
    except WriteFailed:
        raise
    except OSError as err:
        raise WriteFailed(name, reason(err), what) from None
    return where


def check_writable(path: str, what: str = "file") -> None:
    """Refuse, before any work, a ``path`` that :func:`write_atomically` would refuse: a
    :class:`PlaceError` with exit 4."""
    try:
        target(path, what)
    except WriteFailed as failed:
        raise failed.error() from None


def write_atomically(text: str, path: str | Path, what: str = "file") -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder, synced and
    renamed (see the module doc); :class:`WriteFailed` when it cannot be, with nothing left."""
    where = target(path, what)
    temporary = ""
    try:
        # Named before it exists and made inside the try: a SIGTERM whose handler raises at any
        # point still finds the name to remove (a fault fuzz run once found it left when
        # tempfile.mkstemp had made the file but not yet returned its name).
        fd = -1
        for _ in range(100):
            temporary = str(where.parent / f".{where.name}.{os.urandom(6).hex()}.tmp")
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                break
            except FileExistsError:
                temporary = ""
        if fd < 0:
            raise FileExistsError(f"no free temporary name beside {where}")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, where)
    except BaseException as err:
        if temporary:
            Path(temporary).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise WriteFailed(str(path), reason(err), what) from None
        raise


def write_file(text: str, path: str | Path, what: str = "file") -> None:
    """:func:`write_atomically`, a failure raised as its :class:`PlaceError` (exit 4)."""
    try:
        write_atomically(text, path, what)
    except WriteFailed as failed:
        raise failed.error() from None
