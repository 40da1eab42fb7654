"""Packed candidates ranked after their trades (planner/packed_trades.py, PlannerOptions.packed_rerank): the
estimate, the traded step, and the opt-in ranking against the default."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from zeppelin_megatron.planner import CostModel, PlanError, PlannerOptions, api, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.packed import CHARGES, packed_assignments, packed_floor
from zeppelin_megatron.planner.packed_trades import trade_floor, traded
from zeppelin_megatron.planner.partition_context import Assignment
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.planner.ring_parts import split_rings
from zeppelin_megatron.planner.workloads import long_tailed_batch
from zeppelin_megatron.sim.lengths import sample_steps

RERANK = PlannerOptions(packed_rerank=True)


def _cost(spec: str, model: str | None = None, **kw: int) -> CostModel:
    return CostModel(model=load_model(model), cluster=load_cluster(spec, **kw))


def test_trade_floor_example() -> None:
    """The docstring's example: whole documents of 6000, 2000, 2000, 2000 tokens on 4 ranks, 1 ms per 1000 tokens: the
    mean layer, 3 ms (packed_floor: 6)."""
    cost = SimpleNamespace(cluster=SimpleNamespace(world_size=4), call_overhead_ms=0.0,
                           model=SimpleNamespace(layers=1), local_ms=lambda s: s / 1000, linear_ms=lambda t: 0.0)
    lengths = [6000, 2000, 2000, 2000]
    placed = [Assignment("local", (r,)) for r in range(4)]
    assert trade_floor(lengths, placed, cost, PlannerOptions(), "none") == pytest.approx(3.0)  # type: ignore[arg-type]
    assert packed_floor(lengths, placed, cost, PlannerOptions(), "none") == pytest.approx(6.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trade_floor_is_the_mean_of_the_floor_terms(seed: int) -> None:
    """On packings with rings and whole documents: at most packed_floor, and at least its value over the ranks
    (the floor's busiest rank over the world size: the mean of non-negative terms)."""
    cost = _cost("2x8")
    lengths = long_tailed_batch(1 << 18, seed)
    for cp in (2, 4):
        placed = packed_assignments(lengths, cost, cp, head_parallel=True, absorb=True)
        assert placed is not None and any(a.placement != "local" for a in placed)
        est = trade_floor(lengths, placed, cost, PlannerOptions(), CHARGES)
        floor = packed_floor(lengths, placed, cost, PlannerOptions())
        assert floor / 16 <= est <= floor * (1 + 1e-12)
        assert est < floor  # these packings are not perfectly balanced


@pytest.mark.parametrize("step,trades", [(0, True), (1, False)])
def test_traded_step_is_the_finished_plans(step: int, trades: bool) -> None:
    """traded()'s step is what the plan_step-finished traded placement predicts under the charges (rings in parts),
    and without trades the candidate's own step (in parts). Llama-7B prolong-128k on 128 GPUs: batch 0 trades,
    batch 1 does not."""
    cost = _cost("16x8", "configs/models/llama_7b.yaml")
    lengths = sample_steps("prolong-128k", 2, 1 << 20, 0)[step]
    options = PlannerOptions()
    no_remap = replace(options, remap=False)
    plan = plan_step(lengths, cost, replace(options, packed_moves=False))
    placed = [Assignment(s.placement, s.ranks) for s in plan.sequences]  # type: ignore[arg-type]
    ms = predict(plan, cost, charges=CHARGES).step_ms
    after, moved = traded(lengths, placed, plan, ms, cost, options, CHARGES)
    assert (moved is not None) is trades
    if moved is None:
        assert after == pytest.approx(predict(split_rings(plan, cost), cost, charges=CHARGES).step_ms, rel=1e-9)
    else:
        widths = [moved.widths.get(i, s.a2a) for i, s in enumerate(plan.sequences)]
        done = split_rings(api._candidate(list(lengths), moved.assignments, cost, no_remap, widths), cost)
        assert after == pytest.approx(predict(done, cost, charges=CHARGES).step_ms, rel=1e-9)
        assert after < ms


def test_rerank_finds_the_wide_span_of_the_example() -> None:
    """packed_trades' example (Llama-7B prolong-128k, 128 GPUs, batch 1): the default keeps the lead with the 92.2k
    document alone on a ring of 16 ranks (1889.9 ms charged); the post-trade ranking puts it on a span of 32 ranks
    in the rest (1911.5 before trades, 1793.5 after)."""
    cost = _cost("16x8", "configs/models/llama_7b.yaml")
    lengths = sample_steps("prolong-128k", 2, 1 << 20, 0)[1]
    i = lengths.index(92201)
    default, ranked = plan_step(lengths, cost), plan_step(lengths, cost, RERANK)
    assert len(default.sequences[i].ranks) == 16 and len(ranked.sequences[i].ranks) == 32
    assert predict(default, cost, charges=CHARGES).step_ms == pytest.approx(1889.93, abs=0.01)
    assert predict(ranked, cost, charges=CHARGES).step_ms == pytest.approx(1793.50, abs=0.01)
    assert ranked.origin == "packed" and ranked.linear == "attention"


@pytest.mark.parametrize("dist,spec,model,tokens", [
    ("arxiv-64k", "2x8", "configs/models/llama_7b.yaml", 1 << 19),
    ("github-64k", "4x8", "configs/models/llama_3b.yaml", 1 << 20),
])
def test_rerank_never_predicts_above_the_default(dist: str, spec: str, model: str, tokens: int) -> None:
    """The search before trades is the default's, and the ranking only replaces the kept candidate by a lower step
    after trades: per batch the charged prediction is at most the default's (7B arxiv-64k on 16 GPUs, batch 1:
    lower, 3975.2 -> 3920.3 ms)."""
    cost = _cost(spec, model)
    steps = []
    for lengths in sample_steps(dist, 2, tokens, 0):
        a = predict(plan_step(lengths, cost), cost, charges=CHARGES).step_ms
        b = predict(plan_step(lengths, cost, RERANK), cost, charges=CHARGES).step_ms
        assert b <= a + 1e-6
        steps.append((a, b))
    if dist == "arxiv-64k":
        assert steps[1][1] < steps[1][0] - 1.0


def test_rerank_option_is_checked() -> None:
    with pytest.raises(PlanError, match="packed_rerank is 1, expected True or False"):
        PlannerOptions(packed_rerank=1)  # type: ignore[arg-type]
    assert PlannerOptions().packed_rerank is False
