"""``network.fair_rates`` (max-min fair rates of a multiset of paths) and the rates ``FluidNetwork`` remembers.

The reference below is the progressive filling flow by flow, as ``FluidNetwork`` computed it before it grouped
flows by path and remembered the results (2026-11-29): the rates must be the same to the last bit, so that every
simulated step stays what it was.
"""

from __future__ import annotations

import heapq
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeppelin_megatron.sim.network import Flow, FluidNetwork, fair_rates


def _reference(paths: list[tuple[int, ...]], capacity: list[float]) -> list[float]:
    """Progressive filling over individual flows (one per entry of ``paths``), in the given order: each flow's
    rate."""
    count = {i: 0 for p in paths for i in p}
    left = {i: capacity[i] for i in count}
    users: dict[int, list[int]] = {i: [] for i in count}
    for f, p in enumerate(paths):
        for i in p:
            count[i] += 1
            users[i].append(f)
    heap = [(left[i] / count[i], i) for i in count]
    heapq.heapify(heap)
    rate: dict[int, float] = {}
    while heap:
        share, i = heapq.heappop(heap)
        if count[i] == 0:
            continue
        cur = left[i] / count[i]
        if abs(share - cur) > 1e-12 * max(1.0, cur):
            heapq.heappush(heap, (cur, i))
            continue
        for f in users[i]:
            if f in rate:
                continue
            rate[f] = share
            for j in paths[f]:
                left[j] -= share
                count[j] -= 1
                if j != i and count[j] > 0:
                    heapq.heappush(heap, (max(left[j], 0.0) / count[j], j))
        count[i] = 0
    return [rate[f] for f in range(len(paths))]


def test_worked_example() -> None:
    # resource 1 (4 B/ms, two flows) saturates first at 2 each; resource 0 (10 B/ms) then gives its other two
    # flows (10 - 2) / 2 = 4 each
    assert fair_rates(((0,), (0,), (0, 1), (1,)), [10.0, 4.0]) == {(0,): 4.0, (0, 1): 2.0, (1,): 2.0}


def test_a_path_listed_m_times_is_m_flows() -> None:
    # three flows on one 9 B/ms port get 3 each; a fourth, alone on a 1 B/ms port it also crosses, takes 1 of
    # the 9 and leaves the three 8 / 3
    assert fair_rates(((0,), (0,), (0,)), [9.0]) == {(0,): 3.0}
    rates = fair_rates(((0,), (0,), (0,), (0, 1)), [9.0, 1.0])
    assert rates[(0, 1)] == 1.0 and rates[(0,)] == pytest.approx(8.0 / 3.0)


_PATHS = st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True).map(tuple),
                  min_size=1, max_size=40)
_CAPS = st.lists(st.sampled_from([1.0, 3.0, 7.5, 10.0, 25.0, 1e3 / 3.0, 450e6, 50e6]), min_size=8, max_size=8)


@settings(max_examples=400, deadline=None)
@given(paths=_PATHS, caps=_CAPS, seed=st.integers(0, 2**31))
def test_same_rates_as_flow_by_flow_filling(paths: list[tuple[int, ...]], caps: list[float], seed: int) -> None:
    """Grouping flows by path, in any order of the flows, gives each flow exactly the reference's rate."""
    random.Random(seed).shuffle(paths)
    ref = _reference(paths, caps)
    got = fair_rates(tuple(sorted(paths)), caps)
    assert [got[p] for p in paths] == ref
    for i in range(len(caps)):  # and the result is max-min fair: no port over its capacity
        assert sum(got[p] for p in paths if i in p) <= caps[i] * (1 + 1e-9)


class _Forgetful(dict):  # type: ignore[type-arg]
    """A memo that remembers nothing: every rate computed afresh."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


def _finish_times(net: FluidNetwork, starts: list[tuple[float, float, tuple[str, ...], float]]) -> list[float]:
    """Start each flow ``(at, nbytes, resources, latency)`` at its time and run the network dry: finish times in
    start order."""
    flows: list[Flow] = []
    pending = sorted(range(len(starts)), key=lambda k: starts[k][0])
    k = 0
    while True:
        while k < len(pending) and starts[pending[k]][0] <= net.now:
            at, nbytes, res, lat = starts[pending[k]]
            f = Flow(nbytes, res, lat, tag=pending[k])
            flows.append(f)
            net.start(f)
            k += 1
        t = net.next_event_time()
        nxt = starts[pending[k]][0] if k < len(pending) else math.inf
        if t == math.inf and nxt == math.inf:
            break
        net.advance(min(t, nxt))
    return [f.done_at for f in sorted(flows, key=lambda f: f.tag)]


def test_remembered_rates_give_the_same_finish_times() -> None:
    """Overlapping flows over a few shared ports, the same pattern repeated (as chained layers repeat it): finish
    times with the remembered rates equal those computed afresh at every event, to the last bit, and the
    repetitions find their rates remembered (the memo holds no more sets than after the first two)."""
    rng = random.Random(7)
    ports = {f"p{i}": c for i, c in enumerate([10.0, 4.0, 7.0, 10.0, 2.5, 30.0])}
    names = list(ports)
    pattern = [(rng.uniform(0.0, 5.0), rng.uniform(1.0, 60.0), tuple(rng.sample(names, rng.randint(1, 3))),
                rng.choice([0.0, 0.01])) for _ in range(12)]

    def repeated(times: int) -> list[tuple[float, float, tuple[str, ...], float]]:
        return [(at + 500.0 * rep, nbytes, res, lat) for rep in range(times) for at, nbytes, res, lat in pattern]

    remembered = FluidNetwork(ports)
    fresh = FluidNetwork(ports)
    fresh._fair = _Forgetful()
    got = _finish_times(remembered, repeated(30))
    assert got == _finish_times(fresh, repeated(30))
    assert all(math.isfinite(t) for t in got) and max(got) > 500.0 * 29
    two = FluidNetwork(ports)
    _finish_times(two, repeated(2))
    assert 0 < len(remembered._fair) == len(two._fair)
