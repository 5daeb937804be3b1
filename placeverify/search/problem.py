"""What a search is asked: a model on some devices for a global batch, from a file or flags.

A :class:`Problem` comes from a strategy (a ``.place`` file or an imported configuration: its
model, precision, device profile, number of devices, global batch, device memory, reserve,
memory profile, loss, clipping) with any of them replaced by ``search``'s flags. Everything the
layouts do not choose is copied into each layout's text as the file wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import NoReturn

from placeverify.cost.time import default_matmul
from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span
from placeverify.ir.devices import Device
from placeverify.ir.model import Transformer
from placeverify.ir.placement import Role
from placeverify.ir.precision import Precision
from placeverify.ir.strategy import Strategy
from placeverify.syntax import ast

DEFAULT_PCIE = Fraction(25 * 10**9)  # bytes/s: PCIe 4.0 x16, when the file gives none


@dataclass(frozen=True, slots=True)
class Problem:
    title: str
    model_name: str
    arch: Transformer  # micro_batch is the layout's
    precision_text: str  # the precision statement, as the file wrote it
    device: Device
    devices: int
    global_batch: int  # sequences per step
    device_memory: int  # bytes
    reserve: int  # bytes
    memory_profile: str | None
    pcie_bandwidth: Fraction
    pcie_assumed: bool  # no pcie_bandwidth was given: DEFAULT_PCIE
    tail: tuple[str, ...]  # statements copied into every layout (loss, clip, loss_scale)
    precision: Precision
    compute_dtype: str  # the dtype matmuls run in (the step-time model's)
    matmul: str | None = None  # as the file wrote it (mesh { matmul = ... })

    def arch_for(self, micro_batch: int) -> Transformer:
        return replace(self.arch, micro_batch=micro_batch)

    def mesh_lines(self, offload: bool) -> list[str]:
        """Mesh properties every layout shares (besides its axes and device)."""
        lines = [f"device_memory = {self.device_memory} B"]
        if self.reserve:
            lines.append(f"reserve = {self.reserve} B")
        if self.memory_profile:
            lines.append(f"memory_profile = {self.memory_profile}")
        if self.matmul:
            lines.append(f"matmul = {self.matmul}")
        if offload:
            lines.append(f"pcie_bandwidth = {int(self.pcie_bandwidth)} B/s")
        return lines

    @property
    def tokens(self) -> int:
        return self.global_batch * self.arch.seq


def problem_from(strategy: Strategy, tree: ast.File | None, *, devices: int | None = None,
                 device: Device | None = None, global_batch: int | None = None,
                 batch_tokens: int | None = None, seq: int | None = None) -> Problem:
    """The problem a strategy states, with the flags' replacements; errors point at the file."""
    source = strategy.source
    arch = strategy.model.arch
    if arch is None:
        _fail(source, "search needs a model architecture, not a bare parameter count",
              "name a bundled model (model llama3_70b) or describe one (model transformer {...})")
    if strategy.model.frozen or strategy.model.adapter is not None:
        _fail(source, "search does not model fine-tunes: its screen would rank the strategies "
              "of training every parameter", "check each fine-tune layout with 'placeverify "
              "check' (frozen groups, adapters and a quantised base are costed there)")
    if arch.latent is not None or arch.shared_experts or arch.mixed_layers:
        _fail(source, "search does not model multi-head latent attention, shared experts or a "
              "mix of dense and MoE layers: its screen estimates Llama-shaped layers",
              "check each layout of this model with 'placeverify check'")
    if seq is not None:
        arch = replace(arch, seq=seq)
    mesh = strategy.mesh
    profile = device or mesh.device
    if profile is None:
        _fail(source, "search needs a device profile: 'device = h100_sxm' in the mesh, or "
              "--device", "bundled: a100_80gb_sxm, h100_sxm, h200, mi300x, b200")
    n = devices or mesh.world
    # the file's global batch: micro-batch x micro-batches x the ranks that split the batch
    replicas = mesh.world
    for p in strategy.placements:
        if p.role in (Role.TENSOR, Role.PIPELINE, Role.CONTEXT):
            replicas //= strategy.size(p.axis)
    file_batch = arch.micro_batch * strategy.microbatches * replicas
    if batch_tokens is not None:
        if batch_tokens % arch.seq:
            _fail(source, f"--batch-tokens ({batch_tokens}) is not a whole number of sequences "
                  f"of {arch.seq} tokens")
        global_batch = batch_tokens // arch.seq
    gbs = global_batch or file_batch
    memory = mesh.device_memory or profile.memory_bytes
    text = source.text
    tail: list[str] = []
    precision_text = f"precision {strategy.precision.name}"
    if tree is not None:
        for stmt in tree.statements:
            piece = _slice(text, stmt.span)
            if isinstance(stmt, ast.PrecisionStmt):
                precision_text = piece
            elif isinstance(stmt, ast.LossStmt | ast.ClipStmt | ast.LossScaleStmt):
                tail.append(piece)
    return Problem(
        title=strategy.model.name, model_name=strategy.model.name, arch=arch,
        precision_text=precision_text, device=profile, devices=n, global_batch=gbs,
        device_memory=memory, reserve=mesh.reserve or 0, memory_profile=mesh.memory_profile,
        pcie_bandwidth=mesh.pcie_bandwidth or DEFAULT_PCIE,
        pcie_assumed=mesh.pcie_bandwidth is None, tail=tuple(tail),
        precision=strategy.precision, compute_dtype=mesh.matmul or default_matmul(strategy),
        matmul=mesh.matmul)


def _slice(text: str, span: Span) -> str:
    """The source text a span covers (1-based lines and columns, end exclusive)."""
    lines = text.splitlines()
    line, column, end_line, end_column = span.line, span.column, span.end_line, span.end_column
    if line == end_line:
        return lines[line - 1][column - 1:end_column - 1]
    parts = [lines[line - 1][column - 1:], *lines[line:end_line - 1],
             lines[end_line - 1][:end_column - 1]]
    return "\n".join(parts)


def _fail(source: Source, message: str, *notes: str) -> NoReturn:
    raise PlaceError([Diagnostic(Severity.ERROR, message, Code.MISSING, None, notes)], source)
