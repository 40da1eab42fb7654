"""Ring parts (planner/ring_parts.py): a head-parallel ring of several sequences run as two or three rings over the
same ranks, the rule that decides it, the plan field that records it (``SequencePlan.part``), and what follows from it:
rings, ring order, local slots, JSON, validation, lowering, prediction and simulation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.cost_heads import head_ring_time
from zeppelin_megatron.planner.lowering import Post, lower
from zeppelin_megatron.planner.plan import LocalSlot, PlanError, SequencePlan, StepPlan
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.planner.ring_parts import best_parts, parts_time, shares, split_rings
from zeppelin_megatron.sim.simulator import simulate
from zigzag_plans import zigzag_plan

NODE = tuple(range(8))


def _cost(spec: str = "1x8", model: str | None = None) -> CostModel:
    return CostModel(model=load_model(model), cluster=load_cluster(spec))


def test_two_shares_examples() -> None:
    assert shares([3000, 8192, 6144, 100], 2) == [[1], [2, 0, 3]]
    assert shares([5, 5], 2) == [[0], [1]]  # ties: A, lower index first
    assert shares([4, 3, 3, 2], 2) == [[0, 3], [1, 2]]  # 16 | 9, 18 | 9, 18 | 13


def test_shares_docstring_example() -> None:
    assert shares([3000, 8192, 6144, 100], 2) == [[1], [2, 0, 3]]
    assert shares([3000, 8192, 6144, 100], 3) == [[1], [2], [0, 3]]  # each part gets one of the three longest first
    assert shares([5, 5, 5], 3) == [[0], [1], [2]]  # ties: the lower part, lower index first


def test_three_parts_where_their_timeline_is_lower() -> None:
    """Three sequences of 32 768, 24 576 and 16 384 tokens on one node (Llama-7B, Ulysses): whole 23.569 ms a layer,
    two parts 22.952, three 22.746 (each part's heads all-to-all under the calls before it): three parts, in order,
    the slot on part 0, predicted as simulated (charged) and faster than two parts."""
    cost = _cost()
    whole, best, parts = best_parts(cost, NODE, [32768, 24576, 16384], 8)
    assert (round(whole, 3), round(best, 3), parts) == (23.569, 22.746, [[0], [1], [2]])
    assert round(parts_time(cost, NODE, [[32768], [24576, 16384]], 8)[0], 3) == 22.952  # two parts
    with pytest.raises(ValueError, match="need at least 2"):
        best_parts(cost, NODE, [32768], 8)
    seqs = [(32768, NODE, 8), (24576, NODE, 8), (16384, NODE, 8)]
    slotted = split_rings(zigzag_plan(seqs, 1, 8, local=((700, 3),), slots=(LocalSlot(3, 0, -1, (3,)),)), cost)
    assert [s.part for s in slotted.sequences] == [0, 1, 2, 0]
    assert [(r.seqs, r.part) for r in slotted.rings] == [((0,), 0), ((1,), 1), ((2,), 2)]
    assert slotted.local_slots == (LocalSlot(3, 0, -1, (3,)),)
    assert StepPlan.from_json(slotted.to_json()) == slotted  # "part": 2 round-trips
    plan = zigzag_plan(seqs, 1, 8)
    parted = split_rings(plan, cost)
    two = plan.evolve(sequences=tuple(replace(s, part=1) if i == 1 else s for i, s in enumerate(plan.sequences)))
    for p in (parted, two):  # 1227.9 / 1229.3 and 1234.4 / 1238.2 ms predicted / simulated
        assert predict(p, cost, charges="zeppelin").step_ms == pytest.approx(simulate(p, cost).step_ms, rel=4e-3)
    assert simulate(parted, cost).step_ms < simulate(two, cost).step_ms < simulate(plan, cost).step_ms


def test_parts_time_is_the_timeline_of_head_ring_times() -> None:
    """One part: the ring's own total; two: the module docstring's timeline, by hand from head_ring_time; the worked
    example's numbers (Llama-7B, 1 x 8, 32 768 and 24 576 tokens)."""
    cost = _cost()
    w = head_ring_time(cost, NODE, [32768, 24576], 8, "zeppelin")
    one = parts_time(cost, NODE, [[32768, 24576]], 8)
    assert one == pytest.approx((w.total, w.a2a_ms), rel=1e-12)
    a = head_ring_time(cost, NODE, [32768], 8, "zeppelin")
    b = head_ring_time(cost, NODE, [24576], 8, "zeppelin")
    a_end = a.heads_ms + a.total - a.a2a_ms
    b_end = max(a_end, a.heads_ms + b.heads_ms) + b.total - b.a2a_ms
    want = max(b_end, a_end + a.tokens_ms) + b.tokens_ms
    total, exposed = parts_time(cost, NODE, [[32768], [24576]], 8)
    assert total == pytest.approx(want, rel=1e-12)
    assert exposed == pytest.approx(want - (a.total - a.a2a_ms) - (b.total - b.a2a_ms), rel=1e-12)
    whole, split, parts = best_parts(cost, NODE, [32768, 24576], 8)  # two lengths: two parts only
    assert parts == [[0], [1]]
    assert (round(whole, 3), round(split, 3)) == (20.107, 19.63)
    assert round(a_end, 3) == 12.455 and round(b_end, 3) == 19.424
    with pytest.raises(ValueError, match="need at least 2"):
        best_parts(cost, NODE, [32768], 8)


def test_split_where_the_timeline_says_and_the_simulator_agrees() -> None:
    """The worked example is split, parts in order, predicted as simulated (the parts' timeline, charged) and faster
    than the whole ring; 8192 + 6144 tokens are not split (the plan returned as is)."""
    cost = _cost()
    plan = zigzag_plan([(32768, NODE, 8), (24576, NODE, 8)], 1, 8)
    parted = split_rings(plan, cost)
    assert [s.part for s in parted.sequences] == [0, 1]
    assert [(r.seqs, r.part) for r in parted.rings] == [((0,), 0), ((1,), 1)]
    for p in (plan, parted):
        assert predict(p, cost, charges="zeppelin").step_ms == pytest.approx(simulate(p, cost).step_ms, rel=2e-3)
    assert simulate(parted, cost).step_ms < simulate(plan, cost).step_ms - 10  # 1031.1 -> 1016.4 ms
    small = zigzag_plan([(8192, NODE, 8), (6144, NODE, 8)], 1, 8)
    assert split_rings(small, cost) is small
    plain = zigzag_plan([(32768, NODE, 1), (24576, NODE, 1)], 1, 8)
    assert split_rings(plain, cost) is plain  # plain rings are never split


def test_slots_move_to_the_first_part_and_parts_run_in_order() -> None:
    """A step -1 slot of the split ring stays in it, on part 0, which runs first; the lowering gives each part its
    own all-to-alls (the later part's heads posted up front) and the two share no transfer."""
    cost = _cost()
    plan = zigzag_plan([(32768, NODE, 8), (24576, NODE, 8)], 1, 8, local=((700, 3),),
                       slots=(LocalSlot(3, 0, -1, (2,)),))
    parted = split_rings(plan, cost)
    assert [r.part for r in parted.rings] == [0, 1]
    assert parted.local_slots == (LocalSlot(3, 0, -1, (2,)),)
    prog = lower(parted).ranks[3]
    posts = [op.transfer for op in prog.forward if isinstance(op, Post)]
    assert [(t.ring, t.kind) for t in posts] == [(0, "heads"), (1, "heads"), (0, "tokens"), (1, "tokens")]
    assert len(lower(parted).transfers) == 4


def test_json_round_trip_and_validation() -> None:
    """``part`` is written only when not 0 (plans without parts keep their documents and digests), read back equal;
    a negative part and a part on a local sequence are refused, naming the sequence and the value."""
    cost = _cost()
    parted = split_rings(zigzag_plan([(32768, NODE, 8), (24576, NODE, 8)], 1, 8), cost)
    text = parted.to_json()
    assert '"part":1' in text and text.count('"part"') == 1
    again = StepPlan.from_json(text)
    assert again == parted and again.rings == parted.rings
    whole = zigzag_plan([(32768, NODE, 8), (24576, NODE, 8)], 1, 8)
    assert '"part"' not in whole.to_json()
    s = whole.sequences
    with pytest.raises(PlanError, match=r"sequence 1 .*part is -1, expected an integer >= 0"):
        StepPlan(nodes=1, gpus_per_node=8, sequences=(s[0], replace(s[1], part=-1)),
                 attention_layout=whole.attention_layout, linear_layout=whole.linear_layout)
    local = zigzag_plan([(32768, NODE, 8)], 1, 8, local=((100, 2),))
    bad = local.sequences[:1] + (SequencePlan(100, "local", (2,), 1, 1),)
    with pytest.raises(PlanError, match=r"sequence 1 .*part is 1, but a local sequence is in no ring"):
        StepPlan(nodes=1, gpus_per_node=8, sequences=bad, attention_layout=local.attention_layout,
                 linear_layout=local.linear_layout)


def test_plan_step_splits_where_it_pays_and_the_ablation_does_not() -> None:
    """Llama-3B prolong-64k on 2 x 8 (docs/BENCHMARKS.md's batch 0, 512k tokens): plan_step runs a head-parallel ring
    in parts; PlannerOptions(ring_parts=False) keeps every ring whole; the parted plan simulates faster, its JSON
    round-trips, and two ranks post their shared transfers in one order (both without whole-document moves, which
    trade on each plan's own ring times)."""
    from zeppelin_megatron.sim.lengths import sample_steps

    cost = _cost("2x8", "configs/models/llama_3b.yaml")
    lengths = sample_steps("prolong-64k", 1, 1 << 19, 0)[0]
    plan = plan_step(lengths, cost, PlannerOptions(packed_moves=False))
    whole = plan_step(lengths, cost, PlannerOptions(ring_parts=False, packed_moves=False))
    assert any(r.part for r in plan.rings) and not any(r.part for r in whole.rings)
    assert [(s.placement, s.ranks, s.a2a) for s in plan.sequences] == [
        (s.placement, s.ranks, s.a2a) for s in whole.sequences]
    assert simulate(plan, cost).step_ms < simulate(whole, cost).step_ms
    assert StepPlan.from_json(plan.to_json()) == plan
    low = lower(plan)
    for a in range(plan.world_size):
        for b in range(a + 1, plan.world_size):
            mine = [op.transfer for op in low.ranks[a].forward + low.ranks[a].backward if isinstance(op, Post)
                    and any({h.sender, h.receiver} == {a, b} for h in low.transfers[op.transfer].hops(1))]
            theirs = [op.transfer for op in low.ranks[b].forward + low.ranks[b].backward if isinstance(op, Post)
                      and any({h.sender, h.receiver} == {a, b} for h in low.transfers[op.transfer].hops(1))]
            assert mine == theirs


def test_plan_summary_names_the_parts() -> None:
    """``zeppelin plan``'s ring line says how many rings are parts of how many (nothing when none is)."""
    from zeppelin_megatron.commands.plan import _head_line

    cost = _cost()
    whole = zigzag_plan([(32768, NODE, 8), (24576, NODE, 8)], 1, 8)
    assert _head_line(whole) == "rings: 1 (0 plain, 1 Ulysses, 0 head-parallel hybrid; block widths [8])"
    assert _head_line(split_rings(whole, cost)) == ("rings: 2 (0 plain, 2 Ulysses, 0 head-parallel hybrid; "
                                                    "block widths [8]; 2 of them parts of 1 ring)")


def test_step_metrics_count_the_sequences_in_parts() -> None:
    """The training log line and the scalars count the split sequences of rings run in parts (none: the line as
    before)."""
    from zeppelin_megatron.megatron.metrics import format_step, plan_metrics, scalars, step_metrics

    cost = _cost()
    whole = zigzag_plan([(32768, NODE, 8), (24576, NODE, 8)], 1, 8)
    parted = split_rings(whole, cost)
    lines = []
    for plan, n in ((whole, 0), (parted, 2)):
        plan = plan.evolve(predicted=predict(plan, cost))
        m = step_metrics(1, [plan_metrics(plan)])
        assert m.in_parts == n and scalars(m)["zeppelin/ring_part_sequences"] == n
        lines.append(format_step(m))
    assert "split: 0 ring, 2 all-to-all, 0 hybrid)" in lines[0]
    assert "split: 0 ring, 2 all-to-all, 0 hybrid, 2 in ring parts)" in lines[1]
