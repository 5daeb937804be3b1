"""The runtime the two torch backends share (``placeverify replay`` and ``placeverify measure``).

:mod:`placeverify.backend.available` says whether torch can be imported, without importing it;
:mod:`placeverify.backend.runtime` starts the ranks, watches them and collects their JSON answers,
and reports every way a run can fail as one :class:`placeverify.backend.runtime.BackendFailure`.
Nothing here imports torch: only the worker modules (:mod:`placeverify.replay.worker`,
:mod:`placeverify.measure.worker`) do, inside the rank processes.
"""
