"""Routed remap (planner side): three all-to-all phases reproduce the direct exchange exactly, cross
nodes only on the proxies' rails, and spread a node's network rows over its NICs."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from zeppelin_megatron.planner import CostModel, PlanError, StepPlan, load_cluster, load_model, plan_step
from zeppelin_megatron.planner import PlannerOptions
from zeppelin_megatron.planner.predict import predict, remap_time
from zeppelin_megatron.planner.remap_cost import remap_proxies_for
from zeppelin_megatron.planner.remap_routing import nic_proxies, routed_exchange
from zeppelin_megatron.planner.workloads import long_tailed_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from plan_factory import random_plan  # noqa: E402


def _tokens(plan: StepPlan, layout: str, r: int) -> np.ndarray:
    """Token ids (seq * 10^6 + position) of rank ``r``'s buffer in ``layout``."""
    ranges = plan.linear_layout[r] if layout == "linear" else plan.attention_layout[r]
    return np.array([q * 10**6 + t for q, s, e in ranges for t in range(s, e)], dtype=np.int64)


def _play(plan: StepPlan, direction: str, proxies: tuple[int, ...]) -> tuple[list[np.ndarray], np.ndarray]:
    """Run every rank's routed phases with an in-memory all-to-all; -> (destination buffers,
    rows each (node, rail) NIC sends per phase-2 [nodes, gpn])."""
    gpn, world = plan.gpus_per_node, plan.world_size
    src, dst = ("linear", "attention") if direction == "to_attention" else ("attention", "linear")
    ex = routed_exchange(plan.remap, direction, gpn, proxies)
    bufs = [_tokens(plan, src, r)[plan.remap.exchange(r, direction).send_index] for r in range(world)]
    nic = np.zeros((plan.nodes, gpn), dtype=np.int64)
    for t in range(3):
        sent = [bufs[r][ex[r].phases[t].send_index] for r in range(world)]
        new = []
        for r in range(world):
            got = []
            for s in range(world):
                counts = ex[s].phases[t].send_counts
                n, off = counts[r], sum(counts[:r])
                assert ex[r].phases[t].recv_counts[s] == n
                if n:
                    if t == 1:  # the network phase: rail-aligned, across nodes, on a proxy's rail
                        assert s // gpn != r // gpn and s % gpn == r % gpn and s % gpn in proxies, (t, s, r)
                        nic[s // gpn, s % gpn] += n
                    else:       # NVLink phases stay inside a node
                        assert s // gpn == r // gpn, (t, s, r)
                got.append(sent[s][off:off + n])
            new.append(np.concatenate([bufs[r][ex[r].phases[t].keep_index], *got]))
        bufs = new
    out = []
    for r in range(world):
        y = np.full(plan.tokens(r, dst), -1, dtype=np.int64)
        direct = plan.remap.exchange(r, direction)
        y[direct.recv_index] = bufs[r][ex[r].final_index]
        y[direct.keep_dst] = _tokens(plan, src, r)[direct.keep_src]  # staying rows never enter a phase
        out.append(y)
    return out, nic


@pytest.mark.parametrize("nodes, gpn", [(2, 2), (2, 4), (4, 2), (3, 3)])
def test_routed_phases_deliver_exactly_what_the_direct_exchange_does(nodes: int, gpn: int) -> None:
    for seed in range(12):
        plan = random_plan(seed, nodes, gpn)
        proxies = tuple(range(gpn)) if seed % 2 else tuple(range(0, gpn, 2))
        for direction in ("to_attention", "to_linear"):
            got, _ = _play(plan, direction, proxies)
            want = "attention" if direction == "to_attention" else "linear"
            for r in range(plan.world_size):
                assert np.array_equal(got[r], _tokens(plan, want, r)), (seed, direction, r)


def test_a_nodes_network_rows_spread_over_its_nics() -> None:
    # 4 x 8, a long-tailed batch: the direct remap sends each moved row over its source's NIC;
    # routed, every pair's rows split evenly over the 8 rails (parts differ by at most one row).
    cl = load_cluster("4x8")
    cost = CostModel(model=load_model(None), cluster=cl)
    # plain rings: with head-parallel rings this batch's plan needs no routed remap
    plan = plan_step(long_tailed_batch(1 << 20, seed=0), cost, PlannerOptions(head_parallel=False, packed=False))
    assert plan.remap_proxies == tuple(range(8))
    _, nic = _play(plan, "to_attention", plan.remap_proxies)
    counts = plan.remap.counts("to_attention")
    pairs = [(a, b) for a in range(32) for b in range(32) if a // 8 != b // 8 and counts[a, b]]
    assert pairs, "this batch moves rows across nodes"
    for n in range(4):
        assert nic[n].max() - nic[n].min() <= len(pairs)  # split_counts: at most one row apart per pair
        assert nic[n].sum() == sum(int(counts[a, b]) for a, b in pairs if a // 8 == n)


def test_proxies_one_per_nic_and_the_planner_default() -> None:
    assert nic_proxies((0, 0, 1, 1)) == (0, 2) and nic_proxies((3, 2, 1, 0)) == (3, 2, 1, 0)
    cl = load_cluster("4x8")
    cost = CostModel(model=load_model(None), cluster=cl)
    lengths = long_tailed_batch(1 << 20, seed=0)
    routed = plan_step(lengths, cost, PlannerOptions(head_parallel=False, packed=False))  # (see the test above)
    direct = plan_step(lengths, cost, PlannerOptions(routing=False))
    assert routed.remap_proxies == remap_proxies_for(routed, cost) == tuple(range(8))
    assert direct.remap_proxies == () and plan_step(lengths, cost, PlannerOptions(remap=False)).remap_proxies == ()
    # chosen because the prediction prices the spread cheaper than one NIC per GPU
    assert remap_time(routed, cost, routed.remap_proxies)[0] < remap_time(routed, cost, ())[0]
    assert predict(routed, cost).remap_ms < predict(replace(routed, remap_proxies=()), cost).remap_ms
    single = load_cluster("1x8")
    one = plan_step(lengths[:len(lengths) // 3], CostModel(model=load_model(None), cluster=single))
    assert one.remap_proxies == ()  # nothing crosses nodes


def test_remap_proxies_round_trip_and_validation() -> None:
    plan = random_plan(2, 2, 4)
    routed = replace(plan, remap_proxies=(0, 2))
    back = StepPlan.from_json(routed.to_json())
    assert back.remap_proxies == (0, 2) and back.digest() == routed.digest() != plan.digest()
    assert "remap_proxies" not in replace(plan, remap_proxies=()).to_dict()
    for bad in ((0, 0), (4,), (-1,)):
        with pytest.raises(PlanError, match=r"remap_proxies must be distinct local indices in \[0, 4\)"):
            replace(plan, remap_proxies=bad)
    with pytest.raises(ValueError, match="proxies must be distinct local indices"):
        routed_exchange(plan.remap, "to_attention", 4, ())
