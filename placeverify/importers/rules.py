"""The frameworks' consistency rules, judged on the values a strategy ends with.

A configuration can contradict itself (DeepSpeed's ``train_batch_size`` is not
micro x accumulation x world; ``--sequence-parallel`` with one tensor-parallel rank, which
Megatron-LM silently switches off), and a ``--set`` override can create such a contradiction or
fix one. So an importer does not decide these rules on the file alone: it records each as a
:class:`Rule` at the key it comes from, and :func:`judge` decides it on the strategy as finally
lowered, the file's own values or the overridden ones. A broken rule is reported at the key when
the file as written breaks it too, and at the override when the file alone keeps it (the
override made the contradiction), with a note naming the key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

from placeverify.diagnostics import Code, Diagnostic, Severity, Source
from placeverify.importers.origins import Origin
from placeverify.ir.placement import Role, State
from placeverify.ir.strategy import Strategy
from placeverify.lower.overrides import Setting, Settings
from placeverify.roles.queries import gathered_axes, offloaded
from placeverify.roles.relations import sample_axes


@dataclass(frozen=True, slots=True)
class Facts:
    """What the rules read of a strategy: sequences per micro-batch, micro-batches per step, the
    size of the axes that split the samples (the data-parallel degree, expert axes included), the
    size of the tensor-parallel axes, and the pipeline axis if any."""

    micro_batch: int | None  # None for a model given as a bare parameter count
    microbatches: int
    batch_degree: int
    tensor: int
    pipeline: str | None
    batch_axes: tuple[str, ...] = ()
    tensor_axes: tuple[str, ...] = ()
    world: int = 0  # devices in the mesh
    params_gathered: bool = False  # Θ sharded over a data axis and gathered for use (ZeRO-3)
    params_offloaded: bool = False  # Θ offloaded to host memory

    @staticmethod
    def of(strategy: Strategy) -> Facts:
        config = strategy.config
        arch = strategy.model.arch
        pipeline = config.pipeline
        batch, tensor = sample_axes(config), config.axes(Role.TENSOR)
        return Facts(arch.micro_batch if arch is not None else None, config.microbatches,
                     prod(config.size(a) for a in batch), prod(config.size(a) for a in tensor),
                     pipeline.axis if pipeline is not None else None, batch, tensor,
                     config.mesh.world, bool(gathered_axes(config)),
                     offloaded(config, State.PARAMS))

    def set_microbatches(self, count: int) -> str:
        """How an override sets the micro-batch count to ``count`` for this strategy."""
        if self.pipeline is not None:
            return f"--set place.{self.pipeline}=pipeline(..., microbatches = {count})"
        return f"--set microbatches={count}"


@dataclass(frozen=True)
class Rule:
    """One consistency rule of a framework, at the key it comes from: ``check`` gives the message
    when ``Facts`` break it (None when they keep it); ``reads`` says whether an override
    (``mesh.dp``, ``model.micro_batch``) changes what it reads: 2 directly, 1 perhaps (a
    placement, which may change an axis's role or count), 0 not."""

    severity: Severity
    code: Code
    origin: Origin
    check: Callable[[Facts], str | None]
    reads: Callable[[Setting, Facts], int]


def batch_rule(origin: Origin, total: int, message: Callable[[Facts, int], str]) -> Rule:
    """Sequences per step = micro-batch x micro-batches x data-parallel degree = ``total`` (the
    global batch a file gives); ``message(facts, product)`` describes a break."""

    def check(facts: Facts) -> str | None:
        if facts.micro_batch is None:
            return None
        product = facts.micro_batch * facts.microbatches * facts.batch_degree
        if product == total:
            return None
        per_step = facts.micro_batch * facts.batch_degree
        hint = (f"; with micro-batch {facts.micro_batch} and data-parallel size "
                f"{facts.batch_degree} it holds with {total // per_step} micro-batches "
                f"({facts.set_microbatches(total // per_step)})" if total % per_step == 0 else
                f"; {total} is not a multiple of micro-batch {facts.micro_batch} x data-parallel "
                f"size {facts.batch_degree} = {per_step}")
        return message(facts, product) + hint

    return Rule(Severity.ERROR, Code.CONFLICT, origin, check, _reads_batch)


def world_rule(origin: Origin, world: int, why: str) -> Rule:
    """The launcher starts ``world`` processes and the mesh must have as many devices, for a file
    whose model-parallel sizes do not divide its world (``why`` says who asserts it): its mesh is
    written with a data-parallel size of 1, so the rule holds only once an override resizes the
    mesh to ``world`` devices (``--set mesh.pp=1``), or the sizes and the world together."""

    def check(facts: Facts) -> str | None:
        if facts.world == world:
            return None
        model = facts.world // max(1, facts.batch_degree)
        hint = (f"; with these model-parallel sizes it holds with a data-parallel size of "
                f"{world // model}" if world % model == 0 else
                f"; {world} is not divisible by the model-parallel sizes' product {model}")
        return (f"the launcher starts {world} processes but the mesh has {facts.world} devices "
                f"({why}){hint}")

    def reads(setting: Setting, final: Facts) -> int:
        head = setting.parts[0]
        return 2 if head == "mesh" and len(setting.parts) == 2 else 1 if head == "place" else 0

    return Rule(Severity.ERROR, Code.NOT_DIVISIBLE, origin, check, reads)


def reads_placement(setting: Setting, final: Facts) -> int:
    """What a rule about the placement reads: ``place.*`` and ``offload`` directly."""
    head = setting.parts[0]
    return 2 if head in ("place", "offload") else 0


def _reads_batch(setting: Setting, final: Facts) -> int:
    return _reads(setting, final.batch_axes, ("model", "model.micro_batch", "microbatches"))


def reads_tensor(setting: Setting, final: Facts) -> int:
    return _reads(setting, final.tensor_axes, ())


def _reads(setting: Setting, axes: tuple[str, ...], keys: tuple[str, ...]) -> int:
    """2: the override sets what a rule reads (a key of ``keys``, the size of an axis of
    ``axes``); 1: perhaps (a placement, which may change an axis's role or count, or another
    axis's size, which may change the world); 0: not."""
    head = setting.parts[0]
    if setting.key in keys or (head == "mesh" and len(setting.parts) == 2
                               and setting.parts[1] in axes):
        return 2
    return 1 if head == "place" or (head == "mesh" and len(setting.parts) == 2) else 0


def judge(rules: list[Rule], final: Facts, written: Facts | None,
          settings: Settings | None) -> list[tuple[Diagnostic, Source]]:
    """The broken rules' diagnostics on ``final`` (the strategy as lowered): at the key when the
    file as written (``written``; None when it does not lower alone) breaks the rule too, else at
    the last override that changes what the rule reads (one that changes it directly first)."""
    out: list[tuple[Diagnostic, Source]] = []
    for rule in rules:
        message = rule.check(final)
        if message is None:
            continue
        culprit = None
        if settings and written is not None and rule.check(written) is None:
            ranked = [(rule.reads(s, final), s.index, s) for s in settings.items
                      if rule.reads(s, final)]
            culprit = max(ranked, key=lambda r: r[:2])[2] if ranked else None  # the last, direct first
        span = rule.origin.span
        where = (f"{rule.origin.source.path}:{span.line}:{span.column}" if span is not None
                 else rule.origin.source.path)
        if culprit is not None:
            note = f"{rule.origin.key} is at {where}"
            assert settings is not None
            out.append((Diagnostic(rule.severity, message, rule.code, culprit.span, (note,),
                                   source=settings.source), settings.source))
            continue
        notes = (settings.note(),) if settings else ()
        out.append((Diagnostic(rule.severity, message, rule.code, span, notes,
                               source=rule.origin.source), rule.origin.source))
    return out
