"""Scores of a partition, by the prediction's own rules (:mod:`.predict`), cheap enough to call per candidate.

* :func:`attention_times`: each GPU's attention time (one layer) of a set of
  assignments, exactly as :func:`~.predict.predict` computes it;
* :func:`remap_time` / :func:`node_remap`: the remap time the attention
  layout forces, from per-rank token counts alone (equal to the plan's).
"""

from __future__ import annotations

from typing import Sequence

from .linear_layout import balanced_quotas
from .partition_context import Assignment, PartitionContext
from .predict import rank_attention
from .remap_routing import nic_proxies
from .zigzag import zigzag_tokens

__all__ = ["attention_times", "rank_tokens", "remap_time", "node_remap"]


def attention_times(ctx: PartitionContext, assignments: list[Assignment]) -> list[float]:
    """Per-GPU attention time (one layer) of ``assignments``, by the rule of :func:`~.predict.predict`.

    Sequences with the same ranks share a ring; cross-node hops are routed as
    :func:`~.routing.plan_routing` routes them (over idle NICs when enabled).
    """
    cl, cost = ctx.cluster, ctx.cost
    rings: dict[tuple[int, ...], list[int]] = {}
    local = [0.0] * cl.world_size
    for i, a in enumerate(assignments):
        if a.placement == "local":
            local[a.ranks[0]] += ctx.w[i]
        else:
            rings.setdefault(a.ranks, []).append(ctx.lengths[i])
    ring_total = [0.0] * cl.world_size
    ring_own = [0.0] * cl.world_size
    for ranks, ls in rings.items():
        total, own = ctx.ring_times(ranks, tuple(ls))
        for r in ranks:
            ring_total[r] += total
            ring_own[r] += own
    return rank_attention(ring_total, ring_own, local, cost.call_overhead_ms)[0]


def rank_tokens(ctx: PartitionContext, assignments: list[Assignment]) -> list[int]:
    """Attention tokens of each rank under ``assignments``."""
    tokens = [0] * ctx.cluster.world_size
    for i, a in enumerate(assignments):
        s = ctx.lengths[i]
        if len(a.ranks) == 1:
            tokens[a.ranks[0]] += s
        else:
            for p, r in enumerate(a.ranks):
                tokens[r] += zigzag_tokens(s, len(a.ranks), p)
    return tokens


def remap_time(ctx: PartitionContext, tokens: Sequence[int]) -> float:
    """Remap time (ms, one layer) when rank ``r`` holds ``tokens[r]`` attention tokens: :func:`node_remap`
    of every node with the quotas of :func:`~.linear_layout.balanced_quotas` (equals the plan's remap time)."""
    gpn = ctx.gpn
    quota = balanced_quotas(tokens)

    def slowest(routed: bool) -> float:
        return max(node_remap(ctx, tokens[n * gpn:(n + 1) * gpn], quota[n * gpn:(n + 1) * gpn], routed=routed)
                   for n in range(ctx.cluster.nodes))
    # the plan routes its remap only where that is predicted faster (remap_routing.remap_proxies_for)
    return min(slowest(False), slowest(True)) if _proxies(ctx) > 1 else slowest(False)


def _proxies(ctx: PartitionContext) -> int:
    """How many NICs a routed remap would use (1: routing off or one NIC per node)."""
    return len(nic_proxies(ctx.cluster.gpu_nic)) if ctx.options.routing else 1


def node_remap(ctx: PartitionContext, held: Sequence[int], quota: Sequence[int], *, routed: bool = True) -> float:
    """Remap time (ms, one layer) of one node's slowest GPU, GPU ``l`` holding ``held[l]`` of ``quota[l]``.

    Counts what :func:`~.linear_layout.linear_layout` moves: surpluses fill the
    node's deficits in local order over NVLink; what is left (a surplus or a
    deficit) crosses nodes. Times it as :func:`~.predict.predict` does: NVLink
    bytes over NVLink plus network bytes over the GPU's NIC share, ``2 q + kv``
    bytes per token, counted on both sides; with routing (the plan's
    ``remap_proxies``, one GPU per NIC) the node's network bytes spread over the
    ``k`` proxies' NICs (``max(out, in) / k`` each) and each GPU forwards ``2 (k-1)/k``
    of its larger direction over NVLink (``routed=False``: direct, as if routing were off).
    Example: held ``[10, 2]``, quota ``[4, 4]``: GPU 0 sends 2 tokens to GPU 1
    over NVLink and 4 across nodes.
    """
    key = (tuple(held), tuple(quota), routed)
    hit = ctx.node_remap_memo.get(key)
    if hit is None:
        hit = ctx.node_remap_memo[key] = _node_remap(ctx, held, quota, routed)
    return hit


def _node_remap(ctx: PartitionContext, held: Sequence[int], quota: Sequence[int], routed: bool) -> float:
    cost = ctx.cost
    surplus = [max(0, h - q) for h, q in zip(held, quota)]
    need = [max(0, q - h) for h, q in zip(held, quota)]
    intra = [0] * len(held)
    donors = [l for l in range(len(held)) if surplus[l]]
    d = 0
    for taker in range(len(held)):
        while need[taker] and d < len(donors):
            n = min(need[taker], surplus[donors[d]])
            need[taker] -= n
            surplus[donors[d]] -= n
            intra[taker] += n
            intra[donors[d]] += n
            if not surplus[donors[d]]:
                d += 1
    per_token = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    k = _proxies(ctx) if routed else 1
    if k > 1:  # surplus left: rows this GPU sends across nodes; need left: rows it receives
        cross = max(sum(surplus), sum(need))
        return max(cost.nvlink_ms((intra[l] + 2 * max(surplus[l], need[l]) * (k - 1) / k) * per_token)
                   + cost.nic_ms(cross * per_token / k) for l in range(len(held)))
    return max(cost.nvlink_ms(intra[l] * per_token)
               + cost.nic_ms((surplus[l] + need[l]) * per_token * ctx.nic_share[l]) for l in range(len(held)))
