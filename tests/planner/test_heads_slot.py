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
    once). In the step -1 slot the call runs while the heads all-to-all flows: each call starts when its rank
    posts the all-to-all, and no wait is left after it. After the ring it runs while the tokens all-to-all
    flows (the lowering waits that one last): no wait for it is left after the call. One block's heads and
    tokens all-to-alls carry the same bytes (forward q, k, v and backward dout against forward out and
    backward dq, dk, dv, all in the training dtype), so the two layers are equally long (no charges: kernels
    and transfers only), and shorter by one all-to-all than the ring's own time with the call after it."""
    cost = _cost(1, 4)
    plan = _plan([(8192, (0, 1, 2, 3), 4)], 1, 4, local=tuple((2500, r) for r in range(4)))
    slots = replace(plan, local_slots=tuple(LocalSlot(r, 0, -1, (1 + r,)) for r in range(4)))
    h = 2 * 0.005 + 3 * 2048 * 8192 / 4e8  # tests/sim/test_head_rings.py: 3 flows of 2048 tokens x 8192 B per port,
    # two messages (runs) for the pairs of lanes 0-2: twice the latency
    local = max(cost.local_ms(2500), cost.call_overhead_ms)
    assert local > h
    after = simulate(plan, cost, charges="none")
    inside = simulate(slots, cost, charges="none")
    assert after.layer_ms == pytest.approx(inside.layer_ms, rel=1e-12)
    for r in range(4):
        ev = [e for e in inside.events if e.rank == r]
        lin, call, kernel = ev[0], ev[1], ev[2]
        assert (lin.kind, call.kind, kernel.kind) == ("linear", "local", "attention")
        assert call.start == lin.end and kernel.start == call.end  # posted, called, no wait left after it
        assert not [e for e in ev if "to heads" in e.label]  # the all-to-all ended under the call
        bare = [e for e in after.events if e.rank == r]
        heads = next(e for e in bare if "to heads" in e.label)
        assert heads.end - heads.start == pytest.approx(h, rel=1e-9)
        kernel, call, lin = bare[2], bare[3], bare[4]
        assert (kernel.kind, call.kind, lin.kind) == ("attention", "local", "linear")
        assert call.start == kernel.end and lin.start == call.end  # the tokens all-to-all ended under the call
        assert not [e for e in bare if "to tokens" in e.label]
        assert lin.start - heads.start == pytest.approx(h + (kernel.end - kernel.start) + local, rel=1e-9)


def test_lowering_posts_heads_first_and_waits_tokens_last() -> None:
    """lowering.py's example: Ulysses ring 0 over ranks (0, 1) with rank 0's local sequence in its step -1 slot,
    a plain ring 1 over (0, 2), a Ulysses ring 2 over (0, 3) (1 x 4 GPUs): rank 0 posts both heads all-to-alls
    first and waits both tokens ones last, so ring 2's heads and ring 0's tokens all-to-alls flow under ring 1;
    backward alike. The other ranks, in one ring each, keep the bracket of their ring."""
    plan = _plan([(64, (0, 1), 2), (40, (0, 2), 1), (24, (0, 3), 2)], 1, 4, local=((5, 0),),
                 slots=(LocalSlot(0, 0, -1, (3,)),))
    assert [(r.ranks, r.a2a) for r in plan.rings] == [((0, 1), 2), ((0, 2), 1), ((0, 3), 2)]
    low = lower(plan)
    ring1 = [("Post", "kv"), ("diag", 0), ("Wait", "kv"), ("late", 1)]
    assert _kinds(low.ranks[0].forward) == [
        ("Post", "heads"), ("Post", "heads"), ("Local", -1), ("Wait", "heads"), ("diag", 0), ("Post", "tokens"),
        *ring1, ("Wait", "heads"), ("diag", 0), ("Post", "tokens"), ("Wait", "tokens"), ("Wait", "tokens")]
    rings = [op.transfer.ring for op in low.ranks[0].forward if isinstance(op, (Post, Wait))
             and op.transfer.kind in ("heads", "tokens")]
    assert rings == [0, 2, 0, 0, 2, 2, 0, 2]
    back = _kinds(low.ranks[0].backward)
    assert back[:4] == [("Post", "heads"), ("Post", "heads"), ("Local", -1), ("Wait", "heads")]
    assert back[-5:] == [("Wait", "heads"), ("diag", 0), ("Post", "tokens"), ("Wait", "tokens"), ("Wait", "tokens")]
    for r, kinds in ((1, "heads"), (3, "heads")):
        assert _kinds(low.ranks[r].forward) == [("Post", kinds), ("Wait", kinds), ("diag", 0), ("Post", "tokens"),
                                                ("Wait", "tokens")]


def _shared_order(program: object, other: int, transfers: dict) -> list[object]:
    """The transfers of ``program`` (posts in op order) that have a message between its rank and ``other``."""
    me: int = program.rank  # type: ignore[attr-defined]
    out = []
    for op in program.forward + program.backward:  # type: ignore[attr-defined]
        t = transfers[op.transfer] if isinstance(op, Post) else None
        if t is not None and any({h.sender, h.receiver} == {me, other} for h in t.hops(1)):
            out.append(op.transfer)
    return out


@pytest.mark.parametrize("spec,seed,packed", [("2x4", 25, False), ("4x8", 1, False), ("2x8", 5, True),
                                              ("4x8", 1, True)])
def test_two_ranks_post_their_shared_transfers_in_one_order(spec: str, seed: int, packed: bool) -> None:
    """NCCL matches point-to-point calls between two ranks by order: on plans of long-tailed batches (16k tokens a
    GPU; ranks in a head-parallel ring and another ring, the partitioner's routed rings with a relay on 2 x 4,
    packed plans with wide spans), every pair of ranks posts the transfers they exchange messages in (K/V,
    accumulators, all-to-alls; relays' hops included) in the same order."""
    from zeppelin_megatron.planner import PlannerOptions, load_cluster, plan_step
    from zeppelin_megatron.planner.routing import outside_relays
    from zeppelin_megatron.planner.workloads import long_tailed_batch

    cluster = load_cluster(spec)
    cost = CostModel(model=load_model(None), cluster=cluster)
    plan = plan_step(long_tailed_batch(cluster.world_size * (1 << 14), seed), cost, PlannerOptions(packed=packed))
    low = lower(plan)
    assert any(len(r.rings) >= 2 and any(p.a2a > 1 for p in r.rings) for r in low.ranks)
    if spec == "2x4":  # a relay outside its ring (seed 0 had one until relays' waits were charged, 2026-11-28)
        assert any(outside_relays(g.ranks, plan.routes_for(g.ranks).values(), 4) for g in plan.rings if g.a2a == 1)
    pairs = {(h.sender, h.receiver) for t in low.transfers.values() for h in t.hops(1)}
    for a, b in sorted(pairs):
        assert _shared_order(low.ranks[a], b, low.transfers) == _shared_order(low.ranks[b], a, low.transfers)
