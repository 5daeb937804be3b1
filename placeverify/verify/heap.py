"""The caller's heap is not the verification's: its objects are left out of garbage collection.

A full collection walks every object the process tracks. In a process that holds a large heap
before it verifies (a test run's worker, a notebook with a model loaded) one takes a large part of
a second under load, and a collection that straddles the deadline carries the verification that
far past its budget (a CI run: 2.58 s on a 2 s budget; ``benchmarks/budget.py --compare`` runs
both ways beside CPU hogs). :func:`callers_heap_frozen` moves what exists when the
verification starts into the collector's permanent generation (``gc.freeze``) and puts it back
in the oldest one when the outermost verification ends (``gc.unfreeze``): the verification's own
garbage is collected as before, the caller's waits until the verification is over.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0


@contextmanager
def callers_heap_frozen() -> Iterator[None]:
    """Within the block (nested and concurrent blocks share one freeze), collections skip every
    object that existed when the outermost block began."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1:
            gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.unfreeze()
