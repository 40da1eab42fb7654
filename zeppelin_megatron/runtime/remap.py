"""Remap layer: move this rank's tokens between the linear and the attention layout.

Both layouts list, per rank, ``(seq, start, end)`` ranges whose concatenation
is the rank's token buffer. :attr:`StepPlan.remap` turns the two layouts into
``all_to_all_single`` lists (:class:`~zeppelin_megatron.planner.remap.RankExchange`):
``send_index`` picks rows of the source buffer grouped by destination,
``recv_index`` says where the received rows land in the destination buffer.

One transfer (:func:`remap_parts`) moves one or more parts ``x_i`` [T_src, H_i, *F] together,
``gather -> all_to_all_single -> gather``::

    send = empty(S, sum(H_i), *F); send[:, cols_i] = x_i[send_index]   # one index_select per part
    recv = all_to_all(send, send_counts, recv_counts)
    y_i = recv[:, cols_i][gather_index]                                  # [T_dst, H_i, *F], contiguous

with ``gather_index`` the inverse of ``recv_index`` (``y[recv_index] = recv``), so q, k and v travel
as one buffer with no ``cat`` before and no split copies after (:func:`qkv_to_attention`).

Routed (``plan.remap_proxies`` non-empty, :mod:`~zeppelin_megatron.planner.remap_routing`):
the send buffer is the first staging buffer; three ``all_to_all`` phases move
cross-node rows over the proxies' rail-aligned NICs::

    buf = send
    for phase in phases:                      # NVLink, network (rail-aligned), NVLink
        buf = cat(buf[keep_index], all_to_all(buf[send_index], send_counts, recv_counts))
    y_i = buf[:, cols_i][gather_index]        # gather_index[recv_index] = final_index

Posted (:func:`post_parts` -> :class:`PostedRemap`, :meth:`PostedRemap.wait`): the same exchange split
at the first collective: the post packs ``send`` and starts the direct ``all_to_all`` (routed: phase 1)
with ``async_op=True``, the wait finishes it (routed: then runs phases 2 and 3, which need phase 1's
rows) and unpacks; :func:`remap_parts` is the post and the wait at once. :mod:`.overlap` runs the
plan's remap windows in between.

``to_attention`` and ``to_linear`` are exact inverses, so each one's backward is
the other's forward applied to the gradient.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..planner.lowering import RankProgram, rank_remap
from ..planner.remap_staging import SOURCE, drop_rows, in_place_rows, rank_staging
from ..planner.remap import Direction
from ..planner.plan import StepPlan
from .comm import PendingAllToAll, all_to_all_start, all_to_all_uneven
from .group import ZeppelinGroup

__all__ = ["remap_parts", "post_parts", "PostedRemap", "remap_tokens", "to_attention", "to_linear",
           "qkv_to_attention", "RemapFunction", "QKVRemapFunction"]


_Gather = tuple[tuple[int, "torch.Tensor | None", "torch.Tensor | None", "tuple[int, int] | None"], ...]
"""Entries ``(origin, rows, positions, span)``: a :data:`~zeppelin_megatron.planner.remap_staging.Gather`'s on a
device, ``span`` ``(start, end)`` when the positions are ``range(start, end)`` (written as a slice)."""


@dataclass(frozen=True)
class _Indices:
    """``rank``'s remap in one direction on a device: the direct exchange ``ex``, ``send_index``, the
    routed exchange (or None) and, per buffer built, its gather from the origins (``send``, then what
    each ``all_to_all`` delivered, and the source tensor; :mod:`~zeppelin_megatron.planner.remap_staging`):
    ``phases`` (routed only) and ``final`` (the destination); ``moves``: whether any rank sends a row (else
    no rank runs the collective)."""

    ex: Any
    send_index: torch.Tensor
    routed: Any
    phases: tuple[_Gather, ...]
    final: _Gather
    moves: bool


_INDEX_CACHE: "weakref.WeakKeyDictionary[StepPlan, dict[Any, _Indices]]" = weakref.WeakKeyDictionary()


def _indices(plan: StepPlan, rank: int, direction: Direction, device: torch.device,
             program: RankProgram | None = None) -> _Indices:
    """``rank``'s lowered remap (:func:`~zeppelin_megatron.planner.lowering.rank_remap`) with its index
    tensors on ``device``, cached per plan.

    The gathers are :func:`~zeppelin_megatron.planner.remap_staging.rank_staging`'s (the plan the simulator's
    charges count too): the destination is built by gathers, not a gather and a scatter; staying rows are
    read from the source tensor (origin ``SOURCE``, never sent); routed rows are read from the buffer they
    arrived in, so no staging buffer is materialised. ``program``: the rank's lowered program, whose in-place
    local chunks (``LocalChunk.linear_rows``) fill their destination rows themselves: those rows are not
    gathered (:func:`~zeppelin_megatron.planner.remap_staging.drop_rows`).
    """
    per_plan = _INDEX_CACHE.setdefault(plan, {})
    key = (rank, direction, str(device), program is not None)
    hit = per_plan.get(key)
    if hit is None:
        ex, routed = rank_remap(plan, rank, direction)
        as_t = lambda a: torch.as_tensor(a, dtype=torch.long).to(device)  # noqa: E731
        src, dst = ("linear", "attention") if direction == "to_attention" else ("attention", "linear")
        try:
            st = rank_staging(ex, routed, plan.tokens(rank, src), plan.tokens(rank, dst))
        except ValueError as exc:
            raise AssertionError(f"rank {rank}: the remap {direction}: {exc}") from None
        if program is not None:
            st = drop_rows(st, in_place_rows(program.local_chunks, direction), plan.tokens(rank, dst))

        def on(g: Any) -> _Gather:
            return tuple((o, None if r is None else as_t(r), None if p is None else as_t(p), _span(p))
                         for o, r, p in g)

        hit = per_plan[key] = _Indices(ex=ex, send_index=as_t(ex.send_index), routed=routed,
                                       phases=tuple(on(g) for g in st.phases), final=on(st.final),
                                       moves=plan.remap.moves())
    return hit


def _span(pos: Any) -> tuple[int, int] | None:
    """``(start, end)`` when ``pos`` is ``range(start, end)`` (non-empty), else None."""
    if pos is None or not len(pos):
        return None
    p = np.asarray(pos)
    return (int(p[0]), int(p[-1]) + 1) if bool(np.all(np.diff(p) == 1)) else None


def _assemble(sources: Sequence[torch.Tensor], plan: _Gather, n: int, like: torch.Tensor,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """The [n, *like.shape[1:]] buffer ``plan`` gathers from ``sources`` (one copy of each row read); origin
    ``SOURCE`` (-1) is ``sources[-1]``. ``out``: an allocated buffer to fill (``plan``'s positions only).
    An entry whose positions are one range is read straight into that slice (one ``index_select`` or
    ``copy_``), others by an ``index_select`` and an ``index_copy_``."""
    if out is None and len(plan) == 1 and plan[0][2] is None:
        o, rows, _, _ = plan[0]
        return sources[o].contiguous() if rows is None else sources[o].index_select(0, rows)
    if out is None:
        out = like.new_empty((n, *like.shape[1:]))
    for o, rows, pos, span in plan:
        assert pos is not None
        if span is not None:
            dst = out.narrow(0, span[0], span[1] - span[0])
            if rows is None:
                dst.copy_(sources[o])
            else:
                torch.index_select(sources[o], 0, rows, out=dst)
        else:
            out.index_copy_(0, pos, sources[o] if rows is None else sources[o].index_select(0, rows))
    return out


def remap_parts(
    parts: Sequence[torch.Tensor], plan: StepPlan, group: ZeppelinGroup, direction: Direction
) -> tuple[torch.Tensor, ...]:
    """Move tensors ``parts[i]`` [T_src, H_i, *F] (this rank's buffers in the source layout, one dtype,
    one ``F``) together -> ``[T_dst, H_i, *F]`` each (no autograd): :func:`post_parts` and its wait.

    The rows of all parts travel in one packed buffer ``send`` [S, sum(H_i), *F], filled by one
    ``index_select`` per part straight into its column slice (no ``cat``); the received buffer is
    unpacked by one ``index_select`` per part into that part's contiguous result (no split copies).
    Routed: each phase's send buffer is gathered from the buffers its rows arrived in, and each
    destination row is read from the buffer it arrived in (no staging buffer is built).
    Example: ``q`` [T, 32, 128], ``k``, ``v`` [T, 8, 128] travel as one [S, 48, 128] buffer.
    """
    return post_parts(parts, plan, group, direction).wait()


class PostedRemap:
    """A remap started by :func:`post_parts`; :meth:`wait` -> the parts in the destination layout.

    Direct: the one ``all_to_all`` is in flight; the wait finishes it and unpacks. Routed: phase 1
    is in flight; the wait finishes it, then runs phases 2 .. n one after the other (each sends rows
    the previous one delivered), then unpacks. The staying rows were gathered into the destination
    buffers at the post. Call :meth:`wait` once.
    """

    def __init__(self, idx: _Indices, sources: list[torch.Tensor], pending: PendingAllToAll | None,
                 widths: list[int], t_dst: int, group: ZeppelinGroup, direction: Direction,
                 results: list[torch.Tensor | None]) -> None:
        self._idx, self._sources, self._pending = idx, sources, pending
        self._widths, self._t_dst, self._group, self._direction = widths, t_dst, group, direction
        self._results = results

    def wait(self) -> tuple[torch.Tensor, ...]:
        idx, sources, group, direction = self._idx, self._sources, self._group, self._direction
        if self._pending is not None:
            sources.append(self._pending.wait())
            self._pending = None
        if idx.routed is not None and idx.moves and group.size > 1:
            send = sources[0]
            for n in range(len(sources), len(idx.routed.phases) + 1):  # phases 2 .. n, each after the last
                phase, g = idx.routed.phases[n - 1], idx.phases[n - 1]
                buf = _assemble(sources, g, int(sum(phase.send_counts)), send)
                sources.append(all_to_all_uneven(buf, phase.send_counts, phase.recv_counts, group,
                                                 what=f"the routed remap {direction} (phase {n} of 3)"))
        moved = tuple(e for e in idx.final if e[0] != SOURCE)
        out, off = [], 0
        for w, res in zip(self._widths, self._results):
            if moved or res is None:  # res: None, or the staying rows gathered at the post
                cols = [t.narrow(1, off, w) for t in sources]
                res = _assemble(cols, idx.final if res is None else moved, self._t_dst, cols[0], out=res)
            out.append(res)
            off += w
        return tuple(out)


def post_parts(
    parts: Sequence[torch.Tensor], plan: StepPlan, group: ZeppelinGroup, direction: Direction, *,
    program: RankProgram | None = None, into: Sequence[torch.Tensor] | None = None,
) -> PostedRemap:
    """Pack ``parts`` (as :func:`remap_parts`) and start the exchange: the direct ``all_to_all``, or
    phase 1 of a routed remap (phases 2 .. n need phase 1's rows: they run in :meth:`PostedRemap.wait`).
    The rows that stay on this rank are gathered from ``parts`` into the destination buffers here (they
    never enter the send buffer nor the collective); when no rank sends a row (``plan.remap.moves()`` is
    False) no collective runs. Work issued between this and the wait overlaps the exchange (:mod:`.overlap`);
    ``parts`` may be changed once this returns, except where a destination is all of a contiguous part, in
    order: it is that part (no copy). ``program`` (the rank's lowered program): the rows its in-place local chunks
    fill are not gathered (:mod:`.overlap`); ``into``: the destination buffers to fill (one per part,
    ``[T_dst, H_i, *F]``), else they are allocated."""
    rank = group.rank
    src_layout = "linear" if direction == "to_attention" else "attention"
    dst_layout = "attention" if direction == "to_attention" else "linear"
    want = plan.tokens(rank, src_layout)
    first = parts[0]
    for i, x in enumerate(parts):
        if x.shape[0] != want:
            raise ValueError(f"rank {rank}: {x.shape[0]} tokens given (part {i}), the plan's {src_layout} "
                             f"layout has {want}")
        if x.dim() < 2 or x.shape[2:] != first.shape[2:] or x.dtype != first.dtype or x.device != first.device:
            raise ValueError(f"part {i} {tuple(x.shape)} {x.dtype} must be [tokens, heads, ...] like part 0 "
                             f"{tuple(first.shape)} {first.dtype} on {first.device}")
    idx = _indices(plan, rank, direction, first.device, program)
    t_dst = plan.tokens(rank, dst_layout)
    widths = [x.shape[1] for x in parts]
    kept = tuple(e for e in idx.final if e[0] == SOURCE)
    if into is not None and (len(into) != len(parts) or any(y.shape != (t_dst, *x.shape[1:])
                                                             for x, y in zip(parts, into))
                             or any(p is None for _, _, p, _ in idx.final)):
        raise ValueError(f"into must give each of the {len(parts)} parts a [{t_dst}, heads, ...] buffer and the "
                         "remap must skip some destination rows (program with in-place chunks)")
    results: list[torch.Tensor | None] = list(into) if into is not None else []
    for i, x in enumerate(parts):  # the staying rows, straight from the source
        if into is not None:
            if kept:
                _assemble([x], kept, t_dst, x, out=results[i])
        elif not kept:
            results.append(None)
        elif len(idx.final) == 1 and idx.final[0][2] is None:
            results.append(_assemble([x], idx.final, t_dst, x))
        else:
            results.append(_assemble([x], kept, t_dst, x, out=x.new_empty((t_dst, *x.shape[1:]))))
    send = first.new_empty((idx.send_index.shape[0], sum(widths), *first.shape[2:]))
    off = 0
    for x, w in zip(parts, widths):
        if idx.send_index.shape[0]:
            torch.index_select(x, 0, idx.send_index, out=send.narrow(1, off, w))
        off += w
    sources = [send]
    pending = None
    if not idx.moves:  # no rank sends a row (a one-rank plan, or layouts that only reorder each rank's rows)
        pass
    elif idx.routed is not None:
        phase, g = idx.routed.phases[0], idx.phases[0]
        buf = _assemble(sources, g, int(sum(phase.send_counts)), send)
        pending = all_to_all_start(buf, phase.send_counts, phase.recv_counts, group,
                                   what=f"the routed remap {direction} (phase 1 of 3)")
    else:
        pending = all_to_all_start(send, idx.ex.send_counts, idx.ex.recv_counts, group,
                                   what=f"the remap {direction}")
    return PostedRemap(idx, sources, pending, widths, t_dst, group, direction, results)


def remap_tokens(x: torch.Tensor, plan: StepPlan, group: ZeppelinGroup, direction: Direction) -> torch.Tensor:
    """Move ``x`` [T_src, *F] (this rank's buffer in the source layout) -> [T_dst, *F] (no autograd)."""
    rank = group.rank
    src_layout = "linear" if direction == "to_attention" else "attention"
    if x.shape[0] != plan.tokens(rank, src_layout):
        raise ValueError(
            f"rank {rank}: {x.shape[0]} tokens given, the plan's {src_layout} layout has "
            f"{plan.tokens(rank, src_layout)}"
        )
    dst_layout = "attention" if direction == "to_attention" else "linear"
    flat = x.reshape(x.shape[0], 1, math.prod(x.shape[1:]))  # [T, 1, prod(F)]: one part of width 1
    (y,) = remap_parts([flat], plan, group, direction)
    return y.view(plan.tokens(rank, dst_layout), *x.shape[1:])


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


class QKVRemapFunction(torch.autograd.Function):
    """Differentiable :func:`remap_parts` of ``(q, k, v)`` to the attention layout; backward moves
    ``(dq, dk, dv)`` back the same packed way."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: StepPlan,
                group: ZeppelinGroup) -> tuple[torch.Tensor, ...]:
        ctx.plan, ctx.group = plan, group
        ctx.like = [(x.shape[1:], x.dtype, x.device) for x in (q, k, v)]
        return remap_parts([q, k, v], plan, group, "to_attention")

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        t_att = ctx.plan.tokens(ctx.group.rank, "attention")
        g = [torch.zeros((t_att, *shape), dtype=dtype, device=device) if x is None else x
             for x, (shape, dtype, device) in zip(grads, ctx.like)]  # a part unused downstream moves zeros
        return (*remap_parts(g, ctx.plan, ctx.group, "to_linear"), None, None)


def qkv_to_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: StepPlan, group: ZeppelinGroup
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q`` [T_linear, Hq, D], ``k``, ``v`` [T_linear, Hkv, D] -> the same in the attention layout, each
    contiguous, moved in one packed exchange (:func:`remap_parts`); differentiable."""
    q_a, k_a, v_a = QKVRemapFunction.apply(q, k, v, plan, group)
    return q_a, k_a, v_a
