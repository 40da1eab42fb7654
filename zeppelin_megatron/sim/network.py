"""Fluid network model: flows share link bandwidth max-min fairly.

Resources are one-direction link ports with a capacity in bytes per
millisecond:

* ``("nvl_out", rank)`` / ``("nvl_in", rank)``: a GPU's NVLink egress/ingress;
* ``("nic_out", node, nic)`` / ``("nic_in", node, nic)``: a NIC's send/receive
  side (GPUs attached to one NIC by ``cluster.gpu_nic`` share it).

A flow crosses one or more resources and moves ``nbytes``. It first waits its
link latency (no bandwidth used), then transmits at its max-min fair rate,
recomputed whenever a flow starts or ends (progressive filling: the resource
with the smallest ``remaining capacity / unfrozen flows`` is saturated first,
its flows get that share, and so on). So ``k`` flows alone on one resource each
get ``1/k`` of it; a flow alone on its path takes
``latency + nbytes / bandwidth``, exactly :meth:`CostModel.link_ms`.

Rates are recomputed only for the flows connected (through shared resources)
to a flow that started or ended; each flow's bytes are brought up to date
only when its rate changes, and finish times sit in a heap.
"""

from __future__ import annotations

import heapq
import math
from typing import Hashable

__all__ = ["Flow", "FluidNetwork", "EPS_MS", "fair_rates"]

EPS_MS = 1e-9
"""Times closer than this (ms) are simultaneous."""


class Flow:
    """One transfer of ``nbytes`` over ``resources`` (mutable simulation state)."""

    __slots__ = ("nbytes", "resources", "latency_ms", "tag", "remaining", "rate", "since", "done_at",
                 "version", "_res")

    def __init__(self, nbytes: float, resources: tuple[Hashable, ...], latency_ms: float, tag: object = None) -> None:
        if not nbytes > 0:
            raise ValueError(f"a flow moves a positive number of bytes, got {nbytes}")
        self.nbytes = float(nbytes)
        self.resources = tuple(resources)
        self.latency_ms = float(latency_ms)
        self.tag = tag
        self.remaining = float(nbytes)
        self.rate = 0.0
        self.since = 0.0
        self.done_at = math.inf
        self.version = 0
        self._res: tuple[int, ...] = ()


class FluidNetwork:
    """Max-min fair fluid simulation of flows over capacitated resources.

    ``capacity[res]`` is in bytes per millisecond. Use: :meth:`start` flows,
    ask :meth:`next_event_time`, :meth:`advance` to it; it returns the flows
    that finished (in start order).
    """

    def __init__(self, capacity: dict[Hashable, float]) -> None:
        self._index: dict[Hashable, int] = {}
        self._cap: list[float] = []
        for res, cap in capacity.items():
            if not cap > 0:
                raise ValueError(f"resource {res!r} has capacity {cap}, expected > 0")
            self._index[res] = len(self._cap)
            self._cap.append(float(cap))
        self._users: list[set[Flow]] = [set() for _ in self._cap]
        self.now = 0.0
        self._pending: list[tuple[float, int, Flow]] = []   # in latency: (active_at, seq, flow)
        self._finish: list[tuple[float, int, int, Flow]] = []  # (finish time, version, seq, flow)
        self._order: dict[Flow, int] = {}
        self._seq = 0
        self._dirty: set[int] = set()
        self._done_seq: dict[Flow, int] = {}
        self._fair: dict[tuple[tuple[int, ...], ...], dict[tuple[int, ...], float]] = {}  # fair_rates, remembered

    # -- public ----------------------------------------------------------------
    def start(self, flow: Flow) -> None:
        try:
            flow._res = tuple(self._index[r] for r in flow.resources)
        except KeyError as exc:
            raise KeyError(f"flow uses unknown resource {exc.args[0]!r}") from None
        self._order[flow] = self._seq
        heapq.heappush(self._pending, (self.now + flow.latency_ms, self._seq, flow))
        self._seq += 1

    @property
    def busy(self) -> bool:
        return bool(self._pending or self._order)

    def next_event_time(self) -> float:
        """Earliest time a flow becomes active or finishes (``inf`` when idle)."""
        self._rates()
        t = self._pending[0][0] if self._pending else math.inf
        while self._finish and self._finish[0][1] != self._finish[0][3].version:
            heapq.heappop(self._finish)  # stale entry
        if self._finish:
            t = min(t, self._finish[0][0])
        return t

    def advance(self, t: float) -> list[Flow]:
        """Move time to ``t`` (not past :meth:`next_event_time`); return flows finished by then."""
        if t < self.now - EPS_MS:
            raise ValueError(f"cannot move time back from {self.now} to {t}")
        self._rates()
        self.now = max(self.now, t)
        finished: list[Flow] = []
        while self._finish and self._finish[0][0] <= t + EPS_MS:
            _, version, _, f = heapq.heappop(self._finish)
            if version != f.version:
                continue
            f.remaining = 0.0
            f.done_at = t
            f.rate = 0.0
            finished.append(f)
            for i in f._res:
                self._users[i].discard(f)
                self._dirty.add(i)
            self._done_seq[f] = self._order.pop(f)
        while self._pending and self._pending[0][0] <= t + EPS_MS:
            _, _, f = heapq.heappop(self._pending)
            f.since = t
            for i in f._res:
                self._users[i].add(f)
                self._dirty.add(i)
        finished.sort(key=self._seq_of)
        return finished

    def _seq_of(self, f: Flow) -> int:
        return self._done_seq.pop(f)

    # -- max-min fair rates ------------------------------------------------------
    def _rates(self) -> None:
        """Bring the flows connected to a changed resource up to date and give them their max-min fair rates
        (module docstring), each with its new finish time."""
        if not self._dirty:
            return
        # Flows connected to a changed resource.
        seen_res = set(self._dirty)
        stack = list(self._dirty)
        self._dirty.clear()
        flows: set[Flow] = set()
        while stack:
            i = stack.pop()
            for f in self._users[i]:
                if f not in flows:
                    flows.add(f)
                    for j in f._res:
                        if j not in seen_res:
                            seen_res.add(j)
                            stack.append(j)
        if not flows:
            return
        now = self.now
        for f in flows:
            f.remaining -= f.rate * (now - f.since)
            f.since = now
        paths = tuple(sorted(f._res for f in flows))
        rates = self._fair.get(paths)
        if rates is None:
            if len(self._fair) >= _FAIR_CACHE:
                self._fair.clear()
            rates = self._fair[paths] = fair_rates(paths, self._cap)
        order, finish = self._order, self._finish
        if len(finish) > 4 * len(order) + 64:  # mostly stale entries: keep the current ones (the same pops)
            finish[:] = [e for e in finish if e[1] == e[3].version]
            heapq.heapify(finish)
        for f in flows:  # any order: (finish time, version, start order) never ties for two flows
            f.rate = rate = rates[f._res]
            f.version += 1
            left = f.remaining
            heapq.heappush(finish, (now + (0.0 if 0.0 > left else left) / rate, f.version, order[f], f))


