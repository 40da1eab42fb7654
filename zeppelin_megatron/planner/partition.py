"""Hierarchical sequence partitioner: placements, node assignment, GPU assignment.

Input: sequence lengths, a cluster and a cost model. Output: for each sequence a
placement and its ranks (ring order for split sequences). Two levels, both
greedy "largest first, least loaded first" (LPT) heuristics:

1. Nodes. Sequences in decreasing cost order. A sequence spans nodes
   (``inter_node``) when even one whole node cannot take it: its tokens exceed
   a node's free capacity, or splitting it over all ``G`` GPUs of the least
   loaded node would push that node above the per-rank target ``t = W / P``
   (``W``: total whole-sequence attention time, ``P``: GPUs). It then takes the
   smallest number of whole nodes ``k`` whose ring brings its
   per-rank time under ``t`` (and whose compute hides its ring transfer over
   the network, see below), on the ``k`` least loaded nodes (ring in node
   order). Other sequences go to the least loaded node that has room. Then a
   local search (:mod:`.node_balance`) moves work off the busiest node: light
   sequences, trades, a slice of a sequence lent as a ring over its node plus
   ``m`` GPUs of another node (``inter_node`` over ``G + m`` ranks), or a
   whole-node ring's share.
2. GPUs, node by node (:mod:`.place_gpus`). Each node's target is its load divided by ``G``.
   A sequence goes whole to the least loaded GPU (``local``) if that keeps
   the GPU under the node target (to the least loaded one that also stays
   under the linear layout's token quota, if that one is over it); otherwise it is split over the smallest
   number ``g >= 2`` of least loaded GPUs for which every one of them stays
   under target (``intra_node``), ring order by local index. The node is
   filled twice, once that way and once giving every split sequence a ring
   over the whole node (even ring loads); the fill with the lower peak plus
   node remap time (:func:`~.score.node_remap`) wins.
3. Check and correct. Each result is scored by what it costs the step: the
   busiest GPU's attention time by the rule of :func:`~.predict.predict`
   (:func:`~.score.attention_times`: shared ring calls, ring waits filled by local
   work, routed cross-node hops) plus the remap time its attention layout
   forces (:func:`~.score.remap_time`; the linear modules' time is the same for every
   plan). While the busiest GPU exceeds the mean by more than ``slack``,
   level 1 restarts its search from what level 2 made of each node (node load
   = ``G`` x its busiest GPU; a split sequence's cost = its ring's GPU-time)
   and level 2 runs again, up to :data:`CORRECTION_ROUNDS` times. Level 1's
   estimates (smallest ring, even GPUs) differ from level 2's outcome by a few
   percent, as much as the balance target. If level 1 lent any sequence, the
   whole is repeated without lends: evening out a lent GPU's time can pile
   short sequences' tokens on the node's other GPUs, and the remap that
   follows can cost more than the balance gained. The best score wins among
   the results whose busiest GPU is within ``balance_target`` of the mean
   (1.05); only when no result reaches it does the best score overall win.
   Within each of these two classes, results where no node-spanning ring
   shares GPUs with two others (:func:`_chained`: such a ring waits for both,
   which the score does not see) win over results where one does.

Splitting is allowed on a link only where the sequence's compute-to-
communication ratio (one off-diagonal ring step's kernel time over its
transfer time, :meth:`CostModel.comm_ratio`) is at least ``min_ratio``: a
sequence too short to hide its ring traffic stays local, unless it does not
fit in memory, in which case it is split anyway (the least bad choice). A
split must also beat keeping the sequence whole (a ring of tiny blocks pays
the per-call overhead at every step).
No fixed length thresholds: everything comes from the cost model.

Module map: the inputs, limits and memoised cost queries every stage reads are
a :class:`~.partition_context.PartitionContext`; level 1 is here
(:func:`_assign_nodes`, :func:`_pick_span`), its local search in
:mod:`.node_balance`, level 2 in :mod:`.place_gpus`, the scores in
:mod:`.score`; both levels place long runs of equal sequences whole rounds at a time
(:mod:`.even_rounds`, exact). Imports run one way: ``node_balance`` and ``score`` import the
context, ``place_gpus`` imports those, ``partition`` imports them all.
"""

