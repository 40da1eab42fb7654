"""What every stage of the partitioner reads: the batch, the cost model, the options, derived limits.

:class:`PartitionContext` is built once per :func:`~.partition.partition` call
and handed to level 1 (:mod:`.partition`), its local search
(:mod:`.node_balance`), level 2 (:mod:`.place_gpus`), the scores
(:mod:`.score`) and the capacity fallback (:mod:`.capacity_fill`). It holds
inputs and constants (read-only) and memoises the cost queries they repeat; it
never holds a partial result. :class:`Assignment` is one sequence's outcome.

Example (2 nodes x 4 GPUs, 40k tokens per GPU, Llama-7B shape)::

    ctx = PartitionContext([60000, 24000, 3000], cost, PlannerOptions())
    ctx.gpn, ctx.cap            # 4, 40000
    ctx.w[0]                    # 319 ms: sequence 0 whole on one GPU, one layer fwd+bwd
    ctx.target                  # sum(w) / 8 GPUs: the per-GPU time perfect balance gives
    ctx.intra_ok(24000, 4)      # True: a 4-GPU ring over NVLink hides its transfer and beats whole
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .cluster import Cluster
from .cost_model import CostModel
from .options import PlannerOptions
from .predict import ring_time
from .routing import Route, plan_routing
from .zigzag import ring_max_tokens

__all__ = ["Assignment", "assignments_of", "PartitionContext", "NODE_HEADROOM"]

NODE_HEADROOM = 0.05
"""Fraction of a node's token capacity level 1 leaves free while it can (fragmentation)."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where one sequence goes: ``placement`` (``local`` | ``intra_node`` | ``inter_node``) and its
    ranks (one for ``local``; ring order, position ``p`` at ``ranks[p]``, for split ones)."""

    placement: str
    ranks: tuple[int, ...]


def assignments_of(groups: Sequence[tuple[int, ...]], cluster: Cluster) -> list[Assignment]:
    """Each sequence's :class:`Assignment` from its ranks ``groups[i]``: ``local`` on one rank, ``intra_node`` on
    ranks of one node, else ``inter_node``; one object per distinct rank tuple (sequences of one group share it).
    Example (nodes of 8): ``[(3,), (0, 1), (6, 7, 8, 9)]`` -> ``local``, ``intra_node``, ``inter_node``."""
    made: dict[tuple[int, ...], Assignment] = {}
    out = []
    for g in groups:
        a = made.get(g)
        if a is None:
            one_node = len({cluster.node_of(r) for r in g}) == 1
            a = made[g] = Assignment("local" if len(g) == 1 else "intra_node" if one_node else "inter_node", g)
        out.append(a)
    return out


class PartitionContext:
    """Inputs of one partition call, the limits derived from them, and memoised cost queries.

    Attributes (read-only by convention): ``lengths``, ``cost``, ``options``,
    ``cluster``; ``gpn`` (GPUs per node), ``cap`` (tokens per GPU),
    ``proxies`` (NICs a routed cross-node hop uses; 1 without routing),
    ``allow_local`` / ``allow_intra`` / ``allow_inter`` (placements allowed),
    ``w[i]`` (sequence ``i`` whole on one GPU, ms per layer), ``total_tokens``,
    ``quota`` (the linear layout's tokens per GPU, ``T / P``), ``nic_share[l]``
    (GPUs sharing local GPU ``l``'s NIC), ``target`` (``sum(w) / P``),
    ``limit`` (``target * (1 + slack)``), ``node_soft_cap`` (a node's tokens
    minus :data:`NODE_HEADROOM`).
    """

    def __init__(self, lengths: Sequence[int], cost: CostModel, options: PlannerOptions) -> None:
        cl = cost.cluster
        self.lengths, self.cost, self.options, self.cluster = lengths, cost, options, cl
        self.gpn, self.cap = cl.gpus_per_node, cl.tokens_per_gpu
        self.proxies = cl.nics_per_node if options.routing else 1
        self.allow_local = "local" in options.placements
        self.allow_intra = "intra_node" in options.placements
        self.allow_inter = "inter_node" in options.placements
        by_length = {s: cost.local_ms(s) for s in set(lengths)}  # batches repeat lengths: time each once
        self.w = [by_length[s] for s in lengths]
        self.total_tokens = sum(lengths)
        self.quota = self.total_tokens / cl.world_size
        self.nic_share = [cl.gpus_sharing_nic(cl.gpu_nic[l]) for l in range(cl.gpus_per_node)]
        self.target = sum(self.w) / cl.world_size
        self.limit = self.target * (1.0 + options.slack)
        self.node_soft_cap = int(self.gpn * self.cap * (1.0 - NODE_HEADROOM))
        self._inter_ok: dict[tuple[int, int], bool] = {}
        self._intra_ok: dict[tuple[int, int], bool] = {}
        self._rings: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[float, float]] = {}
        self._node_cost: dict[int, float] = {}
        self.node_remap_memo: dict[tuple[tuple[int, ...], tuple[int, ...], bool], float] = {}
        """:func:`~.score.node_remap` by ``(held, quota, routed)``: nodes alike cost alike (large clusters)."""

    def is_light(self, i: int) -> bool:
        """Sequence ``i`` is light enough for level 2 to keep whole on one GPU (``w <= limit``): such
        sequences even out a node's GPUs."""
        return self.w[i] <= self.limit

    def intra_ok(self, s: int, g: int) -> bool:
        """Splitting ``s`` over ``g`` GPUs of a node hides its transfer and beats keeping it whole (memoised:
        level 2 asks for every sequence of every node)."""
        hit = self._intra_ok.get((s, g))
        if hit is None:
            cost = self.cost
            hit = (s >= 2 * g and cost.ring_may_beat_local(s, g)
                   and cost.comm_ratio(s, g, inter_node=False) >= self.options.min_ratio
                   and cost.ring_ms(s, g, inter_node=False) < cost.local_ms(s))
            self._intra_ok[(s, g)] = hit
        return hit

    def inter_ok(self, s: int, ranks: int) -> bool:
        """The same for a ring of ``ranks`` GPUs across nodes (memoised: level 1 asks often)."""
        hit = self._inter_ok.get((s, ranks))
        if hit is None:
            cost = self.cost
            hit = (s >= 2 * ranks and cost.ring_may_beat_local(s, ranks)
                   and cost.comm_ratio(s, ranks, inter_node=True, proxies=self.proxies)
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
        """Per-rank time of ``s`` on a node-spanning ring of ``ranks`` GPUs (routed when enabled)."""
        return self.cost.ring_ms(s, ranks, inter_node=True, proxies=self.proxies)

    def node_cost(self, i: int) -> float:
        """Estimated GPU-time sequence ``i`` adds to a node: ``g`` GPUs x per-rank time.

        ``g``: the smallest ring whose per-rank time meets the limit, else the
        fastest ring (:meth:`fastest_intra`): every ring step pays the call
        overhead, so beyond some size a larger ring is slower, not faster.
        Memoised per length (the answer depends on the length alone).
        """
        s = self.lengths[i]
        hit = self._node_cost.get(s)
        if hit is None:
            hit = self._node_cost[s] = self._node_cost_of(s, self.w[i])
        return hit

    def _node_cost_of(self, s: int, w: float) -> float:
        cost, gpn = self.cost, self.gpn
        if (w <= self.limit and s <= self.cap and self.allow_local) or gpn == 1 or not self.intra_ok(s, 2):
            return w
        for g in range(2, gpn + 1):
            if (cost.ring_ms(s, g, inter_node=False) <= self.limit and 2 * g <= s
                    and ring_max_tokens(s, g) <= self.cap):
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
        fits = [g for g in range(2, gpn + 1) if 2 * g <= s and ring_max_tokens(s, g) <= self.cap]
        if not fits:
            return gpn
        return min(fits, key=lambda g: (cost.ring_ms(s, g, inter_node=False), g))
