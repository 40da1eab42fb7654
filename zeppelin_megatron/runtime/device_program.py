"""A rank's lowered program on one device: index tensors, head-parallel plumbing, transfer wires; once per plan.

:func:`cached_program` memoises the pure lowering (:func:`~zeppelin_megatron.planner.lowering.lower_rank`) per plan
object; :func:`device_program` turns it into :class:`DeviceProgram`, what :class:`~.engine.AttentionEngine` reads
at every layer of a step: the rank's ring rows (and whether they are one range), each ring call's varlen batch and
row indices (:class:`~.ring.StepIndex`), the local chunks, each head-parallel ring's :class:`~.heads.HeadIndex`, and
every transfer's :class:`Wire` (its hops and message sizes for the tensors it carries in that direction). Both
caches are weak on the plan, so a step's plan and its programs go away together.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ..planner.lowering import Post, RankProgram, RingCall, Transfer, TransferId, lower_rank
from ..planner.plan import StepPlan
from .heads import HeadIndex, HeadShape, head_index, heads_problem, transfer_unit
from .kernels import VarlenBatch
from .ring import StepIndex
from .router import rank_rounds

__all__ = ["Wire", "DeviceProgram", "device_program", "cached_program"]

# plan -> {(rank, routed): RankProgram}; programs are pure functions of these.
_PROGRAMS: "weakref.WeakKeyDictionary[StepPlan, dict[tuple[int, bool], RankProgram]]" = weakref.WeakKeyDictionary()


def cached_program(plan: StepPlan, rank: int, routed: bool) -> RankProgram:
    """:func:`~zeppelin_megatron.planner.lowering.lower_rank`, memoised per plan object."""
    per_plan = _PROGRAMS.setdefault(plan, {})
    hit = per_plan.get((rank, routed))
    if hit is None:
        hit = per_plan[(rank, routed)] = lower_rank(plan, rank, routing=routed)
    return hit


@dataclass(frozen=True, kw_only=True)
class Wire:
    """A transfer as this rank runs it for ``unit`` elements per token (:func:`~.heads.transfer_unit`):
    its hops per round, every message's ``(src, dst)`` and element count."""

    rounds: tuple[tuple[Any, ...], ...]
    ends: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]
    unit: int


@dataclass(frozen=True, kw_only=True)
class DeviceProgram:
    """A program's index tensors on one device: ``rows[ring]`` (the rank's ring rows in its attention
    buffer), ``steps[(ring, step)]``, ``local[chunk]`` ``(rows, batch)``, ``heads[ring]`` (head-parallel
    rings, :class:`~.heads.HeadIndex`), and ``wires[(transfer id, backward)]`` (the ``heads`` and
    ``tokens`` all-to-alls carry other tensors forward and backward, so other sizes). ``spans[ring]`` /
    ``local_spans[chunk]``: ``(start, end)`` when those rows are ``range(start, end)``
    (``RingPart.span``, ``LocalChunk.span`` of :mod:`~zeppelin_megatron.planner.lowering_parts`; views and
    slices), else None (gathers). ``linear_local[chunk]``: ``(rows, span)`` of an in-place chunk
    (``LocalChunk.linear_rows``) in the rank's linear buffers."""

    program: RankProgram
    shape: HeadShape
    rows: dict[int, torch.Tensor]
    steps: dict[tuple[int, int], StepIndex]
    local: tuple[tuple[torch.Tensor, VarlenBatch], ...]
    spans: dict[int, tuple[int, int] | None]
    local_spans: tuple[tuple[int, int] | None, ...]
    heads: dict[int, HeadIndex]
    wires: dict[tuple[TransferId, bool], Wire]
    linear_local: dict[int, tuple[torch.Tensor, tuple[int, int] | None]]


_DEVICE: "weakref.WeakKeyDictionary[StepPlan, dict[tuple[int, bool, HeadShape, torch.device], DeviceProgram]]" = (
    weakref.WeakKeyDictionary()
)


def _wire(t: Transfer, rank: int, unit: int) -> Wire:
    return Wire(rounds=rank_rounds(t.hops(unit), rank), ends=tuple((m.src, m.dst) for m in t.messages),
                sizes=tuple(m.tokens * unit for m in t.messages), unit=unit)


def device_program(plan: StepPlan, rank: int, routed: bool, shape: HeadShape, device: torch.device) -> DeviceProgram:
    """Rank ``rank``'s program with its index tensors on ``device`` and its transfers for inputs of
    ``shape`` (heads, head dim), built once per plan (every layer of a step shares it). Raises
    ``ValueError`` (:func:`~.heads.heads_problem`) when a head-parallel ring's lanes cannot split the heads."""
    per_plan = _DEVICE.setdefault(plan, {})
    key = (rank, routed, shape, device)
    hit = per_plan.get(key)
    if hit is not None:
        return hit
    why = heads_problem(plan, shape.hq, shape.hkv)
    if why is not None:
        raise ValueError(why)
    program = cached_program(plan, rank, routed)
    as_t = lambda rows: torch.tensor(rows, dtype=torch.long, device=device)  # noqa: E731
    rows = {p.ring: as_t(p.rows) for p in program.rings if p.position is not None}
    spans = {p.ring: p.span for p in program.rings if p.position is not None}
    steps: dict[tuple[int, int], StepIndex] = {}
    shared: dict[tuple[int, ...], torch.Tensor] = {}  # one tensor per distinct row list (e.g. the late rows)

    def index(r: tuple[int, ...]) -> torch.Tensor:
        if r not in shared:
            shared[r] = as_t(r)
        return shared[r]

    for op in program.forward:
        if isinstance(op, RingCall):
            steps[(op.ring, op.step)] = StepIndex(
                batch=VarlenBatch(lens_q=op.lens_q, lens_k=op.lens_k, causal=op.causal, device=device),
                q_index=None if op.q_all else index(op.q_rows), kv_index=None if op.kv_all else index(op.kv_rows))
    local = tuple((as_t(c.rows), VarlenBatch(lens_q=c.lens, lens_k=c.lens, causal=True, device=device))
                  for c in program.local_chunks)
    local_spans = tuple(c.span for c in program.local_chunks)
    linear_local = {i: (as_t([r for a, b in c.linear_rows for r in range(a, b)]), c.linear_span)
                    for i, c in enumerate(program.local_chunks) if c.linear_rows is not None}
    heads = {p.ring: head_index(program, p, shape, device) for p in program.rings
             if p.a2a > 1 and p.position is not None}
    a2a = {p.ring: p.a2a for p in program.rings}
    made: dict[tuple[TransferId, int], Wire] = {}
    wires: dict[tuple[TransferId, bool], Wire] = {}
    for backward, ops in ((False, program.forward), (True, program.backward)):
        for op in ops:
            if isinstance(op, Post):
                tid = op.transfer
                unit = transfer_unit(tid.kind, backward, a2a[tid.ring], shape)
                if (tid, unit) not in made:
                    made[(tid, unit)] = _wire(program.transfers[tid], rank, unit)
                wires[(tid, backward)] = made[(tid, unit)]
    hit = per_plan[key] = DeviceProgram(program=program, shape=shape, rows=rows, steps=steps, local=local,
                                        heads=heads, wires=wires, spans=spans, local_spans=local_spans,
                                        linear_local=linear_local)
    return hit
