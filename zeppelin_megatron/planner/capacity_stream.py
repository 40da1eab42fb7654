"""Closing GPUs one after another: a capacity rule for a cluster filled to the token (:func:`stream_fill`).

GPU ``i`` (in rank order) takes the longest unplaced sequence that fits its free tokens ``f`` whole, skipping one
that would leave exactly 1 token free (no ring position holds 1) while another fits; when none fits, one unplaced
sequence goes on a ring with a position on GPU ``i`` holding exactly ``f`` tokens (else as many as fit) and its other
positions on the GPUs with the most room (:func:`_closing_ring`); when neither places anything, GPU ``i`` keeps its
free tokens and the next one is filled. Where :func:`~.capacity_level.level_fill` spreads the free tokens evenly (and
so strands a sequence when fewer than its margin are left per GPU), this rule leaves every GPU but the last few
exactly full, which places batches that fill the cluster to within a few tokens. ``reserve``: the shortest sequences
of at most that many tokens in all are placed last, after the others (short sequences close the last GPUs best).

Example: 3 GPUs of 9 tokens, ``[2, 15, 8, 2]`` (27 tokens, every GPU full): GPU 0 skips 8 (it would leave 1
free) and takes both 2s (5 free); 15 then goes on a ring of 3 holding 5 + 5 + 5, position 0 on GPU 0 (now full) and
the others on GPUs 1 and 2 (4 free each); GPU 1 puts 8 on a ring of 2 (4 + 4) with GPU 2. The four rules before it and
:func:`~.capacity_level.level_fill` all strand a sequence on this batch.
"""

from __future__ import annotations

from bisect import bisect_right

from .partition_context import Assignment, PartitionContext, assignments_of
from .plan_parts import PlanError
from .zigzag import zigzag_counts, zigzag_tokens

__all__ = ["stream_fill"]


class _Pool:
    """Unplaced sequences by length: ``sizes`` (distinct, ascending) and ``waiting[s]`` (indices, lowest last)."""

    def __init__(self, lengths: list[int], ids: list[int]) -> None:
        self.waiting: dict[int, list[int]] = {}
        for i in ids:  # ascending by length, then by descending index
            self.waiting.setdefault(lengths[i], []).append(i)
        self.sizes = sorted(self.waiting)

    def take(self, s: int) -> int:
        """The lowest unplaced index of length ``s``, removed."""
        ids = self.waiting[s]
        i = ids.pop()
        if not ids:
            del self.waiting[s]
            self.sizes.remove(s)
        return i


def stream_fill(ctx: PartitionContext, reserve: int = 0) -> list[Assignment]:
    """Every sequence's assignment by closing GPUs in rank order (module docstring); raises :class:`PlanError`
    naming a sequence left when every GPU is full or holds too few free tokens for the sequences left."""
    lengths, cap, world = list(ctx.lengths), ctx.cap, ctx.cluster.world_size
    free = [cap] * world
    groups: list[tuple[int, ...]] = [()] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], -i))  # ascending; ties: lowest index last
    kept = held = 0
    while kept < len(order) and held + lengths[order[kept]] <= reserve:
        held += lengths[order[kept]]
        kept += 1
    pools = [_Pool(lengths, order[kept:]), _Pool(lengths, order[:kept])]  # the reserve: placed last
    pool = pools.pop(0)
    gpu = 0
    while pool.sizes or pools:
        if not pool.sizes:
            pool, gpu = pools.pop(0), 0
            continue
        sizes = pool.sizes
        while gpu < world and free[gpu] == 0:
            gpu += 1
        if gpu == world:
            i = pool.waiting[sizes[-1]][-1]
            raise PlanError(
                f"sequence {i} of length {lengths[i]} does not fit: every GPU is full or holds too few free tokens "
                f"for the sequences left ({sum(free)} tokens free on {sum(f > 0 for f in free)} GPUs, tokens_per_gpu "
                f"= {cap}, closing GPUs in rank order); raise tokens_per_gpu or add GPUs"
            )
        f = free[gpu]
        k = bisect_right(sizes, f)
        if k > 1 and sizes[k - 1] == f - 1 and sizes[0] > 1:
            k -= 1  # 1 token left free would stay free (no ring position holds 1): the next longest instead
        if k:
            s = sizes[k - 1]
            groups[pool.take(s)] = (gpu,)
            free[gpu] -= s
            continue
        ring = _closing_ring(sizes, gpu, free)
        if ring is None:
            gpu += 1  # nothing places a token on this GPU: its free tokens stay free
            continue
        s, ranks = ring
        groups[pool.take(s)] = ranks
        for p, r in enumerate(ranks):
            free[r] -= zigzag_tokens(s, len(ranks), p)
    return assignments_of(groups, ctx.cluster)


def _closing_ring(sizes: list[int], gpu: int, free: list[int]) -> tuple[int, tuple[int, ...]] | None:
    """``(length, ranks)``: a ring of one of ``sizes`` (each longer than ``f = free[gpu]``) with a position on ``gpu``
    holding exactly ``f`` tokens (the longest such length, then the fewest positions), else the most it can; the other
    positions, most tokens first, on the other GPUs with the most room (ties: lower rank). ``None`` when no ring fits.

    A ring of ``g`` holds ``2b``, ``2b + 1`` or ``2b + 2`` tokens a position (``b = s // 2g``), so only ``g`` from
    about ``s / (f + 2)`` to ``s / (f - 2)`` can put ``f`` on the GPU. Example: ``f = 3``, ``s = 7``: ``g = 2`` holds
    4 + 3 (``b = 1``), so position 1 (3 tokens) on ``gpu`` and position 0 on the roomiest other GPU.
    """
    f = free[gpu]
    roomy = sorted((r for r in range(len(free)) if r != gpu and free[r] > 0), key=lambda r: (-free[r], r))
    best: tuple[int, int, int, tuple[int, ...]] | None = None  # (tokens on gpu, length, -g, ranks)
    for s in reversed(sizes):
        lo = max(2, -(-s // (f + 2)) - 1)
        hi = min(len(roomy) + 1, s // 2, s // max(1, f - 2) + 1)
        for g in range(lo, hi + 1):
            counts = zigzag_counts(s, g)
            fit = [p for p in range(g) if counts[p] <= f]
            if not fit:
                continue
            here = max(fit, key=lambda p: (counts[p], -p))
            others = sorted((p for p in range(g) if p != here), key=lambda p: (-counts[p], p))
            if any(free[r] < counts[p] for p, r in zip(others, roomy)):
                continue
            ranks = [gpu] * g
            for p, r in zip(others, roomy):
                ranks[p] = r
            if counts[here] == f:
                return s, tuple(ranks)
            if best is None or (counts[here], s, -g) > best[:3]:
                best = (counts[here], s, -g, tuple(ranks))
    return None if best is None else (best[1], best[3])
