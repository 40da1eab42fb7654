"""Fast acceptance of an attention layout written in the planner's own order (issue 14 item 4).

:func:`planner_attention_layout` builds, from a plan's sequences alone, the by-index
attention layout: on each rank, ranges by sequence index; a local
sequence ``i`` whole, ``(i, 0, length)``, on its rank; a split one its zigzag ranges
(:func:`~.zigzag.position_ranges`) on the rank at each ring position.
:func:`engine_attention_layout` builds the *engine order* :func:`~.api.plan_step` writes
(issue 12 item 4: ring by ring, then local chunks, so the engine slices rows instead of
gathering them); for a plan without rings and local slots the two are the same.
:func:`attention_in_planner_order` compares them with the plan's layout. Equal means two of
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

from .plan_parts import LocalSlot, RemapSlot, Ring, SequencePlan, TokenRange
from .zigzag import ring_ranges

if TYPE_CHECKING:
    from .plan import StepPlan

__all__ = ["planner_attention_layout", "engine_attention_layout", "attention_in_planner_order"]


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
        for r, ranges in zip(s.ranks, ring_ranges(i, s.length, g)):
            out[r].extend(ranges)
            touched.add(r)
    for r in touched:
        out[r].sort()  # by sequence index (one sequence's ranges by start), as plan_step appends them
    return out


def engine_attention_layout(sequences: Sequence[SequencePlan], rings: Sequence[Ring],
                            local_slots: Sequence[LocalSlot], world: int,
                            remap_slots: Sequence[RemapSlot] = ()) -> list[list[TokenRange]]:
    """Each rank's attention ranges in *engine order*, the order :func:`~.api.plan_step` writes them
    in: ring by ring (``rings``: :attr:`~.plan.StepPlan.rings` order), each ring's sequences in its
    order, each one's zigzag ranges (:func:`~.zigzag.position_ranges`: early chunk, then late), so a
    member's ring rows (:attr:`~.lowering_parts.RingPart.rows`, seq-major) are one contiguous range;
    then the local sequences of each slot (``local_slots`` sorted by ``(ring, step, seqs)``, the
    lowering's chunk order), the rank's other local sequences by index, then the sequences of its
    ``remap_slots`` (``to_attention``'s, then ``to_linear``'s), so every local chunk's
    rows (:attr:`~.lowering_parts.LocalChunk.rows`) are one range too. A slot's sequence that is
    not local on the slot's rank, or already placed, is skipped (it lands with the rest), so the
    result holds every token once whatever the slots say.

    Example: 1 node x 2 GPUs, sequence 0 (3 tokens) local on rank 1, sequence 1 (8 tokens) on a
    ring over ranks 0 and 1, no slots: ``[[(1, 0, 2), (1, 6, 8)], [(1, 2, 6), (0, 0, 3)]]``.
    """
    out: list[list[TokenRange]] = [[] for _ in range(world)]
    for ring in rings:
        g = len(ring.ranks)
        per_seq = [ring_ranges(i, sequences[i].length, g) for i in ring.seqs]
        for p, r in enumerate(ring.ranks):
            mine = out[r]
            for ranges in per_seq:
                mine.extend(ranges[p])
    placed: set[int] = set()
    for x in sorted(local_slots, key=lambda x: (x.ring, x.step, x.seqs)):
        for i in x.seqs:
            s = sequences[i] if isinstance(i, int) and 0 <= i < len(sequences) else None
            if s is not None and s.placement == "local" and s.ranks[0] == x.rank and i not in placed:
                placed.add(i)
                out[x.rank].append((i, 0, s.length))
    last: list[tuple[int, int]] = []  # remap slots' sequences: after the rest
    for y in sorted(remap_slots, key=lambda y: (y.rank, y.direction != "to_attention", y.seqs)):
        for i in y.seqs:
            s = sequences[i] if isinstance(i, int) and 0 <= i < len(sequences) else None
            if s is not None and s.placement == "local" and s.ranks[0] == y.rank and i not in placed:
                placed.add(i)
                last.append((y.rank, i))
    for i, s in enumerate(sequences):
        if s.placement == "local" and i not in placed:
            out[s.ranks[0]].append((i, 0, s.length))
    for r, i in last:
        out[r].append((i, 0, sequences[i].length))
    return out


def attention_in_planner_order(plan: "StepPlan") -> bool:
    """The plan's attention layout equals :func:`planner_attention_layout` of its sequences, or
    :func:`engine_attention_layout` of its sequences, rings and slots, range for range.

    True proves the layout covers every token once and holds each sequence as its placement
    says; False proves nothing (the full check decides). The by-index order is tried first (a
    plan without rings and slots, e.g. a million local sequences, is in both orders).
    """
    world = plan.nodes * plan.gpus_per_node
    built = planner_attention_layout(plan.sequences, world)
    if built is None:
        return False
    # tuple() of a tuple is the tuple itself: one comparison, range for range (lists compare as tuples).
    have = tuple(map(tuple, plan.attention_layout))
    if tuple(map(tuple, built)) == have:
        return True
    if not all(isinstance(s.ranks[0], int) for s in plan.sequences if s.placement == "local"):
        return False
    engine = engine_attention_layout(plan.sequences, plan.rings, plan.local_slots, world, plan.remap_slots)
    return tuple(map(tuple, engine)) == have
