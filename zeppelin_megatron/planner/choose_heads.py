"""Which rings run head-parallel, and at which block width (the plan's ``SequencePlan.a2a``).

For each group of split sequences the partitioner put on one rank tuple (one
ring), :func:`choose_widths` picks the block width ``a`` with the lowest
predicted time of that ring for its members, among

* ``a = 1``: the plain ring, :func:`~.predict.ring_time` with its cross-node
  hops routed as :func:`~.routing.plan_routing` routes that ring (what the plan
  will do, routing being per ring);
* every ``a >= 2`` of :func:`~.cost_heads.head_widths` (``a`` divides the ring,
  each block of ``a`` consecutive ranks inside one node, the heads split over
  ``a`` lanes): :func:`~.cost_heads.head_ring_time`.

Both priced with the engine's charges (:data:`CHOICE_CHARGES`, "Charges" below).
Ties go to the smaller width (the plain ring first). :func:`~.api.plan_step`
also weighs what a member loses when the ring's all-to-all holds it back
(:func:`_fill_aware`): local work hidden in the plain ring's waits that the
head-parallel ring's waits (its lane steps and its ``heads`` all-to-all, where
a member free before its block's last lane waits: local slot step ``-1``) do
not hide, and, when it has work after the ring, the head start of a member
free before its partners. The width changes neither
the attention layout nor any rank's tokens (the layout of a head-parallel ring
is the plain zigzag), so no batch the plain ring can run is refused.
``PlannerOptions(head_parallel=False)`` keeps every ring plain.

Charges: a plain ring pays the engine's merges, row copies and fp32 dK/dV on the
wire (:func:`~.engine_ring.ring_steps`) at each of its ``G`` steps, a
head-parallel ring at its ``m = G / a`` lane steps plus the copies around its
all-to-alls; pricing both sides without them (``charges="none"``) kept rings
plain that the simulator runs far slower (Llama-13B prolong-128k, 128 GPUs: a
20-rank ring 30.3 vs 28.8 ms uncharged, 40.1 vs 30.6 charged; docs/planner.md).

Example (Llama-7B, one H100 node, call overhead 1.09 ms): one sequence of 8192
tokens on ranks 0-7: the plain ring pays the overhead and the charges at each of
its 8 steps (9.36 ms; 8.74 uncharged); Ulysses (``a = 8``) is one call over
``1/8`` of the heads plus two all-to-alls (1.29 ms; 1.24 uncharged): ``a = 8`` is chosen.

Pure and deterministic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .cost_heads import head_ring_time, head_widths
from .cost_model import CostModel
from .local_schedule import ring_timeline
from .options import PlannerOptions
from .plan import SequencePlan, StepPlan, TokenRange, derive_routing
from .predict import ring_time
from .routing import Route, plan_routing

if TYPE_CHECKING:
    from .partition_context import Assignment

__all__ = ["choose_widths", "choose_width", "plain_ring_ms", "CHOICE_CHARGES"]

CHOICE_CHARGES = "zeppelin"
"""The charge model (:mod:`.engine_ring`) the width choice prices both sides with: the engine's merges,
row copies, fp32 dK/dV on the wire and the copies around the all-to-alls. A plain ring pays them at each of
its ``G`` steps, a head-parallel one at ``m = G / a``; the uncharged rule missed that and kept plain rings
the simulator runs far slower (module docstring, "Charges")."""


def plain_ring_ms(cost: CostModel, ranks: tuple[int, ...], lengths: Sequence[int], routing: bool,
                  charges: str = "none") -> float:
    """Per-member time of the plain ring (``a = 1``), cross-node hops routed as the plan routes them;
    ``charges``: :func:`~.predict.ring_time`'s (the width choice passes :data:`CHOICE_CHARGES`)."""
    key = ("plain_ring", tuple(ranks), tuple(lengths), routing, charges)
    hit = cost._cache.get(key)
    if hit is not None:  # memoised: the width choice asks for every ring of every candidate
        return hit  # type: ignore[no-any-return]
    cl = cost.cluster
    routes: dict[tuple[int, int], Route] = {}
    if routing and len({cl.node_of(r) for r in ranks}) > 1:
        step_bytes = sum(cost.ring_step_bytes(s, len(ranks)) for s in lengths)
        routes = {(rt.src, rt.dst): rt for rt in plan_routing([(ranks, step_bytes)], cl, cost, enabled=True)}
    cost._cache[key] = out = ring_time(cost, ranks, lengths, routes, charges)[0]
    return out


