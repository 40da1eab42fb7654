"""Simulator against hand-computed cases: one flow, shared NIC, max-min, ring, overlap."""

from __future__ import annotations

from dataclasses import replace

import math

import pytest

from zeppelin_megatron.planner import Cluster, CostModel, load_model
from zeppelin_megatron.sim.network import Flow, FluidNetwork
from zeppelin_megatron.sim.planbuild import build_plan
from zeppelin_megatron.sim.program import Leg, LayerProgram, Op, Traffic
from zeppelin_megatron.sim.simulator import link_capacities, simulate, simulate_program


def _run(net: FluidNetwork) -> dict[object, float]:
    done = {}
    while True:
        t = net.next_event_time()
        if t == math.inf:
            return done
        for f in net.advance(t):
            done[f.tag] = f.done_at


def test_one_flow_is_latency_plus_bytes_over_bandwidth() -> None:
    net = FluidNetwork({"a": 10.0})
    net.start(Flow(50.0, ("a",), 0.5, tag="x"))
    assert _run(net)["x"] == pytest.approx(0.5 + 5.0)


def test_two_flows_share_a_resource_equally() -> None:
    net = FluidNetwork({"nic": 10.0})
    net.start(Flow(50.0, ("nic",), 0.0, tag="x"))
    net.start(Flow(50.0, ("nic",), 0.0, tag="y"))
    done = _run(net)
    assert done["x"] == pytest.approx(10.0) and done["y"] == pytest.approx(10.0)


def test_max_min_fair_progressive_filling() -> None:
    # A uses r1 (cap 10) and r2 (cap 4); B uses r2; C uses r1.
    # r2 is the bottleneck: A = B = 2; C gets the rest of r1: 8.
    # A, B move 20 bytes: done at 10. C moves 40 bytes: 8/ms until A leaves r1
    # at t = 10 (40 bytes would take 5 ms) -> C done at 5.
    net = FluidNetwork({"r1": 10.0, "r2": 4.0})
    net.start(Flow(20.0, ("r1", "r2"), 0.0, tag="A"))
    net.start(Flow(20.0, ("r2",), 0.0, tag="B"))
    net.start(Flow(40.0, ("r1",), 0.0, tag="C"))
    done = _run(net)
    assert done["C"] == pytest.approx(5.0)
    assert done["A"] == pytest.approx(10.0) and done["B"] == pytest.approx(10.0)


def test_rates_rise_when_a_flow_leaves() -> None:
    # Two flows on one 10 B/ms link: 10 and 30 bytes. Both at 5 until t = 2
    # (first done), then the second alone at 10: 30 - 10 = 20 left -> t = 4.
    net = FluidNetwork({"l": 10.0})
    net.start(Flow(10.0, ("l",), 0.0, tag="s"))
    net.start(Flow(30.0, ("l",), 0.0, tag="t"))
    done = _run(net)
    assert done["s"] == pytest.approx(2.0) and done["t"] == pytest.approx(4.0)


def _cluster(nodes: int, gpus: int, nics: int, gpu_nic: tuple[int, ...], nic_Gbps: float = 400.0) -> Cluster:
    return Cluster(nodes=nodes, gpus_per_node=gpus, nics_per_node=nics, gpu_nic=gpu_nic, nvlink_GBps=400.0,
                   nic_Gbps=nic_Gbps, tokens_per_gpu=1 << 20, nvlink_latency_us=5.0, nic_latency_us=10.0)


def _cost(cluster: Cluster, layers: int = 1) -> CostModel:
    model = load_model(None)
    from dataclasses import replace
    return CostModel(model=replace(model, layers=layers), cluster=cluster)


def test_nic_shared_by_two_gpus_gives_each_half() -> None:
    # 2 nodes x 2 GPUs, one NIC per node: GPUs 0 and 1 send 1 GB each to 2 and 3.
    cl = _cluster(2, 2, 1, (0, 0))
    cost = _cost(cl)
    nbytes = 1e9
    t = Traffic(("x",), "ring", [[Leg(0, 2, nbytes, "nic")], [Leg(1, 3, nbytes, "nic")]])
    ops = [[Op("post", key=("x",)), Op("wait", key=("x",), kind="ring")] for _ in range(4)]
    res = simulate_program(LayerProgram(ops, {("x",): t}), cost)
    _, nic = link_capacities(cost)
    assert nic == pytest.approx(50e6)  # 400 Gb/s = 50 GB/s = 5e7 bytes/ms
    expected = 10e-3 + 2 * nbytes / nic  # latency, then half of the NIC each
    assert res.layer_ms == pytest.approx(expected)
    # And alone: half the time.
    t1 = Traffic(("x",), "ring", [[Leg(0, 2, nbytes, "nic")]])
    res1 = simulate_program(LayerProgram(ops, {("x",): t1}), cost)
    assert res1.layer_ms == pytest.approx(10e-3 + nbytes / nic)
    assert res.nic_util[(0, 0)] == pytest.approx(2 * nbytes / nic / expected)


