"""Local slots: the estimated ring timeline, the packing of local sequences into its gaps, and the
``local_slots`` field of a plan (validation, JSON)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from zeppelin_megatron.planner import CostModel, PlanError, StepPlan, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.local_schedule import filling_rings, ring_timeline, schedule_local
from zeppelin_megatron.planner.plan import LocalSlot
from zeppelin_megatron.planner.workloads import long_tailed_batch
from zeppelin_megatron.sim.planbuild import build_plan


@pytest.fixture(scope="module")
def node4() -> tuple[object, CostModel]:
    cl = load_cluster("1x4")
    return cl, CostModel(model=load_model(None), cluster=cl)


def test_timeline_matches_a_hand_computed_convoy(node4: tuple[object, CostModel]) -> None:
    # Rings in queue order A = (0, 1) (one 40k sequence) then B = (1, 2) (one 12k sequence).
    # A: both post step 0 at 0; step 0 lasts max(diag, o) or the transfer, whichever is longer;
    # then the last step (off). Rank 1 reaches B at A's end T_A; rank 2 posted B at 0, ran its
    # diagonal and waits for rank 1's hop: gap = T_A + comm_B - c_B.
    cl, cost = node4
    plan = build_plan([40000, 12000, 3000], [(0, 1), (1, 2), (2,)], cl, cost, local_slots=False)
    assert [r.ranks for r in plan.rings] == [(0, 1), (1, 2)]
    o = cost.call_overhead_ms
    d_a, f_a = cost.ring_compute_profile(40000, 2)
    d_b, f_b = cost.ring_compute_profile(12000, 2)
    comm_a = cost.nvlink_ms(3 * cost.ring_step_bytes(40000, 2))
    comm_b = cost.nvlink_ms(3 * cost.ring_step_bytes(12000, 2))
    t_a = max(max(d_a, o), comm_a) + max(f_a, o)
    gaps, free = ring_timeline(plan, cost)
    assert gaps[(0, 0, 0)] == pytest.approx(max(0.0, comm_a - max(d_a, o)))
    assert gaps[(2, 1, 0)] == pytest.approx(t_a + comm_b - max(d_b, o))
    assert gaps[(1, 1, 0)] == pytest.approx(max(0.0, comm_b - max(d_b, o)))
    assert free[0] == pytest.approx(t_a)
    assert free[1] == pytest.approx(t_a + max(max(d_b, o), comm_b) + max(f_b, o))
    assert free[2] == pytest.approx(t_a + comm_b + max(f_b, o))  # its kernel ended long before the data came
    assert free[3] == 0.0
    # the 3k local sequence of rank 2 fits its gap: one slot at B's step 0
    assert cost.local_ms(3000) < gaps[(2, 1, 0)]
    assert schedule_local(plan, cost) == (LocalSlot(2, 1, 0, (2,)),)


def test_sequences_that_fit_no_gap_overflow_into_the_filling_ring_or_run_after() -> None:
    # Rings A = (0, 1), B = (1, 2), C = (2, 3) in queue order (C starts early: its members are
    # free at 0; then A, then B behind both). B fills (no member in a later ring); A and C do not.
    # Rank 2's 60k sequence fits no gap: it goes to B's step 0 with what fits there. Rank 0's
    # long local sequence fits no gap and rank 0 has no filling ring: after its rings.
    cl = load_cluster("1x4")
    cost = CostModel(model=load_model(None), cluster=cl)
    plan = build_plan([40000, 12000, 30000, 3000, 60000, 50000], [(0, 1), (1, 2), (2, 3), (2,), (2,), (0,)], cl,
                      cost, local_slots=False)
    rings = [r.ranks for r in plan.rings]
    assert rings == [(0, 1), (2, 3), (1, 2)]
    assert filling_rings(rings) == (False, False, True)
    gaps = ring_timeline(plan, cost)[0]
    assert cost.local_ms(60000) > max(g for (r, _, _), g in gaps.items() if r == 2)
    assert cost.local_ms(50000) > max(g for (r, _, _), g in gaps.items() if r == 0)
    slots = schedule_local(plan, cost)
    assert [x for x in slots if x.rank == 0] == []  # sequence 5 after the rings
    assert [(x.ring, x.step) for x in slots if 4 in x.seqs] == [(2, 0)]


def test_filling_rings() -> None:
    assert filling_rings([(0, 1), (2, 3), (1, 2)]) == (False, False, True)  # the docstring's example
    assert filling_rings([(0, 1), (2, 3)]) == (True, True) and filling_rings([]) == ()


def test_best_fit_largest_first_and_the_call_overhead(node4: tuple[object, CostModel]) -> None:
    # Several small local sequences on rank 2: every slot's call fits its gap, calls cost at least
    # the overhead, and the packing is deterministic.
    cl, cost = node4
    local = [2000, 1500, 900, 700, 500, 300]
    plan = build_plan([40000, 12000, *local], [(0, 1), (1, 2)] + [(2,)] * len(local), cl, cost, local_slots=False)
    gaps = ring_timeline(plan, cost)[0]
    slots = schedule_local(plan, cost)
    assert slots == schedule_local(plan, cost)
    assert slots, "rank 2 has a gap of a whole ring of rank 1"
    for x in slots:
        ms = max(sum(cost.local_ms(plan.sequences[i].length) for i in x.seqs), cost.call_overhead_ms)
        assert ms <= gaps[(x.rank, x.ring, x.step)] + 1e-9
    placed = sorted(i for x in slots for i in x.seqs)
    assert placed[0] == 2  # the largest local sequence fits, so it goes first


def test_planner_slots_are_valid_fit_their_gaps_and_are_deterministic() -> None:
    cl = load_cluster("4x8")
    cost = CostModel(model=load_model(None), cluster=cl)
    for seed in range(4):
        lengths = long_tailed_batch(1 << 20, seed=seed)
        plan = plan_step(lengths, cost)
        assert plan.local_slots == plan_step(lengths, cost).local_slots
        gaps = ring_timeline(plan, cost)[0]
        seen: set[int] = set()
        for x in plan.local_slots:
            assert (x.rank, x.ring, x.step) in gaps  # a member's ring step with a wait after it
            assert not seen & set(x.seqs)
            seen |= set(x.seqs)
        assert StepPlan.from_json(plan.to_json()).local_slots == plan.local_slots


def _plan_with_rings() -> StepPlan:
    cl = load_cluster("1x4")
    cost = CostModel(model=load_model(None), cluster=cl)
    return build_plan([4000, 3000, 100, 200, 300], [(0, 1, 2), (1, 2), (0,), (2,), (3,)], cl, cost,
                      local_slots=False)


def test_local_slots_round_trip_and_keep_old_documents_unchanged() -> None:
    plan = _plan_with_rings()
    assert "local_slots" not in plan.to_dict()  # no slots: the document (and digest) as before
    slotted = replace(plan, local_slots=(LocalSlot(0, 0, 1, (2,)), LocalSlot(2, 1, 0, (3,))))
    back = StepPlan.from_json(slotted.to_json())
    assert back.local_slots == slotted.local_slots and back.digest() == slotted.digest() != plan.digest()


@pytest.mark.parametrize("slot, msg", [
    (LocalSlot(0, 5, 0, (2,)), r"ring index 5 is outside \[0, 2\)"),
    (LocalSlot(3, 0, 0, (4,)), r"rank 3 is not a member of ring \[0, 1, 2\]"),
    (LocalSlot(0, 0, 2, (2,)), r"step must be in \[0, 1\] for a ring of 3"),
    (LocalSlot(0, 0, 0, ()), "no sequences"),
    (LocalSlot(0, 0, 0, (9,)), r"sequence index 9 is outside \[0, 5\)"),
    (LocalSlot(0, 0, 0, (3,)), r"sequence 3 \(local on ranks \[2\]\) is not a local sequence of rank 0"),
    (LocalSlot(0, 0, 0, (0,)), r"sequence 0 \(intra_node"),
])
def test_bad_local_slots_are_refused_with_the_value(slot: LocalSlot, msg: str) -> None:
    with pytest.raises(PlanError, match=msg):
        replace(_plan_with_rings(), local_slots=(slot,))


def test_evolve_checks_what_it_changes_and_only_that(monkeypatch: pytest.MonkeyPatch) -> None:
    """StepPlan.evolve refuses a bad slot, origin, remap proxies or linear kind as a construction does, and
    re-runs only the checks that read a changed field (a prediction or origin change leaves the slots' checks
    out), carrying the rings."""
    import zeppelin_megatron.planner.plan as plan_mod
    plan = _plan_with_rings()
    for slot, msg in [(LocalSlot(0, 5, 0, (2,)), r"ring index 5 is outside"), (LocalSlot(3, 0, 0, (4,)), "member")]:
        with pytest.raises(PlanError, match=msg):
            plan.evolve(local_slots=(slot,))
    with pytest.raises(PlanError, match="origin is 'mine'"):
        plan.evolve(origin="mine")
    with pytest.raises(PlanError, match="remap_proxies must be distinct local indices"):
        plan.evolve(remap_proxies=(0, 0))
    with pytest.raises(PlanError, match="linear is 'balanced'"):
        plan.evolve(linear="balanced")
    slotted = plan.evolve(local_slots=(LocalSlot(0, 0, 0, (2,)),))
    calls: list[str] = []
    monkeypatch.setattr(plan_mod, "check_local_slots", lambda p: calls.append("slots"))
    monkeypatch.setattr(plan_mod, "check_routing", lambda p: calls.append("routing"))
    moved = slotted.evolve(origin="packed")
    assert calls == [] and moved.local_slots == slotted.local_slots and moved.__dict__["rings"] is slotted.rings
    slotted.evolve(local_slots=())
    slotted.evolve(routing=())
    assert calls == ["slots", "routing"]


def test_a_sequence_in_two_slots_or_two_slots_at_one_step_are_refused() -> None:
    plan = _plan_with_rings()
    with pytest.raises(PlanError, match=r"sequence 2 is already in local_slots\[0\]"):
        replace(plan, local_slots=(LocalSlot(0, 0, 0, (2,)), LocalSlot(0, 0, 1, (2,))))
    with pytest.raises(PlanError, match="a second slot at the same ring step"):
        replace(plan, local_slots=(LocalSlot(2, 0, 0, (3,)), LocalSlot(2, 0, 0, (3,))))
    doc = replace(plan, local_slots=(LocalSlot(0, 0, 0, (2,)),)).to_dict()
    doc["local_slots"][0]["step"] = -2
    with pytest.raises(PlanError, match=r"local_slots\[0\].step must be an integer >= -1, got -2"):
        StepPlan.from_json(doc)
    doc["local_slots"][0]["step"] = -1  # the heads all-to-all's slot: a plain ring has none
    with pytest.raises(PlanError, match=r"step -1 \(inside the heads all-to-all\) needs a head-parallel ring, "
                                        r"ring 0 is plain \(a2a 1\): step must be in \[0, 1\]"):
        StepPlan.from_json(doc)
    doc["local_slots"] = {"rank": 0}
    with pytest.raises(PlanError, match="local_slots must be a list"):
        StepPlan.from_json(doc)


def test_random_plans_schedule_only_where_a_rank_is_a_member() -> None:
    rng = random.Random(3)
    cl = load_cluster("2x4", tokens_per_gpu=1 << 17)
    cost = CostModel(model=load_model(None), cluster=cl)
    for _ in range(5):
        lengths = [rng.choice([rng.randint(100, 3000), rng.randint(20000, 60000)]) for _ in range(40)]
        plan = plan_step(lengths, cost)
        for x in plan.local_slots:
            ring = plan.rings[x.ring]
            assert x.rank in ring.ranks
            # a ring steps over its blocks (its ranks when plain); a head-parallel ring also has step -1 (inside
            # its heads all-to-all)
            assert (-1 if ring.a2a > 1 else 0) <= x.step <= ring.blocks - 2


def test_a_sequence_that_fits_nowhere_goes_where_it_overflows_least(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rings in queue order (0, 1, 2) then (1, 2): rank 2's first ring does not fill, its second does.
    # With the timeline's gaps replaced by chosen ones, a sequence too long for both gaps goes to the
    # gap it overflows least; on equal overflow, to the filling ring's step 0.
    import zeppelin_megatron.planner.local_schedule as ls

    cl = load_cluster("1x4")
    cost = CostModel(model=load_model(None), cluster=cl)
    plan = build_plan([9000, 6000, 30000], [(0, 1, 2), (1, 2), (2,)], cl, cost, local_slots=False)
    assert [r.ranks for r in plan.rings] == [(0, 1, 2), (1, 2)]
    assert filling_rings([r.ranks for r in plan.rings]) == (False, True)
    ms = cost.local_ms(30000)

    def with_gaps(first: float, filling: float) -> tuple[LocalSlot, ...]:
        monkeypatch.setattr(ls, "ring_timeline", lambda p, c: ({(2, 0, 1): first, (2, 1, 0): filling}, []))
        return schedule_local(plan, cost)

    assert with_gaps(ms - 3.0, ms - 6.0) == (LocalSlot(2, 0, 1, (2,)),)  # overflows 3 ms there, 6 in the filling ring
    assert with_gaps(ms - 6.0, ms - 3.0) == (LocalSlot(2, 1, 0, (2,)),)
    assert with_gaps(ms - 4.0, ms - 4.0) == (LocalSlot(2, 1, 0, (2,)),)  # a tie: the filling ring
    assert with_gaps(ms + 1.0, 2.0) == (LocalSlot(2, 0, 1, (2,)),)       # it fits the first gap


def test_overflow_into_a_ring_that_does_not_fill_only_when_it_hides_more_than_it_delays(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Rings (0, 1, 2) then (1, 2): the first does not fill (ranks 1 and 2 go on), the second does. A local
    # call that overflows a gap of the first ring by more than the gap holds the partners' next ring up by
    # more than it hides: rank 2's goes to its filling ring, rank 0's (no filling ring) after its rings.
    # (Issue 12, Llama-7B arxiv-128k on 64 GPUs: 47 ms of local work in a 4 ms gap of such a ring held a
    # partner's 45 ms ring up; simulated step 4438 -> 3299 ms.)
    import zeppelin_megatron.planner.local_schedule as ls

    cl = load_cluster("1x4")
    cost = CostModel(model=load_model(None), cluster=cl)
    for r in (2, 0):
        plan = build_plan([9000, 6000, 30000], [(0, 1, 2), (1, 2), (r,)], cl, cost, local_slots=False)
        assert filling_rings([x.ranks for x in plan.rings]) == (False, True)
        ms = cost.local_ms(30000)

        def with_gap(first: float, r: int = r, plan: StepPlan = plan) -> tuple[LocalSlot, ...]:
            gaps = {(r, 0, 1): first} if r == 0 else {(2, 0, 1): first, (2, 1, 0): 2.0}
            monkeypatch.setattr(ls, "ring_timeline", lambda p, c: (gaps, []))
            return schedule_local(plan, cost)

        assert with_gap(0.6 * ms) == (LocalSlot(r, 0, 1, (2,)),)  # overflows 0.4 ms per ms, hides 0.6
        assert with_gap(0.4 * ms) == (() if r == 0 else (LocalSlot(2, 1, 0, (2,)),))


def _reference_timeline(plan: StepPlan, cost: CostModel) -> tuple[dict[tuple[int, int, int], float], list[float]]:
    """ring_timeline's definition, step by step and hop by hop (no vectorised steps, no steady-state
    repeat): every hop starts when all the ranks it touches are free and ends ``ms`` later; a rank is done
    when all its hops ended; a member's step ends at the later of that and its kernel."""
    import zeppelin_megatron.planner.local_schedule as ls
    o = cost.call_overhead_ms
    free = [0.0] * plan.world_size
    gaps: dict[tuple[int, int, int], float] = {}
    for k, ring in enumerate(plan.rings):
        if ring.a2a > 1:
            ls._head_timeline(plan, cost, k, free, gaps)
            continue
        g = len(ring.ranks)
        diag = sum(cost.ring_compute_profile(plan.sequences[i].length, g)[0] for i in ring.seqs)
        off = sum(cost.ring_compute_profile(plan.sequences[i].length, g)[1] for i in ring.seqs)
        nbytes = 3 * sum(cost.ring_step_bytes(plan.sequences[i].length, g) for i in ring.seqs)
        hops = ls._hops(plan, ring.ranks, nbytes, cost)
        post = {r: free[r] for touched, _ in hops for r in touched}
        for j in range(g - 1):
            c = max(diag if j == 0 else off, o)
            done = dict.fromkeys(post, 0.0)
            for touched, ms in hops:
                end = max(post[r] for r in touched) + ms
                for r in touched:
                    done[r] = max(done[r], end)
            for r in post:
                if r in ring.ranks:
                    ready = post[r] + c
                    gaps[(r, k, j)] = max(0.0, done[r] - ready)
                    post[r] = max(done[r], ready)
                else:
                    post[r] = max(post[r], done[r])
        for r, t in post.items():
            free[r] = t + (max(off, o) if r in ring.ranks else 0.0)
    return gaps, free


