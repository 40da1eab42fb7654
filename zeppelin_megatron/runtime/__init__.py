"""Distributed runtime: executes a :class:`~zeppelin_megatron.planner.plan.StepPlan` forward and backward.

Public entry point: :func:`zeppelin_attention`. Building blocks: :class:`ZeppelinGroup`
(ranks, nodes, global ranks), :mod:`.comm` (all-to-all, point-to-point, plan check),
:mod:`.remap` (linear <-> attention layout), :mod:`.ring` (zigzag ring attention),
:mod:`.router` (proxy routing), :mod:`.engine` (queues), :mod:`.kernels` (backends).
Never imports megatron.
"""

from .attention import validate_inputs, zeppelin_attention
from .comm import check_plan_agreement
from .errors import BackendUnavailableError, PlanMismatchError, RuntimeInputError
from .group import ZeppelinGroup
from .kernels import available_backends, get_kernel
from .remap import to_attention, to_linear

__all__ = [
    "zeppelin_attention",
    "validate_inputs",
    "check_plan_agreement",
    "ZeppelinGroup",
    "to_attention",
    "to_linear",
    "get_kernel",
    "available_backends",
    "RuntimeInputError",
    "PlanMismatchError",
    "BackendUnavailableError",
]
