"""Is a trace a counterexample of its own source? What a trace must show before it is replayed.

A trace is written by ``check --trace`` from one refutation of its ``source``: the mesh and the
micro-batch count of the smallest counterexample (never more micro-batches than the source's
step, exactly its count when the step names micro-batch indices), one token and sample count per
atom of that mesh, and, for a wrong loss normaliser (kind ``coefficient``), counts that the exact
interpreter (:func:`placeverify.semantics.interpreter.run`) shows diverging. A trace edited
afterwards — its source fixed, its counts made equal, its micro-batch count changed — can claim a
refutation its own content does not show. Replaying it would run something Z3 did not judge and
report the difference as a verifier bug ("not confirmed", exit 1); it is an input error instead
(exit 2), pointing at the key of the trace file that does not fit.

Only what makes the replay's verdict meaningless is refused. A trace replayed on a resized mesh
(``--world N``, or a mesh above eight devices) does not use its counts, so they are not judged
there; refutations whose value does not depend on the counts (a missing reduction, a wrong
reduction order, dropout seeds, ...) are not judged by the interpreter either.
"""

from __future__ import annotations

from placeverify.ir.strategy import Strategy
from placeverify.replay.counts import atom_keys, pick_counts, unit_samples
from placeverify.roles.relations import batch_axes
from placeverify.semantics.groups import group_view
from placeverify.semantics.interpreter import run, uniform_instance
from placeverify.semantics.schedule import Unmodelled
from placeverify.trace import EVERY_SIZE, AtomCount, Trace, inconsistent
from placeverify.verdicts import Condition, ObligationKind, Verdict

MAX_JUDGED_ATOMS = 1024  # the interpreter is asked about at most this many atoms per count set

Counts = dict[tuple[tuple[int, ...], int], int]


def mesh_text(sizes: dict[str, int], m: int) -> str:
    axes = ", ".join(f"{a} = {n}" for a, n in sizes.items()) or "one device"
    return f"{axes} with {m} micro-batch{'es' if m != 1 else ''}"


def check_microbatches(trace: Trace, strategy: Strategy) -> None:
    """A counterexample has at most the step's micro-batches, and exactly as many when the step
    names micro-batch indices (``on microbatch 0 { ... }``), unless ``check --every-size`` wrote
    it at another count (``values.every_size``): Z3 must still refute its claim there."""
    declared, m = strategy.step.microbatches, trace.microbatches
    if trace.values.get(EVERY_SIZE) is True and not strategy.step.windows:
        return  # check --every-size's counterexample: judged at its own count (trace_case)
    indexed = any(lo.microbatch is not None for lo in strategy.step.loop)
    if len(strategy.step.windows) > 1:  # several steps: the trace is one window's
        if m not in strategy.step.windows:
            raise inconsistent(trace, f"the trace has {m} micro-batches but no step of its "
                               f"source's {len(strategy.step.windows)} has that window "
                               f"({', '.join(map(str, strategy.step.windows))})", "microbatches")
        return
    if m > declared:
        raise inconsistent(trace, f"the trace has {m} micro-batches but its source's step has "
                           f"{declared}: a counterexample never has more micro-batches than its "
                           "strategy (was the source or the count changed after the trace was "
                           "written?)", "microbatches")
    if indexed and m != declared:
        raise inconsistent(trace, f"the trace has {m} micro-batch{'es' if m != 1 else ''} but its "
                           f"source's step names micro-batch indices and has {declared}: its "
                           "counterexamples keep the step's count", "microbatches")


def _read(trace: Trace, rows: tuple[AtomCount, ...], what: str, strategy: Strategy,
          sizes: dict[str, int]) -> Counts:
    """The ``what`` ("token" or "sample") rows as counts per atom; exactly one row per atom of
    the mesh, or an input error at the trace's ``tokens`` or ``samples`` key."""
    key_name = f"{what}s"
    axes = batch_axes(strategy)
    keys = set(atom_keys(strategy, sizes, trace.microbatches))
    out: Counts = {}
    for row in rows:
        if set(row.coords) != set(axes):
            raise inconsistent(trace, f"a trace {what} row has coordinates "
                               f"{{{', '.join(sorted(row.coords))}}}, not the batch axes of its "
                               f"source ({', '.join(axes) or 'none'})", key_name)
        key = (tuple(row.coords[a] for a in axes), row.microbatch)
        if key not in keys or key in out:
            where = ", ".join(f"{a} {row.coords[a]}" for a in axes)
            raise inconsistent(trace, f"the trace's {what} rows do not fit its mesh "
                               f"({mesh_text(sizes, trace.microbatches)}): "
                               f"{'a second' if key in out else 'a'} row for "
                               f"{where + ', ' if where else ''}micro-batch {row.microbatch}",
                               key_name)
        out[key] = row.count
    if set(out) != keys:
        raise inconsistent(trace, f"the trace's {what} rows do not fit its mesh "
                           f"({mesh_text(sizes, trace.microbatches)}): {len(out)} rows for "
                           f"{len(keys)} atoms (one per device on the batch axes and micro-batch)",
                           key_name)
    return out


