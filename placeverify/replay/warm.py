"""Preloaded by the replay forkserver: import torch and the worker, and run one tiny step so
every lazy import has happened before ranks are forked from it."""

from __future__ import annotations

from placeverify.backend.follow import die_with_server_parent

die_with_server_parent()  # before torch: a server whose parent was killed does not import it

from placeverify.replay.worker import warm_up  # noqa: E402  (after the parent is followed)

warm_up()
