"""``zeppelin_attention``: the public entry point of the runtime.

Per call (one attention layer, one step)::

    check inputs and agreement across ranks (one small all_reduce: plan, scale, heads,
                                            head dim, dtype, routing, check setting, kernel)
    q, k, v --remap--> attention layout  (one all_to_all_single of the packed rows)
    engine: inter-node rings, intra-node rings, local sequences
    out --remap--> linear layout            (one all_to_all_single)

When the plan remaps (linear layout != attention layout) the three run as one autograd Function
(:mod:`.overlap`): each exchange is posted (``async_op``), local chunks whose sequences stay on the rank
run *in place* on its linear rows (the remap skips their rows both ways), the rank's remap windows run
between a post and its wait; backward the same around the output-gradient and dq/dk/dv exchanges::

    post q, k, v -> attention; window to_attention call; wait
    engine (in-place chunks on the linear rows, into out)
    post out -> linear; window to_linear call; wait (the other rows of out)

A routed remap posts its phase 1 only; phases 2 and 3 run at the wait. Rows that stay on their rank
never enter the exchange. When the linear layout is the attention layout no remap runs at all.

Everything is differentiable with respect to ``q``, ``k`` and ``v``. Every wait
runs under ``group.timeout_s``: a rank that fails (even one that raises and stays
alive) makes the others raise :class:`~.errors.ZeppelinTimeoutError` naming the step
and the peer within that time instead of blocking.
"""

from __future__ import annotations

import math

import torch

from ..planner.plan import StepPlan
from .agreement import CallTerms, check_agreement
from .engine import AttentionEngine, EngineFunction
from .errors import BackendUnavailableError, RuntimeInputError
from .group import ZeppelinGroup
from .heads import heads_problem
from .kernels import get_kernel
from .overlap import overlap_attention

__all__ = ["zeppelin_attention", "validate_inputs"]


def validate_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: StepPlan, group: ZeppelinGroup
) -> str | None:
    """The first problem with this rank's inputs, as a message naming the values; None if fine."""
    rank = group.rank
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            return f"{name} must be a torch.Tensor, got {type(t).__name__}"
        if t.dim() != 3:
            return f"{name} must be [tokens, heads, head_dim], got shape {tuple(t.shape)}"
    if not (q.dtype == k.dtype == v.dtype):
        return f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if not q.dtype.is_floating_point:
        return f"q, k and v must be floating point, got {q.dtype}"
    if not (q.device == k.device == v.device):
        return f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
    if k.shape != v.shape:
        return f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        return f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on tokens and head_dim"
    hq, hkv = q.shape[1], k.shape[1]
    if hkv < 1 or hq % hkv:
        return f"the query heads Hq={hq} must be a multiple of the key/value heads Hkv={hkv}"
    heads = heads_problem(plan, hq, hkv)
    if heads is not None:
        return heads
    if group.size != plan.world_size or group.gpus_per_node != plan.gpus_per_node:
        return (
            f"the plan is for {plan.nodes} x {plan.gpus_per_node} = {plan.world_size} ranks but the "
            f"Zeppelin group is {group.nodes} x {group.gpus_per_node} = {group.size}"
        )
    expected = plan.tokens(rank, "linear")
    if q.shape[0] != expected:
        return (
            f"rank {rank}: q, k and v hold {q.shape[0]} tokens but the plan's linear layout gives this rank "
            f"{expected} tokens ({len(plan.linear_layout[rank])} ranges)"
        )
    return None


