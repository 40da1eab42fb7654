"""Packed candidates: documents packed by attention + linear work, one layout for both modules (no remap).

The partitioner balances *attention* per rank and leaves the linear modules to the remap, which moves
every layer's q/k/v and output rows to a token-balanced layout and back. Where documents are short
against the batch (github data, and at 16-32 GPUs most data), a placement that evens attention plus
linear time per rank needs no remap at all: WLB-LLM's packing. :func:`packed_groups` builds it for one
CP size ``cp``: ``P / cp`` groups of ``cp`` consecutive ranks; documents, heaviest work first, go to the
group with the least work that has token room (work: kept whole ``local_ms(s) + lin * s``, sharded
``cp * ring_ms(s, cp) + lin * s``, ``lin`` the linear ms per token at the batch's per-rank share); a
document is sharded over its whole group when :func:`split_pays` (its ring hides its transfer and beats
one GPU) or when it does not fit one GPU, else it stays whole on the group rank with the least work
that has room; in Zeppelin's packings (:func:`packed_assignments`) one that no rank of its group has room for
goes whole to the least-loaded rank with room of another group, else on a ring over the roomiest ranks
(:func:`~.packed_whole.spill_whole`), where WLB-LLM's packing fails.
The simulator's ``wlb-llm`` baseline is this placement (without that spill) on TE CP's ring
(:func:`~zeppelin_megatron.sim.baselines.wlb_llm_groups` calls :func:`packed_groups`). With
``head_parallel=True`` a sharded document weighs what Zeppelin's engine can run it in (:func:`sharded_ms`:
the cheaper of the plain ring and a head-parallel one), which is less than the plain ring's ``cp`` calls and
K/V hops: a group holding one then takes more of the whole documents (the plain model leaves them to the
groups without a ring, whose ranks end up the busiest: Llama-3B github-64k on 128 GPUs, ``cp = 8``, the
ringless node's ranks 11-14k tokens against 7-9k elsewhere).

With head-parallel rings a third packing per CP size shards *every* document from
:func:`head_parallel_threshold` on: the shortest length from which a head-parallel ring over ``cp`` ranks
beats one GPU, usually far below where a plain ring hides its transfer (Llama-7B, 16 x 8 H100s: about 4.7k
tokens at ``cp = 16``), so long documents share few wide groups instead of loading single GPUs (13B
prolong-128k on 128 GPUs: the ``cp = 16`` packing at 16k and up, simulated 1.32x -> 1.05x the best peer on
the ratio guard).

:func:`~.packed_search.best_packed` makes candidates per CP size of :func:`~.grouped.pack_sizes`, by both
work models when head-parallel rings are on (identical placements once) and the threshold packing (tried
for growing ``cp`` until its floor rises), and led packings (:mod:`.packed_search`: the longest documents on
one wide leading group, the rest packed after it), bounds each one's predicted step from below
(:func:`quick_floor` before packing, :func:`packed_floor` after, no layout built), finishes those whose
floor is below the step to beat, lowest floor first, as
``plan_step`` finishes a placement but with the linear layout *equal* to the attention layout (Zeppelin's
block widths, head-parallel rings, routing and local slots), and keeps one only where its predicted step
*under the engine's charges* (:data:`CHARGES`: ``predict(..., charges="zeppelin")``, the device-memory work
the simulator charges) is lower than the plan so far's. Why charged: on the 120 steps of
docs/BENCHMARKS.md's batches (3B / 7B / 13B, 16-128 GPUs, every packing finished), choosing by the
uncharged prediction made the simulated steps 1.72% faster on average than the partitioner's plans,
choosing by the charged one 1.87% (15 steps choose differently: 11 simulate faster, up to -5.4%; 4
slower, up to +1.3%); the uncharged prediction underrates the charges of the remap that a packed plan
does not pay. The plan keeps its uncharged ``predicted``, as every plan does. Tried when ``options.remap`` is
``"auto"`` (the default) or ``False`` (a forced token-balanced layout, ``remap=True``, has no packed
candidate) and every placement a candidate uses is allowed.

What the packings bought, simulated, as they came in: docs/planner.md, "Packed candidates".

Example (Llama-7B, 1 node x 4 GPUs, ``cp = 2``, lengths ``[9000, 3000, 3000, 1000]``): only 9000 pays to
shard over 2 GPUs; the heaviest, it goes to group 0 (ranks 0-1) and is sharded there; both 3000s go to group 1
(less work than group 0's), then 1000 too (two 3000s are still less work than the sharded 9000); inside
group 1 whole documents go to the rank with the least work: 3000 on rank 2, 3000 on rank 3, 1000 on rank 2
(a tie: the lower rank). ``packed_groups`` returns ``[(0, 1), (2,), (3,), (2,)]``.

Pure and deterministic.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Sequence

from .cost_heads import head_ring_time, head_widths
from .cost_model import CostModel
from .grouped import layer_floors, ring_floor
from .options import PlannerOptions
from .packed_whole import absorb_whole, spill_whole
from .partition_context import Assignment, assignments_of
from .plan import PlanError
from .zigzag import zigzag_counts

__all__ = ["split_pays", "sharded_ms", "head_parallel_threshold", "share_threshold", "linear_per_token", "whole_work",
           "packed_groups", "packed_assignments", "packed_floor", "quick_floor", "CHARGES", "QUICK"]


CHARGES = "zeppelin"
"""The charges :func:`~.packed_search.best_packed` compares plans under (:func:`~.predict.predict`'s
``charges``): the engine's device-memory work included, which tracked the simulator better than the uncharged
prediction on the candidates (module docstring)."""


def _ring_ms(cost: CostModel, s: int, g: int) -> float:
    return cost.ring_ms(s, g, inter_node=g > cost.cluster.gpus_per_node)


def sharded_ms(cost: CostModel, s: int, cp: int) -> float:
    """Per-rank time of sequence ``s`` sharded alone over a group of ``cp`` ranks as Zeppelin's engine can run
    it: the plain ring's :meth:`~.cost_model.CostModel.ring_ms`, or less where a head-parallel ring's total
    (:func:`~.cost_heads.head_ring_time` at a width of :func:`~.cost_heads.head_widths`: an all-to-all inside
    each node, one call per block) is lower, over the group shapes of :func:`_group_shapes` (the least: the
    packing weighs sequences before it places them). Example: a 27 000-token document on one node of 8 H100s
    (Llama-3B): the plain ring, 8 calls and 7 K/V hops, 8.74 ms a layer per rank; the width-8 head-parallel
    ring, one call and two all-to-alls, 6.75 ms: the packing weighs it by 6.75."""
    key = ("sharded", s, cp)
    hit = cost._cache.get(key)
    if hit is None:
        hit = min([_ring_ms(cost, s, cp)] + [head_ring_time(cost, ranks, [s], a).total
                                             for ranks in _group_shapes(cost, cp) for a in head_widths(cost, ranks)])
        cost._cache[key] = hit
    return hit  # type: ignore[no-any-return]


def head_parallel_threshold(lengths: Sequence[int], cost: CostModel, cp: int) -> int | None:
    """The shortest of ``lengths`` from which sharding over ``cp`` ranks pays with a head-parallel ring:
    ``s >= 2 cp``, one GPU takes more than a call's overhead (``local_ms(s) > call_overhead_ms``) and
    :func:`sharded_ms` is below ``local_ms(s)``; ``None`` when no length pays. Found by bisection over the
    distinct lengths (``O(log n)`` ring times): the test holds from one length on, for every (model, cp) of
    ``tests/planner/test_packed.py``'s grid (Llama-3B / 7B, ``cp`` 2-128, lengths up to 70k: one flip each,
    at 3.2k-15.7k tokens). Example: Llama-7B on 16 x 8 H100s, ``cp = 16``: about 4.7k tokens."""
    if cp < 2:
        return None
    o = cost.call_overhead_ms

    def pays(s: int) -> bool:
        return s >= 2 * cp and cost.local_ms(s) > o and sharded_ms(cost, s, cp) < cost.local_ms(s)

    xs = sorted(set(lengths))
    lo, hi = 0, len(xs)  # the first index that pays
    while lo < hi:
        mid = (lo + hi) // 2
        if pays(xs[mid]):
            hi = mid
        else:
            lo = mid + 1
    return xs[lo] if lo < len(xs) else None


def share_threshold(lengths: Sequence[int], cost: CostModel, ranks: int) -> int | None:
    """The shortest of ``lengths`` whose work kept whole (``local_ms(s) + lin * s``, as :func:`packed_groups`
    weighs it, ``lin`` the linear ms per token at the batch's share of ``ranks``) exceeds the mean work per rank
    over ``ranks``; ``None`` when none does. Kept whole, such a document alone loads its GPU above the
    balanced level, so it must be sharded; every shorter one can stay whole (FlexSP shards only those). Example
    (Llama-13B TP 2 on 8 x 8 H100s, 32 ranks; batch 0 of docs/BENCHMARKS.md's arxiv-64k, 86 documents): the mean
    is 89.6 ms of work a layer, which the 7 documents from 32 584 tokens on exceed; the threshold packing at ``cp
    = 4`` shards the 65 from 4 355 tokens on."""
    work = whole_work(lengths, cost, ranks)
    mean = sum(work) / ranks
    over = [s for s, w in zip(lengths, work) if w > mean]
    return min(over) if over else None


def linear_per_token(lengths: Sequence[int], cost: CostModel, ranks: int) -> float:
    """The linear modules' ms per token at the batch's share of ``ranks`` (``linear_ms(share) / share``, ``share =
    sum(lengths) // ranks``, at least 1): what the packings weigh a sequence's tokens by."""
    share = max(1, sum(lengths) // ranks)
    return cost.linear_ms(share) / share


def whole_work(lengths: Sequence[int], cost: CostModel, ranks: int) -> list[float]:
    """Each sequence's work kept whole, as :func:`packed_groups` weighs it: ``local_ms(s) + lin * s``, ``lin``
    from :func:`linear_per_token` over ``ranks``."""
    lin = linear_per_token(lengths, cost, ranks)
    return [cost.local_ms(s) + lin * s for s in lengths]


def split_pays(cost: CostModel, s: int, g: int) -> bool:
    """A ``g``-way ring of ``s`` tokens hides its transfer (``comm_ratio >= 1``) and beats one GPU
    (``ring_ms < local_ms``); ``False`` for ``g < 2`` or ``s < 2 g`` (zigzag needs two chunks per rank)."""
    if g < 2 or s < 2 * g or not cost.ring_may_beat_local(s, g):
        return False
    key = ("split_pays", s, g)
    hit = cost._cache.get(key)
    if hit is None:  # memoised: every packing of a step asks for every sequence
        inter = g > cost.cluster.gpus_per_node
        hit = cost._cache[key] = (cost.comm_ratio(s, g, inter_node=inter) >= 1.0
                                  and cost.ring_ms(s, g, inter_node=inter) < cost.local_ms(s))
    return hit  # type: ignore[no-any-return]


def packed_groups(lengths: Sequence[int], cost: CostModel, cp: int, *, head_parallel: bool = False,
                  shard_from: int | None = None, first: int = 0, lead: Sequence[int] = (),
                  absorb: bool = False, wide: Sequence[tuple[int, int]] = (),
                  splits: Callable[[CostModel, int, int], bool] | None = None,
                  spill: bool = False) -> list[tuple[int, ...]]:
    """Ranks of each sequence under the packing with CP size ``cp`` (module docstring): ``(r,)`` for a
    whole one, the group's ``cp`` ranks in order for a sharded one.

    ``head_parallel``: a sharded sequence's work is its ring's time as Zeppelin's engine can run it, the
    lesser of the plain ring's and the head-parallel one's (:func:`sharded_ms`); ``False`` (default, and
    WLB-LLM's packing, which runs TE CP's plain ring): the plain ring's. ``shard_from``: sequences of at
    least that many tokens are sharded, and those over one GPU, no others (:func:`head_parallel_threshold`:
    from there a head-parallel ring beats one GPU, and a plain ring that pays, :func:`split_pays`, pays
    head-parallel too, so no sequence below it would be sharded anyway); ``None`` (default): those where
    ``splits(cost, s, cp)`` (default :func:`split_pays`; the ``wlb-llm`` baseline also tries its own rule) or over
    one GPU. ``first``: pack over ranks ``first .. P-1`` only (``(P - first) / cp``
    groups from rank ``first``; the ranks before hold a leading group, :mod:`.packed_search`), default all.
    ``lead``: indices of sequences sharded together over ranks ``0 .. first-1`` (a *filled* leading group,
    ``first >= 2``): that group then takes part in the packing as one more group, weighed per rank (its work
    times ``cp / first`` against a CP group's), starting with the lead's work (:func:`sharded_ms` over
    ``first`` ranks, or the plain ring's); it takes whole sequences only (to its least-loaded rank), the other
    groups shard as above. Example (Llama-7B, 1 x 8 GPUs): ``[12000] + [3000] * 30``, ``first = 2``, ``cp = 1``,
    ``lead = [0]``: 12000 is sharded over ranks 0 and 1, which then take two and one of the short documents
    (their load reached the others'), ranks 2-7 five or four each (FlexSP's shape: one pair, six single GPUs;
    with 40000 instead the pair takes none). ``absorb``: after placing, each group's ring takes whole
    sequences off the group's busiest rank while that lowers the group's busiest load
    (:func:`~.packed_whole.absorb_whole`); default
    off (WLB-LLM's packing keeps every whole sequence whole). ``wide``: ``(sequence, z)`` pairs
    (:func:`~.packed_wide.wide_spans`): each such sequence is sharded over a *span* of ``z`` consecutive ranks (a
    multiple of ``cp``: whole CP groups), laid from rank ``first`` on, widest first; its work (its ring over ``z``
    ranks) loads every CP group it covers by ``cp / z`` of it before the others are packed, which then fill those
    groups like any other (a rank holds its span's ring and its group's). Example (the packing above with ``wide =
    [(0, 4)]`` and ``cp = 2``): 9000 is sharded over ranks 0-3, both CP groups start at half its work; the 3000s go
    to groups 0 and 1 (ranks 0 and 2), 1000 to group 0's less-loaded rank 1: ``[(0, 1, 2, 3), (0,), (2,), (1,)]``.

    Raises :class:`PlanError` (naming the sequence, its tokens and the limit) when ``cp`` does not divide
    the ranks packed over, a sequence too long for one GPU cannot be sharded (``cp = 1`` or ``s < 2 cp``), a
    span is malformed (:func:`_spans`), or a sequence fits in no group (``cp * tokens_per_gpu`` tokens) or on no
    GPU of its group (without ``spill``; with it, such a sequence goes where :func:`~.packed_whole.spill_whole`
    finds room, Zeppelin's candidates only: WLB-LLM's packing has no such step)."""
    cluster = cost.cluster
    world, cap = cluster.world_size, cluster.tokens_per_gpu
    if not 0 <= first < world:
        raise PlanError(f"first = {first} must be a rank in [0, {world})")
    if cp < 1 or (world - first) % cp:
        raise PlanError(f"cp_size = {cp} must be a positive divisor of the world size {world}" if not first else
                        f"cp_size = {cp} must be a positive divisor of the {world - first} ranks from {first}")
    n_groups = (world - first) // cp
    led = set(lead)
    if led and (first < 2 or min(lengths[i] for i in led) < 2 * first):
        raise PlanError(f"a leading group of {first} ranks needs first >= 2 and at least {2 * first} tokens per "
                        f"sequence it holds (zigzag), got sequences of {[lengths[i] for i in sorted(led)]}")
    spans = _spans(lengths, cp, first, world, led, wide)
    if shard_from is None:
        rule = splits or split_pays
        shard = [rule(cost, s, cp) or s > cap for s in lengths]
    else:  # a plain ring that pays (split_pays) pays head-parallel too: no such sequence is below shard_from
        shard = [s >= shard_from or s > cap for s in lengths]
    for i in led | spans.keys():
        shard[i] = False  # not sharded over a CP group: over the leading one or its span (below)
    bad = next((i for i, (s, sh) in enumerate(zip(lengths, shard)) if sh and (cp == 1 or s < 2 * cp)), None)
    if bad is not None:
        raise PlanError(f"sequence {bad} ({lengths[bad]} tokens) does not fit one GPU ({cap} tokens) and cannot "
                        f"be sharded over cp = {cp}")
    lin_per_token = linear_per_token(lengths, cost, world - (0 if led else first))
    ring_work = sharded_ms if head_parallel else _ring_ms
    local_ms = cost.local_ms
    work = [(cp * ring_work(cost, s, cp) if sh else local_ms(s)) + s * lin_per_token
            for s, sh in zip(lengths, shard)]
    for i in led:
        work[i] = first * ring_work(cost, lengths[i], first) + lengths[i] * lin_per_token
    for i, ranks in spans.items():
        work[i] = len(ranks) * ring_work(cost, lengths[i], len(ranks)) + lengths[i] * lin_per_token
    order = [i for _, _, i in sorted(zip([-w for w in work], [-s for s in lengths], range(len(lengths))))
             if i not in led and i not in spans]
    # groups by (work, index): the least-loaded group with room, ties to the lower group; a filled leading
    # group is group n_groups, its work scaled by cp / first (per-rank load against a CP group's). Entries are
    # unique (one per group), so the pop order does not depend on how the heap is arranged (heapreplace).
    # A span's sequence loads each CP group it covers with its work per rank times cp, and its tokens there.
    g_work = [0.0] * n_groups
    g_tok = [0] * n_groups
    for i, ranks in spans.items():
        for r, t in zip(ranks, zigzag_counts(lengths[i], len(ranks))):
            g_work[(r - first) // cp] += work[i] / len(ranks)
            g_tok[(r - first) // cp] += t
    heap = [(w, b) for b, w in enumerate(g_work)]
    where = [-1] * len(lengths)
    scale = cp / first if led else 1.0
    room, lead_room = cp * cap, first * cap
    if led:
        g_tok.append(sum(lengths[i] for i in led))
        heap.append((scale * sum(work[i] for i in led), n_groups))
    if led or spans:
        heapq.heapify(heap)
    pop, push, replace = heapq.heappop, heapq.heappush, heapq.heapreplace
    # CP groups without room for a sequence wait aside, roomiest first, until a shorter one fits them: the heap holds
    # the groups with room for the sequences tried so far, the least-loaded of those with room for this one is its
    # least-loaded group with room (near full, popping every full group for every sequence cost O(n P))
    full_groups: list[tuple[int, float, int]] = []  # (-free tokens, work, group)
    for i in order:
        s = lengths[i]
        while full_groups and -full_groups[0][0] >= s:
            _, w, b = pop(full_groups)
            push(heap, (w, b))
        skipped = []  # the filled leading group, which takes whole sequences only: back after this one
        while heap:
            w, b = heap[0]
            if b < n_groups:
                if g_tok[b] + s <= room:
                    break
                push(full_groups, (g_tok[b] - room, w, b))
            elif not shard[i] and g_tok[b] + s <= lead_room:
                break
            else:
                skipped.append(heap[0])
            pop(heap)
        if not heap:
            raise PlanError(f"sequence {i} ({s} tokens) fits in no group of {cp * cap} tokens (cp = {cp})")
        where[i] = b
        g_tok[b] += s
        replace(heap, (w + (work[i] if b < n_groups else scale * work[i]), b))
        for item in skipped:
            push(heap, item)
    load = [0.0] * world
    tok = [0] * world  # what room is checked against: a sharded sequence's ceil(s / cp) per rank
    groups: list[tuple[int, ...]] = [()] * len(lengths)
    for i, ranks in [(i, tuple(range(first))) for i in led] + list(spans.items()):
        groups[i] = ranks
        for r, t in zip(ranks, zigzag_counts(lengths[i], len(ranks))):
            load[r] += work[i] / len(ranks)
            tok[r] += t
    group_ranks = [tuple(range(first + b * cp, first + (b + 1) * cp)) for b in range(n_groups)]
    for i, s in enumerate(lengths):
        if shard[i]:
            groups[i] = ranks = group_ranks[where[i]]
            per, t = work[i] / cp, -(-s // cp)
            for r in ranks:
                load[r] += per
                tok[r] += t
    # whole sequences: per group, ranks by (work, rank), the least-loaded one with room
    whole_max = 0  # the longest sequence placed whole so far (spill_whole: which may take a ring)
    spilled: set[tuple[int, ...]] = set()  # spill_whole's rings: absorb none
    members = group_ranks + ([tuple(range(first))] if led else [])  # the ranks that take whole sequences, by group
    rank_heaps = [sorted((load[r], r) for r in ranks) for ranks in members]
    full_ranks: list[list[tuple[int, float, int]]] = [[] for _ in rank_heaps]  # per group: (-free tokens, load, rank)
    for i in order:
        if groups[i]:
            continue
        s, h, full = lengths[i], rank_heaps[where[i]], full_ranks[where[i]]
        while full and -full[0][0] >= s:  # ranks set aside (as groups above) with room again
            _, w, r = pop(full)
            push(h, (w, r))
        while h and tok[h[0][1]] + s > cap:
            w, r = pop(h)
            push(full, (tok[r] - cap, w, r))
        if not h:
            if not spill:
                raise PlanError(f"sequence {i} ({s} tokens) fits on no GPU of group {where[i]} ({cap} tokens per GPU)")
            groups[i] = spill_whole(i, s, work[i], where[i], cap, load, tok, members, whole_max)
            for k in {n_groups if r < first else (r - first) // cp for r in groups[i]}:  # the groups it loaded
                rank_heaps[k] = sorted((load[r], r) for r in members[k])  # every rank back (sorted: a heap)
                full_ranks[k].clear()
            if len(groups[i]) == 1:
                whole_max = max(whole_max, s)
            else:
                spilled.add(groups[i])
            continue
        whole_max = max(whole_max, s)
        w, r = h[0]
        groups[i] = (r,)
        tok[r] += s
        load[r] += work[i]
        replace(h, (w + work[i], r))
    if absorb:
        absorb_whole(lengths, cost.cluster.tokens_per_gpu, groups, work, load, tok, frozenset(spilled))
    return groups


def _spans(lengths: Sequence[int], cp: int, first: int, world: int, led: set[int],
           wide: Sequence[tuple[int, int]]) -> dict[int, tuple[int, ...]]:
    """The ranks of each wide span (:func:`packed_groups`' ``wide``): ``(sequence, z)`` pairs, laid from rank
    ``first`` on, largest ``z`` first (ties: the given order), each over ``z`` consecutive ranks. Raises
    :class:`PlanError` for a ``z`` that is not a multiple of ``cp`` above it, a sequence under ``2 z`` tokens, one in
    the lead or twice, or spans over more than the ranks packed."""
    out: dict[int, tuple[int, ...]] = {}
    at = first
    for i, z in sorted(wide, key=lambda x: -x[1]):
        if z <= cp or z % cp or lengths[i] < 2 * z or i in led or i in out or at + z > world:
            raise PlanError(f"wide span of {z} ranks for sequence {i} ({lengths[i]} tokens): needs a multiple of "
                            f"cp = {cp} above it, at least {2 * z} tokens, a sequence in no other span or lead, and "
                            f"room in the {world - first} ranks from {first}")
        out[i] = tuple(range(at, at + z))
        at += z
    return out


def packed_assignments(lengths: Sequence[int], cost: CostModel, cp: int, *, head_parallel: bool = False,
                       shard_from: int | None = None, first: int = 0, lead: Sequence[int] = (),
                       absorb: bool = False, wide: Sequence[tuple[int, int]] = ()) -> list[Assignment] | None:
    """:func:`packed_groups` as the partitioner's :class:`Assignment` list (``local``, ``intra_node`` or
    ``inter_node`` by the group's nodes), or ``None`` when the packing fails (:class:`PlanError`) or leaves
    a rank over ``tokens_per_gpu`` (the packing checks a sharded sequence's room per group: its zigzag
    chunks can still round a nearly full rank over, e.g. two 5-token sequences on 2 GPUs of 5 tokens put
    3 + 3 on the first; such a packing is no candidate)."""
    try:
        groups = packed_groups(lengths, cost, cp, head_parallel=head_parallel, shard_from=shard_from, first=first,
                               lead=lead, absorb=absorb, wide=wide, spill=True)
    except PlanError:
        return None
    cl = cost.cluster
    held = [0] * cl.world_size
    for s, g in zip(lengths, groups):
        if len(g) == 1:
            held[g[0]] += s
            continue
        for r, t in zip(g, zigzag_counts(s, len(g))):
            held[r] += t
    if max(held) > cl.tokens_per_gpu:
        return None
    return assignments_of(groups, cl)


def packed_floor(lengths: Sequence[int], assignments: Sequence[Assignment], cost: CostModel,
                 options: PlannerOptions, charges: str = CHARGES) -> float:
    """A lower bound on ``predict(finish(assignments), charges=charges).step_ms`` when the linear layout is
    the attention layout (no remap, so no remap windows), cheap: no layout built.

    :func:`~.predict.predict` gives such a plan ``L * max_r (attn_r + linear_ms(t_r))`` (no remap, no remap
    copies), ``t_r`` the tokens rank ``r`` holds (``zigzag_tokens`` of each of its ring positions, its whole
    sequences), and ``attn_r = max(tot_r, own_r + loc_r)`` (:func:`~.predict.rank_attention`, ``loc_r`` its
    local sequences' ``local_ms`` plus their row copies under ``charges``, at least the call overhead when
    any), where every ring's total and own times are at least :func:`~.grouped.ring_floor`'s under the same
    charges whatever the widths and routes. Example (``charges="none"``): 4 GPUs, two whole sequences of 3000
    tokens on ranks 0 and 1: ``L * (local_ms(3000) + linear_ms(3000))``.
    """
    return cost.model.layers * max(layer_floors(lengths, assignments, cost, options, charges))


def quick_floor(longest: Sequence[int], cost: CostModel, cp: int, options: PlannerOptions,
                charges: str = CHARGES, shard_from: int | None = None, absorb: bool = False,
                one_group: bool = False, spans: Sequence[tuple[int, int]] = ()) -> float:
    """A lower bound on :func:`packed_floor` of the packing with CP size ``cp``, without packing: ``longest``
    are some of the batch's sequences, longest first (the caller passes the first few). A sequence the
    packing shards (``split_pays``, over one GPU, or from ``shard_from`` on) puts at least its ring's
    :func:`~.grouped.ring_floor` total on every group rank (a ring's floor only grows with the sequences sharing it) and
    ``zigzag_tokens`` of its position on each; one kept whole puts ``max(local_ms(s), overhead)`` (no copies:
    its rank may hold no ring) and ``s`` tokens on its rank; every rank's linear time is at least ``p * tokens``
    (``p``: the profile's least ms per token). Stops after the longest sharded and the longest whole sequence
    (later ones are shorter). ``absorb`` (the packing's rings may absorb whole sequences,
    :func:`~.packed_whole.absorb_whole`): a
    sequence kept whole of at least ``2 cp`` tokens puts the lesser of the two (whole, or on a ring of its group).
    ``one_group``: the packing has one CP group (``cp`` is all the ranks packed over), so every sharded sequence of
    ``longest`` shares its ring, which puts at least their ring's floor and their zigzag tokens together on its
    ranks (a ring's floor and tokens only grow with the sequences it holds). ``spans``: ``(s, z)`` for each sequence
    on a wide span (:func:`packed_groups`' ``wide``; not among ``longest``), which puts its ring's floor over ``z``
    ranks and its zigzag tokens there. Example: the batch's longest
    sequence, 123 936 tokens, sharded over ``cp = 8`` on Llama-7B: about 6.4 s a step, far above a 2.5 s plan, so
    that packing is never built."""
    cap = cost.cluster.tokens_per_gpu
    per_token = cost.least_linear_ms_per_token()

    def on_ring(ss: Sequence[int], g: int = cp) -> float:  # the cheapest ring of ss over g ranks, its busiest tokens
        peak = max(map(sum, zip(*(zigzag_counts(s, g) for s in ss))))
        return min(ring_floor(cost, ranks, list(ss), options.head_parallel, charges)[0]
                   for ranks in _group_shapes(cost, g)) + per_token * peak

    bound = max((on_ring([s], z) for s, z in spans), default=0.0)
    sharded: list[int] = []
    seen_whole = False
    for s in longest:
        if s > cap and (cp == 1 or s < 2 * cp):
            return math.inf  # packed_groups cannot place it: no packing
        if s > cap or (s >= shard_from if shard_from is not None else split_pays(cost, s, cp)):
            sharded.append(s)
        elif not seen_whole:  # later whole ones are shorter
            seen_whole = True
            whole = max(cost.local_ms(s), cost.call_overhead_ms) + per_token * s
            if absorb and cp >= 2 and s >= 2 * cp:
                whole = min(whole, on_ring([s]))
            bound = max(bound, whole)
        if seen_whole and sharded and not one_group:
            break
    if sharded:
        bound = max(bound, on_ring(sharded if one_group else sharded[:1]))
    return cost.model.layers * bound


def _group_shapes(cost: CostModel, cp: int) -> tuple[tuple[int, ...], ...]:
    """One group of ``cp`` consecutive ranks per distinct node pattern (``3`` GPUs per node, ``cp = 2``:
    ``(0, 1)`` inside a node and ``(2, 3)`` across two), so a bound taken over these holds for every group
    (a ring's floor depends on its ranks only through their nodes: hops, head-parallel blocks)."""
    key = ("group_shapes", cp)
    hit = cost._cache.get(key)
    if hit is not None:  # memoised: every sharded document and floor asks
        return hit  # type: ignore[no-any-return]
    cl = cost.cluster
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
    for b in range(cl.world_size // cp):
        ranks = tuple(range(b * cp, (b + 1) * cp))
        shapes.setdefault(tuple(cl.node_of(r) - cl.node_of(ranks[0]) for r in ranks), ranks)
    cost._cache[key] = out = tuple(shapes.values())
    return out


QUICK = 8
"""How many of the longest sequences :func:`quick_floor` looks at, at most."""
