"""The fixed part of a standalone reproducer (``placeverify replay trace.json --emit repro.py``).

:data:`RUNTIME` is Python source that :mod:`placeverify.replay.emit` pastes into every emitted
script between the counterexample's constants and the generated step functions. It imports
only torch and the standard library. It defines the rank grid and its process groups (every
rank creates every group in the same order), the collectives (gloo or NCCL), the tiny model and
its deterministic data, single-device training on the global batch (the oracle), one rank's
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

RUNTIME = r'''
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


# ---- single-device training on the global batch (the oracle) --------------------------------------

def reference():
    """Every step: the whole model, every atom of the global batch, the declared loss; returns
    the parameters after STEPS steps, each step's gradient per group (None when skipped) and the
    loss factor alpha the ranks must apply too."""
    p = {n: v.clone().requires_grad_(True) for n, v in init_params().items()}
    total_tokens = sum(TOKENS.values())
    total_samples = sum(SAMPLES.values())
    units = sorted(TOKENS)
    alpha, grads_per_step = 1.0, []
    for t in range(STEPS):
        loss = torch.zeros((), dtype=DTYPE, device=DEVICE)
        for b, k in units:
            ids, labels, features, mask = atom(t, b, k)
            if LOSS == "token_mean":
                w = mask * float(Fraction(1, total_tokens))
            elif LOSS == "sample_mean":
                w = torch.full_like(mask, float(Fraction(1, SEQ * total_samples)))
            elif LOSS == "microbatch_mean":
                w = mask * float(Fraction(1, len(units) * TOKENS[(b, k)]))
            else:
                w = mask
            loss = loss + (losses(p, ids, labels, features) * w).sum()
        loss.backward()
        grads = {n: v.grad.clone() for n, v in p.items()}
        for v in p.values():
            v.grad = None
        if t == 0 and MAX_NORM is not None:
            alpha = CLIP_HEADROOM * MAX_NORM / _norm(grads)
        grads = {n: g * alpha for n, g in grads.items()}
        if DYNAMIC_LOSS_SCALE and t == 0:
            grads_per_step.append(None)  # the ranks inject an overflow into step 0: it is skipped
            continue
        if MAX_NORM is not None:
            coef = min(1.0, MAX_NORM / (_norm(grads) + NORM_EPS))
            grads = {n: g * coef for n, g in grads.items()}
        grads_per_step.append({g: flat(grads, g) for g in GROUPS})
        with torch.no_grad():
            for n, v in p.items():
                v.sub_(LEARNING_RATE * grads[n])
    return {n: v.detach() for n, v in p.items()}, grads_per_step, alpha


def _norm(grads):
    return float(torch.sqrt(sum((g * g).sum() for g in grads.values())))


# ---- one rank's run ----------------------------------------------------------------------------------

def opt_slice(group, rank):
    """The slice of the group's flat buffer that ``rank`` updates: all of it, or its 1/n along
    the axes where the optimizer state is sharded (ZeRO, Rajbhandari et al. 2020)."""
    numel = NUMEL[group]
    axes = OPTIMIZER_AXES[group]
    if not axes:
        return 0, numel
    ms = members(axes, rank)
    return flat_slice(numel, len(ms), ms.index(rank))


class Run:
    """One rank's parameters and gradient buffers through STEPS steps of one step function."""

    def __init__(self, alpha):
        self.p = init_params()
        self.alpha = alpha
        self.full, self.shard, self.shard_at = {}, {}, {}
        self.overflow = False
        self.consumed_diff = 0.0
        self.skipped = []

    def begin_step(self):
        self.full = {g: torch.zeros(NUMEL[g], dtype=DTYPE, device=DEVICE) for g in GROUPS}
        self.shard = {g: None for g in GROUPS}
        self.shard_at = {g: None for g in GROUPS}
        self.overflow = False

    def backward(self, t, k, factor):
        """Forward and backward of this rank's micro-batch ``k`` with the loss ``factor * sum``;
        the gradients are added (+=) to the full buffers."""
        b = tuple(COORDS[a] for a in BATCH_AXES)
        ids, labels, features, mask = atom(t, b, k)
        p = {n: v.clone().requires_grad_(True) for n, v in self.p.items()}
        total = (losses(p, ids, labels, features) * local_weights(mask)).sum()
        (total * (float(factor) * self.alpha)).backward()
        for g in GROUPS:
            self.full[g] = self.full[g] + flat({n: v.grad for n, v in p.items()}, g)
        if DYNAMIC_LOSS_SCALE and t == 0 and k == 0 and RANK == 0:
            self.full[next(iter(GROUPS))][0] = float("inf")  # an overflow, for the skip logic

    def consumed(self, group, sharded):
        """The gradient the optimizer reads: the full buffer, overwritten by the shard."""
        out = self.full[group].clone()
        if sharded and self.shard[group] is not None:
            lo, hi = self.shard_at[group]
            out[lo:hi] = self.shard[group]
        return out

    def update(self, t, consumed, reference_grads):
        """SGD on this rank's optimizer slice of every group; under dynamic loss scaling the step
        is skipped when the overflow flag, or this rank's own check, is set."""
        slices = {g: consumed[g][slice(*opt_slice(g, RANK))] for g in GROUPS}
        if DYNAMIC_LOSS_SCALE and (self.overflow or nonfinite(*slices.values())):
            self.skipped.append(t)
            if reference_grads is not None:
                self.consumed_diff = math.inf  # the reference makes this update
            return
        for g, grad in slices.items():
            lo, hi = opt_slice(g, RANK)
            if reference_grads is None:
                self.consumed_diff = math.inf  # the reference skips this update
            else:
                diff = (grad - reference_grads[g][lo:hi]).abs().max().item() if hi > lo else 0.0
                self.consumed_diff = max(self.consumed_diff, diff if diff == diff else math.inf)
            values = flat(self.p, g).clone()
            values[lo:hi] = values[lo:hi] - LEARNING_RATE * grad
            self.write(g, values)

    def write(self, group, values):
        offset = 0
        for name in GROUPS[group]:
            n = self.p[name].numel()
            self.p[name] = values[offset:offset + n].view_as(self.p[name]).clone()
            offset += n