def test_full_overlap_and_no_overlap() -> None:
    cl = _cluster(1, 2, 2, (0, 1))
    cost = _cost(cl)
    nvl, _ = link_capacities(cost)
    nbytes = 10.0 * nvl  # 10 ms on NVLink (+ 5 us latency)
    comm = 5e-3 + 10.0
    t = {("x",): Traffic(("x",), "ring", [[Leg(0, 1, nbytes, "nvl")]])}
    overlap = [[Op("post", key=("x",)), Op("compute", 25.0, "attention"), Op("wait", key=("x",), kind="ring")]
               for _ in range(2)]
    res = simulate_program(LayerProgram(overlap, t), cost)
    assert res.layer_ms == pytest.approx(25.0)          # transfer fully hidden
    assert res.exposed_comm_ms == pytest.approx(0.0)
    serial = [[Op("post", key=("x",)), Op("wait", key=("x",), kind="group"), Op("compute", 25.0, "attention")]
              for _ in range(2)]
    res = simulate_program(LayerProgram(serial, t), cost)
    assert res.layer_ms == pytest.approx(comm + 25.0)   # nothing hidden
    assert res.exposed_comm_ms == pytest.approx(comm)
    assert res.wait_ms == (pytest.approx(comm), pytest.approx(comm))
    partial = [[Op("post", key=("x",)), Op("compute", 4.0, "attention"), Op("wait", key=("x",), kind="ring")]
               for _ in range(2)]
    res = simulate_program(LayerProgram(partial, t), cost)
    assert res.layer_ms == pytest.approx(comm)           # 4 ms hidden, the rest exposed
    assert res.exposed_comm_ms == pytest.approx(comm - 4.0)


def test_one_ring_matches_hand_computation() -> None:
    # One sequence of 16 384 tokens over a 2-GPU ring (1 node), no remap.
    cl = _cluster(1, 2, 2, (0, 1))
    cost = _cost(cl, layers=3)
    plan = build_plan([16384], [(0, 1)], cl, cost)
    res = simulate(plan, cost, charges="none")
    o = cost.call_overhead_ms
    diag, off = cost.ring_compute_profile(16384, 2)
    nvl, _ = link_capacities(cost)
    comm = 5e-3 + 3 * cost.ring_step_bytes(16384, 2) / nvl
    lin = cost.linear_ms(8192)
    # linear/2, step 0 (transfer overlapped with the diagonal), step 1 (no transfer), linear/2.
    layer = lin / 2 + max(max(diag, o), comm) + max(off, o) + lin / 2
    assert res.layer_ms == pytest.approx(layer)
    assert res.step_ms == pytest.approx(3 * layer)
    assert res.compute_ms[0] == pytest.approx(3 * (lin + max(diag, o) + max(off, o)))
    kinds = [e.kind for e in res.events if e.rank == 0]
    assert kinds[0] == "linear" and kinds[-1] == "linear" and "attention" in kinds


def test_all_to_all_goes_rail_aligned_then_fans_out() -> None:
    # 2 nodes x 2 GPUs (one NIC each): rank 0 sends 1 GB to each of ranks 2 and 3.
    # PXN-style: 2 GB over rank 0's NIC to rank 2 (its rail peer), then 1 GB 2 -> 3 on NVLink.
    from zeppelin_megatron.sim.layer_ops import pairs_transfer
    cl = _cluster(2, 2, 2, (0, 1))
    cost = _cost(cl)
    t = pairs_transfer(("a",), "group", cost, {(0, 2): 1e9, (0, 3): 1e9})
    assert [[(h.src, h.dst, h.nbytes, h.link) for h in c] for c in t.chains] == [
        [(0, 2, 2e9, "nic")], [(2, 3, 1e9, "nvl")]]
    ops = [[Op("post", key=("a",)), Op("wait", key=("a",), kind="group")] for _ in range(4)]
    res = simulate_program(LayerProgram(ops, {("a",): t}), cost)
    nvl, nic = link_capacities(cost)
    assert res.layer_ms == pytest.approx(10e-3 + 2e9 / nic + 5e-3 + 1e9 / nvl)


