"""Fast acceptance of an attention layout written in the planner's own order (issue 14 item 4).

:func:`planner_attention_layout` builds, from a plan's sequences alone, the attention
layout :func:`~.api.plan_step` writes: on each rank, ranges by sequence index; a local
sequence ``i`` whole, ``(i, 0, length)``, on its rank; a split one its zigzag ranges
(:func:`~.zigzag.position_ranges`) on the rank at each ring position.
:func:`attention_in_planner_order` compares it with the plan's layout. Equal means two of
:func:`~.plan_check.validate_plan`'s checks hold at once: every token of the attention
layout exactly once, and each sequence held as its placement says. Not equal (another
order, a bad layout) proves nothing either way: the full check
runs and names the problem. A million local sequences: about 0.3 s instead of 0.7 s.

Both need sequences whose fields :func:`~.plan_check.validate_plan` has already checked
(ranks non-empty, distinct and in range; split sequences long enough for their ring).

Example: 1 node x 2 GPUs, sequence 0 (8 tokens) on a ring over ranks 0 and 1, sequence 1
(3 tokens) local on rank 1: ``(((0, 0, 2), (0, 6, 8)), ((0, 2, 6), (1, 0, 3)))``.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import attrgetter, itemgetter, ne
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .plan_parts import SequencePlan, TokenRange
from .zigzag import position_ranges

if TYPE_CHECKING:
    from .plan import StepPlan

__all__ = ["planner_attention_layout", "attention_in_planner_order"]


def planner_attention_layout(sequences: Sequence[SequencePlan], world: int) -> list[list[TokenRange]] | None:
    """Each rank's attention ranges as :func:`~.api.plan_step` lists them (module docstring).

    ``None`` when a local sequence's rank is not an integer. A split sequence's ranges do not
    depend on its block width ``a2a`` (:mod:`.head_parallel` runs on the zigzag layout).
    Example: ``[SequencePlan(3, "local", (1,)), SequencePlan(2, "local", (0,))]`` on 2 ranks
    -> ``[[(1, 0, 2)], [(0, 0, 3)]]``.
    """
    n = len(sequences)
    placements = list(map(attrgetter("placement"), sequences))
    lengths = list(map(attrgetter("length"), sequences))
    first = list(map(itemgetter(0), map(attrgetter("ranks"), sequences)))  # each local sequence's rank
    split = [] if placements.count("local") == n else list(compress(range(n), map(ne, placements, repeat("local"))))
    for i in split:
        first[i] = world  # grouped after every rank, then dropped
    rank = np.array(first)
    if rank.dtype.kind != "i":  # ranks that are not all integers: left to the full check
        return None
    order = np.argsort(rank, kind="stable")  # by rank, each rank's sequences in index order
    bounds = np.searchsorted(rank[order], np.arange(world + 1)).tolist()
    ids = order.tolist()
    out: list[list[TokenRange]] = []
    for r in range(world):
        lo, hi = bounds[r], bounds[r + 1]
        if lo == hi:  # many ranks hold no local sequence (large clusters, few sequences)
            out.append([])
            continue
        mine = ids[lo:hi]
        out.append(list(zip(mine, repeat(0), map(lengths.__getitem__, mine))))
    touched: set[int] = set()
    for i in split:
        s = sequences[i]
        g = len(s.ranks)
        for p, r in enumerate(s.ranks):
            out[r].extend(position_ranges(i, s.length, g, p))
            touched.add(r)
    for r in touched:
        out[r].sort()  # by sequence index (one sequence's ranges by start), as plan_step appends them
    return out


def attention_in_planner_order(plan: "StepPlan") -> bool:
    """The plan's attention layout equals :func:`planner_attention_layout` of its sequences, range for range.

    True proves the layout covers every token once and holds each sequence as its placement
    says; False proves nothing (the full check decides).
    """
    world = plan.nodes * plan.gpus_per_node
    built = planner_attention_layout(plan.sequences, world)
    if built is None:
        return False
    # tuple() of a tuple is the tuple itself: one comparison, range for range (lists compare as tuples).
    return tuple(map(tuple, built)) == tuple(map(tuple, plan.attention_layout))
