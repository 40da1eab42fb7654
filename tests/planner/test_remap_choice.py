"""The plan's linear layout and routing, chosen per step (layout_choice.py; cost-model predictions).

Candidates: token-balanced, workload-balanced, attention layout, each routed and unrouted; the
lowest predicted step wins, ties in that order (routed first). Hand-made plans below make each one
win; realistic batches check the rule and determinism.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from zeppelin_megatron.planner import CostModel, PlanError, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner import layout_choice
from zeppelin_megatron.planner.layout_choice import candidate_kinds, choose_plan
from zeppelin_megatron.planner.linear_layout import linear_layout
from zeppelin_megatron.planner.plan import SequencePlan, StepPlan
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.planner.workloads import long_tailed_batch
from zeppelin_megatron.planner.zigzag import position_ranges


def _cost(spec: str, tokens_per_gpu: int | None = None) -> CostModel:
    return CostModel(model=load_model(None), cluster=load_cluster(spec, tokens_per_gpu=tokens_per_gpu))


def hand_plan(spec: str, seqs: list[tuple[int, str, list[int]]]) -> tuple[StepPlan, CostModel]:
    """A plan's base as ``plan_step`` hands it to ``choose_plan``: ``seqs`` = (length, placement, ranks),
    the attention layout from them, the token-balanced linear layout."""
    cost = _cost(spec, tokens_per_gpu=200_000)
    cl = cost.cluster
    att: list[list[tuple[int, int, int]]] = [[] for _ in range(cl.world_size)]
    for i, (s, placement, ranks) in enumerate(seqs):
        if placement == "local":
            att[ranks[0]].append((i, 0, s))
        else:
            for p, r in enumerate(ranks):
                att[r].extend(position_ranges(i, s, len(ranks), p))
    layout = tuple(tuple(a) for a in att)
    sequences = tuple(SequencePlan(s, p, tuple(r)) for s, p, r in seqs)  # type: ignore[arg-type]
    return StepPlan(nodes=cl.nodes, gpus_per_node=cl.gpus_per_node, sequences=sequences, attention_layout=layout,
                    linear_layout=linear_layout(layout, cl)), cost


def _choose(base: StepPlan, cost: CostModel, remap: Any = "auto", routing: bool = True) -> StepPlan:
    return choose_plan(base, cost, PlannerOptions(remap=remap, routing=routing))


# Rank 0: four 8k documents (heavy attention, many tokens); ranks 1-3 one 2k document each.
TOKEN_BALANCED = ("1x4", [(8192, "local", [0])] * 4 + [(2048, "local", [r]) for r in (1, 2, 3)])
# Across two nodes: rank 0 one 16k document (heavy attention), rank 1 twenty 1k ones (light):
# evening the tokens out would make rank 1 wait for rank 0 and pay the network.
ATTENTION = ("2x1", [(16384, "local", [0])] + [(1024, "local", [1])] * 20)
# Ranks 0-1: a ring over a 32k document (heavy, 16k tokens each); rank 2: forty 1k documents, rank 3 eight.
WORKLOAD = ("1x4", [(32768, "intra_node", [0, 1])] + [(1024, "local", [2])] * 40 + [(1024, "local", [3])] * 8)


@pytest.mark.parametrize("case,winner", [(TOKEN_BALANCED, "token_balanced"), (ATTENTION, "attention"),
                                         (WORKLOAD, "workload_balanced")])
def test_each_layout_wins_where_it_must(case: tuple[str, list[tuple[int, str, list[int]]]], winner: str) -> None:
    base, cost = hand_plan(*case)
    auto = _choose(base, cost)
    assert auto.linear == winner
    forced = {True: _choose(base, cost, True), False: _choose(base, cost, False)}
    assert forced[True].linear == "token_balanced" and forced[True].linear_layout == base.linear_layout
    assert forced[False].linear == "attention" and forced[False].linear_layout == base.attention_layout
    assert auto.predicted is not None
    for other in forced.values():  # the choice is never predicted slower than a forced layout
        assert other.predicted is not None and auto.predicted.step_ms <= other.predicted.step_ms
    if winner != "token_balanced":
        assert auto.predicted.step_ms < forced[True].predicted.step_ms  # type: ignore[union-attr]
    if winner != "attention":
        assert auto.predicted.step_ms < forced[False].predicted.step_ms  # type: ignore[union-attr]


def test_workload_balanced_keeps_the_ring_and_evens_the_rest() -> None:
    base, cost = hand_plan(*WORKLOAD)
    plan = _choose(base, cost)
    held = [plan.tokens(r, "attention") for r in range(4)]
    lin = [plan.tokens(r, "linear") for r in range(4)]
    assert held == [16384, 16384, 40960, 8192]
    assert lin == [16384, 16384, 24576, 24576]  # the ring's ranks keep theirs; ranks 2 and 3 share 49152
    assert plan.linear_layout[:2] == plan.attention_layout[:2]
    assert plan.predicted == predict(replace(plan, predicted=None, validate=False), cost)
    StepPlan.from_json(plan.to_json())  # a valid plan (full validation of both layouts)


def test_unrouted_plan_chosen_when_the_routed_one_predicts_slower(monkeypatch: pytest.MonkeyPatch) -> None:
    cost = _cost("2x8")
    lengths = long_tailed_batch(1 << 19, 0)
    routed = plan_step(lengths, cost, PlannerOptions(head_parallel=False, packed=False))
    assert routed.routing, "this batch routes ring hops"
    real = layout_choice.predict

    def slower_when_routed(plan: StepPlan, c: CostModel) -> Any:
        p = real(plan, c)
        return replace(p, step_ms=p.step_ms + (1e6 if plan.routing or plan.remap_proxies else 0.0))

    monkeypatch.setattr(layout_choice, "predict", slower_when_routed)
    plan = plan_step(lengths, cost, PlannerOptions(head_parallel=False, packed=False))
    assert plan.routing == () and plan.remap_proxies == ()
    # the same tokens on each rank; the order follows the local slots, which follow the routing (engine_order)
    assert [sorted(r) for r in plan.attention_layout] == [sorted(r) for r in routed.attention_layout]
    monkeypatch.undo()
    off = plan_step(lengths, cost, PlannerOptions(head_parallel=False, routing=False))
    assert off.routing == () and off.remap_proxies == ()


def test_tie_keeps_the_first_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal predictions: routed before unrouted, token-balanced before workload-balanced before attention."""
    real = layout_choice.predict
    monkeypatch.setattr(layout_choice, "predict", lambda plan, cost: replace(real(plan, cost), step_ms=1.0))
    cost = _cost("2x8")
    lengths = long_tailed_batch(1 << 19, 0)
    plan = plan_step(lengths, cost, PlannerOptions(head_parallel=False, packed=False))
    assert plan.linear == "token_balanced" and plan.routing and plan.remap_proxies
    assert plan.linear_layout == plan_step(lengths, cost, PlannerOptions(remap=True)).linear_layout