from __future__ import annotations

import heapq
from itertools import compress, islice, repeat
from operator import eq, ne
from typing import Sequence

from .capacity_fill import capacity_fill
from .cost_model import CostModel
from .even_rounds import MIN_ROUNDS, even_rounds
from .gc_pause import gc_paused
from .node_balance import NodeState, rebalance_nodes
from .options import PlannerOptions
from .partition_context import Assignment, PartitionContext
from .place_gpus import place_gpus
from .plan_parts import PlanError
from .score import attention_times, remap_time
from .zigzag import ring_max_tokens, ring_node_tokens

__all__ = ["Assignment", "PartitionContext", "partition", "attention_times", "remap_time"]  # re-exported


SPAN_FACTORS: tuple[float, ...] = (1.0, 0.5, 0.25)
"""Candidate thresholds (fractions of the per-rank target) for spanning nodes."""

CORRECTION_ROUNDS = 3
"""Times level 1 is rebalanced on level 2's outcome for one span threshold."""


def partition(lengths: Sequence[int], cost: CostModel, options: PlannerOptions) -> list[Assignment]:
    """Place every sequence; see the module docstring. Deterministic.

    For each span threshold (the target, then lower ones while needed), with
    lends and then, if level 1 lent any sequence, without: level 1, level 2,
    and up to :data:`CORRECTION_ROUNDS` corrections (:func:`_correct`) while
    the busiest GPU exceeds the mean attention time by more than ``slack``.
    Every result is scored by busiest-GPU attention time plus remap time; the
    lowest score among results within ``balance_target`` wins (ties: the
    earlier), or the lowest overall if none is within it; in either class a
    result without :func:`_chained` rings beats one with them. Lower thresholds, which span more
    sequences over nodes (batches dominated by a few huge sequences), are
    tried unless the best result so far is within ``slack``. A sequence a level cannot fit where it
    chose is placed after the nodes (:func:`~.place_gpus.place_spilled`); a candidate whose
    spilled sequences still find no room is skipped; if none fits, the batch is packed
    by tokens alone (:func:`~.capacity_fill.capacity_fill`), which fits by
    construction or names the sequence it cannot place.
    """
    with gc_paused():  # a million sequences allocate millions of objects (gc_pause.py)
        return _partition(lengths, cost, options)


def _partition(lengths: Sequence[int], cost: CostModel, options: PlannerOptions) -> list[Assignment]:
    check_ring_fit(lengths, cost.cluster.world_size, cost.cluster.tokens_per_gpu)
    ctx = PartitionContext(lengths, cost, options)
    order, ends = placement_runs(lengths, ctx.w)
    if len(ends) == 1:  # one length: the order is the index order, its own inverse
        rank_in_order = list(order)
    else:
        rank_in_order = [0] * len(lengths)  # sequence -> its place in the order
        for k, i in enumerate(order):
            rank_in_order[i] = k
    # best: ((misses balance_target, chained rings, score), assignments, balanced within slack); lower key wins
    best: tuple[tuple[bool, bool, float], list[Assignment], bool] | None = None
    seen: set[tuple] = set()  # level-1 outcomes already placed (thresholds often agree)
    for factor in SPAN_FACTORS if ctx.allow_inter and ctx.cluster.nodes > 1 else SPAN_FACTORS[:1]:
        for lend in (True, False):  # without lends only if some were made
            try:
                st = _assign_nodes(ctx, order, ctx.limit * factor, rank_in_order, lend=lend, ends=ends)
            except PlanError:  # this candidate runs out of tokens somewhere: the others may not
                continue
            outcome = (tuple(st.inter.items()), tuple(map(tuple, st.seqs)), tuple(st.spill))
            if outcome in seen:
                if not st.lends:
                    break
                continue
            seen.add(outcome)
            for rnd in range(CORRECTION_ROUNDS + 1):
                try:
                    assignments, tokens = place_gpus(ctx, st)
                except PlanError:
                    break
                att = attention_times(ctx, assignments)
                peak, mean = max(att), sum(att) / len(att)
                within = peak <= mean * (1.0 + options.slack)
                key = (peak > mean * options.balance_target, _chained(assignments),
                       peak + remap_time(ctx, tokens))
                if best is None or key[:2] < best[0][:2] or (key[:2] == best[0][:2] and key[2] < best[0][2] - 1e-9):
                    best = (key, assignments, within)
                if within or rnd == CORRECTION_ROUNDS or not _correct(ctx, st, assignments, att, rank_in_order,
                                                                      lend=lend):
                    break
            if not st.lends:
                break
        if best is not None and best[2]:
            break  # the best plan is within slack of its mean: no need to try more spanning
    if best is None:  # no balanced candidate fits the token capacity: pack by tokens alone
        return capacity_fill(ctx)
    return best[1]


