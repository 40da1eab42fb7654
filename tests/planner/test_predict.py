"""predict(): the step rule with and without a remap (cost-model predictions)."""

from __future__ import annotations

import pytest

from zeppelin_megatron.planner import CostModel, StepPlan, load_cluster, load_model, plan_step
from zeppelin_megatron.planner import PlannerOptions
from zeppelin_megatron.planner.plan import Prediction, SequencePlan
from zeppelin_megatron.planner.predict import attention_time, predict
from zeppelin_megatron.planner.remap_cost import remap_couples, remap_ranks
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


def _pair_rule(plan: StepPlan, pred: Prediction) -> float:
    """``max over coupled pairs and each path rank with itself of (linear_s + attn_r) + remap`` (uncharged:
    no copies), written out from the plan's moved rows (the module docstring's rule)."""
    att, lin = attention_time(pred), pred.linear_ms
    pairs = set(remap_couples(plan, plan.remap_proxies))
    on = remap_ranks(plan, plan.remap_proxies)
    worst = max([lin[s] + att[r] for s, r in pairs] + [lin[r] + att[r] for r in on])
    rest = max((lin[r] + att[r] for r in range(plan.world_size) if r not in on), default=0.0)
    return max(worst + pred.remap_ms, rest)


def test_remapped_plan_keeps_the_barrier_rule() -> None:
    # Same batch, linear layout balanced (one 1k sequence's tokens move): max attn + max linear + remap, which
    # the pair rule gives here (the busiest attention rank, 0, holds as many linear tokens as the other).
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
    assert pred.step_ms == pytest.approx(_pair_rule(plan, pred), abs=1e-4)


def test_remap_waits_pair_by_pair_not_as_a_barrier() -> None:
    """Rank 0 holds the heavy attention and sends one short sequence to rank 3; rank 1 holds the heavy linear
    work and sends its sequences to rank 2. No rank waits for both: the layer is the slowest coupled pair
    (rank 0 with itself), well under max attention + max linear (a barrier would add rank 0's attention to
    rank 1's linear modules)."""
    cost = CostModel(model=load_model(None), cluster=load_cluster("1x4"))
    lengths = [16384, 64] + [1024] * 20
    ranks = [0, 3] + [2] * 20
    lin = [[(0, 0, 16384), (1, 0, 64)], [(i, 0, 1024) for i in range(2, 22)], [], []]
    plan = _local_plan(lengths, ranks, 4, remap_to=lin)
    pred = predict(plan, cost)
    att, lin_ms = attention_time(pred), pred.linear_ms
    assert remap_couples(plan, ()) == {(0, 3), (1, 2)} and remap_ranks(plan, ()) == {0, 1, 2, 3}
    assert pred.step_ms == pytest.approx(_pair_rule(plan, pred), abs=1e-4)
    assert pred.step_ms == pytest.approx(max(lin_ms[0] + att[0], lin_ms[1] + att[2]) + pred.remap_ms, abs=1e-4)
    assert pred.step_ms < max(att) + max(lin_ms) + pred.remap_ms - 0.1 * pred.step_ms  # the barrier: 10% more


def test_remap_couples_follow_the_rows_paths() -> None:
    """Direct cross-node rows relay through rail GPUs, routed ones through the proxies: both ends count."""
    att = ((), (), (), ((0, 0, 8),))
    lin = (((0, 0, 8),), (), (), ())
    plan = StepPlan(nodes=2, gpus_per_node=2, sequences=(SequencePlan(8, "local", (3,)),),
                    attention_layout=att, linear_layout=lin)
    direct = {(x, y) for x in (0, 1, 2) for y in (3, 1, 2)}  # in: 0's rail at node 1 is 2; out: 3's at node 0 is 1
    assert remap_couples(plan, ()) == direct
    assert remap_couples(plan, (1,)) == {(x, y) for x in (0, 1, 3) for y in (3, 1)}  # proxy 1: relays 1 and 3


@pytest.mark.parametrize("seed", [3, 11])
def test_planner_predictions_follow_the_rule_of_their_layouts(seed: int) -> None:
    cost = CostModel(model=load_model(None), cluster=load_cluster("2x8"))
    lengths = long_tailed_batch(1 << 19, seed)
    on = plan_step(lengths, cost, PlannerOptions(remap=True)).predicted
    off = plan_step(lengths, cost, PlannerOptions(remap=False)).predicted
    plan_on = plan_step(lengths, cost, PlannerOptions(remap=True))
    assert on.step_ms == pytest.approx(_pair_rule(plan_on, on), abs=1e-4)
    assert on.step_ms <= max(attention_time(on)) + max(on.linear_ms) + on.remap_ms + 1e-4  # never above a barrier
    assert off.step_ms == pytest.approx(max(a + l for a, l in zip(attention_time(off), off.linear_ms)), abs=1e-4)
    assert off.step_ms == pytest.approx(max(off.rank_ms), abs=1e-5)
