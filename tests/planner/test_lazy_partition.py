"""``plan_step`` with packing on finishes the partitioner's placement on the token-balanced layout first, the bar the
packed candidates must beat, and with every layout only where none does (``api._lazy_partition``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import zeppelin_megatron.planner.api as api
from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.packed import CHARGES
from zeppelin_megatron.planner.partition import partition
from zeppelin_megatron.planner.plan import StepPlan
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.sim.lengths import sample_steps


def _cost() -> CostModel:
    return CostModel(model=load_model("configs/models/llama_7b.yaml"), cluster=load_cluster("2x8"))


def _charged(plan: StepPlan, cost: CostModel) -> float:
    return predict(plan, cost, charges=CHARGES).step_ms


def test_the_bar_is_the_token_balanced_plan_and_full_finishing_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    cost = _cost()
    lengths = sample_steps("prolong-64k", 1, 1 << 18, 0)[0]
    seen: list[tuple[str, str]] = []
    real_best, real_lazy = api.best_packed, api._lazy_partition

    def best(lengths: list[int], cost: CostModel, options: PlannerOptions, plan: StepPlan, finish: object) -> StepPlan:
        seen.append(("bar", plan.linear))
        return real_best(lengths, cost, options, plan, finish)  # type: ignore[arg-type]

    def lazy(*a: object) -> StepPlan:
        seen.append(("full", ""))
        return real_lazy(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "best_packed", best)
    monkeypatch.setattr(api, "_lazy_partition", lazy)
    plan = plan_step(lengths, cost)
    assert plan.origin == "packed" and seen == [("bar", "token_balanced")]  # a packed plan beat it: no full finish
    seen.clear()
    plan_step(lengths, cost, PlannerOptions(remap=False))  # nothing to leave out: the attention layout only
    assert seen == [("bar", "attention")]


@pytest.mark.parametrize("cluster, tokens, dist, seed, kept", [
    ("4x8", 1 << 19, "arxiv-64k", 3, "full"),  # workload-balanced, 2111 ms charged against the bar's 2317
    ("2x8", 1 << 18, "github-64k", 2, "bar"),  # workload-balanced by the uncharged rule, 2433 ms against 2430
])
def test_where_nothing_packed_wins_the_lower_charged_partitioner_plan_is_kept(
        monkeypatch: pytest.MonkeyPatch, cluster: str, tokens: int, dist: str, seed: int, kept: str) -> None:
    """With the packed search finding nothing, ``plan_step`` returns the partitioner's full layout choice, or the
    token-balanced bar where that is charged lower (one of the full choice's layouts, picked there by the uncharged
    prediction), finished as ``plan_step`` finishes its plans."""
    cost = CostModel(model=load_model("configs/models/llama_7b.yaml"), cluster=load_cluster(cluster))
    options = PlannerOptions(ring_parts=False)
    lengths = sample_steps(dist, 1, tokens, seed)[0]
    monkeypatch.setattr(api, "best_packed", lambda lengths, cost, options, plan, finish: plan)
    plan = plan_step(lengths, cost, options)
    placed = partition(lengths, cost, options)
    full = api._partition_plan(lengths, placed, cost, options)
    bar = api._partition_plan(lengths, placed, cost, replace(options, remap=True))
    assert bar.linear == "token_balanced" and full.linear == "workload_balanced"
    assert (_charged(bar, cost) < _charged(full, cost) - 1e-6) == (kept == "bar")
    assert plan.to_json() == api._final(bar if kept == "bar" else full).to_json()
    chosen = api._lazy_partition(lengths, placed, cost, options, bar)
    assert (chosen is bar) == (kept == "bar") and chosen.to_json() == (bar if kept == "bar" else full).to_json()


def test_a_lower_charged_bar_is_kept() -> None:
    cost = _cost()
    options = PlannerOptions()
    lengths = sample_steps("arxiv-64k", 1, 1 << 18, 1)[0]
    placed = partition(lengths, cost, options)
    lower = plan_step(lengths, cost)  # a packed plan, charged below the partitioner's: as a bar it is kept
    full = api._partition_plan(lengths, placed, cost, options)
    assert _charged(lower, cost) < _charged(full, cost) - 1e-6
    assert api._lazy_partition(lengths, placed, cost, options, lower) is lower
