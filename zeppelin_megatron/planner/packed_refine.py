"""Refining the kept packed plan: a whole document on a group's busiest rank joins the group's ring.

A packing (:mod:`.packed`) weighs every document alone: a sharded one by its own ring (:func:`~.packed.sharded_ms`,
one call and its all-to-alls, or ``cp`` calls and K/V hops), a whole one by ``local_ms``. Groups then end
level in that model, but two things it cannot see make ranks uneven inside a group:

* a whole document lands on one rank of its group, a lump the group's other ranks do not share;
* a ring runs *all* its documents in the same calls and all-to-alls, so one more document on a ring costs
  its kernel work and bytes, not another call overhead and latency: much less than :func:`~.packed.sharded_ms`
  charged it, so documents the packing kept whole (below :func:`~.packed.split_pays` or the threshold) would
  have been cheaper on the ring.

:func:`refine_packed` takes the finished winner of :func:`~.packed_search.best_packed` and, in rounds, for each
group (the ranks of one split document's ring, at least two) whose busiest rank ``b`` is within :data:`NEAR` of
the predicted step, proposes one whole document of ``b`` (``s >= 2 g`` tokens, as zigzag needs; one that leaves
every rank of the group within ``tokens_per_gpu``) for the group's ring: the one with the lowest estimate of the
group's busiest rank afterwards, ``max(t_b - w, t_2) + w / g`` (``t_b``, ``t_2``: the busiest and the next
busiest rank's predicted times, ``w = L (local_ms(s) + linear_ms(s))`` the document's time on one GPU, spread
over the ``g`` ranks), where that estimate gains at least :data:`MIN_GAIN` of the step. A round is tried only
when every rank at the step is in a group with a proposal (groups share no rank, so otherwise the step cannot
fall). One finish and prediction per round (under :data:`~.packed.CHARGES`, as the candidates were compared)
judges its moves: a move stays where its group's busiest rank got faster, the others are not proposed again;
the round is kept only if the step did not get slower (a second finish when some moves were dropped). At most
:data:`ROUNDS` rounds. Moves only take documents off a rank onto a ring the rank already belongs to, so nothing
else about the placement changes; block widths, routes and local slots are chosen again by the finish.

Example (Llama-7B arxiv-64k, 16 x 8 H100s, batch 0 of seed 0, 86 documents; simulated): best_packed keeps a
led packing, the two longest documents on 32 ranks and node-wide head-parallel groups after it; whole
documents of 1-3k tokens sit on single ranks, e.g. 3126 on rank 72, whose node's busiest rank is at 39.98 ms a
layer predicted against 34.9 for its node's mean. Three rounds (4, 7 and 3 proposals) move 14 such documents
onto their node's ring (Ulysses, width 8): charged prediction 1315 -> 1182 ms, simulated 1291 -> 1182
(docs/planner.md, "Packed candidates"). Pure and deterministic.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .cost_model import CostModel
from .options import PlannerOptions
from .packed import CHARGES
from .partition_context import Assignment
from .plan import Prediction, StepPlan
from .predict import predict
from .zigzag import zigzag_counts

__all__ = ["refine_packed", "refine_moves", "ROUNDS", "NEAR"]

ROUNDS = 4
"""Rounds of :func:`refine_packed` at most (each one finish and prediction, two when some moves are dropped)."""

NEAR = 0.97
"""A group is refined when its busiest rank's predicted time is at least this fraction of the predicted step:
a group far below the step cannot lower it, and its moves would only cost planning time."""

MIN_GAIN = 0.005
"""A move is proposed only where its estimate (module docstring) lowers its group's busiest rank by at least this
fraction of the predicted step: smaller gains are inside the estimate's error and would cost a finish each."""

_EPS = 1e-6  # predictions are rounded to 1e-6 ms