def placement_order(lengths: Sequence[int], w: Sequence[float]) -> list[int]:
    """Sequences costliest first (``w``, the time whole), ties: longer, then lower index.

    ``w`` depends on the length alone, so the distinct lengths are sorted and each one's
    sequences follow in index order. Example: lengths ``[5, 9, 5]`` -> ``[1, 0, 2]``.
    """
    return placement_runs(lengths, w)[0]


def placement_runs(lengths: Sequence[int], w: Sequence[float]) -> tuple[list[int], list[int]]:
    """:func:`placement_order` and where each run of one length ends in it (exclusive, ascending).

    Example: lengths ``[5, 9, 5]`` -> ``([1, 0, 2], [1, 3])``.
    """
    distinct = set(lengths)
    by_length: dict[int, list[int]] = {}
    if len(distinct) == 1:
        by_length = {lengths[0]: list(range(len(lengths)))}
    elif len(distinct) <= 8:  # few lengths (batches of equal sequences): one C-level pass each
        by_length = {s: list(compress(range(len(lengths)), map(eq, lengths, repeat(s)))) for s in distinct}
    else:
        for i, s in enumerate(lengths):
            by_length.setdefault(s, []).append(i)
    first = {s: idx[0] for s, idx in by_length.items()}
    out: list[int] = []
    ends: list[int] = []
    for s in sorted(by_length, key=lambda s: (-w[first[s]], -s)):
        out.extend(by_length[s])
        ends.append(len(out))
    return out, ends


