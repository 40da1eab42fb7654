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
2. GPUs, node by node. Each node's target is its load divided by ``G``.
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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .cost_model import CostModel
from .node_balance import NodeState, rebalance_nodes
from .plan import PlanError
from .predict import ring_time
from .routing import Route, plan_routing
from .score import attention_times, node_remap, rank_tokens, remap_time
from .options import PlannerOptions
from .zigzag import ring_max_tokens, ring_node_tokens, zigzag_tokens

__all__ = ["Assignment", "partition", "attention_times", "remap_time"]  # scores re-exported


@dataclass(frozen=True)
class Assignment:
    placement: str
    ranks: tuple[int, ...]


NODE_HEADROOM = 0.05
"""Fraction of a node's token capacity level 1 leaves free while it can (fragmentation)."""


class _Ctx:
    """Shared inputs of the two levels and the cost queries they make."""

    def __init__(self, lengths: Sequence[int], cost: CostModel, options: PlannerOptions) -> None:
        cl = cost.cluster
        self.lengths, self.cost, self.options, self.cluster = lengths, cost, options, cl
        self.gpn, self.cap = cl.gpus_per_node, cl.tokens_per_gpu
        self.proxies = cl.nics_per_node if options.routing else 1
        self.allow_local = "local" in options.placements
        self.allow_intra = "intra_node" in options.placements
        self.allow_inter = "inter_node" in options.placements
        self.w = [cost.local_ms(s) for s in lengths]
        self.total_tokens = sum(lengths)
        self.quota = self.total_tokens / cl.world_size
        self.nic_share = [cl.gpus_sharing_nic(cl.gpu_nic[l]) for l in range(cl.gpus_per_node)]
        self.target = sum(self.w) / cl.world_size
        self.limit = self.target * (1.0 + options.slack)
        self.node_soft_cap = int(self.gpn * self.cap * (1.0 - NODE_HEADROOM))
        self._inter_ok: dict[tuple[int, int], bool] = {}
        self._rings: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[float, float]] = {}

    def intra_ok(self, s: int, g: int) -> bool:
        """Splitting ``s`` over ``g`` GPUs of a node hides its transfer and beats keeping it whole."""
        cost = self.cost
        return (s >= 2 * g and cost.comm_ratio(s, g, inter_node=False) >= self.options.min_ratio
                and cost.ring_ms(s, g, inter_node=False) < cost.local_ms(s))

    def inter_ok(self, s: int, ranks: int) -> bool:
        """The same for a ring of ``ranks`` GPUs across nodes (memoised: level 1 asks often)."""
        hit = self._inter_ok.get((s, ranks))
        if hit is None:
            cost = self.cost
            hit = (s >= 2 * ranks and cost.comm_ratio(s, ranks, inter_node=True, proxies=self.proxies)
                   >= self.options.min_ratio and self.inter_ms(s, ranks) < cost.local_ms(s))
            self._inter_ok[(s, ranks)] = hit
        return hit

    def ring_times(self, ranks: tuple[int, ...], lengths: tuple[int, ...]) -> tuple[float, float]:
        """:func:`~.predict.ring_time` ``(total, own)`` of one ring, its cross hops routed (memoised).

        Routes of a ring depend on that ring alone (:func:`~.routing.plan_routing`).
        """
        key = (ranks, lengths)
        hit = self._rings.get(key)
        if hit is None:
            cost, cl = self.cost, self.cluster
            routes: dict[tuple[int, int], Route] = {}
            if len({cl.node_of(r) for r in ranks}) > 1:
                step_bytes = sum(cost.ring_step_bytes(s, len(ranks)) for s in lengths)
                routes = {(rt.src, rt.dst): rt
                          for rt in plan_routing([(ranks, step_bytes)], cl, cost, enabled=self.options.routing)}
            hit = ring_time(cost, ranks, lengths, routes)[:2]
            self._rings[key] = hit
        return hit

    def inter_ms(self, s: int, ranks: int) -> float:
        return self.cost.ring_ms(s, ranks, inter_node=True, proxies=self.proxies)

    def node_cost(self, i: int) -> float:
        """Estimated GPU-time sequence ``i`` adds to a node: ``g`` GPUs x per-rank time.

        ``g``: the smallest ring whose per-rank time meets the limit, else the
        fastest ring (:meth:`fastest_intra`): every ring step pays the call
        overhead, so beyond some size a larger ring is slower, not faster.
        """
        s, cost, gpn = self.lengths[i], self.cost, self.gpn
        if ((self.w[i] <= self.limit and s <= self.cap and self.allow_local)
                or gpn == 1 or not self.intra_ok(s, 2)):
            return self.w[i]
        for g in range(2, gpn + 1):
            if cost.ring_ms(s, g, inter_node=False) <= self.limit and ring_max_tokens(s, g) <= self.cap:
                return g * cost.ring_ms(s, g, inter_node=False)
        g = self.fastest_intra(s)
        return g * cost.ring_ms(s, g, inter_node=False)

    def fastest_intra(self, s: int) -> int:
        """Ring size ``2 <= g <= G`` with the lowest per-rank :meth:`CostModel.ring_ms` among those whose
        ring positions fit ``tokens_per_gpu`` (ties: the smaller ``g``); ``G`` if none fits.

        Example (Llama-3B, H100 profile, call overhead 1.09 ms): 17686 tokens take
        11.6, 7.9, 6.1, 5.5, 6.6, 7.7, 8.7 ms per rank on 2..8 GPUs: ``g = 5``.
        """
        cost, gpn = self.cost, self.gpn
        fits = [g for g in range(2, gpn + 1) if ring_max_tokens(s, g) <= self.cap]
        if not fits:
            return gpn
        return min(fits, key=lambda g: (cost.ring_ms(s, g, inter_node=False), g))


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
    tried unless the best result so far is within ``slack``. A candidate that
    cannot fit the token capacity is skipped; if none fits, the first one's
    :class:`PlanError` is raised.
    """
    ctx = _Ctx(lengths, cost, options)
    order = sorted(range(len(lengths)), key=lambda i: (-ctx.w[i], -lengths[i], i))
    rank_in_order = {i: k for k, i in enumerate(order)}
    # best: ((misses balance_target, chained rings, score), assignments, balanced within slack); lower key wins
    best: tuple[tuple[bool, bool, float], list[Assignment], bool] | None = None
    error: PlanError | None = None
    seen: set[tuple] = set()  # level-1 outcomes already placed (thresholds often agree)
    for factor in SPAN_FACTORS if ctx.allow_inter and ctx.cluster.nodes > 1 else SPAN_FACTORS[:1]:
        for lend in (True, False):  # without lends only if some were made
            try:
                st = _assign_nodes(ctx, order, ctx.limit * factor, rank_in_order, lend=lend)
            except PlanError as exc:  # this candidate runs out of memory somewhere
                error = error or exc
                continue
            key = (tuple(st.inter.items()), tuple(map(tuple, st.seqs)))
            if key in seen:
                if not st.lends:
                    break
                continue
            seen.add(key)
            for rnd in range(CORRECTION_ROUNDS + 1):
                try:
                    assignments = _place_gpus(ctx, st)
                except PlanError as exc:
                    error = error or exc
                    break
                att = attention_times(ctx, assignments)
                peak, mean = max(att), sum(att) / len(att)
                within = peak <= mean * (1.0 + options.slack)
                key = (peak > mean * options.balance_target, _chained(assignments),
                       peak + remap_time(ctx, rank_tokens(ctx, assignments)))
                if best is None or key[:2] < best[0][:2] or (key[:2] == best[0][:2] and key[2] < best[0][2] - 1e-9):
                    best = (key, assignments, within)
                if within or rnd == CORRECTION_ROUNDS or not _correct(ctx, st, assignments, att, rank_in_order,
                                                                      lend=lend):
                    break
            if not st.lends:
                break
        if best is not None and best[2]:
            break  # the best plan is within slack of its mean: no need to try more spanning
    if best is None:
        assert error is not None
        raise error  # no candidate fits: the first one's reason
    return best[1]


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


def _correct(ctx: _Ctx, st: NodeState, assignments: list[Assignment], att: list[float],
             rank_in_order: dict[int, int], *, lend: bool = True) -> bool:
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


def _place_gpus(ctx: _Ctx, st: NodeState) -> list[Assignment]:
    """Level 2 for every node, after the node-spanning rings; returns every sequence's assignment."""
    cl, gpn, lengths = ctx.cluster, ctx.gpn, ctx.lengths
    out: dict[int, Assignment] = {i: Assignment("inter_node", r) for i, r in st.inter.items()}
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
    for n in range(cl.nodes):
        ranks = [cl.rank_of(n, l) for l in range(gpn)]
        t_lim = max(st.load[n] / gpn, ctx.target) * (1.0 + ctx.options.slack)
        # Two candidate fills of the node; keep the one whose busiest GPU plus remap is cheapest.
        best: tuple[float, tuple[dict[int, Assignment], list[float], list[int]]] | None = None
        for whole_node in (False, True):
            trial = _place_node(ctx, n, st.seqs[n], ranks, list(gpu_load), list(gpu_tok), t_lim, whole_node)
            score = max(trial[1][r] for r in ranks) + node_remap(ctx, [trial[2][r] for r in ranks], quota)
            if best is None or score < best[0] - 1e-9:
                best = (score, trial)
        assert best is not None
        placed, gpu_load, gpu_tok = best[1]
        out.update(placed)
    return [out[i] for i in range(len(lengths))]


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
            if gpu_tok[room[0]] + s > ctx.quota:
                # Within the time limit, prefer a GPU that stays under the linear layout's quota
                # (fewer tokens to remap; short sequences carry many tokens per millisecond).
                fit = [r for r in room if gpu_load[r] + ctx.w[i] <= t_lim and gpu_tok[r] + s <= ctx.quota]
                choice = fit[:1] or choice
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


def _assign_nodes(ctx: _Ctx, order: list[int], span_limit: float, rank_in_order: dict[int, int], *,
                  lend: bool = True) -> NodeState:
    """Level 1: node of each sequence, or the node-spanning ring of an inter-node one.

    Greedy placement in ``order``, then :func:`rebalance_nodes`. A node's load
    is the GPU-time (sum over its GPUs) it is expected to carry.
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
            share = ring_node_tokens(s, k, gpn)
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
    st = NodeState(seqs=node_seqs, inter=inter, load=node_load, tokens=node_tok,
                   cost={i: ctx.node_cost(i) for seqs in node_seqs for i in seqs})
    rebalance_nodes(ctx, st, rank_in_order, lend=lend)
    return st




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
        need = ring_max_tokens(s, g)
        cand = [r for r in by_load if gpu_tok[r] + need <= ctx.cap][:g]
        if len(cand) < g:
            continue
        peak = max(gpu_load[r] for r in cand) + per_rank
        if peak <= t_lim:
            return cand
        if fallback is None or peak < fallback[0]:
            fallback = (peak, cand)
    return None if fallback is None else fallback[1]
