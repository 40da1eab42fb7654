"""Hand-written zeppelin-plan/1 documents: accepted when valid, clear errors otherwise."""

from __future__ import annotations

import copy
import json

import pytest

from zeppelin_megatron.planner import PlanError, StepPlan

from .conftest import make_cost

# 1 node x 2 GPUs: sequence 0 (10 tokens) zigzag-split over ranks [0, 1]; sequence 1 local on rank 1.
DOC = {
    "schema": "zeppelin-plan/1", "nodes": 1, "gpus_per_node": 2,
    "sequences": [{"length": 10, "placement": "intra_node", "ranks": [0, 1]},
                  {"length": 4, "placement": "local", "ranks": [1]}],
    "attention_layout": [[[0, 0, 3], [0, 8, 10]], [[0, 3, 8], [1, 0, 4]]],
    "linear_layout": [[[0, 0, 7]], [[0, 7, 10], [1, 0, 4]]],
    "predicted": {"step_ms": 1.0, "rank_ms": [1.0, 1.0]},
}


def test_hand_written_plan_accepted() -> None:
    plan = StepPlan.from_json(json.dumps(DOC))
    assert [r.ranks for r in plan.rings] == [(0, 1)]
    # lin 0 = seq0 [0,7): [0,3) stays, [3,7) to rank 1; lin 1: [7,8) stays, [8,10) to rank 0, seq 1 stays.
    assert plan.remap.counts("to_attention").tolist() == [[3, 4], [2, 5]]
    assert StepPlan.from_json(plan.to_json()) == plan


def test_planner_round_trip_and_routing_derivation() -> None:
    cost = make_cost("2x8", tokens_per_gpu=40_000)
    from zeppelin_megatron.planner import plan_step

    plan = plan_step([300_000, 500, 700, 9000], cost)
    assert StepPlan.from_json(plan.to_json()) == plan
    doc = json.loads(plan.to_json())
    del doc["routing"]
    assert StepPlan.from_json(doc).routing == ()
    assert StepPlan.from_json(doc, cost_model=cost).routing == plan.routing


def _bad(mutate) -> dict:  # type: ignore[no-untyped-def,type-arg]
    doc = copy.deepcopy(DOC)
    mutate(doc)
    return doc


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(schema="zeppelin-plan/2"), "schema"),
    (lambda d: d["attention_layout"][1].append([1, 2, 3]), r"tokens \[2, 3\) of sequence 1 appear twice"),
    (lambda d: d["linear_layout"][1].pop(), r"tokens \[0, 4\) of sequence 1 are missing"),
    (lambda d: d["attention_layout"].pop(), "attention_layout has 1 rank lists but the plan is for 1 x 2 = 2"),
    (lambda d: d["sequences"][0].update(ranks=[1, 0]), "zigzag chunks of a ring over ranks"),
    (lambda d: d.update(attention_layout=[[[0, 0, 5]], [[0, 5, 10], [1, 0, 4]]]), "zigzag chunks"),
    (lambda d: d["sequences"][1].update(ranks=[0]), "whole sequence on its rank"),
    (lambda d: d["sequences"][0].update(placement="inter_node"), "needs ranks on >= 2 nodes"),
    (lambda d: d["sequences"][1].update(placement="sideways"), "placement is 'sideways'"),
    (lambda d: d["sequences"][0].update(ranks=[0, 5]), r"rank 5 is outside \[0, 2\)"),
    (lambda d: d["linear_layout"][0].append([0, 9, 12]), r"\[9, 12\) of sequence 0 is empty or outside"),
    (lambda d: d["attention_layout"][0].append([7, 0, 1]), r"sequence index 7 is outside"),
    (lambda d: d.update(sequences=[]), "no sequences"),
    (lambda d: d["linear_layout"][0].append(["a", 1, 2]), r"must be \[seq, start, end\] integers"),
    (lambda d: d.update(routing=[{"ring": [0, 1], "src": 0, "dst": 1, "proxies": [0]}]), "not a cross-node hop"),
])
def test_invalid_documents(mutate, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlanError, match=match):
        StepPlan.from_json(_bad(mutate))


def test_not_json() -> None:
    with pytest.raises(PlanError, match="not valid JSON"):
        StepPlan.from_json("{nope")
