"""Head-parallel rings in the planner: their cost (cost_heads.py), the choice (choose_heads.py), the
prediction, ring timeline and local slots of plans that hold them."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.choose_heads import choose_width, choose_widths, plain_ring_ms
from zeppelin_megatron.planner.cost_heads import (
    a2a_bytes_per_token, head_ring_time, head_widths, lane_hops, lane_kv_bytes_per_token,
)
from zeppelin_megatron.planner.grouped import pack_sizes
from zeppelin_megatron.planner.head_parallel import head_split_error, lane_runs
from zeppelin_megatron.planner.packed import head_parallel_threshold, packed_assignments
from zeppelin_megatron.planner.local_schedule import ring_timeline
from zeppelin_megatron.planner.partition_context import Assignment
from zeppelin_megatron.planner.plan import LocalSlot, SequencePlan, StepPlan
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.planner.workloads import long_tailed_batch
from zeppelin_megatron.planner.zigzag import position_ranges, ring_max_tokens


def _cost(spec: str = "1x8", *, q: int | None = None, kv: int | None = None, tp: int = 1) -> CostModel:
    model = load_model(None)  # Llama-7B shape: 32 query and 32 K/V heads of 128
    if q is not None or kv is not None:
        model = replace(model, q_heads=q or model.q_heads, kv_heads=kv or model.kv_heads)
    return CostModel(model=model, cluster=load_cluster(spec), tensor_parallel=tp)


def _layout(lengths: list[int], assignments: list[Assignment], world: int) -> list[list[tuple[int, int, int]]]:
    att: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    for i, (s, a) in enumerate(zip(lengths, assignments)):
        if a.placement == "local":
            att[a.ranks[0]].append((i, 0, s))
        else:
            for p, r in enumerate(a.ranks):
                att[r].extend(position_ranges(i, s, len(a.ranks), p))
    return att


def _plan(cost: CostModel, lengths: list[int], groups: list[tuple[int, ...]], widths: list[int]) -> StepPlan:
    """A plan holding sequence ``i`` on ``groups[i]`` at width ``widths[i]`` (no remap), slots and prediction."""
    cl = cost.cluster
    assignments = [Assignment("local" if len(g) == 1 else "intra_node" if len({cl.node_of(r) for r in g}) == 1
                              else "inter_node", g) for g in groups]
    att = tuple(tuple(rs) for rs in _layout(lengths, assignments, cl.world_size))
    seqs = tuple(SequencePlan(s, a.placement, a.ranks, w)  # type: ignore[arg-type]
                 for s, a, w in zip(lengths, assignments, widths))
    plan = StepPlan(nodes=cl.nodes, gpus_per_node=cl.gpus_per_node, sequences=seqs, attention_layout=att,
                    linear_layout=att)
    from zeppelin_megatron.planner.local_schedule import with_local_slots
    plan = with_local_slots(plan, cost)
    return plan.evolve(predicted=predict(plan, cost))


# -- cost ----------------------------------------------------------------------------------------------------


def test_ulysses_time_by_hand() -> None:
    """8192 tokens on one node of 8 (NVLink 450 GB/s, 5 us), a = 8: each rank holds 1024 tokens and sends
    7 peers 1024 x 4096 bytes (q, k, v slices of 4 heads + dout slice, bf16) = 29.36 MB in two messages each
    (its two zigzag chunks, apart in the head buffer: head_parallel.lane_runs; lane 7's meet), each paying the
    5 us latency: 0.0752 ms; back
    as much (out, and the one call's dq, dk, dv in bf16, as a ring of several blocks sends its accumulators too,
    cast once; 1024 x 7168 = 51.38 MB with fp32 gradients, which only lanes sharing K/V heads send); one call over
    4 of 32 heads
    (0.81 ms) pays the 1.0925 ms call overhead. The plain ring pays it at each of its 8 steps: 8.74 ms."""
    cost = _cost()
    assert a2a_bytes_per_token(cost, 8) == (4096, 4096) and lane_kv_bytes_per_token(cost, 8) == 2048
    h = head_ring_time(cost, tuple(range(8)), [8192], 8)
    assert h.heads_ms == pytest.approx(0.010 + 7 * 1024 * 4096 / 450e6)
    assert h.tokens_ms == pytest.approx(0.010 + 7 * 1024 * 4096 / 450e6)
    assert a2a_bytes_per_token(cost, 8, blocks=1) == (4096, 4096)
    assert h.diag == pytest.approx(cost.causal_ms(8192) / 8) and h.diag < cost.call_overhead_ms
    assert h.total == pytest.approx(1.0925 + 2 * (0.010 + 7 * 1024 * 4096 / 450e6)) == pytest.approx(1.242989, abs=1e-6)
    assert h.step_comm_ms == 0 and h.lane_bytes == 0 and h.own == cost.call_overhead_ms
    assert plain_ring_ms(cost, tuple(range(8)), [8192], True) == pytest.approx(8 * 1.0925)


@pytest.mark.parametrize("lengths,a", [([8192], 8), ([8192, 4096, 2048], 8), ([8192, 4096], 2), ([64, 40, 24], 4)])
def test_all_to_all_latency_counts_the_busiest_pairs_messages(lengths: list[int], a: int) -> None:
    """head_ring_time charges each all-to-all the latency once per message of the busiest lane pair (one message per
    run of a lane's tokens, head_parallel.lane_runs, as the lowering sends them): 2 per sequence at a > 2 (a middle
    lane's two chunks never meet), one per sequence plus one at a = 2 (lane 0: its late chunk and the next
    sequence's early chunk meet; lane 1: its two chunks meet); exactly the most runs of any lane (sequences long
    enough for every chunk to hold tokens)."""
    cost = _cost()
    ranks = tuple(range(a))
    h = head_ring_time(cost, ranks, lengths, a)
    runs = max(len(lane_runs(lengths, a, a, 0, x)) for x in range(a))
    assert runs == (2 * len(lengths) if a > 2 else len(lengths) + 1)
    held = sum(ring_max_tokens(s, a) for s in lengths)
    heads_b, _ = a2a_bytes_per_token(cost, a, 1)
    assert h.heads_ms == pytest.approx(runs * 0.005 + (a - 1) * held * heads_b / 450e6)


def test_hybrid_across_nodes_by_hand() -> None:
    """131072 tokens on 16 ranks of 2 nodes, a = 8: two blocks (one per node), lanes of 4 heads; a lane hop
    carries 3 x 65536 tokens (two chunks of the 2-block zigzag) x 2 x 4 x 128 x 2 bytes = 402.7 MB over its
    own GPU's NIC (50 GB/s, 15 us; one GPU per NIC): 8.068 ms."""
    cost = _cost("2x8")
    h = head_ring_time(cost, tuple(range(16)), [131072], 8)
    assert h.lane_bytes == 3 * 65536 * 2048 == 402653184
    assert h.step_comm_ms == pytest.approx(402653184 / 50e6 + 0.015)
    d, f = cost.ring_compute_profile(131072, 2)
    o = cost.call_overhead_ms
    assert h.total == pytest.approx(h.heads_ms + h.tokens_ms + max(d / 8, o) + max(f / 8, o, h.step_comm_ms))
    assert [(p, q) for p, q, _ in lane_hops(cost, tuple(range(16)), 8, 1.0)][:2] == [(0, 8), (1, 9)]


def test_lanes_share_their_nic() -> None:
    """A800 nodes: two GPUs per NIC (25 GB/s, 20 us); a block's lanes 0 and 1 share NIC 0: each hop takes
    twice the bytes' time."""
    cost = _cost("2x8@configs/clusters/a800.yaml")
    hops = lane_hops(cost, tuple(range(16)), 8, 1e6)
    assert len(hops) == 16 and all(ms == pytest.approx(2e6 / 25e6 + 0.020) for _, _, ms in hops)
    within = lane_hops(cost, tuple(range(8)), 4, 1e6)  # blocks (0-3), (4-7) in one node: NVLink
    assert all(ms == pytest.approx(1e6 / 200e6 + 0.005) for _, _, ms in within)


def test_widths_follow_the_rules() -> None:
    cost = _cost("2x8")
    assert head_widths(cost, tuple(range(8))) == (2, 4, 8)
    assert head_widths(cost, (6, 7, 8, 9)) == (2,)  # a block of 4 would span two nodes
    assert head_widths(cost, (0, 8, 1, 9, 2, 10, 3, 11)) == ()  # every block of >= 2 spans nodes
    c12 = _cost(q=12, kv=4)  # 12 query / 4 K/V heads over 8 GPUs: no Ulysses over 8 (8 does not divide 12)
    assert head_widths(c12, tuple(range(8))) == (2, 4) and head_split_error(12, 4, 8) is not None
    tp2 = _cost(q=32, kv=8, tp=2)  # 16 / 4 heads per rank; at 8 lanes a K/V head is shared by two lanes
    assert (tp2.heads, head_widths(tp2, tuple(range(8)))) == (16, (2, 4, 8))
    assert lane_kv_bytes_per_token(tp2, 8) == 2 * 1 * 128 * 2
    with pytest.raises(ValueError, match="block width 8 is not allowed"):
        head_ring_time(c12, tuple(range(8)), [8192], 8)


# -- the choice ----------------------------------------------------------------------------------------------


def test_a_long_document_on_one_node_runs_as_ulysses() -> None:
    cost = _cost()
    plan = plan_step([30000, 1000, 800], cost)
    s = plan.sequences[0]
    assert (s.ranks, s.a2a) == (tuple(range(8)), 8)
    assert head_ring_time(cost, s.ranks, [30000], 8).total < plain_ring_ms(cost, s.ranks, [30000], True)
    off = plan_step([30000, 1000, 800], cost, PlannerOptions(head_parallel=False))
    assert [x.a2a for x in off.sequences] == [1, 1, 1]
    assert plan.predicted.step_ms < off.predicted.step_ms  # type: ignore[union-attr]


def test_heads_that_do_not_split_keep_the_ring_or_a_narrower_width() -> None:
    c12 = _cost(q=12, kv=4)
    for lengths in ([30000, 1000, 800], [60000, 1000, 800]):
        s = plan_step(lengths, c12).sequences[0]
        assert s.placement == "intra_node" and s.a2a in (1,) + head_widths(c12, s.ranks) and s.a2a != 8
    assert choose_width(c12, tuple(range(8)), [30000], True) in (1, 2, 4)
    alternating = (0, 8, 1, 9, 2, 10, 3, 11)
    assert choose_width(_cost("2x8"), alternating, [65536], True) == 1  # no width: the plain ring


def test_tensor_parallel_heads_per_rank() -> None:
    """hq = 32, hkv = 8 at TP 2: 16 / 4 heads per Zeppelin rank; Ulysses over 8 replicates each K/V head."""
    tp2 = _cost(q=32, kv=8, tp=2)
    s = plan_step([60000, 1000, 800], tp2).sequences[0]
    assert (s.ranks, s.a2a) == (tuple(range(8)), 8)
    assert choose_width(tp2, tuple(range(8)), [30000], True) == 8  # 5.29 ms against 8.74 plain
    h = head_ring_time(tp2, tuple(range(8)), [30000], 8)
    assert h.diag == pytest.approx(tp2.ring_compute_profile(30000, 1)[0] / 8)


def test_a_member_ahead_of_its_partners_keeps_the_ring_plain() -> None:
    """Ranks 0-3 first run a 60k-token ring; ranks 4-7 are free meanwhile and rank 7 holds 40000 tokens of
    local work (142 ms), more than its wait. By its own time (charged, CHOICE_CHARGES) the 64k ring over 0-7
    runs best as Ulysses (47.1 vs 52.7 ms), but a plain ring lets ranks 4-7 start early (its first kernel,
    7.3 ms) and rank 7's local work after the ring starts that much sooner, where the all-to-all would hold
    them back. (This pins the rule. Until the one-block Ulysses path kept the kernel's dtype, 2026-11-24, the
    case was a 40k ring: 19.99 vs 22.34 ms, head start 2.6 ms; now 18.9 vs 22.3, so Ulysses, the head start
    no longer covering the difference.)"""
    cost = _cost()
    lengths = [60000, 64000, 40000, 500, 500, 500]
    a = [Assignment("intra_node", (0, 1, 2, 3)), Assignment("intra_node", tuple(range(8)))] + \
        [Assignment("local", (r,)) for r in (7, 4, 5, 6)]
    assert choose_widths(lengths, a, cost, PlannerOptions())[1] == 8  # the ring's own time
    widths = choose_widths(lengths, a, cost, PlannerOptions(), _layout(lengths, a, 8))
    assert widths[1] == 1 and widths[2:] == [1] * 4
    assert choose_widths(lengths, a, cost, PlannerOptions(head_parallel=False), _layout(lengths, a, 8)) == [1] * 6


def test_local_work_of_members_ahead_fits_the_heads_wait() -> None:
    """The same rings with 8000 tokens of local work on rank 7 (6.2 ms): in a Ulysses ring ranks 4-7 wait for
    ranks 0-3 inside the heads all-to-all and their local sequences run there (slots at step -1), nothing is
    left after the ring, so the head start no longer counts: Ulysses. Simulated, with and without the
    simulator's charges, it is faster than the plain ring with its step slots (4246 vs 4304 ms at 44ff427)."""
    from zeppelin_megatron.sim.simulator import simulate

    cost = _cost()
    lengths = [60000, 30000, 8000, 500, 500, 500]
    a = [Assignment("intra_node", (0, 1, 2, 3)), Assignment("intra_node", tuple(range(8)))] + \
        [Assignment("local", (r,)) for r in (7, 4, 5, 6)]
    widths = choose_widths(lengths, a, cost, PlannerOptions(), _layout(lengths, a, 8))
    assert widths[1:] == [8, 1, 1, 1, 1]  # (the 60k ring over ranks 0-3 runs at a = 2)
    groups = [x.ranks for x in a]
    uly, plain = (_plan(cost, lengths, groups, [widths[0], w, 1, 1, 1, 1]) for w in (8, 1))
    assert [(x.rank, x.ring, x.step) for x in uly.local_slots] == [(r, 1, -1) for r in (4, 5, 6, 7)]
    assert [x.step for x in plain.local_slots] == [0, 1, 1, 0]
    for charges in ("zeppelin", "none"):
        ms = [simulate(p, cost, keep_events=False, charges=charges).step_ms for p in (uly, plain)]
        assert ms[0] < ms[1], (charges, ms)


@pytest.fixture(scope="module")
def on_off_plans() -> list[tuple[StepPlan, StepPlan]]:
    """4x8 long-tailed batches (seeds 0-11), planned with head-parallel rings on (whole: no ring parts) and off, both
    without whole-document moves (their trades follow each plan's own ring times)."""
    cost = _cost("4x8")
    return [(plan_step(lengths, cost, PlannerOptions(ring_parts=False, packed_moves=False)),
             plan_step(lengths, cost, PlannerOptions(head_parallel=False, packed_moves=False)))
            for lengths in (long_tailed_batch(1 << 20, seed) for seed in range(12))]


def test_predicted_step_never_above_the_plain_plans(on_off_plans: list[tuple[StepPlan, StepPlan]]) -> None:
    """Head-parallel rings change block widths, not placements, except that with them on the packed
    candidates also pack by the head-parallel work model (packed.sharded_ms): a plan placed differently is
    such a packing (the same shards, or sharding from the head-parallel threshold; its rings absorbing whole
    sequences, packed_whole.absorb_whole, or not)."""
    cost = _cost("4x8")
    repacked = 0
    for seed, (on, off) in enumerate(on_off_plans):
        assert on.predicted.step_ms <= off.predicted.step_ms + 1e-6, seed  # type: ignore[union-attr]
        placed = [Assignment(s.placement, s.ranks) for s in on.sequences]
        if placed != [Assignment(s.placement, s.ranks) for s in off.sequences]:
            lengths = [s.length for s in on.sequences]
            assert on.origin == "packed" and any(
                packed_assignments(lengths, cost, cp, head_parallel=True, shard_from=sf, absorb=ab) == placed
                for cp in pack_sizes(lengths, cost.cluster)
                for sf in (None, head_parallel_threshold(lengths, cost, cp)) for ab in (False, True)), seed
            repacked += 1
    assert repacked < len(on_off_plans)


# -- prediction, timeline, slots -----------------------------------------------------------------------------


def test_prediction_counts_the_all_to_alls_as_exposed() -> None:
    """Ulysses over ranks 0-7 (16384 tokens) and a local sequence on rank 0: the lane's kernel is attention
    time, the all-to-alls exposed communication that the local call does not fill in the prediction (the
    slot inside the heads all-to-all, where the sequence overflows least, is not credited)."""
    cost = _cost()
    plan = _plan(cost, [16384, 3000], [tuple(range(8)), (0,)], [8, 1])
    h = head_ring_time(cost, tuple(range(8)), [16384], 8)
    pred, layers, o = plan.predicted, cost.model.layers, cost.call_overhead_ms
    assert pred is not None and plan.local_slots == (LocalSlot(0, 0, -1, (1,)),)  # the filling ring's only slot
    kernel = max(h.diag, o)
    assert pred.attention_ms[1] == pytest.approx(layers * kernel, abs=1e-5)
    assert pred.attention_ms[0] == pytest.approx(layers * (kernel + max(cost.local_ms(3000), o)), abs=1e-5)
    assert pred.exposed_comm_ms[0] == pytest.approx(layers * h.a2a_ms, abs=1e-5)
    assert pred.intra_MB[3] == pytest.approx(layers * h.a2a_bytes / 1e6, abs=1e-5)
    assert pred.inter_MB == (0.0,) * 8
    gaps, free = ring_timeline(plan, cost)
    assert gaps == {(r, 0, -1): pytest.approx(h.heads_ms) for r in range(8)} and free[0] == pytest.approx(h.total)


def test_timeline_of_a_hybrid_ring() -> None:
    """65536 tokens on 16 ranks of 2 A800 nodes at a = 8: two blocks, one lane step over the NICs (two lanes
    per NIC: 16.1 ms, longer than the 12.0 ms diagonal kernel: a gap); the ring ends after the all-to-alls."""
    cost = _cost("2x8@configs/clusters/a800.yaml")
    plan = _plan(cost, [65536, 20000], [tuple(range(16)), (3,)], [8, 1])
    h = head_ring_time(cost, tuple(range(16)), [65536], 8)
    gaps, free = ring_timeline(plan, cost)
    o = cost.call_overhead_ms
    gap = h.step_comm_ms - max(h.diag, o)
    assert gap > o and set(gaps) == {(r, 0, j) for r in range(16) for j in (-1, 0)}
    assert h.heads_ms < o and all(gaps[(r, 0, 0)] == pytest.approx(gap) and gaps[(r, 0, -1)] == pytest.approx(
        h.heads_ms) for r in range(16))  # everyone arrives at 0: the heads wait is the all-to-all alone
    # the step-0 transfer overlaps the diagonal kernel, the last kernel follows it (the prediction's
    # diag + max(off, comm) differs from that by diag - off, a few microseconds here)
    end = h.heads_ms + max(h.diag, o, h.step_comm_ms) + max(h.off, o) + h.tokens_ms
    assert free == [pytest.approx(end)] * 16 and end == pytest.approx(h.total, rel=1e-3)
    assert [(x.rank, x.ring, x.step) for x in plan.local_slots] == [(3, 0, 0)]  # the local call fills it


def test_ring_order_does_not_depend_on_widths(on_off_plans: list[tuple[StepPlan, StepPlan]]) -> None:
    """The choice reads the all-plain plan's timeline in ring order; the plan keeps that order (on the steps
    placed alike: with head-parallel rings on, a packing only they make can be chosen instead)."""
    same = 0
    for on, off in on_off_plans:
        if [(s.placement, s.ranks) for s in on.sequences] != [(s.placement, s.ranks) for s in off.sequences]:
            continue
        assert any(r.a2a > 1 for r in on.rings)
        assert [r.ranks for r in on.rings] == [r.ranks for r in off.rings]
        same += 1
    assert same >= 2


def test_widths_are_chosen_on_charged_ring_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """The earlier setting of the head-start test (a 30k ring over ranks 0-7): uncharged, Ulysses gains less than
    the head start and the ring stays plain; charged (CHOICE_CHARGES, the engine's merges and copies at each of
    the plain ring's 8 steps against one Ulysses call), Ulysses gains more, and the simulator agrees (7499 vs
    7560 ms at d34424f). Issue 12: Llama-13B prolong-128k on 128 GPUs kept a 20-rank cross-node ring plain
    (30.3 vs 28.8 ms uncharged, 40.1 vs 30.6 charged); simulated mean step 4666 -> 4404 ms."""
    import zeppelin_megatron.planner.choose_heads as ch
    from zeppelin_megatron.sim.simulator import simulate

    cost = _cost()
    lengths = [60000, 30000, 40000, 500, 500, 500]
    a = [Assignment("intra_node", (0, 1, 2, 3)), Assignment("intra_node", tuple(range(8)))] + \
        [Assignment("local", (r,)) for r in (7, 4, 5, 6)]
    layout = _layout(lengths, a, 8)
    charged = choose_widths(lengths, a, cost, PlannerOptions(), layout)
    monkeypatch.setattr(ch, "CHOICE_CHARGES", "none")
    bare = choose_widths(lengths, a, cost, PlannerOptions(), layout)
    assert charged[1] == 8 and bare[1] == 1
    groups = [x.ranks for x in a]
    ms = [simulate(_plan(cost, lengths, groups, w), cost, keep_events=False).step_ms for w in (charged, bare)]
    assert ms[0] < ms[1], ms


@pytest.mark.parametrize("spec", ["2x8", "4x8", "3x4", "16x8"])
def test_lane_comm_is_the_slowest_lane_hop(spec: str) -> None:
    """The memoised hop shape (a hop inside a node; the largest NIC sharing of one across) gives exactly the
    slowest of lane_hops' times, for contiguous and scattered rings, every width and several byte counts."""
    from zeppelin_megatron.planner.cost_heads import _lane_comm_ms

    cost = _cost(spec)
    world = cost.cluster.world_size
    rng = random.Random(7)
    checked = 0
    for _ in range(120):
        g = rng.choice([x for x in (2, 4, 6, 8, 12, 16, 32) if x <= world])
        start = rng.randrange(0, world - g + 1)
        ranks = tuple(range(start, start + g)) if rng.random() < 0.6 else tuple(sorted(rng.sample(range(world), g)))
        for a in (x for x in range(2, g + 1) if g % x == 0):
            for nbytes in (1.0, 123_456.0, 7e7):
                slowest = max(ms for _, _, ms in lane_hops(cost, ranks, a, nbytes))
                assert _lane_comm_ms(cost, ranks, a, nbytes) == slowest
                checked += 1
    assert checked > 100
