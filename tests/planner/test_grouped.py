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


def _packing_by_scan(lengths: Sequence[int], cluster: object, cp: int) -> list[Assignment] | None:
    """The packing rule of grouped_assignments written as plain scans (every group, every rank), as it first
    was: the reference its heaps must equal."""
    world, cap = cluster.world_size, cluster.tokens_per_gpu  # type: ignore[attr-defined]
    bins, load, where = world // cp, [0] * (world // cp), [-1] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    for i in order:
        fits = [b for b in range(bins) if load[b] + lengths[i] <= cp * cap]
        if not fits:
            return None
        where[i] = min(fits, key=lambda b: (load[b], b))
        load[where[i]] += lengths[i]
    held, out = [0] * world, [None] * len(lengths)
    for i, s in enumerate(lengths):
        if cp > 1 and s >= 2 * cp:
            ranks = tuple(range(where[i] * cp, (where[i] + 1) * cp))
            node = cluster.node_of  # type: ignore[attr-defined]
            out[i] = Assignment("intra_node" if node(ranks[0]) == node(ranks[-1]) else "inter_node", ranks)
            for r in ranks:
                held[r] += -(-s // cp)
    for i in order:
        if out[i] is None:
            r = min(range(where[i] * cp, (where[i] + 1) * cp), key=lambda r: (held[r], r))
            out[i], held[r] = Assignment("local", (r,)), held[r] + lengths[i]
    return None if max(held) > cap else out  # type: ignore[return-value]


@pytest.mark.parametrize("spec", ["2x4", "4x8", "16x8"])
def test_heaps_pack_as_the_scans_do(spec: str) -> None:
    """grouped_assignments keeps the emptiest group and each group's least-loaded rank in heaps (ties to the
    lowest index, as the scans break them); same packings, refusals included, on random batches."""
    import random

    rng = random.Random(7)
    cluster = load_cluster(spec, tokens_per_gpu=8192)
    outcomes = set()
    for _ in range(40):
        lengths = [rng.choice([rng.randint(1, 40), rng.randint(100, 3000), rng.randint(5000, 30000)])
                   for _ in range(rng.randint(1, 120))]
        for cp in [c for c in (1, 2, 4, 8, 16, 32, 64, 128) if cluster.world_size % c == 0]:
            got = grouped_assignments(lengths, cluster, cp)
            assert got == _packing_by_scan(lengths, cluster, cp), (lengths, cp)
            outcomes.add(got is None)
    assert outcomes == {True, False}  # packings and refusals both compared


def test_sizes_and_refusals() -> None:
    assert group_sizes([122250], load_cluster("16x4", tokens_per_gpu=131072)) == [4, 8, 16, 32, 64]
    assert group_sizes([100000], load_cluster("2x4", tokens_per_gpu=20000)) == [8]  # 4 GPUs hold 80000 only
    assert grouped_assignments([40000] * 3, load_cluster("2x4", tokens_per_gpu=12000), 4) is None  # no room
    with pytest.raises(ValueError, match="cp = 3 must be a positive divisor of the world size 8"):
        grouped_assignments([10], load_cluster("2x4"), 3)


NO_PACKED = PlannerOptions(packed=False)
"""The partitioner's plan alone (packed candidates off): the grouped candidates are compared with it."""


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
            return plan_step(lengths, cost, NO_PACKED)
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
    plan = plan_step(lengths, cost, NO_PACKED)
    best = best_plan(lengths, cost, NO_PACKED, plan, _finish(lengths, cost, monkeypatch))
    assert (best is not plan) == grouped
    if grouped:
        assert best.predicted.step_ms < plan.predicted.step_ms  # type: ignore[union-attr]
        assert rings_end_ms(best, cost) < rings_end_ms(plan, cost)
        assert {len(r.ranks) for r in best.rings} == {16} and {r.a2a for r in best.rings} == {4}
        ms = [simulate(p, cost, keep_events=False).step_ms for p in (best, plan)]
        assert ms[0] < 0.85 * ms[1], ms
    # ablations keep the partitioner's plan
    off = PlannerOptions(head_parallel=False, packed=False)
    assert best_plan(lengths, cost, off, plan, _finish(lengths, cost, monkeypatch)) is plan


def test_plan_step_tries_the_candidates_only_when_asked() -> None:
    """``PlannerOptions(grouped=True)``: plan_step returns the cp = 16 candidate on 13B prolong-128k
    (128 GPUs, batch 0), the partitioner's plan otherwise (packed candidates off); a bad value is named. By
    default a packed candidate wins this batch (the longest documents on a leading group of nodes, the rest packed
    after it, packed_search): below the grouped candidate's prediction and the partitioner's."""
    from zeppelin_megatron.planner.plan import PlanError

    cost, lengths = _setup("llama_13b", 2, "prolong-128k", 16, 0)
    plain = plan_step(lengths, cost, NO_PACKED)
    grouped = plan_step(lengths, cost, PlannerOptions(grouped=True, packed=False))
    default = plan_step(lengths, cost)
    assert default.origin == "packed"
    assert default.predicted.step_ms < grouped.predicted.step_ms < plain.predicted.step_ms  # type: ignore[union-attr]
    assert {len(r.ranks) for r in grouped.rings} == {16} and {r.a2a for r in grouped.rings} == {4}
    assert grouped.predicted.step_ms < plain.predicted.step_ms  # type: ignore[union-attr]
    # finished without a remap (every long document split over its group balances the tokens too)
    assert grouped.origin == "grouped" and grouped.linear == "attention"
    assert grouped.linear_layout == grouped.attention_layout and plain.origin is None
    assert plan_step(lengths, cost, PlannerOptions(grouped=True, head_parallel=False, packed=False)).to_json() == \
        plan_step(lengths, cost, PlannerOptions(head_parallel=False, packed=False)).to_json()
    with pytest.raises(PlanError, match="grouped is 1, expected True or False"):
        PlannerOptions(grouped=1)  # type: ignore[arg-type]


def _brute_force(lengths: list[int], cost, options: PlannerOptions, plan: StepPlan):  # type: ignore[no-untyped-def]
    """Every candidate finished, ascending cp, the first strictly lower prediction that also ends its rings
    sooner (best_plan's rule before the floors)."""
    import zeppelin_megatron.planner.api as api
    from zeppelin_megatron.planner.grouped import group_sizes

    best, best_ms, ends = plan, plan.predicted.step_ms, rings_end_ms(plan, cost)  # type: ignore[union-attr]
    finished = []
    for cp in group_sizes(lengths, cost.cluster):
        a = grouped_assignments(lengths, cost.cluster, cp)
        if a is None:
            continue
        cand = api._finish(lengths, a, cost, options)
        finished.append((a, cand))
        if cand.predicted.step_ms < best_ms - 1e-9 and rings_end_ms(cand, cost) < ends - 1e-9:  # type: ignore[union-attr]
            best, best_ms = cand, cand.predicted.step_ms  # type: ignore[union-attr]
    return best, finished


@pytest.mark.parametrize("cluster,tokens,model,overlap,heads", [
    ("2x8", 1 << 18, "llama_7b", True, True), ("4x8", 1 << 19, "llama_7b", True, True),
    ("4x8", 1 << 19, "llama_13b", False, True), ("4x4", 1 << 18, "llama_7b", True, False)])
def test_floor_is_below_every_finished_candidate_and_pruning_changes_nothing(
        cluster: str, tokens: int, model: str, overlap: bool, heads: bool) -> None:
    """step_floor <= predict(finished candidate).step_ms for every candidate of long-tailed batches (seeds
    0-5; remap windows on and off, head-parallel on and off, two models), and best_plan (floors: lowest
    first, candidates that cannot win not finished) returns the plan the exhaustive rule returns."""
    import zeppelin_megatron.planner.api as api
    from zeppelin_megatron.planner import CostModel, load_model
    from zeppelin_megatron.planner.grouped import step_floor
    from zeppelin_megatron.planner.workloads import long_tailed_batch

    cost = CostModel(model=load_model(f"configs/models/{model}.yaml"), cluster=load_cluster(cluster))
    options = PlannerOptions(remap_overlap=overlap, head_parallel=heads, grouped=True)
    checked = 0
    for seed in range(6):
        lengths = long_tailed_batch(tokens, seed)
        plan = api._finish(lengths, api.partition(lengths, cost, options), cost, options)
        want, finished = _brute_force(lengths, cost, options, plan)
        for a, cand in finished:
            floor = step_floor(lengths, a, cost, options)
            assert 0 < floor <= cand.predicted.step_ms + 1e-6, (seed, floor, cand.predicted)  # type: ignore[union-attr]
            checked += 1
        got = best_plan(lengths, cost, options, plan, lambda a, ls=lengths: api._finish(ls, a, cost, options))
        if not heads:
            assert got is plan
        else:
            assert got.to_json() == want.to_json(), seed
    assert checked >= 12


def test_floor_of_a_small_batch_by_hand() -> None:
    """One sequence of 8192 tokens on a ring over one node's 8 ranks, nothing else (Llama-7B, 1x8): the
    floor is layers * max(ring floor, (8 * ring floor + p * 8192) / 8), p the profile's least linear ms
    per token, the ring floor the cheaper of the plain ring's own time and Ulysses' total."""
    from zeppelin_megatron.planner import CostModel, load_model
    from zeppelin_megatron.planner.cost_heads import head_ring_time
    from zeppelin_megatron.planner.engine_ring import ring_steps
    from zeppelin_megatron.planner.grouped import step_floor

    cost = CostModel(model=load_model("configs/models/llama_7b.yaml"), cluster=load_cluster("1x8"))
    ranks = tuple(range(8))
    st = ring_steps(cost, [8192], 8, charges="none")
    ring = min(st.diag + 7 * st.off + st.first_late,
               *(head_ring_time(cost, ranks, [8192], a, "none").total for a in (2, 4, 8)))
    p = min(cost.linear_ms(r.tokens) / r.tokens for r in cost.profile.linear)
    want = cost.model.layers * max(ring, ring + p * 8192 / 8)
    got = step_floor([8192], [Assignment("intra_node", ranks)], cost, PlannerOptions())
    assert got == pytest.approx(want, rel=1e-12)
    plain_only = step_floor([8192], [Assignment("intra_node", ranks)], cost, PlannerOptions(head_parallel=False))
    assert plain_only == pytest.approx(cost.model.layers * (st.diag + 7 * st.off + st.first_late + p * 1024))
