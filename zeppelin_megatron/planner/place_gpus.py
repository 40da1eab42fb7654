"""Level 2 of the partitioner: the GPUs of each node, after level 1 chose the node of every sequence.

Node-spanning rings (level 1's ``inter_node`` sequences) are placed first. Then,
node by node, each node-local sequence (in level 1's placement order) goes
whole to the least loaded GPU with room if that keeps it under the node's
target ``t_lim`` (to the least loaded one that also stays under the linear
layout's token quota, when that one is over it: fewer tokens to remap);
otherwise it is split over the smallest number ``g >= 2`` of least loaded GPUs
that all stay under target (:func:`pick_ring`; ``intra_node``, ring in local
index order). Each node is filled twice, once that way and once giving every
split sequence a ring over the whole node (even ring loads), and the fill with
the lower busiest GPU plus node remap time (:func:`~.score.node_remap`) wins.
A sequence its node cannot hold (the node's free tokens scattered over its GPUs), and one level 1 found no node
for, is placed after every node, where it finishes first (:func:`place_spilled`).
A long run of equal sequences that goes round robin over the GPUs is placed whole rounds
at a time (:mod:`.even_rounds`): the same GPUs, loads and order as one by one (past the
target too, for a length no ring takes: :func:`never_split`).

Example: a node of 2 GPUs, target 10 ms, sequences costing 6, 3 and 3 ms whole:
6 goes to GPU 0, 3 to GPU 1, the second 3 to GPU 1 (least loaded: 3 < 6).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_

from .capacity_level import roomiest_ring
from .even_rounds import MIN_ROUNDS, even_rounds
from .node_balance import NodeState
from .partition_context import Assignment, PartitionContext, assignments_of
from .plan_parts import PlanError
from .score import node_remap
from .zigzag import ring_max_tokens, zigzag_tokens

__all__ = ["place_gpus", "place_node", "pick_ring", "NodeFill"]


def place_gpus(ctx: PartitionContext, st: NodeState) -> tuple[list[Assignment], list[int]]:
    """Level 2 for every node, after the node-spanning rings.

    Returns every sequence's assignment and each rank's attention tokens (exact zigzag counts;
    equal to :func:`~.score.rank_tokens` of the assignments, counted on the way).

    Raises:
        PlanError: a node-spanning ring does not fit ``tokens_per_gpu``, or a spilled sequence finds no room.
    """
    cl, gpn, lengths = ctx.cluster, ctx.gpn, ctx.lengths
    out: list[Assignment | None] = [None] * len(lengths)
    for i, ranks in st.inter.items():
        out[i] = Assignment("inter_node", ranks)
    gpu_load = [0.0] * cl.world_size
    gpu_tok = [0] * cl.world_size
    for i, ring in st.inter.items():
        per_rank = ctx.inter_ms(lengths[i], len(ring))
        for p, r in enumerate(ring):
            gpu_load[r] += per_rank
            gpu_tok[r] += zigzag_tokens(lengths[i], len(ring), p)
    over = [r for r in range(cl.world_size) if gpu_tok[r] > ctx.cap]
    if over:
        raise PlanError(f"node-spanning rings put {gpu_tok[over[0]]} tokens on rank {over[0]}, "
                        f"more than tokens_per_gpu = {ctx.cap}")
    quota = [ctx.total_tokens // cl.world_size] * gpn  # the linear layout's, to a token
    spill = list(st.spill)  # sequences no node (level 1) or no GPU or ring of their node holds: placed last
    for n in range(cl.nodes):
        if not st.seqs[n]:
            continue  # nothing to place: both fills would leave the node as it is
        base = cl.rank_of(n, 0)
        t_lim = max(st.load[n] / gpn, ctx.target) * (1.0 + ctx.options.slack)
        # Two candidate fills of the node; keep the one whose busiest GPU plus remap is cheapest.
        best: tuple[tuple[int, float], NodeFill, list[float], list[int]] | None = None
        for whole_node in (False, True):
            load, tok = gpu_load[base:base + gpn], gpu_tok[base:base + gpn]
            placed, rings_asked = place_node(ctx, n, st.seqs[n], load, tok, t_lim, whole_node)
            score = (len(placed.spill), max(load) + node_remap(ctx, tok, quota))  # fewer spilled first
            if best is None or score[0] < best[0][0] or (score[0] == best[0][0] and score[1] < best[0][1] - 1e-9):
                best = (score, placed, load, tok)
            if not rings_asked:
                break  # every sequence went whole at once: the whole-node fill would repeat this one
        assert best is not None
        best[1].write(out)
        spill.extend(best[1].spill)
        gpu_load[base:base + gpn], gpu_tok[base:base + gpn] = best[2], best[3]
    for i in sorted(spill, key=lambda i: (-lengths[i], i)):
        out[i] = place_spilled(ctx, i, gpu_load, gpu_tok)
    if any(map(is_, out, repeat(None))):  # impossible: level 1 gave every sequence a node or a ring
        raise RuntimeError(f"level 2 left sequence {out.index(None)} unplaced")
    return out, gpu_tok  # type: ignore[return-value]  # no None left


@dataclass
class NodeFill:
    """One fill of a node by :func:`place_node`: ``one`` maps sequences placed one by one to their
    assignment; ``runs``: sequences placed whole rounds at a time, as (sequences, their shared
    assignment), one entry per GPU and run.

    Example: ``NodeFill({7: Assignment("intra_node", (0, 1))}, [([3, 5], Assignment("local", (0,)))])``.
    """

    one: dict[int, Assignment] = field(default_factory=dict)
    runs: list[tuple[list[int], Assignment]] = field(default_factory=list)
    spill: list[int] = field(default_factory=list)

    def write(self, out: list[Assignment | None]) -> None:
        """Store every assignment of this fill at its sequence's index in ``out``."""
        for i, a in self.one.items():
            out[i] = a
        for seqs, a in self.runs:
            for i in seqs:
                out[i] = a


