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


def test_split_local_is_a_deterministic_balanced_cover() -> None:
    import random

    from zeppelin_megatron.planner.local_chunks import filling_rings, split_local

    assert split_local([10, 30, 20, 5], 2) == ((1,), (0, 2, 3))  # the module docstring's example
    assert split_local([4, 4, 4], 5) == ((0,), (1,), (2,))        # never more chunks than sequences
    assert split_local([7, 3], 0) == ((0, 1),)                    # no slot: one chunk after the rings
    assert split_local([], 4) == ()
    assert filling_rings([(0, 1), (2, 3), (1, 2)]) == (False, False, True)  # the docstring's example
    assert filling_rings([(0, 1), (2, 3)]) == (True, True) and filling_rings([]) == ()
    rng = random.Random(5)
    for _ in range(200):
        lens = [rng.randint(1, 500) for _ in range(rng.randint(1, 30))]
        slots = rng.randint(0, 12)
        chunks = split_local(lens, slots)
        assert chunks == split_local(list(lens), slots)
        assert len(chunks) == max(1, min(slots, len(lens)))
        assert sorted(i for c in chunks for i in c) == list(range(len(lens)))
        assert all(c and list(c) == sorted(c) for c in chunks)
        work = [sum(lens[i] ** 2 for i in c) for c in chunks]
        # greedy LPT: the heaviest chunk exceeds the mean by at most one sequence's work
        assert max(work) <= sum(work) / len(work) + max(n * n for n in lens)
    for bad, msg in (((([3, 0], 2)), "local sequence 1 has length 0"), ((([3], -1)), "slots must be >= 0")):
        with pytest.raises(ValueError, match=msg):
            split_local(*bad)


def test_build_program_local_chunks_cover_the_local_rows() -> None:
    from zeppelin_megatron.planner.local_chunks import filling_rings
    from zeppelin_megatron.runtime.router import Router

    class _R(Router):
        def __init__(self, plan):  # type: ignore[no-untyped-def]
            self.group = FakeGroup(size=plan.world_size, gpus_per_node=plan.gpus_per_node)
            self._routes = {(r.ring, r.src, r.dst): r for r in plan.routing}

    seen_split = False
    for seed in (11, 12, 13):
        plan = random_plan(seed, 2, 4)
        for rank in range(plan.world_size):
            prog = build_program(plan, rank, _R(plan))
            assert sorted(r for c in prog.local_chunks for r in c.rows) == sorted(prog.local_rows)
            assert sorted(n for c in prog.local_chunks for n in c.lens) == sorted(prog.local_lens)
            n = len(prog.local_lens)
            fills = filling_rings([r.ranks for r in plan.rings])
            member = [r for r in plan.rings if rank in r.ranks]
            assert prog.slots == sum(f for r, f in zip(plan.rings, fills) if rank in r.ranks) <= 1, prog.slots
            assert [t.fills for t in prog.rings if t.position is not None] == [
                f for r, f in zip(plan.rings, fills) if r in member]
            assert len(prog.local_chunks) == (min(prog.slots, n) if prog.slots else min(1, n))
            seen_split |= prog.slots == 1 and n > 0
    assert seen_split, "no rank had local sequences and a filling ring"
