"""Importers: read a framework's configuration (never run it) and write the .place it means.

One module per format; the format is recognised from the file's content (``--format`` forces
it). Each produces a :class:`~placeverify.importers.common.Plan`, rendered as ``.place`` text whose
lines name the key they came from; that text is then parsed and lowered like any file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The suffixes of the configuration files check and compare hand to the importers. This module
# stays light (the formats are in placeverify.importers.registry), so that checking a .place file
# does not load them.
EXTENSIONS = (".json", ".toml", ".yaml", ".yml", ".sh", ".bash", ".slurm", ".sbatch", ".args",
              ".py")


@dataclass(frozen=True, slots=True)
class Options:
    model: str | None = None  # a Hugging Face config.json
    world: int | None = None
    fmt: str | None = None
    # the keys ``--set`` gives ('model.vocab'): a value the file lacks is then no error
    given: frozenset[str] = frozenset()
    # a launch script's environment (--env NAME=VALUE) and arguments (--script-args; None: not
    # given): placeverify.importers.shell_inputs
    env: tuple[tuple[str, str], ...] = ()
    script_args: tuple[str, ...] | None = None
    # a torchtitan config registry's function (--config, as torchtitan's own --config)
    config: str | None = None


def is_importable(path: str) -> bool:
    """Whether ``check``/``compare`` should import this file rather than parse it as .place."""
    return Path(path).suffix.lower() in EXTENSIONS
