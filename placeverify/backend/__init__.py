"""The runtime the two torch backends share (``placeverify replay`` and ``placeverify measure``).

:mod:`placeverify.backend.available` says whether torch can be imported, without importing it;
:mod:`placeverify.backend.runtime` is the front: it starts the ranks (:mod:`~placeverify.backend.
pool` forks replay ranks from a warm forkserver, :mod:`~placeverify.backend.processes` starts a
fresh interpreter per measure rank), watches them and collects their JSON answers, and reports
every way a run can fail as one :class:`placeverify.backend.contract.BackendFailure`; each rank
follows its parent (:mod:`~placeverify.backend.follow`) and the janitor
(:mod:`~placeverify.backend.janitor`) cleans up after a parent killed outright.
Nothing here imports torch: only the worker modules (:mod:`placeverify.replay.worker`,
:mod:`placeverify.measure.worker`) do, inside the rank processes.
"""
