"""Grouped candidates: every split sequence on a whole CP group of nodes, as TE CP a2a+p2p places them.

The partitioner places sequences one by one on the ranks it finds least loaded; with several long
documents of similar length it can leave rings that share ranks pairwise (a ring over ranks A and B,
one over B and C, one over C and A): rank by rank each ring is well placed, but every rank runs its
rings one after the other, so the three form a chain (a *convoy*) that the prediction, which sums a
rank's own rings, does not see. TE CP a2a+p2p never builds such chains: ``P / cp`` groups of ``cp``
consecutive ranks, each sequence packed into one group (by tokens, longest first, into the emptiest
group with room) and split over all of it, one ring per group. With Zeppelin's head-parallel rings
(:mod:`.choose_heads`: an all-to-all inside each node, a ring across the group's nodes) that is the
peer's plan run by Zeppelin's engine.

:func:`grouped_assignments` builds that placement for one ``cp``; :func:`group_sizes` lists the sizes
tried (powers of two, whole nodes: ``cp`` a multiple of the GPUs per node, dividing the world, ``cp``
GPUs holding the longest sequence); :func:`best_plan` bounds each candidate's predicted step from below
(:func:`step_floor`: its rings' cheapest widths and the linear layers' least ms per token, no layout),
finishes the candidates whose floor is below the step to beat, lowest floor first (as the partitioner's
placement is finished: block widths, layouts, routing, local slots; the expensive part) and takes one
only where it wins on both of two estimates: the predicted step (:func:`~.predict.predict`, which sums
each rank's own rings and so misses convoys) and the rings' estimated end with convoys
(:func:`~.local_schedule.ring_timeline`: a ring starts when all its members are free; the latest rank's
end). Either alone misleads: the prediction prefers ``cp = 8`` groups on Llama-7B github-64k at 128 GPUs
(840 against 870 ms predicted; simulated 913 against 862), the timeline has no local work, linear layers
or remap. A sequence shorter than ``2 cp`` tokens (zigzag needs two chunks per rank) stays whole on the
group's rank holding the fewest tokens, longest first.

Simulated (Llama-13B, TP 2, prolong-128k, 128 GPUs, 2 steps, seed 0, 1M tokens, at 9b837f4): the
partitioner's plans 4706 / 4102 ms (predicted 3609 / 3196), the ``cp = 16`` candidates 3652 / 3357
(predicted 3427 / 3134): chosen, mean 4404 -> 3504 ms (te-cp-a2a-p2p 3302). Llama-7B arxiv-128k on
64 GPUs: the partitioner's plans predict lower (2970 / 2306 against 3051 / 2336) and simulate
faster: kept. With :func:`best_plan` called at the end of ``plan_step`` (the partitioner's
assignments finished as now, then ``best_plan(lengths, cost, options, plan, finish)``): 3B
prolong-64k 128 GPUs 1017.7 -> 895.6 ms, 7B prolong-64k 128 1614.7 -> 1549.4, 7B prolong-128k 128
2350.5 -> 2155.9; unchanged: 7B arxiv-128k 64, github/arxiv/prolong-64k 32, arxiv-64k 128, 13B
arxiv/prolong-64k 128, arxiv-128k 64; 4x8 long-tailed batches (Llama-7B, seeds 0-11): a candidate
in 6 of 12, each simulated faster (-0.1% to -8.9%). The floors change no choice (the finished
candidates they skip could not have won; tested against finishing all) and cut the CPU time of
``plan_step`` with ``grouped=True`` on 1M-token long-tailed batches at 128 GPUs (benchmarks/plan_speed.py's,
seeds 0-4, measured, 2 shared cores) from 194-736 ms to 168-302 ms (without: 32-37 ms): on those batches
the ``cp = 32`` candidate predicts lower (2117-2292 ms against 2346-2706) and finishing it (~16k zigzag
ranges) alone took 125-250 ms. ``plan_step`` now finishes a candidate without a remap (its tokens are
balanced already): 115-123 ms median with ``grouped=True`` (quiet machine), still over plan_speed's 50 ms
budget, so it calls :func:`best_plan` only with ``PlannerOptions(grouped=True)`` (opt-in).

Example: 2 nodes x 4 GPUs, lengths ``[40000, 30000, 2000, 6]``, ``cp = 4``: groups ``0-3`` and
``4-7``; 40000 -> group 0, 30000 -> group 1, 2000 -> group 1 (30000 < 40000 tokens), 6 -> group 1
(32000 < 40000); 40000 on ranks ``(0, 1, 2, 3)``, 30000 and 2000 on ``(4, 5, 6, 7)``, 6 (shorter than
``2 cp``) whole on rank 4 (each of 4-7 holds 8000, the lowest rank wins).

Pure and deterministic.
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

from .choose_heads import choose_width
from .cost_heads import head_ring_time, head_widths
from .cluster import Cluster
from .cost_model import CostModel
from .engine_ring import local_copy_ms_per_token, ring_steps
from .local_schedule import ring_timeline
from .options import PlannerOptions
from .partition_context import Assignment
from .plan import PLACEMENTS, SequencePlan, StepPlan, derive_routing
from .zigzag import zigzag_counts

__all__ = ["pack_sizes", "group_sizes", "grouped_assignments", "best_plan", "rings_end_ms", "step_floor",
           "ring_floor", "rank_floors", "layer_floors"]


def pack_sizes(lengths: Sequence[int], cluster: Cluster) -> list[int]:
    """CP sizes a group placement can use: powers of two dividing the world whose GPUs hold the longest sequence
    (``ceil(max / cp) <= tokens_per_gpu``); :mod:`.packed` tries them all. Example: 2 x 8 GPUs, capacity 65536,
    longest 100 000: ``[2, 4, 8, 16]``."""
    world, cap = cluster.world_size, cluster.tokens_per_gpu
    out = []
    cp = 1
    while cp <= world:
        if world % cp == 0 and -(-max(lengths) // cp) <= cap:
            out.append(cp)
        cp *= 2
    return out


def group_sizes(lengths: Sequence[int], cluster: Cluster) -> list[int]:
    """CP sizes tried: the :func:`pack_sizes` that are multiples of ``gpus_per_node`` (whole nodes). Example:
    16 nodes of 4, capacity 131072, longest 122250: ``[4, 8, 16, 32, 64]``."""
    return [cp for cp in pack_sizes(lengths, cluster) if cp % cluster.gpus_per_node == 0]


def grouped_assignments(lengths: Sequence[int], cluster: Cluster, cp: int) -> list[Assignment] | None:
    """Where each sequence goes with CP groups of ``cp`` ranks (module docstring), or ``None`` when the
    batch does not pack (a group or a rank over its capacity). Raises ``ValueError`` when ``cp`` is not
    a positive divisor of the world size."""
    world, cap = cluster.world_size, cluster.tokens_per_gpu
    if cp < 1 or world % cp:
        raise ValueError(f"cp = {cp} must be a positive divisor of the world size {world}")
    bins = world // cp
    where = [-1] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups = [(0, b) for b in range(bins)]  # (tokens, group): the emptiest group first, ties to the lowest index
    for i in order:
        load, b = heapq.heappop(groups)
        if load + lengths[i] > cp * cap:  # the emptiest group has no room: none has
            return None
        where[i] = b
        heapq.heappush(groups, (load + lengths[i], b))
    out: list[Assignment | None] = [None] * len(lengths)
    split = [Assignment("intra_node" if cluster.node_of(b * cp) == cluster.node_of(b * cp + cp - 1)
                        else "inter_node", tuple(range(b * cp, (b + 1) * cp))) for b in range(bins)]
    shared = [0] * bins  # every rank of a group holds ceil(s / cp) tokens of each of its split sequences
    for i, s in enumerate(lengths):
        if cp > 1 and s >= 2 * cp:
            out[i] = split[where[i]]
            shared[where[i]] += -(-s // cp)
    held = [shared[r // cp] for r in range(world)]
    ranks = [[(held[r], r) for r in range(b * cp, (b + 1) * cp)] for b in range(bins)]  # per group, a heap
    for h in ranks:
        heapq.heapify(h)
    for i in order:
        if out[i] is None:  # whole, on its group's rank holding the fewest tokens (ties: the lowest rank)
            t, r = heapq.heappop(ranks[where[i]])
            out[i] = Assignment("local", (r,))
            held[r] = t + lengths[i]
            heapq.heappush(ranks[where[i]], (held[r], r))
    if max(held) > cap:
        return None
    return [a for a in out if a is not None]


def rings_end_ms(plan: StepPlan, cost: CostModel) -> float:
    """When the last ring of ``plan`` ends in one layer, convoys included (:func:`~.local_schedule.ring_timeline`,
    no local work); 0 without rings."""
    return max(ring_timeline(plan, cost)[1], default=0.0)


def ring_floor(cost: CostModel, ranks: tuple[int, ...], lengths: Sequence[int],
               head_parallel: bool, charges: str = "none") -> tuple[float, float]:
    """``(total, own)`` lower bounds of one ring's per-layer times in :func:`~.predict.predict` under
    ``charges`` (default ``none``, what ``plan_step`` predicts with; :mod:`.packed` compares under
    ``zeppelin``), whatever block width and routes the finished plan gives it:
    the minimum over the widths :func:`~.choose_heads.choose_widths` may pick (1 and, with
    ``head_parallel``, :func:`~.cost_heads.head_widths`) of

    * plain: ``diag + (g-1) * off + first_late`` for both: ``total = diag + (g-1) * max(off, comm) +
      first_late`` is at least that whatever the routes make ``comm``;
    * head-parallel at width ``a``: ``total`` of :func:`~.cost_heads.head_ring_time` (no term depends on
      the plan's routes), and ``own + a2a_ms`` (what ``predict`` adds to the rank's own time).
    """
    key = ("ring_floor", ranks, tuple(lengths), head_parallel, charges)
    hit = cost._cache.get(key)
    if hit is not None:  # memoised: packings of one step share rings (the leading one, single sequences)
        return hit  # type: ignore[no-any-return]
    st = ring_steps(cost, lengths, len(ranks), charges=charges)
    plain = st.diag + (len(ranks) - 1) * st.off + st.first_late
    total = own = plain
    if head_parallel:
        for a in head_widths(cost, ranks):
            h = head_ring_time(cost, ranks, lengths, a, charges)
            total, own = min(total, h.total), min(own, h.own + h.a2a_ms)
    cost._cache[key] = (total, own)
    return total, own


def rank_floors(lengths: Sequence[int], assignments: Sequence[Assignment], cost: CostModel, head_parallel: bool,
                charges: str = "none") -> tuple[list[float], list[float], list[float]]:
    """Per rank, ``(tot, own, loc)`` lower bounds of :func:`~.predict.predict`'s terms under ``charges``: the
    sums of its rings' :func:`ring_floor` totals and own times (the rings are the sequences sharing a rank
    tuple, as :attr:`~.plan.StepPlan.rings` groups them), and its local sequences' ``local_ms`` plus their row
    copies (:func:`~.engine_ring.local_copy_ms_per_token`; none under ``none``, nor on a rank in no ring: without
    a remap it runs one call on its buffers, :attr:`~.lowering.RankProgram.whole_chunk`). Example: one sequence
    local on rank 0, none elsewhere: ``loc = [local_ms(s), 0, ...]``, ``tot = own = [0, ...]``."""
    world = cost.cluster.world_size
    copy = local_copy_ms_per_token(cost, charges)
    rings: dict[tuple[int, ...], list[int]] = {}
    local = [0.0] * world
    for s, a in zip(lengths, assignments):
        if a.placement != "local":
            rings.setdefault(a.ranks, []).append(s)
    ringed = {r for ranks in rings for r in ranks}
    for s, a in zip(lengths, assignments):
        if a.placement == "local":
            local[a.ranks[0]] += cost.local_ms(s) + (s * copy if a.ranks[0] in ringed else 0.0)
    tot = [0.0] * world
    own = [0.0] * world
    for ranks, ls in rings.items():
        t, o = ring_floor(cost, ranks, ls, head_parallel, charges)
        for r in ranks:
            tot[r] += t
            own[r] += o
    return tot, own, local


def layer_floors(lengths: Sequence[int], assignments: Sequence[Assignment], cost: CostModel,
                 options: PlannerOptions, charges: str = "none") -> list[float]:
    """Per rank, the lower bound on its layer that :func:`~.packed.packed_floor` takes the maximum of:
    ``max(tot_r, own_r + loc_r) + linear_ms(t_r)`` (``loc_r`` at least the call overhead when any)."""
    tot, own, local = rank_floors(lengths, assignments, cost, options.head_parallel, charges)
    tokens = [0] * cost.cluster.world_size
    for s, a in zip(lengths, assignments):
        if a.placement == "local":
            tokens[a.ranks[0]] += s
            continue
        for r, t in zip(a.ranks, zigzag_counts(s, len(a.ranks))):
            tokens[r] += t
    oh, linear_ms = cost.call_overhead_ms, cost.linear_ms
    return [max(t, o + (max(x, oh) if x > 0 else 0.0)) + linear_ms(k) for t, o, x, k in zip(tot, own, local, tokens)]


def step_floor(lengths: Sequence[int], assignments: Sequence[Assignment], cost: CostModel,
               options: PlannerOptions) -> float:
    """A lower bound on ``predict(finish(assignments)).step_ms`` (``finish`` as :func:`~.api.plan_step`
    finishes a placement: any block widths, routes, linear layout and remap windows), cheap: no layout.

    Proof against :func:`~.predict.predict` (``L`` layers; ``attn_r``, ``linear_r``, ``copy_r`` per layer).
    For a rank ``r`` on a remap path the step is at least ``L * (attn_r + linear_r + copy_r + remap)`` (the
    rank paired with itself, :func:`~.remap_cost.remap_couples`), so at least ``L * (attn_r + linear_r)``;
    off the paths it is at least
    ``rank_ms_r = L * (attn_r + linear_r + copy_r)``. So ``step >= L * max_r (attn_r + linear_r)``.

    * ``attn_r = tot_r + max(0, loc_r - (tot_r - own_r)) >= tot_r``, ``tot_r`` the sum over ``r``'s rings
      of their totals, each at least :func:`ring_floor`'s (the rings are the sequences sharing a rank
      tuple, as :attr:`~.plan.StepPlan.rings` groups them). With ``remap_overlap`` off no local sequence
      is hidden, so also ``attn_r >= own_r + loc_r`` (``loc_r``: ``r``'s local ``local_ms``, at least the
      call overhead when any); with it on, sequences in remap windows leave ``loc_r``, so local work is
      not counted.
    * ``linear_ms(t) >= p * t`` with ``p`` the least ms per token of the profile's linear rows
      (:meth:`~.cost_model.CostModel.linear_ms` interpolates the per-token time between those rows and
      holds it beyond them), and the linear layout holds all ``T`` tokens: ``sum_r linear_r >= p * T``.

    So ``step >= L * max_r (a_r + p * l_r)`` for some ``l`` summing to ``T``, which is at least
    ``L * max(max_r a_r, (sum_r a_r + p * T) / W)`` (a maximum is at least the mean).

    Example (2 nodes x 4 GPUs, Llama-7B, ``[40000, 30000, 2000, 6]`` at ``cp = 4``): the two rings' floors
    and the 8 ranks' linear share; :func:`best_plan` finishes a candidate only when this is below the
    step to beat.
    """
    world = cost.cluster.world_size
    tot, own, local = rank_floors(lengths, assignments, cost, options.head_parallel)
    att = tot
    if not options.remap_overlap:
        oh = cost.call_overhead_ms
        att = [max(t, o + (max(x, oh) if x > 0 else 0.0)) for t, o, x in zip(tot, own, local)]
    per_token = cost.least_linear_ms_per_token()
    return cost.model.layers * max(max(att), (sum(att) + per_token * sum(lengths)) / world)


def _rings_only(lengths: Sequence[int], assignments: Sequence[Assignment], cost: CostModel,
                options: PlannerOptions) -> StepPlan:
    """The candidate's rings alone (no layouts, not validated; each ring's width by
    :func:`~.choose_heads.choose_width`, routed as planned): enough for :func:`rings_end_ms`."""
    cl = cost.cluster
    ring_lengths: dict[tuple[int, ...], list[int]] = {}
    for s, a in zip(lengths, assignments):
        if a.placement != "local":
            ring_lengths.setdefault(a.ranks, []).append(s)
    widths = {ranks: choose_width(cost, ranks, ls, options.routing) for ranks, ls in ring_lengths.items()}
    seqs = tuple(SequencePlan(s, a.placement, a.ranks, widths.get(a.ranks, 1))  # type: ignore[arg-type]
                 for s, a in zip(lengths, assignments))
    empty: tuple[tuple[tuple[int, int, int], ...], ...] = tuple(() for _ in range(cl.world_size))
    plan = StepPlan(nodes=cl.nodes, gpus_per_node=cl.gpus_per_node, sequences=seqs, attention_layout=empty,
                    linear_layout=empty, validate=False)
    return plan.evolve(routing=derive_routing(plan, cost, enabled=options.routing))


def best_plan(lengths: Sequence[int], cost: CostModel, options: PlannerOptions, plan: StepPlan,
              finish: Callable[[Sequence[Assignment]], StepPlan]) -> StepPlan:
    """``plan`` (the partitioner's, finished) or a grouped candidate that beats it on both its predicted
    step and :func:`rings_end_ms` (strictly; among several, the lowest predicted step, then the smaller
    ``cp``). ``finish`` turns assignments into a finished plan as :func:`~.api.plan_step` does. Only with
    head-parallel rings on and every placement allowed (``options``; otherwise ``plan``: the grouped plan
    is the peer's all-to-all in each node and ring across them, and ``head_parallel=False`` plans stay
    the partitioner's, byte-identical to those made before head-parallel rings existed)."""
    if not options.head_parallel or set(options.placements) != set(PLACEMENTS) or plan.predicted is None:
        return plan
    ends = rings_end_ms(plan, cost)
    best, best_ms, best_cp = plan, plan.predicted.step_ms, 0
    slack = 1e-6  # predictions are rounded to 1e-6 ms (predict._ROUND): a floor may pass them by that much
    floors = []
    for cp in group_sizes(lengths, cost.cluster):
        assignments = grouped_assignments(lengths, cost.cluster, cp)
        if assignments is not None:
            floors.append((step_floor(lengths, assignments, cost, options), cp, assignments))
    for floor, cp, assignments in sorted(floors, key=lambda x: (x[0], x[1])):  # the likeliest winner first
        if floor - slack >= best_ms - 1e-9 and not (best_cp > cp and floor - slack <= best_ms + 1e-9):
            continue  # cannot win (nor tie with a larger cp): not finished (layouts, remap, validation)
        if rings_end_ms(_rings_only(lengths, assignments, cost, options), cost) >= ends - 1e-9:
            continue
        cand = finish(assignments)
        if cand.predicted is None or rings_end_ms(cand, cost) >= ends - 1e-9:
            continue
        ms = cand.predicted.step_ms
        if ms < best_ms - 1e-9 or (best_cp > cp and ms <= best_ms + 1e-9):  # near-ties: the smaller cp
            best, best_ms, best_cp = cand, ms, cp
    return best
