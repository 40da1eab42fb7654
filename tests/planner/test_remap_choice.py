"""plan_step(remap="auto" | True | False): per-step choice between remapping and not (cost-model predictions)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zeppelin_megatron.planner import CostModel, PlanError, load_cluster, load_model, plan_step
from zeppelin_megatron.planner import PlannerOptions
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.planner.workloads import long_tailed_batch


def _cost(spec: str, tokens_per_gpu: int | None = None) -> CostModel:
    return CostModel(model=load_model(None), cluster=load_cluster(spec, tokens_per_gpu=tokens_per_gpu))


CASES = [("2x8", 1 << 19, seed) for seed in range(4)] + [("4x8", 1 << 20, seed) for seed in (0, 5)]


@pytest.mark.parametrize("spec,tokens,seed", CASES)
def test_auto_keeps_the_faster_of_the_two(spec: str, tokens: int, seed: int) -> None:
    cost = _cost(spec)
    lengths = long_tailed_batch(tokens, seed)
    on = plan_step(lengths, cost, PlannerOptions(remap=True))
    off = plan_step(lengths, cost, PlannerOptions(remap=False))
    auto = plan_step(lengths, cost, PlannerOptions(remap="auto"))
    assert on.attention_layout == off.attention_layout == auto.attention_layout
    assert on.routing == off.routing == auto.routing
    assert off.linear_layout == off.attention_layout != on.linear_layout
    assert auto.predicted.step_ms == min(on.predicted.step_ms, off.predicted.step_ms)
    assert auto == (on if on.predicted.step_ms <= off.predicted.step_ms else off)
    # deterministic
    assert auto.to_json() == plan_step(list(lengths), _cost(spec), PlannerOptions(remap="auto")).to_json()


def test_auto_picks_each_side_on_some_batch() -> None:
    # Not a tautology of the rule above: both outcomes occur on realistic batches.
    picked = set()
    for spec, tokens, seed in CASES + [("2x8", 1 << 18, s) for s in range(6)]:
        cost = _cost(spec)
        plan = plan_step(long_tailed_batch(tokens, seed), cost, PlannerOptions(remap="auto"))
        picked.add(plan.linear_layout == plan.attention_layout)
    assert picked == {True, False}


def test_tie_keeps_the_remap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Make both candidates predict the same step: "auto" must return the remapped one.
    import zeppelin_megatron.planner.api as api

    real = api.predict
    monkeypatch.setattr(api, "predict", lambda plan, cost: replace(real(plan, cost), step_ms=1.0))
    cost = _cost("2x8")
    lengths = long_tailed_batch(1 << 19, 1)
    plan = plan_step(lengths, cost, PlannerOptions(remap="auto"))
    assert plan.linear_layout != plan.attention_layout
    assert plan.linear_layout == plan_step(lengths, cost, PlannerOptions(remap=True)).linear_layout


def test_default_is_the_token_balanced_layout() -> None:
    """Issue 2: without options every rank holds floor(T/N) or ceil(T/N) linear-layout tokens."""
    for spec, tokens, seed in CASES + [("2x8", 1 << 18, s) for s in range(6)]:
        cost = _cost(spec)
        plan = plan_step(long_tailed_batch(tokens, seed), cost)
        counts = {plan.tokens(r, "linear") for r in range(plan.world_size)}
        t, n = plan.total_tokens, plan.world_size
        assert counts <= {t // n, -(-t // n)}, (spec, seed, sorted(counts))


def test_no_remap_plan_within_capacity_beyond_the_linear_quota() -> None:
    # tokens_per_gpu bounds the attention layout; a rank may hold more than the linear quota
    # T/P and the no-remap plan (linear layout = attention layout) is still valid.
    cost = _cost("2x4", tokens_per_gpu=20_000)
    lengths = long_tailed_batch(150_000, 11, long_min=10_000, long_max=40_000)
    quota = -(-sum(lengths) // 8)
    for remap in ("auto", False):
        plan = plan_step(lengths, cost, PlannerOptions(remap=remap))  # type: ignore[arg-type]
        held = [plan.tokens(r, "linear") for r in range(8)]
        assert max(held) <= 20_000
    off = plan_step(lengths, cost, PlannerOptions(remap=False))
    assert max(off.tokens(r, "linear") for r in range(8)) > quota


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, "Auto"])
def test_bad_remap_value(bad: object) -> None:
    cost = _cost("1x2")
    with pytest.raises(PlanError, match="remap is"):
        plan_step([100, 200], cost, PlannerOptions(remap=bad))  # type: ignore[arg-type]


def test_predictions_are_those_of_predict() -> None:
    cost = _cost("2x8")
    lengths = long_tailed_batch(1 << 19, 2)
    for remap in ("auto", True, False):
        plan = plan_step(lengths, cost, PlannerOptions(remap=remap))  # type: ignore[arg-type]
        assert plan.predicted == predict(replace(plan, predicted=None, validate=False), cost)
