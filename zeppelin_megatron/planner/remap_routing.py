"""Routed remap: spread the layout all-to-all's cross-node traffic over a node's NICs.

The direct remap (:meth:`~.remap.RemapPlan.exchange`) sends every token from
its source rank to its destination rank in one ``all_to_all``: a rank whose
attention buffer holds many tokens of other nodes sends (or receives) them
all through its own NIC, while the node's other NICs idle. Routed, every
cross-node pair ``a -> b`` of ``n`` rows is cut into ``len(proxies)`` parts
(:func:`~.routing.split_counts`); part ``p`` travels through the GPUs of local
index ``proxies[p]`` on both nodes, so it crosses the network on that rail::

    phase 1 (NVLink): a        -> P_a(p)        (skipped when a is P_a(p))
    phase 2 (network): P_a(p)  -> P_b(p)        (same local index: rail-aligned)
    phase 3 (NVLink): P_b(p)   -> b             (skipped when b is P_b(p))

Pairs inside one node move in phase 1. Each phase is one ``all_to_all`` over
the whole group; between phases every rank holds a *staging buffer*: its rows
in transit. :func:`routed_exchange` plays all ranks' phases once (pure, no
communication) and returns, per rank, what each phase sends and keeps.

Rows that stay on their rank never enter a phase (:class:`~.remap.RankExchange`'s
``keep_src`` / ``keep_dst``). Staging order (what makes the index arithmetic agree on all ranks): a
rank's first staging buffer is its direct send buffer (rows grouped by destination
rank, ``RankExchange.send_index`` order), which lists its pieces by
``(destination, part)``. In a phase, a rank sends the pieces whose next hop is
another rank, grouped by that rank (ascending), each group in staging order,
and keeps the rest; its next staging buffer is the kept pieces (in order) and
then what it received, by source rank (ascending), each source's pieces in the
order that source sent them. After phase 3 a rank holds exactly the rows sent
to it; ``final_index`` reorders them into the direct exchange's receive order
(by source rank, then the source's order).

Worked example, 2 nodes x 2 GPUs, proxies ``(0, 1)``: rank 0 sends 5 rows to
rank 3. Parts ``[3, 2]``: part 0 (3 rows) stays on rank 0 in phase 1, crosses
0 -> 2 in phase 2 (rail 0), goes 2 -> 3 in phase 3; part 1 (2 rows) goes 0 -> 1
in phase 1, crosses 1 -> 3 in phase 2 (rail 1) and is home.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .remap import Direction, RemapPlan
from .routing import split_counts

__all__ = ["RoutedPhase", "RoutedExchange", "routed_exchange", "nic_proxies", "proxy_parts"]


def proxy_parts(a: int, b: int, n: int, gpus_per_node: int,
                proxies: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """The non-empty parts of ``n`` rows of the cross-node pair ``a -> b``: ``(part, rows, P_a, P_b)``,
    part ``p`` on proxy ``proxies[p]``'s GPU of each node (:func:`~.routing.split_counts`).

    Example: 2 nodes x 2 GPUs, ``0 -> 3``, 5 rows, proxies ``(0, 1)``: ``[(0, 3, 0, 2), (1, 2, 1, 3)]``.
    """
    na, nb = a // gpus_per_node, b // gpus_per_node
    return [(p, rows, na * gpus_per_node + x, nb * gpus_per_node + x)
            for p, (x, rows) in enumerate(zip(proxies, split_counts(n, len(proxies)))) if rows]


def nic_proxies(gpu_nic: Sequence[int]) -> tuple[int, ...]:
    """One local GPU per NIC (the lowest-numbered one), in NIC order.

    Example: ``gpu_nic = (0, 0, 1, 1)`` (two GPUs per NIC) -> ``(0, 2)``.
    """
    first: dict[int, int] = {}
    for local, nic in enumerate(gpu_nic):
        first.setdefault(nic, local)
    return tuple(first[n] for n in sorted(first))


@dataclass(frozen=True)
class RoutedPhase:
    """One ``all_to_all`` of one rank: ``send_index`` [sum(send_counts)] rows of the staging
    buffer grouped by destination (Zeppelin-rank order); ``keep_index`` rows it keeps; the next
    staging buffer is ``cat(staging[keep_index], received)``."""

    send_counts: tuple[int, ...]
    send_index: np.ndarray
    recv_counts: tuple[int, ...]
    keep_index: np.ndarray


@dataclass(frozen=True)
class RoutedExchange:
    """One rank's routed remap in one direction: three phases, then ``final_index`` [received
    rows] positions in the last staging buffer, in the direct exchange's receive order."""

    phases: tuple[RoutedPhase, ...]
    final_index: np.ndarray