def refine_moves(lengths: Sequence[int], cost: CostModel, options: PlannerOptions,
                 assignments: Sequence[Assignment], rank_ms: Sequence[float],
                 tried: set[tuple[int, tuple[int, ...]]]) -> dict[int, Assignment]:
    """One round's moves (module docstring): ``{sequence index: its new assignment}``, at most one per group.

    ``rank_ms``: the predicted per-rank times of the plan of ``assignments``; ``tried``: ``(sequence, group)``
    pairs not to propose again. A group is the rank tuple of a split assignment (``len >= 2``); only
    placements ``options`` allows are proposed, and only where every rank of the group keeps within
    ``tokens_per_gpu``. Example: 1 node x 2 GPUs, ``[8000, 3000, 1000]`` as ring ``(0, 1)``, 3000 on rank 0
    and 1000 on rank 1, rank 0 the busier and near the step: ``{1: Assignment("intra_node", (0, 1))}``
    (3000 >= 2 * 2 tokens, and its time is the closer to rank 0's excess of the two documents on it: the only
    one)."""
    cl = cost.cluster
    cap, gpn, layers = cl.tokens_per_gpu, cl.gpus_per_node, cost.model.layers
    tokens = [0] * cl.world_size
    local_on: dict[int, list[int]] = {}
    groups: dict[tuple[int, ...], None] = {}  # insertion order: first sequence of each group
    for i, (s, a) in enumerate(zip(lengths, assignments)):
        if a.placement == "local":
            tokens[a.ranks[0]] += s
            local_on.setdefault(a.ranks[0], []).append(i)
            continue
        groups.setdefault(a.ranks)
        for r, t in zip(a.ranks, zigzag_counts(s, len(a.ranks))):
            tokens[r] += t
    step = max(rank_ms)
    moves: dict[int, Assignment] = {}
    for g in groups:
        busiest = max(g, key=lambda r: (rank_ms[r], -r))
        if rank_ms[busiest] < NEAR * step:
            continue
        others = max((rank_ms[r] for r in g if r != busiest), default=0.0)
        placement = "intra_node" if len({r // gpn for r in g}) == 1 else "inter_node"
        if placement not in options.placements:
            continue
        best: tuple[float, int] | None = None
        for i in local_on.get(busiest, ()):
            s = lengths[i]
            if s < 2 * len(g) or (i, g) in tried:
                continue
            if any(tokens[r] - (s if r == busiest else 0) + t > cap for r, t in zip(g, zigzag_counts(s, len(g)))):
                continue
            whole = layers * (cost.local_ms(s) + cost.linear_ms(s))
            est = max(rank_ms[busiest] - whole, others) + whole / len(g)
            if est <= rank_ms[busiest] - MIN_GAIN * step and (best is None or (est, i) < best):
                best = (est, i)
        if best is not None:
            moves[best[1]] = Assignment(placement, g)
    return moves


def refine_packed(lengths: Sequence[int], cost: CostModel, options: PlannerOptions,
                  assignments: Sequence[Assignment], plan: StepPlan,
                  finish: Callable[[Sequence[Assignment]], StepPlan]) -> StepPlan:
    """``plan`` (the finished placement ``assignments``) after at most :data:`ROUNDS` rounds of
    :func:`refine_moves` (module docstring); its predicted step under :data:`~.packed.CHARGES` is never above
    ``plan``'s. ``finish`` turns assignments into a finished plan (as :func:`~.packed_search.best_packed` got it)."""
    cur_a = list(assignments)
    cur, pred = plan, predict(plan, cost, charges=CHARGES)
    tried: set[tuple[int, tuple[int, ...]]] = set()
    for _ in range(ROUNDS):
        moves = refine_moves(lengths, cost, options, cur_a, pred.rank_ms, tried)
        moved = {r for a in moves.values() for r in a.ranks}
        top = max(pred.rank_ms)
        if not moves or any(ms >= top - _EPS and r not in moved for r, ms in enumerate(pred.rank_ms)):
            break  # a rank at the step keeps its time: no round can lower the step (groups share no rank)
        tried.update((i, a.ranks) for i, a in moves.items())
        new = list(cur_a)
        for i, a in moves.items():
            new[i] = a
        cand = finish(new)
        got = predict(cand, cost, charges=CHARGES)
        kept = [i for i, a in moves.items() if _group_max(got, a.ranks) < _group_max(pred, a.ranks) - _EPS]
        if not kept:
            continue
        if len(kept) < len(moves):
            new = list(cur_a)
            for i in kept:
                new[i] = moves[i]
            cand = finish(new)
            got = predict(cand, cost, charges=CHARGES)
        if got.step_ms > pred.step_ms + _EPS:
            break
        cur_a, cur, pred = new, cand, got
    return cur


def _group_max(pred: Prediction, ranks: tuple[int, ...]) -> float:
    return max(pred.rank_ms[r] for r in ranks)