CASES = [("2x8", 1 << 19, seed) for seed in range(3)] + [("4x8", 1 << 20, seed) for seed in (0, 5)]


@pytest.mark.parametrize("spec,tokens,seed", CASES)
def test_auto_is_never_predicted_slower_than_a_forced_layout(spec: str, tokens: int, seed: int) -> None:
    cost = _cost(spec)
    lengths = long_tailed_batch(tokens, seed)
    on = plan_step(lengths, cost, PlannerOptions(remap=True))
    off = plan_step(lengths, cost, PlannerOptions(remap=False, packed=False))
    auto = plan_step(lengths, cost, PlannerOptions(packed=False))  # "auto" on the partitioner's placement
    # the same ranges on each rank (their order within a rank follows the slots: remap windows' last)
    assert [sorted(r) for r in on.attention_layout] == [sorted(r) for r in off.attention_layout] \
        == [sorted(r) for r in auto.attention_layout]
    assert (on.linear, off.linear) == ("token_balanced", "attention")
    assert off.linear_layout == off.attention_layout
    assert auto.predicted.step_ms <= min(on.predicted.step_ms, off.predicted.step_ms)  # type: ignore[union-attr]
    assert auto.predicted == predict(replace(auto, predicted=None, validate=False), cost)
    # the default also tries packed candidates (packed.py, compared under the engine's charges): never
    # predicted slower than auto on the partition there
    default = plan_step(lengths, cost)
    assert predict(default, cost, charges="zeppelin").step_ms <= predict(auto, cost, charges="zeppelin").step_ms
    assert default == auto or default.linear_layout == default.attention_layout  # a packed plan has no remap
    # deterministic: a fresh cost model, a copy of the lengths, the same document
    assert default.to_json() == plan_step(list(lengths), _cost(spec)).to_json()


