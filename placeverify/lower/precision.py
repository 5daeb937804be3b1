"""Lower the ``precision`` statement: a preset, optionally changed by a block of dtypes or bytes.

``params``, ``grads``, ``optimizer`` and ``activations`` take a dtype or bytes per element;
``gather`` and ``reduce`` (the dtypes Θ is all-gathered in and G is reduced in) and ``compute``
(the dtype matmuls run in) take a dtype name: :mod:`placeverify.ir.precision`."""

from __future__ import annotations

from fractions import Fraction

from placeverify.diagnostics import Code, did_you_mean
from placeverify.ir.mesh import Mesh
from placeverify.ir.precision import DTYPE_BYTES, MATMUL_DTYPES, PRECISIONS, Precision
from placeverify.lower.values import MAX_BYTES_PER_ELEMENT, Context, literal
from placeverify.syntax import ast

# the keys that name a dtype only, and the field each sets
NAMED_DTYPES = {"gather": "gather_dtype", "reduce": "reduce_dtype", "compute": "compute"}


def _named_dtype(ctx: Context, key: str, value: ast.Value) -> str | None:
    """``gather = bf16``, ``reduce = fp32``, ``compute = tf32``: a dtype name; ``compute`` one a
    matmul runs in (fp32 operands run as tf32)."""
    if not isinstance(value, ast.NameValue):
        ctx.error(f"{key} takes a dtype name ({', '.join(DTYPE_BYTES)}), not bytes",
                  Code.BAD_VALUE, value.span)
        return None
    if key == "compute" and value.name.text == "fp32":
        ctx.error("compute = fp32: fp32 matmuls run as tf32 on a device profile; write "
                  "compute = tf32", Code.BAD_VALUE, value.span)
        return None
    return ctx.word(value, "matmul dtype" if key == "compute" else "dtype",
                    list(MATMUL_DTYPES if key == "compute" else DTYPE_BYTES))


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
        if key in NAMED_DTYPES:
            changes[NAMED_DTYPES[key]] = _named_dtype(ctx, key, entry.value)
            continue
        if key not in keys:
            known = [*keys, *NAMED_DTYPES, "loss_scale"]
            ctx.error(f"unknown precision key '{key}'{did_you_mean(key, known)}",
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


def check_compute(ctx: Context, stmt: ast.PrecisionStmt, precision: Precision, mesh: Mesh) -> None:
    """A written ``compute`` is the dtype matmuls run in: the device profile must have it, and
    the mesh's older ``matmul`` property, where also written, must say the same."""
    entry = next((e for e in (stmt.block.entries if stmt.block else ()) if e.key.text == "compute"),
                 None)
    if entry is None or precision.compute is None:
        return
    if mesh.matmul is not None and mesh.matmul != precision.compute:
        ctx.error(f"compute = {precision.compute} here, but the mesh says matmul = {mesh.matmul}: "
                  "write the matmuls' dtype once (precision compute)", Code.CONFLICT,
                  entry.value.span)
    elif mesh.device is not None and mesh.device.peak(precision.compute) is None:
        ctx.error(f"device '{mesh.device.key}' has no {precision.compute} matmuls", Code.BAD_VALUE,
                  entry.value.span)