_FAIR_CACHE = 1 << 16
"""How many flow sets' rates one :class:`FluidNetwork` remembers (then it starts afresh): chained layers repeat
the same sets of concurrent flows, so most recomputations are found here."""


def fair_rates(paths: tuple[tuple[int, ...], ...], capacity: list[float]) -> dict[tuple[int, ...], float]:
    """Max-min fair rate per path of one flow each per entry of ``paths`` (resource indices into ``capacity``,
    bytes per ms; a path listed ``m`` times is ``m`` flows), by progressive filling: the resource with the smallest
    ``remaining capacity / unfrozen flows`` is saturated first, its flows frozen at that share, and so on. A
    function of the multiset ``paths`` alone (flows with one path get one rate), which is what lets
    :class:`FluidNetwork` remember it; the arithmetic is flow by flow, so a path's ``m`` flows subtract their
    share ``m`` times, as ``m`` separate flows would.

    Example: capacities ``[10.0, 4.0]``, paths ``((0,), (0,), (0, 1), (1,))``: resource 1's share is 2 (4 over
    two flows), resource 0's 10/3; resource 1 saturates first, freezing ``(0, 1)`` and ``(1,)`` at 2, then
    resource 0 gives its other two flows (10 - 2) / 2 = 4 each: ``{(0,): 4.0, (0, 1): 2.0, (1,): 2.0}``."""
    flows: dict[tuple[int, ...], int] = {}
    for p in paths:
        flows[p] = flows.get(p, 0) + 1
    count: dict[int, int] = {}
    users: dict[int, list[tuple[int, ...]]] = {}
    for p, m in flows.items():
        for i in p:
            count[i] = count.get(i, 0) + m
            users.setdefault(i, []).append(p)
    left = {i: capacity[i] for i in count}
    heap = [(left[i] / count[i], i) for i in count]
    heapq.heapify(heap)
    rate: dict[tuple[int, ...], float] = {}
    while heap:
        share, i = heapq.heappop(heap)
        if count[i] == 0:
            continue
        cur = left[i] / count[i]
        if abs(share - cur) > 1e-12 * max(1.0, cur):
            heapq.heappush(heap, (cur, i))
            continue
        for p in users[i]:
            if p in rate:
                continue
            rate[p] = share
            for _ in range(flows[p]):
                for j in p:
                    left[j] -= share
                    count[j] -= 1
                    if j != i and count[j] > 0:
                        heapq.heappush(heap, (max(left[j], 0.0) / count[j], j))
        count[i] = 0
    return rate
