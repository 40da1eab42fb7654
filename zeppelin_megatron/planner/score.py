"""Scores of a partition, by the prediction's own rules (:mod:`.predict`), cheap enough to call per candidate.

* :func:`attention_times`: each GPU's attention time (one layer) of a set of
  assignments, exactly as :func:`~.predict.predict` computes it;
* :func:`scheduled_attention_times`: the same with the rings run in the
  engine's global order (:func:`~.plan.ring_order`): a ring starts when its
  last member is free, so a rank in two rings holds up its second ring's
  members ("convoys"), which :func:`~.predict.predict` does not count;
* :func:`remap_time` / :func:`node_remap`: the remap time the attention
  layout forces, from per-rank token counts alone (equal to the plan's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .linear_layout import balanced_quotas
from .plan import Ring, ring_order
from .predict import rank_attention
from .remap_routing import nic_proxies
from .zigzag import zigzag_tokens

if TYPE_CHECKING:
    from .partition import Assignment, _Ctx

__all__ = ["attention_times", "scheduled_attention_times", "node_scheduled_peak", "rank_tokens", "remap_time",
           "node_remap"]


def attention_times(ctx: _Ctx, assignments: list[Assignment]) -> list[float]:
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


def scheduled_attention_times(ctx: _Ctx, assignments: list[Assignment]) -> list[float]:
    """Per-GPU attention time (one layer) of ``assignments`` with the rings run in the engine's order.

    Rings (sequences with the same ranks share one) run in :func:`~.plan.ring_order`;
    each starts when its last member is free and keeps every member busy for
    its :func:`~.predict.ring_time` total. A member's idle time (before a
    ring starts, and inside it, ``total - own``) is filled by its local work
    (at least one call overhead), as :func:`~.predict.rank_attention` fills
    ring waits: ``attn_r = end_r + max(0, local_r - idle_r)``, ``end_r`` the
    end of the rank's last ring. Without shared members this equals
    :func:`attention_times`; with them it is at least as large.

    Example: rings ``A = (0, 1)`` then ``B = (1, 2)``, each 4 ms, no local
    work: rank 2 waits for rank 1 (4 ms idle) and ends at 8 ms, not 4.
    """
    cl, cost = ctx.cluster, ctx.cost
    groups: dict[tuple[int, ...], list[int]] = {}
    local = [0.0] * cl.world_size
    for i, a in enumerate(assignments):
        if a.placement == "local":
            local[a.ranks[0]] += ctx.w[i]
        else:
            groups.setdefault(a.ranks, []).append(i)
    out = _schedule(ctx, groups, dict(enumerate(local)), dict.fromkeys(range(cl.world_size), 0.0), assignments)
    return [out[r] for r in range(cl.world_size)]


def node_scheduled_peak(ctx: _Ctx, placed: dict[int, Assignment], ranks: Sequence[int],
                        busy: Sequence[float]) -> float:
    """Busiest GPU of one node under :func:`scheduled_attention_times` rules, for level 2's fills.

    ``placed``: the node's node-local sequences (sequence -> assignment);
    ``ranks``: the node's GPUs; ``busy[r]``: rank ``r``'s node-spanning ring
    time (global rank index), counted as run before the node's own rings.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    local = {r: 0.0 for r in ranks}
    for i in sorted(placed):
        a = placed[i]
        if a.placement == "local":
            local[a.ranks[0]] += ctx.w[i]
        else:
            groups.setdefault(a.ranks, []).append(i)
    return max(_schedule(ctx, groups, local, {r: busy[r] for r in ranks}, placed).values())


def _schedule(ctx: _Ctx, groups: dict[tuple[int, ...], list[int]], local: dict[int, float],
              busy: dict[int, float], assignments: "Sequence[Assignment] | dict[int, Assignment]") -> dict[int, float]:
    """Attention time of each rank of ``local``/``busy`` (same keys, every ring member among them):
    rings ``groups`` (ranks -> sequences) in :func:`~.plan.ring_order` after ``busy``; local work
    fills idle time (see :func:`scheduled_attention_times`)."""
    rings = [Ring(ranks, assignments[seqs[0]].placement, tuple(seqs))  # type: ignore[arg-type]
             for ranks, seqs in groups.items()]
    free = dict(busy)
    idle = dict.fromkeys(busy, 0.0)
    for ring in ring_order(rings, ctx.lengths):
        total, own = ctx.ring_times(ring.ranks, tuple(ctx.lengths[i] for i in ring.seqs))
        start = max(free[r] for r in ring.ranks)
        for r in ring.ranks:
            idle[r] += start - free[r] + total - own
            free[r] = start + total
    o = ctx.cost.call_overhead_ms
    out = {}
    for r, end in free.items():
        loc = max(local[r], o) if local[r] > 0 else 0.0
        out[r] = end + max(0.0, loc - idle[r])
    return out


def rank_tokens(ctx: _Ctx, assignments: list[Assignment]) -> list[int]:
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


def remap_time(ctx: _Ctx, tokens: Sequence[int]) -> float:
    """Remap time (ms, one layer) when rank ``r`` holds ``tokens[r]`` attention tokens: :func:`node_remap`
    of every node with the quotas of :func:`~.linear_layout.balanced_quotas` (equals the plan's remap time)."""
    gpn = ctx.gpn
    quota = balanced_quotas(tokens)

    def slowest(routed: bool) -> float:
        return max(node_remap(ctx, tokens[n * gpn:(n + 1) * gpn], quota[n * gpn:(n + 1) * gpn], routed=routed)
                   for n in range(ctx.cluster.nodes))
    # the plan routes its remap only where that is predicted faster (remap_routing.remap_proxies_for)
    return min(slowest(False), slowest(True)) if _proxies(ctx) > 1 else slowest(False)


def _proxies(ctx: _Ctx) -> int:
    """How many NICs a routed remap would use (1: routing off or one NIC per node)."""
    return len(nic_proxies(ctx.cluster.gpu_nic)) if ctx.options.routing else 1


def node_remap(ctx: _Ctx, held: Sequence[int], quota: Sequence[int], *, routed: bool = True) -> float:
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
