"""Pure tests of :mod:`zeppelin_megatron.planner.lowering` on hand-made and random plans (no process group)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plan_factory import random_plan
from zeppelin_megatron.planner import CostModel, ModelShape, load_cluster
from zeppelin_megatron.planner.lowering import (
    LocalCall, Message, Post, RingCall, RingPart, TransferId, Wait, lower, lower_rank, message_hops,
)
from zeppelin_megatron.planner.lowering_parts import token_rows as _rows
from zeppelin_megatron.planner.plan import LocalSlot, StepPlan
from zeppelin_megatron.planner.routing import Route
from zeppelin_megatron.sim.planbuild import build_plan


def _docstring_plan() -> StepPlan:
    """The module docstring's example: ring (0, 1) of an 8-token sequence, a 3-token local one on rank 0
    in the slot of ring 0 step 0."""
    cluster = load_cluster("1x2", tokens_per_gpu=64)
    cost = CostModel(model=ModelShape(layers=1, hidden=32, q_heads=4, kv_heads=2, ffn=64, head_dim=8), cluster=cluster)
    plan = build_plan([8, 3], [(0, 1), (0,)], cluster, cost, local_slots=False)
    return replace(plan, local_slots=(LocalSlot(0, 0, 0, (1,)),))


def _describe(op: object) -> tuple[object, ...]:
    if isinstance(op, RingCall):
        return (op.kind, op.step, op.q, op.kv)
    if isinstance(op, LocalCall):
        return ("local", op.chunk)
    assert isinstance(op, (Post, Wait))
    return (type(op).__name__.lower(), op.transfer.kind, op.transfer.step)


def test_docstring_example() -> None:
    prog = lower(_docstring_plan())
    r0, r1 = prog.ranks
    assert [_describe(op) for op in r0.forward] == [
        ("post", "kv", 0), ("diag", 0, ((0, 0, 2), (0, 6, 8)), ((0, 0, 2), (0, 6, 8))), ("local", 0),
        ("wait", "kv", 0), ("late", 1, ((0, 6, 8),), ((0, 2, 4), (0, 4, 6)))]
    assert [_describe(op)[:2] for op in r0.backward] == [
        ("post", "kv"), ("diag", 0), ("post", "acc"), ("local", 0), ("wait", "kv"), ("late", 1),
        ("wait", "acc"), ("post", "acc"), ("wait", "acc")]
    assert [_describe(op) for op in r1.forward] == [
        ("post", "kv", 0), ("diag", 0, ((0, 2, 4), (0, 4, 6)), ((0, 2, 4), (0, 4, 6))), ("wait", "kv", 0),
        ("early", 1, ((0, 2, 4), (0, 4, 6)), ((0, 0, 2),))]
    late, early = r0.forward[4], r1.forward[3]
    assert isinstance(late, RingCall) and isinstance(early, RingCall)
    assert (late.lens_q, late.lens_k, late.q_rows, late.kv_rows) == ((2,), (4,), (2, 3), (0, 1, 2, 3))
    assert not late.causal
    assert (early.lens_q, early.lens_k, early.q_rows, early.kv_rows) == ((4,), (2,), (0, 1, 2, 3), (0, 1))
    assert r0.rings[0].rows == (0, 1, 2, 3) and r0.local_chunks[0].rows == (4, 5, 6) and r0.local_chunks[0].lens == (3,)
    kv = prog.transfers[TransferId(0, 0, "kv")]
    assert [(m.src, m.dst, m.tokens) for m in kv.messages] == [(0, 1, 4), (1, 0, 4)]
    assert [(h.sender, h.receiver, h.count, h.tag) for h in kv.hops(3)] == [(0, 1, 12, 0), (1, 0, 12, 1)]
    assert prog.transfers[TransferId(0, 1, "acc")].hops(1)[0].tag == 1 << 20
    assert TransferId(0, 1, "kv") not in prog.transfers  # no K/V hop after the last step
    assert prog.remaps is None  # build_plan's layouts move nothing here


def test_ring_part_worked_example() -> None:
    part = RingPart(ring=0, ranks=(5, 2), placement="inter_node", seqs=(3, 4), lengths=(8, 9), position=0, layout=())
    # 8 = 2+2+2+2; 9 = 3+2+2+2
    assert part.lens(0) == (4, 5) and part.lens(1) == (4, 4) and part.tokens(0) == 9
    assert part.seq_major(0, "early")[0] == (0, 1, 4, 5, 6) and part.seq_major(0, "late")[0] == (2, 3, 7, 8)
    assert part.seq_major(1)[1] == ((3, 2, 4), (3, 4, 6), (4, 3, 5), (4, 5, 7))


def test_rows_follow_token_order_not_buffer_order() -> None:
    assert _rows([(0, 4, 10), (4, 6, 0)], 3, 5) == [13, 0]
    with pytest.raises(ValueError, match="not all"):
        _rows([(0, 4, 0)], 2, 6)


def test_message_hops_worked_example() -> None:
    m = (Message(src=1, dst=6, tokens=10, route=Route((1, 6), 1, 6, (1, 0, 3))),)
    hops = [(h.round, h.sender, h.receiver, h.offset, h.count, h.tag) for h in message_hops(m, (10,), 4)]
    assert hops == [(0, 1, 6, 0, 4, 0), (0, 1, 0, 4, 3, 1), (0, 1, 3, 7, 3, 2),
                    (1, 0, 4, 4, 3, 0), (1, 3, 7, 7, 3, 1), (2, 4, 6, 4, 3, 0), (2, 7, 6, 7, 3, 1)]
    # rail partner is the destination itself: no combine hop
    m = (Message(src=0, dst=5, tokens=4, route=Route((0, 5), 0, 5, (0, 1))),)
    assert [(h.round, h.sender, h.receiver) for h in message_hops(m, (4,), 4)] == [(0, 0, 5), (0, 0, 1), (1, 1, 5)]
    assert [(h.round, h.sender, h.receiver, h.count) for h in message_hops((Message(src=0, dst=5, tokens=4),), (4,), 4)
            ] == [(0, 0, 5, 4)]
    with pytest.raises(ValueError, match="to itself"):
        message_hops((Message(src=2, dst=2, tokens=1),), (1,), 4)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_hops_cover_every_element_once(seed: int) -> None:
    plan = random_plan(seed, 2, 4)
    for t in lower(plan).transfers.values():
        hops = t.hops(6)
        for i, m in enumerate(t.messages):
            final = sorted((h.offset, h.offset + h.count) for h in hops if h.msg == i and h.receiver == m.dst)
            assert final[0][0] == 0 and final[-1][1] == m.tokens * 6
            assert all(a[1] == b[0] for a, b in zip(final, final[1:]))
        for r in range(3):  # tags: the hop's index in its round, on both ends
            tags = [h.tag for h in hops if h.round == r]
            assert tags == list(range(t.tag_base, t.tag_base + len(tags)))


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_programs_cover_the_attention_buffer_and_follow_the_slots(seed: int) -> None:
    plan = random_plan(seed, 2, 4)
    prog = lower(plan)
    seen = {"slot": False, "leftover": False, "relay": False}
    for rank, rp in enumerate(prog.ranks):
        assert rp == lower_rank(plan, rank)
        rows = [r for p in rp.rings for r in p.rows] + [r for c in rp.local_chunks for r in c.rows]
        assert sorted(rows) == list(range(plan.tokens(rank, "attention")))
        assert [p.ring for p in rp.rings] == sorted(p.ring for p in rp.rings)  # queue order
        mine = sorted((x.ring, x.step, x.seqs) for x in plan.local_slots if x.rank == rank)
        slots = [(op.ring, op.step, rp.local_chunks[op.chunk].seqs) for op in rp.forward
                 if isinstance(op, LocalCall) and op.ring is not None]
        assert slots == mine
        left = [i for i, s in enumerate(plan.sequences) if s.placement == "local" and s.ranks == (rank,)
                and all(i not in seqs for _, _, seqs in mine)]
        tail = [op for op in rp.forward if isinstance(op, LocalCall) and op.ring is None]
        assert [rp.local_chunks[op.chunk].seqs for op in tail] == ([tuple(left)] if left else [])
        for part in rp.rings:
            g = part.size
            calls = [op for op in rp.forward if isinstance(op, RingCall) and op.ring == part.ring]
            if part.position is None:  # relay: the ring's transfers, no compute
                assert not calls and rank not in part.ranks
                seen["relay"] = True
                continue
            assert [c.step for c in calls] == list(range(g)) and calls[0].kind == "diag"
            for c in calls:  # every query row of the ring sees every key chunk once over the steps
                assert sum(c.lens_q) == len(c.q_rows) and sum(c.lens_k) == len(c.kv_rows)
            posts = [op.transfer for op in rp.forward if isinstance(op, Post) and op.transfer.ring == part.ring]
            assert posts == [TransferId(part.ring, j, "kv") for j in range(g - 1)]
            acc = [op.transfer for op in rp.backward if isinstance(op, Wait) and op.transfer.kind == "acc"
                   and op.transfer.ring == part.ring]
            assert acc == [TransferId(part.ring, j, "acc") for j in range(g)]
        seen["slot"] |= bool(mine)
        seen["leftover"] |= bool(left)
    assert all(seen.values()), seen


def test_routing_off_has_no_relays_and_direct_hops() -> None:
    plan = random_plan(3, 2, 4)
    assert plan.routing
    off = lower(plan, routing=False)
    for t in off.transfers.values():
        assert all(m.route is None for m in t.messages) and all(h.round == 0 for h in t.hops(1))
    for rp in off.ranks:
        assert all(p.position is not None for p in rp.rings)


def test_remaps_list_the_moved_rows() -> None:
    plan = random_plan(3, 2, 4)
    prog = lower(plan)
    assert prog.remaps is not None
    fwd, back = prog.remaps
    moved = sum(seg.length for seg in plan.remap.segments if seg.lin_rank != seg.att_rank)
    assert sum(n for _, _, n in fwd.pair_rows) == moved == sum(n for _, _, n in back.pair_rows)
    assert sorted((b, a, n) for a, b, n in fwd.pair_rows) == list(back.pair_rows)
    for remap in prog.remaps:
        pieces = remap.chains(plan.gpus_per_node)
        assert sum(n for _, n in pieces) == moved
        assert all(path[0] != path[-1] and len(path) >= 2 for path, _ in pieces)


def test_lower_rank_rejects_a_rank_outside_the_plan() -> None:
    plan = random_plan(3, 1, 2)
    with pytest.raises(ValueError, match=r"rank 2 is outside the plan's \[0, 2\)"):
        lower_rank(plan, 2)


def test_lowering_is_pure_and_deterministic() -> None:
    import subprocess
    import sys

    code = ("import sys, zeppelin_megatron.planner.lowering as m; "
            "assert not any(n == 'torch' or n.startswith('torch.') for n in sys.modules), 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
    plan = random_plan(5, 2, 4)
    a, b = lower(plan), lower(plan)
    assert a.ranks == b.ranks and a.transfers == b.transfers and a.remaps == b.remaps
    assert [op for op in a.ranks[3].forward] == [op for op in b.ranks[3].forward]


def test_rank_remap_is_direct_or_the_three_routed_phases() -> None:
    from zeppelin_megatron.planner.lowering import rank_remap

    plan = random_plan(3, 2, 4)
    routed = replace(plan, remap_proxies=(0, 2)) if not plan.remap_proxies else plan
    direct = replace(plan, remap_proxies=())
    for rank in range(plan.world_size):
        for direction in ("to_attention", "to_linear"):
            ex, none = rank_remap(direct, rank, direction)
            assert none is None and ex.send_counts == direct.remap.exchange(rank, direction).send_counts
            ex2, phases = rank_remap(routed, rank, direction)
            assert phases is not None and len(phases.phases) == 3
            assert ex2.recv_counts == ex.recv_counts  # the routed phases end in the direct exchange's rows
            assert len(phases.final_index) == sum(ex.recv_counts)
