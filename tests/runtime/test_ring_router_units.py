"""Pure (no process group) tests of ring arithmetic, row mapping and route schedules."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from plan_factory import random_plan
from zeppelin_megatron.planner.routing import Route
from zeppelin_megatron.runtime.engine import _rows, build_program
from zeppelin_megatron.runtime.ring import RingLayout
from zeppelin_megatron.runtime.router import Message, build_schedule


@dataclass(frozen=True)
class FakeGroup:
    """Just the rank arithmetic of a ZeppelinGroup."""

    size: int
    gpus_per_node: int
    rank: int = 0

    def node_of(self, r: int) -> int:
        return r // self.gpus_per_node

    def local_of(self, r: int) -> int:
        return r % self.gpus_per_node

    def rank_at(self, node: int, local: int) -> int:
        return node * self.gpus_per_node + local


def test_ring_layout_worked_example() -> None:
    lay = RingLayout(ranks=(5, 2), lengths=(8, 9))
    # 8 = 2+2+2+2; 9 = 3+2+2+2
    assert lay.seq_lens(0) == (4, 5) and lay.seq_lens(1) == (4, 4)
    assert lay.rows(0, "early") == [0, 1, 4, 5, 6] and lay.rows(0, "late") == [2, 3, 7, 8]
    assert lay.token_ranges(1) == ((0, 2, 4), (0, 4, 6), (1, 3, 5), (1, 5, 7))
    assert [lay.source(1, j) for j in range(2)] == [1, 0]
    assert lay.next_rank(1) == 5 and lay.prev_rank(0) == 2 and lay.position(2) == 1 and lay.position(3) is None
    msgs = lay.messages(1, row_numel=10)  # step 1: position p sends the K/V of p - 1
    assert [(m.src, m.dst, m.numel) for m in msgs] == [(5, 2, 80), (2, 5, 90)]
    with pytest.raises(ValueError, match="too short"):
        RingLayout(ranks=(0, 1, 2), lengths=(5,))


def test_rows_follow_token_order_not_buffer_order() -> None:
    assert _rows([(4, 6, 0), (0, 4, 10)], 3, 5) == [13, 0]
    with pytest.raises(ValueError, match="not all"):
        _rows([(0, 4, 0)], 2, 6)


def test_router_worked_example() -> None:
    group = FakeGroup(size=8, gpus_per_node=4)
    sched = build_schedule([Message(src=1, dst=6, numel=10)], {(1, 6): Route((1, 6), 1, 6, (1, 0, 3))}, group)
    hops = [(h.round, h.sender, h.receiver, h.offset, h.count) for h in sched.hops]
    assert hops == [(0, 1, 6, 0, 4), (0, 1, 0, 4, 3), (0, 1, 3, 7, 3),
                    (1, 0, 4, 4, 3), (1, 3, 7, 7, 3), (2, 4, 6, 4, 3), (2, 7, 6, 7, 3)]
    # rail partner is the destination itself: no combine hop
    sched = build_schedule([Message(src=0, dst=5, numel=4)], {(0, 5): Route((0, 5), 0, 5, (0, 1))}, group)
    assert [(h.round, h.sender, h.receiver) for h in sched.hops] == [(0, 0, 5), (0, 0, 1), (1, 1, 5)]
    # no route: one direct hop
    sched = build_schedule([Message(src=0, dst=5, numel=4)], {}, group)
    assert [(h.round, h.sender, h.receiver, h.count) for h in sched.hops] == [(0, 0, 5, 4)]


def test_schedule_covers_every_element_once() -> None:
    group = FakeGroup(size=8, gpus_per_node=4)
    plan = random_plan(3, 2, 4)
    for ring in plan.rings:
        lay = RingLayout(ranks=ring.ranks, lengths=tuple(plan.sequences[s].length for s in ring.seqs))
        msgs = lay.messages(0, 6)
        sched = build_schedule(msgs, plan.routes_for(ring.ranks), group)
        for i, m in enumerate(msgs):
            final = sorted((h.offset, h.offset + h.count) for h in sched.hops if h.msg == i and h.receiver == m.dst)
            assert final[0][0] == 0 and final[-1][1] == m.numel
            assert all(a[1] == b[0] for a, b in zip(final, final[1:]))


def test_build_program_covers_the_attention_buffer() -> None:
    from zeppelin_megatron.runtime.router import Router

    class _R(Router):
        def __init__(self, plan):  # type: ignore[no-untyped-def]
            self.group = FakeGroup(size=plan.world_size, gpus_per_node=plan.gpus_per_node)
            self._routes = {(r.ring, r.src, r.dst): r for r in plan.routing}

    plan = random_plan(11, 2, 4)
    for rank in range(plan.world_size):
        prog = build_program(plan, rank, _R(plan))
        rows = [r for t in prog.rings for r in t.rows] + list(prog.local_rows)
        assert sorted(rows) == list(range(plan.tokens(rank, "attention")))
        assert [t.layout.ranks for t in prog.rings] == [
            r.ranks for r in plan.rings if any(t.layout.ranks == r.ranks for t in prog.rings)]


def test_build_program_local_chunks_follow_the_plans_slots() -> None:
    from zeppelin_megatron.runtime.router import Router

    class _R(Router):
        def __init__(self, plan):  # type: ignore[no-untyped-def]
            self.group = FakeGroup(size=plan.world_size, gpus_per_node=plan.gpus_per_node)
            self._routes = {(r.ring, r.src, r.dst): r for r in plan.routing}

    seen = {"slot": False, "later step": False, "leftover": False}
    for seed in (11, 12, 13):
        plan = random_plan(seed, 2, 4)
        for rank in range(plan.world_size):
            prog = build_program(plan, rank, _R(plan))
            assert sorted(r for c in prog.local_chunks for r in c.rows) == sorted(prog.local_rows)
            assert sorted(n for c in prog.local_chunks for n in c.lens) == sorted(prog.local_lens)
            mine = sorted((x.ring, x.step, x.seqs) for x in plan.local_slots if x.rank == rank)
            assert prog.slots == len(mine)
            # chunk c < slots is the c-th slot in (ring, step) order, named by its ring's fills
            member_rings = [k for k, ring in enumerate(plan.rings) if rank in ring.ranks]
            fills = [(k, j, c) for k, t in zip(member_rings, [t for t in prog.rings if t.position is not None])
                     for j, c in t.fills]
            assert [(k, j) for k, j, _ in sorted(fills, key=lambda f: f[2])] == [(k, j) for k, j, _ in mine]
            for c, (_, _, seqs) in enumerate(mine):
                assert prog.local_chunks[c].lens == tuple(plan.sequences[i].length for i in seqs)
            left = [s.length for i, s in enumerate(plan.sequences) if s.placement == "local" and s.ranks == (rank,)
                    and all(i not in seqs for _, _, seqs in mine)]
            assert len(prog.local_chunks) == len(mine) + bool(left)
            if left:
                assert list(prog.local_chunks[-1].lens) == left  # after the rings, plan order
            seen["slot"] |= bool(mine)
            seen["later step"] |= any(j > 0 for _, j, _ in mine)
            seen["leftover"] |= bool(left)
    assert all(seen.values()), seen
