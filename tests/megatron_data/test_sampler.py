from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeppelin_megatron.megatron.data.indexed import DataError
from zeppelin_megatron.megatron.data.sampler import TokenBudgetSampler


def reference_cut(lengths: list[int], order: list[int], budget: int) -> list[tuple[int, ...]]:
    """Plain greedy cut of one epoch's order (the specification)."""
    steps: list[tuple[int, ...]] = []
    cur: list[int] = []
    tok = 0
    for i in order:
        if cur and tok + lengths[i] > budget:
            steps.append(tuple(cur))
            cur, tok = [], 0
        cur.append(i)
        tok += lengths[i]
    steps.append(tuple(cur))
    return steps


def test_worked_example_and_reference() -> None:
    lengths = [5, 3, 4, 2, 6]
    s = TokenBudgetSampler(lengths=lengths, budget=8, seed=0)
    expected: list[tuple[int, ...]] = []
    for e in range(4):
        order = np.random.default_rng([0, e]).permutation(5).tolist()
        assert s.order(e).tolist() == order
        expected += reference_cut(lengths, order, 8)
    assert [s.micro_step(k) for k in range(len(expected))] == expected


def test_epochs_cover_every_sequence_once_within_budget() -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 200, size=500)
    budget = 1000
    s = TokenBudgetSampler(lengths=lengths, budget=budget, seed=11)
    k = 0
    for epoch in range(3):
        seen: list[int] = []
        n_steps = s.steps_per_epoch(epoch)
        for j in range(n_steps):
            assert s.epoch_of(k) == (epoch, j)
            ids = s.micro_step(k)
            tok = int(lengths[list(ids)].sum())
            assert 0 < tok <= budget
            if j < n_steps - 1:  # greedy: the next sequence did not fit
                nxt = s.micro_step(k + 1)[0]
                assert tok + lengths[nxt] > budget
            seen += ids
            k += 1
        assert sorted(seen) == list(range(500))
        assert seen == s.order(epoch).tolist()
    assert s.order(0).tolist() != s.order(1).tolist()


def test_pure_in_k() -> None:
    lengths = np.random.default_rng(5).integers(1, 64, size=300)
    a = TokenBudgetSampler(lengths=lengths, budget=256, seed=7)
    forward = [a.micro_step(k) for k in range(200)]
    b = TokenBudgetSampler(lengths=lengths, budget=256, seed=7)
    for k in np.random.default_rng(0).permutation(200):
        assert b.micro_step(int(k)) == forward[k]
    c = TokenBudgetSampler(lengths=lengths.tolist(), budget=256, seed=7)
    assert c.micro_step(150) == forward[150]  # a jump ahead, no earlier call
    d = TokenBudgetSampler(lengths=lengths, budget=256, seed=8)
    assert [d.micro_step(k) for k in range(20)] != forward[:20]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=60),
    budget=st.integers(50, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_matches_reference_property(lengths: list[int], budget: int, seed: int) -> None:
    s = TokenBudgetSampler(lengths=lengths, budget=budget, seed=seed)
    expected = []
    for e in range(2):
        expected += reference_cut(lengths, np.random.default_rng([seed, e]).permutation(len(lengths)).tolist(), budget)
    assert [s.micro_step(k) for k in range(len(expected))] == expected
    assert s.steps_per_epoch(0) + s.steps_per_epoch(1) == len(expected)


def test_errors() -> None:
    with pytest.raises(DataError, match="sequence 2 has 9 tokens, more than the micro-step budget of 8"):
        TokenBudgetSampler(lengths=[1, 2, 9], budget=8, seed=0)
    with pytest.raises(DataError, match="sequence 1 has length 0"):
        TokenBudgetSampler(lengths=[1, 0], budget=8, seed=0)
    with pytest.raises(DataError, match="non-empty"):
        TokenBudgetSampler(lengths=[], budget=8, seed=0)
    with pytest.raises(DataError, match="integers"):
        TokenBudgetSampler(lengths=[1.5], budget=8, seed=0)
    with pytest.raises(DataError, match="budget must be a positive integer, got 0"):
        TokenBudgetSampler(lengths=[1], budget=0, seed=0)
    with pytest.raises(DataError, match="seed"):
        TokenBudgetSampler(lengths=[1], budget=4, seed=-1)
    s = TokenBudgetSampler(lengths=[1], budget=4, seed=0)
    with pytest.raises(DataError, match="micro-step index must be a non-negative integer, got -1"):
        s.micro_step(-1)
    assert s.micro_step(5) == (0,)  # one sequence: one micro-step per epoch
