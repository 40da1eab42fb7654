"""The local slot inside a head-parallel ring's ``heads`` all-to-all (``LocalSlot(..., step=-1, ...)``):
validation and JSON, lowering (the call between ``Post`` and ``Wait`` of ``heads``), the planner's timeline
and schedule (a member ahead of its block's last lane waits there), and the simulator (the call overlaps the
all-to-all)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zeppelin_megatron.planner import Cluster, CostModel, load_model
from zeppelin_megatron.planner.local_schedule import ring_timeline, schedule_local
from zeppelin_megatron.planner.lowering import LocalCall, Post, RingCall, TransferId, Wait, lower
from zeppelin_megatron.planner.plan import LocalSlot, PlanError, StepPlan
from zeppelin_megatron.planner.cost_heads import head_ring_time
from zeppelin_megatron.sim.simulator import simulate
from zigzag_plans import zigzag_plan


_plan = zigzag_plan


def _cost(nodes: int, gpn: int) -> CostModel:
    cl = Cluster(nodes=nodes, gpus_per_node=gpn, nics_per_node=gpn, gpu_nic=tuple(range(gpn)), nvlink_GBps=400.0,
                 nic_Gbps=400.0, tokens_per_gpu=1 << 20, nvlink_latency_us=5.0, nic_latency_us=10.0)
    return CostModel(model=replace(load_model(None), layers=1), cluster=cl)  # Llama-7B shape, one layer


def _kinds(ops: tuple[object, ...]) -> list[tuple[str, object]]:
    return [(type(op).__name__, op.transfer.kind) if isinstance(op, (Post, Wait)) else  # type: ignore[attr-defined]
            ("Local", op.step) if isinstance(op, LocalCall) else (op.kind, op.step)  # type: ignore[attr-defined]
            for op in ops]


def test_lowering_puts_the_call_inside_the_heads_all_to_all() -> None:
    """Hybrid ring (16 tokens over ranks 0-3 of 2 x 2 GPUs, a2a 2) and local sequence 1 (5 tokens) of
    rank 1 at step -1, sequence 2 (3 tokens) at step 0: rank 1 posts the heads all-to-all, runs sequence
    1, waits; the step-0 slot stays after the diagonal kernel. Backward alike."""
    plan = _plan([(16, (0, 1, 2, 3), 2)], 2, 2, local=((5, 1), (3, 1)),
                 slots=(LocalSlot(1, 0, -1, (1,)), LocalSlot(1, 0, 0, (2,))))
    r1 = lower(plan).ranks[1]
    assert [c.seqs for c in r1.local_chunks] == [(1,), (2,)]  # slots in ring and step order: -1 first
    assert _kinds(r1.forward) == [("Post", "heads"), ("Local", -1), ("Wait", "heads"), ("Post", "kv"),
                                  ("diag", 0), ("Local", 0), ("Wait", "kv"), ("late", 1), ("Post", "tokens"),
                                  ("Wait", "tokens")]
    assert _kinds(r1.backward) == [("Post", "heads"), ("Local", -1), ("Wait", "heads"), ("Post", "kv"),
                                   ("diag", 0), ("Post", "acc"), ("Local", 0), ("Wait", "kv"), ("late", 1),
                                   ("Wait", "acc"), ("Post", "acc"), ("Wait", "acc"), ("Post", "tokens"),
                                   ("Wait", "tokens")]
    call = r1.forward[1]
    assert isinstance(call, LocalCall) and (call.chunk, call.ring, call.step) == (0, 0, -1)
    assert r1.forward[0] == Post(TransferId(0, 0, "heads")) and r1.forward[2] == Wait(TransferId(0, 0, "heads"))
    # the other ranks' programs do not change
    bare = lower(replace(plan, local_slots=()))
    for r in (0, 2, 3):
        assert lower(plan).ranks[r].forward == bare.ranks[r].forward


def test_ulysses_slot_and_validation() -> None:
    """Ulysses (one block) has only step -1; a plain ring has none; JSON keeps -1 and names -2."""
    plan = _plan([(12, (0, 1, 2), 3), (8, (1, 2), 1)], 1, 3, local=((4, 0), (6, 2)))
    uly = next(k for k, r in enumerate(plan.rings) if r.a2a == 3)
    ring = 1 - uly
    ok = replace(plan, local_slots=(LocalSlot(0, uly, -1, (2,)), LocalSlot(2, uly, -1, (3,))))
    ops = [op for op in lower(ok).ranks[0].forward if not isinstance(op, RingCall)]
    assert ops == [Post(TransferId(uly, 0, "heads")), LocalCall(chunk=0, ring=uly, step=-1),
                   Wait(TransferId(uly, 0, "heads")), Post(TransferId(uly, 0, "tokens")),
                   Wait(TransferId(uly, 0, "tokens"))]
    assert StepPlan.from_json(ok.to_json()) == ok
    assert '"step":-1' in ok.to_json()
    with pytest.raises(PlanError, match=r"step must be in \[-1, -1\] for a ring of 1 positions \(a2a 3; -1: "
                                        r"inside its heads all-to-all\)"):
        replace(plan, local_slots=(LocalSlot(0, uly, 0, (2,)),))
    with pytest.raises(PlanError, match=rf"local_slots\[0\] \(rank 2, ring {ring}, step -1\): step -1 \(inside the "
                                        rf"heads all-to-all\) needs a head-parallel ring, ring {ring} is plain"):
        replace(plan, local_slots=(LocalSlot(2, ring, -1, (3,)),))
    doc = ok.to_dict()
    doc["local_slots"][0]["step"] = -2
    with pytest.raises(PlanError, match=r"local_slots\[0\]\.step must be an integer >= -1, got -2"):
        StepPlan.from_json(doc)
    with pytest.raises(PlanError, match="a second slot at the same ring step"):
        replace(plan, local_slots=(LocalSlot(2, uly, -1, (3,)), LocalSlot(2, uly, -1, (3,))))


def test_timeline_gap_is_the_wait_for_the_blocks_last_lane() -> None:
    """A plain ring over ranks (0, 1) of 24000 tokens, then Ulysses over 0-3 of 8000: ranks 2 and 3 are
    free at 0 and wait inside the heads all-to-all until ranks 0 and 1 are free (``T``) and the
    all-to-all is done (``h``): gap ``T + h``; ranks 0 and 1 wait ``h`` (too short for a call). Rank 2's
    local sequence (well under ``T``) goes there, rank 0's after the rings."""
    cost = _cost(1, 4)
    plan = _plan([(24000, (0, 1), 1), (8000, (0, 1, 2, 3), 4)], 1, 4, local=((3000, 2), (3000, 0)))
    assert [(r.ranks, r.a2a) for r in plan.rings] == [((0, 1), 1), ((0, 1, 2, 3), 4)]
    arrive: dict[tuple[int, int], float] = {}
    gaps, free = ring_timeline(plan, cost, arrive)
    t = arrive[(0, 1)]
    h = head_ring_time(cost, (0, 1, 2, 3), [8000], 4)
    assert t > 0 and arrive[(2, 1)] == 0.0 and arrive[(1, 1)] == t
    assert gaps[(2, 1, -1)] == pytest.approx(t + h.heads_ms) and gaps[(3, 1, -1)] == pytest.approx(t + h.heads_ms)
    assert gaps[(0, 1, -1)] == pytest.approx(h.heads_ms) and h.heads_ms < cost.call_overhead_ms
    assert cost.local_ms(3000) < t
    assert free[2] == free[0] > t + h.heads_ms  # every lane leaves with the tokens all-to-all
    # rank 0's sequence: no gap (its Ulysses ring is its filling ring, so it overflows into step -1 there)
    assert schedule_local(plan, cost) == (LocalSlot(0, 1, -1, (3,)), LocalSlot(2, 1, -1, (2,)))


