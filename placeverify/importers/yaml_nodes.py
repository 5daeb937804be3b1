"""YAML as the frameworks read it, with positions: PyYAML's ``SafeLoader`` (what accelerate,
axolotl and TRL load their files with: ``yaml.safe_load``, YAML 1.1 scalars, anchors, aliases,
merge keys, block scalars, the last of duplicate keys) builds the values, and the same parse's
node graph gives the span of every key and list item. Nothing is constructed beyond the safe
tags (no Python objects).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from placeverify.diagnostics import Code, Source, Span
from placeverify.importers.common import Reader
from placeverify.importers.origins import Origin, Value
from placeverify.importers.positions import Path, syntax_error, too_deep

# a key written twice in one mapping: (its path, the first and the repeated key's spans)
Duplicate = Callable[[Path, Span, Span], None]


def compose(source: Source) -> tuple[yaml.Node | None, Any]:
    """The document's node graph and its value, or the parser's error at its position. The
    graph is composed apart from the value: constructing flattens merge keys into the nodes."""
    try:
        node = yaml.compose(source.text, Loader=yaml.SafeLoader)
        data = yaml.load(source.text, Loader=yaml.SafeLoader) if node is not None else None
    except yaml.MarkedYAMLError as error:
        raise syntax_error(source, _message(error), _where(source, error)) from None
    except yaml.YAMLError as error:
        raise syntax_error(source, f"not valid YAML: {error}", None) from None
    except RecursionError:
        raise too_deep(source, comments=True) from None
    return node, data


def _message(error: yaml.MarkedYAMLError) -> str:
    problem = error.problem or error.context or "a YAML syntax error"
    context = f" ({error.context})" if error.context and error.problem else ""
    return f"not valid YAML: {problem}{context}"


def _where(source: Source, error: yaml.MarkedYAMLError) -> Span | None:
    """Where the parser stopped; where the construct it was reading began when it stopped past
    the text (an unclosed list or key at the end of the file)."""
    text_end = len(source.text.rstrip())
    for mark in (error.problem_mark, error.context_mark):
        if mark is not None and mark.index < text_end:
            return Span.point(mark.line + 1, mark.column + 1)
    return source.end_span()


def span_of(node: yaml.Node) -> Span:
    start, end = node.start_mark, node.end_mark
    if end.line > start.line:  # a key's span stays on its line
        return Span(start.line + 1, start.column + 1, start.line + 1, start.column + 2)
    return Span(start.line + 1, start.column + 1, end.line + 1, max(end.column, start.column) + 1)


def key_spans(node: yaml.Node | None, duplicate: Duplicate | None = None) -> dict[Path, Span]:
    """The span of every mapping key (by path of keys, list items by their index as text) and
    of every list item; ``duplicate`` hears of each key written twice in one mapping."""
    spans: dict[Path, Span] = {}

    def walk(node: yaml.Node, path: Path, seen: set[int]) -> None:
        if id(node) in seen:  # an alias of a node already walked (recursive anchors)
            return
        seen = seen | {id(node)}
        if isinstance(node, yaml.MappingNode):
            merges = [v for k, v in node.value if k.tag == "tag:yaml.org,2002:merge"]
            for value_node in merges:  # merged first: the mapping's own keys override them
                for merged in (value_node.value if isinstance(value_node, yaml.SequenceNode)
                               else [value_node]):
                    walk(merged, path, seen)
            own: dict[str, Span] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or \
                        key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                where, span = (*path, key_node.value), span_of(key_node)
                if key_node.value in own and duplicate is not None:
                    duplicate(where, own[key_node.value], span)
                own[key_node.value] = spans[where] = span
                walk(value_node, where, seen)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                where = (*path, str(index))
                spans.setdefault(where, span_of(item))
                walk(item, where, seen)

    if node is not None:
        walk(node, (), set())
    return spans


def load_yaml(source: Source, duplicate: Duplicate | None = None) -> tuple[dict[str, Any],
                                                                          dict[Path, Span]]:
    """A YAML document that is a mapping (an empty file: an empty one), with each key's span."""
    node, data = compose(source)
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        assert node is not None
        raise syntax_error(source, "a YAML mapping of keys was expected, not a "
                           f"{type(data).__name__}", span_of(node))
    return data, key_spans(node, duplicate)


# a setting by its path of keys, with its origin: get("fsdp_config", "fsdp_offload_params",
# default=False); ``why`` says where a default comes from (the origin reads "KEY (why)")
Get = Callable[..., Value]


def load_settings(reader: Reader, source: Source, loader: str) -> tuple[dict[str, Any],
                                                                       dict[Path, Span], Get]:
    """A framework's YAML settings file: its mapping, each key's span, and a getter of values
    with their origins. A key written twice is a warning at the first, since ``loader`` (the
    framework's ``yaml.safe_load``) keeps the last, as placeverify does."""

    def duplicate(path: Path, first: Span, again: Span) -> None:
        reader.warning(f"'{'.'.join(path)}' is written twice; {loader} keeps the last "
                       f"(line {again.line}), as placeverify does",
                       Origin(".".join(path), source, first), code=Code.BAD_VALUE)

    data, spans = load_yaml(source, duplicate)

    def get(*path: str, default: Any = None, why: str = "") -> Value:
        node: Any = data
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        name = ".".join(path)
        if node is None:
            return Value(default, Origin(f"{name} ({why or 'default'})", source))
        return Value(node, Origin(name, source, spans.get(path)))

    return data, spans, get
