"""Lower the ``mesh`` statement (axes, their links, named groups, memory) and resolve groups.

A group (``dp * cp``, ``world``, a named group, ``ends(pp)``) is resolved against the mesh here
for every statement that names one: placements, the step's collectives, seeds and counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from placeverify.diagnostics import Code, Span, did_you_mean
from placeverify.ir.mesh import Axis, Group, Mesh
from placeverify.ir.profiles import MEMORY_PROFILES
from placeverify.lower.values import (
    BYTE_UNITS,
    MAX_AXIS,
    MAX_MEMORY,
    MAX_WORLD,
    RESERVED_AXIS_NAMES,
    TIME_UNITS,
    Context,
    at,
)
from placeverify.syntax import ast

if TYPE_CHECKING:
    from placeverify.ir.devices import Device

MESH_PROPERTIES = ("world", "device_memory", "host_memory", "pcie_bandwidth", "reserve")
# a bundled device profile; the dtype matmuls run in; the implementation whose peak is modelled
NAMED_PROPERTIES = ("device", "matmul", "memory_profile")


def read_mesh(ctx: Context, stmt: ast.MeshStmt) -> Mesh | None:
    axes, properties = _read_entries(ctx, stmt)
    if not axes and not ctx.diag.errors:
        ctx.error("the mesh has no axes, e.g. 'dp = 8'", Code.MISSING, stmt.span)
        return None
    mesh = Mesh(tuple(axes), stmt.span)
    groups: list[tuple[str, Group]] = []
    for entry in stmt.entries:
        if isinstance(entry, ast.GroupEntry):
            group = read_group(ctx, entry.group, mesh, allow_named=False)
            if group is not None:
                groups.append((entry.name.text, group))
    mesh = Mesh(mesh.axes, stmt.span, tuple(groups))
    memory, profile, matmul, memory_profile = _read_properties(ctx, properties, mesh)
    if mesh.world > MAX_WORLD:
        ctx.error(f"the mesh has {mesh.world:,} devices, absurdly many", Code.BAD_VALUE,
                  stmt.span)
    axes_out = mesh.axes if profile is None else device_links(mesh.axes, profile)
    if profile is not None and "device_memory" not in memory:
        memory["device_memory"] = profile.memory_bytes
    if profile is not None and matmul is not None and profile.peak(matmul) is None:
        ctx.error(f"device '{profile.key}' has no {matmul} matmuls", Code.BAD_VALUE,
                  properties["matmul"].value.span,
                  "it has: " + ", ".join(dtype for dtype, _ in profile.flops))
    return Mesh(axes_out, stmt.span, mesh.groups, memory.get("device_memory"),  # type: ignore[arg-type]
                memory.get("host_memory"), memory.get("pcie_bandwidth"),  # type: ignore[arg-type]
                profile, matmul, memory.get("reserve"), memory_profile)  # type: ignore[arg-type]


def _read_entries(ctx: Context, stmt: ast.MeshStmt) -> tuple[list[Axis], dict[str, ast.AxisEntry]]:
    """The mesh's axes (with their links), and its property entries by name (read later)."""
    axes: list[Axis] = []
    properties: dict[str, ast.AxisEntry] = {}
    seen: dict[str, Span] = {}
    for entry in stmt.entries:
        name = entry.name.text
        if name in seen:
            ctx.error(f"duplicate mesh entry '{name}'", Code.DUPLICATE, entry.name.span,
                      f"first defined at {at(seen[name])}")
            continue
        seen[name] = entry.name.span
        if isinstance(entry, ast.GroupEntry):
            continue
        if name in NAMED_PROPERTIES or name in MESH_PROPERTIES:
            properties[name] = entry
            if entry.block is not None:
                ctx.error(f"'{name}' takes no block", Code.BAD_VALUE, entry.block.span)
            continue
        if name in RESERVED_AXIS_NAMES:
            ctx.error(f"'{name}' is reserved and cannot name an axis", Code.BAD_VALUE,
                      entry.name.span)
            continue
        if isinstance(entry.value, ast.QuantityValue):
            hint = did_you_mean(name, MESH_PROPERTIES)
            if hint.startswith("; did you mean"):
                ctx.error(f"unknown mesh property '{name}'{hint}", Code.UNKNOWN_NAME,
                          entry.name.span)
            else:
                ctx.error(f"the size of axis '{name}' is a plain number, not "
                          f"'{entry.value.text}'", Code.BAD_VALUE, entry.value.span,
                          "mesh properties with units: " + ", ".join(MESH_PROPERTIES[1:]))
            continue
        size = ctx.integer(entry.value, f"size of axis '{name}'", 1, MAX_AXIS)
        if size is None:
            continue
        bandwidth, latency = link(ctx, entry.block)
        axes.append(Axis(name, size, entry.name.span, bandwidth, latency))
    return axes, properties


