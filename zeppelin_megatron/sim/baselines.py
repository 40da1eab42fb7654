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
from ..planner.packed import packed_groups
from ..planner.plan import PlanError, StepPlan
from .planbuild import build_plan
from .te_cp import cp_candidates

__all__ = ["hybrid_dp_groups", "hybrid_dp_plan", "wlb_llm_groups", "wlb_llm_plan"]


def _ring_ms(cost: CostModel, s: int, g: int, cluster: Cluster) -> float:
    return cost.ring_ms(s, g, inter_node=g > cluster.gpus_per_node)


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
    """Ranks of each document under WLB-LLM with CP size ``cp`` (see module docstring): the planner's
    :func:`~zeppelin_megatron.planner.packed.packed_groups` (Zeppelin tries the same packing as a candidate);
    its :class:`PlanError` prefixed ``wlb-llm:``."""
    if cost.cluster != cluster:
        raise ValueError("cost was built for another cluster; build it with this cluster")
    try:
        return packed_groups(lengths, cost, cp)
    except PlanError as exc:
        raise PlanError(f"wlb-llm: {exc}") from None


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
