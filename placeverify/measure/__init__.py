"""The measure backend: run the real torch implementation of a strategy at small scale on CPU and
compare what it holds and sends with placeverify's predictions (``placeverify measure``).

Only :mod:`placeverify.measure.worker`, :mod:`placeverify.measure.models`,
:mod:`placeverify.measure.probes` and :mod:`placeverify.measure.allocation` import torch, and only
inside the worker processes.
"""
