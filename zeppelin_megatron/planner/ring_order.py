"""The global order in which every rank runs its rings (:attr:`~.plan.StepPlan.rings`).

Beside the local-slot scheduler (:mod:`.local_schedule`), which places local
sequences into the waits of the rings in this order. Integer arithmetic on the
sequences alone (no cost model), so every rank and :meth:`~.plan.StepPlan.from_json`
derive the same order.
"""

from __future__ import annotations

import heapq
from typing import Sequence

from .plan_parts import Ring

__all__ = ["ring_order"]


def ring_order(rings: Sequence[Ring], lengths: Sequence[int]) -> tuple[Ring, ...]:
    """The global order in which every rank runs its rings (each rank keeps this order).

    A rank in two rings runs them one after the other, so the members of its second
    ring wait for its first one ("convoys"); a chain of such rings costs the sum of their
    times. The order is list scheduling on an estimate of each ring's time, its per-member
    attention work ``w = sum(s^2) // g`` (token^2; integers, so every machine orders alike):
    repeatedly take the ring that can start earliest (the latest estimated free time of
    its members); ties: inter-node before intra-node, then lower ranks (the order a plain
    sort would give), then the lower part (:mod:`.ring_parts`: a ring's parts run in order); its
    members are then busy until ``start + w``. A ring whose members are free thus never queues
    behind rings it shares no rank with.

    A head-parallel ring (``Ring.a2a > 1``) is ordered by the same estimate: its members compute the
    same flops, over ``1/a`` of the heads each, so the order does not depend on the block widths (the
    width choice, :mod:`.choose_heads`, reads the all-plain plan's timeline in this very order).

    Example: equal rings ``A = (0, 1)``, ``B = (1, 2)``, ``C = (2, 3)``: ``A`` (start 0,
    lower ranks), ``C`` (start 0; ``B`` now starts at ``w``), then ``B``: two ring times,
    where the sorted order ``A, B, C`` chains all three (``B`` waits for ``A``, ``C`` for ``B``).
    """
    work = [sum(lengths[i] ** 2 for i in r.seqs) // len(r.ranks) for r in rings]
    heap = [(0, 0 if r.placement == "inter_node" else 1, r.ranks, r.part, k) for k, r in enumerate(rings)]
    heapq.heapify(heap)
    free: dict[int, int] = {}
    out: list[Ring] = []
    while heap:
        start, kind, ranks, part, k = heapq.heappop(heap)
        now = max(free.get(r, 0) for r in ranks)
        if now > start:  # its members got busier since it was queued: requeue at its real start
            heapq.heappush(heap, (now, kind, ranks, part, k))
            continue
        out.append(rings[k])
        for r in ranks:
            free[r] = now + work[k]
    return tuple(out)