def test_fill_engine_runs_local_work_during_ring_waits() -> None:
    cl = _cluster(1, 2, 2, (0, 1))
    cost = _cost(cl)
    nvl, _ = link_capacities(cost)
    comm = 5e-3 + 10.0
    t = {("x",): Traffic(("x",), "ring", [[Leg(0, 1, 10.0 * nvl, "nvl")]])}
    ops = [[Op("post", key=("x",)), Op("compute", 1.0, "attention"), Op("wait", key=("x",), kind="ring"),
            Op("local", kind="local")] for _ in range(2)]
    queue = [[3.0, 2.0], []]
    runtime = simulate_program(LayerProgram(ops, t, queue), cost, engine="runtime")
    assert runtime.finish_ms[0] == pytest.approx(comm + 5.0)      # local work after the ring
    assert runtime.finish_ms[1] == pytest.approx(comm)
    fill = simulate_program(LayerProgram(ops, t, queue), cost, engine="fill")
    assert fill.finish_ms[0] == pytest.approx(comm)               # 1 + 3 + 2 ms hidden in the 10 ms wait
    assert fill.compute_ms[0] == pytest.approx(6.0)
    long_queue = [[8.0, 6.0], []]                                  # 1 + 8 + 6 > 10: the wait ends mid-call
    fill = simulate_program(LayerProgram(ops, t, long_queue), cost, engine="fill")
    assert fill.finish_ms[0] == pytest.approx(1.0 + 8.0 + 6.0)
    with pytest.raises(ValueError, match="engine"):
        simulate_program(LayerProgram(ops, t, queue), cost, engine="nope")


