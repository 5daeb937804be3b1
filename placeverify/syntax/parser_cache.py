"""A JSON cache of built Lark parsers (data only: nothing read back is executed or unpickled).

Lark's own cache pickles the parser; placeverify never unpickles a file, so it stores Lark's
serialised form (plain dicts, lists, strings and numbers) as JSON instead. Dictionaries with
non-string keys are written as lists of pairs so they come back exactly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import lark
from lark import Lark
from lark.grammar import Rule
from lark.lexer import TerminalDef

PAIRS = "__placeverify_pairs__"
MAX_CACHE_BYTES = 4 << 20


def cache_dir() -> Path | None:
    if os.environ.get("PLACEVERIFY_NO_CACHE") == "1":
        return None
    explicit = os.environ.get("PLACEVERIFY_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "placeverify"


def _key(text: str, options: dict[str, Any], name: str, import_paths: list[str]) -> str:
    payload = json.dumps([name, text, lark.__version__, sorted(options.items()), import_paths,
                          *(_imported_texts(import_paths))])
    return hashlib.sha256(payload.encode()).hexdigest()


def _imported_texts(import_paths: list[str]) -> list[str]:
    texts = []
    for folder in import_paths:
        for grammar in sorted(Path(folder).glob("*.lark")):
            texts.append(grammar.read_text(encoding="utf-8"))
    return texts


def _encode(value: Any) -> Any:
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and PAIRS not in value:
            return {k: _encode(v) for k, v in value.items()}
        return {PAIRS: [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if PAIRS in value and len(value) == 1:
            return {_decode(k): _decode(v) for k, v in value[PAIRS]}
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def load_or_build(text: str, options: dict[str, Any], name: str,
                  import_paths: list[str] | None = None) -> Lark:
    paths = import_paths or []
    folder = cache_dir()
    key = _key(text, options, name, paths)
    path = folder / f"{name}-parser-{key[:24]}.json" if folder else None
    if path is not None:
        cached = _read(path, key)
        if cached is not None:
            return cached
    built = Lark(text, import_paths=paths, **options)
    if path is not None:
        _write(path, key, built)
    return built


def _read(path: Path, key: str) -> Lark | None:
    try:
        if not path.is_file() or path.stat().st_size > MAX_CACHE_BYTES:
            return None
        document = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict) or document.get("key") != key:
            return None
        loaded: Lark = Lark._load_from_dict(  # type: ignore[no-untyped-call]
            _decode(document["data"]), _decode(document["memo"]))
        return loaded
    except Exception:  # a stale, truncated or foreign cache file is rebuilt, never trusted
        return None


def _write(path: Path, key: str, parser: Lark) -> None:
    """Write the cache file atomically (a temporary file renamed over it); never over anything
    but a regular file, and never leaving the temporary file behind."""
    try:
        if path.exists() and not path.is_file():
            return  # a directory, FIFO or device where the file goes: not ours to replace
        data, memo = parser.memo_serialize([TerminalDef, Rule])
        text = json.dumps({"key": key, "data": _encode(data), "memo": _encode(memo)})
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".parser-", suffix=".json", dir=path.parent)
    except (OSError, TypeError, ValueError):
        return  # a read-only home or an unserialisable parser: build each time instead
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
