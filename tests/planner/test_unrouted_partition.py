"""``plan_step`` partitions without routing too when the routed plan's remap and relay waits dominate its
predicted step (``api._unrouted_partition``; cost-model predictions)."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import pytest

import zeppelin_megatron.planner.api as api
from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.api import REMAP_BOUND
from zeppelin_megatron.planner.partition import partition
from zeppelin_megatron.planner.workloads import long_tailed_batch
from zeppelin_megatron.sim.lengths import sample_steps


@lru_cache(maxsize=None)
def _slow_nic_cost() -> CostModel:
    """Llama-7B on 16 x 8 H100 with the NICs 30% slower (cluster and profile, as benchmarks/sensitivity.py)."""
    base = CostModel(model=load_model("configs/models/llama_7b.yaml"), cluster=load_cluster("16x8"))
    cluster = replace(base.cluster, nic_Gbps=base.cluster.nic_Gbps * 0.7)
    profile = replace(base.profile, nic_GBps=base.profile.nic_GBps * 0.7) if base.profile.nic_GBps else base.profile
    return CostModel(model=base.model, cluster=cluster, profile=profile)


def test_remap_bound_plans_the_unrouted_partition_too(monkeypatch: pytest.MonkeyPatch) -> None:
    cost = _slow_nic_cost()
    lengths = sample_steps("prolong-64k", 1, 1 << 20, 0)[0]
    opts = PlannerOptions(packed=False, ring_parts=False)  # the partitioner's plans alone (a packed one wins here)
    routed_only = api._finish(lengths, partition(lengths, cost, opts), cost, opts)
    assert routed_only.predicted is not None
    # since the relays' waits are charged its remap is 24% of its step, under the bound: with the relays' waits
    # (another 24%) the two costs of routing the partitioner does not score dominate
    step = routed_only.predicted.step_ms
    assert routed_only.predicted.remap_ms <= REMAP_BOUND * step < routed_only.predicted.remap_ms + api._relay_ms(
        routed_only, cost)
    assert api._relay_ms(routed_only, cost) > 0.2 * step
    plan = plan_step(lengths, cost, opts)
    unrouted = api._finish(lengths, partition(lengths, cost, replace(opts, routing=False)), cost, opts)
    assert plan.predicted is not None and unrouted.predicted is not None
    assert plan.predicted.step_ms == unrouted.predicted.step_ms < 0.9 * routed_only.predicted.step_ms
    assert plan.to_json() == unrouted.to_json()
    packed = plan_step(lengths, cost)  # by default: a packed candidate, lower still (no remap at all)
    assert packed.origin == "packed" and packed.predicted is not None
    assert packed.predicted.step_ms < plan.predicted.step_ms and packed.predicted.remap_ms == 0.0


def test_no_second_partition_where_the_remap_does_not_dominate(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    real = api.partition

    def counted(lengths: list[int], cost: CostModel, options: PlannerOptions) -> object:
        calls.append(options.routing)
        return real(lengths, cost, options)

    monkeypatch.setattr(api, "partition", counted)
    cost = CostModel(model=load_model(None), cluster=load_cluster("16x8"))
    for seed in range(3):  # benchmarks/plan_speed.py's batches
        plan = plan_step(long_tailed_batch(1 << 20, seed), cost)
        assert plan.predicted is not None and plan.predicted.remap_ms <= REMAP_BOUND * plan.predicted.step_ms
    assert calls == [True, True, True]
    calls.clear()
    plan_step(long_tailed_batch(1 << 20, 0), cost, PlannerOptions(routing=False))
    assert calls == [False]