def choose_width(cost: CostModel, ranks: tuple[int, ...], lengths: Sequence[int], routing: bool) -> int:
    """The block width of the ring over ``ranks`` holding ``lengths`` (module docstring): 1 or one of
    :func:`~.cost_heads.head_widths`, the lowest predicted time, ties to the smaller width."""
    best_ms, best = plain_ring_ms(cost, ranks, lengths, routing, CHOICE_CHARGES), 1
    for a in head_widths(cost, ranks):
        ms = head_ring_time(cost, ranks, lengths, a, CHOICE_CHARGES).total
        if ms < best_ms:
            best_ms, best = ms, a
    return best


def choose_widths(lengths: Sequence[int], assignments: "Sequence[Assignment]", cost: CostModel,
                  options: PlannerOptions,
                  attention_layout: Sequence[Sequence[TokenRange]] | None = None) -> list[int]:
    """``a2a`` of every sequence: 1 for local ones (and everywhere when ``options.head_parallel`` is
    off); for split ones, the width chosen for the ring of their rank tuple.

    Without ``attention_layout``: :func:`choose_width` (the ring's own time). With it (what
    :func:`~.api.plan_step` passes), the choice also counts the local work a member would no longer
    hide (:func:`_fill_aware`): a plain ring's member idles in its waits, including the wait for
    partners still busy in earlier rings, and the plan's local slots fill those waits with its local
    sequences; a head-parallel ring has slots at its lane steps and in its ``heads`` all-to-all (where
    a member waits for its block's last lane: the only slot of a Ulysses ring), and local work that
    fits none of them runs after the rings instead.

    Example: ``[8192, 100]`` on one node of 8 GPUs, sequence 0 on ranks 0-7, sequence 1 local on rank
    0: ``[8, 1]`` (Llama-7B: Ulysses beats the plain ring, see the module docstring).
    """
    out = [1] * len(lengths)
    if not options.head_parallel:
        return out
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, a in enumerate(assignments):
        if a.placement != "local":
            groups.setdefault(a.ranks, []).append(i)
    if attention_layout is None:
        widths = {ranks: choose_width(cost, ranks, [lengths[i] for i in seqs], options.routing)
                  for ranks, seqs in groups.items()}
    else:
        widths = _fill_aware(lengths, assignments, groups, cost, options, attention_layout)
    for ranks, seqs in groups.items():
        for i in seqs:
            out[i] = widths[ranks]
    return out


