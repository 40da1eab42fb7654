"""CP-group candidates (planner/grouped.py): the packing, the sizes tried, and the choice against the
partitioner's plan on the two issue-12 batches (simulated)."""

from __future__ import annotations

from typing import Sequence

import pytest

from zeppelin_megatron.planner import PlannerOptions, load_cluster, plan_step
from zeppelin_megatron.planner.grouped import best_plan, group_sizes, grouped_assignments, rings_end_ms
from zeppelin_megatron.planner.partition_context import Assignment
from zeppelin_megatron.planner.plan import StepPlan


def test_packing_of_the_docstring_example() -> None:
    cl = load_cluster("2x4")
    got = grouped_assignments([40000, 30000, 2000, 6], cl, 4)
    assert got == [Assignment("intra_node", (0, 1, 2, 3)), Assignment("intra_node", (4, 5, 6, 7)),
                   Assignment("intra_node", (4, 5, 6, 7)), Assignment("local", (4,))]
    assert grouped_assignments([40000, 30000, 2000, 6], cl, 8)[0] == Assignment("inter_node", tuple(range(8)))


def test_sizes_and_refusals() -> None:
    assert group_sizes([122250], load_cluster("16x4", tokens_per_gpu=131072)) == [4, 8, 16, 32, 64]
    assert group_sizes([100000], load_cluster("2x4", tokens_per_gpu=20000)) == [8]  # 4 GPUs hold 80000 only
    assert grouped_assignments([40000] * 3, load_cluster("2x4", tokens_per_gpu=12000), 4) is None  # no room
    with pytest.raises(ValueError, match="cp = 3 must be a positive divisor of the world size 8"):
        grouped_assignments([10], load_cluster("2x4"), 3)


def _setup(model: str, tp: int, dist: str, nodes: int, step: int):  # type: ignore[no-untyped-def]
    from zeppelin_megatron.commands.simulate import setup
    from zeppelin_megatron.sim.lengths import sample_steps

    cluster, cost = setup(f"{nodes}x8@configs/clusters/h100.yaml", f"configs/models/{model}.yaml", None, tp)
    return cost, sample_steps(dist, 2, 1 << 20, 0)[step]


def _finish(lengths: list[int], cost, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Assignments -> a plan finished as plan_step finishes the partitioner's (its partition replaced)."""
    import zeppelin_megatron.planner.api as api

    def finish(assignments: Sequence[Assignment]) -> StepPlan:
        with monkeypatch.context() as m:
            m.setattr(api, "partition", lambda *_: list(assignments))
            return plan_step(lengths, cost)
    return finish


@pytest.mark.parametrize("case,grouped", [(("llama_13b", 2, "prolong-128k", 16, 0), True),
                                          (("llama_7b", 1, "arxiv-128k", 8, 0), False)])
def test_candidate_taken_only_where_both_estimates_win_and_it_simulates_faster(
        case: tuple[str, int, str, int, int], grouped: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """13B prolong-128k on 128 GPUs, batch 0: the partitioner's rings form chains (4706 ms simulated,
    3609 predicted); the cp = 16 candidate wins on the prediction (3427) and on the rings' end with convoys,
    and simulates at 3652 ms. 7B arxiv-128k on 64 GPUs, batch 0: the partitioner's plan is kept (3299 ms;
    the best candidate, cp = 32, simulates at 3741)."""
    from zeppelin_megatron.sim.simulator import simulate

    cost, lengths = _setup(*case)
    plan = plan_step(lengths, cost)
    best = best_plan(lengths, cost, PlannerOptions(), plan, _finish(lengths, cost, monkeypatch))
    assert (best is not plan) == grouped
    if grouped:
        assert best.predicted.step_ms < plan.predicted.step_ms  # type: ignore[union-attr]
        assert rings_end_ms(best, cost) < rings_end_ms(plan, cost)
        assert {len(r.ranks) for r in best.rings} == {16} and {r.a2a for r in best.rings} == {4}
        ms = [simulate(p, cost, keep_events=False).step_ms for p in (best, plan)]
        assert ms[0] < 0.85 * ms[1], ms
    # ablations keep the partitioner's plan
    off = PlannerOptions(head_parallel=False)
    assert best_plan(lengths, cost, off, plan, _finish(lengths, cost, monkeypatch)) is plan


def test_plan_step_tries_the_candidates_only_when_asked() -> None:
    """``PlannerOptions(grouped=True)``: plan_step returns the cp = 16 candidate on 13B prolong-128k
    (128 GPUs, batch 0), the partitioner's plan otherwise; a bad value is named."""
    from zeppelin_megatron.planner.plan import PlanError

    cost, lengths = _setup("llama_13b", 2, "prolong-128k", 16, 0)
    plain = plan_step(lengths, cost)
    grouped = plan_step(lengths, cost, PlannerOptions(grouped=True))
    assert {len(r.ranks) for r in grouped.rings} == {16} and {r.a2a for r in grouped.rings} == {4}
    assert grouped.predicted.step_ms < plain.predicted.step_ms  # type: ignore[union-attr]
    assert plan_step(lengths, cost, PlannerOptions(grouped=True, head_parallel=False)).to_json() == \
        plan_step(lengths, cost, PlannerOptions(head_parallel=False)).to_json()
    with pytest.raises(PlanError, match="grouped is 1, expected True or False"):
        PlannerOptions(grouped=1)  # type: ignore[arg-type]
