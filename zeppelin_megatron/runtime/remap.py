"""Remap layer: move this rank's tokens between the linear and the attention layout.

Both layouts list, per rank, ``(seq, start, end)`` ranges whose concatenation
is the rank's token buffer. :attr:`StepPlan.remap` turns the two layouts into
``all_to_all_single`` lists (:class:`~zeppelin_megatron.planner.remap.RankExchange`):
``send_index`` picks rows of the source buffer grouped by destination,
``recv_index`` says where the received rows land in the destination buffer.

One transfer is ``gather -> all_to_all_single -> scatter``::

    send = x[send_index]                     # [sum(send_counts), *F]
    recv = all_to_all(send, send_counts, recv_counts)
    y = empty(T_dst, *F); y[recv_index] = recv

Routed (``plan.remap_proxies`` non-empty, :mod:`~zeppelin_megatron.planner.remap_routing`):
the send buffer is the first staging buffer; three ``all_to_all`` phases move
cross-node rows over the proxies' rail-aligned NICs::

    buf = x[send_index]
    for phase in phases:                      # NVLink, network (rail-aligned), NVLink
        buf = cat(buf[keep_index], all_to_all(buf[send_index], send_counts, recv_counts))
    y = empty(T_dst, *F); y[recv_index] = buf[final_index]

``to_attention`` and ``to_linear`` are exact inverses, so each one's backward is
the other's forward applied to the gradient.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ..planner.lowering import rank_remap
from ..planner.remap import Direction
from ..planner.plan import StepPlan
from .comm import all_to_all_uneven
from .group import ZeppelinGroup

__all__ = ["remap_tokens", "to_attention", "to_linear", "RemapFunction"]


_Indices = tuple[Any, torch.Tensor, torch.Tensor, Any, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]
_INDEX_CACHE: "weakref.WeakKeyDictionary[StepPlan, dict[Any, _Indices]]" = weakref.WeakKeyDictionary()


def _indices(plan: StepPlan, rank: int, direction: Direction, device: torch.device) -> _Indices:
    """``rank``'s lowered remap (:func:`~zeppelin_megatron.planner.lowering.rank_remap`) with its index
    tensors on ``device``, cached per plan: ``(direct exchange, send_index, recv_index, routed exchange
    or None, its phases' (send, keep) indices, its final index)``."""
    per_plan = _INDEX_CACHE.setdefault(plan, {})
    key = (rank, direction, str(device))
    hit = per_plan.get(key)
    if hit is None:
        ex, routed = rank_remap(plan, rank, direction)
        as_t = lambda a: torch.as_tensor(a, dtype=torch.long).to(device)  # noqa: E731
        phases = [(as_t(p.send_index), as_t(p.keep_index)) for p in routed.phases] if routed is not None else []
        hit = per_plan[key] = (ex, as_t(ex.send_index), as_t(ex.recv_index), routed, phases,
                               as_t(routed.final_index) if routed is not None else None)
    return hit


def remap_tokens(x: torch.Tensor, plan: StepPlan, group: ZeppelinGroup, direction: Direction) -> torch.Tensor:
    """Move ``x`` [T_src, *F] (this rank's buffer in the source layout) -> [T_dst, *F] (no autograd)."""
    rank = group.rank
    src_layout = "linear" if direction == "to_attention" else "attention"
    dst_layout = "attention" if direction == "to_attention" else "linear"
    if x.shape[0] != plan.tokens(rank, src_layout):
        raise ValueError(
            f"rank {rank}: {x.shape[0]} tokens given, the plan's {src_layout} layout has "
            f"{plan.tokens(rank, src_layout)}"
        )
    ex, send_index, recv_index, routed, phases, final = _indices(plan, rank, direction, x.device)
    send = x.index_select(0, send_index)
    if routed is not None and group.size > 1:
        assert final is not None
        for n, (phase, (p_send, p_keep)) in enumerate(zip(routed.phases, phases), 1):
            got = all_to_all_uneven(send.index_select(0, p_send), phase.send_counts, phase.recv_counts, group,
                                    what=f"the routed remap {direction} (phase {n} of 3)")
            send = torch.cat([send.index_select(0, p_keep), got])
        recv = send.index_select(0, final)
    else:
        recv = all_to_all_uneven(send, ex.send_counts, ex.recv_counts, group, what=f"the remap {direction}")
    y = x.new_empty((plan.tokens(rank, dst_layout), *x.shape[1:]))
    y.index_copy_(0, recv_index, recv)
    return y


class RemapFunction(torch.autograd.Function):
    """Differentiable :func:`remap_tokens`; backward runs the inverse direction on the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, plan: StepPlan, group: ZeppelinGroup, direction: Direction) -> torch.Tensor:
        ctx.plan, ctx.group = plan, group
        ctx.inverse = "to_linear" if direction == "to_attention" else "to_attention"
        return remap_tokens(x, plan, group, direction)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return remap_tokens(grad.contiguous(), ctx.plan, ctx.group, ctx.inverse), None, None, None


def to_attention(x: torch.Tensor, plan: StepPlan, group: ZeppelinGroup) -> torch.Tensor:
    """[T_linear, *F] -> [T_attention, *F] for this rank; differentiable."""
    return RemapFunction.apply(x, plan, group, "to_attention")


def to_linear(x: torch.Tensor, plan: StepPlan, group: ZeppelinGroup) -> torch.Tensor:
    """[T_attention, *F] -> [T_linear, *F] for this rank; differentiable."""
    return RemapFunction.apply(x, plan, group, "to_linear")
