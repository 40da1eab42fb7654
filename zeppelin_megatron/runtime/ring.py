"""Zigzag ring attention over one ring of a plan: forward, backward and the ring arithmetic.

Layout. A ring of ``g`` ranks holds sequences ``s`` split into ``2g`` chunks
(:mod:`zeppelin_megatron.planner.zigzag`); ring position ``i`` holds chunks
``i`` (*early*) and ``2g-1-i`` (*late*). On every rank the ring's tokens are
kept *seq-major*: ``[s0 early, s0 late, s1 early, s1 late, ...]``; K and V are
packed as one ``kv`` buffer [n_i, 2*Hkv, D] (K heads first) so one message per
hop carries both.

Steps. At step ``j`` position ``i`` holds the K/V of ``src = ring_source(i, j, g)``
and computes one varlen call for all the ring's sequences:

* ``src == i`` (diagonal, step 0): all local q against all local K/V, causal;
  seq-major order makes "causal within [early, late]" exactly the global mask;
* ``src < i``: src's early chunk precedes both local chunks -> all local q
  attend it fully; src's late chunk comes after both -> skipped;
* ``src > i``: both of src's chunks lie between the local early and late
  chunks -> only the local late chunk attends, to all of src's K/V, fully.

Worked example, g = 2, one sequence of 8 tokens (chunks of 2: c0..c3), so
position 0 holds c0+c3 = tokens [0,2)+[6,8) and position 1 holds c1+c2 = [2,6):
step 1 at position 0 has src = 1 > 0, so q = c3 attends k = c1+c2; at
position 1 src = 0 < 1, so q = c1+c2 attends k = c0.

Partial results are merged with the log-sum-exp: with block ``(o_b, l_b)`` and
running ``(o, l)``: ``l' = logaddexp(l, l_b)``, ``o' = o e^{l-l'} + o_b e^{l_b-l'}``.

Backward re-circulates K/V the same way and, recompute-free, asks the kernel
for each block's gradients given the final ``out`` and ``lse``. dQ stays
local; each position's dK/dV accumulator travels one hop behind its K/V,
collecting every position's contribution, and arrives home after ``g`` hops.

Transfers of step ``j`` are posted before step ``j``'s compute and waited on
after it. An optional ``fill(j)`` callback runs in between at every step
``j < g - 1`` (backward: after step ``j``'s dK/dV accumulator is posted too),
while step ``j``'s K/V transfer is in flight: the engine runs the local work
the plan put at that step (``StepPlan.local_slots``), so it overlaps the
transfer or a late partner. ``fill`` computes only; it never communicates.
Ranks that only relay routed traffic for a ring (proxies) run the same loop
with no compute, so every rank posts the same sequence of transfers.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import torch

from ..planner.zigzag import ring_source, zigzag_ranges
from .kernels import AttentionKernel, VarlenBatch, acc_dtype
from .router import Message, Router, Schedule

__all__ = ["RingLayout", "RingCache", "ring_forward", "ring_backward", "ZigzagRingAttention", "merge_lse"]

KV_TAG = 0
ACC_TAG = 1 << 20


@dataclass(frozen=True, kw_only=True)
class RingLayout:
    """The ring's ranks (ring order) and its sequences' lengths; all ring rank arithmetic lives here."""

    ranks: tuple[int, ...]
    lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.ranks) < 2 or len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"a ring needs >= 2 distinct ranks, got {list(self.ranks)}")
        if not self.lengths:
            raise ValueError("a ring needs at least one sequence")
        for n in self.lengths:
            if n < 2 * len(self.ranks):
                raise ValueError(f"sequence of length {n} is too short for a ring of {len(self.ranks)}")

    @property
    def size(self) -> int:
        return len(self.ranks)

    def position(self, rank: int) -> int | None:
        """Ring position of Zeppelin rank ``rank`` (None when not a member)."""
        return self.ranks.index(rank) if rank in self.ranks else None

    def next_rank(self, pos: int) -> int:
        """Rank that receives position ``pos``'s K/V at every step (K/V move ``p -> p + 1``)."""
        return self.ranks[(pos + 1) % self.size]

    def prev_position(self, pos: int) -> int:
        """Position whose K/V (or dK/dV) ``pos`` receives at every step (``p - 1 -> p``)."""
        return (pos - 1) % self.size

    def prev_rank(self, pos: int) -> int:
        return self.ranks[self.prev_position(pos)]

    def source(self, pos: int, step: int) -> int:
        """Position whose K/V ``pos`` holds at ``step``."""
        return ring_source(pos, step, self.size)

    @cached_property
    def _chunks(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """[pos][seq] -> (early, late) chunk lengths."""
        out = []
        for p in range(self.size):
            row = []
            for n in self.lengths:
                (a0, a1), (b0, b1) = zigzag_ranges(n, self.size, p)
                row.append((a1 - a0, b1 - b0))
            out.append(tuple(row))
        return tuple(out)

    def early_lens(self, pos: int) -> tuple[int, ...]:
        return tuple(e for e, _ in self._chunks[pos])

    def late_lens(self, pos: int) -> tuple[int, ...]:
        return tuple(l for _, l in self._chunks[pos])

    def seq_lens(self, pos: int) -> tuple[int, ...]:
        """Tokens of each sequence at ``pos`` (early + late)."""
        return tuple(e + l for e, l in self._chunks[pos])

    def tokens(self, pos: int) -> int:
        return sum(self.seq_lens(pos))

    def token_ranges(self, pos: int) -> tuple[tuple[int, int, int], ...]:
        """``(seq index in the ring, start, end)`` of pos's tokens in seq-major order."""
        out = []
        for s, n in enumerate(self.lengths):
            early, late = zigzag_ranges(n, self.size, pos)
            out += [(s, *early), (s, *late)]
        return tuple(out)

    def rows(self, pos: int, part: str) -> list[int]:
        """Row numbers of the ``early`` or ``late`` chunks in pos's seq-major buffer.

        Example: chunk lengths (2, 2) and (3, 2) -> early rows [0, 1, 4, 5, 6],
        late rows [2, 3, 7, 8].
        """
        rows: list[int] = []
        off = 0
        for e, l in self._chunks[pos]:
            rows += range(off, off + e) if part == "early" else range(off + e, off + e + l)
            off += e + l
        return rows

    def messages(self, step: int, row_numel: int) -> list[Message]:
        """Hops of ``step``: every position sends the K/V (or dK/dV) it holds to the next one."""
        return [
            Message(src=self.ranks[p], dst=self.next_rank(p),
                    numel=self.tokens(self.source(p, step)) * row_numel)
            for p in range(self.size)
        ]


@dataclass(kw_only=True)
class RingCache:
    """Device-side batches and row indices for one position of one ring (built once per call)."""

    layout: RingLayout
    position: int
    device: torch.device
    _batches: dict[int, VarlenBatch] = field(default_factory=dict)
    _rows: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)

    def batch(self, src: int) -> VarlenBatch:
        """The varlen batch of the step whose K/V come from position ``src``."""
        hit = self._batches.get(src)
        if hit is None:
            lay, i = self.layout, self.position
            if src == i:
                hit = VarlenBatch(lens_q=lay.seq_lens(i), lens_k=lay.seq_lens(i), causal=True, device=self.device)
            elif src < i:
                hit = VarlenBatch(lens_q=lay.seq_lens(i), lens_k=lay.early_lens(src), causal=False,
                                  device=self.device)
            else:
                hit = VarlenBatch(lens_q=lay.late_lens(i), lens_k=lay.seq_lens(src), causal=False,
                                  device=self.device)
            self._batches[src] = hit
        return hit

    def rows(self, pos: int, part: str) -> torch.Tensor:
        hit = self._rows.get((pos, part))
        if hit is None:
            hit = torch.tensor(self.layout.rows(pos, part), dtype=torch.long, device=self.device)
            self._rows[(pos, part)] = hit
        return hit


