"""How DeepSpeed's pipeline engine splits Megatron-DeepSpeed's model into stages.

``runtime/pipe/module.py`` (``PipelineModule._partition_layers``): ``type:REGEX``
(``--pp-partition-method``; Megatron-DeepSpeed's default ``type:transformer``) weighs each layer
of GPTModelPipe's list whose class name the regex finds (case-insensitive) 1, the others 0, and
``runtime/utils.py``'s ``partition_balanced`` splits the list. Since DeepSpeed 0.12.5
(deepspeedai/DeepSpeed#4312) that is a dynamic programme minimising the spread between the
heaviest and lightest stage; before, a binary search on the heaviest stage. Both are computed;
the newer is written, the older named in a warning where it differs.
"""

from __future__ import annotations

import re
from bisect import bisect_left

from placeverify.diagnostics import Code
from placeverify.importers.arguments import Arguments
from placeverify.importers.common import Line, Reader
from placeverify.importers.origins import Origin, Value

DEFAULT_PARTITION = "type:transformer"
TRANSFORMER_LAYER = "ParallelTransformerLayerPipe"


def gpt_pipe_layers(layers: int, float16: bool, untied: bool = False) -> list[str]:
    """The class (or function) names of GPTModelPipe's layer list, in order
    (bigscience-workshop/Megatron-DeepSpeed ``megatron/model/gpt_model.py``): the cast to 16 bits,
    the tied embedding, a transpose, the transformer layers, its undo, the final LayerNorm
    (``MixedFusedLayerNorm``), the tied embedding again (the logits; deepspeedai's fork has an
    ``LMHeadPipe`` there under --untie-embeddings-and-output-weights) and, with fp16 or bf16, the
    cast back."""
    return ["_to_float16", "EmbeddingPipe", "<lambda>", *[TRANSFORMER_LAYER] * layers, "undo",
            "MixedFusedLayerNorm", "LMHeadPipe" if untied else "EmbeddingPipe",
            *(["float16_to_fp32"] if float16 else [])]


def partition_uniform(items: int, parts: int) -> list[int]:
    """``runtime/utils.py`` ``partition_uniform``: boundaries of ``parts`` near-equal runs."""
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    chunk, rest = divmod(items, parts)
    return [p * chunk + min(p, rest) for p in range(parts + 1)]


def partition_balanced(weights: list[int], parts: int) -> list[int]:
    """DeepSpeed >= 0.12.5 ``partition_balanced``: of the splits into ``parts`` contiguous runs,
    the one with the least difference between its heaviest and lightest run (ties: the last
    split point tried)."""
    n = len(weights)
    if n <= parts:
        return partition_uniform(n, parts)
    inf = float("inf")
    top = [[inf] * (parts + 1) for _ in range(n + 1)]
    low = [[inf] * (parts + 1) for _ in range(n + 1)]
    cost = [[inf] * (parts + 1) for _ in range(n + 1)]
    where = [[0] * (parts + 1) for _ in range(n + 1)]
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    top[0][0] = cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, parts) + 1):
            for k in range(i):
                run = prefix[i] - prefix[k]
                high, small = max(top[k][j - 1], run), min(low[k][j - 1], run)
                if cost[i][j] >= high - small:
                    cost[i][j], top[i][j], low[i][j], where[i][j] = high - small, high, small, k
    bounds = [n]
    for j in range(parts, 0, -1):
        bounds.append(where[bounds[-1]][j])
    return bounds[::-1]


def partition_balanced_before_4312(weights: list[int], parts: int, eps: float = 1e-3) -> list[int]:
    """DeepSpeed < 0.12.5 ``partition_balanced``: a binary search for the smallest heaviest run
    (``_rb_partition_balanced``), then that run's greedy probe (``_lprobe``)."""
    n = len(weights)
    if n <= parts:
        return partition_uniform(n, parts)
    sums: list[int] = []
    for w in weights:
        sums.append((sums[-1] if sums else 0) + w)

    def probe(bottleneck: float) -> tuple[list[int], bool]:
        bounds = [0] + [n] * parts
        target, chunk = bottleneck, n // parts
        step = chunk
        for p in range(1, parts):
            while step < n and sums[step] < target:
                step += chunk
            bounds[p] = bisect_left(sums, target, lo=step - chunk, hi=min(step, n))
            if bounds[p] == n:
                return bounds, sums[-1] - sums[bounds[p - 1]] < bottleneck
            target = sums[bounds[p] - 1] + bottleneck
        return bounds, target >= sums[-1]

    lower, upper = sums[-1] / parts, float(sums[-1])
    while upper > lower + eps:
        middle = lower + (upper - lower) / 2
        if probe(middle)[1]:
            upper = middle
        else:
            lower = middle + eps
    return probe(upper)[0]


