"""Whole documents moved or swapped off the busiest ranks of a finished packed plan (:func:`move_whole`).

A packing (:mod:`.packed`) places documents by *estimates*: a group's work is the sum of its documents' work
at one linear cost per token, and whole documents go, heaviest first, to the least-loaded rank of the group
the group-level pass chose, never to another group's. The finished plan's prediction then differs: the linear
time per token depends on a rank's tokens, a whole document on a ring's rank pays the engine's row copies, a
ring's waits hide local work, and the last documents placed are not small against the gaps left (Llama-7B
arxiv-64k on 16 GPUs, 512k tokens, batch 0: ranks 5-7 at 123.2 ms a layer under a head-parallel ring with
nothing else, ranks 12, 13 and 15 of the other node at 131.0-131.5, predicted under the engine's charges).

:func:`move_whole` corrects that on the finished plan with :func:`~.predict.predict`'s own per-rank terms.
Without a remap a rank ``r`` takes ``attn_r + linear_ms(t_r)`` a layer, ``attn_r = tot_r + max(0, max(loc_r, o)
- (tot_r - own_r))`` when it holds whole documents, else ``tot_r`` (:func:`~.predict.rank_attention`; ``tot_r``,
``own_r`` its rings', :func:`~.predict.ring_loads`, which no move changes; ``loc_r`` its whole documents'
``local_ms`` plus their row copies where it pays them, :func:`~.predict.copied_ranks`; ``o`` a call's overhead;
``t_r`` its tokens). So ``L`` times the busiest rank's layer *is* the predicted step under those charges, before
and after the moves (:class:`Moved`; checked against ``predict`` in ``tests/planner/test_whole_moves.py``).

The busiest rank ``b`` (ties: the lower rank) gives a whole document of ``s`` tokens to a receiver ``r``, taking
back one of ``u < s`` tokens or none, where ``r`` has room (``tokens_per_gpu``) and both end below ``b``'s time
now; receivers are tried least-loaded first (ties: the lower rank) among the :data:`TARGETS` least-loaded ranks
and every ring rank whose waits would hide part of a document, and the first receiver with such a trade makes
the one with the lowest ``max(new b, new r)`` (ties: the shorter ``s``, then ``u``). One document per distinct
length is tried on each side (the lowest index). Each trade lowers the rank times sorted in descending order
(lexicographically), so the loop ends; it stops after ``2 P`` trades at most. Rings, their widths and routes
stay as they were: :func:`~.packed_search.best_packed` finishes the traded placement with the same widths and
keeps it where its step is lower.

Example (4 GPUs, no rings, no linear time, no call overhead, ``local_ms(s) = s / 1000``): ranks 0-3 holding
``[5000, 3000]``, ``[4000]``, ``[4000]``, ``[2000]`` (8, 4, 4, 2 ms). Rank 0 is busiest; the least-loaded
receiver, rank 3, can take 3000 (``max(5, 5) = 5``), take 5000 (``max(3, 7) = 7``) or swap 5000 for 2000
(``max(5, 5) = 5``; the tie goes to the shorter ``s``): 3000 moves, times (5, 4, 4, 5).
Then rank 0 (5 ms, the lower of the two busiest) holds only 5000: moving it (``max(0, 9)``), or swapping it for
4000 (``max(4, 5)``, not below 5), 2000 (``max(2, 8)``) or 3000 (``max(3, 7)``) lowers nothing: the loop ends,
the step 8 -> 5.

Pure and deterministic.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import NamedTuple, Sequence

from .cost_model import CostModel
from .engine_ring import local_copy_ms_per_token
from .partition_context import Assignment
from .plan import StepPlan
from .predict import copied_ranks, ring_loads

__all__ = ["move_whole", "trade_whole", "Moved", "TARGETS"]

TARGETS = 8
"""How many of the least-loaded ranks are offered a trade (besides ring ranks whose waits would hide a document)."""


class Moved(NamedTuple):
    """What :func:`move_whole` made: the traded placement, and the step before and after the trades (``L`` layers
    times the busiest rank's layer, :func:`~.predict.predict`'s step of a plan without a remap)."""

    assignments: list[Assignment]
    before_ms: float
    after_ms: float


def move_whole(lengths: Sequence[int], assignments: Sequence[Assignment], plan: StepPlan, cost: CostModel,
               charges: str) -> Moved | None:
    """``assignments`` (the placement ``plan`` was finished from, linear layout = attention layout) with whole
    documents traded off the busiest ranks (module docstring) and the step before and after, or ``None`` when no
    trade lowers the step or ``plan`` has a remap. Times under ``charges`` (:func:`~.predict.predict`'s)."""
    if plan.linear_layout != plan.attention_layout:
        return None
    world = cost.cluster.world_size
    loads = ring_loads(plan, cost, charges)
    tot, own = loads.total, loads.own
    copied = copied_ranks(plan)
    per_token = local_copy_ms_per_token(cost, charges)
    pays = [per_token if copied is None or r in copied else 0.0 for r in range(world)]
    return trade_whole(lengths, assignments, tot, own, pays, list(plan.rank_tokens[1]), cost)


def trade_whole(lengths: Sequence[int], assignments: Sequence[Assignment], tot: Sequence[float],
                own: Sequence[float], pays: Sequence[float], tokens: list[int], cost: CostModel) -> Moved | None:
    """The trades of :func:`move_whole` (module docstring) given each rank's ring ``tot`` and ``own`` ms a layer,
    the row-copy ms per token ``pays`` its whole documents cost on top of ``local_ms``, and its ``tokens``
    (updated in place); ``None`` when no trade lowers the step. ``cost`` gives ``local_ms``, ``linear_ms``, the
    call overhead, the layers and the cluster's ranks and ``tokens_per_gpu``."""
    world, cap = cost.cluster.world_size, cost.cluster.tokens_per_gpu
    oh = cost.call_overhead_ms
    loc = [0.0] * world
    held: list[list[int]] = [[] for _ in range(world)]
    for i, a in enumerate(assignments):
        if a.placement == "local":
            r = a.ranks[0]
            loc[r] += cost.local_ms(lengths[i]) + lengths[i] * pays[r]
            held[r].append(i)
    linear_ms = cost.linear_ms

    def time(r: int, local: float, t: int, n: int) -> float:
        """Rank ``r``'s layer with ``n`` whole documents of ``local`` ms and ``t`` tokens."""
        a = tot[r] + max(0.0, max(local, oh) - (tot[r] - own[r])) if n else tot[r]
        return a + linear_ms(t)

    def call(r: int, s: int) -> float:
        """What a whole document of ``s`` tokens adds to rank ``r``'s local work."""
        return cost.local_ms(s) + s * pays[r]

    times = [time(r, loc[r], tokens[r], len(held[r])) for r in range(world)]
    order = sorted((t, r) for r, t in enumerate(times))  # (time, rank), ascending
    waits = [t - o for t, o in zip(tot, own)]

    def hides(r: int) -> bool:
        """Whether rank ``r``'s ring waits have room for more local work."""
        return waits[r] > (max(loc[r], oh) if held[r] else 0.0)

    spare = {r for r in range(world) if hides(r)}  # ranks whose ring waits would hide part of a document
    where = [a.ranks[0] if a.placement == "local" else -1 for a in assignments]
    first = order[-1][0]
    moved = False
    kinds: list[list[tuple[int, int]] | None] = [None] * world  # _distinct(held[r]), until r changes
    for _ in range(2 * world):
        top = order[-1][0]
        b = order[bisect_left(order, (top, -1))][1]  # the busiest (ties: the lowest rank)
        targets = sorted({r for _, r in order[:TARGETS]}.union(spare), key=lambda r: (times[r], r))
        mine = _distinct(held[b], lengths)
        drop: dict[tuple[int, int], float] = {}  # (s, u) -> b's time after giving s and taking u
        best: tuple[float, int, int, int, int, int] | None = None  # value, s, u, r, i, j (j = -1: a move)
        for r in targets:
            if best is not None:
                break  # the least-loaded receiver with a move that lowers b
            if r == b:
                continue
            theirs = kinds[r]
            if theirs is None:
                theirs = kinds[r] = [(-1, 0)] + _distinct(held[r], lengths)
            room = cap - tokens[r]
            for i, s in mine:
                for j, u in theirs:
                    if u >= s:
                        break  # a swap for a longer one moves work toward b
                    if s - u > room:
                        continue
                    after_b = drop.get((s, u))
                    if after_b is None:
                        after_b = drop[(s, u)] = time(b, loc[b] - call(b, s) + (call(b, u) if j >= 0 else 0.0),
                                                      tokens[b] - s + u, len(held[b]) - (j < 0))
                    if after_b > (top - 1e-9 if best is None else best[0]):
                        continue  # no lower than b now, or than the best so far
                    after_r = time(r, loc[r] + call(r, s) - (call(r, u) if j >= 0 else 0.0), tokens[r] + s - u,
                                   len(held[r]) + (j < 0))
                    key = (max(after_b, after_r), s, u, r, i, j)
                    if key[0] < top - 1e-9 and (best is None or key < best):
                        best = key
        if best is None:
            break
        _, s, u, r, i, j = best
        for x, out, into in ((b, i, j), (r, j, i)):
            if out >= 0:
                loc[x] -= call(x, lengths[out])
                tokens[x] -= lengths[out]
                held[x].remove(out)
            if into >= 0:
                loc[x] += call(x, lengths[into])
                tokens[x] += lengths[into]
                held[x].append(into)
                where[into] = x
            del order[bisect_left(order, (times[x], x))]
            times[x] = time(x, loc[x], tokens[x], len(held[x]))
            insort(order, (times[x], x))
            if hides(x):
                spare.add(x)
            else:
                spare.discard(x)
            kinds[x] = None
        moved = True
    layers = cost.model.layers
    if not moved or layers * order[-1][0] >= layers * first - 1e-6:  # predictions are rounded to 1e-6 ms
        return None
    return Moved([Assignment("local", (where[i],)) if a.placement == "local" else a for i, a in enumerate(assignments)],
                 layers * first, layers * order[-1][0])


def _distinct(held: Sequence[int], lengths: Sequence[int]) -> list[tuple[int, int]]:
    """``(index, length)`` of one document per distinct length of ``held`` (the lowest index), shortest first."""
    seen: dict[int, int] = {}
    for i in held:
        s = lengths[i]
        if s not in seen or i < seen[s]:
            seen[s] = i
    return sorted(((i, s) for s, i in seen.items()), key=lambda x: (x[1], x[0]))
