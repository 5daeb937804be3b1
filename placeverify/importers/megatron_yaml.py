"""Megatron-LM's own test configurations, read as the training arguments they become.

NVIDIA/Megatron-LM keeps the configurations of its functional and release tests as YAML
(``tests/functional_tests/test_cases/<model>/<test>/model_config.yaml``): a mapping
``MODEL_ARGS`` of ``--flag: value`` beside keys that decide no placement (``ENV_VARS``,
``METRICS``, ``TEST_TYPE``, ``LAUNCHER``, ``BEFORE_SCRIPT`` / ``AFTER_SCRIPT`` shell blocks, which
are never run); ``MODE: inference`` marks an inference test, refused (it has no training step).
The test harness (``tests/functional_tests/shell_test_utils/_run_training.sh``) turns each entry
into arguments: ``true`` is the bare flag, a flow list ``[a, b]`` gives its items as the flag's
values, anything else is the flag's one value (``false`` included, as the harness passes it).
``MODEL_ARGS_2`` and later keys are the arguments of a resumed run; the first run's
``MODEL_ARGS`` is read. Values naming the harness's environment (``${DATA_PATH}``) stay
unresolved: an error only where such a value would decide placement. The launch (nodes and GPUs
per node) is in the harness's recipe, not in this file: the world size comes from ``--world``.
"""

from __future__ import annotations

import re

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span
from placeverify.importers.positions import _scalar, _strip_comment, syntax_error
from placeverify.importers.shell_values import Word

_TOP_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)[ \t]*:", re.M)
_ENTRY = re.compile(r"(--[A-Za-z0-9][A-Za-z0-9_\-]*)\s*:(\s+|$)")
_MODE = re.compile(r"MODE[ \t]*:[ \t]*(\S+)\s*$")  # the test's kind: pretraining, inference, rl
_ENVIRONMENT = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
KEY = "MODEL_ARGS"


def is_test_config(source: Source) -> bool:
    """Whether the file is a Megatron-LM test configuration (a top-level ``MODEL_ARGS:``)."""
    return any(m.group(1) == KEY for m in _TOP_KEY.finditer(source.text))


def arguments(source: Source) -> list[Word]:
    """The training arguments ``MODEL_ARGS`` stands for, each word at its key's text.

    Only the ``MODEL_ARGS`` block is read (the other top-level keys may hold shell blocks and
    anchors that decide nothing here). A flag written twice is passed twice, as the harness's
    ``to_entries`` does, and argparse keeps the last (the argument reader warns)."""
    lines = source.lines
    for number, line in enumerate(lines, start=1):
        mode = _MODE.match(_strip_comment(line))
        if mode is not None and mode.group(1).strip("'\"") == "inference":
            raise PlaceError([Diagnostic(
                Severity.ERROR, "not modelled: MODE inference (a Megatron-LM inference test: "
                "placeverify checks training steps)", Code.NOT_MODELLED,
                Span(number, 1, number, len(line.rstrip()) + 1))], source)
    start = next(i for i, line in enumerate(lines)
                 if (top := _TOP_KEY.match(line)) is not None and top.group(1) == KEY)
    head = _strip_comment(lines[start])
    if head.split(":", 1)[1].strip():
        raise syntax_error(source, f"{KEY} is not a block of '--flag: value' lines",
                           Span.point(start + 1, len(KEY) + 2))
    words: list[Word] = []
    indent: int | None = None
    entries = [(n, line) for n in range(start + 2, len(lines) + 1)
               if (line := _strip_comment(lines[n - 1]).rstrip()).strip()]
    entries = entries[:next((i for i, (_, line) in enumerate(entries) if not line[0].isspace()),
                            len(entries))]  # up to the next top-level key
    for at, (number, line) in enumerate(entries):
        column = len(line) - len(line.lstrip(" "))
        if indent is None:
            indent = column
        if column > indent and at > 0 and _continues(entries, at, indent):
            continue  # a value written on the lines after its key (read with that key)
        body = line[column:]
        match = _ENTRY.match(body)
        if column != indent or match is None:
            what = ("a YAML merge key or anchor (placeverify reads MODEL_ARGS as plain "
                    "'--flag: value' lines)" if body.startswith(("<<", "&", "*"))
                    else "not a '--flag: value' line of MODEL_ARGS")
            raise syntax_error(source, what, Span.point(number, column + 1))
        flag = match.group(1)
        span = Span(number, column + 1, number, column + 1 + len(flag))
        words.append(Word(flag, span))
        rest = body[match.end():].strip() or " ".join(
            text.strip() for _, text in _value_lines(entries, at, indent))
        value = _scalar(source, rest, number, column + 1 + match.end()) if rest else None
        if value is True or value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            text = "false" if item is False else str(item)  # yq's tostring
            found = _ENVIRONMENT.search(text)
            words.append(Word(text, span, found.group(0) if found else None))
    return words


def _value_lines(entries: list[tuple[int, str]], at: int, indent: int) -> list[tuple[int, str]]:
    """The lines after entry ``at`` indented deeper than the entries: a plain value written on
    the lines after its key (YAML folds them into one, joined with spaces)."""
    out = []
    for number, line in entries[at + 1:]:
        if len(line) - len(line.lstrip(" ")) <= indent:
            break
        out.append((number, line))
    return out


def _continues(entries: list[tuple[int, str]], at: int, indent: int) -> bool:
    """Whether line ``at`` (indented deeper than the entries) is part of the value of the entry
    above its run of deeper lines, an entry that gave no value on its own line."""
    first = at
    while first > 0 and len(entries[first][1]) - len(entries[first][1].lstrip(" ")) > indent:
        first -= 1
    head = entries[first][1].strip()
    match = _ENTRY.match(head)
    return match is not None and not head[match.end():].strip()
