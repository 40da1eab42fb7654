"""balanced_layout.py: ring groups, stay quotas, quota layouts, the stay choice; predict's pairwise remap."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from zeppelin_megatron.planner import PlannerOptions, plan_step
from zeppelin_megatron.planner.balanced_layout import choose_stays, quota_layout, ring_groups, stay_quotas
from zeppelin_megatron.planner.linear_layout import balanced_quotas, linear_layout
from zeppelin_megatron.planner.plan import StepPlan
from zeppelin_megatron.planner.predict import attention_time, predict
from zeppelin_megatron.planner.workloads import long_tailed_batch

from .conftest import make_cost
from .test_remap_choice import WORKLOAD, hand_plan


def test_ring_groups_join_rings_sharing_ranks() -> None:
    base, _ = hand_plan("1x4", [(64, "intra_node", [0, 1]), (64, "intra_node", [1, 2]), (8, "local", [3])])
    assert ring_groups(base) == [(0, 1, 2), (3,)]
    base, _ = hand_plan(*WORKLOAD)
    assert ring_groups(base) == [(0, 1), (2,), (3,)]


def test_stay_quotas_examples() -> None:
    assert stay_quotas([2, 2, 9, 7], {0, 1}) == [2, 2, 8, 8]
    assert stay_quotas([2, 2, 9, 7], {0}) == [2, 6, 6, 6]
    assert stay_quotas([2, 2, 9, 8], {0}) == [2, 6, 7, 6]  # 19 over 3: the extra token to the fullest
    assert stay_quotas([5, 1], {0, 1}) == [5, 1]


def test_quota_layout_docstring_example_and_errors() -> None:
    att = ([(0, 0, 4)], [(1, 0, 1)], [(2, 0, 1)])
    assert quota_layout(att, [2, 2, 2], 3) == (((0, 0, 2),), ((1, 0, 1), (0, 2, 3)), ((2, 0, 1), (0, 3, 4)))
    with pytest.raises(ValueError, match="sum to the attention layout's 6 tokens"):
        quota_layout(att, [2, 2, 3], 3)
    with pytest.raises(ValueError, match="must be >= 0"):
        quota_layout(att, [7, -1, 0], 3)


@pytest.mark.parametrize("spec,tokens,seed", [("2x8", 1 << 19, 0), ("4x8", 1 << 20, 3), ("3x5", 300_000, 1)])
def test_quota_layout_with_balanced_quotas_is_the_linear_layout(spec: str, tokens: int, seed: int) -> None:
    cost = make_cost(spec)
    plan = plan_step(long_tailed_batch(tokens, seed), cost, PlannerOptions(remap=False))
    held = [plan.tokens(r, "attention") for r in range(plan.world_size)]
    assert quota_layout(plan.attention_layout, balanced_quotas(held), plan.gpus_per_node) == \
        linear_layout(plan.attention_layout, cost.cluster)


@pytest.mark.parametrize("seed", range(6))
def test_quota_layouts_are_valid_and_keep_stayers_in_place(seed: int) -> None:
    cost = make_cost("4x8")
    plan = plan_step(long_tailed_batch(1 << 20, seed), cost, PlannerOptions(remap=False))
    held = [plan.tokens(r, "attention") for r in range(32)]
    stays = set(random.Random(seed).sample(range(32), 10))
    quotas = stay_quotas(held, stays)
    lay = quota_layout(plan.attention_layout, quotas, 8)
    checked = StepPlan(nodes=4, gpus_per_node=8, sequences=plan.sequences, attention_layout=plan.attention_layout,
                       linear_layout=lay)  # full validation: every token once, within tokens_per_gpu
    assert [checked.tokens(r, "linear") for r in range(32)] == quotas
    assert all(lay[r] == plan.attention_layout[r] for r in stays)
    intra, out, into = checked.remap_traffic
    assert all(intra[r] == out[r] == into[r] == 0 for r in stays)  # stayers move no row


def test_choose_stays_on_the_hand_made_ring() -> None:
    base, cost = hand_plan(*WORKLOAD)
    pred = predict(base, cost)
    att = attention_time(pred)
    assert att[0] == att[1] > max(att[2], att[3])
    choice = choose_stays(base, att, cost, pred.remap_ms)
    assert choice is not None and choice.stays == (0, 1)
    assert choice.quotas == (16384, 16384, 24576, 24576)
    layers = cost.model.layers
    assert choice.bound_ms == pytest.approx(max(a + layers * cost.linear_ms(q) for a, q in zip(att, choice.quotas)))
    assert choose_stays(hand_plan("1x2", [(64, "intra_node", [0, 1])])[0], [1.0, 1.0], cost, 0.0) is None


def test_predict_rank_moving_no_row_waits_for_nobody() -> None:
    """The remap's waits are pairwise: a rank with no row to move is timed attention + linear alone;
    the ranks that exchange rows end together (max attention + max linear + remap)."""
    base, cost = hand_plan(*WORKLOAD)
    lay = quota_layout(base.attention_layout, [16384, 16384, 24576, 24576], 4)
    plan = replace(base, linear_layout=lay)
    p = predict(plan, cost)
    att, lin = attention_time(p), p.linear_ms
    movers = max(att[2], att[3]) + max(lin[2], lin[3]) + p.remap_ms
    stayers = max(att[0] + lin[0], att[1] + lin[1])
    assert p.step_ms == pytest.approx(max(movers, stayers), abs=1e-5)
    assert p.rank_ms[0] == pytest.approx(att[0] + lin[0], abs=1e-5)  # no remap on a stayer
    assert p.rank_ms[2] == pytest.approx(att[2] + lin[2] + p.remap_ms, abs=1e-5)
    tb = predict(base, cost)  # every rank moves rows: the old barrier rule
    assert tb.step_ms == pytest.approx(max(attention_time(tb)) + max(tb.linear_ms) + tb.remap_ms, abs=1e-5)
