"""StepPlan.rings order (ring_order): list scheduling so rings on free ranks never queue."""

from __future__ import annotations

import random

import pytest

from zeppelin_megatron.planner import CostModel, StepPlan, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.plan import Ring, ring_order
from zeppelin_megatron.planner.workloads import long_tailed_batch


def _rings(spec: list[tuple[tuple[int, ...], str, list[int]]]) -> tuple[list[Ring], list[int]]:
    """``(ranks, placement, lengths)`` per ring -> Rings and the flat lengths list."""
    rings, lengths = [], []
    for ranks, placement, ls in spec:
        seqs = tuple(range(len(lengths), len(lengths) + len(ls)))
        rings.append(Ring(ranks, placement, seqs))  # type: ignore[arg-type]
        lengths += ls
    return rings, lengths


def _reference(rings: list[Ring], lengths: list[int]) -> list[Ring]:
    """Brute force: repeatedly the ring with the smallest (start, kind, ranks)."""
    free: dict[int, int] = {}
    left, out = list(rings), []
    while left:
        def key(r: Ring) -> tuple:
            return (max(free.get(x, 0) for x in r.ranks), 0 if r.placement == "inter_node" else 1, r.ranks)
        best = min(left, key=key)
        start = key(best)[0]
        for x in best.ranks:
            free[x] = start + sum(lengths[i] ** 2 for i in best.seqs) // len(best.ranks)
        out.append(best)
        left.remove(best)
    return out


def test_chain_of_rings_runs_its_ends_together() -> None:
    # A = (0, 1), B = (1, 2), C = (2, 3), equal: sorted order chains A -> B -> C (three ring
    # times); list scheduling runs A and C together, then B (two ring times).
    rings, lengths = _rings([((0, 1), "intra_node", [4096]), ((1, 2), "intra_node", [4096]),
                             ((2, 3), "intra_node", [4096])])
    assert [r.ranks for r in ring_order(rings, lengths)] == [(0, 1), (2, 3), (1, 2)]


def test_rings_sharing_a_rank_keep_the_sorted_order() -> None:
    # All share rank 5: each must wait for the previous one anyway; inter-node first, then by ranks.
    rings, lengths = _rings([((4, 5), "intra_node", [9000]), ((5, 0, 7, 2), "inter_node", [333]),
                             ((3, 5, 6, 1), "inter_node", [200])])
    assert [r.ranks for r in ring_order(rings, lengths)] == [(3, 5, 6, 1), (5, 0, 7, 2), (4, 5)]


def test_a_rank_does_not_idle_behind_a_busy_partner() -> None:
    # Rank 0 is busy in the long inter-node ring (0, 8). Sorted order makes rank 1 run (0, 1)
    # first, waiting for rank 0, while rank 2 waits in (1, 2) for rank 1. List scheduling puts
    # (1, 2) first: ranks 1 and 2 work while rank 0 is busy, then rank 1 joins (0, 1).
    rings, lengths = _rings([((0, 8), "inter_node", [60000]), ((0, 1), "intra_node", [8000]),
                             ((1, 2), "intra_node", [8000])])
    assert [r.ranks for r in ring_order(rings, lengths)] == [(0, 8), (1, 2), (0, 1)]


@pytest.mark.parametrize("seed", range(20))
def test_matches_brute_force_and_ignores_input_order(seed: int) -> None:
    rng = random.Random(seed)
    spec, seen = [], set()
    for _ in range(rng.randint(1, 25)):
        ranks = tuple(rng.sample(range(16), rng.randint(2, 6)))
        if ranks in seen:
            continue
        seen.add(ranks)
        placement = "inter_node" if len({r // 8 for r in ranks}) > 1 else "intra_node"
        spec.append((ranks, placement, [rng.randint(100, 50_000) for _ in range(rng.randint(1, 3))]))
    rings, lengths = _rings(spec)
    want = _reference(rings, lengths)
    assert list(ring_order(rings, lengths)) == want
    shuffled = list(rings)
    rng.shuffle(shuffled)
    assert list(ring_order(shuffled, lengths)) == want


def test_planned_rings_are_a_deterministic_permutation_and_round_trip() -> None:
    cost = CostModel(model=load_model(None), cluster=load_cluster("8x8"))
    for seed in (0, 3):
        lengths = long_tailed_batch(1 << 20, seed)
        plan = plan_step(lengths, cost)
        groups = {(s.ranks, s.a2a, s.part) for s in plan.sequences if s.placement != "local"}
        assert sorted((r.ranks, r.a2a, r.part) for r in plan.rings) == sorted(groups)
        again = StepPlan.from_json(plan.to_json())
        assert again == plan and again.rings == plan.rings
        again = plan_step(list(lengths), CostModel(model=load_model(None), cluster=load_cluster("8x8")))
        assert plan.to_json() == again.to_json()
