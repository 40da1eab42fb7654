"""Transformer Engine context parallelism (TE CP) and its all-gather variant: fixed CP groups.

The ``P`` GPUs form ``P / cp`` data-parallel groups of ``cp`` consecutive ranks
(Megatron's rank order puts CP innermost after TP). Sequences are packed into
the groups by tokens (longest first, into the group holding the fewest tokens
that has room; ties: lower group), and every sequence of a group is
zigzag-split over all ``cp`` ranks of its group (TE's THD layout with
``cu_seqlens`` per document). All sequences of a group share one ring and one
kernel call per ring step, as in TE's ``AttnFuncWithCPAndKVP2P``.

Deviation, in TE CP's favour: TE pads every sequence to a multiple of
``2 cp`` tokens; a ``StepPlan`` cannot split a sequence shorter than ``2 cp``,
so such a sequence is kept whole on the group rank holding the fewest tokens
(no padding compute, no ring traffic).

``cp_size=None`` picks, per batch, the power of two ``cp`` (dividing ``P``,
large enough for the longest sequence) whose plan the cost model
(:func:`~zeppelin_megatron.planner.predict.predict`) predicts fastest: the most
favourable fixed CP size for every batch (ties: the smaller ``cp``).
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..planner.cluster import Cluster
from ..planner.cost_model import CostModel
from ..planner.grouped import pack_sizes
from ..planner.plan import PlanError, StepPlan
from .planbuild import build_plan

__all__ = ["cp_groups", "te_cp_plan", "cp_candidates", "pack_by_tokens", "allgather_estimate_ms"]


def cp_candidates(lengths: Sequence[int], cluster: Cluster) -> list[int]:
    """Powers of two ``cp`` dividing the world size whose GPUs can hold the longest sequence
    (:func:`~zeppelin_megatron.planner.grouped.pack_sizes`); :class:`PlanError` when there is none."""
    out = pack_sizes(lengths, cluster)
    if not out:
        raise PlanError(f"no CP size up to {cluster.world_size} GPUs holds the longest sequence ({max(lengths)} "
                        f"tokens, {cluster.tokens_per_gpu} tokens per GPU)")
    return out


def pack_by_tokens(lengths: Sequence[int], bins: int, capacity: int,
                   weights: Sequence[float] | None = None) -> list[int]:
    """Bin of each sequence: heaviest first into the lightest bin with token room (ties: lower bin); a sequence
    weighs its tokens, or ``weights[i]`` when given (``wlb-llm``'s per-document packing: each document's work).

    Example: lengths ``[5, 4, 3, 3]``, 2 bins of capacity 8 -> ``[0, 1, 1, 0]``
    (5 -> bin 0; 4 -> bin 1; 3 -> bin 1 (4 < 5); 3 -> bin 0 (5 < 7)).
    """
    w = lengths if weights is None else weights
    tokens = [0] * bins
    load = [0.0] * bins
    where = [-1] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-w[i], -lengths[i], i)):
        s = lengths[i]
        best = -1
        for b in range(bins):
            if tokens[b] + s <= capacity and (best < 0 or load[b] < load[best]):
                best = b
        if best < 0:
            raise PlanError(f"sequence {i} ({s} tokens) fits in no group: {bins} groups of {capacity} tokens "
                            f"hold {sorted(tokens)} already")
        where[i] = best
        tokens[best] += s
        load[best] += w[i]
    return where


def cp_groups(lengths: Sequence[int], cluster: Cluster, cp: int) -> list[tuple[int, ...]]:
    """Ranks of each sequence under TE CP with CP size ``cp`` (see module docstring)."""
    world = cluster.world_size
    if cp < 1 or world % cp:
        raise PlanError(f"cp_size = {cp} must be a positive divisor of the world size {world}")
    where = pack_by_tokens(lengths, world // cp, cp * cluster.tokens_per_gpu)
    held = [0] * world
    groups: list[tuple[int, ...]] = [()] * len(lengths)
    for i, s in enumerate(lengths):
        ranks = tuple(range(where[i] * cp, (where[i] + 1) * cp))
        if cp > 1 and s >= 2 * cp:
            groups[i] = ranks
            for r in ranks:
                held[r] += s // cp
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):  # short ones: whole
        if not groups[i]:
            base = where[i] * cp
            r = min(range(base, base + cp), key=lambda r: (held[r], r))
            groups[i] = (r,)
            held[r] += lengths[i]
    return groups


def te_cp_plan(
    lengths: Sequence[int],
    cluster: Cluster,
    cost: CostModel,
    *,
    cp_size: int | None = None,
    routing: bool = False,
    score: Callable[[StepPlan, int], float] | None = None,
) -> tuple[StepPlan, int]:
    """TE CP plan and the CP size used (auto when ``cp_size`` is None; see module docstring).

    ``score(plan, cp)`` ranks candidate sizes (lower is better); default: the
    cost model's predicted step time.
    """
    from .simulator import Fastest

    candidates = [cp_size] if cp_size is not None else cp_candidates(lengths, cluster)
    fastest: Fastest[tuple[StepPlan, int]] = Fastest()
    for cp in candidates:
        try:
            plan = build_plan(lengths, cp_groups(lengths, cluster, cp), cluster, cost, routing=routing)
        except PlanError:
            if cp_size is not None:
                raise
            continue
        value = score(plan, cp) if score is not None else plan.predicted.step_ms  # type: ignore[union-attr]
        fastest.offer(value, (plan, cp))
    if fastest.kept is None:
        raise PlanError(f"no CP size in {candidates} can pack {len(lengths)} sequences "
                        f"({sum(lengths)} tokens) on {cluster.world_size} GPUs")
    return fastest.kept


def allgather_estimate_ms(plan: StepPlan, cost: CostModel) -> float:
    """Analytic step time of ``plan`` run as all-gather CP (picks the CP size; the simulator reports).

    Per group of ``g`` ranks: compute ``sum block_ms(s/g, s) / 2`` per rank; the
    all-gather (``2 (g-1)/g`` of the group's K/V bytes into each rank) overlaps
    the rank's diagonal blocks; the reduce-scatter (``(g-1)/g``) is exposed.
    NVLink within a node, one NIC per GPU across nodes. Plus local work and linear.
    """
    cl = cost.cluster
    o = cost.call_overhead_ms
    per_rank = [cost.linear_ms(plan.tokens(r, "linear")) for r in range(plan.world_size)]
    for ring in plan.rings:
        g = len(ring.ranks)
        lens = [plan.sequences[i].length for i in ring.seqs]
        total = sum(lens) * cost.kv_bytes_per_token
        near = min(g, cl.gpus_per_node)
        share = (cl.gpus_sharing_nic(0), (near - 1) / g, (g - near) / g)

        def link(b: float, share: tuple[int, float, float] = share) -> float:
            return max(cost.nvlink_ms(b * share[1]), cost.nic_ms(b * share[2] * share[0]) if share[2] else 0.0)
        diag = max(sum(cost.causal_ms(s // g) for s in lens), o)
        rest = max(sum(cost.block_ms(s // g, s) / 2 for s in lens) - diag, o)
        t = max(diag, link(2 * total)) + rest + link(total)
        for r in ring.ranks:
            per_rank[r] += t
    for s in plan.sequences:
        if s.placement == "local":
            per_rank[s.ranks[0]] += cost.local_ms(s.length)
    return cost.model.layers * max(per_rank)