def _diverges(strategy: Strategy, sizes: dict[str, int], m: int, tokens: Counts,
              samples: Counts) -> bool | None:
    """Does the exact interpreter show some parameter group's consumed gradient differ from the
    single-device one with these counts? None when it cannot tell (a step it does not model)."""
    judged = False
    for group in strategy.model.groups_present():
        view = group_view(strategy, group)
        try:
            if run(strategy, view, uniform_instance(strategy, view, sizes, m, tokens,
                                                     samples)).mismatches():
                return True
        except (ArithmeticError, KeyError, Unmodelled):
            continue
        judged = True
    return False if judged else None


def check_counts(trace: Trace, strategy: Strategy, sizes: dict[str, int],
                 declared_strategy: Strategy | None = None) -> None:
    """On the trace's own mesh (``strategy`` re-targeted to it and to the trace's micro-batch
    count): its rows cover that mesh, and, for a wrong loss normaliser, its counts make the step
    diverge. ``declared_strategy`` is the same at the count the file declares, which tells a
    trace whose micro-batch count was lowered from one whose source was changed."""
    if not trace.tokens:
        return  # nothing written: the replay picks diverging counts itself
    m = trace.microbatches
    tokens = _read(trace, trace.tokens, "token", strategy, sizes)
    samples = (_read(trace, trace.samples, "sample", strategy, sizes) if trace.samples
               else unit_samples(strategy, sorted(tokens), None))
    if trace.kind is not ObligationKind.COEFFICIENT or \
            trace.condition is not Condition.GRADIENT_INTEGRITY:
        return
    if len(tokens) > MAX_JUDGED_ATOMS or _diverges(strategy, sizes, m, tokens, samples) is not False:
        return
    where = mesh_text(sizes, m)
    if pick_counts(strategy, sizes, m, True)[2]:  # other counts diverge here: these are at fault
        if len(set(tokens.values())) == 1 and len(set(samples.values())) == 1:
            raise inconsistent(trace, f"the trace's token counts are all equal "
                               f"({next(iter(tokens.values()))} each), and with them the step "
                               f"computes the single-device gradient at {where} (the exact "
                               "interpreter finds no difference): the refuted claim is about a "
                               "loss normaliser (kind coefficient), which differs only for "
                               "unequal counts, so these counts are no counterexample", "tokens")
        raise inconsistent(trace, f"with the trace's token counts the step computes the "
                           f"single-device gradient at {where} (the exact interpreter finds no "
                           "difference), so they are no counterexample to the refuted claim",
                           "tokens")
    at_file = declared_strategy or strategy
    declared = at_file.step.microbatches
    if declared != m and len(atom_keys(at_file, sizes, declared)) <= MAX_JUDGED_ATOMS and \
            pick_counts(at_file, sizes, declared, True)[2]:
        raise inconsistent(trace, f"at {where} the trace's source computes the single-device "
                           "gradient for every token count tried (the exact interpreter finds no "
                           f"difference), though with its step's {declared} micro-batches it "
                           "does not: the trace's micro-batch count is no counterexample",
                           "microbatches")
    raise inconsistent(trace, f"at {where} the trace's source computes the single-device "
                       "gradient for every token count tried (the exact interpreter finds no "
                       "difference): the trace is no counterexample of its source (was the "
                       "source changed after the trace was written?)", "source")


def check_claim(trace: Trace, strategy: Strategy, sizes: dict[str, int], verdict: Verdict) -> None:
    """Z3 at the trace's own mesh and micro-batch count must not prove what the trace refutes
    (``verdict``: Z3's over the obligations a run can witness, for a trace of such a kind)."""
    if verdict is not Verdict.PROVED or trace.microbatches != strategy.step.microbatches:
        return
    line = f", line {trace.line}" if trace.line is not None else ""
    raise inconsistent(trace, f"Z3 proves the trace's source at the trace's own mesh "
                       f"({mesh_text(sizes, trace.microbatches)}), so the trace's refutation "
                       f"({trace.condition.value.replace('_', ' ')}{line}: {trace.claim}) is not "
                       "about this source (was it changed after the trace was written?)",
                       "source")


def check_mesh(trace: Trace, strategy: Strategy) -> None:
    """The trace's mesh names only axes of its source."""
    unknown = set(trace.mesh) - set(strategy.mesh.names)
    if unknown:
        raise inconsistent(trace, "trace mesh names axes the strategy does not have: "
                           f"{', '.join(sorted(unknown))}", "mesh")

