"""Workload-balanced linear layout: the heaviest ranks keep their tokens, the others even out.

The remap's all-to-alls are waits between the ranks that exchange rows, not a barrier of all
ranks (``sim/program.py`` waits for the legs a rank sends or receives; the runtime's
``all_to_all_single`` on NCCL posts only the non-empty sends and receives). So ranks that
exchange rows end together (``max attention + max linear + remap`` over them), while a rank that
moves no row runs its own ``attention + linear`` and waits for nobody. Moving rows *onto* a
rank with heavy attention makes every rank it exchanges with wait for that attention; giving it
fewer linear tokens (its own attention tokens, usually few: a long document's ring chunks) and
evening out the rest among the other ranks shortens the step when the heavy ranks' attention
stands out (at 128 GPUs: simulated, ``benchmarks/simulate_tables.py`` configurations; see
docs/planner.md, "Linear layout").

The layout, for a number ``k`` of *stay groups*:

1. ranks joined by rings form groups (:func:`ring_groups`; a ring's members stay or go together, so
   a staying rank's ring partners never wait for a remap), ordered by their heaviest member's
   attention time (ties: lowest rank);
2. the first ``k`` groups *stay*: linear tokens = their attention tokens, in place;
3. the other ranks share their tokens evenly (``floor`` or ``ceil`` of their mean; the extra tokens
   to those holding the most), across the cluster or (``per_node``) within each node, keep the
   first ``min(held, quota)`` tokens of their attention buffer and fill deficits from surpluses on
   their node first, then across nodes (:func:`quota_layout`, the rule of :mod:`~.linear_layout`
   with other quotas). Per node no row crosses nodes, so no NIC and no other node's GPU relays the
   remap, and a staying rank is on no remap path at all (a relay waits like a sender).

``k`` is chosen (:func:`choose_stays`) by the estimate ``max(stay, rest)``: ``stay`` the stayers'
slowest ``attention + linear(held)``, ``rest`` the others' heaviest attention plus the linear time
of their mean tokens (per node: the slowest node's) plus an assumed remap; only groups heavier than
the mean attention are offered. Every quota is at most the largest attention count, so the layout
fits ``tokens_per_gpu`` whenever the attention layout does.

Worked example, 1 node x 4 GPUs, attention tokens ``[2, 2, 9, 7]``, ranks 0-1 one ring with 100 ms
of attention each, ranks 2-3 local work of 20 ms, linear 1 ms per token: groups ``(0, 1)``,
``(2,)``, ``(3,)``. ``k = 1``: ranks 0-1 stay (``100 + 2 = 102``); ranks 2-3 share 16 tokens, 8
each (rank 2 sends one token to rank 3): ``20 + 8 + remap``. Token-balanced would give every rank
5 tokens and the exchanging ranks ``100 + 5 + remap``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .gc_pause import gc_paused
from .linear_layout import _take

if TYPE_CHECKING:
    from .cost_model import CostModel
    from .plan import StepPlan

__all__ = ["StayChoice", "ring_groups", "choose_stays", "quota_layout", "stay_quotas"]

TokenRange = tuple[int, int, int]


@dataclass(frozen=True)
class StayChoice:
    """The chosen stay groups: ``stays`` (sorted ranks), per-rank ``quotas`` (linear tokens),
    ``estimate_ms`` (the step estimate that chose them) and ``bound_ms``: a lower bound on the
    predicted step of any plan with these quotas (every rank's ``attention + linear(quota)``)."""

    stays: tuple[int, ...]
    quotas: tuple[int, ...]
    estimate_ms: float
    bound_ms: float


def ring_groups(plan: "StepPlan") -> list[tuple[int, ...]]:
    """Ranks joined by shared rings (transitively), each group sorted, groups by lowest rank; a rank in
    no ring is a group of its own.

    Example: rings ``(0, 1)`` and ``(1, 2)`` on 4 ranks: ``[(0, 1, 2), (3,)]``.
    """
    parent = list(range(plan.world_size))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for ring in plan.rings:
        root = find(ring.ranks[0])
        for r in ring.ranks[1:]:
            other = find(r)
            if other != root:
                parent[max(other, root)] = min(other, root)
                root = min(other, root)
    groups: dict[int, list[int]] = {}
    for r in range(plan.world_size):
        groups.setdefault(find(r), []).append(r)
    return [tuple(g) for _, g in sorted(groups.items())]


def stay_quotas(held: Sequence[int], stays: set[int], gpus_per_node: int | None = None) -> list[int]:
    """Linear tokens per rank: ``held[r]`` for a stayer; the others share their tokens, ``floor`` or
    ``ceil`` of their mean, the ``ceil`` to those holding the most (ties: lower rank); with
    ``gpus_per_node``, node by node (no row crosses nodes).

    Example: held ``[2, 2, 9, 7]``, stays ``{0, 1}``: ``[2, 2, 8, 8]``; stays ``{0}``: ``[2, 6, 6, 6]``;
    stays ``{0}`` node by node with 2 GPUs per node: ``[2, 2, 8, 8]`` (rank 1 is alone in its node).
    """
    n = len(held)
    quotas = list(held)
    g = gpus_per_node or n
    for start in range(0, n, g):
        rest = [r for r in range(start, min(n, start + g)) if r not in stays]
        if not rest:
            continue
        base, extra = divmod(sum(held[r] for r in rest), len(rest))
        for r in rest:
            quotas[r] = base
        for r in sorted(rest, key=lambda r: (-held[r], r))[:extra]:
            quotas[r] += 1
    return quotas


def choose_stays(plan: "StepPlan", attention_ms: Sequence[float], cost: "CostModel",
                 remap_ms: float, per_node: bool = False) -> StayChoice | None:
    """The stay groups of the workload-balanced layout (module docstring), or ``None`` when there is
    no choice between token-balanced (no group stays) and the attention layout (all stay), or no group
    is heavier than the mean attention (only such groups are offered to stay).

    ``attention_ms[r]``: rank ``r``'s attention time per step (:func:`~.predict.attention_time`);
    ``remap_ms``: the remap time per step to assume for the ranks that exchange rows. ``per_node``: the
    others even out within their node only (:func:`stay_quotas`; the estimate takes the slowest node).
    """
    groups = ring_groups(plan)
    if len(groups) < 2:
        return None
    layers = cost.model.layers
    world = plan.world_size
    gpn = plan.gpus_per_node if per_node else world
    held = [plan.tokens(r, "attention") for r in range(world)]
    heavy = [max(attention_ms[r] for r in g) for g in groups]
    order = sorted(range(len(groups)), key=lambda i: (-heavy[i], groups[i][0]))
    # Per part (the whole cluster, or a node): the others' tokens, count, and their attention, heaviest first.
    parts = world // gpn
    tokens = [sum(held[p * gpn:(p + 1) * gpn]) for p in range(parts)]
    count = [gpn] * parts
    staying = [False] * world
    by_att = [sorted(range(p * gpn, (p + 1) * gpn), key=lambda r: -attention_ms[r]) for p in range(parts)]
    top = [0] * parts  # index into by_att[p] of the heaviest rank still evening out

    def rest_ms(p: int) -> float:
        while top[p] < gpn and staying[by_att[p][top[p]]]:
            top[p] += 1
        if top[p] == gpn:
            return 0.0
        return attention_ms[by_att[p][top[p]]] + layers * cost.linear_ms(-(-tokens[p] // count[p])) + remap_ms

    value = [rest_ms(p) for p in range(parts)]
    heap = [(-v, p) for p, v in enumerate(value)]
    heapq.heapify(heap)
    stay = 0.0
    best: tuple[float, int] | None = None
    mean_att = sum(attention_ms) / world
    for k in range(1, len(order)):
        if heavy[order[k - 1]] <= mean_att:  # only groups heavier than the mean stay
            break
        g = groups[order[k - 1]]
        stay = max(stay, max(attention_ms[r] + layers * cost.linear_ms(held[r]) for r in g))
        touched = set()
        for r in g:
            staying[r] = True
            p = r // gpn
            tokens[p] -= held[r]
            count[p] -= 1
            touched.add(p)
        for p in sorted(touched):
            value[p] = rest_ms(p)
            heapq.heappush(heap, (-value[p], p))
        while -heap[0][0] != value[heap[0][1]]:  # stale entries
            heapq.heappop(heap)
        est = max(stay, -heap[0][0])
        if best is None or est < best[0]:
            best = (est, k)
        if stay >= best[0]:  # the stayers alone already cost more: more stayers cannot help
            break
    if best is None:
        return None
    est, k = best
    stays = {r for i in order[:k] for r in groups[i]}
    quotas = stay_quotas(held, stays, plan.gpus_per_node if per_node else None)
    bound = max(attention_ms[r] + layers * cost.linear_ms(quotas[r]) for r in range(world))
    return StayChoice(tuple(sorted(stays)), tuple(quotas), est, bound)


def quota_layout(attention: Sequence[Sequence[TokenRange]], quotas: Sequence[int],
                 gpus_per_node: int) -> tuple[tuple[TokenRange, ...], ...]:
    """A linear layout giving rank ``r`` exactly ``quotas[r]`` tokens (``sum(quotas)`` must be the
    attention layout's tokens): each rank keeps the first ``min(held, quota)`` tokens of its attention
    buffer; the surplus of over-full ranks fills the deficits of under-full ranks, same node first, then
    across nodes, both in rank order (:mod:`~.linear_layout`'s rule, there with balanced quotas).

    Example, 1 node x 3 GPUs: attention ``[[(0, 0, 4)], [(1, 0, 1)], [(2, 0, 1)]]``, quotas ``[2, 2, 2]``:
    ``[[(0, 0, 2)], [(1, 0, 1), (0, 2, 3)], [(2, 0, 1), (0, 3, 4)]]``.

    Raises:
        ValueError: the quotas do not sum to the attention layout's tokens.
    """
    with gc_paused():
        return _quota_layout(attention, quotas, gpus_per_node)


def _quota_layout(attention: Sequence[Sequence[TokenRange]], quotas: Sequence[int],
                  gpus_per_node: int) -> tuple[tuple[TokenRange, ...], ...]:
    n = len(attention)
    held = [sum(e - s for _, s, e in rs) for rs in attention]
    if len(quotas) != n or sum(quotas) != sum(held) or min(quotas, default=0) < 0:
        raise ValueError(f"quotas {list(quotas)[:8]}... (sum {sum(quotas)}, {len(quotas)} ranks) must be >= 0 and "
                         f"sum to the attention layout's {sum(held)} tokens on {n} ranks")
    kept: list[list[TokenRange]] = []
    surplus: list[list[TokenRange]] = []
    for r in range(n):
        if held[r] <= quotas[r]:
            kept.append(list(attention[r]))
            surplus.append([])
        else:
            head, rest = _take(list(attention[r]), quotas[r])
            kept.append(head)
            surplus.append(rest)
    need = [max(0, quotas[r] - held[r]) for r in range(n)]

    def fill(ranks: range) -> None:
        donors = [r for r in ranks if surplus[r]]
        d = 0
        for t in ranks:
            while need[t] > 0 and d < len(donors):
                give, surplus[donors[d]] = _take(surplus[donors[d]], need[t])
                kept[t].extend(give)
                need[t] -= sum(e - s for _, s, e in give)
                if not surplus[donors[d]]:
                    d += 1

    for node in range(n // gpus_per_node):
        fill(range(node * gpus_per_node, (node + 1) * gpus_per_node))
    fill(range(n))
    out: list[tuple[TokenRange, ...]] = []
    for r in range(n):
        rs = attention[r]
        if held[r] == quotas[r] and isinstance(rs, tuple):
            out.append(rs)  # kept as it is: share the tuple
            continue
        merged: list[TokenRange] = []
        for seq, s, e in kept[r]:
            if merged and merged[-1][0] == seq and merged[-1][2] == s:
                merged[-1] = (seq, merged[-1][1], e)
            else:
                merged.append((seq, s, e))
        out.append(tuple(merged))
    return tuple(out)
