"""The attention engine: runs one rank's share of a plan on attention-layout tensors.

Input/output are this rank's tokens in the plan's *attention layout*
(``attention_layout[rank]`` ranges concatenated): ``q`` [T_a, Hq, D], ``k``,
``v`` [T_a, Hkv, D] -> ``out`` [T_a, Hq, D].

Queues, in this order on every rank: the plan's inter-node rings, its
intra-node rings (both in :attr:`StepPlan.rings` order), then all local
sequences in one causal varlen call. A rank takes part in a ring as a member
(it holds zigzag chunks) or as a relay (it carries routed parts of a cross-node
hop); relays run the ring's transfer sequence without compute. Because every
rank walks the rings in the same global order and posts each ring's transfers
in the same order, any valid plan executes without deadlock, including ranks
that belong to several rings.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..planner.plan import StepPlan
from ..planner.routing import Route
from .comm import CommStream
from .group import ZeppelinGroup
from .kernels import AttentionKernel, VarlenBatch
from .ring import RingLayout, RingRun, ring_backward, ring_forward
from .router import Router

__all__ = ["RingTask", "RankProgram", "build_program", "AttentionEngine", "EngineFunction"]


@dataclass(frozen=True, kw_only=True)
class RingTask:
    """One ring as seen by one rank.

    ``position``: ring position (None: relay only). ``rows``: attention-buffer
    rows of the rank's ring tokens in seq-major ring order (empty for relays).
    """

    layout: RingLayout
    placement: str
    position: int | None
    rows: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class RankProgram:
    """Everything rank ``rank`` runs for a plan: rings in queue order, then its local sequences.

    ``local_rows``: attention-buffer rows of its local sequences, sequence after
    sequence; ``local_lens``: their lengths; ``tokens``: attention-layout tokens.
    """

    rank: int
    rings: tuple[RingTask, ...]
    local_rows: tuple[int, ...]
    local_lens: tuple[int, ...]
    tokens: int


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
    rings = []
    for ring in plan.rings:
        layout = RingLayout(ranks=ring.ranks, lengths=tuple(plan.sequences[s].length for s in ring.seqs))
        if rank not in router.participants(ring.ranks):
            continue
        pos = layout.position(rank)
        rows: list[int] = []
        if pos is not None:
            for s_idx, start, end in layout.token_ranges(pos):
                rows += _rows(pieces[ring.seqs[s_idx]], start, end)
        rings.append(RingTask(layout=layout, placement=ring.placement, position=pos, rows=tuple(rows)))
    local_rows: list[int] = []
    local_lens: list[int] = []
    for s, seq in enumerate(plan.sequences):
        if seq.placement == "local" and seq.ranks[0] == rank:
            local_rows += _rows(pieces[s], 0, seq.length)
            local_lens.append(seq.length)
    return RankProgram(rank=rank, rings=tuple(rings), local_rows=tuple(local_rows),
                       local_lens=tuple(local_lens), tokens=plan.tokens(rank, "attention"))


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
        self.program = cached_program(plan, group.rank, self.router, bool(routes))
        self.device = device
        self.runs = [
            RingRun(layout=t.layout, position=t.position, kernel=kernel, scale=scale, router=self.router,
                    hkv=hkv, head_dim=head_dim, dtype=dtype, device=device)
            for t in self.program.rings
        ]
        self.rows = [torch.tensor(t.rows, dtype=torch.long, device=device) for t in self.program.rings]
        self.local_rows = torch.tensor(self.program.local_rows, dtype=torch.long, device=device)
        self.local_batch = VarlenBatch(lens_q=self.program.local_lens, lens_k=self.program.local_lens,
                                       causal=True, device=device)
        self.hkv = hkv

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, list[Any]]:
        """-> ``(out [T_a, Hq, D], saved)``; ``saved`` holds each queue's ``(out, lse)`` for backward."""
        out = torch.zeros_like(q)
        saved: list[Any] = []
        for run, rows in zip(self.runs, self.rows):
            if run.position is None:
                ring_forward(run, None, None)
                saved.append(None)
                continue
            q_r = q.index_select(0, rows)
            kv_r = torch.cat([k.index_select(0, rows), v.index_select(0, rows)], dim=1)
            res = ring_forward(run, q_r, kv_r)
            assert res is not None
            out.index_copy_(0, rows, res[0])
            saved.append(res)
        if self.program.local_lens:
            rows = self.local_rows
            o, lse = self.kernel.forward(q.index_select(0, rows), k.index_select(0, rows),
                                         v.index_select(0, rows), self.local_batch, self.scale)
            out.index_copy_(0, rows, o)
            saved.append((o, lse))
        return out, saved

    def backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, saved: list[Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        hkv = self.hkv
        for run, rows, res in zip(self.runs, self.rows, saved):
            if run.position is None:
                ring_backward(run, None, None, None, None, None)
                continue
            out_r, lse_r = res
            kv_r = torch.cat([k.index_select(0, rows), v.index_select(0, rows)], dim=1)
            grads = ring_backward(run, dout.index_select(0, rows), q.index_select(0, rows), kv_r, out_r, lse_r)
            assert grads is not None
            dq.index_copy_(0, rows, grads[0])
            dk.index_copy_(0, rows, grads[1][:, :hkv])
            dv.index_copy_(0, rows, grads[1][:, hkv:])
        if self.program.local_lens:
            rows = self.local_rows
            o, lse = saved[len(self.runs)]
            dq_l, dk_l, dv_l = self.kernel.backward(
                dout.index_select(0, rows), q.index_select(0, rows), k.index_select(0, rows),
                v.index_select(0, rows), o, lse, self.local_batch, self.scale)
            dq.index_copy_(0, rows, dq_l)
            dk.index_copy_(0, rows, dk_l)
            dv.index_copy_(0, rows, dv_l)
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