@pytest.mark.parametrize("shape", ["2x4", "4x8", "16x8"])
def test_timeline_matches_its_step_by_step_definition(shape: str) -> None:
    # plain rings (routed hops through relays, convoys of rings sharing ranks) and head-parallel ones, on
    # plan_step's plans and on their all-plain variants routed as choose_heads._fill_aware routes them
    from zeppelin_megatron.planner.plan import SequencePlan
    from zeppelin_megatron.planner.plan_json import derive_routing
    cl = load_cluster(shape)
    cost = CostModel(model=load_model(None), cluster=cl)
    rng = random.Random(7)
    checked = 0
    for seed in range(4):
        lengths = long_tailed_batch(cl.world_size * 8192, seed) if seed % 2 else \
            [rng.randint(100, 3 * 8192) for _ in range(cl.world_size * 2)]
        plan = plan_step(lengths, cost)
        plain = StepPlan(nodes=cl.nodes, gpus_per_node=cl.gpus_per_node,
                         sequences=tuple(SequencePlan(s.length, s.placement, s.ranks) for s in plan.sequences),
                         attention_layout=plan.attention_layout, linear_layout=plan.attention_layout, validate=False)
        for p in (plan, plain.evolve(routing=derive_routing(plain, cost, enabled=True)), plain):
            gaps, free = ring_timeline(p, cost)
            want_gaps, want_free = _reference_timeline(p, cost)
            assert gaps.keys() == want_gaps.keys()
            assert all(abs(gaps[key] - want_gaps[key]) <= 1e-6 for key in gaps)
            assert free == pytest.approx(want_free, abs=1e-6)
            checked += len(p.rings)
    assert checked > 10
