"""The second half of a reproducer's fixed part: single-device training on the global batch (the
oracle), one rank's buffers and optimizer slice, and the comparison that prints the verdict.

It follows :data:`placeverify.replay.emit_runtime.PROCESSES` in every emitted script; the
semantics is the replay's (:mod:`placeverify.replay.reference`, :mod:`placeverify.replay.compare`).
"""

from __future__ import annotations

ORACLE = r'''
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
    sys.exit(0 if reproduced else 1)  # reproduced: the run did its job; torchrun ends cleanly
'''