def test_simulated_call_overlaps_the_all_to_all() -> None:
    """Ulysses over the 4 GPUs of a node, one local sequence per rank (equal tokens, so every rank posts at
    once). In the step -1 slot the call runs while the heads all-to-all flows: the layer is shorter by
    exactly the all-to-all's time than with the calls after the ring (no charges: kernels and transfers
    only); each call starts when its rank posts the all-to-all, and no wait is left after it."""
    cost = _cost(1, 4)
    plan = _plan([(8192, (0, 1, 2, 3), 4)], 1, 4, local=tuple((2500, r) for r in range(4)))
    slots = replace(plan, local_slots=tuple(LocalSlot(r, 0, -1, (1 + r,)) for r in range(4)))
    h = 0.005 + 3 * 2048 * 8192 / 4e8  # tests/sim/test_head_rings.py: 3 flows of 2048 tokens x 8192 B per port
    local = max(cost.local_ms(2500), cost.call_overhead_ms)
    assert local > h
    after = simulate(plan, cost, charges="none")
    inside = simulate(slots, cost, charges="none")
    assert after.layer_ms - inside.layer_ms == pytest.approx(h, rel=1e-9)
    for r in range(4):
        ev = [e for e in inside.events if e.rank == r]
        lin, call, kernel = ev[0], ev[1], ev[2]
        assert (lin.kind, call.kind, kernel.kind) == ("linear", "local", "attention")
        assert call.start == lin.end and kernel.start == call.end  # posted, called, no wait left after it
        assert not [e for e in ev if "to heads" in e.label]  # the all-to-all ended under the call
        bare = [e for e in after.events if e.rank == r]
        heads = next(e for e in bare if "to heads" in e.label)
        assert heads.end - heads.start == pytest.approx(h, rel=1e-9)
