"""The pipeline stages torchtitan builds: transformer layers per (virtual) stage, from the last
TOML release (9810191bb^) of ``torchtitan/distributed/pipeline_parallel.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from placeverify.diagnostics import Code
from placeverify.importers.common import Plan, Reader
from placeverify.importers.origins import Origin, Value
from placeverify.ir.model import ARCHITECTURES


def layer_count(plan: Plan, preset: str | None) -> int | None:
    """The model's transformer layers: a bundled preset's, else the ``layers`` entry of the model
    block (a described flavor, or --model's config.json)."""
    if plan.model_name is not None and preset is not None:
        return ARCHITECTURES[preset].layers
    for line in plan.model:
        name, _, value = line.text.partition(" = ")
        if name == "layers" and value.isdigit():
            return int(value)
    return None


def stage_split(reader: Reader, get: Callable[[str, str, Any], Value],
                 integer: Callable[..., int], pp: int, single: bool,
                 layers: int | None) -> Value | None:
    """Transformer layers per virtual stage, in stage order, as torchtitan builds them (the last
    TOML release, 9810191bb^, torchtitan/distributed/pipeline_parallel.py): the stages come from
    ``pipeline_parallel_layers_per_stage`` (ceil((L + first + last) / n) virtual stages), else
    one per rank for a single-stage schedule and two for a looped one; L + first + last
    "effective" layers, the embedding and the output counted as ``..._first_stage_less_layers``
    and ``..._last_stage_less_layers`` layers (1 each by default), split evenly, the remainder
    one each to the first stages; or ``module_fqns_per_model_part`` as written. Virtual stage k
    runs on rank k mod pp (the "loop" style of its looped schedules), placeverify's order too.
    None when the model's layers are unknown (already an error)."""
    parts = get("parallelism", "module_fqns_per_model_part", None)
    if parts.value is not None:
        return _written_parts(reader, parts, pp, single, layers)
    if layers is None:
        return None
    first = get("parallelism", "pipeline_parallel_first_stage_less_layers", 1)
    last = get("parallelism", "pipeline_parallel_last_stage_less_layers", 1)
    first_n = integer("parallelism", "pipeline_parallel_first_stage_less_layers", 1, low=0)
    last_n = integer("parallelism", "pipeline_parallel_last_stage_less_layers", 1, low=0)
    effective = layers + first_n + last_n
    per_stage = get("parallelism", "pipeline_parallel_layers_per_stage", None)
    where = first.origin if first.origin.span is not None else last.origin
    if per_stage.value is not None:
        size = integer("parallelism", "pipeline_parallel_layers_per_stage", 1)
        stages = -(-effective // size)
        ranks = stages // pp
        said = (f"{per_stage.origin.key} {size}: ceil(({layers} layers + {first_n} + {last_n}) / "
                f"{size}) = {stages} virtual stages")
        if stages % pp:
            reader.error(f"{said}, not a multiple of pipeline_parallel_degree {pp} (torchtitan "
                         "raises ValueError)", per_stage.origin, code=Code.NOT_DIVISIBLE)
            return None
        if single and ranks != 1:
            reader.error(f"{said}, {ranks} per rank: a single-stage schedule needs exactly 1 "
                         "(torchtitan raises ValueError)", per_stage.origin, code=Code.BAD_VALUE)
            return None
        if not single and ranks < 2:
            reader.error(f"{said}, {ranks} per rank: a looped schedule needs at least 2 "
                         "(torchtitan raises ValueError)", per_stage.origin, code=Code.BAD_VALUE)
            return None
        where = per_stage.origin
    else:
        stages = pp * (1 if single else 2)
    base, extra = divmod(effective, stages)
    counts = [base + (i < extra) for i in range(stages)]
    counts[0] -= first_n
    counts[-1] -= last_n
    kind = "stages" if single else "virtual stages"
    said = (f"{layers} layers + {first_n} + {last_n} over {stages} {kind}: {base} each"
            + (f", one more on the first {extra}" if extra else ""))
    if base == 0 or first_n > base or last_n > base:
        reader.error(f"{said}; torchtitan refuses a stage with fewer layers than the embedding's "
                     "or the output's weight (ValueError)", where, code=Code.BAD_VALUE)
        return None
    return Value(tuple(counts), Origin(said, where.source, where.span))


def _written_parts(reader: Reader, parts: Value, pp: int, single: bool,
                   layers: int | None) -> Value | None:
    """``module_fqns_per_model_part``: one list of module names per virtual stage; placeverify
    reads how many ``layers.N`` each holds, with the embedding on the first and the output on
    the last."""
    chunks = parts.value
    at = parts.origin
    if not (isinstance(chunks, list) and chunks and all(
            isinstance(c, list) and all(isinstance(n, str) for n in c) for c in chunks)):
        reader.error(f"{at.key} must be a list of lists of module names", at)
        return None
    if len(chunks) % pp or (single and len(chunks) != pp) or (not single and len(chunks) < 2 * pp):
        need = f"{pp}" if single else f"a multiple of {pp}, at least {2 * pp}"
        reader.error(f"{at.key} lists {len(chunks)} stages; the schedule over "
                     f"pipeline_parallel_degree {pp} needs {need}", at, code=Code.BAD_VALUE)
        return None
    held: list[int] = []
    counts = []
    for chunk in chunks:
        mine = [n for n in chunk if n.startswith("layers.")]
        held += [int(n[7:]) for n in mine if n[7:].isdigit()]
        counts.append(len(mine))
    ends = "tok_embeddings" in chunks[0] and any(n in chunks[-1] for n in ("output", "lm_head"))
    if layers is not None and sorted(held) != list(range(layers)):
        reader.error(f"{at.key} does not name each of layers.0 .. layers.{layers - 1} once",
                     at, code=Code.BAD_VALUE)
        return None
    if not ends or min(counts) < 1:
        reader.error(f"not modelled: {at.key} without the embedding first, the output last and "
                     "a transformer layer in every stage", at, code=Code.NOT_MODELLED)
        return None
    return Value(tuple(counts), at)
