"""Bash's pattern removal, ``${NAME#pattern}``, ``##``, ``%`` and ``%%`` (bash(1), Parameter
Expansion, "Remove matching prefix pattern" / "suffix pattern"): the value less the shortest
(``#``, ``%``) or longest (``##``, ``%%``) prefix or suffix the pattern matches, the value
unchanged when none does. The pattern is bash's (``*``, ``?``, ``[...]`` with ``!`` or ``^``
negating), its quoted characters literal; it is matched here, never by a shell.
"""

from __future__ import annotations

import re

from placeverify.importers.shell_values import Char

STRIPS = ("##", "#", "%%", "%")


def pattern_regex(chars: list[tuple[str, bool]]) -> re.Pattern[str]:
    """The regular expression of a bash pattern given as (character, quoted) pairs."""
    out: list[str] = []
    i = 0
    while i < len(chars):
        c, quoted = chars[i]
        if quoted:
            out.append(re.escape(c))
        elif c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            close = _class_end(chars, i)
            if close is None:
                out.append(re.escape(c))
            else:
                body = "".join(ch for ch, _ in chars[i + 1:close])
                negate = body[:1] in ("!", "^")
                body = body[1:] if negate else body
                inner = "".join("\\" + ch if ch in "\\^" else ch for ch in body)
                out.append(f"[{'^' if negate else ''}{inner}]")
                i = close
        elif c == "\\" and i + 1 < len(chars):
            i += 1
            out.append(re.escape(chars[i][0]))
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _class_end(chars: list[tuple[str, bool]], start: int) -> int | None:
    """The index of the ``]`` closing the bracket expression opened at ``start`` (a ``]`` right
    after ``[``, ``[!`` or ``[^`` is a member, as bash has it)."""
    i = start + 1
    if i < len(chars) and chars[i][0] in "!^":
        i += 1
    if i < len(chars) and chars[i][0] == "]":
        i += 1
    while i < len(chars):
        if chars[i][0] == "]" and not chars[i][1]:
            return i
        i += 1
    return None


def strip(op: str, chars: tuple[Char, ...], pattern: re.Pattern[str]) -> tuple[Char, ...]:
    """``chars`` less the prefix (``#``, ``##``) or suffix (``%``, ``%%``) ``op`` removes."""
    text = "".join(c for c, _, _ in chars)
    n = len(text)
    if op in ("#", "##"):
        cuts = range(n + 1) if op == "#" else range(n, -1, -1)
        for k in cuts:
            if pattern.fullmatch(text[:k]):
                return chars[k:]
        return chars
    cuts = range(n, -1, -1) if op == "%" else range(n + 1)
    for k in cuts:
        if pattern.fullmatch(text[k:]):
            return chars[:k]
    return chars
