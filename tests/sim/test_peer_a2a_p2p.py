"""te-cp-a2a-p2p: hand-computed programs, head divisibility (GQA), size choice."""

from __future__ import annotations

import pytest

from zeppelin_megatron.planner import CostModel, PlanError, load_cluster, load_model
from zeppelin_megatron.planner.model import ModelShape
from zeppelin_megatron.sim import plan_with
from zeppelin_megatron.sim.simulator import simulate
from zeppelin_megatron.sim.te_cp_a2a_p2p import A2AP2P, a2a_p2p_plan, heads_divisible, size_candidates


def _cost(spec: str, model: ModelShape | None = None, tp: int = 1) -> CostModel:
    return CostModel(model=model or load_model(None), cluster=load_cluster(spec, tokens_per_gpu=65536),
                     tensor_parallel=tp)


def test_two_sequence_batch_in_one_node() -> None:
    # 1 node x 2 GPUs, a2a 2 x p2p 1: one CP group; each rank holds 4096 tokens (two half sequences).
    cost = _cost("1x2")
    plan, sizes = a2a_p2p_plan([4096, 4096], cost.cluster, cost, a2a=2, p2p=1)
    assert sizes == A2AP2P(2, 1) and all(s.ranks == (0, 1) for s in plan.sequences)
    per_pair = 4096 * (2 * cost.q_bytes_per_token + cost.kv_bytes_per_token) / 2
    attn = max(2 * cost.causal_ms(4096) / 2, cost.call_overhead_ms)
    layer = cost.linear_ms(4096) + 2 * cost.nvlink_ms(per_pair) + attn
    assert simulate(plan, cost, attention_comm="a2a_p2p", charges="none").layer_ms == pytest.approx(layer, rel=1e-9)


def test_cross_node_ring_between_all_to_all_groups() -> None:
    # 2 nodes x 2 GPUs, a2a 2 x p2p 2: all-to-all inside each node, rings (0, 2) and (1, 3) over the NICs.
    cost = _cost("2x2")
    n = 16384
    plan, _ = a2a_p2p_plan([n], cost.cluster, cost, a2a=2, p2p=2)
    assert plan.sequences[0].ranks == (0, 1, 2, 3) and plan.sequences[0].placement == "inter_node"
    held = n // 4
    a2a = cost.nvlink_ms(held * (2 * cost.q_bytes_per_token + cost.kv_bytes_per_token) / 2)
    diag, off = cost.ring_compute_profile(n, 2)
    o = cost.call_overhead_ms
    comm = cost.nic_ms(3 * cost.ring_step_bytes(n, 2) / 2)
    layer = cost.linear_ms(held) + 2 * a2a + max(max(diag / 2, o), comm) + max(off / 2, o)
    res = simulate(plan, cost, attention_comm="a2a_p2p", charges="none")
    assert res.layer_ms == pytest.approx(layer, rel=1e-9)
    assert res.network_MB > 0


def test_gqa_heads_must_divide_the_all_to_all_group() -> None:
    gqa = ModelShape(layers=32, hidden=4096, q_heads=32, kv_heads=4, ffn=14336, name="gqa-4kv")
    cost = _cost("2x8", gqa)
    assert heads_divisible(cost, 4) and not heads_divisible(cost, 8)
    assert {c.a2a for c in size_candidates([8192] * 4, cost)} == {2, 4}
    with pytest.raises(PlanError, match="a2a=8, p2p=2 are not allowed.*32 query heads and 4 kv heads"):
        a2a_p2p_plan([8192] * 4, cost.cluster, cost, a2a=8, p2p=2)
    # Tensor parallelism divides the kv heads first: 4 kv heads / TP 2 = 2 per rank -> only a2a = 2.
    tp2 = _cost("2x8", gqa, tp=2)
    assert {c.a2a for c in size_candidates([8192] * 4, tp2)} == {2}
    # One kv head per rank leaves no all-to-all size: refused, with the counts.
    one = _cost("2x8", ModelShape(layers=2, hidden=1024, q_heads=8, kv_heads=1, ffn=2048))
    with pytest.raises(PlanError, match="8 query heads and 1 kv heads"):
        a2a_p2p_plan([4096] * 4, one.cluster, one)


def test_sizes_are_the_best_simulated() -> None:
    cost = _cost("2x4")
    lens = [30000, 9000, 5000, 3000, 2000, 1000, 800, 500]
    plan, sizes = a2a_p2p_plan(lens, cost.cluster, cost)
    times = {c: simulate(a2a_p2p_plan(lens, cost.cluster, cost, a2a=c.a2a, p2p=c.p2p)[0], cost,
                         attention_comm="a2a_p2p").step_ms for c in size_candidates(lens, cost)}
    assert times[sizes] == pytest.approx(min(times.values()), rel=1e-12)
    sp = plan_with("te-cp-a2a-p2p", lens, cost.cluster, cost)
    assert sp.attention_comm == "a2a_p2p" and f"a2a {sizes.a2a} x p2p {sizes.p2p}" in sp.note
    with pytest.raises(PlanError, match="both a2a and p2p sizes or neither"):
        a2a_p2p_plan(lens, cost.cluster, cost, a2a=2)