def place_node(ctx: PartitionContext, n: int, seqs: list[int], load: list[float], tok: list[int],
               t_lim: float, whole_node: bool) -> tuple[NodeFill, bool]:
    """Level 2 for node ``n``: each sequence local to the least loaded GPU, or on the smallest fitting ring.

    ``load`` / ``tok``: the node's GPUs' time and tokens by local index (updated in place).
    ``whole_node``: a sequence that must split takes a ring over every GPU of the node (when it
    hides its transfer there), which keeps ring loads even. Returns the assignments and whether
    any sequence was offered a ring (:func:`pick_ring`: the only step ``whole_node`` changes).
    """
    fill = NodeFill()
    out = fill.one
    cap, gpn, base, quota = ctx.cap, len(load), ctx.cluster.rank_of(n, 0), ctx.quota
    lengths, ws, allow_local = ctx.lengths, ctx.w, ctx.allow_local
    whole = [Assignment("local", (base + l,)) for l in range(gpn)]  # shared: frozen and equal anyway
    rings_asked = False
    heap = [(load[l], l) for l in range(gpn)]  # (load, local index), stale entries skipped
    heapq.heapify(heap)
    pos, total, next_try, gap, tried, stays, no_fit = 0, len(seqs), 0, gpn, -1, False, -1
    while pos < total:
        i = seqs[pos]
        s, w = lengths[i], ws[i]
        if s != tried:  # another length: try whole rounds at once (even_rounds.py) now, if the run is long
            far = pos + MIN_ROUNDS * gpn - 1
            next_try, gap, tried = pos if far < total and lengths[seqs[far]] == s else -1, gpn, s
            stays = never_split(ctx, s, gpn, whole_node)
        if pos == next_try:
            next_try, gap = pos + gap, 2 * gap  # then less and less often while they do not apply
            # A length no ring takes goes to the least loaded GPU over the limit too (pick_ring: None).
            stop, top = _rounds(seqs, pos, load, tok, whole, fill, math.inf if stays else t_lim, ctx) \
                if allow_local else (pos, 0.0)
            if stop > pos:
                rings_asked = rings_asked or top > t_lim  # a pick over the limit asked for a ring
                heap = [(load[l], l) for l in range(gpn)]
                heapq.heapify(heap)
                pos, next_try, gap = stop, stop, gpn
                continue
        pos += 1
        while heap[0][0] != load[heap[0][1]]:
            heapq.heappop(heap)
        least = heap[0][1]
        if tok[least] + s > cap:  # the least loaded GPU is full: the least loaded one with room
            room = [l for l in range(gpn) if tok[l] + s <= cap]
            least = min(room, key=lambda l: (load[l], l)) if room else -1
        if least >= 0 and allow_local and load[least] + w <= t_lim and tok[least] + s <= quota:
            out[i] = whole[least]  # the common case, spelled out: whole on the least loaded GPU
            load[least] += w
            tok[least] += s
            if heap[0][1] == least:
                heapq.heapreplace(heap, (load[least], least))
            else:
                heapq.heappush(heap, (load[least], least))
            continue
        choice: list[int] | None
        if least >= 0 and allow_local and load[least] + w <= t_lim:
            choice = [least]
            if tok[least] + s > quota and s != no_fit:
                # Within the time limit, prefer a GPU that stays under the linear layout's quota
                # (fewer tokens to remap; short sequences carry many tokens per millisecond).
                fit = [l for l in sorted(range(gpn), key=lambda l: (load[l], l))
                       if tok[l] + s <= cap and load[l] + w <= t_lim and tok[l] + s <= ctx.quota]
                choice = fit[:1] or choice
                if not fit:  # loads and tokens only grow: no later sequence of this length fits either
                    no_fit = s
        elif stays and least >= 0:  # pick_ring would return None: no ring takes this length
            rings_asked = True
            choice = [least]
        else:
            rings_asked = True
            by_load = sorted(range(gpn), key=lambda l: (load[l], l))
            choice = pick_ring(ctx, s, by_load, load, tok, t_lim, force=least < 0, whole_node=whole_node)
            if choice is None and least < 0:  # the node's free tokens are too scattered: placed across nodes later
                fill.spill.append(i)
                continue
            choice = choice or [least]
        if len(choice) == 1:
            l = choice[0]
            out[i] = whole[l]
            load[l] += w
            tok[l] += s
            heapq.heappush(heap, (load[l], l))
            continue
        ring = sorted(choice)
        per_rank = ctx.cost.ring_ms(s, len(ring), inter_node=False)
        for p, l in enumerate(ring):
            load[l] += per_rank
            tok[l] += zigzag_tokens(s, len(ring), p)
            heapq.heappush(heap, (load[l], l))
        out[i] = Assignment("intra_node", tuple(base + l for l in ring))
    return fill, rings_asked