def _fill_aware(lengths: Sequence[int], assignments: "Sequence[Assignment]", groups: dict[tuple[int, ...], list[int]],
                cost: CostModel, options: PlannerOptions,
                attention_layout: Sequence[Sequence[TokenRange]]) -> dict[tuple[int, ...], int]:
    """Each ring's width when the local work its members hide counts (see :func:`choose_widths`).

    From the all-plain plan's :func:`~.local_schedule.ring_timeline`: ``G[r, k]``, the waits of member
    ``r`` in ring ``k`` long enough for a local call (``> o``); ``F_r``, their sum over its rings;
    ``L_r``, its local work. At width ``a`` the ring's time changes by ``T_a - T_1``, and member ``r``
    loses (1) hidden local work, from ``min(L_r, F_r)`` to ``min(L_r, F'_r)``, ``F'_r = F_r - G[r, k]
    + H_a(r)``, ``H_a(r)`` its waits in the head-parallel ring (:func:`_head_fill`: the lane steps,
    ``m - 1`` of ``max(0, comm - kernel)``, and its ``heads`` all-to-all's wait, from when it is free
    to its block's last lane + ``heads_ms``, if longer than ``o``); and, when it has work after the
    ring (a later ring, or local work beyond ``F'_r``), the larger of (1) and (2) its head start: a
    member free before its last partner runs its first kernel (``max(diag, o)``) early in a plain
    ring and ends that much sooner, where the all-to-all holds it back. Rings in queue order each
    take the width with the lowest worst member change, if below 0 (ties: the smaller width), and
    update ``F``. Candidates: 1 and :func:`~.cost_heads.head_widths`.

    Example: a member (in no later ring) free 3 ms before its block's last lane, 2.5 ms of local work that only the
    plain ring's step-0 wait hid (``G = 2.8``, ``F = 2.8``): at a width whose ``heads`` wait is 3.1 ms,
    ``F' = 3.1``, nothing is lost and nothing is left after the ring, so its head start no longer counts.
    """
    cl, o = cost.cluster, cost.call_overhead_ms
    # ranks -> [(total, width, lane step waits, heads all-to-all ms)]
    times: dict[tuple[int, ...], list[tuple[float, int, float, float]]] = {}
    for ranks, members in groups.items():
        ls = [lengths[i] for i in members]
        cands: list[tuple[float, int, float, float]] = []
        for a in head_widths(cost, ranks):
            h = head_ring_time(cost, ranks, ls, a, CHOICE_CHARGES)
            m = len(ranks) // a
            waits = sum(max(0.0, h.step_comm_ms - max(h.diag if j == 0 else h.off, o)) for j in range(m - 1))
            cands.append((h.total, a, waits, h.heads_ms))
        if cands:
            times[ranks] = cands
    widths = dict.fromkeys(groups, 1)
    if not times:
        return widths
    world = cl.world_size
    plain_seqs = tuple(SequencePlan(n, x.placement, x.ranks)  # type: ignore[arg-type]
                       for n, x in zip(lengths, assignments))
    att = tuple(tuple(rs) for rs in attention_layout)
    plain = StepPlan(nodes=cl.nodes, gpus_per_node=cl.gpus_per_node, sequences=plain_seqs, attention_layout=att,
                     linear_layout=att, validate=False)
    plain = plain.evolve(routing=derive_routing(plain, cost, enabled=options.routing))
    arrive: dict[tuple[int, int], float] = {}
    gaps, _ = ring_timeline(plain, cost, arrive)
    fill: dict[tuple[int, int], float] = {}  # (rank, ring index) -> waits a local call fits in
    for (r, k, _j), gap in [x for x in gaps.items() if x[1] > o]:  # few of the many steps' waits
        fill[(r, k)] = fill.get((r, k), 0.0) + gap
    free = [0.0] * world  # F_r
    for (r, _k), g in fill.items():
        free[r] += g
    local = [0.0] * world  # L_r
    for n, x in zip(lengths, assignments):
        if x.placement == "local":
            local[x.ranks[0]] += cost.local_ms(n)
    local = [max(x, o) if x > 0 else 0.0 for x in local]
    last = [-1] * world  # the last ring (queue order) each rank is in
    for k, ring in enumerate(plain.rings):
        for r in ring.ranks:
            last[r] = k
    for k, ring in enumerate(plain.rings):
        options_k = times.get(ring.ranks)
        if options_k is None:
            continue
        ls = [lengths[i] for i in ring.seqs]
        t1 = plain_ring_ms(cost, ring.ranks, ls, options.routing, CHOICE_CHARGES)
        first = max(sum(cost.ring_compute_profile(n, len(ring.ranks))[0] for n in ls), o)
        start = max(arrive[(r, k)] for r in ring.ranks)
        # a member that arrives ahead of its partners runs its first kernel early in a plain ring and ends
        # (and starts what follows) that much sooner; a head-parallel ring's all-to-all holds it back
        early = {r: min(start - arrive[(r, k)], first) for r in ring.ranks}
        best, best_width = 0.0, 1
        best_fill: dict[int, float] = {}
        for total, a, waits, heads_ms in options_k:
            h_fill = _head_fill(ring.ranks, a, k, arrive, waits, heads_ms, o)
            worst = -float("inf")
            for r in ring.ranks:
                room = free[r] - fill.get((r, k), 0.0) + h_fill[r]  # F_r at width a
                lost = min(local[r], free[r]) - min(local[r], room)
                after = last[r] > k or (local[r] > 0 and local[r] > room)  # a later ring, or local work not hidden
                worst = max(worst, total - t1 + (max(early[r], lost) if after else lost))
            if worst < best:
                best, best_width, best_fill = worst, a, h_fill
        if best_width != 1:
            widths[ring.ranks] = best_width
            for r in ring.ranks:
                free[r] += best_fill[r] - fill.get((r, k), 0.0)
    return widths


def _head_fill(ranks: tuple[int, ...], a: int, k: int, arrive: dict[tuple[int, int], float], waits: float,
               heads_ms: float, o: float) -> dict[int, float]:
    """``H_a`` per member of ring ``k`` over ``ranks`` at width ``a``: the lane steps' waits (``waits``) plus
    its wait in the ``heads`` all-to-all, from when it is free (``arrive``) to its block's last lane's
    arrival plus ``heads_ms``, when longer than a call's overhead ``o`` (the step ``-1`` slot,
    :func:`~.local_schedule.ring_timeline`).

    Example: ranks ``(4, 5)``, ``a = 2``, free at 0 and 3 ms, ``heads_ms`` 0.1, ``o`` 1, no lane steps:
    ``{4: 3.1, 5: 0.0}`` (rank 5's 0.1 ms holds no call).
    """
    out: dict[int, float] = {}
    for b in range(0, len(ranks), a):
        block = ranks[b:b + a]
        ready = max(arrive[(r, k)] for r in block) + heads_ms
        for r in block:
            gap = ready - arrive[(r, k)]
            out[r] = waits + (gap if gap > o else 0.0)
    return out
