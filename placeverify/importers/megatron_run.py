"""A Megatron-LM launch as the importer reads it: the training program's arguments and the
launcher's, the world size and the parallel sizes, and what each step of
:func:`placeverify.importers.megatron.read` has decided so far.
"""

from __future__ import annotations

from dataclasses import dataclass

from placeverify.diagnostics import Code, Source
from placeverify.importers import megatron_yaml
from placeverify.importers.arguments import Arguments, Launch, split_launch
from placeverify.importers.common import Line, Plan, Reader
from placeverify.importers.megatron_deepspeed import Engine
from placeverify.importers.megatron_launch import launch_world
from placeverify.importers.origins import Origin, Value
from placeverify.importers.shell import Script


@dataclass
class Run:
    """A Megatron-LM launch as the steps of :func:`placeverify.importers.megatron.read` have
    read it so far."""

    reader: Reader
    source: Source
    model: str | None  # --model: a Hugging Face config.json
    script: Script | None  # None for a test configuration (YAML)
    started: Launch
    args: Arguments  # the training program's
    runner: Arguments  # the launcher's
    plan: Plan
    world: int | None
    world_line: Line | None
    replaced: list[str]  # the assumptions --world replaced
    tp: Value
    pp: Value
    cp: Value
    ep: Value
    etp: Value | None
    dp: int = 1  # world / (tp x pp x cp)
    d: int = 1  # the dp axis: dp, less the expert ranks
    sp: Value | None = None
    overlap: Value | None = None
    micro: Value | None = None
    glob: Value | None = None
    m: int = 1  # micro-batches per step
    fsdp2: Value | None = None
    dist_opt: Value | None = None
    engine: Engine | None = None
    # ETP below TP: the experts split whole over tp x ep (the tp axis TP / ETP, the ep axis
    # ETP x EP / TP, an etp axis ETP: lower/expert_mesh.py)
    split: bool = False

    @property
    def etp_size(self) -> int:
        """ETP when the experts split whole over part of tp, else 1."""
        return int(str(self.etp.value)) if self.split and self.etp is not None else 1

    @property
    def ep_axis(self) -> int:
        """The ep axis: EP, or ETP x EP / TP when the experts also split whole over tp."""
        e = int(str(self.ep.value))
        return self.etp_size * e // int(str(self.tp.value)) if self.split else e

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """TP, PP, CP and EP."""
        t, p, c, e = (int(str(v.value)) for v in (self.tp, self.pp, self.cp, self.ep))
        return t, p, c, e


def _no_command(reader: Reader, script: Script, started: Launch) -> None:
    """A script that runs no Python file and gives no flag to any command, but keeps flags in
    a variable no command uses (``GPT_ARGS="--num-layers 24 ..."``, the launch left out): an
    error at that variable, not the flags' absence."""
    if any(w.text.startswith("--") for w in started.arguments):
        return
    for name, offset in script.assigned.items():
        value = script.state.values.get(name)
        items = value if isinstance(value, tuple) else (value,) if value is not None else ()
        flags = [w for t in items for w in t.text.split() if w.startswith("--")]
        if name in script.expanded or not flags:
            continue
        reader.error(f"no training command in this file: ${name} holds training flags "
                     f"({', '.join(flags[:3])}{', ...' if len(flags) > 3 else ''}) but no "
                     f"command uses it; placeverify reads the command that runs them (`torchrun "
                     f"... pretrain_gpt.py ${name}`)",
                     Origin(name, script.source, script.span(offset, offset + len(name))),
                     code=Code.MISSING)
        reader.raise_if_errors()


def start(reader: Reader, source: Source, model: str | None, world: int | None) -> Run:
    """The launch: the training program's arguments and the launcher's, the world size, and the
    parallel sizes (an error for any that is not a number)."""
    script: Script | None = None
    if megatron_yaml.is_test_config(source):
        started = Launch([], None, megatron_yaml.arguments(source), False)
    else:
        script = Script(source, reader.inputs)
        started = split_launch(script)
        if started.program is None:
            _no_command(reader, script, started)
    launch, words, launched = started.launcher, started.arguments, started.launched
    plan = Plan("megatron", source.path)
    args = Arguments(reader, words, source)
    runner = Arguments(reader, launch, source)
    world_value, world_line, replaced = launch_world(runner, reader, script, launch, launched,
                                                     world)
    tp = args.integer("--tensor-model-parallel-size", 1)
    pp = args.integer("--pipeline-model-parallel-size", 1)
    cp = args.integer("--context-parallel-size", 1)
    ep = args.integer("--expert-model-parallel-size", 1)
    etp = args.integer("--expert-tensor-parallel-size")
    sizes = [v for v in (tp, pp, cp, ep) if v is not None]
    if len(sizes) < 4:
        reader.raise_if_errors()
    assert tp is not None and pp is not None and cp is not None and ep is not None
    run = Run(reader, source, model, script, started, args, runner, plan, world_value, world_line,
               replaced, tp, pp, cp, ep, etp)
    t, _, c, e = run.sizes
    # Megatron-core builds the experts' own mesh (parallel_state.py, initialize_model_parallel:
    # RankGenerator(tp=expert_tensor_parallel_size, ep=expert_model_parallel_size,
    # dp=world / (ETP * EP * PP)), in the dense mesh's order tp-cp-ep-dp-pp). With ETP dividing
    # TP, TP dividing ETP * EP and CP 1, each dense tensor-parallel group lies inside one
    # expert-parallel group: the mesh etp x tp' x ep' x dp (tp' = TP / ETP, ep' = ETP * EP / TP)
    # refines both, and the experts split whole over tp' x ep' (place expert over tp * ep,
    # lower/expert_mesh.py). Any other ETP != TP splits the experts over ranks no axis of such a
    # mesh gives (also at EP 1: every tensor rank holds every expert whole), not a guess to make
    x = int(str(etp.value)) if etp is not None else t
    if etp is not None and x != t and (e > 1 or args.has("--num-experts")):
        if x < t and t % x == 0 and (x * e) % t == 0 and c == 1 and e > 1:
            run.split = True
        else:
            reader.error(f"not modelled: --expert-tensor-parallel-size {etp.value} with "
                         f"--tensor-model-parallel-size {t}, --context-parallel-size {c} and "
                         f"--expert-model-parallel-size {e} (Megatron-core splits the experts "
                         "over ETP ranks, with an expert data-parallel group of world / (ETP x "
                         "EP x PP); placeverify models ETP dividing TP with CP 1 and ETP x EP a "
                         "multiple of TP, where each tensor-parallel group lies inside one "
                         "expert-parallel group)", etp.origin, code=Code.NOT_MODELLED)
    return run
