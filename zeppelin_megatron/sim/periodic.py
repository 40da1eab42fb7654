"""When a chained simulation (:func:`~.simulator.simulate_program`) may stop early: independent components of
ranks, and the layer from which each one repeats itself.

A step is ``layers`` chained copies of one layer's op lists. Ranks interact only through transfers they take
part in and through link ports their flows share (a GPU's NVLink ports are its own; a NIC's are shared by the
GPUs attached to it, ``cluster.gpu_nic``). :func:`components` splits the ranks into groups that interact with
no rank outside: union of the two ends of every hop, and of every rank whose hops cross one NIC port.

:class:`LayerLog` records, per component and layer, every event time: each rank's compute starts (in its op
order) and each hop's start and end. A component whose layers ``l - 2``, ``l - 1`` and ``l`` are each the
previous one shifted by one ``delta`` in every event (to within :data:`TOLERANCE` ms) has settled: the
simulator stops running its ranks and adds ``delta`` per remaining layer to each of their finish times (and
layer ``l``'s compute and waits per remaining layer to their totals). Nothing outside the component could
change that (it shares no port), and inside it every later layer starts ``delta`` after the one before, from
the same state. ``tests/sim/test_chained_layers.py`` checks the stop against simulating every layer, on every
strategy of the simulated benchmarks' configurations.

Example: TE CP's ring over all 8 GPUs of a node, one component; layers 0 and 1 differ (they start together,
then settle), layers 1, 2 and 3 are shifts of ``delta`` = one layer's time: the simulation stops after layer 3
and the step is the finish of layer 3 plus ``(layers - 4) * delta``. Four single GPUs with no transfer: four
components, each settled at layer 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .layer_ops import nic_ports

if TYPE_CHECKING:
    from ..planner.cost_model import CostModel
    from .layer_ops import LayerProgram

__all__ = ["components", "LayerLog", "TOLERANCE"]

TOLERANCE = 1e-9
"""Relative tolerance (of the event's time, at least 1 ms) within which two layers' events count as shifted
alike: sums of float times drift by about 1e-12 of the step."""


def components(program: "LayerProgram", cost: "CostModel") -> list[int]:
    """Per rank, the index of its component (ranks numbered by their lowest rank's order). Example: 4 ranks,
    one transfer 0 -> 1 over NVLink, nothing else: ``[0, 0, 1, 2]``; with hops 2 -> 5 and 3 -> 6 leaving a
    node through one shared NIC, ranks 2, 3, 5 and 6 are one component."""
    world = len(program.ops)
    parent = list(range(world))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    port_user: dict[tuple[str, int, int], int] = {}
    for t in program.transfers.values():
        for chain in t.chains:
            for hop in chain:
                union(hop.src, hop.dst)
                if hop.link != "nvl":
                    for port in nic_ports(cost, hop):
                        union(port_user.setdefault(port, hop.src), hop.src)
    roots: dict[int, int] = {}
    return [roots.setdefault(find(r), len(roots)) for r in range(world)]


class LayerLog:
    """Event times per component and layer (module docstring), and the test of a settled component.

    ``comp``: :func:`components`' list. Call :meth:`compute` at each compute start, :meth:`hop_start` /
    :meth:`hop_end` for each hop, :meth:`rank_done` when a rank finishes a layer; the latter returns ``delta``
    when that completes a layer of its component that settles it (else ``None``)."""

    def __init__(self, comp: list[int]) -> None:
        self.comp = comp
        self.members: list[list[int]] = [[] for _ in range(max(comp, default=-1) + 1)]  # component -> its ranks
        for r, c in enumerate(comp):
            self.members[c].append(r)
        self._starts: dict[tuple[int, int], list[float]] = {}        # (rank, layer) -> compute starts
        self._hops: dict[tuple[int, int], dict[tuple, list[float]]] = {}  # (comp, layer) -> hop -> [start, end]
        self._open: dict[tuple[int, int], int] = {}                  # (comp, layer) -> hops not ended
        self._done: dict[tuple[int, int], int] = {}                  # (comp, layer) -> ranks finished
        self._finish: dict[tuple[int, int], float] = {}              # (rank, layer) -> finish time

    def compute(self, rank: int, layer: int, now: float) -> None:
        self._starts.setdefault((rank, layer), []).append(now)

    def hop_start(self, rank: int, layer: int, hop: tuple, now: float) -> None:
        key = (self.comp[rank], layer)
        self._hops.setdefault(key, {})[hop] = [now, -1.0]
        self._open[key] = self._open.get(key, 0) + 1

    def hop_end(self, rank: int, layer: int, hop: tuple, now: float) -> None:
        key = (self.comp[rank], layer)
        self._hops[key][hop][1] = now
        self._open[key] -= 1

    def rank_done(self, rank: int, layer: int, now: float) -> float | None:
        """Record ``rank``'s finish of ``layer``. Returns the settled component's ``delta`` when this was the
        component's last rank to finish ``layer`` and layers ``layer - 2 .. layer`` are shifts of one another
        (module docstring)."""
        c = self.comp[rank]
        ranks = self.members[c]
        self._finish[(rank, layer)] = now
        self._done[(c, layer)] = self._done.get((c, layer), 0) + 1
        if self._done[(c, layer)] < len(ranks):
            return None
        self._forget(c, ranks, layer - 3)  # no later test compares it
        if layer < 2 or any(self._open.get((c, m), 0) for m in (layer - 2, layer - 1, layer)):
            return None  # too early, or a hop still in flight: not comparable yet
        delta = self._finish[(ranks[0], layer)] - self._finish[(ranks[0], layer - 1)]
        if all(self._shifted(c, ranks, m, delta) for m in (layer - 1, layer)):
            return delta
        return None

    def _shifted(self, c: int, ranks: list[int], m: int, delta: float) -> bool:
        """Every event of layer ``m`` is the same event of layer ``m - 1`` plus ``delta``."""
        def same(a: float, b: float) -> bool:
            return abs(b - a - delta) <= TOLERANCE * max(1.0, abs(b))

        for r in ranks:
            if not same(self._finish[(r, m - 1)], self._finish[(r, m)]):
                return False
            a, b = self._starts.get((r, m - 1), []), self._starts.get((r, m), [])
            if len(a) != len(b) or not all(map(same, a, b)):
                return False
        ha, hb = self._hops.get((c, m - 1), {}), self._hops.get((c, m), {})
        if ha.keys() != hb.keys():
            return False
        return all(same(ha[h][0], hb[h][0]) and same(ha[h][1], hb[h][1]) for h in hb)

    def _forget(self, c: int, ranks: list[int], layer: int) -> None:
        """Drop a layer no later test compares (memory stays a few layers per component)."""
        self._hops.pop((c, layer), None)
        self._open.pop((c, layer), None)
        self._done.pop((c, layer), None)
        for r in ranks:
            self._starts.pop((r, layer), None)
            self._finish.pop((r, layer), None)
