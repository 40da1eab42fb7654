"""The engine's lowered program and device-side indices are built once per plan, not once per layer."""

from __future__ import annotations

import pytest
import torch

from plan_factory import random_plan
from zeppelin_megatron.planner.lowering import Post, RingCall, lower_rank
from zeppelin_megatron.runtime.engine import cached_program, device_program
from zeppelin_megatron.runtime.heads import HeadShape, heads_problem, transfer_unit

CPU = torch.device("cpu")


def test_device_program_is_built_once_per_plan_and_matches_the_lowered_program() -> None:
    plan = random_plan(11, 2, 4)
    shape = HeadShape(4, 2, 3)  # K/V transfers: 2 * 2 * 3 = 12 elements per token
    for rank in range(plan.world_size):
        dev = device_program(plan, rank, True, shape, CPU)
        assert device_program(plan, rank, True, shape, CPU) is dev  # no rebuild for a second layer
        assert cached_program(plan, rank, True) is dev.program
        prog = lower_rank(plan, rank)
        assert dev.program == prog and not dev.heads
        assert {k: r.tolist() for k, r in dev.rows.items()} == {
            p.ring: list(p.rows) for p in prog.rings if p.position is not None}
        assert [(r.tolist(), b.lens_q, b.lens_k, b.causal) for r, b in dev.local] == [
            (list(c.rows), c.lens, c.lens, True) for c in prog.local_chunks]
        for op in prog.forward:
            if isinstance(op, RingCall):
                idx = dev.steps[(op.ring, op.step)]
                assert (idx.batch.lens_q, idx.batch.lens_k, idx.batch.causal) == (op.lens_q, op.lens_k, op.causal)
                q_rows = list(range(len(prog.rings[[p.ring for p in prog.rings].index(op.ring)].rows)))
                assert (idx.q_index.tolist() if idx.q_index is not None else q_rows) == list(op.q_rows)
        for (tid, _), wire in dev.wires.items():
            t = prog.transfers[tid]
            assert wire.unit == 12 and wire.sizes == tuple(m.tokens * 12 for m in t.messages)
            assert [h for r in wire.rounds for h in r] == [h for h in t.hops(12) if rank in (h.sender, h.receiver)]
        posted = {(op.transfer, b) for b, ops in ((False, prog.forward), (True, prog.backward)) for op in ops
                  if isinstance(op, Post)}
        assert set(dev.wires) == posted
    assert device_program(plan, 0, False, shape, CPU) is not device_program(plan, 0, True, shape, CPU)


def test_head_parallel_wires_carry_each_kind_at_its_own_size() -> None:
    """Hq = 8, Hkv = 2, D = 3: a ring of width 2 moves K/V of 1 head per lane (6 elements per token);
    its forward all-to-all q, k, v of 4 + 2 heads (18), back out (12); backward dout (12), then dq,
    dk, dv (18); a ring of width 4 has K/V heads replicated (hkv_l = 1)."""
    shape = HeadShape(8, 2, 3)
    assert [transfer_unit(k, b, 2, shape) for k in ("kv", "acc", "heads", "tokens") for b in (False, True)] == [
        6, 6, 6, 6, 18, 12, 12, 18]
    assert [transfer_unit(k, b, 4, shape) for k in ("kv", "heads", "tokens") for b in (False, True)] == [
        6, 6, 12, 6, 6, 12]
    assert transfer_unit("kv", False, 1, shape) == 12
    with pytest.raises(ValueError, match="unknown transfer kind 'x'"):
        transfer_unit("x", False, 1, shape)
    plan = random_plan(3, 2, 4, n_head_rings=3, head_widths=(2, 4))
    seen = set()
    for rank in range(plan.world_size):
        dev = device_program(plan, rank, True, shape, CPU)
        a2a = {p.ring: p.a2a for p in dev.program.rings}
        assert set(dev.heads) == {p.ring for p in dev.program.rings if p.a2a > 1 and p.position is not None}
        for (tid, backward), wire in dev.wires.items():
            unit = transfer_unit(tid.kind, backward, a2a[tid.ring], shape)
            seen.add((tid.kind, backward, a2a[tid.ring], unit))
            assert wire.unit == unit
            assert wire.sizes == tuple(m.tokens * unit for m in dev.program.transfers[tid].messages)
        for ring, hx in dev.heads.items():
            part = next(p for p in dev.program.rings if p.ring == ring)
            assert hx.rows.tolist() == list(part.rows) and hx.own == len(part.rows)
            # the own runs and the received messages' rows fill the head buffer exactly once (messages land in
            # place); what it sends covers its own tokens once per other lane, as what comes home does
            filled = [r for _, r, c in hx.own_runs for r in range(r, r + c)]
            filled += [r for _, r0, r1 in hx.heads_recv for r in range(r0, r1)]
            assert sorted(filled) == list(range(hx.block)) and hx.block == sum(hx.counts)
            for sends in (hx.heads_send, hx.tokens_recv):
                lanes = {y for _, y, _, _ in sends}
                assert lanes == (set(range(hx.a2a)) - {hx.lane} if hx.own else set())
                for y in lanes:
                    assert sorted(r for _, z, o0, o1 in sends if z == y for r in range(o0, o1)) == list(range(hx.own))
            assert sorted(r for _, r0, r1 in hx.tokens_send for r in range(r0, r1)) == sorted(
                r for _, r0, r1 in hx.heads_recv for r in range(r0, r1))
    assert {(k, b) for k, b, _, _ in seen} >= {("heads", False), ("heads", True), ("tokens", False),
                                               ("tokens", True), ("kv", False), ("acc", True)}


def test_heads_that_do_not_split_are_named_before_any_work() -> None:
    plan = random_plan(5, 2, 3, n_head_rings=2, head_widths=(3,))
    k = next(i for i, r in enumerate(plan.rings) if r.a2a == 3)
    ring = plan.rings[k]
    why = heads_problem(plan, 12, 4)
    assert why == (f"ring {k} (ranks {list(ring.ranks)}, sequences {list(ring.seqs)}) is head-parallel over 3 "
                   "lanes, but the heads Hq=12, Hkv=4 cannot split: 3 lanes and 4 K/V heads: neither divides the "
                   "other")
    assert heads_problem(plan, 12, 3) is None and heads_problem(plan, 6, 1) is None
    with pytest.raises(ValueError, match=r"head-parallel over 3 lanes, but the heads Hq=12, Hkv=4"):
        device_program(plan, 0, True, HeadShape(12, 4, 2), CPU)
    assert heads_problem(random_plan(5, 2, 3), 12, 4) is None  # no head-parallel ring: any heads
