"""The fixed part of a standalone reproducer (``placeverify replay trace.json --emit repro.py``).

:data:`PROCESSES` (followed by :data:`placeverify.replay.emit_oracle.ORACLE`) is Python
source that :mod:`placeverify.replay.emit` pastes into every emitted script between the
counterexample's constants and the generated step functions. It imports only torch and the
standard library. This half defines the rank grid and its process groups (every rank creates
every group in the same order), the collectives (gloo or NCCL), and the tiny model and its
deterministic data; the oracle half has single-device training on the global batch, one rank's
buffers and optimizer slice, and the comparison that prints the verdict. Its semantics is the
replay's (:mod:`placeverify.replay.step`, :mod:`placeverify.replay.collectives`,
:mod:`placeverify.replay.reference`, :mod:`placeverify.replay.compare`), restricted to meshes
whose split axes all hold data: every rank holds the whole model.

The names the generated code uses: ``run.full[g]`` and ``run.shard[g]`` (the full gradient
buffer and the reduce-scatter shard of parameter group ``g``), ``all_reduce``,
``all_reduce_rank_dependent``, ``reduce_scatter``, ``all_gather``, ``gather_params``, ``count``,
``size``, ``nonfinite``, ``COORDS``, ``run.backward``, ``run.update``, ``run.consumed``.
"""

from __future__ import annotations