# A piece: (source, destination, part, rows, path) with path[t] = its rank after phase t.
_Piece = tuple[int, int, int, int, tuple[int, int, int, int]]


def _pieces(remap: RemapPlan, direction: Direction, gpus_per_node: int,
            proxies: Sequence[int]) -> list[list[_Piece]]:
    """Per source rank, its pieces in direct send order (destination, then part)."""
    world = remap.world_size
    counts = remap.counts(direction)
    out: list[list[_Piece]] = [[] for _ in range(world)]
    for a in range(world):
        for b in range(world):
            n = int(counts[a, b])
            if n == 0 or a == b:  # staying rows never enter the exchange (RankExchange.keep_src)
                continue
            if a // gpus_per_node == b // gpus_per_node:
                out[a].append((a, b, 0, n, (a, b, b, b)))
                continue
            parts = proxy_parts(a, b, n, gpus_per_node, proxies)
            out[a] += [(a, b, p, rows, (a, pa, pb, b)) for p, rows, pa, pb in parts]
    return out


def _ranges(offsets: list[int], sizes: list[int]) -> np.ndarray:
    if not offsets:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(o, o + n, dtype=np.int64) for o, n in zip(offsets, sizes)])


def routed_exchange(remap: RemapPlan, direction: Direction, gpus_per_node: int,
                    proxies: Sequence[int]) -> list[RoutedExchange]:
    """Every rank's :class:`RoutedExchange` (see the module docstring). Deterministic.

    ``proxies``: distinct local indices (one per NIC in use), at least one.
    """
    world = remap.world_size
    if not proxies or len(set(proxies)) != len(proxies) or not all(0 <= p < gpus_per_node for p in proxies):
        raise ValueError(f"proxies must be distinct local indices in [0, {gpus_per_node}), got {list(proxies)}")
    if world % gpus_per_node:
        raise ValueError(f"world size {world} is not a multiple of gpus_per_node {gpus_per_node}")
    staging = _pieces(remap, direction, gpus_per_node, proxies)
    phases: list[list[RoutedPhase]] = [[] for _ in range(world)]
    for t in (1, 2, 3):
        outgoing: list[dict[int, list[_Piece]]] = [{} for _ in range(world)]
        kept: list[list[_Piece]] = [[] for _ in range(world)]
        plans = []
        for r in range(world):
            offs = np.cumsum([0] + [x[3] for x in staging[r]])
            keep_o, keep_n = [], []
            by_dst: dict[int, list[tuple[int, int]]] = {}
            for i, x in enumerate(staging[r]):
                nxt = x[4][t]
                if nxt == r:
                    kept[r].append(x)
                    keep_o.append(int(offs[i]))
                    keep_n.append(x[3])
                else:
                    outgoing[r].setdefault(nxt, []).append(x)
                    by_dst.setdefault(nxt, []).append((int(offs[i]), x[3]))
            sending = [0] * world
            send_o, send_n = [], []
            for d in sorted(by_dst):
                for o, n in by_dst[d]:
                    sending[d] += n
                    send_o.append(o)
                    send_n.append(n)
            plans.append((tuple(sending), _ranges(send_o, send_n), _ranges(keep_o, keep_n)))
        for r in range(world):
            recv_counts = [0] * world
            arrived: list[_Piece] = []
            for s in range(world):
                for x in outgoing[s].get(r, ()):
                    recv_counts[s] += x[3]
                    arrived.append(x)
            send_counts, send_index, keep_index = plans[r]
            phases[r].append(RoutedPhase(send_counts, send_index, tuple(recv_counts), keep_index))
            staging[r] = kept[r] + arrived
    out = []
    for r in range(world):
        offs = np.cumsum([0] + [x[3] for x in staging[r]])
        order = sorted(range(len(staging[r])), key=lambda i: (staging[r][i][0], staging[r][i][2]))
        final = _ranges([int(offs[i]) for i in order], [staging[r][i][3] for i in order])
        out.append(RoutedExchange(tuple(phases[r]), final))
    return out
