"""The attention engine: runs one rank's share of a plan on attention-layout tensors.

Input/output are this rank's tokens in the plan's *attention layout*
(``attention_layout[rank]`` ranges concatenated): ``q`` [T_a, Hq, D], ``k``,
``v`` [T_a, Hkv, D] -> ``out`` [T_a, Hq, D].

Queues: the plan's rings in :attr:`StepPlan.rings` order, with the rank's
local sequences where the plan's ``local_slots`` put them
(:mod:`~zeppelin_megatron.planner.local_schedule`): each slot is one causal
varlen call inside one of the rank's rings, after the step-``j`` kernel and
before step ``j``'s wait, so it runs while that step's K/V transfer is in
flight or a partner is late (:func:`~zeppelin_megatron.runtime.ring.ring_forward`'s
``fill``). The rank's local sequences in no slot run as one call after the
rings. Backward runs each chunk's backward at the same place of the backward
ring walk. Each chunk's ``(out, lse)`` is saved for backward, so results equal
one call over all local sequences after the rings.

A rank takes part in a ring as a member (it holds zigzag chunks) or as a relay
(it carries routed parts of a cross-node hop); relays run the ring's transfer
sequence without compute (and fill no slots). Only compute moves: every rank
walks the rings in the same global order and posts each ring's transfers in
the same order, so any valid plan executes without deadlock, including ranks
that belong to several rings.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..planner.plan import StepPlan
from ..planner.routing import Route
from .comm import CommStream
from .group import ZeppelinGroup
from .kernels import AttentionKernel, VarlenBatch
from .ring import RingLayout, RingRun, ring_backward, ring_forward
from .router import Router

__all__ = ["RingTask", "LocalChunk", "RankProgram", "build_program", "AttentionEngine", "EngineFunction"]


@dataclass(frozen=True, kw_only=True)
class RingTask:
    """One ring as seen by one rank.

    ``position``: ring position (None: relay only). ``rows``: attention-buffer
    rows of the rank's ring tokens in seq-major ring order (empty for relays).
    ``fills``: ``(step, local chunk index)`` pairs, by step: the chunks run in
    this ring (members only).
    """

    layout: RingLayout
    placement: str
    position: int | None
    rows: tuple[int, ...]
    fills: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, kw_only=True)
class LocalChunk:
    """Whole local sequences run as one causal varlen call in one slot.

    ``rows``: attention-buffer rows, sequence after sequence; ``lens``: their lengths.
    """

    rows: tuple[int, ...]
    lens: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.lens or sum(self.lens) != len(self.rows):
            raise ValueError(f"a local chunk of lengths {list(self.lens)} needs {sum(self.lens)} rows "
                             f"(at least one sequence), got {len(self.rows)}")


@dataclass(frozen=True, kw_only=True)
class RankProgram:
    """Everything rank ``rank`` runs for a plan: rings in queue order, local chunks filling their slots.

    ``local_rows``: attention-buffer rows of its local sequences, sequence after
    sequence (plan order); ``local_lens``: their lengths; ``local_chunks``:
    the same sequences as the calls that run them: the plan's slots of this
    rank in ring and step order (named by the rings' ``fills``), then, if any
    local sequence is in no slot, one chunk of those run after the rings;
    ``tokens``: attention-layout tokens.
    """

    rank: int
    rings: tuple[RingTask, ...]
    local_rows: tuple[int, ...]
    local_lens: tuple[int, ...]
    local_chunks: tuple[LocalChunk, ...]
    tokens: int

    @property
    def slots(self) -> int:
        """Local chunks that run inside a ring step (the rest, at most one, after the rings)."""
        return sum(len(t.fills) for t in self.rings)


def _pieces(plan: StepPlan, rank: int) -> dict[int, list[tuple[int, int, int]]]:
    """seq -> ``(start, end, buffer offset)`` pieces of the rank's attention buffer."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    off = 0
    for seq, start, end in plan.attention_layout[rank]:
        out.setdefault(seq, []).append((start, end, off))
        off += end - start
    return out


def _rows(pieces: list[tuple[int, int, int]], a: int, b: int) -> list[int]:
    """Buffer rows of tokens ``[a, b)`` of one sequence.

    Example: pieces ``[(0, 4, 10), (4, 6, 0)]`` (tokens 0-3 at rows 10-13,
    tokens 4-5 at rows 0-1); tokens [3, 5) -> rows [13, 0].
    """
    rows: list[int] = []
    for start, end, off in sorted(pieces):  # token order, whatever the buffer order
        lo, hi = max(a, start), min(b, end)
        if lo < hi:
            rows += range(off + lo - start, off + hi - start)
    if len(rows) != b - a:
        raise ValueError(f"tokens [{a}, {b}) are not all in this rank's attention layout")
    return rows


def build_program(plan: StepPlan, rank: int, router: Router) -> RankProgram:
    pieces = _pieces(plan, rank)
    mine = sorted((x.ring, x.step, x.seqs) for x in plan.local_slots if x.rank == rank)
    per_seq: dict[int, list[int]] = {}
    local_lens: list[int] = []
    for s, seq in enumerate(plan.sequences):
        if seq.placement == "local" and seq.ranks[0] == rank:
            per_seq[s] = _rows(pieces[s], 0, seq.length)
            local_lens.append(seq.length)
    slotted = {i for _, _, seqs in mine for i in seqs}
    groups = [seqs for _, _, seqs in mine] + [tuple(i for i in per_seq if i not in slotted)]
    chunks = tuple(
        LocalChunk(rows=tuple(r for i in idx for r in per_seq[i]),
                   lens=tuple(plan.sequences[i].length for i in idx))
        for idx in groups if idx)
    fills: dict[int, list[tuple[int, int]]] = {}
    for c, (k, j, _) in enumerate(mine):
        fills.setdefault(k, []).append((j, c))
    rings = []
    for k, ring in enumerate(plan.rings):
        layout = RingLayout(ranks=ring.ranks, lengths=tuple(plan.sequences[s].length for s in ring.seqs))
        if rank not in router.participants(ring.ranks):
            continue
        pos = layout.position(rank)
        rows: list[int] = []
        if pos is not None:
            for s_idx, start, end in layout.token_ranges(pos):
                rows += _rows(pieces[ring.seqs[s_idx]], start, end)
        rings.append(RingTask(layout=layout, placement=ring.placement, position=pos, rows=tuple(rows),
                              fills=tuple(fills.get(k, ())) if pos is not None else ()))
    return RankProgram(rank=rank, rings=tuple(rings), local_rows=tuple(r for rows in per_seq.values() for r in rows),
                       local_lens=tuple(local_lens), local_chunks=chunks, tokens=plan.tokens(rank, "attention"))


# plan -> {(rank, gpus_per_node, routed): RankProgram}; programs are pure functions of these.
_PROGRAMS: "weakref.WeakKeyDictionary[StepPlan, dict[tuple[int, int, bool], RankProgram]]" = (
    weakref.WeakKeyDictionary()
)


def cached_program(plan: StepPlan, rank: int, router: Router, routed: bool) -> RankProgram:
    """:func:`build_program`, memoised per plan object (one build per step, not per layer)."""
    per_plan = _PROGRAMS.setdefault(plan, {})
    key = (rank, router.group.gpus_per_node, routed)
    hit = per_plan.get(key)
    if hit is None:
        hit = per_plan[key] = build_program(plan, rank, router)
    return hit


# plan -> {(rank, gpus_per_node, routed, device): (ring row tensors, local chunk (rows, batch))}
_DEVICE: "weakref.WeakKeyDictionary[StepPlan, dict[tuple[int, int, bool, torch.device], Any]]" = (
    weakref.WeakKeyDictionary()
)


def _device_indices(
    plan: StepPlan, program: RankProgram, key: tuple[int, int, bool, torch.device]
) -> tuple[tuple[torch.Tensor, ...], tuple[tuple[torch.Tensor, VarlenBatch], ...]]:
    """``program``'s row indices and local batches on ``key``'s device, built once per plan (not per layer)."""
    per_plan = _DEVICE.setdefault(plan, {})
    hit = per_plan.get(key)
    if hit is None:
        device = key[3]
        rows = tuple(torch.tensor(t.rows, dtype=torch.long, device=device) for t in program.rings)
        local = tuple(
            (torch.tensor(c.rows, dtype=torch.long, device=device),
             VarlenBatch(lens_q=c.lens, lens_k=c.lens, causal=True, device=device))
            for c in program.local_chunks
        )
        hit = per_plan[key] = (rows, local)
    return hit


class AttentionEngine:
    """Executes a :class:`RankProgram` forward and backward with one kernel backend."""

    def __init__(
        self,
        plan: StepPlan,
        group: ZeppelinGroup,
        *,
        kernel: AttentionKernel,
        scale: float,
        routes: Sequence[Route],
        hkv: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.group = group
        self.kernel = kernel
        self.scale = scale
        self.stream = CommStream(device)
        self.router = Router(group, routes, stream=self.stream)
        routed = bool(routes)
        self.program = cached_program(plan, group.rank, self.router, routed)
        self.device = device
        self.runs = [
            RingRun(layout=t.layout, position=t.position, kernel=kernel, scale=scale, router=self.router,
                    hkv=hkv, head_dim=head_dim, dtype=dtype, device=device)
            for t in self.program.rings
        ]
        self.rows, self.local = _device_indices(
            plan, self.program, (group.rank, group.gpus_per_node, routed, device))
        self.hkv = hkv

    def _filler(
        self, run_chunk: Callable[[int], None]
    ) -> tuple[Callable[[RingTask], Callable[[int], None] | None], Callable[[], None]]:
        """-> ``(fill_for, finish)``: ``fill_for(task)`` is the ring's ``fill(j)`` (None when no chunk
        runs in it), running the chunks the plan put at step ``j``; ``finish`` runs the chunks left."""
        done: set[int] = set()

        def run(c: int) -> None:
            done.add(c)
            run_chunk(c)

        def fill_for(task: RingTask) -> Callable[[int], None] | None:
            if not task.fills:
                return None

            def fill(j: int) -> None:
                for step, c in task.fills:
                    if step == j and c not in done:
                        run(c)
            return fill

        def finish() -> None:
            for c in range(len(self.local)):
                if c not in done:
                    run(c)

        return fill_for, finish

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, list[Any]]:
        """-> ``(out [T_a, Hq, D], saved)``; ``saved``: each ring's ``(out, lse)`` (None for relays),
        then each local chunk's ``(out, lse)``, for backward."""
        out = torch.zeros_like(q)
        saved: list[Any] = []
        local: list[Any] = [None] * len(self.local)

        def run_chunk(c: int) -> None:
            rows, batch = self.local[c]
            o, lse = self.kernel.forward(q.index_select(0, rows), k.index_select(0, rows),
                                         v.index_select(0, rows), batch, self.scale)
            out.index_copy_(0, rows, o)
            local[c] = (o, lse)

        fill_for, finish = self._filler(run_chunk)
        for run, rows, task in zip(self.runs, self.rows, self.program.rings):
            if run.position is None:
                ring_forward(run, None, None)
                saved.append(None)
                continue
            q_r = q.index_select(0, rows)
            kv_r = torch.cat([k.index_select(0, rows), v.index_select(0, rows)], dim=1)
            res = ring_forward(run, q_r, kv_r, fill=fill_for(task))
            assert res is not None
            out.index_copy_(0, rows, res[0])
            saved.append(res)
        finish()
        return out, saved + local

    def backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, saved: list[Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        hkv = self.hkv
        local = saved[len(self.runs):]

        def run_chunk(c: int) -> None:
            rows, batch = self.local[c]
            o, lse = local[c]
            dq_l, dk_l, dv_l = self.kernel.backward(
                dout.index_select(0, rows), q.index_select(0, rows), k.index_select(0, rows),
                v.index_select(0, rows), o, lse, batch, self.scale)
            dq.index_copy_(0, rows, dq_l)
            dk.index_copy_(0, rows, dk_l)
            dv.index_copy_(0, rows, dv_l)

        fill_for, finish = self._filler(run_chunk)
        for run, rows, res, task in zip(self.runs, self.rows, saved, self.program.rings):
            if run.position is None:
                ring_backward(run, None, None, None, None, None)
                continue
            out_r, lse_r = res
            kv_r = torch.cat([k.index_select(0, rows), v.index_select(0, rows)], dim=1)
            grads = ring_backward(run, dout.index_select(0, rows), q.index_select(0, rows), kv_r, out_r, lse_r,
                                  fill=fill_for(task))
            assert grads is not None
            dq.index_copy_(0, rows, grads[0])
            dk.index_copy_(0, rows, grads[1][:, :hkv])
            dv.index_copy_(0, rows, grads[1][:, hkv:])
        finish()
        return dq, dk, dv


class EngineFunction(torch.autograd.Function):
    """Autograd wrapper: ``(q, k, v)`` in attention layout -> ``out``; backward through the engine."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, engine: AttentionEngine) -> torch.Tensor:
        out, saved = engine.forward(q, k, v)
        ctx.engine = engine
        ctx.saved = saved
        ctx.save_for_backward(q, k, v)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v = ctx.saved_tensors
        dq, dk, dv = ctx.engine.backward(dout.contiguous(), q, k, v, ctx.saved)
        ctx.saved = None
        return dq, dk, dv, None
