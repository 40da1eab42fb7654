"""Pure tests of head-parallel rings in the lowering (:mod:`zeppelin_megatron.planner.head_parallel`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plan_factory import random_plan
from zigzag_plans import zigzag_plan
from zeppelin_megatron.planner.head_parallel import (
    block_ranges, head_split_error, lane_heads, lane_kv_heads, lane_runs,
)
from zeppelin_megatron.planner.lowering import Post, RingCall, TransferId, Wait, lower
from zeppelin_megatron.planner.plan import PlanError, SequencePlan, StepPlan


_plan = zigzag_plan


def test_block_ranges_and_lane_heads_worked_examples() -> None:
    assert block_ranges(16, 4, 2, 0) == ((0, 4), (12, 16))
    assert block_ranges(16, 4, 2, 1) == ((4, 8), (8, 12))
    assert block_ranges(16, 4, 4, 0) == ((0, 8), (8, 16))
    assert lane_runs((16,), 4, 2, 0, 0) == ((0, 0, 2), (2, 6, 2)) and lane_runs((16,), 4, 2, 0, 1) == ((0, 2, 4),)
    assert lane_runs((16, 8), 4, 2, 0, 0) == ((0, 0, 2), (2, 6, 3), (5, 11, 1))  # lane 0's runs meet across seqs
    assert lane_runs((16, 8), 4, 2, 0, 1) == ((0, 2, 4), (4, 9, 2))
    assert lane_heads(32, 8, 4, 1) == ((8, 16), (2, 4))
    assert lane_heads(32, 8, 16, 5) == ((10, 12), (2, 3))
    assert lane_kv_heads(8, 4) == 2 and lane_kv_heads(2, 8) == 1
    assert head_split_error(12, 4, 8) and head_split_error(24, 6, 4)
    assert head_split_error(32, 2, 8) is None
    with pytest.raises(ValueError, match="8 lanes do not divide 12 query heads"):
        lane_heads(12, 4, 8, 0)


@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2), (8, 1), (16, 4), (12, 6), (6, 3)])
def test_lane_heads_partition_queries_and_cover_what_they_read(hq: int, hkv: int) -> None:
    for a in range(1, hq + 1):
        if head_split_error(hq, hkv, a) is not None:
            continue
        seen: list[int] = []
        for lane in range(a):
            (q0, q1), (k0, k1) = lane_heads(hq, hkv, a, lane)
            seen += range(q0, q1)
            assert k1 - k0 == lane_kv_heads(hkv, a)
            assert {h // (hq // hkv) for h in range(q0, q1)} == set(range(k0, k1))  # exactly the heads read
        assert seen == list(range(hq))


def test_worked_example_hybrid_ring_of_two_blocks() -> None:
    """Length 16 over ranks (0, 1, 2, 3) of 2 x 2 GPUs, a2a = 2: block 0 = ranks 0, 1 (node 0)."""
    plan = _plan([(16, (0, 1, 2, 3), 2)], nodes=2, gpn=2)
    assert plan.rings[0].a2a == 2 and plan.rings[0].blocks == 2
    prog = lower(plan)
    r1 = prog.ranks[1]
    part = r1.rings[0]
    assert (part.position, part.lane, part.size) == (0, 1, 2)
    assert part.fine_ranges(1) == ((0, 2, 4), (0, 12, 14))
    assert part.lane_rows(0) == (0, 1, 6, 7) and part.lane_rows(1) == (2, 3, 4, 5)
    kinds = [(type(op).__name__, op.transfer.kind) if isinstance(op, (Post, Wait)) else (op.kind, op.step)
             for op in r1.forward]
    assert kinds == [("Post", "heads"), ("Wait", "heads"), ("Post", "kv"), ("diag", 0), ("Wait", "kv"),
                     ("late", 1), ("Post", "tokens"), ("Wait", "tokens")]
    diag, late = r1.forward[3], r1.forward[5]
    assert isinstance(diag, RingCall) and isinstance(late, RingCall)
    assert diag.q == ((0, 0, 4), (0, 12, 16)) and diag.causal
    assert late.q == ((0, 12, 16),) and late.kv == ((0, 4, 8), (0, 8, 12)) and late.q_rows == (4, 5, 6, 7)
    heads = prog.transfers[TransferId(0, 0, "heads")]
    # one message per run of the sender's lane in the head buffer: lane 0's two chunks land apart, lane 1's meet
    assert part.lane_runs(0) == ((0, 0, 2), (2, 6, 2)) and part.lane_runs(1) == ((0, 2, 4),)
    assert [(m.src, m.dst, m.tokens) for m in heads.messages] == [(0, 1, 2), (0, 1, 2), (1, 0, 4), (2, 3, 2),
                                                                   (2, 3, 2), (3, 2, 4)]
    back = prog.transfers[TransferId(0, 0, "tokens")]
    assert [(m.src, m.dst, m.tokens) for m in back.messages] == [(1, 0, 2), (1, 0, 2), (0, 1, 4), (3, 2, 2),
                                                                 (3, 2, 2), (2, 3, 4)]
    kv = prog.transfers[TransferId(0, 0, "kv")]
    assert [(m.src, m.dst, m.tokens) for m in kv.messages] == [(0, 2, 8), (1, 3, 8), (2, 0, 8), (3, 1, 8)]
    assert heads.hops(1)[0].tag == 2 << 20 and prog.transfers[TransferId(0, 0, "tokens")].hops(1)[0].tag == 3 << 20
    back = [(type(op).__name__, op.transfer.kind) for op in r1.backward if isinstance(op, (Post, Wait))]
    assert back == [("Post", "heads"), ("Wait", "heads"), ("Post", "kv"), ("Post", "acc"), ("Wait", "kv"),
                    ("Wait", "acc"), ("Post", "acc"), ("Wait", "acc"), ("Post", "tokens"), ("Wait", "tokens")]


def test_ulysses_ring_is_one_diag_call_without_ring_transfers() -> None:
    plan = _plan([(12, (1, 0, 2), 3), (7, (1, 0, 2), 3)], nodes=1, gpn=3)
    prog = lower(plan)
    for r in prog.ranks:
        calls = [op for op in r.forward if isinstance(op, RingCall)]
        assert len(calls) == 1 and calls[0].kind == "diag"
        assert calls[0].q == ((0, 0, 6), (0, 6, 12), (1, 0, 4), (1, 4, 7)) and calls[0].lens_q == (12, 7)
        assert all(t.kind in ("heads", "tokens") for t in r.transfers)


def test_a2a_checked_on_construction() -> None:
    with pytest.raises(PlanError, match="a2a is 3, which does not divide its 4 ranks"):
        _plan([(16, (0, 1, 2, 3), 3)], nodes=1, gpn=4)
    with pytest.raises(PlanError, match=r"a2a block 0 \(ranks \[0, 2\]\) spans nodes"):
        _plan([(16, (0, 2, 1, 3), 2)], nodes=2, gpn=2)
    plan = _plan([(16, (0, 1), 1)], nodes=1, gpn=2)
    with pytest.raises(PlanError, match="a local sequence runs whole"):
        replace(plan, sequences=(SequencePlan(16, "local", (0,), 2),),
                attention_layout=(((0, 0, 16),), ()), linear_layout=(((0, 0, 16),), ()))
    assert StepPlan.from_json(_plan([(16, (0, 1, 2, 3), 2)], 2, 2).to_json()).sequences[0].a2a == 2
    assert '"a2a"' not in plan.to_json()  # plain plans keep their JSON


def _pairs_of(call: RingCall) -> set[tuple[int, int, int]]:
    """(seq, q token, k token) pairs the call computes (causal by position within each segment)."""
    out: set[tuple[int, int, int]] = set()
    qs: dict[int, list[int]] = {}
    ks: dict[int, list[int]] = {}
    for s, a, b in call.q:
        qs.setdefault(s, []).extend(range(a, b))
    for s, a, b in call.kv:
        ks.setdefault(s, []).extend(range(a, b))
    for s in qs:
        for i, q in enumerate(qs[s]):
            for j, k in enumerate(ks[s]):
                if not call.causal or j <= i:
                    assert k <= q, (call.kind, s, q, k)  # never a future key
                    out.add((s, q, k))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_each_lane_computes_every_causal_pair_once(seed: int) -> None:
    nodes, gpn = [(1, 4), (2, 2), (2, 4), (3, 2)][seed % 4]
    plan = random_plan(seed, nodes, gpn, n_local=3, n_intra_rings=1, n_inter_rings=1, n_head_rings=3, max_len=48)
    prog = lower(plan)
    heads = [k for k, r in enumerate(plan.rings) if r.a2a > 1]
    assert heads
    for k in heads:
        ring = plan.rings[k]
        for lane in range(ring.a2a):
            got: list[tuple[int, int, int]] = []
            for b in range(ring.blocks):
                rank = ring.ranks[b * ring.a2a + lane]
                for op in prog.ranks[rank].forward:
                    if isinstance(op, RingCall) and op.ring == k:
                        got += _pairs_of(op)
            want = {(s, q, kk) for s in ring.seqs for q in range(plan.sequences[s].length) for kk in range(q + 1)}
            assert len(got) == len(want) and set(got) == want
        for b in range(ring.blocks):  # the lanes' tokens fill each head buffer exactly once, run by run
            rank = ring.ranks[b * ring.a2a]
            part = next(p for p in prog.ranks[rank].rings if p.ring == k)
            rows = sorted(r for lane in range(ring.a2a) for r in part.lane_rows(lane))
            assert rows == list(range(sum(part.lens(b))))
            assert sum(part.fine_tokens(b * ring.a2a + lane) for lane in range(ring.a2a)) == len(rows)
            for lane in range(ring.a2a):
                runs = part.lane_runs(lane)
                assert [o for o, _, _ in runs] == [sum(c for _, _, c in runs[:i]) for i in range(len(runs))]
                assert all(c > 0 for _, _, c in runs) and all(  # merged: no run continues the one before
                    (o0 + c0, r0 + c0) != (o1, r1) for (o0, r0, c0), (o1, r1, _) in zip(runs, runs[1:]))
