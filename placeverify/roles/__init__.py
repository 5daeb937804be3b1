"""The parallelism roles as data: one :class:`~placeverify.roles.spec.RoleSpec` per role, one
module each, and the single registry every backend asks."""

from __future__ import annotations

from placeverify.ir.placement import Role
from placeverify.roles.context import CONTEXT
from placeverify.roles.data import DATA
from placeverify.roles.expert import EXPERT
from placeverify.roles.pipeline import PIPELINE
from placeverify.roles.spec import RoleSpec
from placeverify.roles.tensor import TENSOR

ROLES: dict[Role, RoleSpec] = {spec.role: spec for spec in (DATA, TENSOR, PIPELINE, CONTEXT, EXPERT)}
