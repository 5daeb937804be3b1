"""What every importer shares: where a value came from, the plan it builds, the .place it writes.

An importer reads a configuration file (never runs it) into a :class:`Plan`: the lines of a
``.place`` file, each with the key it came from. placeverify then parses and lowers that text like
any file, so one code path decides what a strategy means; :func:`render` writes the text and keeps,
for every line, the key's position so that an error found while lowering points at the key.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from placeverify.diagnostics import Code, Diagnostic, Diagnostics, PlaceError, Severity, Source, Span
from placeverify.importers.origins import Origin
from placeverify.importers.rules import Rule
from placeverify.importers.shell_inputs import NO_INPUTS, Inputs

COMMENT_COLUMN = 44  # where the "# key" comments start, when the statement is shorter


@dataclass(frozen=True, slots=True)
class Line:
    """One line of the produced .place text; ``why`` is its comment (the key, or a derivation)."""

    text: str
    why: str = ""
    origin: Origin | None = None


@dataclass
class Plan:
    """A strategy as an importer reads it: the .place statements, each with its origin."""

    fmt: str  # the format's name, as --format spells it
    path: str
    title: str = ""
    framework: str | None = None  # the engine that runs it (FRAMEWORKS), when not fmt's own
    header: list[str] = field(default_factory=list)  # comment lines at the top
    model_name: str = "transformer"
    model: list[Line] = field(default_factory=list)  # entries of the model block
    model_origin: Origin | None = None
    precision: Line | None = None
    mesh: list[Line] = field(default_factory=list)  # axes innermost first (rank order), world
    body: list[Line] = field(default_factory=list)  # place, microbatches, loss, clip, ...
    rules: list[Rule] = field(default_factory=list)  # consistency rules, judged on final values


@dataclass
class Imported:
    """An importer's product: the .place text, the key behind each line, and the warnings."""

    fmt: str
    path: str
    text: str
    origins: dict[int, Origin]  # 1-based line of ``text`` -> the key it came from
    warnings: list[tuple[Diagnostic, Source]]
    rules: list[Rule] = field(default_factory=list)  # judged on the strategy as lowered

    def where(self, line: int) -> str:
        """A line of the produced text, as a note on a message moved to its key."""
        text = Source(self.path, self.text).line_text(line).strip()
        return f"in the imported strategy, line {line}: {text}"


class Reader:
    """Diagnostics of one imported file (and of the model file, if any)."""

    def __init__(self, source: Source, given: frozenset[str] = frozenset(),
                 inputs: Inputs = NO_INPUTS, config: str | None = None) -> None:
        self.source = source
        self.given = given  # keys an override gives (Options.given)
        self.inputs = inputs  # a launch script's --env and --script-args
        self.config = config  # a config registry's function (--config)
        self._once: dict[object, tuple[int, list[str]]] = {}  # see once()
        self.diags = Diagnostics(source)
        self.extra: list[tuple[Diagnostic, Source]] = []  # warnings about other files
        self.pending: list[Diagnostic] = []  # rules judged after overrides, unless errors come first

    def error(self, message: str, origin: Origin | None, *notes: str,
              code: Code = Code.BAD_VALUE) -> None:
        self._add(Severity.ERROR, message, origin, notes, code)

    def warning(self, message: str, origin: Origin | None, *notes: str,
                code: Code = Code.NOT_MODELLED) -> None:
        self._add(Severity.WARNING, message, origin, notes, code)

    def _add(self, severity: Severity, message: str, origin: Origin | None,
             notes: tuple[str, ...], code: Code) -> None:
        span = origin.span if origin is not None else None
        diagnostic = Diagnostic(severity, message, code, span, notes)
        if origin is not None and origin.source is not self.source:
            if severity is Severity.ERROR:
                raise PlaceError([diagnostic], origin.source)
            self.extra.append((diagnostic, origin.source))
        else:
            self.diags.items.append(diagnostic)

    def once(self, key: object, subject: str, message: str, origin: Origin, code: Code) -> None:
        """An error reported once per ``key`` (an undecided test of a script): ``subject``
        (a flag) starts its message; the subjects of later ones are named in its note."""
        if key not in self._once:
            self._once[key] = (len(self.diags.items), [])
            self.error(f"{subject}: {message}", origin, code=code)
            return
        at, others = self._once[key]
        if subject in others or self.diags.items[at].message.startswith(f"{subject}:"):
            return
        others.append(subject)
        first = self.diags.items[at]
        self.diags.items[at] = Diagnostic(first.severity, first.message, first.code, first.span,
                                          (f"the same test also decides {', '.join(others)}",))

    def pending_error(self, message: str, origin: Origin, code: Code) -> None:
        """An error that a rule judges on the final strategy (an override may fix it), reported
        here only beside other errors of the file, which stop it from being lowered at all."""
        self.pending.append(Diagnostic(Severity.ERROR, message, code, origin.span))

    def raise_if_errors(self) -> None:
        if self.diags.errors:
            self.diags.items.extend(self.pending)
            self.pending = []
        self.diags.raise_if_errors()

    def warnings(self) -> list[tuple[Diagnostic, Source]]:
        return [*((d, self.source) for d in self.diags.warnings), *self.extra]


IGNORED_HEADER = "Read but without effect on placement, memory or communication: "


