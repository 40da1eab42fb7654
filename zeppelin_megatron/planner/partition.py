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
   order). Other sequences go to the least loaded node that has room; a final
   pass moves sequences from the busiest to the idlest node while that helps.
2. GPUs, node by node. Each node's target is its load divided by ``G``.
   A sequence goes whole to the least loaded GPU (``local``) if that keeps
   the GPU under the node target; otherwise it is split over the smallest
   number ``g >= 2`` of least loaded GPUs for which every one of them stays
   under target (``intra_node``), ring order by local index. The node is
   filled twice, once that way and once giving every split sequence a ring
   over the whole node (even ring loads); the fill with the lower peak wins.

Splitting is allowed on a link only where the sequence's compute-to-
communication ratio (one off-diagonal ring step's kernel time over its
transfer time, :meth:`CostModel.comm_ratio`) is at least ``min_ratio``: a
sequence too short to hide its ring traffic stays local, unless it does not
fit in memory, in which case it is split anyway (the least bad choice). A
split must also beat keeping the sequence whole (a ring of tiny blocks pays
the per-call overhead at every step).
No fixed length thresholds: everything comes from the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .cost_model import CostModel
from .plan import PlanError
from .zigzag import zigzag_tokens

__all__ = ["PartitionOptions", "Assignment", "partition"]


@dataclass(frozen=True, kw_only=True)
class PartitionOptions:
    """Knobs of the partitioner (defaults are what users get)."""

    slack: float = 0.02
    """A GPU or node may exceed its target time by this fraction before splitting."""
    min_ratio: float = 1.0
    """Compute/communication ratio a split needs (1.0: the ring step's compute hides its transfer)."""
    routing: bool = True
    """Whether inter-node rings may spread hops over idle NICs (affects their predicted cost)."""
    placements: tuple[str, ...] = ("local", "intra_node", "inter_node")
    """Allowed placements (ablations); sequences that must split still split."""

    def __post_init__(self) -> None:
        if not 0 <= self.slack < 1:
            raise PlanError(f"slack must be in [0, 1), got {self.slack}")
        if not self.min_ratio >= 0:
            raise PlanError(f"min_ratio must be >= 0, got {self.min_ratio}")
        bad = [p for p in self.placements if p not in ("local", "intra_node", "inter_node")]
        if bad or not self.placements:
            raise PlanError(f"placements must be a non-empty subset of local/intra_node/inter_node, got {bad}")


@dataclass(frozen=True)
class Assignment:
    placement: str
    ranks: tuple[int, ...]


NODE_HEADROOM = 0.05
"""Fraction of a node's token capacity level 1 leaves free while it can (fragmentation)."""


