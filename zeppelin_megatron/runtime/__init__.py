"""Distributed runtime: executes a :class:`~zeppelin_megatron.planner.plan.StepPlan` forward and backward.

Public entry point: :func:`zeppelin_attention`. Building blocks: :class:`ZeppelinGroup`
(ranks, nodes, global ranks, timeout), :mod:`.comm` (all-to-all, point-to-point),
:mod:`.agreement` (the start-of-call check), :mod:`.waits` (timeouts naming step and peer),
:mod:`.remap` (linear <-> attention layout), :mod:`.overlap` (remap windows), :mod:`.ring` (zigzag ring attention),
:mod:`.router` (proxy routing), :mod:`.engine` (queues), :mod:`.kernels` (backends).
Never imports megatron.
"""

from .attention import validate_inputs, zeppelin_attention
from .agreement import check_agreement, check_plan_agreement
from .errors import (
    AgreementError,
    BackendUnavailableError,
    PlanMismatchError,
    RuntimeInputError,
    ZeppelinCommError,
    ZeppelinTimeoutError,
)
from .group import DEFAULT_TIMEOUT_S, ZeppelinGroup
from .kernels import available_backends, get_kernel
from .remap import to_attention, to_linear

__all__ = [
    "zeppelin_attention",
    "validate_inputs",
    "check_agreement",
    "check_plan_agreement",
    "ZeppelinGroup",
    "DEFAULT_TIMEOUT_S",
    "to_attention",
    "to_linear",
    "get_kernel",
    "available_backends",
    "RuntimeInputError",
    "AgreementError",
    "PlanMismatchError",
    "BackendUnavailableError",
    "ZeppelinCommError",
    "ZeppelinTimeoutError",
]