def _read_properties(ctx: Context, properties: dict[str, ast.AxisEntry], mesh: Mesh
                     ) -> tuple[dict[str, object], Device | None, str | None, str | None]:
    """The mesh's properties: its memory and link sizes, the device profile, the matmul dtype
    and the memory profile; ``world`` checked against the axes' product."""
    memory: dict[str, object] = {}
    profile: Device | None = None
    matmul: str | None = None
    memory_profile: str | None = None
    for name, entry in properties.items():
        if name == "device":
            profile = read_device(ctx, entry)
        elif name == "memory_profile":
            memory_profile = read_memory_profile(ctx, entry)
        elif name == "matmul":
            matmul = read_matmul(ctx, entry)
        elif name == "world":
            world = ctx.integer(entry.value, "world", 1, MAX_WORLD)
            if world is not None and world != mesh.world:
                product = " x ".join(f"{a.name} {a.size}" for a in mesh.axes) or "no axes"
                ctx.error(f"the mesh has {mesh.world:,} devices ({product}) but world = "
                          f"{world:,}", Code.WORLD_MISMATCH, entry.value.span)
        elif name == "pcie_bandwidth":
            memory[name] = ctx.quantity(entry.value, "PCIe bandwidth", BYTE_UNITS, True,
                                        Fraction(MAX_MEMORY))
        else:
            amount = ctx.quantity(entry.value, name.replace("_", " "), BYTE_UNITS, False,
                                  Fraction(MAX_MEMORY))
            memory[name] = None if amount is None else int(amount)
    return memory, profile, matmul, memory_profile


def read_memory_profile(ctx: Context, entry: ast.AxisEntry) -> str | None:
    """``memory_profile = torch``: whose temporaries the peak counts (placeverify/cost/peak.py)."""
    if not isinstance(entry.value, ast.NameValue):
        ctx.error("'memory_profile' names an implementation, e.g. 'memory_profile = torch'",
                  Code.BAD_VALUE, entry.value.span, "known: " + ", ".join(MEMORY_PROFILES))
        return None
    key = entry.value.name.text
    if key not in MEMORY_PROFILES:
        ctx.error(f"unknown memory profile '{key}'{did_you_mean(key, MEMORY_PROFILES)}",
                  Code.UNKNOWN_NAME, entry.value.span, "known: " + ", ".join(MEMORY_PROFILES))
        return None
    return key


def read_device(ctx: Context, entry: ast.AxisEntry) -> Device | None:
    """``device = h100_sxm``: a bundled profile (placeverify/ir/devices.json)."""
    # Deferred, as in the two functions below: only a mesh that names a device or a matmul
    # dtype loads the profiles (check start-up time).
    from placeverify.ir.devices import devices

    known = devices()
    if not isinstance(entry.value, ast.NameValue):
        ctx.error("'device' names a bundled profile, e.g. 'device = h100_sxm'", Code.BAD_VALUE,
                  entry.value.span, "bundled: " + ", ".join(sorted(known)))
        return None
    key = entry.value.name.text
    if key not in known:
        ctx.error(f"unknown device '{key}'{did_you_mean(key, known)}", Code.UNKNOWN_NAME,
                  entry.value.span)
        return None
    return known[key]


