"""Whole rounds over the least loaded bins only (``even_rounds(..., subset=True)``) are what the
one-by-one greedy does while the other bins stay above them (issue 14 follow-up)."""

from __future__ import annotations

import math
import random

from zeppelin_megatron.planner.even_rounds import MIN_ROUNDS, even_rounds

from .test_even_rounds import _greedy  # the one-by-one reference


def test_docstring_examples() -> None:
    assert even_rounds([0.0, 0.0, 9.5], [0] * 3, 1.0, 1, 30, token_limit=100, subset=True) == (
        [0, 1], 10, [10.0, 10.0, 9.5])
    assert even_rounds([5.0, 0.0, 0.2], [0] * 3, 1.0, 1, 30, token_limit=100, subset=True) == (
        [1, 2], 5, [5.0, 5.0, 5.2])
    # all bins within one cost of each other: the same as without subset
    assert even_rounds([0.0, 0.0], [0, 0], 1.0, 1, 20, token_limit=100, subset=True) == ([0, 1], 10, [10.0, 10.0])


def test_subset_rounds_match_the_greedy_on_random_cases() -> None:
    rng = random.Random(11)
    used = partial = 0
    for _ in range(4000):
        k = rng.choice((1, 2, 3, 4, 8, 16))
        cost = rng.choice((1.0, 0.1, 0.3, 3.7, 1e-9))
        base = rng.choice((0.0, 1.0, 1e6, 1e17))
        loads = [base + rng.choice((0.0, cost / 3, cost, 2 * cost, 7.5 * cost, 30 * cost, rng.random() * 50 * cost))
                 for _ in range(k)]
        size = rng.choice((1, 2, 5))
        tokens = [rng.randrange(0, 40) for _ in range(k)]
        token_limit = rng.choice((math.inf, 60, 100.5, 400))
        load_limit = rng.choice((math.inf, base + 10 * cost, base + 40.5 * cost))
        items = rng.randint(0, 400)
        order, rounds, after = even_rounds(loads, tokens, cost, size, items, token_limit=token_limit,
                                           load_limit=load_limit, subset=True)
        if not rounds:
            assert order == [] and after == loads
            continue
        used += 1
        partial += len(order) < k
        assert rounds >= MIN_ROUNDS and rounds * len(order) <= items and len(set(order)) == len(order)
        picks, ref_loads, _ = _greedy(loads, tokens, cost, size, rounds * len(order), token_limit, load_limit)
        assert picks == order * rounds  # every one of these picks passed the limits, in this order
        assert after == ref_loads  # bit for bit
        if len(order) == k:  # every bin: what the plain rounds give
            assert even_rounds(loads, tokens, cost, size, items, token_limit=token_limit,
                               load_limit=load_limit) == (order, rounds, after)
    assert used > 400 and partial > 150  # the mix exercises rounds over some bins and over all
