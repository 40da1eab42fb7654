"""Plans from ``plan_step`` run the engine's view path (contiguous rows), exact and traced on gloo; the
unit checks of the spans the engine and the simulator read (``RingPart.span``, ``LocalChunk.span``)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import contiguous_workers
from dist_harness import spawn
from plan_factory import random_plan
from zeppelin_megatron.planner.lowering import lower
from zeppelin_megatron.planner.lowering_parts import ranges_span, row_span


def test_row_span_examples() -> None:
    assert row_span((4, 5, 6)) == (4, 7)
    assert row_span((4, 6)) is None
    assert row_span((5, 4)) is None
    assert row_span(()) == (0, 0)
    layout = ((0, 0, 4), (1, 0, 3))
    assert ranges_span(layout, [(0, 2, 4), (1, 0, 2)]) == (2, 6)
    assert ranges_span(layout, [(1, 0, 2), (0, 2, 4)]) is None
    assert ranges_span(((0, 0, 2), (0, 2, 4)), [(0, 1, 3)]) == (1, 3)  # over two adjacent layout ranges
    assert ranges_span(((0, 2, 4), (0, 0, 2)), [(0, 1, 3)]) is None  # rows 3, 0
    with pytest.raises(ValueError, match=r"tokens \[3, 5\)"):
        ranges_span(layout, [(0, 3, 5)])


@pytest.mark.parametrize("seed", range(6))
def test_spans_agree_with_the_rows(seed: int) -> None:
    """``span`` (from ranges) is ``row_span(rows)`` (from every row) on random plans (shuffled ranges)
    and on those plans with their layouts in engine order."""
    from zeppelin_megatron.planner.api import engine_order

    plan = random_plan(seed, 2, 4, n_head_rings=1 if seed % 2 else 0)
    ordered = engine_order(plan)
    found = {True: 0, False: 0}
    for p, contiguous in ((plan, None), (ordered, True)):
        for prog in lower(p).ranks:
            for part in prog.rings:
                assert part.span == row_span(part.rows), (seed, part.ring)
                if contiguous:
                    assert part.span is not None
                found[part.span is None] += 1
            for c in prog.local_chunks:
                assert c.span == row_span(c.rows), (seed, c.seqs)
                if contiguous:
                    assert c.span is not None
                found[c.span is None] += 1
    assert found[True] > 0, "random plans shuffle ranges: some rows are not contiguous"


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_plan_step_plans_world_4() -> None:
    spawn(4, contiguous_workers.run_contiguous)


def test_whole_chunk_is_the_one_local_call_over_the_buffer() -> None:
    """``RankProgram.whole_chunk``: 0 for a rank whose only work is one local call over its whole buffer in order
    and no remap; None for a rank in a ring, or whose chunk runs in place on linear rows."""
    from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, load_model, plan_step

    cost = CostModel(model=load_model(None), cluster=load_cluster("2x2", tokens_per_gpu=96))
    packed = plan_step([150, 40, 37, 33, 29, 21, 11, 9, 5], cost)
    progs = lower(packed).ranks
    ringed = {r for ring in packed.rings for r in ring.ranks}
    assert ringed and len(ringed) < 4
    assert [p.whole_chunk for p in progs] == [None if r in ringed else 0 for r in range(4)]
    remapped = plan_step([150, 40, 37, 33, 29, 21, 11, 9, 5], cost, PlannerOptions(packed=False, remap=True))
    assert remapped.linear_layout != remapped.attention_layout
    for p in lower(remapped).ranks:
        assert p.whole_chunk is None or not any(c.linear_rows for c in p.local_chunks)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
@pytest.mark.parametrize("spec", ["1x2", "2x2", "2x3", "2x4"])
def test_whole_local_ranks(spec: str) -> None:
    nodes, gpn = map(int, spec.split("x"))
    spawn(nodes * gpn, contiguous_workers.run_whole, spec)


def test_wide_span_plans_world_8() -> None:
    """A packed plan with a wide span (planner/packed_wide.py: a ring over 4 ranks beside rings over 2 on the same
    ranks), head-parallel and plain, exact on gloo at world size 8 (2 x 4)."""
    spawn(8, contiguous_workers.run_wide)


@pytest.mark.parametrize("world", [2, 4, 6, 8])
def test_ring_parts_exact(world: int) -> None:
    """Head-parallel rings in parts (planner/ring_parts.py: several rings over the same ranks at the same width,
    Ulysses and hybrid, with step -1 slots in parts) exact on gloo at world sizes 2, 4, 6, 8 (1x2, 2x2, 2x3, 2x4):
    float64 GQA and float32 MHA against per-sequence SDPA, outputs and gradients, and the lowered trace."""
    spawn(world, contiguous_workers.run_parts)