def stage_layers(names: list[str], bounds: list[int]) -> list[int]:
    """Transformer layers in each stage's run of ``names``."""
    return [names[bounds[s]:bounds[s + 1]].count(TRANSFORMER_LAYER) for s in range(len(bounds) - 1)]


def _outside_the_ends(names: list[str], bounds: list[int]) -> str:
    """What a split puts where the language cannot: a stage with no module of the list, the
    embedding after the first stage or the logits before the last ('' when none)."""
    empty = [s for s in range(len(bounds) - 1) if bounds[s] == bounds[s + 1]]
    if empty:
        return f"leaves stage {empty[0]} with no layer at all"
    if names.index("EmbeddingPipe") >= bounds[1]:
        return "puts the embedding after the first stage"
    if names.index("MixedFusedLayerNorm") + 1 < bounds[-2]:  # the logits follow the last norm
        return "puts the output layer before the last stage"
    return ""


def pipeline_line(args: Arguments, reader: Reader, p: int, float16: bool, m: int) -> Line | None:
    """``place pipeline(1f1b, ...) over pp``: GPTModelPipe's layers split over ``p`` stages by
    --pp-partition-method (None, after an error at the flag, for a split placeverify does not
    model)."""
    layers = args.integer("--num-layers")
    virtual = next((f for f in ("--virtual-pipeline-model-parallel-size",
                                "--num-layers-per-virtual-pipeline-stage") if f in args.flags),
                   None)
    if virtual is not None:
        reader.error(f"not modelled: {virtual} with DeepSpeed's pipeline engine, which has no "
                     "interleaved schedule", args.origin(args.flags[virtual][0]),
                     code=Code.NOT_MODELLED)
        return None
    if layers is None:
        return None  # already an error: no model
    method = args.text("--pp-partition-method") or Value(
        DEFAULT_PARTITION, Origin("--pp-partition-method (Megatron-DeepSpeed's default)",
                                  args.source))
    names = gpt_pipe_layers(int(str(layers.value)), float16,
                            "--untie-embeddings-and-output-weights" in args.flags)
    text = str(method.value)
    if not text.lower().startswith("type:"):
        reader.error(f"not modelled: --pp-partition-method {text} (placeverify splits by "
                     "'type:REGEX'; 'parameters' and 'uniform' weigh layers it does not list)",
                     method.origin, code=Code.NOT_MODELLED)
        return None
    try:
        pattern = re.compile(text.split(":", 1)[1], re.IGNORECASE)
    except re.error as error:
        reader.error(f"--pp-partition-method {text}: not a regular expression ({error})",
                     method.origin, code=Code.BAD_VALUE)
        return None
    weights = [1 if pattern.search(name) else 0 for name in names]
    if not any(weights):
        reader.error(f"--pp-partition-method {text} finds no layer of GPTModelPipe (DeepSpeed "
                     "raises 'found no valid layers to partition')", method.origin,
                     code=Code.BAD_VALUE)
        return None
    bounds = partition_balanced(weights, p)
    outside = _outside_the_ends(names, bounds)
    if outside:
        reader.error(f"not modelled: --pp-partition-method {text} over {p} stages {outside}: "
                     "placeverify holds the embedding on the first stage and the output layer "
                     "on the last, and every stage runs a part of the list", method.origin,
                     code=Code.NOT_MODELLED)
        return None
    split = stage_layers(names, bounds)
    older = stage_layers(names, partition_balanced_before_4312(weights, p))
    why = (f"{method.origin.key} {text}: DeepSpeed's partition_balanced over GPTModelPipe's "
           "layers; 1F1B, no interleaving")
    if older != split:
        reader.warning(f"DeepSpeed before 0.12.5 (partition_balanced before "
                       f"deepspeedai/DeepSpeed#4312) splits these {layers.value} layers "
                       f"{', '.join(map(str, older))}, not {', '.join(map(str, split))} as "
                       "written: a run on such a version holds those", method.origin,
                       code=Code.CONFLICT)
    listed = "" if len(set(split)) == 1 else f", layers = [{', '.join(map(str, split))}]"
    return Line(f"place pipeline(1f1b, microbatches = {m}{listed}) over pp", why, method.origin)