def check_ring_fit(lengths: Sequence[int], world: int, cap: int) -> None:
    """Refuse a sequence that no placement can hold: longer than one GPU and than any ring's positions.

    A sequence of ``s > cap`` tokens needs a ring of ``g <= world`` GPUs with ``s >= 2g``
    (zigzag chunks) and ``ceil(s / g) <= cap`` (:func:`~.zigzag.ring_max_tokens`).
    Example: 4 GPUs of 10 tokens: 41 tokens leave 11 on some GPU even over all 4: refused.

    Raises:
        PlanError: naming the sequence, its length, the GPUs and ``tokens_per_gpu``.
    """
    if not lengths or max(lengths) <= cap:  # every sequence fits one GPU (the common case, C-level)
        return
    for i, s in enumerate(lengths):
        if s <= cap:
            continue
        g = min(world, s // 2)  # the largest ring possible holds the fewest tokens per GPU
        if g < 2 or ring_max_tokens(s, g) > cap:
            held = s if g < 2 else ring_max_tokens(s, g)
            raise PlanError(
                f"sequence {i} of length {s} does not fit: even split over {max(g, 1)} of the {world} GPUs "
                f"it leaves {held} tokens on a GPU, more than tokens_per_gpu = {cap}"
            )


def _chained(assignments: list[Assignment]) -> bool:
    """Some node-spanning ring shares GPUs with two or more other node-spanning rings.

    Every rank runs its rings in one global order, so such a ring starts only
    after both of the others have ended on its GPUs; members that left the
    earlier of the two wait (:func:`~.predict.predict` does not count it).
    Example: rings over ranks 0-15, 16-31 and (8-15, 16-23): the third waits
    for the first on ranks 8-15 and for the second on 16-23.
    """
    on: dict[int, list[tuple[int, ...]]] = {}
    rings = {a.ranks for a in assignments if a.placement == "inter_node"}
    for ring in rings:
        for r in ring:
            on.setdefault(r, []).append(ring)
    for ring in rings:
        others = {o for r in ring for o in on[r] if o != ring}
        if len(others) > 1:
            return True
    return False


def _correct(ctx: PartitionContext, st: NodeState, assignments: list[Assignment], att: list[float],
             rank_in_order: Sequence[int], *, lend: bool = True) -> bool:
    """Level 1 again on level 2's outcome; True if it moved anything.

    Each node's load becomes ``G`` times its busiest GPU's attention time in
    ``att`` (what counts for the step: ring waits not filled, shared ring
    calls, and uneven GPUs left by the fill level 2 chose are all in it), and
    each node-local sequence's cost what level 2 gave it: ``w`` if local,
    ``g * ring_ms(s, g)`` on a ring of ``g``. Then :func:`rebalance_nodes`
    moves work off the busiest node.
    """
    gpn = ctx.gpn
    for n in range(ctx.cluster.nodes):
        st.load[n] = gpn * max(att[n * gpn:(n + 1) * gpn])
        for i in st.seqs[n]:
            a = assignments[i]
            g = len(a.ranks)
            st.cost[i] = ctx.w[i] if g == 1 else g * ctx.cost.ring_ms(ctx.lengths[i], g, inter_node=False)
    return rebalance_nodes(ctx, st, rank_in_order, lend=lend)


def run_ends(order: Sequence[int], lengths: Sequence[int]) -> list[int]:
    """Where each run of equal lengths in ``order`` ends (exclusive). Example: ``[1, 0, 2]`` of
    lengths ``[5, 9, 5]`` -> ``[1, 3]``."""
    ls = list(map(lengths.__getitem__, order))
    return list(compress(range(1, len(ls)), map(ne, ls, islice(ls, 1, None)))) + [len(ls)]


def _assign_nodes(ctx: PartitionContext, order: list[int], span_limit: float, rank_in_order: Sequence[int], *,
                  lend: bool = True, ends: Sequence[int] | None = None) -> NodeState:
    """Level 1: node of each sequence, or the node-spanning ring of an inter-node one.

    Greedy placement in ``order``, then :func:`rebalance_nodes`. A node's load
    is the GPU-time (sum over its GPUs) it is expected to carry. ``ends``: :func:`run_ends`
    of ``order`` (computed when not given); long runs of equal sequences that go round
    robin over the nodes (or over the least loaded ones, below the others) are placed whole
    rounds at a time (:func:`~.even_rounds.even_rounds`: the same nodes, loads and order as one
    by one).
    """
    cl, gpn, cap, lengths, w = ctx.cluster, ctx.gpn, ctx.cap, ctx.lengths, ctx.w
    n_nodes = cl.nodes
    node_load = [0.0] * n_nodes
    node_tok = [0] * n_nodes
    node_seqs: list[list[int]] = [[] for _ in range(n_nodes)]
    inter: dict[int, tuple[int, ...]] = {}
    spill: list[int] = []
    heap = [(0.0, n) for n in range(n_nodes)]  # (load, node); entries whose load changed are skipped
    soft_cap, may_span, node_cost = ctx.node_soft_cap, n_nodes > 1 and ctx.allow_inter, ctx.node_cost
    cost: dict[int, float] = {}  # GPU-time each node-local sequence adds to its node
    run_end, next_try, gap, pos, total = 0, 0, n_nodes, 0, len(order)
    run_iter = iter(run_ends(order, lengths) if ends is None else ends)
    while pos < total:
        if pos >= run_end:  # a run of equal lengths starts: try whole rounds now, then less and less often
            run_end, next_try, gap = next(run_iter), pos, n_nodes
        if pos == next_try:
            next_try, gap = pos + gap, 2 * gap
            i = order[pos]
            if run_end - pos >= MIN_ROUNDS * n_nodes and not (may_span and w[i] > span_limit):
                c, s = node_cost(i), lengths[i]
                turn, rounds, after = even_rounds(node_load, node_tok, c, s, run_end - pos, token_limit=soft_cap,
                                                  subset=True)
                if rounds:
                    width = len(turn)  # the least loaded nodes, or all
                    stop = pos + rounds * width
                    for j, n in enumerate(turn):
                        node_seqs[n].extend(order[pos + j:stop:width])
                        node_tok[n] += rounds * s
                    node_load[:] = after
                    cost.update(dict.fromkeys(order[pos:stop], c))
                    heap = [(node_load[n], n) for n in range(n_nodes)]
                    heapq.heapify(heap)
                    pos, next_try, gap = stop, stop, n_nodes
                    continue
        i = order[pos]
        pos += 1
        s = lengths[i]
        while heap[0][0] != node_load[heap[0][1]]:
            heapq.heappop(heap)
        top = heap[0][1]  # the least loaded node
        if node_tok[top] + s <= soft_cap and not (may_span and w[i] > span_limit):
            c = node_cost(i)  # the common case, spelled out: the least loaded node takes it
            cost[i] = c
            node_load[top] += c
            node_tok[top] += s
            node_seqs[top].append(i)
            heapq.heapreplace(heap, (node_load[top], top))
            continue
        best: int | None = top
        if node_tok[top] + s > soft_cap:
            # Keep headroom on each node so the GPU level can still pack whole
            # sequences; use the full capacity only when no node has headroom left.
            fits = ([n for n in range(n_nodes) if node_tok[n] + s <= ctx.node_soft_cap]
                    or [n for n in range(n_nodes) if node_tok[n] + s <= gpn * cap])
            best = min(fits, key=lambda n: (node_load[n], n)) if fits else None
        span = best is None
        if may_span and best is not None and w[i] > span_limit:
            whole_node = ctx.cost.ring_ms(s, gpn, inter_node=False) if gpn > 1 and s >= 2 * gpn else w[i]
            span = node_load[best] / gpn + whole_node > span_limit and ctx.inter_ok(s, 2 * gpn)
        if span and n_nodes > 1:
            k = _pick_span(ctx, s, node_tok, span_limit)
            ring_size = k * gpn
            share = ring_node_tokens(s, k, gpn)
            room = sorted((n for n in range(n_nodes) if node_tok[n] + max(share) <= gpn * cap),
                          key=lambda n: (node_load[n], n))
            if len(room) < k:  # the nodes' free tokens are too scattered: level 2 places it after the nodes
                spill.append(i)
                continue
            block = sorted(room[:k])
            inter[i] = tuple(cl.rank_of(n, l) for n in block for l in range(gpn))
            per_rank = ctx.inter_ms(s, ring_size)
            for p, n in enumerate(block):
                node_load[n] += gpn * per_rank
                node_tok[n] += share[p]
                heapq.heappush(heap, (node_load[n], n))
            continue
        if best is None:  # no node has room for it whole: level 2 places it after the nodes
            spill.append(i)
            continue
        cost[i] = c = node_cost(i)
        node_load[best] += c
        node_tok[best] += s
        node_seqs[best].append(i)
        heapq.heappush(heap, (node_load[best], best))
    st = NodeState(seqs=node_seqs, inter=inter, load=node_load, tokens=node_tok, cost=cost, spill=spill)
    rebalance_nodes(ctx, st, rank_in_order, lend=lend)
    return st


def _pick_span(ctx: PartitionContext, s: int, node_tok: list[int], span_limit: float) -> int:
    """Smallest node count whose ring fits ``s`` and meets the time limit.

    Grows while a larger ring still hides its network transfer; stops at the
    first count that meets ``span_limit``.
    """
    gpn, cap, n_nodes = ctx.gpn, ctx.cap, ctx.cluster.nodes
    free = sorted((gpn * cap - t for t in node_tok), reverse=True)
    best_k = None
    for k in range(2, n_nodes + 1):
        ranks = k * gpn
        if s < 2 * ranks or sum(free[:k]) < s or ring_max_tokens(s, ranks) > cap:
            continue
        if best_k is None:
            best_k = k
        if ctx.inter_ms(s, ranks) <= span_limit or not ctx.inter_ok(s, (k + 1) * gpn):
            return k
    if best_k is None:
        raise PlanError(
            f"a sequence of length {s} does not fit on the cluster: {n_nodes} nodes x {gpn} GPUs "
            f"x {cap} tokens per GPU leave {sum(free)} free tokens"
        )
    return n_nodes if s >= 2 * n_nodes * gpn else best_k
