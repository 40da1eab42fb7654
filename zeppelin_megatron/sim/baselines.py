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
document) by one of three rules, else kept whole on the group rank with the least
work: where that pays (its ring hides its transfer and beats keeping it whole:
the planner's own test), where its ring beats one GPU at all, or always (every
document of at least ``2 cp`` tokens: WLB-LLM's per-document sharding as its
paper states it, TE CP's THD layout; :func:`per_document_groups`, whose groups
are packed by each document's work as WLB-LLM weighs it, attention kept whole
plus linear, since all documents of a group share one ring: weighing each by its
own ring's time, overheads and transfer included, would pack those groups
worse); the rule, like the CP size, is the one the
simulator finds fastest for the batch (:data:`SHARD_RULES`; WLB-LLM's adaptive
choice of sharding granularity). Until 2026-11-29 only the first rule was tried,
which left long documents whole in cross-node groups (cp > 8) and so the
baseline 3-49% slower on ten of docs/BENCHMARKS.md's configurations at 64-128
GPUs; until later that day the third was missing, which left the baseline slower
than plain ``te-cp`` (the same sharding, packed by tokens) on some batches.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from ..planner.cluster import Cluster
from ..planner.cost_model import CostModel
from ..planner.packed import packed_groups, split_pays, whole_work
from ..planner.plan import PlanError, StepPlan
from ..planner.zigzag import zigzag_counts
from .planbuild import build_plan
from .te_cp import cp_candidates, pack_by_tokens

__all__ = ["hybrid_dp_groups", "hybrid_dp_plan", "wlb_llm_groups", "wlb_llm_plan", "ring_beats_local", "zigzag_splits",
           "per_document_groups", "SHARD_RULES"]


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


SHARD_RULES: tuple[str, ...] = ("pays", "faster", "all")
"""WLB-LLM's sharding rules tried per CP size (its adaptive choice of sharding granularity): ``pays``, a document is
sharded over its group where its ring hides its transfer and beats one GPU (the planner's
:func:`~zeppelin_megatron.planner.packed.split_pays`); ``faster``, where its ring beats one GPU with the transfer
exposed or not (:func:`ring_beats_local`); ``all``, every document that zigzag can split (:func:`zigzag_splits`:
WLB-LLM's per-document sharding, each rank a share of every document's attention). Across nodes the second shards
long documents that the first keeps whole (Llama-7B prolong-128k, 128 GPUs, cp = 16: simulated 4044 ms a step
against 5939 on the tables' batches); inside a node the first can win (Llama-13B arxiv-128k, 32 GPUs: 7952 against
8949); where whole documents would leave one rank of a group the busiest, the third (nine 3000-token documents on
8 GPUs: tests/sim/test_baselines.py)."""


def zigzag_splits(s: int, g: int) -> bool:
    """A document of ``s`` tokens can be split zigzag over ``g`` GPUs: ``g >= 2`` and ``s >= 2 g`` (two chunks per
    rank). Example: 31 tokens over 16 GPUs cannot (``31 < 32``), 32 can."""
    return g >= 2 and s >= 2 * g


def ring_beats_local(cost: CostModel, s: int, g: int) -> bool:
    """A ``g``-way ring of ``s`` tokens beats one GPU (``ring_ms < local_ms``, its transfer hidden or not); ``False``
    for ``g < 2`` or ``s < 2 g`` (zigzag needs two chunks per rank). Example: one 65 536-token document over 16 GPUs
    of two nodes (4096 tokens each) beats one GPU whatever the wire."""
    return zigzag_splits(s, g) and cost.ring_ms(s, g, inter_node=g > cost.cluster.gpus_per_node) < cost.local_ms(s)


