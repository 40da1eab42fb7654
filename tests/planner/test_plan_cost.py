"""A deterministic guard on planning work for ``benchmarks/plan_speed.py``'s batches (1M long-tailed tokens on 16 x 8
GPUs): how many candidates ``plan_step`` finishes and how many packings it makes. Wall-clock time is not tested (CI's
shared machine varies by 2x); these counts are what the 50 ms budget rests on (docs/planner.md, "Packed candidates":
about 46 ms with two candidates finished and 9-11 packings per step: 11-14 since 2026-11-27, when leads of any
whole-node size, absorbing rings and whole-node filled leads came in, four to five before; 9-11 since the one-group
bound of quick_floor, later that day; a third finished where a wide packing, judged last, wins: seed 3, with the wide
packings of packed_wide; a fourth there since a hybrid ring's gradients go home in bf16, which made head-parallel rings
cheaper and put one more packing's floor under the step to beat: plan_speed medians 46.4-47.5 ms against 45.6-46.9,
interleaved; two more in all since whole-document moves, planner/whole_moves.py, on seeds 1 and 2, whose kept
packings trade documents and are finished again with their widths kept, which costs less than a finish choosing
them: about 2 ms, with the trades' 1-2 ms, and predictions rounded 5x faster, predict._round, on every step; one to
four more packings since 2026-11-28, when the partitioner's plan became the bar on its token-balanced layout alone,
api._lazy_partition, a looser bar than its full layout choice: 11 / 11 / 15 / 13 / 11 against 11 / 10 / 11 / 12 / 10,
for about 4.5 ms less finishing on each step; one more on seed 1 since whole documents may join a head-parallel ring,
planner/whole_moves.py, whose kept packing then trades: 2 / 4 / 3 / 3 / 2 finishes; since the best-first search of
packed_search.py, later on 2026-11-28, where a finished candidate can rule out a led, filled-lead or wide family before
it is made: 11 / 11 / 12 / 10 / 10 packings, 2 / 4 / 3 / 2 / 2 finishes, the same plans), so a change that adds work to
every step fails here first."""

from __future__ import annotations

import pytest

from zeppelin_megatron.planner import CostModel, api, load_cluster, load_model, packed_search, plan_step
from zeppelin_megatron.planner.workloads import long_tailed_batch


def test_plan_speed_batches_finish_two_candidates_and_pack_a_few_times(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = {"finished": 0, "packings": 0}
    finish, pack = api._candidate, packed_search.packed_assignments

    def counted_finish(*a: object, **k: object) -> object:
        counts["finished"] += 1
        return finish(*a, **k)  # type: ignore[arg-type]

    def counted_pack(*a: object, **k: object) -> object:
        counts["packings"] += 1
        return pack(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "_candidate", counted_finish)
    monkeypatch.setattr(packed_search, "packed_assignments", counted_pack)
    cost = CostModel(model=load_model(None), cluster=load_cluster("16x8"))
    per_plan = []
    for seed in range(5):
        counts.update(finished=0, packings=0)
        plan = plan_step(long_tailed_batch(1 << 20, seed), cost)
        per_plan.append((counts["finished"], counts["packings"], plan.origin))
    assert all(f <= 4 and p <= 12 for f, p, _ in per_plan), per_plan
    assert sum(f for f, _, _ in per_plan) <= 13 and sum(p for _, p, _ in per_plan) <= 54, per_plan
    assert all(o == "packed" for _, _, o in per_plan), per_plan  # a packed plan wins each (docs/planner.md)
