"""The grammar file and the one cached LALR parser built from it.

``grammar/placement.lark`` is the single definition of the ``.place`` syntax (shipped inside the
wheel as ``placeverify/grammar``); :func:`parser` is the one factory that loads it, as lark's own
``Lark.open`` would, but through placeverify's JSON parser cache (:mod:`.parser_cache`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from lark import Lark

from placeverify.syntax import parser_cache

GRAMMAR_NAME = "placement.lark"


def grammar_path() -> Path:
    """The grammar file: inside the installed package, or ``grammar/`` of a source checkout."""
    here = Path(__file__).resolve()
    packaged = here.parents[1] / "grammar" / GRAMMAR_NAME  # placeverify/grammar in a wheel
    if packaged.is_file():
        return packaged
    return here.parents[2] / "grammar" / GRAMMAR_NAME


PARSER_OPTIONS: dict[str, Any] = {"parser": "lalr", "lexer": "contextual",
                                  "propagate_positions": True, "maybe_placeholders": True}


@functools.cache
def parser() -> Lark:
    """The one LALR parser, built once per process or loaded from the parser cache.

    Building the LALR tables takes tens of milliseconds, a large share of a whole ``check``.
    The built parser is cached as JSON (never pickle) under the user's cache folder, keyed by a
    hash of the grammar text, Lark's version and the options; a missing, stale or unreadable
    cache is simply rebuilt. ``PLACEVERIFY_CACHE_DIR`` moves it; ``PLACEVERIFY_NO_CACHE=1``
    turns it off.
    """
    text = grammar_path().read_text(encoding="utf-8")
    return parser_cache.load_or_build(text, PARSER_OPTIONS, "placement")
