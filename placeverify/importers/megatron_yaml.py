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

import yaml

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span
from placeverify.importers.positions import syntax_error
from placeverify.importers.shell_values import Word
from placeverify.importers.yaml_nodes import compose, span_of

_TOP_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)[ \t]*:", re.M)
_ENVIRONMENT = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
KEY = "MODEL_ARGS"
MERGE = "tag:yaml.org,2002:merge"


def is_test_config(source: Source) -> bool:
    """Whether the file is a Megatron-LM test configuration (a top-level ``MODEL_ARGS:``)."""
    return any(m.group(1) == KEY for m in _TOP_KEY.finditer(source.text))


def arguments(source: Source) -> list[Word]:
    """The training arguments ``MODEL_ARGS`` stands for, each word at its key's text.

    The file is parsed as YAML (PyYAML, positions kept: :mod:`.yaml_nodes`); of its top-level
    keys only ``MODE`` and ``MODEL_ARGS`` are read. A flag written twice is passed twice, as the
    harness's ``to_entries`` does, and argparse keeps the last (the argument reader warns)."""
    node, _ = compose(source)
    if not isinstance(node, yaml.MappingNode):
        raise syntax_error(source, "a Megatron-LM test configuration is a YAML mapping",
                           span_of(node) if node is not None else None)
    top = {k.value: (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    if "MODE" in top:
        key, value = top["MODE"]
        if isinstance(value, yaml.ScalarNode) and value.value == "inference":
            raise PlaceError([Diagnostic(
                Severity.ERROR, "not modelled: MODE inference (a Megatron-LM inference test: "
                "placeverify checks training steps)", Code.NOT_MODELLED,
                span_of(key).cover(span_of(value)))], source)
    key, block = top[KEY]
    if not isinstance(block, yaml.MappingNode):
        raise syntax_error(source, f"{KEY} is not a block of '--flag: value' lines",
                           span_of(block) if block.start_mark.line > key.start_mark.line
                           or block.value else Span.point(key.start_mark.line + 1,
                                                          key.start_mark.column + len(KEY) + 2))
    words: list[Word] = []
    for flag_node, value_node in block.value:
        if flag_node.tag == MERGE or not isinstance(flag_node, yaml.ScalarNode) or \
                not str(flag_node.value).startswith("--"):
            what = ("a YAML merge key (placeverify reads MODEL_ARGS as '--flag: value' "
                    "entries)" if flag_node.tag == MERGE
                    else "not a '--flag: value' entry of MODEL_ARGS")
            raise syntax_error(source, what, span_of(flag_node))
        span = span_of(flag_node)
        words.append(Word(flag_node.value, span))
        for text in _values(source, value_node):
            found = _ENVIRONMENT.search(text)
            words.append(Word(text, span, found.group(0) if found else None))
    return words


def _values(source: Source, node: yaml.Node) -> list[str]:
    """The words a flag's value becomes: none for ``true`` (the bare flag) or no value, the
    items of a list, else the value's text (``false`` included, as yq's tostring writes it)."""
    if isinstance(node, yaml.SequenceNode):
        return [word for item in node.value for word in _values(source, item)]
    if isinstance(node, yaml.MappingNode):
        raise syntax_error(source, "a flag's value is a mapping (MODEL_ARGS takes a value or a "
                           "list of values)", span_of(node))
    if node.tag == "tag:yaml.org,2002:bool":
        truth = yaml.SafeLoader("").construct_yaml_bool(node)
        return [] if truth else ["false"]
    if node.tag == "tag:yaml.org,2002:null":
        return []
    return [str(node.value)]
