"""Bad input gets a clear error naming the value and the limit, never a partial plan."""

from __future__ import annotations

import pytest

from zeppelin_megatron.planner import (
    PlannerOptions,
    Cluster, ClusterError, CostModel, ModelError, ModelShape, PlanError, load_cluster, load_model, plan_step,
)

from .conftest import make_cost


def test_sequence_longer_than_cluster() -> None:
    cost = make_cost("2x2", tokens_per_gpu=1000)
    with pytest.raises(PlanError, match=r"5000 tokens, more than the cluster's total capacity of 4000"):
        plan_step([5000], cost)


def test_batch_over_capacity() -> None:
    cost = make_cost("1x2", tokens_per_gpu=1000)
    with pytest.raises(PlanError, match=r"2100 tokens, more than the cluster's total capacity of 2000"):
        plan_step([700, 700, 700], cost)


@pytest.mark.parametrize("lengths, match", [
    ([], "empty"),
    ([5, 0, 3], r"sequence 1: length 0 must be >= 1"),
    ([5, -2], r"sequence 1: length -2 must be >= 1"),
    ([5, 2.5], r"sequence 1: length 2.5 is not an integer"),
])
def test_bad_lengths(lengths: list, match: str) -> None:  # type: ignore[type-arg]
    cost = make_cost("1x2")
    with pytest.raises(PlanError, match=match):
        plan_step(lengths, cost)


def test_swapped_arguments() -> None:
    cost = make_cost("1x2")
    with pytest.raises(PlanError, match="cost_model is a Cluster, expected a CostModel"):
        plan_step([10], cost.cluster, cost)  # type: ignore[arg-type,call-arg]
    with pytest.raises(PlanError, match="options is a dict, expected a PlannerOptions"):
        plan_step([10], cost, {"routing": False})  # type: ignore[arg-type]


@pytest.mark.parametrize("spec, match", [
    ("4y8", "neither NODESxGPUS"),
    ("0x8", "nodes must be a positive integer, got 0"),
    ("2x8@/nonexistent.yaml", "neither NODESxGPUS"),
])
def test_bad_cluster_spec(spec: str, match: str) -> None:
    with pytest.raises(ClusterError, match=match):
        load_cluster(spec)


def test_inconsistent_cluster() -> None:
    base = dict(nodes=2, gpus_per_node=8, nics_per_node=4, nvlink_GBps=450.0, nic_Gbps=400.0, tokens_per_gpu=100)
    with pytest.raises(ClusterError, match="gpu_nic lists 3 entries but the cluster has 8 GPUs per node"):
        Cluster(gpu_nic=(0, 1, 2), **base)
    with pytest.raises(ClusterError, match=r"gpu_nic\[1\] = 9 is not a NIC index in \[0, 4\)"):
        Cluster(gpu_nic=(0, 9, 2, 3, 0, 1, 2, 3), **base)
    with pytest.raises(ClusterError, match=r"NICs \[3\] of 4 are attached to no GPU"):
        Cluster(gpu_nic=(0, 1, 2, 2, 0, 1, 2, 2), **base)
    with pytest.raises(ClusterError, match="unknown cluster keys"):
        Cluster.from_dict(dict(base, gpu_nic=[0] * 8, colour="red"))
    with pytest.raises(ClusterError, match="the spec asks for 4"):
        load_cluster("2x4@configs/clusters/h100.yaml")


def test_bad_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelError, match="q_heads = 32 is not divisible by kv_heads = 5"):
        ModelShape(layers=1, hidden=4096, q_heads=32, kv_heads=5, ffn=1)
    f = tmp_path / "m.yaml"
    f.write_text("layers: 2\nhidden: 64\n")
    with pytest.raises(ModelError, match=r"missing keys \['ffn', 'kv_heads', 'q_heads'\]"):
        load_model(f)
    with pytest.raises(ValueError, match="kv_heads = 32 is not divisible by tensor_parallel = 3"):
        CostModel(model=load_model(None), cluster=load_cluster("1x2"), tensor_parallel=3)


def test_bad_options() -> None:
    cost = make_cost("1x2")
    with pytest.raises(PlanError, match=r"slack is 2.0, expected a fraction in \[0, 1\)"):
        plan_step([10], cost, PlannerOptions(slack=2.0))
    with pytest.raises(PlanError, match="placements \\['everywhere'\\]: expected distinct names"):
        plan_step([10], cost, PlannerOptions(placements=("everywhere",)))