def gather_params(run, group, axes, source="owner"):
    """Each element from the member that owns it in the optimizer layout (``owner``), or every
    element from member ``source``."""
    _, ms = PG[axes]
    if len(ms) == 1:
        return
    values = flat(run.p, group)
    rows = _gather_rows(values, axes)
    if source != "owner":
        run.write(group, rows[source])
        return
    if not OPTIMIZER_AXES[group]:
        return  # every rank updated every element: nothing to gather
    out = values.clone()
    for j, member in enumerate(ms):
        lo, hi = opt_slice(group, member)
        out[lo:hi] = rows[j][lo:hi]
    run.write(group, out)


# ---- running and judging -------------------------------------------------------------------------

def train(step_function, alpha, reference_grads):
    run = Run(alpha)
    for t in range(STEPS):
        run.begin_step()
        step_function(run, t, reference_grads[t])
    return run


def judge(run, ref_params):
    """(max |consumed gradient - reference|, max |parameters - reference|, max difference between
    this rank's parameters and rank 0's copy, which must be bitwise equal)."""
    params = max((run.p[n] - ref_params[n]).abs().max().item() for n in run.p)
    mine = torch.cat([run.p[n].reshape(-1) for n in SHAPES])
    rows = _gather_rows(mine, AXES)
    replicas = (rows[RANK] - rows[0]).abs().max().item()
    nan = lambda x: math.inf if x != x else x  # noqa: E731
    return nan(run.consumed_diff), nan(params), nan(replicas)


def main():
    global BACKEND, DEVICE
    BACKEND, DEVICE = start()
    torch.manual_seed(SEED)
    ref_params, ref_grads, alpha = reference()
    scale = max(v.abs().max().item() for v in ref_params.values())
    tolerance = TOLERANCE_FACTOR * STEPS * 2.0 ** -53 * max(1.0, scale)
    results = {}
    for label, step_function in (("buggy", buggy_step), ("fixed", fixed_step)):
        results[label] = judge(train(step_function, alpha, ref_grads), ref_params)
    mine = torch.tensor([*results["buggy"], *results["fixed"]], dtype=DTYPE, device=DEVICE)
    table = [row.tolist() for row in _gather_rows(mine, AXES)]
    verdicts = {}
    for i, label in enumerate(("buggy", "fixed")):
        worst = max(max(row[3 * i], row[3 * i + 1]) for row in table)
        replicas = max(row[3 * i + 2] for row in table)
        verdicts[label] = (worst > tolerance or replicas != 0.0, worst, replicas)
    if RANK == 0:
        print(f"{WORLD} process{'es' if WORLD != 1 else ''} ({BACKEND}), mesh "
              f"{', '.join(f'{a} = {n}' for a, n in MESH.items())}, {MICROBATCHES} micro-batch"
              f"{'es' if MICROBATCHES != 1 else ''}, {STEPS} steps, float64")
        for r, row in enumerate(table):
            where = ", ".join(f"{a} {c}" for a, c in coords_of(r).items())
            print(f"rank {r} ({where}): buggy: grad {row[0]:.3g}, params {row[1]:.3g}, "
                  f"replicas {row[2]:.3g} | fixed: grad {row[3]:.3g}, params {row[4]:.3g}, "
                  f"replicas {row[5]:.3g}   (max |distributed - single-device|)")
        print(f"tolerance {tolerance:.3g} (2^10 * {STEPS} steps * 2^-53 * max(1, {scale:.3g}))")
        said = []
        for label in ("buggy", "fixed"):
            diverges, worst, replicas = verdicts[label]
            said.append(f"{label}: " + (f"diverges by {worst:.3g}" if worst > tolerance
                                        else f"replicas differ by {replicas:.3g}" if replicas
                                        else f"matches (largest difference {worst:.3g})"))
        print("; ".join(said))
    reproduced = verdicts["buggy"][0] and not verdicts["fixed"][0]
    if RANK == 0:
        print("REPRODUCED: the buggy step diverges from single-device training and the fixed step "
              "matches" if reproduced else "NOT REPRODUCED: the buggy step does not diverge, or "
              "the fixed step does not match")
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if reproduced else 0)
'''