class _Ctx:
    """Shared inputs of the two levels and the cost queries they make."""

    def __init__(self, lengths: Sequence[int], cost: CostModel, options: PartitionOptions) -> None:
        cl = cost.cluster
        self.lengths, self.cost, self.options, self.cluster = lengths, cost, options, cl
        self.gpn, self.cap = cl.gpus_per_node, cl.tokens_per_gpu
        self.proxies = cl.nics_per_node if options.routing else 1
        self.allow_local = "local" in options.placements
        self.allow_intra = "intra_node" in options.placements
        self.allow_inter = "inter_node" in options.placements
        self.w = [cost.local_ms(s) for s in lengths]
        self.target = sum(self.w) / cl.world_size
        self.limit = self.target * (1.0 + options.slack)
        self.node_soft_cap = int(self.gpn * self.cap * (1.0 - NODE_HEADROOM))

    def intra_ok(self, s: int, g: int) -> bool:
        """Splitting ``s`` over ``g`` GPUs of a node hides its transfer and beats keeping it whole."""
        cost = self.cost
        return (s >= 2 * g and cost.comm_ratio(s, g, inter_node=False) >= self.options.min_ratio
                and cost.ring_ms(s, g, inter_node=False) < cost.local_ms(s))

    def inter_ok(self, s: int, ranks: int) -> bool:
        """The same for a ring of ``ranks`` GPUs across nodes."""
        cost = self.cost
        return (s >= 2 * ranks and cost.comm_ratio(s, ranks, inter_node=True, proxies=self.proxies)
                >= self.options.min_ratio and self.inter_ms(s, ranks) < cost.local_ms(s))

    def inter_ms(self, s: int, ranks: int) -> float:
        return self.cost.ring_ms(s, ranks, inter_node=True, proxies=self.proxies)

    def node_cost(self, i: int) -> float:
        """Estimated GPU-time sequence ``i`` adds to a node: ``g`` GPUs x per-rank time."""
        s, cost, gpn = self.lengths[i], self.cost, self.gpn
        if ((self.w[i] <= self.limit and s <= self.cap and self.allow_local)
                or gpn == 1 or not self.intra_ok(s, 2)):
            return self.w[i]
        for g in range(2, gpn + 1):
            if cost.ring_ms(s, g, inter_node=False) <= self.limit and -(-s // g) <= self.cap:
                return g * cost.ring_ms(s, g, inter_node=False)
        return gpn * cost.ring_ms(s, gpn, inter_node=False)


SPAN_FACTORS: tuple[float, ...] = (1.0, 0.5, 0.25)
"""Candidate thresholds (fractions of the per-rank target) for spanning nodes."""


def partition(lengths: Sequence[int], cost: CostModel, options: PartitionOptions) -> list[Assignment]:
    """Place every sequence; see the module docstring. Deterministic.

    Runs level 1 + 2 with the span threshold at the target; if the busiest
    GPU then exceeds the mean GPU load by more than ``slack`` (batches dominated by
    a few huge sequences that whole nodes cannot balance), retries with lower
    thresholds, which span more sequences over nodes, and keeps the candidate
    with the lowest busiest-GPU load (ties: the earlier candidate). A later
    candidate that cannot fit the token capacity is skipped.
    """
    ctx = _Ctx(lengths, cost, options)
    order = sorted(range(len(lengths)), key=lambda i: (-ctx.w[i], -lengths[i], i))
    best: tuple[float, list[Assignment]] | None = None
    for factor in SPAN_FACTORS if ctx.allow_inter and ctx.cluster.nodes > 1 else SPAN_FACTORS[:1]:
        try:
            assignments, peak, mean = _partition_once(ctx, order, ctx.limit * factor)
        except PlanError:
            if best is None:
                raise
            continue  # this candidate runs out of memory somewhere; keep the one we have
        if best is None or peak < best[0] - 1e-9:
            best = (peak, assignments)
        if best[0] <= mean * (1.0 + options.slack):
            break  # already within slack of its own mean: no need to try more spanning
    assert best is not None
    return best[1]


def _partition_once(
    ctx: _Ctx, order: list[int], span_limit: float
) -> tuple[list[Assignment], float, float]:
    """Levels 1 and 2 for one span threshold; returns the assignments, peak and mean GPU load."""
    cl, gpn, lengths = ctx.cluster, ctx.gpn, ctx.lengths
    node_seqs, inter, node_load = _assign_nodes(ctx, order, span_limit)
    out: dict[int, Assignment] = {i: Assignment("inter_node", r) for i, r in inter.items()}
    gpu_load = [0.0] * cl.world_size
    gpu_tok = [0] * cl.world_size
    for i, ring in inter.items():
        per_rank = ctx.inter_ms(lengths[i], len(ring))
        for p, r in enumerate(ring):
            gpu_load[r] += per_rank
            gpu_tok[r] += zigzag_tokens(lengths[i], len(ring), p)
    for n in range(cl.nodes):
        ranks = [cl.rank_of(n, l) for l in range(gpn)]
        t_lim = max(node_load[n] / gpn, ctx.target) * (1.0 + ctx.options.slack)
        # Two candidate fills of the node; keep the one whose busiest GPU is least busy.
        best: tuple[float, tuple[dict[int, Assignment], list[float], list[int]]] | None = None
        for whole_node in (False, True):
            trial = _place_node(ctx, n, node_seqs[n], ranks, list(gpu_load), list(gpu_tok), t_lim, whole_node)
            peak = max(trial[1][r] for r in ranks)
            if best is None or peak < best[0] - 1e-9:
                best = (peak, trial)
        assert best is not None
        placed, gpu_load, gpu_tok = best[1]
        out.update(placed)
    return [out[i] for i in range(len(lengths))], max(gpu_load), sum(gpu_load) / len(gpu_load)


def _place_node(
    ctx: _Ctx, n: int, seqs: list[int], ranks: list[int], gpu_load: list[float], gpu_tok: list[int],
    t_lim: float, whole_node: bool,
) -> tuple[dict[int, Assignment], list[float], list[int]]:
    """Level 2 for node ``n``: local to the least loaded GPU, or the smallest fitting ring.

    ``whole_node``: a sequence that must split takes a ring over every GPU of
    the node (when it hides its transfer there), which keeps ring loads even.
    Updates and returns ``gpu_load``/``gpu_tok`` (callers pass copies).
    """
    out: dict[int, Assignment] = {}
    cap = ctx.cap
    for i in seqs:
        s = ctx.lengths[i]
        by_load = sorted(ranks, key=lambda r: (gpu_load[r], r))
        room = [r for r in by_load if gpu_tok[r] + s <= cap]
        if room and ctx.allow_local and gpu_load[room[0]] + ctx.w[i] <= t_lim:
            choice = [room[0]]
        else:
            choice = _pick_ring(ctx, s, by_load, gpu_load, gpu_tok, t_lim, force=not room,
                                whole_node=whole_node)
            if choice is None and not room:
                raise PlanError(
                    f"sequence {i} of length {s} does not fit on node {n}: its GPUs have "
                    f"{[cap - gpu_tok[r] for r in ranks]} free tokens of {cap}; "
                    "raise tokens_per_gpu or add GPUs"
                )
            choice = choice or [room[0]]
        if len(choice) == 1:
            out[i] = Assignment("local", (choice[0],))
            gpu_load[choice[0]] += ctx.w[i]
            gpu_tok[choice[0]] += s
            continue
        ring = tuple(sorted(choice))
        per_rank = ctx.cost.ring_ms(s, len(ring), inter_node=False)
        for p, r in enumerate(ring):
            gpu_load[r] += per_rank
            gpu_tok[r] += zigzag_tokens(s, len(ring), p)
        out[i] = Assignment("intra_node", ring)
    return out, gpu_load, gpu_tok


def _assign_nodes(
    ctx: _Ctx, order: list[int], span_limit: float
) -> tuple[list[list[int]], dict[int, tuple[int, ...]], list[float]]:
    """Level 1: node of each sequence, or the node-spanning ring of an inter-node one.

    Returns ``(sequences per node in placement order, inter-node rings, node loads)``;
    a node's load is the GPU-time (sum over its GPUs) it is expected to carry.
    """
    cl, gpn, cap, lengths, w = ctx.cluster, ctx.gpn, ctx.cap, ctx.lengths, ctx.w
    n_nodes = cl.nodes
    node_load = [0.0] * n_nodes
    node_tok = [0] * n_nodes
    node_seqs: list[list[int]] = [[] for _ in range(n_nodes)]
    inter: dict[int, tuple[int, ...]] = {}
    for i in order:
        s = lengths[i]
        # Keep headroom on each node so the GPU level can still pack whole
        # sequences; use the full capacity only when no node has headroom left.
        fits = ([n for n in range(n_nodes) if node_tok[n] + s <= ctx.node_soft_cap]
                or [n for n in range(n_nodes) if node_tok[n] + s <= gpn * cap])
        best = min(fits, key=lambda n: (node_load[n], n)) if fits else None
        span = best is None
        if n_nodes > 1 and ctx.allow_inter and best is not None and w[i] > span_limit:
            whole_node = ctx.cost.ring_ms(s, gpn, inter_node=False) if gpn > 1 and s >= 2 * gpn else w[i]
            span = node_load[best] / gpn + whole_node > span_limit and ctx.inter_ok(s, 2 * gpn)
        if span and n_nodes > 1:
            k = _pick_span(ctx, s, node_tok, span_limit)
            ring_size = k * gpn
            share = [sum(zigzag_tokens(s, ring_size, p * gpn + l) for l in range(gpn)) for p in range(k)]
            room = sorted((n for n in range(n_nodes) if node_tok[n] + max(share) <= gpn * cap),
                          key=lambda n: (node_load[n], n))
            if len(room) < k:
                raise PlanError(
                    f"sequence {i} of length {s} needs {k} nodes with room for {max(share)} tokens each; "
                    f"free tokens per node are {[gpn * cap - t for t in node_tok]}"
                )
            block = sorted(room[:k])
            inter[i] = tuple(cl.rank_of(n, l) for n in block for l in range(gpn))
            per_rank = ctx.inter_ms(s, ring_size)
            for p, n in enumerate(block):
                node_load[n] += gpn * per_rank
                node_tok[n] += share[p]
            continue
        if best is None:
            raise PlanError(
                f"sequence {i} of length {s} does not fit: no node has room for it "
                f"({gpn} GPUs x {cap} tokens per GPU; free tokens per node: "
                f"{[gpn * cap - t for t in node_tok]}); raise tokens_per_gpu or add nodes"
            )
        node_load[best] += ctx.node_cost(i)
        node_tok[best] += s
        node_seqs[best].append(i)
    _rebalance_nodes(ctx, node_seqs, node_load, node_tok, inter, rank_in_order={i: k for k, i in enumerate(order)})
    return node_seqs, inter, node_load


def _rebalance_nodes(ctx: _Ctx, node_seqs: list[list[int]], node_load: list[float], node_tok: list[int],
                     inter: dict[int, tuple[int, ...]], *, rank_in_order: dict[int, int]) -> None:
    """Fix greedy overshoot: lower the busiest node's load by moves and swaps.

    For the busiest node ``hi`` and every less loaded node ``lo``, tries
    moving one sequence from ``hi`` to ``lo``, or swapping a sequence of
    ``hi`` with a cheaper one of ``lo`` (net cost moved ``0 < m < gap``), or
    moving ``hi``'s share of a node-spanning ring to ``lo`` (when ``lo`` is
    not in that ring); takes the change with the lowest resulting peak of the
    pair, and repeats while the busiest node's load falls. Example: loads ``[260, 229] x 8`` GPUs and costs 848
    on ``hi``, 746 on ``lo``: swapping them moves 102 GPU-ms.
    """
    cap_node = ctx.node_soft_cap
    cost = {i: ctx.node_cost(i) for seqs in node_seqs for i in seqs}
    for _ in range(sum(len(s) for s in node_seqs)):
        hi = max(range(len(node_load)), key=lambda n: (node_load[n], -n))
        best: tuple[float, int, int, int, int] | None = None  # (new peak, order key, a, b or -1, lo)
        for lo in sorted(range(len(node_load)), key=lambda n: (node_load[n], n)):
            gap = node_load[hi] - node_load[lo]
            if gap <= 1e-9:
                break
            for a in node_seqs[hi]:
                ca, ta = cost[a], ctx.lengths[a]
                if ca < gap:
                    options = [(-1, 0.0, 0)]
                else:  # too big to move alone: swap with a cheaper sequence of lo
                    options = [(b, cost[b], ctx.lengths[b]) for b in node_seqs[lo] if 0 < ca - cost[b] < gap]
                for b, cb, tb in options:
                    if node_tok[lo] + ta - tb > cap_node or node_tok[hi] - ta + tb > cap_node:
                        continue
                    peak = max(node_load[hi] - (ca - cb), node_load[lo] + (ca - cb))
                    key = (peak, rank_in_order[a], a, b, lo)
                    if best is None or key < best:
                        best = key
            for a, ring in inter.items():
                nodes = sorted({r // ctx.gpn for r in ring})
                if hi not in nodes or lo in nodes:
                    continue
                share = ctx.gpn * ctx.inter_ms(ctx.lengths[a], len(ring))
                tok = -(-ctx.lengths[a] // len(nodes))
                if share >= gap or node_tok[lo] + tok > cap_node:
                    continue
                key = (max(node_load[hi] - share, node_load[lo] + share), rank_in_order[a], a, -2, lo)
                if best is None or key < best:
                    best = key
        if best is None or best[0] >= node_load[hi] - 1e-9:
            return
        _, _, a, b, lo = best
        if b == -2:  # move hi's share of the spanning ring a to lo
            nodes = sorted({r // ctx.gpn for r in inter[a]} - {hi} | {lo})
            share = ctx.gpn * ctx.inter_ms(ctx.lengths[a], len(inter[a]))
            tok = -(-ctx.lengths[a] // len(nodes))
            inter[a] = tuple(ctx.cluster.rank_of(n, l) for n in nodes for l in range(ctx.gpn))
            node_load[hi] -= share
            node_load[lo] += share
            node_tok[hi] -= tok
            node_tok[lo] += tok
            continue
        moves = [(a, hi, lo)] + ([(b, lo, hi)] if b >= 0 else [])
        for i, src, dst in moves:
            node_seqs[src].remove(i)
            node_seqs[dst].append(i)
            node_seqs[dst].sort(key=rank_in_order.__getitem__)
            node_load[src] -= cost[i]
            node_load[dst] += cost[i]
            node_tok[src] -= ctx.lengths[i]
            node_tok[dst] += ctx.lengths[i]


def _pick_span(ctx: _Ctx, s: int, node_tok: list[int], span_limit: float) -> int:
    """Smallest node count whose ring fits ``s`` and meets the time limit.

    Grows while a larger ring still hides its network transfer; stops at the
    first count that meets ``span_limit``.
    """
    gpn, cap, n_nodes = ctx.gpn, ctx.cap, ctx.cluster.nodes
    free = sorted((gpn * cap - t for t in node_tok), reverse=True)
    best_k = None
    for k in range(2, n_nodes + 1):
        ranks = k * gpn
        if s < 2 * ranks or sum(free[:k]) < s or 2 * -(-s // (2 * ranks)) > cap:
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


def _pick_ring(ctx: _Ctx, s: int, by_load: list[int], gpu_load: list[float], gpu_tok: list[int],
               t_lim: float, *, force: bool, whole_node: bool = False) -> list[int] | None:
    """Smallest set of least-loaded GPUs of one node that takes ``s`` under ``t_lim``.

    Returns ``None`` to keep the sequence local. ``force``: it does not fit on
    one GPU, so split even if the ratio test fails or the limit is missed.
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
        need = 2 * -(-s // (2 * g))
        cand = [r for r in by_load if gpu_tok[r] + need <= ctx.cap][:g]
        if len(cand) < g:
            continue
        peak = max(gpu_load[r] for r in cand) + per_rank
        if peak <= t_lim:
            return cand
        if fallback is None or peak < fallback[0]:
            fallback = (peak, cand)
    return None if fallback is None else fallback[1]
