"""``placeverify search``: the verified Pareto frontier of layouts for a model on a cluster.

The data flow, one module per stage:

    Problem (problem.py: model, precision, device, devices, global batch, from a file or flags)
      --space.layouts--> every legal Layout (degrees of dp/tp/pp/cp/ep, ZeRO/FSDP/HSDP,
                         sequence parallelism, recomputation, offload, micro-batch size and count,
                         interleaving)
      --screen.estimate--> a closed-form peak and step time per layout (floats, microseconds)
      --run.finalists--> the layouts worth the full model: the best by screened time, and those
                         near the screened memory/time frontier
      --render.place_text + api.load_text + api.costs + time.step_time--> the exact figures
                         ``check`` would print for the layout's ``.place`` text
      --run.frontier--> the Pareto frontier of exact peak memory vs step time among those that fit
      --api.verify--> the three conditions proved for every layout shown (else it is not shown)
      --> SearchResult (run.py) --> report/search_text.py (text, JSON) --> cli.py

The screen decides only which layouts reach the full model; every figure ``search`` prints,
ranks by or writes is the full model's, on the same ``.place`` text that ``-o`` writes.
"""
