"""Shortcuts of the partitioner's local search (issue 14 item 4) give what the plain loops give."""

from __future__ import annotations

import random

import pytest

from zeppelin_megatron.planner import PlannerOptions
from zeppelin_megatron.planner import node_balance
from zeppelin_megatron.planner.node_balance import NodeState, _round_view, rebalance_nodes
from zeppelin_megatron.planner.partition import PartitionContext, placement_order, placement_runs, run_ends
from zeppelin_megatron.planner.workloads import long_tailed_batch

from .conftest import make_cost


def test_round_view_light_work_as_summed_one_by_one() -> None:
    cost = make_cost("4x8")
    rng = random.Random(3)
    lengths = long_tailed_batch(1 << 20, 4)
    ctx = PartitionContext(lengths, cost, PlannerOptions())
    for _ in range(20):
        ids = list(range(len(lengths)))
        rng.shuffle(ids)
        seqs = [sorted(ids[k::4]) for k in range(4)]
        if rng.random() < 0.5:
            seqs[rng.randrange(4)] = []
        st = NodeState(seqs=seqs, inter={}, load=[rng.random() for _ in range(4)], tokens=[0] * 4,
                       cost={i: ctx.w[i] for i in ids})
        view = _round_view(ctx, st, list(range(len(lengths))), None)
        for n in range(4):
            times = [ctx.w[b] for b in seqs[n]]
            assert view.fill[n] == sum(x for x in times if x <= ctx.limit)  # bit for bit
            assert view.heavy[n] == any(x > ctx.limit for x in times)
    assert any(ctx.w[i] > ctx.limit for i in range(len(lengths)))  # heavy sequences exercised


def test_rebalance_stops_at_once_when_loads_are_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = PartitionContext([5] * 8, make_cost("2x2"), PlannerOptions())
    st = NodeState(seqs=[[0, 1, 2, 3], [4, 5, 6, 7]], inter={}, load=[2.0, 2.0], tokens=[20, 20],
                   cost={i: 0.5 for i in range(8)})
    monkeypatch.setattr(node_balance, "_round_view", lambda *a: pytest.fail("no view needed"))
    assert rebalance_nodes(ctx, st, list(range(8))) is False


def test_placement_runs_and_run_ends() -> None:
    w = [float(s % 7) for s in range(40)]
    rng = random.Random(0)
    for distinct in (1, 3, 8, 9, 30):
        lengths = [rng.randrange(distinct) + 1 for _ in range(200)]
        ww = [w[s] for s in lengths]
        order, ends = placement_runs(lengths, ww)
        assert order == placement_order(lengths, ww) == sorted(range(200), key=lambda i: (-ww[i], -lengths[i], i))
        assert ends == run_ends(order, lengths)
        assert ends[-1] == 200 and len(ends) == len(set(lengths))
