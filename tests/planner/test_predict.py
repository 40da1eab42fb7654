"""predict(): the step rule with and without a remap (cost-model predictions)."""

from __future__ import annotations

import pytest

from zeppelin_megatron.planner import CostModel, StepPlan, load_cluster, load_model, plan_step
from zeppelin_megatron.planner import PlannerOptions
from zeppelin_megatron.planner.plan import SequencePlan
from zeppelin_megatron.planner.predict import attention_time, predict
from zeppelin_megatron.planner.workloads import long_tailed_batch


def _local_plan(lengths: list[int], ranks: list[int], world: int, *, remap_to: list[list[tuple[int, int, int]]] | None
                = None) -> StepPlan:
    att: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    for i, (s, r) in enumerate(zip(lengths, ranks)):
        att[r].append((i, 0, s))
    lin = att if remap_to is None else remap_to
    return StepPlan(nodes=1, gpus_per_node=world,
                    sequences=tuple(SequencePlan(s, "local", (r,)) for s, r in zip(lengths, ranks)),
                    attention_layout=tuple(tuple(x) for x in att), linear_layout=tuple(tuple(x) for x in lin))


def test_no_remap_step_is_the_slowest_rank_not_max_plus_max() -> None:
    # Rank 0: one 16k-token sequence (heavy attention, 16k linear tokens);
    # rank 1: 24 sequences of 1k (light attention, 24k linear tokens).
    cost = CostModel(model=load_model(None), cluster=load_cluster("1x2"))
    lengths = [16384] + [1024] * 24
    plan = _local_plan(lengths, [0] + [1] * 24, 2)
    pred = predict(plan, cost)
    layers = cost.model.layers
    attn = [cost.local_ms(16384), max(24 * cost.local_ms(1024), cost.call_overhead_ms)]
    lin = [cost.linear_ms(16384), cost.linear_ms(24 * 1024)]
    assert attn[0] > attn[1] and lin[1] > lin[0]
    expected = layers * max(attn[0] + lin[0], attn[1] + lin[1])
    assert pred.step_ms == pytest.approx(expected, abs=1e-5)
    assert pred.step_ms < layers * (max(attn) + max(lin)) - 1.0     # the old, pessimistic rule
    assert pred.step_ms == pytest.approx(max(pred.rank_ms), abs=1e-5)
    assert pred.remap_ms == 0.0


def test_remapped_plan_keeps_the_barrier_rule() -> None:
    # Same batch, linear layout balanced (one 1k sequence's tokens move): max attn + max linear + remap.
    cost = CostModel(model=load_model(None), cluster=load_cluster("1x2"))
    lengths = [16384] + [1024] * 24
    ranks = [0] + [1] * 24
    lin = [[(0, 0, 16384), (1, 0, 1024), (2, 0, 1024), (3, 0, 1024), (4, 0, 1024)],
           [(i, 0, 1024) for i in range(5, 25)]]
    plan = _local_plan(lengths, ranks, 2, remap_to=lin)
    assert plan.tokens(0) == plan.tokens(1) == 20480 and plan.linear_layout != plan.attention_layout
    pred = predict(plan, cost)
    att_ms = attention_time(pred)
    assert pred.remap_ms > 0
    assert pred.step_ms == pytest.approx(max(att_ms) + max(pred.linear_ms) + pred.remap_ms, abs=1e-4)


@pytest.mark.parametrize("seed", [3, 11])
def test_planner_predictions_follow_the_rule_of_their_layouts(seed: int) -> None:
    cost = CostModel(model=load_model(None), cluster=load_cluster("2x8"))
    lengths = long_tailed_batch(1 << 19, seed)
    on = plan_step(lengths, cost, PlannerOptions(remap=True)).predicted
    off = plan_step(lengths, cost, PlannerOptions(remap=False)).predicted
    assert on.step_ms == pytest.approx(max(attention_time(on)) + max(on.linear_ms) + on.remap_ms, abs=1e-4)
    assert off.step_ms == pytest.approx(max(a + l for a, l in zip(attention_time(off), off.linear_ms)), abs=1e-4)
    assert off.step_ms == pytest.approx(max(off.rank_ms), abs=1e-5)
