"""Pieces of the large-batch speed-ups that must not change results (issue 14 item 4)."""

from __future__ import annotations

import gc
import json

import pytest

from zeppelin_megatron.planner import CostModel, PlannerOptions, StepPlan, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.gc_pause import gc_paused
from zeppelin_megatron.planner.linear_layout import _take
from zeppelin_megatron.planner.workloads import long_tailed_batch


def test_gc_paused_restores_the_collector() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # left as it was
    finally:
        gc.enable()


@pytest.mark.parametrize(("spec", "tokens", "seed", "remap"), [
    ("1x1", 7, 0, True), ("2x4", 300_000, 1, True), ("4x8", 1 << 20, 3, "auto"), ("2x8", 1 << 19, 3, False),
])
def test_to_json_is_json_dumps_byte_for_byte(spec: str, tokens: int, seed: int, remap: object) -> None:
    cost = CostModel(model=load_model(None), cluster=load_cluster(spec))
    plan = plan_step(long_tailed_batch(tokens, seed), cost, PlannerOptions(remap=remap))  # type: ignore[arg-type]
    text = plan.to_json()
    assert text == json.dumps(plan.to_dict(), separators=(",", ":"))
    assert StepPlan.from_json(text).to_json() == text
    assert json.loads(plan.to_json(indent=1)) == plan.to_dict()


def test_take_splits_after_count() -> None:
    ranges = [(0, 0, 4), (1, 0, 3), (2, 5, 6)]
    assert _take(list(ranges), 0) == ([], ranges)
    assert _take(list(ranges), 4) == ([(0, 0, 4)], [(1, 0, 3), (2, 5, 6)])
    assert _take(list(ranges), 5) == ([(0, 0, 4), (1, 0, 1)], [(1, 1, 3), (2, 5, 6)])
    assert _take(list(ranges), 8) == (ranges, [])


def test_many_equal_sequences_plan_evenly() -> None:
    # 20k length-1 sequences on 4x8: every GPU gets T/P tokens (the heap and fast paths of level 1 and 2).
    cost = CostModel(model=load_model(None), cluster=load_cluster("4x8"))
    plan = plan_step([1] * 20_000, cost)
    held = [plan.tokens(r, "attention") for r in range(32)]
    assert sum(held) == 20_000 and max(held) - min(held) <= 1


def test_place_gpus_counts_rank_tokens() -> None:
    from zeppelin_megatron.planner.partition import PartitionContext, _assign_nodes
    from zeppelin_megatron.planner.place_gpus import place_gpus
    from zeppelin_megatron.planner.score import rank_tokens

    for spec, seed in (("2x4", 0), ("4x8", 1)):
        cost = CostModel(model=load_model(None), cluster=load_cluster(spec))
        lengths = long_tailed_batch(cost.cluster.world_size * 30_000, seed)
        ctx = PartitionContext(lengths, cost, PlannerOptions())
        order = sorted(range(len(lengths)), key=lambda i: (-ctx.w[i], -lengths[i], i))
        rank_in_order = [0] * len(lengths)
        for k, i in enumerate(order):
            rank_in_order[i] = k
        st = _assign_nodes(ctx, order, ctx.limit, rank_in_order)
        assignments, tokens = place_gpus(ctx, st)
        assert tokens == rank_tokens(ctx, assignments)
        assert any(a.placement != "local" for a in assignments)


def test_placement_order_is_the_sort_by_cost() -> None:
    import random

    from zeppelin_megatron.planner.partition import placement_order

    cost = CostModel(model=load_model(None), cluster=load_cluster("2x4"))
    rng = random.Random(0)
    lengths = [rng.choice([1, 7, 300, 4096, 5000, 70_000]) for _ in range(500)] + long_tailed_batch(200_000, 2)
    w = [cost.local_ms(s) for s in lengths]
    assert placement_order(lengths, w) == sorted(range(len(lengths)), key=lambda i: (-w[i], -lengths[i], i))
    assert placement_order([5, 9, 5], [1.0, 2.0, 1.0]) == [1, 0, 2]


@pytest.mark.parametrize(("att", "message"), [
    ((((0, 0, 4),), ((0, 0, 4), (1, 0, 2))), r"tokens \[0, 4\) of sequence 0 appear twice"),  # whole twice
    ((((0, 0, 4),), ()), r"tokens \[0, 2\) of sequence 1 are missing"),  # a sequence nowhere
    ((((0, 0, 4), (1, 0, 1)), ((1, 0, 2),)), r"tokens \[0, 1\) of sequence 1 appear twice"),  # overlap
    ((((0, 0, 3),), ((1, 0, 2),)), r"tokens \[3, 4\) of sequence 0 are missing"),  # a tail missing
    ((((0, 0, 4),), ((1, 0, 2), (2, 0, 1))), r"sequence index 2 is outside \[0, 2\)"),
    ((((0, 0, 5),), ((1, 0, 2),)), r"range \[0, 5\) of sequence 0 is empty or outside \[0, 4\)"),
])
def test_layout_cover_errors(att: tuple, message: str) -> None:
    from zeppelin_megatron.planner import PlanError, SequencePlan

    seqs = (SequencePlan(4, "local", (0,)), SequencePlan(2, "local", (1,)))
    with pytest.raises(PlanError, match=message):
        StepPlan(nodes=1, gpus_per_node=2, sequences=seqs, attention_layout=att, linear_layout=att)
