"""Routing plan: spread each cross-node ring hop over idle NICs through proxy GPUs.

A ring whose ranks span nodes sends, at every step, from each rank to the next
ring position. A *cross hop* is one whose ends are on different nodes. With a
node-major ring over whole nodes only one GPU per node sends across, so one
NIC works while the others idle. A :class:`Route` splits the hop's payload
into parts, one per proxy local index ``p`` (rail-aligned: the same local index
on both nodes):

* ``p == local(src)``: the part goes straight from ``src`` to ``dst``;
* otherwise: ``src -> (node(src), p)`` over NVLink (dispatch),
  ``(node(src), p) -> (node(dst), p)`` over ``p``'s NIC,
  ``(node(dst), p) -> dst`` over NVLink (combine; skipped when that is ``dst``).

Part sizes come from :func:`split_counts` (the only place that splits bytes).
A route is planned only when the cost model says it is faster than the direct
transfer; hops without a route go direct.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from .cluster import Cluster
from .zigzag import next_position

if TYPE_CHECKING:
    from .cost_model import CostModel

__all__ = ["Route", "RoutePart", "split_counts", "route_parts", "outside_relays", "cross_hops", "plan_routing"]


@dataclass(frozen=True)
class Route:
    """Cross-node hop ``src -> dst`` of the ring ``ring``, split over ``proxies`` (local indices).

    ``proxies[0]`` is ``local(src)`` (its own NIC, direct part); the others are
    idle GPUs whose NICs carry the other parts.
    """

    ring: tuple[int, ...]
    src: int
    dst: int
    proxies: tuple[int, ...]


def split_counts(n: int, parts: int) -> list[int]:
    """Split ``n`` elements into ``parts`` near-equal counts (earlier parts larger).

    Example: ``split_counts(10, 4) == [3, 3, 2, 2]``.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(n, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


@dataclass(frozen=True)
class RoutePart:
    """Part ``part`` of a routed transfer: elements ``[offset, offset + count)`` travel along
    ``path``, the ranks they visit: ``(src, dst)`` for the direct part (the source's own NIC),
    else ``(src, P_src, P_dst)`` or ``(src, P_src, P_dst, dst)``, with ``P_x`` the proxy's GPU
    on ``x``'s node (the last hop is dropped when ``P_dst`` is ``dst``)."""

    part: int
    offset: int
    count: int
    path: tuple[int, ...]

    @property
    def relays(self) -> tuple[int, ...]:
        """Ranks on the path other than its two ends."""
        return self.path[1:-1]


def route_parts(route: Route, n: int, gpus_per_node: int) -> list[RoutePart]:
    """How ``n`` elements of ``route.src -> route.dst`` split over the route's proxies
    (:func:`split_counts`, in proxy order; empty parts left out). Ranks are node-major
    (``rank = node * gpus_per_node + local``). The one place the runtime's router, the
    simulator and the planner's timeline turn a route into paths.

    Example: 2 nodes x 4 GPUs, route 1 -> 6 over proxies ``(1, 3)``, 10 elements: part 0
    (5 elements) goes ``1 -> 6`` on rank 1's NIC; part 1 (5) goes ``1 -> 3`` (NVLink),
    ``3 -> 7`` (rail 3), ``7 -> 6`` (NVLink).
    """
    src_node, dst_node = route.src // gpus_per_node, route.dst // gpus_per_node
    out: list[RoutePart] = []
    offset = 0
    for k, (p, count) in enumerate(zip(route.proxies, split_counts(n, len(route.proxies)))):
        if count:
            if p == route.src % gpus_per_node:
                path: tuple[int, ...] = (route.src, route.dst)
            else:
                a, b = src_node * gpus_per_node + p, dst_node * gpus_per_node + p
                path = (route.src, a, b) if b == route.dst else (route.src, a, b, route.dst)
            out.append(RoutePart(k, offset, count, path))
        offset += count
    return out


def outside_relays(ring: Sequence[int], routes: Iterable[Route], gpus_per_node: int) -> tuple[int, ...]:
    """The ranks outside ``ring`` that relay a part of one of its ``routes`` (ascending): proxy GPUs that walk the
    ring's transfers without holding any of its tokens. Example: ring ``(0, 4)`` on 2 x 4 GPUs, both hops routed
    over local indices ``(0, 1)``: ranks 1 and 5 (``0 -> 1 -> 5 -> 4`` and ``4 -> 5 -> 1 -> 0``)."""
    members = set(ring)
    return tuple(sorted({r for route in routes for part in route_parts(route, len(route.proxies), gpus_per_node)
                         for r in part.relays if r not in members}))


def cross_hops(ring: Sequence[int], cluster: Cluster) -> list[tuple[int, int]]:
    """``(src, dst)`` pairs of consecutive ring ranks on different nodes, in ring order."""
    g = len(ring)
    hops = []
    for i in range(g):
        src, dst = ring[i], ring[next_position(i, g)]
        if g > 1 and cluster.node_of(src) != cluster.node_of(dst):
            hops.append((src, dst))
    return hops


def plan_routing(
    rings: Sequence[tuple[Sequence[int], int]],
    cluster: Cluster,
    cost: "CostModel | None",
    *,
    enabled: bool = True,
) -> tuple[Route, ...]:
    """Routes for the cross hops of every ring.

    ``rings``: ``(ranks in ring order, forward K/V bytes per step)`` for each
    ring; rings run one at a time, so NICs are shared only within a ring.
    With ``cost=None`` every idle NIC is used (no pay-off test).
    """
    if not enabled:
        return ()
    routes: list[Route] = []
    for ring, step_bytes in rings:
        hops = cross_hops(ring, cluster)
        if not hops:
            continue
        # NICs the ring's direct cross hops already use, per node and direction.
        out_busy: dict[int, set[int]] = {}
        in_busy: dict[int, set[int]] = {}
        for src, dst in hops:
            out_busy.setdefault(cluster.node_of(src), set()).add(cluster.nic_of(src))
            in_busy.setdefault(cluster.node_of(dst), set()).add(cluster.nic_of(dst))
        # Hand each node's idle NICs to its outgoing hops round-robin.
        spare: dict[tuple[int, int], list[int]] = {hop: [] for hop in hops}
        taken_out = {n: set(s) for n, s in out_busy.items()}
        taken_in = {n: set(s) for n, s in in_busy.items()}
        progress = True
        while progress:
            progress = False
            for src, dst in hops:
                a, b = cluster.node_of(src), cluster.node_of(dst)
                for p in range(cluster.gpus_per_node):
                    nic = cluster.gpu_nic[p]
                    if nic in taken_out[a] or nic in taken_in.setdefault(b, set()):
                        continue
                    spare[(src, dst)].append(p)
                    taken_out[a].add(nic)
                    taken_in[b].add(nic)
                    progress = True
                    break
        for src, dst in hops:
            extra = spare[(src, dst)]
            if not extra:
                continue
            best = len(extra)
            if cost is not None:
                nbytes = 3 * step_bytes
                times = [cost.routed_ms(nbytes, 1 + m) for m in range(len(extra) + 1)]
                best = min(range(len(times)), key=lambda m: (times[m], m))
            if best > 0:
                routes.append(Route(tuple(ring), src, dst, (cluster.local_of(src),) + tuple(extra[:best])))
    routes.sort(key=lambda r: (r.ring, r.src, r.dst))
    return tuple(routes)

