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

__all__ = ["Flow", "FluidNetwork", "EPS_MS"]

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
        left = {i: self._cap[i] for i in seen_res}
        count = {i: 0 for i in seen_res}
        for f in flows:
            f.remaining -= f.rate * (now - f.since)
            f.since = now
            for i in f._res:
                count[i] += 1
        heap = [(left[i] / count[i], i) for i in seen_res if count[i]]
        heapq.heapify(heap)
        frozen: set[Flow] = set()
        new_rate: dict[Flow, float] = {}
        while heap:
            share, i = heapq.heappop(heap)
            if count[i] == 0:
                continue
            cur = left[i] / count[i]
            if abs(share - cur) > 1e-12 * max(1.0, cur):
                heapq.heappush(heap, (cur, i))
                continue
            for f in self._users[i]:
                if f in frozen:
                    continue
                frozen.add(f)
                new_rate[f] = share
                for j in f._res:
                    left[j] -= share
                    count[j] -= 1
                    if j != i and count[j] > 0:
                        heapq.heappush(heap, (max(left[j], 0.0) / count[j], j))
            count[i] = 0
        for f in sorted(new_rate, key=self._order.__getitem__):
            f.rate = new_rate[f]
            f.version += 1
            heapq.heappush(self._finish, (now + max(f.remaining, 0.0) / f.rate, f.version, self._order[f], f))
