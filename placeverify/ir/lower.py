"""AST -> IR: resolve names, check values and sizes, expand presets, compose placements.

Lowering collects every error it can find in one pass and raises them together; each points at
the text it is about. The meaning of composition is defined here: each ``place ... over axis``
fills one column of the state x axis mode matrix; ``recompute`` turns the activations' data-axis
modes into M; ``offload`` turns a state's sharded data-axis modes into O.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import ClassVar, TypeVar

from placeverify.diagnostics import Code, Diagnostics, Source, Span, did_you_mean
from placeverify.ir import canonical
from placeverify.ir.mesh import Axis, Group, Mesh
from placeverify.ir.model import (
    ARCHITECTURES,
    BARE_MODELS,
    MODEL_PRESETS,
    Model,
    ParamGroup,
    Transformer,
)
from placeverify.ir.placement import STATE_NAMES, STATES, AxisPlacement, Mode, Role, Schedule, State
from placeverify.ir.precision import DTYPE_BYTES, PRECISIONS, Precision
from placeverify.ir.queries import region_named
from placeverify.ir.relations import BATCH_ROLES
from placeverify.ir.step import (
    Backward,
    Clip,
    Collective,
    CollectiveKind,
    Count,
    CountKind,
    Free,
    LoopOp,
    Monomial,
    Op,
    Order,
    ReduceOp,
    Region,
    Scale,
    Scope,
    Seed,
    Step,
    Target,
    TargetKind,
    Term,
    TermKind,
    Update,
)
from placeverify.ir.strategy import (
    ClipConfig,
    Loss,
    LossKind,
    Recompute,
    RecomputeKind,
    Strategy,
)
from placeverify.syntax import ast
from placeverify.syntax.parser import parse_source, read_source

T = TypeVar("T")

RESERVED_AXIS_NAMES = frozenset({"world", "step", "microbatch", "ends"})

# Sanity bounds: values beyond these are typing mistakes, not plans ("absurd numbers").
MAX_PARAMS = 10**15
MAX_AXIS = 10**7
MAX_WORLD = 10**8
MAX_DIM = 10**7
MAX_LAYERS = 100_000
MAX_SEQ = 10**8
MAX_MICROBATCHES = 10**6
MAX_BYTES_PER_ELEMENT = 64
MAX_MEMORY = 10**16

BYTE_UNITS: dict[str, Fraction] = {
    "B": Fraction(1), "KB": Fraction(10**3), "MB": Fraction(10**6), "GB": Fraction(10**9),
    "TB": Fraction(10**12), "PB": Fraction(10**15), "KiB": Fraction(2**10),
    "MiB": Fraction(2**20), "GiB": Fraction(2**30), "TiB": Fraction(2**40), "PiB": Fraction(2**50),
    "Gb": Fraction(10**9, 8), "Tb": Fraction(10**12, 8),
}
TIME_UNITS: dict[str, Fraction] = {
    "ns": Fraction(1, 10**9), "us": Fraction(1, 10**6), "µs": Fraction(1, 10**6),
    "ms": Fraction(1, 1000), "s": Fraction(1),
}

BOOLEANS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


# ---- presets of one axis ---------------------------------------------------------------------

R, S, SS, M, O = Mode.R, Mode.S, Mode.S_STAR, Mode.M, Mode.O


@dataclass(frozen=True, slots=True)
class _Preset:
    role: Role
    modes: tuple[Mode, Mode, Mode, Mode]
    axes: int = 1  # hsdp takes two axes: shard, replicate


DATA_PRESETS: dict[str, tuple[Mode, Mode, Mode, Mode]] = {
    "ddp": (R, R, R, R),
    "zero1": (R, S, R, R),
    "zero2": (R, S, S, R),
    "zero3": (SS, S, S, R),
    "fsdp": (SS, S, S, R),
}
FSDP_STRATEGIES = {"full": "full", "full_shard": "full", "grad_op": "grad_op",
                   "shard_grad_op": "grad_op", "no_shard": "no_shard", "hybrid": "hybrid",
                   "hybrid_shard": "hybrid"}
PRESETS: dict[str, _Preset] = {
    **{name: _Preset(Role.DATA, modes) for name, modes in DATA_PRESETS.items()},
    "hsdp": _Preset(Role.DATA, (SS, S, S, R), axes=2),
    "megatron": _Preset(Role.TENSOR, (S, S, S, R)),
    "tp": _Preset(Role.TENSOR, (S, S, S, R)),
    "sp": _Preset(Role.TENSOR, (S, S, S, S)),
    "pipeline": _Preset(Role.PIPELINE, (S, S, S, S)),
    "gpipe": _Preset(Role.PIPELINE, (S, S, S, S)),
    "interleaved": _Preset(Role.PIPELINE, (S, S, S, S)),
    "context": _Preset(Role.CONTEXT, (R, R, R, S)),
    "cp": _Preset(Role.CONTEXT, (R, R, R, S)),
    "expert": _Preset(Role.EXPERT, (S, S, S, R)),
    "ep": _Preset(Role.EXPERT, (S, S, S, R)),
}
ROLE_NAMES = {r.value: r for r in Role}
MODE_NAMES = {m.value: m for m in Mode}


def load(path: str) -> Strategy:
    """Read, parse and lower a ``.place`` file."""
    source = read_source(path)
    return lower(parse_source(source), source)


def load_text(text: str, path: str = "<text>") -> Strategy:
    source = Source(path, text)
    return lower(parse_source(source), source)


def lower(file: ast.File, source: Source) -> Strategy:
    return _Lowerer(source).run(file)


class _Lowerer:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.diag = Diagnostics(source)

    # ---- small helpers ----------------------------------------------------------------------

    def error(self, message: str, code: Code, span: Span | None, *notes: str) -> None:
        self.diag.error(message, code, span, *notes)

    def number(self, value: ast.Value, what: str) -> Fraction | None:
        if isinstance(value, ast.NumberValue):
            return value.value
        if isinstance(value, ast.QuantityValue):
            self.error(f"{what} is a plain number, not '{value.text}'", Code.BAD_VALUE, value.span)
        else:
            self.error(f"{what} must be a number", Code.BAD_VALUE, value.span)
        return None

    def integer(self, value: ast.Value, what: str, low: int = 1, high: int = MAX_DIM) -> int | None:
        number = self.number(value, what)
        if number is None:
            return None
        if number.denominator != 1:
            self.error(f"{what} must be a whole number, not {_literal(value, number)}",
                       Code.BAD_VALUE, value.span)
            return None
        return self.in_range(int(number), what, value.span, low, high)

    def in_range(self, n: int, what: str, span: Span, low: int, high: int) -> int | None:
        if n < low:
            kind = "zero" if n == 0 else "negative" if n < 0 else "too small"
            self.error(f"{what} must be at least {low}, got {n} ({kind})", Code.BAD_VALUE, span)
            return None
        if n > high:
            self.error(f"{what} = {_count(n)} is absurdly large (the limit is {_count(high)})",
                       Code.BAD_VALUE, span)
            return None
        return n

    def quantity(self, value: ast.Value, what: str, units: dict[str, Fraction], per_second: bool,
                 high: Fraction) -> Fraction | None:
        if not isinstance(value, ast.QuantityValue):
            example = {True: "25 GB/s", False: "80 GB" if units is BYTE_UNITS else "5 us"}
            self.error(f"{what} needs a unit, e.g. '{example[per_second]}'", Code.BAD_VALUE,
                       value.span)
            return None
        unit = value.unit.removesuffix("/s")
        if value.unit.endswith("/s") != per_second or unit not in units:
            valid = [u + ("/s" if per_second else "") for u in units]
            self.error(f"'{value.unit}' is not a unit of {what}{did_you_mean(value.unit, valid)}",
                       Code.BAD_VALUE, value.span)
            return None
        amount = value.number * units[unit]
        if amount <= 0:
            self.error(f"{what} must be positive, got {value.text}", Code.BAD_VALUE, value.span)
            return None
        if amount > high:
            self.error(f"{what} = {value.text} is absurdly large", Code.BAD_VALUE, value.span)
            return None
        return amount

    def word(self, value: ast.Value, what: str, choices: Sequence[str]) -> str | None:
        if isinstance(value, ast.NameValue) and value.name.text in choices:
            return value.name.text
        shown = _value_text(value)
        self.error(f"unknown {what} '{shown}'{did_you_mean(shown, choices)}", Code.UNKNOWN_NAME,
                   value.span)
        return None

    def boolean(self, value: ast.Value, what: str) -> bool | None:
        if isinstance(value, ast.NameValue) and value.name.text in BOOLEANS:
            return BOOLEANS[value.name.text]
        self.error(f"{what} is true or false, not '{_value_text(value)}'", Code.BAD_VALUE,
                   value.span)
        return None

    def unique(self, items: Sequence[T], key: Callable[[T], str], span: Callable[[T], Span],
               what: str) -> dict[str, T]:
        seen: dict[str, T] = {}
        for item in items:
            k = key(item)
            if k in seen:
                first = span(seen[k])
                self.error(f"duplicate {what} '{k}'", Code.DUPLICATE, span(item),
                           f"first defined at {_at(first)}")
            else:
                seen[k] = item
        return seen

    def single(self, statements: Sequence[T], what: str) -> T | None:
        for extra in statements[1:]:
            first = statements[0].span  # type: ignore[attr-defined]
            self.error(f"duplicate '{what}' statement", Code.DUPLICATE, extra.span,  # type: ignore[attr-defined]
                       f"the first is at {_at(first)}")
        return statements[0] if statements else None

    # ---- the file -----------------------------------------------------------------------------

    def run(self, file: ast.File) -> Strategy:
        by_type: dict[type, list[ast.Statement]] = {}
        for statement in file.statements:
            by_type.setdefault(type(statement), []).append(statement)

        def of(kind: type[T]) -> list[T]:
            return by_type.get(kind, [])  # type: ignore[return-value]

        name_stmt = self.single(of(ast.StrategyStmt), "strategy")
        model_stmt = self.single(of(ast.ModelStmt), "model")
        precision_stmt = self.single(of(ast.PrecisionStmt), "precision")
        mesh_stmt = self.single(of(ast.MeshStmt), "mesh")
        recompute_stmt = self.single(of(ast.RecomputeStmt), "recompute")
        loss_stmt = self.single(of(ast.LossStmt), "loss")
        microbatch_stmt = self.single(of(ast.MicrobatchesStmt), "microbatches")
        clip_stmt = self.single(of(ast.ClipStmt), "clip")
        scale_stmt = self.single(of(ast.LossScaleStmt), "loss_scale")
        step_stmt = self.single(of(ast.StepStmt), "step")

        end = self.source.end_span()
        if model_stmt is None:
            self.error("no 'model' statement: say what is trained, e.g. 'model llama3_8b' or "
                       "'model { params = 7.5e9 }'", Code.MISSING, end)
        if mesh_stmt is None:
            self.error("no 'mesh' statement: name the axes and their sizes, e.g. "
                       "'mesh { dp = 8 }'", Code.MISSING, end)
        if not of(ast.PlaceStmt):
            self.error("no 'place' statement: place the states over each axis, e.g. "
                       "'place zero3 over dp'", Code.MISSING, end)

        model = self.model(model_stmt) if model_stmt else None
        precision = self.precision(precision_stmt)
        mesh = self.mesh(mesh_stmt) if mesh_stmt else None
        self.diag.raise_if_errors()
        assert model is not None and mesh is not None and model_stmt is not None

        placements = self.placements(of(ast.PlaceStmt), mesh, model)
        placements = self.apply_offload(of(ast.OffloadStmt), placements)
        recompute = self.recompute(recompute_stmt, model)
        if recompute.kind is not RecomputeKind.NONE:
            placements = tuple(
                replace(p, modes=(*p.modes[:3], M)) if p.role in BATCH_ROLES and p.modes[3] is R
                else p for p in placements)
        loss = self.loss(loss_stmt)
        microbatches = self.microbatches(microbatch_stmt, placements)
        clip = self.clip(clip_stmt)
        loss_scale = precision.loss_scale
        if scale_stmt is not None:
            loss_scale = self.word(ast.NameValue(scale_stmt.kind), "loss scaling",
                                   ["dynamic", "static", "none"]) or loss_scale
        self.diag.raise_if_errors()
        self.check_shapes(model, mesh, placements, microbatches, model_stmt.span)
        self.diag.raise_if_errors()

        name = name_stmt.name.value if name_stmt else self.source.path
        strategy = Strategy(
            name=name, source=self.source, model=model, model_span=model_stmt.span,
            precision=precision, precision_span=precision_stmt.span if precision_stmt else None,
            mesh=mesh, placements=placements, recompute=recompute, loss=loss,
            microbatches=microbatches, clip=clip, loss_scale=loss_scale,
            step=Step(microbatches, (), (), (), (), True))
        step = self.step(step_stmt, strategy) if step_stmt is not None else \
            canonical.derive(strategy)
        self.diag.raise_if_errors()
        strategy = replace(strategy, step=step, microbatches=step.microbatches,
                           warnings=tuple(self.diag.warnings))
        return strategy

    # ---- model ----------------------------------------------------------------------------------

    ARCH_KEYS = ("layers", "hidden", "heads", "kv_heads", "ffn", "mlp", "vocab",
                 "vocab_divisible_by", "embeddings", "seq", "micro_batch", "position",
                 "max_position", "norm", "bias", "dropout", "attention", "experts", "top_k",
                 "expert_ffn")

    def model(self, stmt: ast.ModelStmt) -> Model | None:
        entries = self.unique(stmt.block.entries if stmt.block else (), lambda e: e.key.text,
                              lambda e: e.key.span, "model key")
        name = stmt.name.text if stmt.name else None
        if name is not None and name not in (*MODEL_PRESETS, "transformer"):
            self.error(f"unknown model '{name}'{did_you_mean(name, MODEL_PRESETS)}",
                       Code.UNKNOWN_NAME, stmt.name.span if stmt.name else stmt.span,
                       "bundled models: " + ", ".join(MODEL_PRESETS))
            return None
        if name in BARE_MODELS or (name is None and "params" in entries):
            return self.bare_model(name, entries, stmt)
        base = ARCHITECTURES.get(name or "")
        if "params" in entries:
            self.error("'params' is derived from the architecture; give either 'params' alone or "
                       "the architecture", Code.CONFLICT, entries["params"].span)
            return None
        arch = self.architecture(base, entries, stmt)
        if arch is None:
            return None
        return Model(name or "transformer", arch.params(), arch)

    def bare_model(self, name: str | None, entries: dict[str, ast.Entry],
                   stmt: ast.ModelStmt) -> Model | None:
        params = BARE_MODELS.get(name or "")
        for key, entry in entries.items():
            if key == "params":
                number = self.number(entry.value, "params")
                if number is None:
                    continue
                if number.denominator != 1:
                    self.error(f"params must be a whole number, not {_literal(entry.value, number)}",
                               Code.BAD_VALUE, entry.value.span)
                    continue
                params = self.in_range(int(number), "params", entry.value.span, 1, MAX_PARAMS)
            elif key in self.ARCH_KEYS:
                self.error(f"'{key}' describes an architecture, but this model is a bare parameter "
                           "count; give the architecture without 'params'", Code.CONFLICT,
                           entry.key.span)
            else:
                self.error(f"unknown model key '{key}'{did_you_mean(key, ['params'])}",
                           Code.UNKNOWN_NAME, entry.key.span)
        if params is None:
            return None
        return Model(name or "model", params, None)

    def architecture(self, base: Transformer | None, entries: dict[str, ast.Entry],
                     stmt: ast.ModelStmt) -> Transformer | None:
        values: dict[str, object] = {}
        for key, entry in entries.items():
            v = entry.value
            if key in ("layers", "heads", "kv_heads", "experts", "top_k"):
                low = 0 if key in ("experts", "top_k") else 1
                high = MAX_LAYERS if key == "layers" else MAX_DIM
                values[key] = self.integer(v, key, low, high)
            elif key in ("hidden", "ffn", "vocab", "micro_batch", "vocab_divisible_by",
                         "max_position", "expert_ffn"):
                low = 0 if key in ("max_position", "expert_ffn") else 1
                values[key] = self.integer(v, key, low, MAX_SEQ if key == "max_position" else MAX_DIM)
            elif key == "seq":
                values[key] = self.integer(v, key, 1, MAX_SEQ)
            elif key == "mlp":
                word = self.word(v, "mlp kind", ["plain", "gated", "swiglu", "geglu"])
                values["gated"] = None if word is None else word != "plain"
            elif key == "embeddings":
                word = self.word(v, "embeddings kind", ["tied", "untied"])
                values["tied_embeddings"] = None if word is None else word == "tied"
            elif key == "position":
                values[key] = self.word(v, "position encoding", ["learned", "rotary", "none"])
            elif key == "norm":
                values[key] = self.word(v, "norm", ["layernorm", "rmsnorm"])
            elif key == "attention":
                values[key] = self.word(v, "attention kind", ["standard", "flash"])
            elif key in ("bias", "dropout"):
                values[key] = self.boolean(v, key)
            else:
                self.error(f"unknown model key '{key}'{did_you_mean(key, self.ARCH_KEYS)}",
                           Code.UNKNOWN_NAME, entry.key.span)
        if any(v is None for v in values.values()):
            return None
        if base is None:
            missing = [k for k in ("layers", "hidden", "heads", "vocab", "seq") if k not in values]
            if missing:
                self.error("a transformer needs " + ", ".join(f"'{m}'" for m in missing),
                           Code.MISSING, stmt.span)
                return None
            hidden = values["hidden"]
            assert isinstance(hidden, int)
            base = Transformer(
                layers=1, hidden=hidden, heads=1, kv_heads=0, ffn=4 * hidden, gated=False, vocab=1,
                seq=1, micro_batch=1, tied_embeddings=False, position="rotary", norm="layernorm",
                bias=False, dropout=False, attention="standard")
        arch = replace(base, **values)  # type: ignore[arg-type]
        if arch.kv_heads == 0 or ("heads" in values and "kv_heads" not in values
                                  and base.kv_heads == base.heads):
            arch = replace(arch, kv_heads=arch.heads)
        span = stmt.span
        if arch.hidden % arch.heads:
            self.error(f"hidden ({arch.hidden}) must be divisible by heads ({arch.heads})",
                       Code.NOT_DIVISIBLE, _entry_span(entries, "hidden", span))
        elif arch.heads % arch.kv_heads:
            self.error(f"heads ({arch.heads}) must be divisible by kv_heads ({arch.kv_heads})",
                       Code.NOT_DIVISIBLE, _entry_span(entries, "kv_heads", span))
        if arch.experts and not arch.top_k:
            self.error("a mixture of experts needs 'top_k' (experts per token)", Code.MISSING,
                       _entry_span(entries, "experts", span))
        if arch.top_k > max(arch.experts, 0) and arch.top_k:
            self.error(f"top_k ({arch.top_k}) cannot exceed experts ({arch.experts})",
                       Code.BAD_VALUE, _entry_span(entries, "top_k", span))
        if arch.position == "learned" and arch.max_position and arch.seq > arch.max_position:
            self.error(f"seq ({arch.seq}) exceeds the learned position table ({arch.max_position} "
                       "rows)", Code.BAD_VALUE, _entry_span(entries, "seq", span))
        if arch.params() > MAX_PARAMS:
            self.error(f"this architecture has {arch.params():,} parameters, absurdly many",
                       Code.BAD_VALUE, span)
        return arch

    # ---- precision ------------------------------------------------------------------------------

    def precision(self, stmt: ast.PrecisionStmt | None) -> Precision:
        base = PRECISIONS["mixed_adam"]
        if stmt is None:
            return base
        if stmt.name is not None:
            if stmt.name.text not in PRECISIONS:
                self.error(f"unknown precision '{stmt.name.text}'"
                           f"{did_you_mean(stmt.name.text, PRECISIONS)}", Code.UNKNOWN_NAME,
                           stmt.name.span, "presets: " + ", ".join(PRECISIONS))
                return base
            base = PRECISIONS[stmt.name.text]
        elif stmt.block is None:
            self.error("precision needs a preset or a block", Code.MISSING, stmt.span)
            return base
        entries = self.unique(stmt.block.entries if stmt.block else (), lambda e: e.key.text,
                              lambda e: e.key.span, "precision key")
        changes: dict[str, object] = {}
        keys = {"params": ("params", "params_dtype"), "grads": ("grads", "grads_dtype"),
                "optimizer": ("optimizer", None), "activations": ("activations", None)}
        for key, entry in entries.items():
            if key == "loss_scale":
                changes["loss_scale"] = self.word(entry.value, "loss scaling",
                                                  ["dynamic", "static", "none"])
                continue
            if key not in keys:
                self.error(f"unknown precision key '{key}'{did_you_mean(key, [*keys, 'loss_scale'])}",
                           Code.UNKNOWN_NAME, entry.key.span)
                continue
            field, dtype_field = keys[key]
            v = entry.value
            if isinstance(v, ast.NameValue):
                dtype = self.word(v, "dtype", list(DTYPE_BYTES))
                if dtype is None:
                    continue
                changes[field] = Fraction(DTYPE_BYTES[dtype])
                if dtype_field:
                    changes[dtype_field] = dtype
            else:
                number = self.number(v, f"{key} bytes per element")
                if number is None:
                    continue
                low = 0 if key == "optimizer" else 1
                if number < low or number > MAX_BYTES_PER_ELEMENT:
                    self.error(f"{key} = {_literal(v, number)} bytes per element is out of range "
                               f"({low} to {MAX_BYTES_PER_ELEMENT})", Code.BAD_VALUE, v.span)
                    continue
                changes[field] = number
                if dtype_field:
                    changes[dtype_field] = {4: "fp32", 2: "bf16", 1: "fp8"}.get(int(number), "fp32")
        if any(v is None for v in changes.values()):
            return base
        name = base.name if not changes else f"{base.name}*" if stmt.name else "custom"
        return base.with_overrides(name=name, **changes)

    # ---- mesh -----------------------------------------------------------------------------------

    MESH_PROPERTIES = ("world", "device_memory", "host_memory", "pcie_bandwidth")

    def mesh(self, stmt: ast.MeshStmt) -> Mesh | None:
        axes: list[Axis] = []
        properties: dict[str, ast.AxisEntry] = {}
        seen: dict[str, Span] = {}
        for entry in stmt.entries:
            name = entry.name.text
            if name in seen:
                self.error(f"duplicate mesh entry '{name}'", Code.DUPLICATE, entry.name.span,
                           f"first defined at {_at(seen[name])}")
                continue
            seen[name] = entry.name.span
            if isinstance(entry, ast.GroupEntry):
                continue
            if name in self.MESH_PROPERTIES:
                properties[name] = entry
                if entry.block is not None:
                    self.error(f"'{name}' takes no block", Code.BAD_VALUE, entry.block.span)
                continue
            if name in RESERVED_AXIS_NAMES:
                self.error(f"'{name}' is reserved and cannot name an axis", Code.BAD_VALUE,
                           entry.name.span)
                continue
            if isinstance(entry.value, ast.QuantityValue):
                hint = did_you_mean(name, self.MESH_PROPERTIES)
                if hint.startswith("; did you mean"):
                    self.error(f"unknown mesh property '{name}'{hint}", Code.UNKNOWN_NAME,
                               entry.name.span)
                else:
                    self.error(f"the size of axis '{name}' is a plain number, not "
                               f"'{entry.value.text}'", Code.BAD_VALUE, entry.value.span,
                               "mesh properties with units: " + ", ".join(self.MESH_PROPERTIES[1:]))
                continue
            size = self.integer(entry.value, f"size of axis '{name}'", 1, MAX_AXIS)
            if size is None:
                continue
            bandwidth, latency = self.link(entry.block)
            axes.append(Axis(name, size, entry.name.span, bandwidth, latency))
        if not axes and not self.diag.errors:
            self.error("the mesh has no axes, e.g. 'dp = 8'", Code.MISSING, stmt.span)
            return None
        mesh = Mesh(tuple(axes), stmt.span)
        groups: list[tuple[str, Group]] = []
        for entry in stmt.entries:
            if isinstance(entry, ast.GroupEntry):
                group = self.group(entry.group, mesh, allow_named=False)
                if group is not None:
                    groups.append((entry.name.text, group))
        mesh = Mesh(mesh.axes, stmt.span, tuple(groups))
        memory: dict[str, object] = {}
        for name, entry in properties.items():
            if name == "world":
                world = self.integer(entry.value, "world", 1, MAX_WORLD)
                if world is not None and world != mesh.world:
                    product = " x ".join(f"{a.name} {a.size}" for a in axes) or "no axes"
                    self.error(f"the mesh has {mesh.world:,} devices ({product}) but world = "
                               f"{world:,}", Code.WORLD_MISMATCH, entry.value.span)
            elif name == "pcie_bandwidth":
                memory[name] = self.quantity(entry.value, "PCIe bandwidth", BYTE_UNITS, True,
                                             Fraction(MAX_MEMORY))
            else:
                amount = self.quantity(entry.value, name.replace("_", " "), BYTE_UNITS, False,
                                       Fraction(MAX_MEMORY))
                memory[name] = None if amount is None else int(amount)
        if mesh.world > MAX_WORLD:
            self.error(f"the mesh has {mesh.world:,} devices, absurdly many", Code.BAD_VALUE,
                       stmt.span)
        return Mesh(mesh.axes, stmt.span, mesh.groups, memory.get("device_memory"),  # type: ignore[arg-type]
                    memory.get("host_memory"), memory.get("pcie_bandwidth"))  # type: ignore[arg-type]

    def link(self, block: ast.Block | None) -> tuple[Fraction | None, Fraction | None]:
        if block is None:
            return None, None
        bandwidth = latency = None
        entries = self.unique(block.entries, lambda e: e.key.text, lambda e: e.key.span, "link key")
        for key, entry in entries.items():
            if key == "bandwidth":
                bandwidth = self.quantity(entry.value, "bandwidth", BYTE_UNITS, True,
                                          Fraction(MAX_MEMORY))
            elif key == "latency":
                latency = self.quantity(entry.value, "latency", TIME_UNITS, False, Fraction(60))
            else:
                self.error(f"unknown link key '{key}'{did_you_mean(key, ['bandwidth', 'latency'])}",
                           Code.UNKNOWN_NAME, entry.key.span)
        return bandwidth, latency

    # ---- groups ---------------------------------------------------------------------------------

    def group(self, group: ast.Group, mesh: Mesh, allow_named: bool = True,
              extra: Sequence[str] = ()) -> Group | None:
        axes: list[str] = []
        ends: set[str] = set()
        ok = True
        names = mesh.names
        named = dict(mesh.groups) if allow_named else {}
        for term in group.terms:
            if isinstance(term, ast.AxisRef):
                refs = [term.name]
            elif isinstance(term, ast.AxisTuple):
                refs = list(term.names)
            else:
                if term.function.text != "ends":
                    self.error(f"unknown group function '{term.function.text}'; 'ends(pp)' is the "
                               "first and last stage of an axis", Code.UNKNOWN_NAME,
                               term.function.span)
                    ok = False
                    continue
                if term.axis.text not in names:
                    self.error(f"unknown axis '{term.axis.text}'{did_you_mean(term.axis.text, names)}",
                               Code.UNKNOWN_NAME, term.axis.span)
                    ok = False
                    continue
                axes.append(term.axis.text)
                ends.add(term.axis.text)
                continue
            for ref in refs:
                if ref.text == "world":
                    axes.extend(names)
                elif ref.text in named:
                    axes.extend(named[ref.text].axes)
                    ends.update(named[ref.text].ends)
                elif ref.text in names or ref.text in extra:
                    axes.append(ref.text)
                else:
                    candidates = [*names, *named, "world", *extra]
                    hint = did_you_mean(ref.text, candidates)
                    notes = () if "expected one of" in hint else (
                        "the mesh declares: " + ", ".join(names),)
                    self.error(f"unknown axis '{ref.text}'{hint}", Code.UNKNOWN_NAME, ref.span,
                               *notes)
                    ok = False
        counts = Counter(axes)
        duplicates = {a for a, k in counts.items() if k > 1}
        if duplicates:
            self.error(f"axis '{sorted(duplicates)[0]}' appears twice in this group",
                       Code.DUPLICATE, group.span)
            ok = False
        if not ok:
            return None
        order = {n: i for i, n in enumerate([*names, *extra])}
        return Group(tuple(sorted(axes, key=order.__getitem__)), frozenset(ends), group.span)

    # ---- placements -----------------------------------------------------------------------------

    def placements(self, statements: Sequence[ast.PlaceStmt], mesh: Mesh,
                   model: Model) -> tuple[AxisPlacement, ...]:
        by_axis: dict[str, AxisPlacement] = {}
        for stmt in statements:
            group = self.group(stmt.group, mesh)
            if group is None:
                continue
            if group.ends:
                self.error("a placement is over whole axes, not ends(...)", Code.BAD_VALUE,
                           stmt.group.span)
                continue
            for placement in self.placement(stmt, group, mesh):
                if placement.axis in by_axis:
                    first = by_axis[placement.axis].span
                    self.error(f"axis '{placement.axis}' is placed twice", Code.DUPLICATE,
                               stmt.span, f"first placed at {_at(first)}")
                else:
                    by_axis[placement.axis] = placement
        for axis in mesh.axes:
            if axis.name not in by_axis and not self.diag.errors:
                self.error(f"axis '{axis.name}' has no placement; add e.g. 'place ddp over "
                           f"{axis.name}'", Code.MISSING, axis.span)
        return tuple(by_axis[a.name] for a in mesh.axes if a.name in by_axis)

    def placement(self, stmt: ast.PlaceStmt, group: Group,
                  mesh: Mesh) -> list[AxisPlacement]:
        p = stmt.placement
        span = stmt.span
        if isinstance(p, ast.TuplePlacement):
            return self.tuple_placement(Role.DATA, "tuple", p.args, group, span)
        name = p.name.text
        args = p.args if isinstance(p, ast.CallPlacement) else ()
        if name in ROLE_NAMES and args and all(_is_mode_arg(a) for a in args[:4]):
            return self.tuple_placement(ROLE_NAMES[name], name, args, group, span)
        if name not in PRESETS:
            self.error(f"unknown placement preset '{name}'{did_you_mean(name, PRESETS)}",
                       Code.UNKNOWN_NAME, p.name.span,
                       "presets: " + ", ".join(sorted(PRESETS)) + "; or a tuple (Θ, Ω, G, A)")
            return []
        preset = PRESETS[name]
        options = self.options(name, args)
        if options is None:
            return []
        if name == "fsdp" and "strategy" in options:
            kind = options.pop("strategy")
            if kind == "hybrid":
                preset, name = PRESETS["hsdp"], "hsdp"
            elif kind == "no_shard":
                preset, name = PRESETS["ddp"], "fsdp(no_shard)"
            elif kind == "grad_op":
                options["reshard_after_forward"] = False
        if len(group.axes) != preset.axes:
            want = "two axes: 'over shard_axis * replicate_axis'" if preset.axes == 2 else "one axis"
            self.error(f"'{name}' is placed over {want}, got {group.label()}", Code.BAD_VALUE,
                       stmt.group.span)
            return []
        base = dict(axis=group.axes[0], role=preset.role, modes=preset.modes, preset=name,
                    span=span)
        if preset.axes == 2:
            return [AxisPlacement(**base, **options),  # type: ignore[arg-type]
                    AxisPlacement(group.axes[1], Role.DATA, (R, R, R, R), name, span)]
        if name == "sp":
            options["sequence_parallel"] = True
        if options.get("sequence_parallel"):
            base["modes"] = (S, S, S, S)
        if preset.role is Role.PIPELINE:
            default = {"gpipe": Schedule.GPIPE, "interleaved": Schedule.INTERLEAVED}.get(name)
            options.setdefault("schedule", default or Schedule.ONE_F_ONE_B)
            if options["schedule"] is Schedule.INTERLEAVED and "chunks" not in options:
                self.error("an interleaved pipeline needs 'chunks' (model chunks per stage)",
                           Code.MISSING, span)
            if "microbatches" not in options:
                self.error("a pipeline needs 'microbatches', e.g. 'pipeline(1f1b, microbatches = "
                           "8)'", Code.MISSING, span)
        return [AxisPlacement(**base, **options)]  # type: ignore[arg-type]

    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {
        "zero3": ("reshard_after_forward",),
        "fsdp": ("reshard_after_forward", "strategy"),
        "hsdp": ("reshard_after_forward",),
        "megatron": ("sequence_parallel",),
        "tp": ("sequence_parallel",),
        "pipeline": ("schedule", "microbatches", "chunks"),
        "gpipe": ("microbatches",),
        "interleaved": ("microbatches", "chunks"),
    }

    PRESET_ROLES: ClassVar[dict[str, str]] = {name: preset.role.value for name, preset in PRESETS.items()}

    def options(self, name: str, args: Sequence[ast.Arg]) -> dict[str, object] | None:
        allowed = self.OPTIONS.get(name, ())
        out: dict[str, object] = {}
        ok = True
        for arg in args:
            if isinstance(arg, ast.PositionalArg):
                word = _value_text(arg.value)
                if name == "fsdp" and word in FSDP_STRATEGIES:
                    out["strategy"] = FSDP_STRATEGIES[word]
                elif name == "pipeline" and word in {s.value for s in Schedule}:
                    out["schedule"] = Schedule(word)
                elif word in allowed and word in ("sequence_parallel",):
                    out[word] = True
                elif word in MODE_NAMES:
                    role = self.PRESET_ROLES.get(name, "data")
                    note = (f"to give the modes, write a tuple of four: {role}(S, S, S, R) or "
                            "(S, S, S, R)") if role != "pipeline" else (
                            "a pipeline is written 'pipeline(1f1b, microbatches = m)'")
                    self.error(f"'{name}' takes options, not modes", Code.BAD_VALUE, arg.span, note)
                    return None
                else:
                    choices = [*allowed]
                    if name == "fsdp":
                        choices.extend(FSDP_STRATEGIES)
                    if name == "pipeline":
                        choices.extend(s.value for s in Schedule)
                    hint = did_you_mean(word, choices)
                    self.error(f"'{name}' takes no option '{word}'{hint}", Code.UNKNOWN_NAME,
                               arg.span)
                    ok = False
                continue
            key = arg.key.text
            if key not in allowed:
                self.error(f"'{name}' takes no option '{key}'{did_you_mean(key, allowed)}",
                           Code.UNKNOWN_NAME, arg.key.span)
                ok = False
            elif key in ("reshard_after_forward", "sequence_parallel"):
                out[key] = self.boolean(arg.value, key)
            elif key == "strategy":
                out[key] = FSDP_STRATEGIES.get(self.word(arg.value, "FSDP sharding strategy",
                                                         list(FSDP_STRATEGIES)) or "")
            elif key == "schedule":
                schedule = self.word(arg.value, "pipeline schedule", [s.value for s in Schedule])
                out[key] = Schedule(schedule) if schedule else None
            elif key in ("microbatches", "chunks"):
                out[key] = self.integer(arg.value, key, 1, MAX_MICROBATCHES)
        if not ok or any(v is None for v in out.values()):
            return None
        return out

    def tuple_placement(self, role: Role, preset: str, args: Sequence[ast.Arg], group: Group,
                        span: Span) -> list[AxisPlacement]:
        modes: list[Mode] = []
        options: dict[str, object] = {}
        for index, arg in enumerate(args):
            if index < 4:
                mode = self.mode(arg, STATES[index])
                if mode is not None:
                    modes.append(mode)
                continue
            if isinstance(arg, ast.KeywordArg) and arg.key.text == "sequence_parallel":
                options["sequence_parallel"] = self.boolean(arg.value, "sequence_parallel")
            else:
                self.error("a placement tuple has four modes: (Θ params, Ω optimizer, G gradients, "
                           "A activations)", Code.BAD_VALUE, arg.span)
                return []
        if len(args) < 4:
            self.error(f"a placement tuple has four modes (Θ, Ω, G, A), got {len(args)}",
                       Code.BAD_VALUE, span)
            return []
        if len(modes) != 4:
            return []
        if len(group.axes) != 1:
            self.error(f"a tuple is placed over one axis, got {group.label()}", Code.BAD_VALUE,
                       group.span)
            return []
        if role is Role.PIPELINE:
            self.error("write a pipeline as 'pipeline(1f1b, microbatches = m)', not a tuple",
                       Code.BAD_VALUE, span)
            return []
        if role is Role.TENSOR:
            options.setdefault("sequence_parallel", modes[3] is S)
        return [AxisPlacement(group.axes[0], role, (modes[0], modes[1], modes[2], modes[3]),
                              preset, span, **options)]  # type: ignore[arg-type]

    def mode(self, arg: ast.Arg, state: State) -> Mode | None:
        value = arg.value if isinstance(arg, ast.PositionalArg) else None
        if value is None or not isinstance(value, ast.NameValue | ast.StarredValue):
            self.error(f"expected a mode for {state.symbol} ({state.value}): R, S, S*, M or O",
                       Code.BAD_VALUE, arg.span)
            return None
        text = value.name.text + ("*" if isinstance(value, ast.StarredValue) else "")
        if text not in MODE_NAMES:
            hint = did_you_mean(text, MODE_NAMES)
            hint = hint if hint.startswith("; did you mean") else ""  # the note lists the modes
            self.error(f"unknown mode '{text}' for {state.symbol} ({state.value}){hint}",
                       Code.UNKNOWN_NAME, value.span,
                       "modes: R replicated, S sharded, S* sharded-with-gather, M materialized, "
                       "O offloaded")
            return None
        mode = MODE_NAMES[text]
        if mode is Mode.M and state is not State.ACTIVATIONS:
            self.error(f"mode M (materialized, recomputed) applies to activations, not to "
                       f"{state.symbol} ({state.value})", Code.BAD_VALUE, value.span)
            return None
        if mode is Mode.S_STAR and state is not State.PARAMS:
            self.error(f"mode S* (gathered before each use) applies to parameters, not to "
                       f"{state.symbol} ({state.value}); use S", Code.BAD_VALUE, value.span)
            return None
        return mode

    # ---- offload, recompute, loss, microbatches, clip --------------------------------------------

    def apply_offload(self, statements: Sequence[ast.OffloadStmt],
                      placements: tuple[AxisPlacement, ...]) -> tuple[AxisPlacement, ...]:
        seen: set[State] = set()
        for stmt in statements:
            if stmt.device is not None and stmt.device.text not in ("cpu", "host", "nvme"):
                self.error(f"unknown offload target '{stmt.device.text}'"
                           f"{did_you_mean(stmt.device.text, ['cpu', 'host', 'nvme'])}",
                           Code.UNKNOWN_NAME, stmt.device.span)
            for name in stmt.states:
                state = STATE_NAMES.get(name.text)
                if state is None:
                    self.error(f"unknown state '{name.text}'"
                               f"{did_you_mean(name.text, ['params', 'optimizer', 'grads', 'activations'])}",
                               Code.UNKNOWN_NAME, name.span)
                    continue
                if state in seen:
                    self.error(f"'{name.text}' is offloaded twice", Code.DUPLICATE, name.span)
                    continue
                seen.add(state)
                placements = self.offload_state(state, name.span, placements)
        return placements

    def offload_state(self, state: State, span: Span,
                      placements: tuple[AxisPlacement, ...]) -> tuple[AxisPlacement, ...]:
        index = STATES.index(state)
        data = [p for p in placements if p.role is Role.DATA]
        if state is State.ACTIVATIONS:
            targets = {p.axis for p in placements if p.role in BATCH_ROLES}
        else:
            targets = {p.axis for p in data if p.modes[index].sharded}
            if not targets and data:
                self.error(f"offloading {state.value} needs them sharded over a data-parallel axis "
                           f"(ZeRO-Offload partitions them); place zero1/zero2/zero3 over "
                           f"{data[0].axis}", Code.CONFLICT, span)
                return placements
            if not data:
                self.error(f"offloading {state.value} needs a data-parallel axis to partition "
                           "them over", Code.CONFLICT, span)
                return placements
        return tuple(
            replace(p, modes=tuple(O if i == index else m for i, m in enumerate(p.modes)))  # type: ignore[arg-type]
            if p.axis in targets else p for p in placements)

    def recompute(self, stmt: ast.RecomputeStmt | None, model: Model) -> Recompute:
        if stmt is None:
            return Recompute(RecomputeKind.NONE, True, None)
        name = stmt.call.name.text
        kinds = [k.value for k in RecomputeKind]
        if name not in kinds:
            self.error(f"unknown recomputation '{name}'{did_you_mean(name, kinds)}",
                       Code.UNKNOWN_NAME, stmt.call.name.span)
            return Recompute(RecomputeKind.NONE, True, stmt.span)
        restore = True
        for arg in stmt.call.args:
            if isinstance(arg, ast.KeywordArg) and arg.key.text == "restore_rng":
                restore = bool(self.boolean(arg.value, "restore_rng"))
            else:
                self.error("recompute takes one option, 'restore_rng = true|false'",
                           Code.UNKNOWN_NAME, arg.span)
        if model.arch is None and name != "none":
            self.error("recomputation changes activation memory, which needs the architecture; "
                       "this model is a bare parameter count", Code.CONFLICT, stmt.span)
        return Recompute(RecomputeKind(name), restore, stmt.span)

    def loss(self, stmt: ast.LossStmt | None) -> Loss:
        if stmt is None:
            return Loss(LossKind.TOKEN_MEAN, None)
        name = stmt.call.name.text
        kinds = [k.value for k in LossKind]
        if name not in kinds:
            self.error(f"unknown loss normalisation '{name}'{did_you_mean(name, kinds)}",
                       Code.UNKNOWN_NAME, stmt.call.name.span,
                       "token_mean: mean over all tokens of the global batch; sample_mean; "
                       "microbatch_mean; sum")
            return Loss(LossKind.TOKEN_MEAN, stmt.span)
        uneven = False
        for arg in stmt.call.args:
            if (name == "sample_mean" and isinstance(arg, ast.PositionalArg)
                    and _value_text(arg.value) == "uneven"):
                uneven = True
            else:
                self.error(f"'{name}' takes no option here" + ("; sample_mean(uneven) says "
                           "micro-batches hold different sample counts" if name == "sample_mean"
                           else ""), Code.UNKNOWN_NAME, arg.span)
        return Loss(LossKind(name), stmt.span, uneven)

    def microbatches(self, stmt: ast.MicrobatchesStmt | None,
                     placements: tuple[AxisPlacement, ...]) -> int:
        declared = self.integer(stmt.value, "microbatches", 1, MAX_MICROBATCHES) if stmt else None
        for p in placements:
            if p.microbatches is None:
                continue
            if declared is not None and declared != p.microbatches and stmt is not None:
                self.error(f"microbatches = {declared} disagrees with the pipeline's "
                           f"microbatches = {p.microbatches}", Code.CONFLICT, stmt.span,
                           f"the pipeline is placed at line {p.span.line}")
            declared = p.microbatches
        return declared or 1

    def clip(self, stmt: ast.ClipStmt | None) -> ClipConfig | None:
        if stmt is None:
            return None
        max_norm: Fraction | None = None
        for entry in stmt.entries:
            if entry.key.text != "max_norm":
                self.error(f"unknown clip key '{entry.key.text}'"
                           f"{did_you_mean(entry.key.text, ['max_norm'])}", Code.UNKNOWN_NAME,
                           entry.key.span)
                continue
            max_norm = self.number(entry.value, "max_norm")
            if max_norm is not None and max_norm <= 0:
                self.error("max_norm must be positive", Code.BAD_VALUE, entry.value.span)
                max_norm = None
        return ClipConfig(max_norm, stmt.span) if max_norm is not None else None

    # ---- shapes: what each axis shards must divide evenly -----------------------------------------

    def check_shapes(self, model: Model, mesh: Mesh, placements: tuple[AxisPlacement, ...],
                     microbatches: int, model_span: Span) -> None:
        """Every dimension a role shards must split evenly over the product of its axes.

        The rules are the ones Megatron-LM asserts (each check cites where). A dimension split
        over several axes (two tensor axes; the sequence under sequence parallelism inside context
        parallelism) must divide by their product, not only by each. An error points at the
        placement of the last axis of the product, so errors come in file order.
        """
        arch = model.arch
        if arch is None:
            for p in placements:
                if p.role in (Role.TENSOR, Role.CONTEXT, Role.EXPERT, Role.PIPELINE):
                    self.error(f"{p.role.value} parallelism over {p.axis} needs the architecture "
                               "(layers, hidden, heads, seq); this model is a bare parameter "
                               "count", Code.CONFLICT, p.span)
            return
        by_role: dict[Role, list[AxisPlacement]] = {}
        for p in placements:
            by_role.setdefault(p.role, []).append(p)
        sequence_parallel = [p for p in by_role.get(Role.TENSOR, []) if p.sequence_parallel]
        context = _factors(mesh, by_role.get(Role.CONTEXT, []))
        for p in placements:
            if p.role is Role.EXPERT and not arch.moe:
                self.error(f"expert parallelism over {p.axis} needs a mixture-of-experts model "
                           "(experts, top_k)", Code.CONFLICT, p.span)
            if p is by_role[p.role][-1]:
                self.check_role_shapes(arch, mesh, by_role[p.role], microbatches)
            if sequence_parallel and p is sequence_parallel[-1]:
                self.check_sequence_parallel(arch, p, _factors(mesh, sequence_parallel), context)

    def need(self, what: str, value: int, by: Sequence[tuple[str, int]], at: Span,
             *notes: str) -> None:
        """``value`` must be divisible by the product of the named factors ``by``; say so if not."""
        divisor = math.prod(size for _, size in by)
        if value % divisor == 0:
            return
        if len(by) == 1:
            shown = f"{by[0][0]} ({divisor:,})"
        else:
            shown = (" x ".join(name for name, _ in by) + " ("
                     + " x ".join(f"{size:,}" for _, size in by) + f" = {divisor:,})")
        self.error(f"{shown} does not divide {what} ({value:,})", Code.NOT_DIVISIBLE, at, *notes)

    def check_role_shapes(self, arch: Transformer, mesh: Mesh, role_placements: list[AxisPlacement],
                          microbatches: int) -> None:
        """The dimensions one role splits, over the product of all of its axes."""
        p = role_placements[-1]
        by = _factors(mesh, role_placements)
        n = math.prod(size for _, size in by)
        label = " x ".join(name for name, _ in by)
        if p.role is Role.TENSOR:
            # megatron/core/transformer/transformer_config.py (__post_init__):
            # num_attention_heads % tensor_model_parallel_size == 0
            self.need("heads", arch.heads, by, p.span)
            if arch.kv_heads != arch.heads and arch.kv_heads % n:
                # ibid.: num_query_groups must be a multiple or a divisor of the TP size. For a
                # divisor, attention.py all-gathers the fused QKV output over tp and each rank
                # slices out one key/value head: a collective, and K and V per rank, that the cost
                # model (K, V split over tp) does not describe.
                why = ("Megatron-LM shards whole key/value head groups over tp; with "
                       f"{label} a multiple of kv_heads it instead all-gathers the fused QKV "
                       "output over tp and each rank slices out its head, which placeverify does "
                       "not model" if n % arch.kv_heads == 0 else
                       "Megatron-LM shards whole key/value head groups over tp, and rejects "
                       "kv_heads that is neither a multiple nor a divisor of the tensor-parallel "
                       "size")
                self.need("kv_heads", arch.kv_heads, by, p.span, why)
            # megatron/core/tensor_parallel/layers.py: Column/RowParallelLinear divide() the
            # split dimension by the TP size
            self.need("ffn", arch.expert_ffn or arch.ffn, by, p.span)
            padded = arch.padded_vocab(n)
            self.need("the vocabulary" + (f" padded to {padded:,}" if padded != arch.vocab else ""),
                      padded, by, p.span,
                      "set vocab_divisible_by (Megatron pads to a multiple of 128 * tp)")
        elif p.role is Role.PIPELINE:
            # megatron/training/arguments.py (validate_args): num_layers % pp == 0, and with
            # --num-layers-per-virtual-pipeline-stage (num_layers / pp) % layers_per_chunk == 0:
            # together, layers % (pp * chunks) == 0
            chunks = math.prod(q.chunks for q in role_placements)
            if chunks > 1:
                self.need("layers", arch.layers, [*by, ("chunks", chunks)], p.span,
                          f"{n} stages of {chunks} chunks each hold the same number of layers")
            else:
                self.need("layers", arch.layers, by, p.span,
                          "each pipeline stage holds the same number of layers")
            if any(q.schedule is Schedule.INTERLEAVED for q in role_placements):
                self.check_interleaved(p, label, n, microbatches)
        elif p.role is Role.CONTEXT and n > 1:
            # megatron/training/arguments.py (validate_args): with context_parallel_size > 1,
            # seq_length % (2 * context_parallel_size) == 0 (causal load balancing: 2 x cp
            # chunks, two per rank)
            self.need("seq", arch.seq, [("2", 2), *by], p.span,
                      "context parallelism splits the sequence into 2 x cp load-balanced chunks")
        elif p.role is Role.EXPERT and arch.moe:
            # megatron/core/transformer/moe/moe_layer.py: num_moe_experts % ep_size == 0
            self.need("experts", arch.experts, by, p.span)

    def check_interleaved(self, p: AxisPlacement, label: str, n: int, microbatches: int) -> None:
        # megatron/training/arguments.py: a virtual pipeline needs pipeline-model-parallel size
        # > 1 (> 2 without --overlap-p2p-comm); schedules.py runs micro-batches in groups of
        # microbatch_group_size_per_vp_stage (default pp) and raises when the last group is
        # smaller than pp: microbatches % pp == 0
        if n < 2:
            self.error(f"the interleaved schedule needs at least 2 pipeline stages, but {label} = "
                       f"{n}", Code.BAD_VALUE, p.span,
                       "Megatron-LM asserts pipeline-model-parallel size > 1 for a virtual "
                       "pipeline (> 2 without --overlap-p2p-comm)")
        elif microbatches % n:
            self.error(f"the interleaved schedule needs microbatches ({microbatches:,}) "
                       f"divisible by {label} ({n:,})", Code.NOT_DIVISIBLE, p.span,
                       "Megatron-LM runs micro-batches in groups of pp on each model chunk and "
                       "rejects a last group smaller than pp")

    def check_sequence_parallel(self, arch: Transformer, p: AxisPlacement,
                                sp: list[tuple[str, int]], cp: list[tuple[str, int]]) -> None:
        sp_label = " x ".join(name for name, _ in sp)
        if math.prod(size for _, size in cp) > 1:
            # Each context-parallel rank holds seq / cp tokens (two chunks of seq / (2 cp));
            # sequence parallelism scatters them along the first dimension over tp, and
            # megatron/core/tensor_parallel/mappings.py (_split_along_first_dim) asserts that
            # the split is even: (seq / cp) % tp == 0. (megatron/core/models/multimodal/
            # context_parallel.py pads to tp * cp * 2 under CP + SP for the same reason.)
            cp_label = " x ".join(name for name, _ in cp)
            self.need("seq", arch.seq, [*sp, *cp], p.span,
                      f"sequence parallelism splits the seq / {cp_label} tokens of each "
                      f"context-parallel rank again over {sp_label}")
        else:
            # mappings.py (_split_along_first_dim): seq % tp == 0
            self.need("seq", arch.seq, sp, p.span,
                      f"sequence parallelism splits the sequence over {sp_label}")

    # ---- the step -------------------------------------------------------------------------------

    def step(self, stmt: ast.StepStmt, strategy: Strategy) -> Step:
        return _StepLowerer(self, strategy).run(stmt)


def _factors(mesh: Mesh, placements: Sequence[AxisPlacement]) -> list[tuple[str, int]]:
    """The axes of ``placements`` with their sizes, for a divisibility message."""
    return [(p.axis, mesh.size(p.axis)) for p in placements]


def _entry_span(entries: dict[str, ast.Entry], key: str, default: Span) -> Span:
    return entries[key].span if key in entries else default


def _is_mode_arg(arg: ast.Arg) -> bool:
    return isinstance(arg, ast.PositionalArg) and isinstance(arg.value, ast.NameValue | ast.StarredValue)


def _value_text(value: ast.Value) -> str:
    if isinstance(value, ast.NameValue):
        return value.name.text
    if isinstance(value, ast.StarredValue):
        return value.name.text + "*"
    if isinstance(value, ast.StringValue):
        return value.value
    if isinstance(value, ast.QuantityValue):
        return value.text
    return value.text


def _at(span: Span) -> str:
    return f"line {span.line}, column {span.column}"


def _literal(value: ast.Value, number: Fraction) -> str:
    """A number as the user wrote it (1e-9 stays 1e-9, not 0)."""
    return value.text if isinstance(value, ast.NumberValue) else _show(number)


def _count(n: int) -> str:
    """A whole number with thousands separators, or in scientific form past 10**16."""
    if abs(n) < 10**16:
        return f"{n:,}"
    digits = str(abs(n))  # not float(n): that overflows past 1e308
    mantissa = (digits[0] + "." + digits[1:4]).rstrip("0").rstrip(".")
    return f"{'-' if n < 0 else ''}{mantissa}e{len(digits) - 1}"


def _show(number: Fraction) -> str:
    return str(number.numerator) if number.denominator == 1 else f"{float(number):g}"


# ---- step lowering ---------------------------------------------------------------------------

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send", "recv",
       "update", "free", "clip")
TARGETS = {k.value: k for k in TargetKind}
# what each collective may act on in a step (every pair is modelled by semantics.buffers)
COLLECTIVE_TARGETS: dict[CollectiveKind, list[TargetKind]] = {
    CollectiveKind.ALL_REDUCE: [TargetKind.GRADS, TargetKind.TOKENS, TargetKind.OVERFLOW],
    CollectiveKind.REDUCE_SCATTER: [TargetKind.GRADS],
    CollectiveKind.ALL_GATHER: [TargetKind.PARAMS, TargetKind.GRADS],
    CollectiveKind.BROADCAST: [TargetKind.PARAMS],
    CollectiveKind.ALL_TO_ALL: [TargetKind.TOKENS],
    CollectiveKind.SEND: [TargetKind.ACTIVATIONS],
    CollectiveKind.RECV: [TargetKind.ACTIVATIONS],
}
GROUP_NAMES = {g.value: g for g in ParamGroup}


class _StepLowerer:
    """Lowers ``step { ... }`` into pre / loop / post ops of :class:`Step`."""

    def __init__(self, outer: _Lowerer, strategy: Strategy) -> None:
        self.outer = outer
        self.strategy = strategy
        self.mesh = strategy.mesh
        self.microbatches: int = strategy.microbatches
        self.microbatches_span: Span | None = None

    def error(self, message: str, code: Code, span: Span | None, *notes: str) -> None:
        self.outer.error(message, code, span, *notes)

    def run(self, stmt: ast.StepStmt) -> Step:
        pre: list[Op] = []
        loop: list[LoopOp] = []
        post: list[Op] = []
        seeds: list[Seed] = []
        backward_seen = False
        deferred_on: list[ast.OnMicrobatch] = []
        for item in stmt.items:
            if isinstance(item, ast.MicrobatchesStmt):
                self.set_microbatches(item)
            elif isinstance(item, ast.BackwardStmt):
                if backward_seen:
                    self.error("a step has one 'backward'", Code.DUPLICATE, item.span)
                backward_seen = True
                loss = self.loss_expr(item.expr)
                if loss is not None:
                    loop.append(LoopOp(Backward(loss, item.span)))
            elif isinstance(item, ast.EachMicrobatch):
                for inner in item.items:
                    if isinstance(inner, ast.BackwardStmt):
                        if backward_seen:
                            self.error("a step has one 'backward'", Code.DUPLICATE, inner.span)
                        backward_seen = True
                        loss = self.loss_expr(inner.expr)
                        if loss is not None:
                            loop.append(LoopOp(Backward(loss, inner.span)))
                    else:
                        op = self.inner_op(inner)
                        if op is not None:
                            loop.append(LoopOp(op))
            elif isinstance(item, ast.OnMicrobatch):
                deferred_on.append(item)
                loop.append(LoopOp(Update(item.span), -1))  # placeholder keeps textual order
            elif isinstance(item, ast.SeedStmt):
                seed = self.seed(item)
                if seed is not None:
                    self.check_seed_conflict(seed, seeds)
                    seeds.append(seed)
            else:
                op = self.op(item)
                if op is None:
                    continue
                if backward_seen:
                    self.check_post_scale(op)
                    post.append(op)
                else:
                    if not (isinstance(op, Collective) and op.target.kind is TargetKind.TOKENS):
                        self.error("this runs before 'backward'; only token counts are reduced "
                                   "before the micro-batch loop", Code.BAD_VALUE, item.span)
                    pre.append(op)
        if not backward_seen:
            self.error("the step has no 'backward' (the loss each micro-batch back-propagates, "
                       "e.g. 'backward sum / tokens(dp, step)')", Code.MISSING, stmt.span)
        # resolve 'on microbatch' blocks now that the micro-batch count is known
        resolved: list[LoopOp] = []
        pending = iter(deferred_on)
        for lo in loop:
            if lo.microbatch == -1:
                block = next(pending)
                index = self.which(block.which)
                for inner in block.items:
                    if isinstance(inner, ast.BackwardStmt):
                        self.error("'backward' belongs in the step or in 'each microbatch'",
                                   Code.BAD_VALUE, inner.span)
                        continue
                    op = self.inner_op(inner)
                    if op is not None and index is not None:
                        resolved.append(LoopOp(op, index))
            else:
                resolved.append(lo)
        updates = [op for op in post if isinstance(op, Update)]
        if backward_seen and not updates:
            self.error("the step never runs 'update params' (the optimizer step)", Code.MISSING,
                       stmt.span)
        for extra in updates[1:]:
            self.error("a step updates the parameters once", Code.DUPLICATE, extra.span)
        return Step(self.microbatches, tuple(pre), tuple(resolved), tuple(post), tuple(seeds),
                    False, stmt.span)

    def check_seed_conflict(self, seed: Seed, earlier: list[Seed]) -> None:
        """Two statements may not set opposite policies for one dropout region of one axis."""
        for other in earlier:
            if other.same == seed.same:
                continue
            for axis in seed.group.axes:
                if axis not in other.group.axes:
                    continue
                region = region_named(self.strategy, axis, seed.region)
                if region_named(self.strategy, axis, other.region) is region:
                    self.error(f"this seed policy contradicts line {other.span.line}: the "
                               f"{region.value} dropout region along {axis} is both "
                               f"{'same' if seed.same else 'differ'} and "
                               f"{'same' if other.same else 'differ'}", Code.CONFLICT, seed.span,
                               *(["on this axis either region word names its one region"]
                                 if seed.region is not other.region else []))
                    return

    def check_post_scale(self, op: Op) -> None:
        """After the loop there is no current micro-batch to count the tokens of."""
        if not isinstance(op, Scale):
            return
        for term, _ in op.factor.factors:
            if term.count is not None and term.count.scope is Scope.MICROBATCH:
                self.error(f"'{term.count.label()}' counts one micro-batch, but this scale runs "
                           f"after the micro-batch loop; write {term.count.kind.value}(..., step)",
                           Code.BAD_VALUE, op.span)

    def set_microbatches(self, item: ast.MicrobatchesStmt) -> None:
        n = self.outer.integer(item.value, "microbatches", 1, MAX_MICROBATCHES)
        if n is None:
            return
        if self.microbatches_span is not None:
            self.error("duplicate 'microbatches'", Code.DUPLICATE, item.span)
        pipeline = self.strategy.pipeline
        if pipeline is not None and pipeline.microbatches != n:
            self.error(f"microbatches = {n} disagrees with the pipeline's microbatches = "
                       f"{pipeline.microbatches}", Code.CONFLICT, item.span,
                       f"the pipeline is placed at line {pipeline.span.line}")
        elif self.strategy.microbatches not in (1, n) and pipeline is None:
            self.error(f"microbatches = {n} disagrees with microbatches = "
                       f"{self.strategy.microbatches} declared outside the step", Code.CONFLICT,
                       item.span)
        self.microbatches = n
        self.microbatches_span = item.span

    def which(self, value: ast.Value) -> int | None:
        if isinstance(value, ast.NameValue) and value.name.text in ("first", "last"):
            return 0 if value.name.text == "first" else self.microbatches - 1
        index = self.outer.integer(value, "micro-batch index", 0, MAX_MICROBATCHES)
        if index is not None and index >= self.microbatches:
            self.error(f"micro-batch {index} does not exist: the step has {self.microbatches} "
                       "(numbered from 0)", Code.BAD_VALUE, value.span)
            return None
        return index

    def inner_op(self, item: ast.StepItem) -> Op | None:
        if isinstance(item, ast.OpStmt):
            op = self.op(item)
            if isinstance(op, Update):
                self.error("'update' runs once per step, after the micro-batch loop",
                           Code.BAD_VALUE, item.span)
                return None
            return op
        if isinstance(item, ast.ScaleStmt):
            return self.op(item)
        self.error("only collectives, 'scale' and 'free' run per micro-batch", Code.BAD_VALUE,
                   item.span)
        return None

    # ---- expressions -------------------------------------------------------------------------

    def loss_expr(self, expr: ast.Expr) -> Monomial | None:
        monomial = self.monomial(expr, allow_loss=True)
        if monomial is None:
            return None
        if monomial.exponent(TermKind.LOSS_SUM) != 1:
            self.error("the loss must contain 'sum' or 'mean' exactly once, multiplied (not "
                       "divided)", Code.BAD_VALUE, expr.span)
            return None
        return monomial

    def monomial(self, expr: ast.Expr, allow_loss: bool) -> Monomial | None:
        factors: list[tuple[Term, int]] = []
        ok = True

        def walk(e: ast.Expr, sign: int) -> None:
            nonlocal ok
            for op, factor in (("*", e.first), *e.rest):
                exponent = sign if op == "*" else -sign
                if isinstance(factor, ast.ParenFactor):
                    walk(factor.expr, exponent)
                    continue
                terms = self.factor(factor, allow_loss)
                if terms is None:
                    ok = False
                    continue
                factors.extend((t, e_ * exponent) for t, e_ in terms)

        walk(expr, 1)
        if not ok:
            return None
        return Monomial(tuple(factors), _expr_text(self.outer.source, expr), expr.span)

    def factor(self, factor: ast.Factor, allow_loss: bool) -> list[tuple[Term, int]] | None:
        loss_kind = self.strategy.loss.kind
        unit = CountKind.SAMPLES if loss_kind.value == "sample_mean" else CountKind.TOKENS
        if isinstance(factor, ast.NumberFactor):
            if factor.value.value <= 0:
                self.error("a scale factor must be positive", Code.BAD_VALUE, factor.span)
                return None
            return [(Term(TermKind.NUMBER, factor.value.value), 1)]
        if isinstance(factor, ast.SizeFactor):
            group = self.outer.group(factor.group, self.mesh)
            return None if group is None else [(Term(TermKind.SIZE, group=group), 1)]
        if isinstance(factor, ast.NameFactor):
            name = factor.name.text
            if name in ("sum", "mean"):
                if not allow_loss:
                    self.error(f"'{name}' is the loss; a gradient scale cannot contain it",
                               Code.BAD_VALUE, factor.span)
                    return None
                terms = [(Term(TermKind.LOSS_SUM), 1)]
                if name == "mean":
                    terms.append((Term(TermKind.COUNT, count=Count(unit, (), Scope.MICROBATCH)), -1))
                return terms
            if name == "microbatches":
                return [(Term(TermKind.MICROBATCHES), 1)]
            if name == "loss_scale":
                return [(Term(TermKind.LOSS_SCALE), 1)]
            if name in ("tokens", "samples"):
                return [(Term(TermKind.COUNT, count=Count(CountKind(name), (), Scope.MICROBATCH)), 1)]
            names = ["sum", "mean", "tokens", "samples", "microbatches", "loss_scale"]
            self.error(f"unknown name '{name}' in an expression{did_you_mean(name, names)}",
                       Code.UNKNOWN_NAME, factor.span,
                       "write axis sizes as |dp| and counts as tokens(dp, step)")
            return None
        if isinstance(factor, ast.CountFactor):
            name = factor.name.text
            if name not in ("tokens", "samples"):
                self.error(f"unknown count '{name}'{did_you_mean(name, ['tokens', 'samples'])}",
                           Code.UNKNOWN_NAME, factor.name.span)
                return None
            axes: list[str] = []
            scope = Scope.MICROBATCH
            for g in factor.groups:
                if len(g.terms) == 1 and isinstance(g.terms[0], ast.AxisRef) and \
                        g.terms[0].name.text in ("step", "microbatch"):
                    scope = Scope(g.terms[0].name.text)
                    continue
                group = self.outer.group(g, self.mesh)
                if group is None:
                    return None
                if group.ends:
                    self.error("counts are summed over whole axes", Code.BAD_VALUE, g.span)
                    return None
                axes.extend(group.axes)
            order = {n: i for i, n in enumerate(self.mesh.names)}
            count = Count(CountKind(name), tuple(sorted(set(axes), key=order.__getitem__)), scope)
            return [(Term(TermKind.COUNT, count=count), 1)]
        raise AssertionError(factor)

    # ---- statements ----------------------------------------------------------------------------

    def target(self, target: ast.Target, allowed: Sequence[TargetKind]) -> Target | None:
        name = target.name.text
        kind = TARGETS.get(name) or {"gradients": TargetKind.GRADS,
                                     "parameters": TargetKind.PARAMS}.get(name)
        if kind is None or kind not in allowed:
            self.error(f"unknown target '{name}'{did_you_mean(name, [k.value for k in allowed])}",
                       Code.UNKNOWN_NAME, target.name.span)
            return None
        if not target.selectors:
            return Target(kind, None, target.span)
        if kind not in (TargetKind.GRADS, TargetKind.PARAMS, TargetKind.OPTIMIZER):
            self.error(f"'{name}' has no parameter groups to select", Code.BAD_VALUE, target.span)
            return None
        present = self.strategy.model.groups_present()
        groups: set[ParamGroup] = set()
        for sel in target.selectors:
            group = GROUP_NAMES.get(sel.text)
            if group is None:
                self.error(f"unknown parameter group '{sel.text}'"
                           f"{did_you_mean(sel.text, GROUP_NAMES)}", Code.UNKNOWN_NAME, sel.span)
                return None
            if group not in present:
                self.error(f"this model has no '{sel.text}' parameters (it has "
                           f"{', '.join(g.value for g in present)})", Code.BAD_VALUE, sel.span)
                return None
            groups.add(group)
        return Target(kind, frozenset(groups), target.span)

    def op(self, item: ast.StepItem) -> Op | None:
        if isinstance(item, ast.ScaleStmt):
            target = self.target(item.target, [TargetKind.GRADS])
            factor = self.monomial(item.expr, allow_loss=False)
            if target is None or factor is None:
                return None
            return Scale(target, factor, item.span)
        if not isinstance(item, ast.OpStmt):
            self.error("not allowed here", Code.BAD_VALUE, item.span)
            return None
        name = item.name.text
        if name not in OPS:
            self.error(f"unknown step operation '{name}'{did_you_mean(name, OPS)}",
                       Code.UNKNOWN_NAME, item.name.span)
            return None
        group = None
        if item.group is not None:
            group = self.outer.group(item.group, self.mesh)
            if group is None:
                return None
        if name in ("update", "free"):
            if item.args:
                self.error(f"'{name}' takes no options", Code.BAD_VALUE, item.args[0].span)
            if item.group is not None:
                self.error(f"'{name}' runs on each device; it has no 'over' group", Code.BAD_VALUE,
                           item.group.span)
            if name == "update":
                target = self.target(item.target, [TargetKind.PARAMS])
                return None if target is None else Update(item.span)
            target = self.target(item.target, [TargetKind.GRADS])
            return None if target is None else Free(target, item.span)
        if name == "clip":
            return self.clip_op(item, group)
        if group is None:
            self.error(f"'{name}' needs a group: '{name} ... over dp'", Code.MISSING, item.span)
            return None
        return self.collective(item, CollectiveKind(name), group)

    def options(self, item: ast.OpStmt, allowed: dict[str, Sequence[str]],
                positional: Sequence[str]) -> dict[str, str] | None:
        out: dict[str, str] = {}
        for arg in item.args:
            if isinstance(arg, ast.PositionalArg):
                word = _value_text(arg.value)
                if word in positional:
                    key = "op" if word in ("sum", "mean", "max") else word
                    out[key] = word
                else:
                    self.error(f"'{item.name.text}' takes no option '{word}'"
                               f"{did_you_mean(word, positional)}", Code.UNKNOWN_NAME, arg.span)
                    return None
                continue
            key = arg.key.text
            if key not in allowed:
                self.error(f"'{item.name.text}' takes no option '{key}'"
                           f"{did_you_mean(key, allowed)}", Code.UNKNOWN_NAME, arg.key.span)
                return None
            word = _value_text(arg.value)
            if allowed[key] and word not in allowed[key]:
                self.error(f"'{word}' is not a value of {key}{did_you_mean(word, allowed[key])}",
                           Code.UNKNOWN_NAME, arg.value.span)
                return None
            out[key] = word
        return out

    def collective(self, item: ast.OpStmt, kind: CollectiveKind, group: Group) -> Op | None:
        reducing = kind in (CollectiveKind.ALL_REDUCE, CollectiveKind.REDUCE_SCATTER)
        positional = ["sum", "mean", "max"] if reducing else []
        if kind is CollectiveKind.REDUCE_SCATTER:
            positional.append("accumulate")
        allowed: dict[str, Sequence[str]] = {"order": ["fixed", "rank_dependent"]}
        if reducing:
            allowed["op"] = ["sum", "mean", "max"]
        if kind is CollectiveKind.BROADCAST:
            allowed["from"] = []
        options = self.options(item, allowed, positional)
        if options is None:
            return None
        target = self.target(item.target, COLLECTIVE_TARGETS[kind])
        if target is None:
            return None
        op = ReduceOp(options["op"]) if "op" in options else (ReduceOp.SUM if reducing else None)
        if target.kind is TargetKind.OVERFLOW and op is not ReduceOp.MAX:
            self.error("the overflow flag is reduced with max (any rank overflowed)",
                       Code.BAD_VALUE, item.span)
        source = options.get("from", "owner")
        if kind is CollectiveKind.BROADCAST and source != "owner" and not source.isdigit():
            self.error("broadcast takes 'from = owner' or 'from = <rank>'", Code.BAD_VALUE, item.span)
            return None
        return Collective(kind, op, target, group, item.span, accumulate="accumulate" in options,
                          order=Order(options.get("order", "fixed")), source=source)

    def clip_op(self, item: ast.OpStmt, group: Group | None) -> Op | None:
        max_norm: Fraction | None = None
        once = True
        for arg in item.args:
            if isinstance(arg, ast.KeywordArg) and arg.key.text == "max_norm":
                max_norm = self.outer.number(arg.value, "max_norm")
            elif isinstance(arg, ast.KeywordArg) and arg.key.text == "replicated":
                word = self.outer.word(arg.value, "replicated counting", ["once", "every_rank"])
                once = word != "every_rank"
            else:
                self.error("clip takes 'max_norm = x' and 'replicated = once|every_rank'",
                           Code.UNKNOWN_NAME, arg.span)
                return None
        if max_norm is None or max_norm <= 0:
            self.error("clip needs a positive 'max_norm', e.g. clip(max_norm = 1.0) grads over dp",
                       Code.MISSING, item.span)
            return None
        target = self.target(item.target, [TargetKind.GRADS])
        if target is None:
            return None
        return Clip(max_norm, group or Group(()), once, item.span, target)

    def seed(self, item: ast.SeedStmt) -> Seed | None:
        if item.call.name.text != "dropout":
            self.error(f"unknown random stream '{item.call.name.text}'; only 'dropout' is modelled",
                       Code.UNKNOWN_NAME, item.call.name.span)
            return None
        region = Region.REPLICATED
        for arg in item.call.args:
            word = _value_text(arg.value)
            if isinstance(arg, ast.PositionalArg) and word in ("replicated", "sharded"):
                region = Region(word)
            else:
                self.error("dropout takes 'replicated' or 'sharded' (the activation region)",
                           Code.UNKNOWN_NAME, arg.span)
                return None
        group = self.outer.group(item.group, self.mesh)
        if group is None:
            return None
        return Seed(region, item.policy.text == "same", group, item.span)


def _expr_text(source: Source, expr: ast.Expr) -> str:
    span = expr.span
    if span.line != span.end_line:
        return " ".join(source.line_text(span.line)[span.column - 1:].split())
    return source.line_text(span.line)[span.column - 1:span.end_column - 1]
