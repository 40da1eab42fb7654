"""Token-balanced layout for the linear modules.

Every rank gets ``floor(T/N)`` or ``ceil(T/N)`` tokens. The ``T mod N`` extra
tokens go to the ranks whose attention layout holds the most tokens (ties: lower
rank), so fewer tokens move. Each rank keeps the first ``min(held, quota)``
tokens of its attention buffer in place; the surplus of over-full ranks fills
the deficits of under-full ranks, same node first, then across nodes, both in
rank order.

Worked example, 2 nodes x 2 GPUs, attention tokens ``[10, 2, 3, 1]`` (T = 16,
quota 4 each): rank 0 keeps its first 4 tokens and has 6 surplus; same node:
rank 1 takes 2 (now 4); across nodes: rank 2 takes 1, rank 3 takes 3.
"""

from __future__ import annotations

from itertools import islice
from operator import eq, itemgetter
from typing import Sequence

from .cluster import Cluster
from .gc_pause import gc_paused

__all__ = ["balanced_quotas", "linear_layout"]

TokenRange = tuple[int, int, int]


def balanced_quotas(held: Sequence[int]) -> list[int]:
    """Per-rank token quotas summing to ``sum(held)``, each ``floor`` or ``ceil`` of the mean."""
    n = len(held)
    total = sum(held)
    base, extra = divmod(total, n)
    quotas = [base] * n
    for r in sorted(range(n), key=lambda r: (-held[r], r))[:extra]:
        quotas[r] += 1
    return quotas


def _tokens(ranges: Sequence[TokenRange]) -> int:
    """Tokens in ``ranges``: ``sum(end - start)``, summed column by column (a million ranges: ~50 ms, not 160).

    Example: ``[(0, 0, 4), (1, 2, 3)]`` -> 5.
    """
    if len(ranges) < 8:  # short lists (large clusters): the plain sum is cheaper
        return sum(e - s for _, s, e in ranges)
    return sum(map(itemgetter(2), ranges)) - sum(map(itemgetter(1), ranges))


def _take(ranges: list[TokenRange], count: int, total: int | None = None) -> tuple[list[TokenRange], list[TokenRange]]:
    """Split a range list after ``count`` tokens: ``(first count tokens, rest)``.

    ``total``: the tokens of ``ranges`` when known (``count >= total`` then returns at once).
    Example: ``[(0, 0, 4), (1, 0, 3)]`` after 5 tokens: ``([(0, 0, 4), (1, 0, 1)], [(1, 1, 3)])``.
    """
    if total is not None and count >= total:
        return ranges, []
    left = count
    for k, (seq, s, e) in enumerate(ranges):
        if left >= e - s:
            left -= e - s
        elif left > 0:  # the split falls inside this range
            return ranges[:k] + [(seq, s, s + left)], [(seq, s + left, e)] + ranges[k + 1:]
        else:
            return ranges[:k], ranges[k:]
    return list(ranges), []


def linear_layout(
    attention: Sequence[Sequence[TokenRange]], cluster: Cluster
) -> tuple[tuple[TokenRange, ...], ...]:
    """Token-balanced layout derived from ``attention`` (see module docstring)."""
    with gc_paused():
        return _linear_layout(attention, cluster)


def _linear_layout(
    attention: Sequence[Sequence[TokenRange]], cluster: Cluster
) -> tuple[tuple[TokenRange, ...], ...]:
    n = len(attention)
    held = [_tokens(rs) for rs in attention]
    quotas = balanced_quotas(held)
    kept: list[list[TokenRange]] = []
    surplus: list[list[TokenRange]] = []
    for r in range(n):
        head, rest = _take(list(attention[r]), min(held[r], quotas[r]), held[r])
        kept.append(head)
        surplus.append(rest)
    need = [quotas[r] - min(held[r], quotas[r]) for r in range(n)]
    gpn = cluster.gpus_per_node

    def fill(donors: list[int], takers: list[int]) -> None:
        d = 0
        for t in takers:
            while need[t] > 0:
                while d < len(donors) and not surplus[donors[d]]:
                    d += 1
                if d == len(donors):
                    return
                give, surplus[donors[d]] = _take(surplus[donors[d]], need[t])
                moved = _tokens(give)
                kept[t].extend(give)
                need[t] -= moved

    for node in range(n // gpn):
        ranks = list(range(node * gpn, (node + 1) * gpn))
        fill(ranks, ranks)
    fill(list(range(n)), list(range(n)))
    if any(need) or any(surplus):  # impossible: quotas sum to the tokens held
        raise RuntimeError(f"linear layout left tokens unplaced: need {need}")
    out: list[tuple[TokenRange, ...]] = []
    for r in range(n):
        rs = _coalesce(kept[r])
        # A rank that keeps its attention ranges as they are shares their tuple (cheap equality later).
        mine = attention[r]
        out.append(mine if isinstance(mine, tuple) and held[r] == quotas[r] and rs is kept[r] else tuple(rs))
    return tuple(out)


def _coalesce(ranges: list[TokenRange]) -> list[TokenRange]:
    """Merge neighbours that are contiguous pieces of one sequence; ``ranges`` itself when none are
    (checked first on the sequence column alone: neighbours of different sequences never merge).

    Example: ``[(0, 0, 2), (0, 2, 5), (1, 0, 3)]`` -> ``[(0, 0, 5), (1, 0, 3)]``.
    """
    if len(ranges) < 2:
        return ranges
    seqs = list(map(itemgetter(0), ranges))
    if not any(map(eq, seqs, islice(seqs, 1, None))):
        return ranges
    out: list[TokenRange] = []
    for seq, s, e in ranges:
        if out and out[-1][0] == seq and out[-1][2] == s:
            out[-1] = (seq, out[-1][1], e)
        else:
            out.append((seq, s, e))
    return out
