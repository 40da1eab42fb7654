"""Filled-lead packings (planner/packed_search.py's fill_splits and _filled, packed.packed_groups(lead=...)): the
longest documents on a ring over the first 2, 4, ... ranks of a node, which also take whole documents."""

from __future__ import annotations

import random
from itertools import accumulate

import pytest

from zeppelin_megatron.planner import CostModel, PlanError, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner import packed_search
from zeppelin_megatron.planner.packed import CHARGES, packed_groups
from zeppelin_megatron.planner.packed_search import fill_splits
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.sim.lengths import sample_steps

from .test_packed import _reference_groups


def _cost(spec: str, **kw: int) -> CostModel:
    return CostModel(model=load_model(None), cluster=load_cluster(spec, **kw))


@pytest.mark.parametrize("spec,first,cp", [("1x8", 2, 1), ("1x8", 2, 2), ("2x8", 4, 4), ("2x8", 2, 1)])
def test_filled_lead_packing_matches_plain_scans(spec: str, first: int, cp: int) -> None:
    cost = _cost(spec)
    rng = random.Random(first * 10 + cp)
    for _ in range(6):
        lengths = [rng.choice([rng.randint(50, 2000), rng.randint(2000, 12_000), rng.randint(12_000, 40_000)])
                   for _ in range(rng.randint(8, 40))]
        lead = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))[:rng.randint(1, 2)]
        shard_from = rng.choice([6000, 20_000, 10 ** 9]) if cp > 1 else 10 ** 9  # cp = 1 shards nothing
        lengths = [min(s, cost.cluster.tokens_per_gpu) for s in lengths]
        try:
            want = _reference_groups(lengths, cost, cp, head_parallel=True, shard_from=shard_from, first=first,
                                     lead=lead)
        except ValueError:  # min() of no room: the packing must refuse too
            with pytest.raises(PlanError):
                packed_groups(lengths, cost, cp, head_parallel=True, shard_from=shard_from, first=first, lead=lead)
            continue
        got = packed_groups(lengths, cost, cp, head_parallel=True, shard_from=shard_from, first=first, lead=lead)
        assert got == want
        assert all(got[i] == tuple(range(first)) for i in lead)
        assert all(len(g) == 1 or len(g) == cp or i in lead for i, g in enumerate(got))


def test_filled_lead_takes_short_documents() -> None:
    """packed_groups' docstring example: 8 ranks, first = 2, cp = 1, the longest in the lead: sharded over ranks 0
    and 1, which then take short documents until their load reaches the others'."""
    cost = _cost("1x8")
    lengths = [12_000] + [3000] * 30
    groups = packed_groups(lengths, cost, 1, head_parallel=True, first=2, lead=[0])
    assert groups[0] == (0, 1)
    on = [sum(1 for g in groups[1:] if g == (r,)) for r in range(8)]
    assert on == [2, 1, 5, 5, 5, 4, 4, 4]
    # a lead heavier than the others' share takes none
    heavy = packed_groups([40_000] + [3000] * 30, cost, 1, head_parallel=True, first=2, lead=[0])
    assert heavy[0] == (0, 1) and all(g[0] >= 2 for g in heavy[1:])


def test_lead_errors_name_the_limit() -> None:
    cost = _cost("1x8")
    with pytest.raises(PlanError, match="leading group of 1 ranks needs first >= 2"):
        packed_groups([9000, 100, 100], cost, 1, first=1, lead=[0])
    with pytest.raises(PlanError, match=r"at least 8 tokens per sequence it holds \(zigzag\), got sequences of \[7\]"):
        packed_groups([7, 9000, 100], cost, 1, first=4, lead=[0])


