"""Preloaded by the replay forkserver: import torch and the worker, and run one tiny step so
every lazy import has happened before ranks are forked from it."""

from __future__ import annotations

from placeverify.replay.worker import warm_up

warm_up()