def zeppelin_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: StepPlan,
    group: ZeppelinGroup,
    softmax_scale: float | None = None,
    *,
    backend: str | None = None,
    routing: bool = True,
    check_plan: bool = True,
    check_setting: bool | None = None,
) -> torch.Tensor:
    """Causal attention within each sequence of ``plan``, executed across ``group``.

    ``q`` [T_r, Hq, D], ``k``, ``v`` [T_r, Hkv, D]: this rank's tokens in the
    plan's linear layout (``linear_layout[rank]`` ranges concatenated in order).
    Returns ``out`` [T_r, Hq, D] in the same layout and dtype.

    ``softmax_scale``: defaults to ``1 / sqrt(D)``. ``backend``: kernel name
    (``reference``, ``torch_varlen``, ``flash_attn``, ``te``) or None for the
    best available. ``routing``: False sends every ring hop directly, ignoring
    the plan's routes.

    ``check_plan``: run the start-of-call check on this call (one ``all_reduce``
    of 24 int64, read on the host; an ``all_gather`` more only when something
    differs, to name the ranks): every rank must hold the same
    plan hash, softmax scale, Hq, Hkv, D, dtype, routing, ``check_setting``,
    resolved kernel, device type and autograd state, and valid inputs; otherwise
    every rank raises (:class:`~.errors.PlanMismatchError`,
    :class:`~.errors.RuntimeInputError` or :class:`~.errors.AgreementError`) naming
    the field and the ranks, see :mod:`.agreement`. ``check_plan`` is a per-call
    *schedule* that every rank must follow identically (a rank that skips the check
    while others run it leaves them waiting until the group timeout); make it
    depend on something all ranks share, such as the layer index, never on a
    per-rank flag. When False, input errors are raised locally and mismatches go
    undetected. ``check_setting``: the caller's check setting (e.g. Megatron's
    ``--zeppelin-check-plan``), compared across ranks by the check; defaults to
    ``check_plan``.
    Every rank of the group must call this with the same plan.

    Example (2 ranks, rank 1 passes ``softmax_scale=0.5``, rank 0 the default
    ``1/sqrt(64)``): both raise ``AgreementError: ... softmax_scale differs:
    rank 0 (node 0, local 0) has 0.125, rank 1 (node 0, local 1) has 0.5 ...``.
    """
    if not isinstance(plan, StepPlan):
        raise RuntimeInputError(f"plan must be a StepPlan, got {type(plan).__name__}")
    if not isinstance(group, ZeppelinGroup):
        raise RuntimeInputError(f"group must be a ZeppelinGroup, got {type(group).__name__}")
    problem = validate_inputs(q, k, v, plan, group)
    scale, kernel, own_error = None, None, None
    if problem is None:
        try:
            scale = 1.0 / math.sqrt(q.shape[2]) if softmax_scale is None else float(softmax_scale)
        except (TypeError, ValueError):
            scale = math.nan
        if not (math.isfinite(scale) and scale > 0):
            problem, scale = f"softmax_scale must be a positive finite number, got {softmax_scale!r}", None
    if problem is None:
        try:  # resolved before the check: a backend missing on one rank is that rank's input error
            kernel = get_kernel(backend, q.device, q.dtype)
        except BackendUnavailableError as exc:
            if not check_plan:
                raise
            problem, own_error = str(exc), exc
    if check_plan:
        device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
        terms = CallTerms.of_call(
            plan=plan, q=q, k=k, scale=scale, routing=routing,
            check_setting=check_plan if check_setting is None else check_setting,
            kernel=kernel.name if kernel is not None else None, problem=problem,
        )
        check_agreement(terms, group, device, own_error or problem)
    elif problem:
        raise RuntimeInputError(problem)
    assert scale is not None and kernel is not None
    hkv, d = k.shape[1], q.shape[2]
    engine = AttentionEngine(
        plan, group, kernel=kernel, scale=scale,
        routes=plan.routing if routing else (), hkv=hkv, head_dim=d, dtype=q.dtype, device=q.device,
        hq=q.shape[1],
    )
    if plan.linear_layout == plan.attention_layout:  # the remap is the identity on every rank: none runs
        out: torch.Tensor = EngineFunction.apply(q.contiguous(), k.contiguous(), v.contiguous(), engine)
        return out
    # one Function: the remap in, the engine (in-place chunks on the linear rows) and the remap out, with the
    # rank's remap windows inside the exchanges (overlap.py)
    return overlap_attention(q, k, v, engine)