def test_fill_splits_rule() -> None:
    """Per k = 2, 4, ... below the node size, then whole nodes (gpn, 2 gpn, 4 gpn, ...) up to half the world: the
    most of the longest documents whose share of the work is at most k / P (at least one, at most LEAD_MAX), each
    at least 2 k tokens, within capacity."""
    from zeppelin_megatron.planner.packed_search import LEAD_MAX
    rng = random.Random(3)
    seen = set()
    for spec in ("1x8", "2x8", "4x8", "2x4", "8x4"):
        cost = _cost(spec)
        world, gpn = cost.cluster.world_size, cost.cluster.gpus_per_node
        sizes = [k for k in (2, 4) if k < gpn] + [k for k in (gpn, 2 * gpn, 4 * gpn, 8 * gpn) if k <= world // 2]
        for _ in range(5):
            lengths = [rng.randint(1, 30_000) for _ in range(rng.randint(3, 60))]
            got = fill_splits(lengths, cost)
            assert [k for k, _ in got] == [k for k in sizes if k in {x for x, _ in got}]
            share = max(1, sum(lengths) // world)
            lin = cost.linear_ms(share) / share
            order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
            cum = list(accumulate(cost.local_ms(lengths[i]) + lengths[i] * lin for i in order))
            for k, top in got:
                n = len(top)
                seen.add((k >= gpn, n == LEAD_MAX))
                assert top == order[:n] and all(lengths[i] >= 2 * k for i in top)
                widest = min(LEAD_MAX, max([m for m in range(1, len(order)) if cum[m - 1] <= k / world * cum[-1]]
                                           or [1]))
                assert n <= widest and (n == widest or lengths[order[n]] < 2 * k)
    assert (True, True) in seen and (False, False) in seen  # whole-node leads, some capped at LEAD_MAX


def test_plan_step_takes_a_filled_lead_where_it_predicts_faster() -> None:
    """Llama-7B prolong-64k on 1 x 8 GPUs, 256k tokens, batch 1 of 4 (61 documents, longest 40008): fill_splits leads
    with it on ranks 0-1 (k = 2), and the packing searched from that lead wins (charged prediction 3744 -> 3662 ms
    against the best packing without filled leads; both plans without whole-document moves, which trade on each
    plan's own times): the longest document's ring starts at ranks 0 and 1 (widened to a head-parallel ring of the
    node's first four GPUs, with two more documents), and ranks 0 and 1 also hold whole ones. (Batch 0 of arxiv-64k
    was this test's case until the head-parallel all-to-alls landed their messages in place, 2026-11-28: its filled
    lead now finishes 0.7% slower than the plain packing; plan_step compares packings by their finished plans'
    predictions only where the search keeps both.)"""
    cost = _cost("1x8")
    b = sample_steps("prolong-64k", 4, 1 << 18, 0)[1]
    assert fill_splits(b, cost)[0] == (2, [35]) and b[35] == max(b)
    plain = plan_step(b, cost, PlannerOptions(packed_fill=False, packed_moves=False))
    filled = plan_step(b, cost, PlannerOptions(packed_moves=False))
    assert filled.origin == "packed" and filled.sequences[35].ranks[:2] == (0, 1)
    assert {s.ranks[0] for s in filled.sequences if s.placement == "local"} >= {0, 1}
    assert predict(filled, cost, charges=CHARGES).step_ms < predict(plain, cost, charges=CHARGES).step_ms - 1.0


def test_packed_fill_option(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PlanError, match="packed_fill is 'yes', expected True or False"):
        PlannerOptions(packed_fill="yes")  # type: ignore[arg-type]
    cost = _cost("1x8")
    b = sample_steps("arxiv-64k", 1, 1 << 18, 0)[0]

    def refuse(*_a: object, **_k: object) -> object:
        raise AssertionError("searched although left out")

    monkeypatch.setattr(packed_search, "fill_splits", refuse)
    plan_step(b, cost, PlannerOptions(packed_fill=False))
    plan_step(b, cost, PlannerOptions(head_parallel=False))
    with pytest.raises(AssertionError, match="searched although left out"):
        plan_step(b, cost)