def _rounds(seqs: list[int], pos: int, load: list[float], tok: list[int], whole: list[Assignment],
            fill: NodeFill, t_lim: float, ctx: PartitionContext) -> tuple[int, float]:
    """Place whole rounds of the run of equal sequences at ``seqs[pos:]`` local to the least loaded GPUs,
    exactly as :func:`place_node` would one by one (:func:`~.even_rounds.even_rounds`); returns where
    the rounds end (``pos`` if none apply) and the highest load a GPU they picked ends at (its last
    pick's load plus the sequence's time). ``load`` / ``tok`` / ``fill`` are updated in place."""
    lengths, gpn = ctx.lengths, len(load)
    s = lengths[seqs[pos]]
    if len(seqs) - pos < MIN_ROUNDS * gpn:
        return pos, 0.0
    # seqs are in placement order, so one length's sequences are contiguous: the run ends at the first other
    count = bisect_left(range(pos, len(seqs)), True, key=lambda p: lengths[seqs[p]] != s)
    turn, rounds, after = even_rounds(load, tok, ctx.w[seqs[pos]], s, count, token_limit=min(ctx.cap, ctx.quota),
                                      load_limit=t_lim, subset=True)
    width = len(turn)  # the least loaded GPUs, or all
    stop = pos + rounds * width
    run = seqs[pos:stop]
    if not rounds or list(map(lengths.__getitem__, run)).count(s) != len(run):  # not contiguous: one by one
        return pos, 0.0
    for j, l in enumerate(turn):
        fill.runs.append((seqs[pos + j:stop:width], whole[l]))
        tok[l] += rounds * s
    load[:] = after
    return stop, max(after[l] for l in turn)


def never_split(ctx: PartitionContext, s: int, gpn: int, whole_node: bool) -> bool:
    """:func:`pick_ring` returns ``None`` for length ``s`` whatever the loads, unless forced: its first
    ring size fails :meth:`~.partition_context.PartitionContext.intra_ok` (or none is allowed).
    Example: ``s = 7`` on 8 GPUs: only ``g <= 3`` hold two chunks each, and a 2-GPU ring of 7
    tokens does not hide its transfer: ``True``."""
    if not ctx.allow_intra or gpn < 2 or s < 4:
        return True
    if whole_node and gpn <= s // 2 and ctx.intra_ok(s, gpn):
        return False
    return not ctx.intra_ok(s, 2)


