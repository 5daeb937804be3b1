"""Lower the ``precision`` statement: a preset, optionally changed by a block of dtypes or bytes."""

from __future__ import annotations

from fractions import Fraction

from placeverify.diagnostics import Code, did_you_mean
from placeverify.ir.precision import DTYPE_BYTES, PRECISIONS, Precision
from placeverify.lower.values import MAX_BYTES_PER_ELEMENT, Context, literal
from placeverify.syntax import ast


def read_precision(ctx: Context, stmt: ast.PrecisionStmt | None) -> Precision:
    base = PRECISIONS["mixed_adam"]
    if stmt is None:
        return base
    if stmt.name is not None:
        if stmt.name.text not in PRECISIONS:
            ctx.error(f"unknown precision '{stmt.name.text}'"
                      f"{did_you_mean(stmt.name.text, PRECISIONS)}", Code.UNKNOWN_NAME,
                      stmt.name.span, "presets: " + ", ".join(PRECISIONS))
            return base
        base = PRECISIONS[stmt.name.text]
    elif stmt.block is None:
        ctx.error("precision needs a preset or a block", Code.MISSING, stmt.span)
        return base
    entries = ctx.unique(stmt.block.entries if stmt.block else (), lambda e: e.key.text,
                         lambda e: e.key.span, "precision key")
    changes: dict[str, object] = {}
    keys = {"params": ("params", "params_dtype"), "grads": ("grads", "grads_dtype"),
            "optimizer": ("optimizer", None), "activations": ("activations", None)}
    for key, entry in entries.items():
        if key == "loss_scale":
            changes["loss_scale"] = ctx.word(entry.value, "loss scaling",
                                             ["dynamic", "static", "none"])
            continue
        if key not in keys:
            ctx.error(f"unknown precision key '{key}'{did_you_mean(key, [*keys, 'loss_scale'])}",
                      Code.UNKNOWN_NAME, entry.key.span)
            continue
        field, dtype_field = keys[key]
        v = entry.value
        if isinstance(v, ast.NameValue):
            dtype = ctx.word(v, "dtype", list(DTYPE_BYTES))
            if dtype is None:
                continue
            changes[field] = Fraction(DTYPE_BYTES[dtype])
            if dtype_field:
                changes[dtype_field] = dtype
        else:
            number = ctx.number(v, f"{key} bytes per element")
            if number is None:
                continue
            low = 0 if key == "optimizer" else 1
            if number < low or number > MAX_BYTES_PER_ELEMENT:
                ctx.error(f"{key} = {literal(v, number)} bytes per element is out of range "
                          f"({low} to {MAX_BYTES_PER_ELEMENT})", Code.BAD_VALUE, v.span)
                continue
            changes[field] = number
            if dtype_field:
                changes[dtype_field] = {4: "fp32", 2: "bf16", 1: "fp8"}.get(int(number), "fp32")
    if any(v is None for v in changes.values()):
        return base
    name = base.name if not changes else f"{base.name}*" if stmt.name else "custom"
    return base.with_overrides(name=name, **changes)