PROCESSES = r'''
# ---- derived constants ---------------------------------------------------------------------------

AXES = tuple(MESH)
WORLD = math.prod(MESH.values())
GRID = torch.arange(WORLD).view(*MESH.values())  # the rank at each mesh coordinate
DTYPE = torch.float64
LEARNING_RATE = 0.05  # plain SGD, the same on every rank and in the reference
CLIP_HEADROOM = 4.0  # with clipping, the loss is scaled so the first gradient norm is 4 x max_norm
NORM_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_: max_norm / (total_norm + 1e-6)
TOLERANCE_FACTOR = 2 ** 10  # rounding only: 2^10 * steps * u * max(1, largest state), u = 2^-53


def coords_of(rank):
    out = {}
    for name, n in reversed(list(MESH.items())):
        rank, out[name] = divmod(rank, n)
    return {name: out[name] for name in AXES}


def members(axes, rank):
    """The ranks that differ from ``rank`` only along ``axes``, in grid order."""
    c = coords_of(rank)
    index = tuple(slice(None) if a in axes else c[a] for a in AXES)
    return GRID[index].reshape(-1).tolist()


def size(*axes):
    return math.prod(MESH[a] for a in axes)


# ---- processes and groups ------------------------------------------------------------------------

RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
COORDS = coords_of(RANK) if RANK < WORLD else {}
PG = {}  # axes -> (process group or None, members)


def start():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != WORLD:
        mesh = ", ".join(f"{a} = {n}" for a, n in MESH.items())
        print(f"this reproducer needs {WORLD} processes ({mesh}); "
              f"run: torchrun --standalone --nproc-per-node {WORLD} {sys.argv[0]}", file=sys.stderr)
        sys.exit(2)
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() > LOCAL_RANK
    if use_cuda:
        torch.cuda.set_device(LOCAL_RANK)
    backend = "nccl" if use_cuda else "gloo"
    if "MASTER_ADDR" in os.environ:  # started by torchrun
        dist.init_process_group(backend, rank=RANK, world_size=WORLD)
    else:  # one process started by plain python
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    for axes in GROUP_AXES:  # every rank creates every group, in the same order
        seen = []
        for r in range(WORLD):
            ms = members(axes, r)
            if ms in seen:
                continue
            seen.append(ms)
            pg = dist.new_group(ms) if len(ms) > 1 else None
            if RANK in ms:
                PG[axes] = (pg, ms)
    return backend, torch.device(f"cuda:{LOCAL_RANK}" if use_cuda else "cpu")


BACKEND, DEVICE = "gloo", torch.device("cpu")


# ---- collectives -----------------------------------------------------------------------------------

def all_reduce(x, axes, op="sum"):
    """A real all-reduce over the ranks of ``axes``; ``mean`` divides the sum by their number."""
    pg, ms = PG[axes]
    y = x.clone()
    if len(ms) > 1:
        dist.all_reduce(y, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=pg)
    return y / len(ms) if op == "mean" else y


def _gather_rows(x, axes):
    pg, ms = PG[axes]
    if len(ms) == 1:
        return [x.clone()]
    rows = [torch.empty_like(x) for _ in ms]
    dist.all_gather(rows, x.contiguous(), group=pg)
    return rows


def all_reduce_rank_dependent(x, axes, op="sum"):
    """Each rank sums the group's buffers starting from its own (order = rank_dependent)."""
    _, ms = PG[axes]
    rows = _gather_rows(x, axes)
    i = ms.index(RANK)
    acc = rows[i].clone()
    for j in range(1, len(ms)):
        row = rows[(i + j) % len(ms)]
        acc = torch.maximum(acc, row) if op == "max" else acc + row
    return acc / len(ms) if op == "mean" else acc


def flat_slice(numel, n, index):
    """Member ``index`` of ``n``'s slice of a flat buffer padded to a multiple of ``n``."""
    chunk = -(-numel // n) if numel else 0
    lo = min(index * chunk, numel)
    return lo, min(lo + chunk, numel)


def reduce_scatter(full, axes, op="sum", order="fixed"):
    """Reduce the full buffer (zero-padded to a multiple of the group) and keep this rank's slice:
    returns (shard, (start, stop))."""
    pg, ms = PG[axes]
    n, i, numel = len(ms), ms.index(RANK), full.numel()
    chunk = -(-numel // n)
    padded = torch.zeros(chunk * n, dtype=full.dtype, device=full.device)
    padded[:numel] = full
    if order == "rank_dependent":
        out = all_reduce_rank_dependent(padded, axes, op)[i * chunk:(i + 1) * chunk]
    elif n == 1:
        out = padded
    elif BACKEND == "nccl" and op != "max":
        out = torch.empty(chunk, dtype=full.dtype, device=full.device)
        dist.reduce_scatter_tensor(out, padded, group=pg)
        out = out / n if op == "mean" else out
    else:  # gloo has no reduce-scatter: the same sums through an all-reduce
        out = all_reduce(padded, axes, op)[i * chunk:(i + 1) * chunk]
    lo, hi = flat_slice(numel, n, i)
    return out[:hi - lo].clone(), (lo, hi)


def all_gather(shard, axes, numel):
    """The group's shards, concatenated, become the full buffer."""
    n = len(PG[axes][1])
    chunk = -(-numel // n)
    padded = torch.zeros(chunk, dtype=shard.dtype, device=shard.device)
    padded[:shard.numel()] = shard
    return torch.cat(_gather_rows(padded, axes))[:numel]


def count(kind, axes, whole_step):
    """This rank's token (or sample) count per micro-batch, over the step when ``whole_step``,
    all-reduced over ``axes``."""
    table = TOKENS if kind == "tokens" else SAMPLES
    b = tuple(COORDS[a] for a in BATCH_AXES)
    local = [table[(b, k)] for k in range(MICROBATCHES)]
    if whole_step:
        local = [sum(local)] * MICROBATCHES
    values = torch.tensor(local, dtype=torch.int64, device=DEVICE)
    return [int(v) for v in all_reduce(values, axes).tolist()]


def nonfinite(*buffers):
    return any(not bool(torch.isfinite(x).all()) for x in buffers if x is not None)


# ---- the tiny model and its data -----------------------------------------------------------------

def init_params():
    """The single-device model's initial parameters, drawn in order from one generator."""
    g = torch.Generator().manual_seed(SEED)
    out = {}
    for name, shape in SHAPES.items():
        if name == "norm.weight":
            value = 1 + 0.1 * torch.randn(shape, generator=g, dtype=DTYPE)
        elif name == "norm.bias":
            value = 0.1 * torch.randn(shape, generator=g, dtype=DTYPE)
        elif name == "embed":
            value = torch.randn(shape, generator=g, dtype=DTYPE)
        else:
            value = torch.randn(shape, generator=g, dtype=DTYPE) / math.sqrt(shape[-1])
        out[name] = value.to(DEVICE)
    return out


def losses(p, ids, labels, features):
    """Per-position cross entropy of the model, (samples, positions)."""
    x = p["embed"][ids] if "embed" in p else features
    a = F.layer_norm(x, (HIDDEN,), p["norm.weight"], p["norm.bias"]) if "norm.weight" in p else x
    h = x + F.gelu(a @ p["fc1"].t()) @ p["fc2"].t()
    if "expert.fc1" in p:
        h = h + torch.tanh(h @ p["expert.fc1"].t()) @ p["expert.fc2"].t()
    logits = h @ (p["embed"] if TIED else p["head"]).t()
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1),
                           reduction="none").view(labels.shape)


def atom(t, b, k):
    """The sequences ranks with batch coordinates ``b`` see in micro-batch ``k`` of step ``t``:
    SAMPLES sequences of SEQ positions, TOKENS of them labelled (the rest are padding)."""
    key = hashlib.sha256(repr((SEED, t, k, b)).encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") >> 1)
    n, tokens = SAMPLES[(b, k)], TOKENS[(b, k)]
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    features = torch.randn((n, SEQ, HIDDEN), generator=g, dtype=DTYPE)
    mask = (torch.arange(n * SEQ).view(SEQ, n).t() < tokens).to(DTYPE)
    return ids.to(DEVICE), labels.to(DEVICE), features.to(DEVICE), mask.to(DEVICE)


def local_weights(mask):
    """Weights that turn per-position losses into an atom's ``sum``: per labelled token, or per
    sample (a sample's loss is the mean over its positions) under ``loss sample_mean``."""
    return torch.full_like(mask, 1.0 / SEQ) if LOSS == "sample_mean" else mask


def flat(tensors, group):
    return torch.cat([tensors[name].reshape(-1) for name in GROUPS[group]])


'''

