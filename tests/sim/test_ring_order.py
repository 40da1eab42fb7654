"""Simulated effect of the ring order (StepPlan.rings): a chain of rings convoys less (simulated)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zeppelin_megatron.planner import Cluster, CostModel, load_model
from zeppelin_megatron.sim.planbuild import build_plan
from zeppelin_megatron.sim.simulator import simulate


def _cost() -> CostModel:
    cl = Cluster(nodes=1, gpus_per_node=4, nics_per_node=4, gpu_nic=(0, 1, 2, 3), nvlink_GBps=400.0,
                 nic_Gbps=400.0, tokens_per_gpu=1 << 20, nvlink_latency_us=5.0, nic_latency_us=10.0)
    return CostModel(model=replace(load_model(None), layers=1), cluster=cl)


def test_chain_of_rings_runs_its_ends_together(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rings (0, 1), (1, 2), (2, 3), one 32k-token sequence each (compute-bound on NVLink).
    cost = _cost()
    s = 32768
    groups = [(0, 1), (1, 2), (2, 3)]
    plan = build_plan([s, s, s], groups, cost.cluster, cost)
    assert [r.ranks for r in plan.rings] == [(0, 1), (2, 3), (1, 2)]
    new = simulate(plan, cost, charges="none")

    import zeppelin_megatron.planner.plan as plan_module
    monkeypatch.setattr(plan_module, "ring_order", lambda rings, lengths: tuple(sorted(rings, key=lambda r: r.ranks)))
    old_plan = build_plan([s, s, s], groups, cost.cluster, cost)
    assert [r.ranks for r in old_plan.rings] == groups
    old = simulate(old_plan, cost, charges="none")

    o = cost.call_overhead_ms
    diag, off = cost.ring_compute_profile(s, 2)
    ring = max(diag, o) + max(off, o)               # compute-bound: NVLink hides each step's transfer
    lin = cost.linear_ms(s)                         # ranks 1 and 2 hold s/2 tokens of two sequences
    # New order: A and C run together, then B on ranks 1 and 2.
    assert new.layer_ms == pytest.approx(lin + 2 * ring, rel=1e-3)
    # Sorted order: rank 2 computes B's diagonal, then waits for rank 1 (busy in A) before B's
    # second step, and C on rank 3 waits for rank 2: the chain costs at least one more step.
    assert old.layer_ms > new.layer_ms + 0.9 * max(off, o)