def test_routed_ring_hop_splits_over_proxies() -> None:
    # 2 nodes x 2 GPUs, one NIC per GPU; one sequence on the ring (0, 2). Both hops cross
    # nodes and are routed over proxies (own NIC + the other GPU's): the direct part goes
    # 0 -> 2 on NIC 0; the other part 0 -> 1 (NVLink), 1 -> 3 (NIC 1), 3 -> 2 (NVLink).
    from zeppelin_megatron.planner.routing import split_counts
    cl = _cluster(2, 2, 2, (0, 1), nic_Gbps=1.0)   # slow NICs: the transfer dominates the step
    cost = _cost(cl)
    s = 65536
    plan = build_plan([s], [(0, 2)], cl, cost, routing=True)
    routes = plan.routes_for((0, 2))
    assert routes[(0, 2)].proxies == (0, 1) and routes[(2, 0)].proxies == (0, 1)
    nvl, nic = link_capacities(cost)
    nbytes = 3 * cost.ring_step_bytes(s, 2)
    direct, other = split_counts(nbytes, 2)
    comm = max(10e-3 + direct / nic, 5e-3 + other / nvl + 10e-3 + other / nic + 5e-3 + other / nvl)
    o = cost.call_overhead_ms
    diag, off = cost.ring_compute_profile(s, 2)
    lin = cost.linear_ms(s // 2)
    assert comm > 10 * max(diag, o)
    res = simulate(plan, cost, charges="none")
    assert res.layer_ms == pytest.approx(lin + max(max(diag, o), comm) + max(off, o))
    # Relays (ranks 1 and 3) post, wait and compute nothing.
    assert res.compute_ms[1] == 0.0 and res.compute_ms[3] == 0.0
    unrouted = simulate(plan, cost, routing=False, charges="none")
    assert unrouted.layer_ms == pytest.approx(lin + max(max(diag, o), 10e-3 + nbytes / nic) + max(off, o))


def test_agrees_with_the_planner_prediction_where_its_assumptions_hold() -> None:
    # One ring over a whole node, compute-bound (NVLink hides the transfers), no local
    # work, no remap: the planner's predict() and the simulator must agree exactly.
    from zeppelin_megatron.planner import load_cluster
    from zeppelin_megatron.planner.predict import predict
    cl = load_cluster("1x4")
    cost = CostModel(model=load_model(None), cluster=cl)
    lengths = [40000, 24000, 9000]
    plan = build_plan(lengths, [(0, 1, 2, 3)] * 3, cl, cost)
    for s in lengths:
        assert cost.comm_ratio(s, 4, inter_node=False) > 1
    assert simulate(plan, cost, charges="none").step_ms == pytest.approx(predict(plan, cost).step_ms, rel=1e-6)


def test_runtime_engine_runs_a_local_chunk_inside_each_ring_step() -> None:
    # 1 node x 2 GPUs: one ring (0, 1) (1 step with a transfer), one local sequence per rank,
    # token-balanced so no remap; the plan puts each rank's local sequence in the ring's step 0.
    # The runtime engine runs the local call after the ring's step-0 compute, before its wait:
    # the transfer hides behind diag + local.
    from zeppelin_megatron.planner.plan import LocalSlot
    from zeppelin_megatron.sim.program import build_layer_program
    cl = _cluster(1, 2, 2, (0, 1))
    cost = _cost(cl)
    plan = build_plan([16384, 3000, 3000], [(0, 1), (0,), (1,)], cl, cost, local_slots=False)
    plan = replace(plan, local_slots=(LocalSlot(0, 0, 0, (1,)), LocalSlot(1, 0, 0, (2,))))
    assert not any(s.lin_rank != s.att_rank for s in plan.remap.segments)
    o = cost.call_overhead_ms
    diag, off = cost.ring_compute_profile(16384, 2)
    loc = max(cost.local_ms(3000), o)
    nvl, _ = link_capacities(cost)
    comm = 5e-3 + 3 * cost.ring_step_bytes(16384, 2) / nvl
    lin = cost.linear_ms(8192 + 3000)
    prog = build_layer_program(plan, cost, charges="none")
    for r in range(2):
        attn = [(op.what, op.kind) for op in prog.ops[r] if op.kind != "linear"]
        assert attn == [("post", ""), ("compute", "attention"), ("compute", "local"), ("wait", "ring"),
                        ("compute", "attention")], attn
    assert simulate(plan, cost, charges="none").layer_ms == pytest.approx(
        lin + max(max(diag, o) + loc, comm) + max(off, o))
    old = build_layer_program(plan, cost, interleave_local=False, charges="none")  # what the fill engine draws from
    assert [op.what for op in old.ops[0] if op.kind != "linear"] == ["post", "compute", "wait", "compute", "local"]
    assert old.local_queue == [[cost.local_ms(3000)], [cost.local_ms(3000)]]
    assert simulate(plan, cost, engine="fill", charges="none").layer_ms == pytest.approx(
        lin + max(max(diag, o) + max(cost.local_ms(3000), o), comm) + max(off, o))


def test_runtime_engine_runs_the_plans_local_slots() -> None:
    # Rings (0, 1) then (0, 1, 2): rank 2 starts (0, 1, 2) while ranks 0, 1 are still in (0, 1),
    # so it idles at step 0 of its ring; build_plan's schedule (planner.local_schedule) puts its
    # local sequence that fits there, and the one too long for the gap too ((0, 1, 2) is the last
    # ring: it fills). Rank 3, in no ring, runs its local sequence after the (absent) rings.
    from zeppelin_megatron.planner.local_schedule import ring_timeline
    from zeppelin_megatron.planner.plan import LocalSlot
    from zeppelin_megatron.sim.program import build_layer_program
    cl = _cluster(1, 4, 4, (0, 1, 2, 3))
    cost = _cost(cl)
    plan = build_plan([12000, 40000, 4000, 40000, 9000], [(0, 1, 2), (0, 1), (2,), (2,), (3,)], cl, cost)
    assert [r.ranks for r in plan.rings] == [(0, 1), (0, 1, 2)]
    gaps, _ = ring_timeline(plan, cost)
    gap = gaps[(2, 1, 0)]
    assert cost.local_ms(4000) < gap < cost.local_ms(40000)
    assert plan.local_slots == (LocalSlot(2, 1, 0, (2, 3)),)
    prog = build_layer_program(plan, cost, charges="none")
    ops = [op for op in prog.ops[2] if op.kind not in ("linear", "remap") and op.what != "post"]
    a, loc, w = ("compute", "attention"), ("compute", "local"), ("wait", "ring")
    assert [(op.what, op.kind) for op in ops] == [a, loc, w, a, w, a]
    assert [op.ms for op in ops if op.kind == "local"] == pytest.approx([cost.local_ms(4000) + cost.local_ms(40000)])
    assert [(op.what, op.kind) for op in prog.ops[3] if op.kind not in ("linear", "remap")] == [loc]
    assert all(q == [] for q in prog.local_queue)  # nothing left for an end-of-attention queue
    # without slots rank 2 idles, then runs both sequences after the rings: a longer layer
    no_slot = build_layer_program(replace(plan, local_slots=()), cost, charges="none")
    assert [(op.what, op.kind) for op in no_slot.ops[2] if op.kind not in ("linear", "remap")
            and op.what != "post"] == [a, w, a, w, a, loc]
    assert (simulate(plan, cost, charges="none").layer_ms
            < simulate(replace(plan, local_slots=()), cost, charges="none").layer_ms)