def test_choice_recorded_in_json_and_round_trip() -> None:
    for case in (TOKEN_BALANCED, ATTENTION, WORKLOAD):
        base, cost = hand_plan(*case)
        plan = _choose(base, cost)
        doc = plan.to_dict()
        assert doc["linear"] == plan.linear
        back = StepPlan.from_json(plan.to_json())
        assert back.linear == plan.linear and back.to_json() == plan.to_json()


def test_old_documents_and_bad_values() -> None:
    base, cost = hand_plan(*WORKLOAD)
    plan = _choose(base, cost)
    doc = plan.to_dict()
    del doc["linear"]  # a document written before the choice was recorded
    old = StepPlan.from_json(doc)
    assert old.linear is None and "linear" not in old.to_dict()
    for bad in ("balanced", 3, None, ""):
        with pytest.raises(PlanError, match=r"plan.linear is .*expected one of \['token_balanced', "
                                            r"'workload_balanced', 'attention'\]"):
            StepPlan.from_json({**plan.to_dict(), "linear": bad})
    with pytest.raises(PlanError, match="linear is 'attention' but the linear layout differs"):
        StepPlan.from_json({**plan.to_dict(), "linear": "attention"})
    with pytest.raises(PlanError, match="linear is 'sideways'"):
        replace(plan, linear="sideways")


def test_candidate_kinds_follow_the_option() -> None:
    assert candidate_kinds(True) == ("token_balanced",)
    assert candidate_kinds(False) == ("attention",)
    assert candidate_kinds("auto") == ("token_balanced", "workload_balanced", "attention")
    assert PlannerOptions().remap == "auto"


def test_default_picks_more_than_one_layout_on_realistic_batches() -> None:
    # Not a tautology of the rule: the default layout choice really chooses per step (on the partitioner's plans:
    # a packed candidate, which wins all of these batches since its rings absorb whole sequences, has no remap)
    picked = set()
    more = [("2x8", 1 << 18, s) for s in range(6)] + [("16x8", 1 << 20, s) for s in range(3)]
    for spec, tokens, seed in CASES + more:
        picked.add(plan_step(long_tailed_batch(tokens, seed), _cost(spec), PlannerOptions(packed=False)).linear)
    assert len(picked) >= 2, picked


def test_no_remap_plan_within_capacity_beyond_the_linear_quota() -> None:
    # tokens_per_gpu bounds the attention layout; a rank may hold more than the linear quota
    # T/P and the no-remap plan (linear layout = attention layout) is still valid.
    cost = _cost("2x4", tokens_per_gpu=20_000)
    lengths = long_tailed_batch(150_000, 11, long_min=10_000, long_max=40_000)
    quota = -(-sum(lengths) // 8)
    for remap in ("auto", False):
        plan = plan_step(lengths, cost, PlannerOptions(remap=remap))  # type: ignore[arg-type]
        assert max(plan.tokens(r, "linear") for r in range(8)) <= 20_000
    off = plan_step(lengths, cost, PlannerOptions(remap=False))
    assert max(off.tokens(r, "linear") for r in range(8)) > quota


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, "Auto"])
def test_bad_remap_value(bad: object) -> None:
    cost = _cost("1x2")
    with pytest.raises(PlanError, match="remap is"):
        plan_step([100, 200], cost, PlannerOptions(remap=bad))  # type: ignore[arg-type]
