"""The layout exchanges of a lowered program: :class:`RemapExchange` and each rank's share.

Part of :mod:`.lowering` (which re-exports these names): ``to_attention`` before
attention, ``to_linear`` after, one ``all_to_all``, or with ``remap_proxies`` the
three routed phases of :mod:`.remap_routing`. Pure, standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import StepPlan
from .remap import Direction, RankExchange
from .remap_routing import RoutedExchange, proxy_parts, routed_exchange

__all__ = ["RemapExchange", "lower_remaps", "rank_remap"]


@dataclass(frozen=True, kw_only=True)
class RemapExchange:
    """The layout exchange ``direction`` (``to_attention`` before attention, ``to_linear`` after):
    direct (``proxies`` empty: one ``all_to_all``) or the three routed phases over ``proxies``."""

    direction: Direction
    proxies: tuple[int, ...]
    pair_rows: tuple[tuple[int, int, int], ...]
    """``(source rank, destination rank, rows)`` for every pair that moves rows, ascending."""

    def chains(self, gpus_per_node: int) -> tuple[tuple[tuple[int, ...], int], ...]:
        """``(path, rows)`` pieces, pairs in order: a pair inside one node, or any pair when direct,
        is one piece ``((a, b), rows)``; a routed cross-node pair gives one piece per proxy part
        (:func:`~.remap_routing.proxy_parts`), path ``(a, P_a, P_b, b)`` without repeated ranks.
        Example: 2 x 2 GPUs, proxies (0, 1), ``0 -> 3`` 5 rows: ``((0, 2, 3), 3)``, ``((0, 1, 3), 2)``."""
        out: list[tuple[tuple[int, ...], int]] = []
        for a, b, n in self.pair_rows:
            if not self.proxies or a // gpus_per_node == b // gpus_per_node:
                out.append(((a, b), n))
                continue
            for _, rows, pa, pb in proxy_parts(a, b, n, gpus_per_node, self.proxies):
                path = (a,) + ((pa,) if pa != a else ()) + (pb,) + ((b,) if pb != b else ())
                out.append((path, rows))
        return tuple(out)



def lower_remaps(plan: StepPlan) -> tuple[RemapExchange, RemapExchange] | None:
    """The plan's two :class:`RemapExchange` s (None when the layouts move no row)."""
    moved: dict[tuple[int, int], int] = {}
    for seg in plan.remap.segments:
        if seg.lin_rank != seg.att_rank:
            key = (seg.lin_rank, seg.att_rank)
            moved[key] = moved.get(key, 0) + seg.length
    if not moved:
        return None
    fwd = tuple((a, b, n) for (a, b), n in sorted(moved.items()))
    back = tuple(sorted((b, a, n) for a, b, n in fwd))
    return (RemapExchange(direction="to_attention", proxies=plan.remap_proxies, pair_rows=fwd),
            RemapExchange(direction="to_linear", proxies=plan.remap_proxies, pair_rows=back))


def rank_remap(plan: StepPlan, rank: int, direction: Direction) -> tuple[RankExchange, RoutedExchange | None]:
    """``rank``'s remap in ``direction``: the direct ``all_to_all`` lists (:meth:`~.remap.RemapPlan.exchange`:
    counts, gather and scatter indices) and, when the plan routes its remap (``remap_proxies`` on more
    than one rank), the three routed phases (:func:`~.remap_routing.routed_exchange`), else None."""
    direct = plan.remap.exchange(rank, direction)
    if not plan.remap_proxies or plan.world_size == 1:
        return direct, None
    return direct, routed_exchange(plan.remap, direction, plan.gpus_per_node, plan.remap_proxies)[rank]
