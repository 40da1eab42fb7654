"""Baseline planners with fixed or per-length group sizes: Hybrid DP and WLB-LLM.

Both produce per-sequence rank groups that :func:`~.planbuild.build_plan`
turns into a ``StepPlan`` (ring attention over each group; linear modules on
the attention layout: neither baseline remaps). Loads are estimated with the
project's :class:`CostModel` (a stronger estimate than either system's own
``s^2`` heuristic, which only helps the baselines).

**Hybrid DP** (Megatron ``--hybrid-context-parallel``,
``hybrid_cp_schedule.BalancedCPScheduler``): a sequence of ``s`` tokens needs
``cp(s) = max(1, 2^ceil(log2(s / m)))`` GPUs, ``m`` = ``max_seqlen_per_rank``
(Megatron's ``--max-seqlen-per-dp-cp-rank``; default here: the per-GPU token
share of the batch, ``ceil(T / P)``). Sequences in decreasing estimated
per-GPU time go to the aligned block of ``cp(s)`` consecutive ranks whose
busiest rank is least loaded (ties: lower block) and has token room;
``cp(s) = 1`` is the data-parallel case (whole sequence on one GPU). Megatron
runs such groups as successive sub-batches; here they are one plan whose rings
run in the engine's order (no per-sub-batch linear passes: in the baseline's
favour).

**WLB-LLM** (workload-aware packing + per-document sharding): fixed CP groups
of ``cp`` consecutive ranks (``cp_size``, default: the candidate the simulator
finds fastest for this batch). Documents, heaviest first, are packed into the
group with the least estimated work (attention + linear) that has token room.
Inside a group a document is sharded over all ``cp`` ranks (zigzag, per
document) when that pays (its ring hides its transfer and beats keeping it
whole: the planner's own test); otherwise it is kept whole on the group rank
with the least work (WLB-LLM's adaptive choice of sharding granularity).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from ..planner.cluster import Cluster
from ..planner.cost_model import CostModel
from ..planner.plan import PlanError, StepPlan
from .planbuild import build_plan
from .te_cp import cp_candidates

__all__ = ["hybrid_dp_groups", "hybrid_dp_plan", "wlb_llm_groups", "wlb_llm_plan", "split_pays"]


def _ring_ms(cost: CostModel, s: int, g: int, cluster: Cluster) -> float:
    return cost.ring_ms(s, g, inter_node=g > cluster.gpus_per_node)


def split_pays(cost: CostModel, s: int, g: int) -> bool:
    """A ``g``-way ring of ``s`` hides its transfer (ratio >= 1) and beats one GPU."""
    cl = cost.cluster
    inter = g > cl.gpus_per_node
    return (g > 1 and s >= 2 * g and cost.comm_ratio(s, g, inter_node=inter) >= 1.0
            and cost.ring_ms(s, g, inter_node=inter) < cost.local_ms(s))


def hybrid_dp_groups(lengths: Sequence[int], cluster: Cluster, cost: CostModel,
                     max_seqlen_per_rank: int | None = None) -> list[tuple[int, ...]]:
    """Ranks of each sequence under Hybrid DP (see module docstring)."""
    world, cap = cluster.world_size, cluster.tokens_per_gpu
    m = max_seqlen_per_rank if max_seqlen_per_rank is not None else -(-sum(lengths) // world)
    if m < 1:
        raise PlanError(f"max_seqlen_per_rank must be >= 1, got {m}")
    m = min(m, cap)

    top = 1 << (world.bit_length() - 1)  # largest power of two <= world

    def needed(s: int) -> int:
        g = 1 if s <= m else 2 ** math.ceil(math.log2(s / m))
        g = min(g, top)
        if -(-s // g) > cap:
            raise PlanError(f"hybrid-dp: a sequence of {s} tokens needs more than {top} GPUs of {cap} tokens")
        return g

    sizes = [needed(s) for s in lengths]
    per_rank = [(_ring_ms(cost, s, g, cluster) if g > 1 else cost.local_ms(s)) for s, g in zip(lengths, sizes)]
    load = [0.0] * world
    tok = [0] * world
    groups: list[tuple[int, ...]] = [()] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-per_rank[i] * sizes[i], -lengths[i], i)):
        g, s = sizes[i], lengths[i]
        share = -(-s // g)
        best = None
        for b in range(0, world, g):
            block = range(b, b + g)
            if any(tok[r] + share > cap for r in block):
                continue
            peak = max(load[r] for r in block)
            if best is None or peak < best[0] - 1e-12:
                best = (peak, b)
        if best is None:
            raise PlanError(f"hybrid-dp: sequence {i} ({s} tokens on {g} GPUs) fits in no block of "
                            f"{cap} tokens per GPU")
        ranks = tuple(range(best[1], best[1] + g))
        groups[i] = ranks
        for r in ranks:
            load[r] += per_rank[i]
            tok[r] += share
    return groups


def hybrid_dp_plan(lengths: Sequence[int], cluster: Cluster, cost: CostModel,
                   max_seqlen_per_rank: int | None = None) -> StepPlan:
    return build_plan(lengths, hybrid_dp_groups(lengths, cluster, cost, max_seqlen_per_rank), cluster, cost)


def wlb_llm_groups(lengths: Sequence[int], cluster: Cluster, cost: CostModel, cp: int) -> list[tuple[int, ...]]:
    """Ranks of each document under WLB-LLM with CP size ``cp`` (see module docstring)."""
    world, cap = cluster.world_size, cluster.tokens_per_gpu
    if cp < 1 or world % cp:
        raise PlanError(f"cp_size = {cp} must be a positive divisor of the world size {world}")
    n_groups = world // cp
    shard = [split_pays(cost, s, cp) or s > cap for s in lengths]
    lin_per_token = cost.linear_ms(max(1, sum(lengths) // world)) / max(1, sum(lengths) // world)
    work = [(cp * _ring_ms(cost, s, cp, cluster) if sh and cp > 1 else cost.local_ms(s)) + s * lin_per_token
            for s, sh in zip(lengths, shard)]
    if any(sh and (cp == 1 or s < 2 * cp) for s, sh in zip(lengths, shard)):
        bad = next(i for i, (s, sh) in enumerate(zip(lengths, shard)) if sh and (cp == 1 or s < 2 * cp))
        raise PlanError(f"wlb-llm: sequence {bad} ({lengths[bad]} tokens) does not fit one GPU and cannot be "
                        f"sharded over cp = {cp}")
    g_work = [0.0] * n_groups
    g_tok = [0] * n_groups
    where = [-1] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-work[i], -lengths[i], i)):
        best = -1
        for b in range(n_groups):
            if g_tok[b] + lengths[i] <= cp * cap and (best < 0 or g_work[b] < g_work[best] - 1e-12):
                best = b
        if best < 0:
            raise PlanError(f"wlb-llm: sequence {i} ({lengths[i]} tokens) fits in no group of {cp * cap} tokens")
        where[i] = best
        g_work[best] += work[i]
        g_tok[best] += lengths[i]
    load = [0.0] * world
    tok = [0] * world
    groups: list[tuple[int, ...]] = [()] * len(lengths)
    for i, s in enumerate(lengths):
        if shard[i] and cp > 1:
            ranks = tuple(range(where[i] * cp, (where[i] + 1) * cp))
            groups[i] = ranks
            for r in ranks:
                load[r] += work[i] / cp
                tok[r] += -(-s // cp)
    for i in sorted(range(len(lengths)), key=lambda i: (-work[i], -lengths[i], i)):
        if groups[i]:
            continue
        base = where[i] * cp
        fits = [r for r in range(base, base + cp) if tok[r] + lengths[i] <= cap]
        if not fits:
            raise PlanError(f"wlb-llm: sequence {i} ({lengths[i]} tokens) fits on no GPU of group {where[i]}")
        r = min(fits, key=lambda r: (load[r], r))
        groups[i] = (r,)
        load[r] += work[i]
        tok[r] += lengths[i]
    return groups


def wlb_llm_plan(lengths: Sequence[int], cluster: Cluster, cost: CostModel, *, cp_size: int | None = None,
                 score: Callable[[StepPlan], float] | None = None) -> tuple[StepPlan, int]:
    """WLB-LLM plan and its CP size (``cp_size=None``: lowest ``score``, default the simulated step)."""
    if score is None:
        from .simulator import simulate

        def score(plan: StepPlan) -> float:
            return simulate(plan, cost, keep_events=False, charges="te").step_ms  # WLB-LLM runs TE CP's ring
    candidates = [cp_size] if cp_size is not None else cp_candidates(lengths, cluster)
    best: tuple[float, int, StepPlan] | None = None
    for cp in candidates:
        try:
            plan = build_plan(lengths, wlb_llm_groups(lengths, cluster, cost, cp), cluster, cost)
        except PlanError:
            if cp_size is not None:
                raise
            continue
        value = score(plan)
        if best is None or value < best[0] - 1e-9:
            best = (value, cp, plan)
    if best is None:
        raise PlanError(f"wlb-llm: no CP size in {candidates} can place the batch")
    return best[2], best[1]
