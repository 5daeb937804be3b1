"""The world size of a Megatron-LM launch: the processes the launcher starts.

torchrun's ``--nproc-per-node`` x ``--nnodes`` (and the ``deepspeed`` launcher's names,
``deepspeed/launcher/runner.py``), or the tasks of an ``srun`` that runs the training program
itself (srun(1): ``--ntasks``, else nodes x ``--ntasks-per-node``, each from srun's own options
or the allocation's ``#SBATCH`` lines), or ``--world`` where the script does not say.
"""

from __future__ import annotations

from dataclasses import dataclass

from placeverify.diagnostics import Code, Span
from placeverify.importers.arguments import Arguments
from placeverify.importers.common import Line, Reader
from placeverify.importers.origins import Origin
from placeverify.importers.shell import Script
from placeverify.importers.shell_values import Word

NPROC_FLAGS = ("--nproc_per_node", "--nproc-per-node", "--num_gpus", "--num-gpus")
NNODES_FLAGS = ("--nnodes", "--num_nodes", "--num-nodes")


# The world, the line that writes it (None when it is not known), and the assumptions --world
# replaced.
World = tuple[int | None, Line | None, list[str]]


def launch_world(runner: Arguments, reader: Reader, script: Script | None, launch: list[Word],
                 launched: bool, world: int | None) -> World:
    """The world of a launch: an srun's tasks when srun starts the training program (no
    launcher under it), else the launcher's process counts; the launcher's count flags are
    marked read."""
    tasks = None if launched or script is None else _srun_tasks(launch, script, reader)
    if tasks is not None:
        found = _tasks_world(tasks, reader, world)
    else:
        found = _world(runner, reader, world, launched or not launch, launch)
    for name in (*NPROC_FLAGS, *NNODES_FLAGS):
        runner.used.add(name)
    return found


_SRUN_OPTIONS = {"--nodes": "--nodes", "-N": "--nodes", "--ntasks-per-node": "--ntasks-per-node",
                 "--ntasks": "--ntasks", "-n": "--ntasks"}


@dataclass(frozen=True, slots=True)
class Tasks:
    """The processes ``srun`` starts, one per task (srun(1)): ``--ntasks``, else nodes x
    ``--ntasks-per-node``; each count from srun's own option or the allocation's ``#SBATCH``
    line. ``count`` is None when the counts do not give it (``why`` says which is missing)."""

    count: int | None
    why: str
    origin: Origin


def _srun_tasks(launch: list[Word], script: Script, reader: Reader) -> Tasks | None:
    """The tasks of an ``srun`` that runs the training program itself (no torchrun under it),
    or None when no srun starts it. An option whose value only running the script gives is an
    error at the word."""
    at = next((k for k, w in enumerate(launch) if w.text.rsplit("/", 1)[-1] == "srun"), None)
    if at is None:
        return None
    sbatch: dict[str, tuple[int, str, Span | None]] = {
        o: (v.value, f"#SBATCH {o}={v.value} (line {v.span.line})", v.span)
        for o, v in script.sbatch.items()}
    own: dict[str, tuple[int, str, Span | None]] = {}
    k = at + 1
    while k < len(launch):
        text = launch[k].text
        name, eq, inline = text.partition("=") if text.startswith("--") else (text[:2], "", text[2:])
        option = _SRUN_OPTIONS.get(name)
        if option is None:
            k += 1
            continue
        value_word = launch[k] if (eq or inline) else launch[k + 1] if k + 1 < len(launch) else None
        k += 1 if (eq or inline) else 2
        if value_word is None:
            continue
        if value_word.unresolved:
            reader.error(f"srun {name}: {value_word.unresolved}; write the number or pass "
                         "--world N", Origin(name, script.source, value_word.span),
                         code=Code.NOT_STATIC)
            continue
        value = inline if (eq or inline) else value_word.text
        if value.isdigit():
            own[option] = (int(value), f"srun {name} {value}", value_word.span)
    # srun's own counts first; the allocation's fill in what srun leaves (srun(1): the
    # SLURM_NTASKS / SLURM_NNODES / SLURM_NTASKS_PER_NODE of the job are its defaults)
    if "--ntasks" in own:
        count, why, span = own["--ntasks"]
        return Tasks(count, why, Origin("--ntasks", script.source, span))
    given = {**sbatch, **own}
    if "--ntasks" in sbatch and not own:
        count, why, span = sbatch["--ntasks"]
        return Tasks(count, why, Origin("--ntasks", script.source, span))
    if "--ntasks-per-node" in given and "--nodes" in given:
        per, per_why, span = given["--ntasks-per-node"]
        nodes, nodes_why, _ = given["--nodes"]
        return Tasks(per * nodes, f"{per_why} x {nodes_why}",
                     Origin("--ntasks-per-node", script.source, span))
    missing = " and ".join(o for o in ("--nodes", "--ntasks-per-node") if o not in given)
    return Tasks(None, f"srun starts the training program with no {missing} (from its own "
                 "options or an #SBATCH line); Slurm's default of one task per node is not "
                 "assumed", Origin("srun", script.source, launch[at].span))