def per_document_groups(lengths: Sequence[int], cost: CostModel, cp: int) -> list[tuple[int, ...]]:
    """Ranks of each document under WLB-LLM's per-document sharding with CP size ``cp`` (rule ``all``): documents,
    heaviest first by :func:`~zeppelin_megatron.planner.packed.whole_work` (attention kept whole + linear: one ring
    per group carries all its documents), into the group of ``cp`` consecutive ranks with the least work that has
    token room (``cp x tokens_per_gpu``; ties: the lower group; :func:`~.te_cp.pack_by_tokens` with these weights,
    the packing ``te-cp`` runs by tokens); in its group a document of ``2 cp`` tokens or more
    is sharded over all ``cp`` ranks, a shorter one kept whole on the rank with the least work that has room
    (ties: the lower rank), after the sharded ones.

    Example (Llama-7B, 1 x 8 GPUs, cp = 4): ``[20000, 12000, 12000, 3]``: 20000 to group 0, the two 12000s to
    group 1 (less work than group 0 after the first), 3 (under ``2 cp``) to group 1 again, whole, on rank 4:
    ``[(0, 1, 2, 3), (4, 5, 6, 7), (4, 5, 6, 7), (4,)]``.

    Raises :class:`PlanError` (naming the document, its tokens and the limit) when ``cp`` does not divide the world,
    a document over one GPU cannot be sharded (``s < 2 cp``), or a document fits in no group or on no rank of its
    group."""
    cluster = cost.cluster
    world, cap = cluster.world_size, cluster.tokens_per_gpu
    if cp < 1 or world % cp:
        raise PlanError(f"cp_size = {cp} must be a positive divisor of the world size {world}")
    shard = [zigzag_splits(s, cp) for s in lengths]
    bad = next((i for i, (s, sh) in enumerate(zip(lengths, shard)) if s > cap and not sh), None)
    if bad is not None:
        raise PlanError(f"sequence {bad} ({lengths[bad]} tokens) does not fit one GPU ({cap} tokens) and cannot be "
                        f"sharded over cp = {cp}")
    work = whole_work(lengths, cost, world)
    where = pack_by_tokens(lengths, world // cp, cp * cap, weights=work)
    order = sorted(range(len(lengths)), key=lambda i: (-work[i], -lengths[i], i))
    load, tok = [0.0] * world, [0] * world
    groups: list[tuple[int, ...]] = [()] * len(lengths)
    for i in order:
        if shard[i]:
            groups[i] = ranks = tuple(range(where[i] * cp, (where[i] + 1) * cp))
            for r, t in zip(ranks, zigzag_counts(lengths[i], cp)):
                load[r] += work[i] / cp
                tok[r] += t
    for i in order:
        if not shard[i]:
            room = [r for r in range(where[i] * cp, (where[i] + 1) * cp) if tok[r] + lengths[i] <= cap]
            if not room:
                raise PlanError(f"sequence {i} ({lengths[i]} tokens) fits on no GPU of its group (cp = {cp}, "
                                f"{cap} tokens per GPU)")
            r = min(room, key=lambda r: (load[r], r))
            groups[i], load[r], tok[r] = (r,), load[r] + work[i], tok[r] + lengths[i]
    return groups


_SPLITS: dict[str, Callable[[CostModel, int, int], bool]] = {"pays": split_pays, "faster": ring_beats_local}


def wlb_llm_groups(lengths: Sequence[int], cluster: Cluster, cost: CostModel, cp: int,
                   rule: str = "pays") -> list[tuple[int, ...]]:
    """Ranks of each document under WLB-LLM with CP size ``cp`` and sharding ``rule`` (:data:`SHARD_RULES`; see
    module docstring): the planner's :func:`~zeppelin_megatron.planner.packed.packed_groups` (Zeppelin tries the
    ``pays`` packing as a candidate), or :func:`per_document_groups` for ``all``; their :class:`PlanError` prefixed
    ``wlb-llm:``. Raises ``ValueError`` for an unknown ``rule``."""
    if cost.cluster != cluster:
        raise ValueError("cost was built for another cluster; build it with this cluster")
    if rule not in SHARD_RULES:
        raise ValueError(f"wlb-llm sharding rule is {rule!r}, expected one of {list(SHARD_RULES)}")
    try:
        if rule == "all":
            return per_document_groups(lengths, cost, cp)
        return packed_groups(lengths, cost, cp, splits=_SPLITS[rule])
    except PlanError as exc:
        raise PlanError(f"wlb-llm: {exc}") from None


def wlb_llm_plan(lengths: Sequence[int], cluster: Cluster, cost: CostModel, *, cp_size: int | None = None,
                 score: Callable[[StepPlan], float] | None = None) -> tuple[StepPlan, int, str]:
    """WLB-LLM plan, its CP size and sharding rule: the lowest ``score`` (default the simulated step) over the CP
    sizes (``cp_size``: that one only) and :data:`SHARD_RULES` (ties: the smaller CP size, then the earlier rule)."""
    from .simulator import Fastest

    fastest: Fastest[tuple[StepPlan, int, str]] = Fastest()
    candidates = [cp_size] if cp_size is not None else cp_candidates(lengths, cluster)
    seen: set[tuple[tuple[int, ...], ...]] = set()
    failed: PlanError | None = None
    for cp in candidates:
        for rule in SHARD_RULES:
            try:
                groups = wlb_llm_groups(lengths, cluster, cost, cp, rule)
            except PlanError as exc:
                failed = failed or exc
                continue
            key = tuple(groups)
            if key in seen:
                continue  # both rules shard the same documents: the same plan
            seen.add(key)
            plan = build_plan(lengths, groups, cluster, cost)
            if score is None:  # WLB-LLM runs TE CP's ring; a size that cannot win is not simulated
                fastest.simulate(plan, cost, (plan, cp, rule), charges="te")
            else:
                fastest.offer(score(plan), (plan, cp, rule))
    if fastest.kept is None:
        if cp_size is not None and failed is not None:
            raise failed  # the packing's own message: which sequence, its tokens and the limit
        raise PlanError(f"wlb-llm: no CP size in {candidates} can place the batch")
    return fastest.kept
