"""Whole rounds of equal items (even_rounds.py) are exactly what the one-by-one greedy does."""

from __future__ import annotations

import heapq
import math
import random

import pytest

from zeppelin_megatron.planner import PlannerOptions
from zeppelin_megatron.planner import partition as partition_mod
from zeppelin_megatron.planner import place_gpus as place_gpus_mod
from zeppelin_megatron.planner.even_rounds import MIN_ROUNDS, even_rounds
from zeppelin_megatron.planner.partition import partition
from zeppelin_megatron.planner.workloads import long_tailed_batch

from .conftest import make_cost


def _greedy(loads: list[float], tokens: list[int], cost: float, size: int, items: int, token_limit: float,
            load_limit: float) -> tuple[list[int], list[float], bool]:
    """One by one as the partitioner does (heap of (load, bin)); stops at the first pick over a limit."""
    loads, tokens = list(loads), list(tokens)
    heap = [(x, b) for b, x in enumerate(loads)]
    heapq.heapify(heap)
    picks: list[int] = []
    for _ in range(items):
        while heap[0][0] != loads[heap[0][1]]:
            heapq.heappop(heap)
        b = heap[0][1]
        if tokens[b] + size > token_limit or loads[b] + cost > load_limit:
            return picks, loads, False
        loads[b] += cost
        tokens[b] += size
        heapq.heapreplace(heap, (loads[b], b))
        picks.append(b)
    return picks, loads, True


def test_docstring_examples() -> None:
    assert even_rounds([0.0, 0.0], [0, 0], 1.0, 1, 7, token_limit=100) == ([], 0, [0.0, 0.0])
    assert even_rounds([0.0, 0.0], [0, 0], 1.0, 1, 20, token_limit=100) == ([0, 1], 10, [10.0, 10.0])


def _case(rng: random.Random) -> tuple[list[float], list[int], float, int, int, float, float]:
    k = rng.choice((1, 2, 3, 4, 8))
    cost = rng.choice((1.0, 0.1, 0.3, 1e-9, 3.7, 1e-300))
    base = rng.choice((0.0, 1.0, 1e6, 1e15, 1e17))
    loads = [base + rng.choice((0.0, 0.0, cost, cost / 3, 2 * cost, rng.random() * cost)) for _ in range(k)]
    size = rng.choice((1, 2, 5))
    tokens = [rng.randrange(0, 40) for _ in range(k)]
    token_limit = rng.choice((math.inf, 60, 100.5, 400))
    load_limit = rng.choice((math.inf, base + 10 * cost, base + 40.5 * cost))
    return loads, tokens, cost, size, rng.randint(0, 200), token_limit, load_limit


def test_rounds_match_the_greedy_on_random_cases() -> None:
    rng = random.Random(5)
    used = 0
    for _ in range(3000):
        loads, tokens, cost, size, items, token_limit, load_limit = _case(rng)
        order, rounds, after = even_rounds(loads, tokens, cost, size, items, token_limit=token_limit,
                                           load_limit=load_limit)
        if not rounds:
            assert order == [] and after == loads
            continue
        used += 1
        assert rounds >= MIN_ROUNDS and rounds * len(loads) <= items
        picks, ref_loads, _ = _greedy(loads, tokens, cost, size, rounds * len(loads), token_limit, load_limit)
        assert picks == order * rounds  # every one of these picks passed the limits, in this order
        assert after == ref_loads  # bit for bit
    assert used > 300  # the case mix exercises the rounds


def test_no_rounds_where_adding_the_cost_changes_nothing() -> None:
    # 1e17 + 1.0 == 1e17: the greedy keeps picking bin 0, never round robin.
    assert even_rounds([1e17, 1e17], [0, 0], 1.0, 1, 100, token_limit=math.inf)[1] == 0
    assert _greedy([1e17, 1e17], [0, 0], 1.0, 1, 5, math.inf, math.inf)[0] == [0] * 5


def _one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    none = lambda loads, *a, **k: ([], 0, list(loads))  # noqa: E731
    monkeypatch.setattr(partition_mod, "even_rounds", none)
    monkeypatch.setattr(place_gpus_mod, "even_rounds", none)


@pytest.mark.parametrize("spec, cap, lengths", [
    ("4x8", None, [1] * 50_000),
    ("4x8", None, [9] * 4000 + [1] * 20_000),
    ("4x8", None, [64] * 20_000 + [1] * 20_000),
    ("4x8", None, long_tailed_batch(1 << 19, 2) + [64] * 8000),  # uneven loads before the run
    ("2x4", 2000, [1] * 7000 + [5] * 300),  # tight: token limits stop the rounds
    ("2x2", None, [200_000] + [2] * 10_000),  # a node-spanning ring, then many short ones
    ("1x8", None, [1] * 999),
])
def test_partition_same_as_one_by_one(monkeypatch: pytest.MonkeyPatch, spec: str, cap: int | None,
                                      lengths: list[int]) -> None:
    cost = make_cost(spec, tokens_per_gpu=cap)
    used: list[int] = []

    def counting(*args, **kw):  # type: ignore[no-untyped-def]
        got = even_rounds(*args, **kw)
        used.append(got[1])
        return got

    with monkeypatch.context() as m:
        m.setattr(partition_mod, "even_rounds", counting)
        m.setattr(place_gpus_mod, "even_rounds", counting)
        fast = partition(lengths, cost, PlannerOptions())
    assert any(used)  # whole rounds were placed
    with monkeypatch.context() as m:
        _one_by_one(m)
        slow = partition(lengths, make_cost(spec, tokens_per_gpu=cap), PlannerOptions())
    assert fast == slow