# layout -> {(position, device): RingCache}; a cache depends only on these, so every layer
# of a step (one RingLayout object per ring, from the engine's memoised program) shares it.
_CACHES: "weakref.WeakKeyDictionary[RingLayout, dict[tuple[int, torch.device], RingCache]]" = (
    weakref.WeakKeyDictionary()
)


def ring_cache(layout: RingLayout, position: int, device: torch.device) -> RingCache:
    """The :class:`RingCache` of ``(layout, position, device)``, built on first use."""
    per_layout = _CACHES.setdefault(layout, {})
    hit = per_layout.get((position, device))
    if hit is None:
        hit = per_layout[(position, device)] = RingCache(layout=layout, position=position, device=device)
    return hit


def merge_lse(
    out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial softmax results over disjoint key sets.

    ``out``, ``out_b`` [T, H, D] (accumulation dtype), ``lse``, ``lse_b`` [T, H].
    """
    new = torch.logaddexp(lse, lse_b)
    w = torch.exp(lse - new).unsqueeze(-1)
    w_b = torch.exp(lse_b - new).unsqueeze(-1)
    return out * w + out_b.to(out.dtype) * w_b, new


@dataclass(frozen=True, kw_only=True)
class RingRun:
    """What a ring execution needs besides tensors."""

    layout: RingLayout
    position: int | None  # None: this rank only relays routed traffic
    kernel: AttentionKernel
    scale: float
    router: Router
    hkv: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @cached_property
    def cache(self) -> RingCache | None:
        if self.position is None:
            return None
        return ring_cache(self.layout, self.position, self.device)

    @cached_property
    def _schedules(self) -> dict[int, Schedule]:
        return {}

    def schedule(self, step: int) -> Schedule:
        """The routed hops of ``step``; K/V and dK/dV hops have the same sizes, so forward and
        backward share one build per step."""
        hit = self._schedules.get(step)
        if hit is None:
            msgs = self.layout.messages(step, 2 * self.hkv * self.head_dim)
            hit = self._schedules[step] = self.router.schedule(msgs, self.layout.ranks)
        return hit

    def start(self, step: int, payload: torch.Tensor | None, dtype: torch.dtype, tag: int) -> Any:
        """Post the hops of ``step`` (K/V or accumulators); ``payload`` is what this rank holds."""
        schedule = self.schedule(step)
        payloads = {self.position: payload.reshape(-1)} if self.position is not None else {}
        return self.router.start(schedule, payloads, dtype=dtype, device=self.device, tag_base=tag)

    def received(self, transfer: Any, step: int) -> torch.Tensor | None:
        """Wait for ``transfer`` of ``step``; -> what this position now holds, [n_src, 2*Hkv, D]."""
        got = transfer.wait()
        if self.position is None:
            return None
        prev = self.layout.prev_position(self.position)
        n = self.layout.tokens(self.layout.source(prev, step))
        return got[prev].view(n, 2 * self.hkv, self.head_dim)


def ring_forward(
    run: RingRun, q: torch.Tensor | None, kv: torch.Tensor | None, *, fill: Callable[[int], None] | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Forward over the ring. ``q`` [n_i, Hq, D], ``kv`` [n_i, 2*Hkv, D] seq-major.

    -> ``(out [n_i, Hq, D] q.dtype, lse [n_i, Hq] accumulation dtype)``; None for a relay.
    ``fill(j)``: called at each step ``j < g - 1``, after its compute, before its wait.
    """
    g, i, hkv = run.layout.size, run.position, run.hkv
    cache = run.cache
    out_acc = lse_acc = q_late = None
    if i is not None:
        assert q is not None and kv is not None and cache is not None
        q_late = q.index_select(0, cache.rows(i, "late"))
    for j in range(g):
        pending = run.start(j, kv, run.dtype, KV_TAG) if j < g - 1 else None
        if i is not None:
            src = run.layout.source(i, j)
            batch = cache.batch(src)
            if src == i:
                o, l = run.kernel.forward(q, kv[:, :hkv], kv[:, hkv:], batch, run.scale)
                out_acc, lse_acc = o.to(acc_dtype(q.dtype)), l
            elif src < i:
                kv_e = kv.index_select(0, cache.rows(src, "early"))
                o, l = run.kernel.forward(q, kv_e[:, :hkv], kv_e[:, hkv:], batch, run.scale)
                out_acc, lse_acc = merge_lse(out_acc, lse_acc, o, l)
            else:
                o, l = run.kernel.forward(q_late, kv[:, :hkv], kv[:, hkv:], batch, run.scale)
                late = cache.rows(i, "late")
                o_m, l_m = merge_lse(out_acc.index_select(0, late), lse_acc.index_select(0, late), o, l)
                out_acc.index_copy_(0, late, o_m)
                lse_acc.index_copy_(0, late, l_m)
        if pending is not None:
            if fill is not None:
                fill(j)
            kv = run.received(pending, j)
    if i is None:
        return None
    return out_acc.to(q.dtype), lse_acc


def ring_backward(
    run: RingRun,
    dout: torch.Tensor | None,
    q: torch.Tensor | None,
    kv: torch.Tensor | None,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    *,
    fill: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Backward over the ring. -> ``(dq [n_i, Hq, D], dkv [n_i, 2*Hkv, D])`` in q's dtype; None for a relay.

    ``fill(j)``: called at each step ``j < g - 1``, after its compute and
    accumulator post, before its K/V wait.
    """
    g, i, hkv = run.layout.size, run.position, run.hkv
    cache = run.cache
    acc_t = acc_dtype(run.dtype)
    dq = late = q_late = dout_late = out_late = lse_late = None
    if i is not None:
        assert q is not None and kv is not None and dout is not None and out is not None and lse is not None
        late = cache.rows(i, "late")
        q_late, dout_late = q.index_select(0, late), dout.index_select(0, late)
        out_late, lse_late = out.index_select(0, late), lse.index_select(0, late)
        dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    acc_pending = None
    acc = None
    for j in range(g):
        kv_pending = run.start(j, kv, run.dtype, KV_TAG) if j < g - 1 else None
        blk = None
        if i is not None:
            src = run.layout.source(i, j)
            batch = cache.batch(src)
            if src == i:
                dq_b, dk_b, dv_b = run.kernel.backward(dout, q, kv[:, :hkv], kv[:, hkv:], out, lse, batch, run.scale)
                dq += dq_b
                blk = (None, dk_b, dv_b)
            elif src < i:
                early = cache.rows(src, "early")
                kv_e = kv.index_select(0, early)
                dq_b, dk_b, dv_b = run.kernel.backward(
                    dout, q, kv_e[:, :hkv], kv_e[:, hkv:], out, lse, batch, run.scale)
                dq += dq_b
                blk = (early, dk_b, dv_b)
            else:
                dq_b, dk_b, dv_b = run.kernel.backward(
                    dout_late, q_late, kv[:, :hkv], kv[:, hkv:], out_late, lse_late, batch, run.scale)
                dq.index_add_(0, late, dq_b.to(acc_t))
                blk = (None, dk_b, dv_b)
        if acc_pending is not None:
            acc = run.received(acc_pending, j - 1)  # accumulator of this step's source
        elif i is not None:
            acc = torch.zeros(kv.shape, dtype=acc_t, device=kv.device)
        if blk is not None:
            rows, dk_b, dv_b = blk
            d = torch.cat([dk_b, dv_b], dim=1).to(acc_t)
            if rows is None:
                acc += d
            else:
                acc.index_add_(0, rows, d)
        acc_pending = run.start(j, acc, acc_t, ACC_TAG)
        if kv_pending is not None:
            if fill is not None:
                fill(j)
            kv = run.received(kv_pending, j)
    home = run.received(acc_pending, g - 1)  # own accumulator, back after g hops
    if i is None:
        return None
    return dq.to(run.dtype), home.to(run.dtype)


class ZigzagRingAttention(torch.autograd.Function):
    """Differentiable ring attention for one ring, on this rank's seq-major ring tokens.

    ``q`` [n_i, Hq, D], ``k``, ``v`` [n_i, Hkv, D] -> out [n_i, Hq, D]. Every
    member (and every proxy, with empty tensors of the right dtype and head
    shape) must call it with the same ``run.layout`` and router.
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, run: RingRun) -> torch.Tensor:
        member = run.position is not None
        kv = torch.cat([k, v], dim=1) if member else None
        res = ring_forward(run, q if member else None, kv)
        ctx.run = run
        if res is None:
            ctx.save_for_backward(q, kv if kv is not None else k)
            return torch.zeros_like(q)
        out, lse = res
        ctx.save_for_backward(q, kv, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        run: RingRun = ctx.run
        if run.position is None:
            q, k = ctx.saved_tensors
            ring_backward(run, None, None, None, None, None)
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(k), None
        q, kv, out, lse = ctx.saved_tensors
        res = ring_backward(run, dout.contiguous(), q, kv, out, lse)
        assert res is not None
        dq, dkv = res
        return dq, dkv[:, :run.hkv], dkv[:, run.hkv:], None