@dataclass(frozen=True)
class Keys:
    """One mapping of a configuration file, for :func:`leftovers`: the keys placeverify reads,
    those it reads without effect (named once in the header), the mappings inside it checked where
    they stand (``inside``, by key), how a key is named in the header and the warnings, and the
    warning about a key it neither reads nor ignores."""

    read: Collection[str] = ()
    ignored: Collection[str] = ()
    inside: Mapping[str, Keys] = field(default_factory=dict)
    name: Callable[[str], str] = str
    unknown: Callable[[str], str] | None = None  # default: "not modelled: NAME"


def leftovers(reader: Reader, plan: Plan, source: Source, data: Mapping[str, Any],
              spans: Mapping[tuple[str, ...], Span],
              *sections: tuple[tuple[str, ...], Keys]) -> None:
    """Every key of ``data`` that no reader took: a warning at its position when placeverify
    does not model it, else one header line naming those without effect. ``sections`` are
    (path in ``data``, its keys), checked in turn; a key of a section is, in this order, a
    mapping of ``inside`` (checked where it stands), ignored, read, or not modelled."""
    ignored: list[str] = []

    def walk(path: tuple[str, ...], node: Any, keys: Keys) -> None:
        if not isinstance(node, Mapping):
            return
        for key, value in node.items():
            where = (*path, key)
            if key in keys.inside and isinstance(value, Mapping):
                walk(where, value, keys.inside[key])
            elif key in keys.ignored:
                ignored.append(keys.name(key))
            elif key not in keys.read:
                message = (keys.unknown(key) if keys.unknown is not None
                           else f"not modelled: {keys.name(key)}")
                reader.warning(message, Origin(keys.name(key), source, spans.get(where)))

    for path, keys in sections:
        node: Any = data
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        walk(path, node, keys)
    ignored_header(plan, ignored)


def ignored_header(plan: Plan, names: list[str]) -> None:
    """The header line naming the keys read without effect, when there are any."""
    if names:
        plan.header.append(IGNORED_HEADER + " ".join(names))


def mesh_title(plan: Plan, source: Source, what: str) -> str:
    """``file: what, tp = 8, dp = 16``: a title naming the file, the framework and the mesh."""
    return f"{Path(source.path).name}: {what}, " + ", ".join(
        line.text for line in plan.mesh if not line.text.startswith("world"))


def number_text(value: Fraction | float | int) -> str:
    """A number as the .place grammar writes it (no exponent, no trailing '.0')."""
    f = Fraction(value).limit_denominator(10**9) if isinstance(value, float) else Fraction(value)
    if f.denominator == 1:
        return str(f.numerator)
    return format(float(f), "f").rstrip("0").rstrip(".") or "0"


@dataclass(frozen=True, slots=True)
class Framework:
    """What an imported strategy says of the framework its file is for: the name titles use, and
    the memory profile (whose kernels save the layer's activations and whose temporaries the peak
    counts, ``placeverify/ir/profiles.py``) with the reason."""

    name: str
    memory_profile: str
    why: str


FRAMEWORKS = {
    "megatron": Framework("Megatron-LM", "megatron", "Megatron-core's fused kernels"),
    "deepspeed": Framework("DeepSpeed", "deepspeed",
                           "DeepSpeed runs the model's eager (Hugging Face) kernels"),
    "megatron_deepspeed": Framework("Megatron-DeepSpeed", "megatron_deepspeed",
                                    "Megatron's model under DeepSpeed's engine and optimizers"),
    "torchtitan": Framework("torchtitan", "torch", "torchtitan: eager PyTorch modules under FSDP2"),
    "accelerate": Framework("accelerate", "torch",
                            "accelerate: the Hugging Face model's eager kernels under torch FSDP"),
    "axolotl": Framework("axolotl", "torch",
                         "axolotl: the Hugging Face model's eager kernels under transformers' Trainer"),
    "trl": Framework("TRL", "torch",
                     "TRL: the Hugging Face model's eager kernels under transformers' Trainer"),
}


def render(plan: Plan) -> tuple[str, dict[int, Origin]]:
    """The .place text of a plan, and the origin of each line that has one."""
    out: list[str] = []
    origins: dict[int, Origin] = {}

    def emit(line: Line, indent: str = "") -> None:
        text = indent + line.text
        if line.why:
            text = f"{text.ljust(COMMENT_COLUMN - 1)} # {line.why}".replace("\n", " ")
        out.append(text)
        if line.origin is not None:
            origins[len(out)] = line.origin

    out.append(f"# Imported by placeverify from {plan.path} ({plan.fmt}); each line names the key "
               "it came from.")
    out.extend(f"# {h}" for h in plan.header)
    out.append(f'strategy "{_quoted(plan.title or plan.path)}"')
    out.append("")
    out.append(f"model {plan.model_name} {{")
    if plan.model_origin is not None:
        origins[len(out)] = plan.model_origin
    for line in plan.model:
        emit(line, "    ")
    out.append("}")
    if plan.precision is not None:
        emit(plan.precision)
    out.append("")
    out.append("mesh {")
    # the importers list axes innermost first (the framework's rank order); a .place mesh is
    # written outermost first, its last axis varying fastest (ir/devices.py, intra_node)
    axes = [line for line in plan.mesh if not line.text.startswith("world")]
    for line in [*reversed(axes), *(line for line in plan.mesh if line not in axes)]:
        emit(line, "    ")
    framework = FRAMEWORKS.get(plan.framework or plan.fmt)
    if framework is not None:
        emit(Line(f"memory_profile = {framework.memory_profile}", framework.why), "    ")
    out.append("}")
    out.append("")
    for line in plan.body:
        emit(line)
    return "\n".join(out) + "\n", origins


def _quoted(text: str) -> str:
    return text.replace("\\", "/").replace('"', "'")