def pick_ring(ctx: PartitionContext, s: int, by_load: list[int], load: list[float], tok: list[int],
              t_lim: float, *, force: bool, whole_node: bool = False) -> list[int] | None:
    """Smallest set of least-loaded GPUs of one node that takes ``s`` under ``t_lim`` (local indices).

    Returns ``None`` to keep the sequence local. ``force``: it does not fit on
    one GPU, so split even if the ratio test fails or the limit is missed
    (then the ring with the lowest peak among those that fit).
    Example: ``s = 41``, two empty GPUs of 21 tokens, ``force``: ring ``[0, 1]`` (21 + 20 tokens).
    """
    gpn = len(by_load)
    if not (ctx.allow_intra or force) or gpn < 2 or s < 4:
        return None
    fallback: tuple[float, list[int]] | None = None
    sizes = range(2, min(gpn, s // 2) + 1)
    if whole_node and gpn <= s // 2 and (force or ctx.intra_ok(s, gpn)):
        sizes = range(gpn, gpn + 1)
    for g in sizes:
        if not force and not ctx.intra_ok(s, g):
            break
        per_rank = ctx.cost.ring_ms(s, g, inter_node=False)
        need = ring_max_tokens(s, g)
        cand = [l for l in by_load if tok[l] + need <= ctx.cap][:g]
        if len(cand) < g:
            continue
        peak = max(load[l] for l in cand) + per_rank
        if peak <= t_lim:
            return cand
        if fallback is None or peak < fallback[0]:
            fallback = (peak, cand)
    return None if fallback is None else fallback[1]


def place_spilled(ctx: PartitionContext, i: int, load: list[float], tok: list[int]) -> Assignment:
    """Sequence ``i``, which a level could not fit where it chose, wherever it finishes first: whole on the least
    loaded GPU with room, the smallest ring over the roomiest GPUs of one node, or the smallest over the cluster's
    roomiest; of those that fit, the one with the lowest busiest GPU after it. ``load`` / ``tok`` (per rank) are
    updated in place.

    Example: 2 nodes x 2 GPUs of 100 tokens, free ``[40, 40, 5, 5]``: a sequence of 60 tokens fits no GPU,
    and a ring over node 0's two GPUs (30 + 30) holds it.

    Raises:
        PlanError: none of them fits (the candidate is skipped; the capacity fallback may take the batch).
    """
    cl, cap, s = ctx.cluster, ctx.cap, ctx.lengths[i]
    gpn, world = cl.gpus_per_node, cl.world_size
    free = [cap - t for t in tok]
    cands: list[tuple[float, tuple[int, ...], float]] = []  # (busiest GPU after, ranks, time added to each)
    if ctx.allow_local:
        room = [r for r in range(world) if free[r] >= s]
        if room:
            r = min(room, key=lambda r: (load[r], r))
            cands.append((load[r] + ctx.w[i], (r,), ctx.w[i]))
    if ctx.allow_intra:
        for n in range(cl.nodes):
            ring = roomiest_ring(s, free, range(n * gpn, (n + 1) * gpn))
            if ring is not None:
                per_rank = ctx.cost.ring_ms(s, len(ring), inter_node=False)
                cands.append((max(load[r] for r in ring) + per_rank, ring, per_rank))
    if ctx.allow_inter and cl.nodes > 1:
        ring = roomiest_ring(s, free, range(world))
        if ring is not None and len({cl.node_of(r) for r in ring}) > 1:
            per_rank = ctx.inter_ms(s, len(ring))
            cands.append((max(load[r] for r in ring) + per_rank, ring, per_rank))
    if not cands:
        raise PlanError(f"sequence {i} of length {s} does not fit: the GPUs have {free} free tokens of {cap} "
                        "and no ring over the roomiest holds it; raise tokens_per_gpu or add GPUs")
    _, ring, per_rank = min(cands)
    for p, r in enumerate(ring):
        load[r] += per_rank
        tok[r] += s if len(ring) == 1 else zigzag_tokens(s, len(ring), p)
    return assignments_of([ring], cl)[0]