def read_matmul(ctx: Context, entry: ast.AxisEntry) -> str | None:
    """``matmul = fp8``: the dtype the device's matmuls run in (default: the parameters')."""
    from placeverify.ir.devices import DTYPE_PEAKS

    word = entry.value.name.text if isinstance(entry.value, ast.NameValue) else None
    if word not in DTYPE_PEAKS:
        shown = word if word is not None else getattr(entry.value, "text", "this value")
        ctx.error(f"unknown matmul dtype '{shown}'{did_you_mean(shown, DTYPE_PEAKS)}",
                  Code.UNKNOWN_NAME, entry.value.span)
        return None
    return word


def device_links(axes: tuple[Axis, ...], profile: Device) -> tuple[Axis, ...]:
    """Axes without a written bandwidth (or latency) get the profile's: NVLink / xGMI when every
    group of the axis stays inside a node (``intra_node``), otherwise the network bandwidth per
    GPU times the group's ranks in one node (``ranks_per_node``), at most NVLink's."""
    from placeverify.ir.devices import intra_node, ranks_per_node

    sizes = tuple(a.size for a in axes)
    out = []
    for i, a in enumerate(axes):
        inside = intra_node(sizes, i, profile.gpus_per_node)
        share = ranks_per_node(sizes, i, profile.gpus_per_node)
        bandwidth = profile.intra_node_bandwidth if inside else min(
            profile.intra_node_bandwidth, share * profile.network_bandwidth)
        latency = profile.intra_node_latency if inside else profile.network_latency
        out.append(Axis(a.name, a.size, a.span, bandwidth if a.bandwidth is None else a.bandwidth,
                        latency if a.latency is None else a.latency))
    return tuple(out)


def link(ctx: Context, block: ast.Block | None) -> tuple[Fraction | None, Fraction | None]:
    if block is None:
        return None, None
    bandwidth = latency = None
    entries = ctx.unique(block.entries, lambda e: e.key.text, lambda e: e.key.span, "link key")
    for key, entry in entries.items():
        if key == "bandwidth":
            bandwidth = ctx.quantity(entry.value, "bandwidth", BYTE_UNITS, True,
                                     Fraction(MAX_MEMORY))
        elif key == "latency":
            latency = ctx.quantity(entry.value, "latency", TIME_UNITS, False, Fraction(60))
        else:
            ctx.error(f"unknown link key '{key}'{did_you_mean(key, ['bandwidth', 'latency'])}",
                      Code.UNKNOWN_NAME, entry.key.span)
    return bandwidth, latency


def read_group(ctx: Context, group: ast.Group, mesh: Mesh, allow_named: bool = True,
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
                ctx.error(f"unknown group function '{term.function.text}'; 'ends(pp)' is the "
                          "first and last stage of an axis", Code.UNKNOWN_NAME,
                          term.function.span)
                ok = False
                continue
            if term.axis.text not in names:
                ctx.error(f"unknown axis '{term.axis.text}'{did_you_mean(term.axis.text, names)}",
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
                ctx.error(f"unknown axis '{ref.text}'{hint}", Code.UNKNOWN_NAME, ref.span,
                          *notes)
                ok = False
    counts = Counter(axes)
    duplicates = {a for a, k in counts.items() if k > 1}
    if duplicates:
        ctx.error(f"axis '{sorted(duplicates)[0]}' appears twice in this group",
                  Code.DUPLICATE, group.span)
        ok = False
    if not ok:
        return None
    order = {n: i for i, n in enumerate([*names, *extra])}
    return Group(tuple(sorted(axes, key=order.__getitem__)), frozenset(ends), group.span)
