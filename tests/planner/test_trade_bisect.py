"""Swaps found by bisection in the whole-document trades (whole_moves._swaps) and the cost model's monotonicity check
that allows it (CostModel.times_increase): the same trades as trying every swap."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from zeppelin_megatron.planner import CostModel, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.cost_model import LogInterp
from zeppelin_megatron.planner.partition_context import Assignment
from zeppelin_megatron.planner.plan_json import plan_to_json
from zeppelin_megatron.planner.whole_moves import _swaps, trade_whole
from zeppelin_megatron.sim.lengths import get_distribution


def test_swaps_docstring_example() -> None:
    theirs = [(-1, 0), (7, 100), (3, 200), (9, 300), (1, 400)]
    assert _swaps(350, 200, theirs, lambda u: u >= 300) == [(3, 200), (9, 300)]  # 350 alone does not fit room
    # the crossing before every candidate: only the first; past all: only the last; room for s: the move too
    assert _swaps(350, 200, theirs, lambda u: True) == [(3, 200)]
    assert _swaps(350, 100, theirs, lambda u: False) == [(9, 300)]
    assert _swaps(350, 400, theirs, lambda u: u >= 200) == [(-1, 0), (7, 100), (3, 200)]
    assert _swaps(50, 1000, theirs, lambda u: True) == [(-1, 0)]  # nothing shorter than s to take back


def test_bundled_profile_allows_bisection() -> None:
    for model in ("configs/models/llama_3b.yaml", "configs/models/llama3_8b.yaml", "configs/models/tiny.yaml"):
        assert CostModel(model=load_model(model), cluster=load_cluster("2x8")).times_increase()


def test_a_steep_causal_rate_forbids_it() -> None:
    """A causal rate that triples from 1024 to 2048 tokens: ``2 min = 2`` is below ``(3 - 1) / ln 2 = 2.89``, so local
    time may fall on that segment and the trades try every swap; a per-token linear time that falls by 80% over a
    doubling lets the linear time fall (``0.2 + (0.2 - 1) / ln 2 < 0``)."""
    cost = CostModel(model=load_model(None), cluster=load_cluster("1x2"))
    object.__setattr__(cost, "_rate_causal", LogInterp([1024, 2048], [1.0, 3.0], below="linear"))
    assert not cost.times_increase()
    cost = CostModel(model=load_model(None), cluster=load_cluster("1x2"))
    object.__setattr__(cost, "_lin_ms_per_token", LogInterp([1024, 2048], [1.0, 0.2]))
    assert not cost.times_increase()
    assert LogInterp([1, 2], [4.0, 2.0]).segments() == [(2.0, pytest.approx(-2 / np.log(2)))]


def _cost(world: int, cap: int, bisect: bool) -> SimpleNamespace:
    return SimpleNamespace(cluster=SimpleNamespace(world_size=world, tokens_per_gpu=cap), call_overhead_ms=0.05,
                           model=SimpleNamespace(layers=3), local_ms=lambda s: 1e-4 * s + 2e-8 * s * s,
                           linear_ms=lambda t: 3e-4 * t, times_increase=lambda: bisect)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**9), world=st.integers(2, 12), n=st.integers(2, 80))
def test_bisection_trades_as_every_swap(seed: int, world: int, n: int) -> None:
    """Random whole documents (many distinct lengths, some repeated), ring work on some ranks (``tot``, ``own``), row
    copies on some (``pays``) and capacities from roomy to tight: trade_whole makes the same trades, to the same
    step, with swaps found by bisection as with every swap tried."""
    rnd = random.Random(seed)
    lengths = [rnd.choice([rnd.randint(1, 9000), rnd.randint(1, 300), 4096]) for _ in range(n)]
    placed = [Assignment("local", (rnd.randrange(world),)) for _ in range(n)]
    tokens = [0] * world
    for s, a in zip(lengths, placed):
        tokens[a.ranks[0]] += s
    cap = max(tokens) + rnd.choice([0, 50, 2000, 10**6])
    tot = [rnd.choice([0.0, 0.0, rnd.uniform(0, 5)]) for _ in range(world)]
    own = [t * rnd.uniform(0.2, 1.0) for t in tot]
    pays = [rnd.choice([0.0, 1e-5]) for _ in range(world)]
    runs = []
    for bisect in (True, False):
        held = list(tokens)
        moved = trade_whole(lengths, placed, list(tot), list(own), pays, held, _cost(world, cap, bisect))  # type: ignore[arg-type]
        runs.append((moved, held))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("dist,spec,tokens", [("github-64k", "2x8", 1 << 19), ("arxiv-64k", "4x8", 1 << 20)])
def test_plans_as_with_every_swap(dist: str, spec: str, tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many-document batches through plan_step: the same plan with every swap tried."""
    lengths = [min(d, 65536) for d in get_distribution(dist).documents(np.random.default_rng(3), tokens)]
    cluster, model = load_cluster(spec), load_model(None)
    fast = plan_to_json(plan_step(lengths, CostModel(model=model, cluster=cluster)))
    monkeypatch.setattr(CostModel, "times_increase", lambda self: False)
    assert plan_to_json(plan_step(lengths, CostModel(model=model, cluster=cluster))) == fast
