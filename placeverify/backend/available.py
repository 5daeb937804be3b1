"""Whether torch is installed, asked without importing it (``placeverify check`` never does)."""

from __future__ import annotations

import importlib.util


def torch_available() -> bool:
    """True when ``import torch`` can find the package (a broken or masked one counts as none)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or masked installation
        return False