def _tasks_world(tasks: Tasks, reader: Reader, world: int | None) -> World:
    """The world of an srun launch: its task count, or --world where the script does not give
    it; a --world that contradicts it is an error."""
    if tasks.count is None:
        if world is not None:
            return world, Line(f"world = {world}", "--world (placeverify option): "
                               + tasks.why.split(";")[0]), []
        reader.error(f"world size unknown: {tasks.why}; pass --world N", tasks.origin,
                     code=Code.MISSING)
        return None, None, []
    if world is not None and world != tasks.count:
        reader.error(f"--world {world} contradicts srun's {tasks.count} tasks ({tasks.why})",
                     tasks.origin, code=Code.WORLD_MISMATCH)
    return tasks.count, Line(f"world = {tasks.count}", f"srun tasks, one process each: "
                             f"{tasks.why}", tasks.origin), []


def _world(runner: Arguments, reader: Reader, world: int | None, launched: bool,
           launch: list[Word]) -> World:
    """The world size: torchrun's --nproc-per-node x --nnodes, or --world; and the assumptions
    --world replaced. A launcher value only running the script gives (``--nnodes $SLURM_NNODES``)
    or a default of one (``${SLURM_NNODES:-1}``) leaves it to --world, which must then be a
    multiple of a known --nproc-per-node."""
    # torchrun's names, then the deepspeed launcher's (deepspeed/launcher/runner.py)
    nproc_name = next((n for n in NPROC_FLAGS if n in runner.flags), "--nproc-per-node")
    nnodes_name = next((n for n in NNODES_FLAGS if n in runner.flags), "--nnodes")
    unknown = [n for n in (nproc_name, nnodes_name) if runner.unresolved(n) is not None]
    assumed = runner.assumed_of(nproc_name, nnodes_name)
    guess = f"; assumed: {'; '.join(assumed)}" if assumed else ""
    # a value taken from a default (NNODES=${SLURM_NNODES:-1}) is a guess that --world replaces
    guessed = [n for n in (nproc_name, nnodes_name) if n not in unknown and runner.assumed_of(n)]
    if (unknown or guessed) and world is not None:
        nproc = None if nproc_name in unknown else runner.integer(nproc_name)
        if nproc is not None and world % int(str(nproc.value)):
            reader.error(f"--world {world} is not a multiple of {nproc.origin.key} {nproc.value} "
                         "(torchrun starts that many processes on each node)", nproc.origin,
                         code=Code.WORLD_MISMATCH)
        runner.used.update(unknown + guessed)
        return world, Line(f"world = {world}", "--world (placeverify option), in place of the "
                           "script's " + " and ".join(unknown + guessed)
                           + (f" (a default: {'; '.join(assumed)})" if assumed else "")), assumed
    fix = "write the number or pass --world N"
    nproc = runner.integer(nproc_name, fix=fix)
    nnodes = runner.integer(nnodes_name, 1, fix=fix)
    if nproc is not None and nnodes is not None:
        world_value = int(str(nproc.value)) * int(str(nnodes.value))
        if world is not None and world != world_value:
            reader.error(f"--world {world} contradicts the launcher's {nproc.value} x "
                         f"{nnodes.value} = {world_value} processes", nproc.origin,
                         code=Code.WORLD_MISMATCH)
        return world_value, Line(f"world = {world_value}", f"{nproc.origin.key} {nproc.value} x "
                                 f"{nnodes.origin.key} {nnodes.value}" + guess, nproc.origin), []
    if world is not None and not unknown:
        return world, Line(f"world = {world}", "--world (placeverify option)"), []
    if not unknown:
        hidden = next((w for w in launch if w.unresolved), None)
        why = (f"the launcher {hidden.text} is not known: {hidden.unresolved}" if hidden else
               "the script launches no torchrun with --nproc-per-node/--nnodes" if launched
               else "the launcher gives no --nproc-per-node")
        reader.error(f"world size unknown: {why}; pass --world N",
                     Origin("launcher", reader.source, hidden.span) if hidden else None,
                     code=Code.MISSING)
    return None, None, []
