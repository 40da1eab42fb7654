"""Rings absorbing whole documents in Zeppelin's packings (planner/packed_whole.py's absorb_whole,
PlannerOptions.packed_absorb)."""

from __future__ import annotations

import pytest

from zeppelin_megatron.planner import CostModel, PlanError, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.packed import CHARGES, packed_assignments, packed_floor, packed_groups, quick_floor
from zeppelin_megatron.planner.packed_whole import absorb_whole
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.planner.workloads import long_tailed_batch
from zeppelin_megatron.sim.lengths import sample_steps


def _cost(spec: str, **kw: int) -> CostModel:
    return CostModel(model=load_model(None), cluster=load_cluster(spec, **kw))


def test_docstring_example() -> None:
    """Weights of 1 per token: ring (0, 1) with 8000 tokens, rank 0 also 3000 and 1000 whole: 3000 joins (loads
    6500 / 5500), then 1000 (6000 / 6000)."""
    lengths, groups = [8000, 3000, 1000], [(0, 1), (0,), (0,)]
    load, tok = [8000.0, 4000.0], [8000, 4000]
    absorb_whole(lengths, 10 ** 6, groups, [float(s) for s in lengths], load, tok)
    assert groups == [(0, 1)] * 3 and load == [6000.0, 6000.0] and tok == [6000, 6000]
    groups, load, tok = [(0, 1), (0,), (0,)], [8000.0, 4000.0], [8000, 4000]  # a spilled ring (skip) takes none
    absorb_whole(lengths, 10 ** 6, groups, [float(s) for s in lengths], load, tok, frozenset({(0, 1)}))
    assert groups == [(0, 1), (0,), (0,)] and load == [8000.0, 4000.0]


def test_absorb_keeps_capacity_the_zigzag_minimum_and_the_busiest_rank() -> None:
    # rank 1 also holds 3000 tokens of little work (7000 of 8000): 3000 more on the ring would give it 1500 (over),
    # 1000 gives it 500
    groups, load, tok = [(0, 1), (0,), (0,), (1,)], [8000.0, 4100.0], [8000, 7000]
    absorb_whole([8000, 3000, 1000, 3000], 8000, groups, [8000.0, 3000.0, 1000.0, 100.0], load, tok)
    assert groups == [(0, 1), (0,), (0, 1), (1,)] and tok == [7500, 7500]
    # sequences under 2 g tokens cannot be zigzag-split: they stay
    groups, load, tok = [(0, 1), (0,)], [8000.0, 4000.0], [4003, 4000]
    absorb_whole([8000, 3], 10 ** 6, groups, [8000.0, 4000.0], load, tok)
    assert groups == [(0, 1), (0,)]
    # only the busiest rank gives: rank 1's lump is not taken while rank 0 is busier and holds nothing whole
    groups, load, tok = [(0, 1), (1,)], [9000.0, 5000.0], [4000, 5000]
    absorb_whole([8000, 1000], 10 ** 6, groups, [8000.0, 1000.0], load, tok)
    assert groups == [(0, 1), (1,)]


def test_packings_absorb_only_when_asked() -> None:
    """WLB-LLM's packing (the peer's, the default) keeps whole documents whole; Zeppelin's absorbs: every changed
    document went from one rank onto a ring over that rank, and the floor falls."""
    cost = _cost("1x8")
    lengths = [16000, 14000] + [500] * 8
    plain = packed_assignments(lengths, cost, 8, head_parallel=True, shard_from=15000)
    taken = packed_assignments(lengths, cost, 8, head_parallel=True, shard_from=15000, absorb=True)
    assert plain is not None and taken is not None
    assert [a.ranks for a in plain[:2]] == [tuple(range(8)), (0,)] and taken[1].ranks == tuple(range(8))
    for old, new in zip(plain, taken):
        assert old == new or (old.placement == "local" and old.ranks[0] in new.ranks and len(new.ranks) == 8)
    options = PlannerOptions()
    assert packed_floor(lengths, taken, cost, options) < packed_floor(lengths, plain, cost, options)
    batch = long_tailed_batch(1 << 18, 0)
    assert all(packed_groups(batch, cost, cp) == packed_groups(batch, cost, cp, absorb=False) for cp in (2, 4, 8))


def test_quick_floor_bounds_an_absorbing_packing() -> None:
    """The longest whole document (14000) is absorbed into the group's ring: the packing's floor (461 ms) is far
    below that document's time on one GPU, which quick_floor without ``absorb`` takes as a bound (1362 ms); with
    it, the lesser of the two (216 ms) bounds the floor."""
    cost = _cost("1x8")
    options = PlannerOptions()
    lengths = [16000, 14000] + [500] * 8
    taken = packed_assignments(lengths, cost, 8, head_parallel=True, shard_from=15000, absorb=True)
    assert taken is not None
    floor = packed_floor(lengths, taken, cost, options)
    longest = sorted(lengths, reverse=True)
    assert quick_floor(longest, cost, 8, options, shard_from=15000) > floor
    assert quick_floor(longest, cost, 8, options, shard_from=15000, absorb=True) <= floor


def test_plan_step_gets_the_absorbing_packing() -> None:
    """Llama-7B arxiv-64k on 4 x 8 GPUs, 256k tokens, batch 0 (24 documents): the absorbing packing predicts 7% faster
    under the engine's charges than the best packing without it (both without the trades after, which move documents
    between rings too: test_whole_moves.py)."""
    cost = _cost("4x8")
    b = sample_steps("arxiv-64k", 1, 1 << 18, 0)[0]
    plain = plan_step(b, cost, PlannerOptions(packed_absorb=False, packed_moves=False))
    taken = plan_step(b, cost, PlannerOptions(packed_moves=False))
    assert taken.origin == "packed"
    assert predict(taken, cost, charges=CHARGES).step_ms < 0.95 * predict(plain, cost, charges=CHARGES).step_ms
    assert sum(s.placement == "local" for s in taken.sequences) < sum(s.placement == "local" for s in plain.sequences)
    with pytest.raises(PlanError, match="packed_absorb is 1, expected True or False"):
        PlannerOptions(packed_absorb=1)  # type: ignore[arg-type]
