"""Imports of configurations that do not give the training sequence length (DeepSpeed JSON,
accelerate YAML): placeverify refuses to take the model's max_position_embeddings for it
(placeverify/importers/hf_config.py), so these tests give it as the command line does,
``--set model.seq=8192`` (8192: Llama 3 8B's training length, arXiv 2407.21783 §3.4.1)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from placeverify.api import overrides
from placeverify.diagnostics import Source
from placeverify.importers import Options, registry
from placeverify.lower.overrides import apply

SEQ = "model.seq=8192"


def with_seq(settings: Any = None) -> Any:
    texts = [s.text for s in settings.items] if settings else []
    if not any(t.startswith("model.seq=") for t in texts):
        texts.append(SEQ)
    return overrides(texts)


DEFAULT = Options()


def load_seq(path: str, options: Options = DEFAULT, settings: Any = None,
             imported: Any = None) -> Any:
    """registry.load under --set model.seq=8192 (and the test's own overrides)."""
    return registry.load(path, options, with_seq(settings), imported)


def import_seq(path: str, options: Options = DEFAULT, settings: Any = None) -> Any:
    """What ``placeverify import FILE --set model.seq=8192`` prints (importers/cli.py)."""
    settings = with_seq(settings)
    imported = registry.import_file(path, registry.with_given(options, settings), judge=False)
    _, imported = registry.load(path, options, settings, imported)
    edited = apply(Source(imported.path, imported.text), settings)
    return replace(imported, text=edited.annotated())
