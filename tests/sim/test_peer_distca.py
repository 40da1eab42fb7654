"""distca: layout, greedy balancing, deduplicated traffic, tolerance loop and ping-pong timing by hand."""

from __future__ import annotations

import pytest

from zeppelin_megatron.planner import CostModel, PlanError, load_cluster, load_model
from zeppelin_megatron.planner.model import ModelShape
from zeppelin_megatron.sim import plan_with
from zeppelin_megatron.sim.distca import (
    DistcaSchedule, Item, balance_items, distca_plan, distca_schedule, linear_items, nano_batch, split_nano_batches)
from zeppelin_megatron.sim.simulator import simulate


def _cost(spec: str) -> CostModel:
    return CostModel(model=load_model(None), cluster=load_cluster(spec, tokens_per_gpu=65536))


def test_linear_layout_head_and_tail_pieces() -> None:
    items = linear_items([0], [8], 2)
    assert [(it.src, it.parts) for it in items] == [(0, [[2, 2], [2, 8]]), (1, [[2, 4], [2, 6]])]
    # FLOPs q*kv - q(q-1)/2: rank 0: 3 + 15, rank 1: 7 + 11.
    assert [it.flops for it in items] == [18, 18]
    assert balance_items(items, 2, 0.05, 4096, 4096) == items  # balanced: nothing moves


def _two_doc_items() -> list[Item]:
    # One nano-batch [1200, 400] on 2 ranks, 800 tokens each:
    # rank 0: head [0,400) + tail [800,1200) = 80200 + 400200; rank 1: [400,600) + [600,800) + doc 1.
    return linear_items([0, 1], [1200, 400], 2)


def test_greedy_moves_head_and_tail_tokens_to_the_starved_rank() -> None:
    items = _two_doc_items()
    assert sum(it.flops for it in items if it.src == 0) == 480400
    assert sum(it.flops for it in items if it.src == 1) == 320400
    out = balance_items(items, 2, 0.05, 4096, 4096)
    # mean 400400, rank 1 needs 80000: m = 80000 // 1201 = 66 tokens from the end of rank 0's head
    # and 66 from the start of its tail: [334, 400) and [800, 866), 79266 FLOPs; 734 left < 20020.
    moved = [it for it in out if it.gpu == 1 and it.src == 0]
    assert len(moved) == 1 and moved[0].parts == [[66, 400], [66, 866]] and moved[0].flops == 79266
    assert sum(it.flops for it in out if it.gpu == 0) == 480400 - 79266
    assert sum(it.flops for it in out if it.gpu == 1) == 320400 + 79266


@pytest.mark.parametrize("kv_heads", [32, 8])
def test_traffic_deduplicates_kv_per_rank_pair(kv_heads: int) -> None:
    model = ModelShape(layers=32, hidden=4096, q_heads=32, kv_heads=kv_heads, ffn=11008)
    cost = CostModel(model=model, cluster=load_cluster("1x2", tokens_per_gpu=65536))
    assert cost.kv_bytes_per_token == 2 * kv_heads * 128 * 2  # K and V, bf16: GQA moves 4x fewer K/V bytes
    base = _two_doc_items()
    work = [Item(it.seq, it.length, it.src, it.gpu, [list(p) for p in it.parts], it.complete) for it in base]
    nb = nano_batch(balance_items(work, 2, 0.05, 4096, 4096), base, 2, cost)
    qb, kvb = cost.q_bytes_per_token, cost.kv_bytes_per_token
    # Rank 1's shards of doc 0 need K/V of [0,334) and [334,400), [800,866) from rank 0: 466 tokens, once.
    # Rank 0's tail [866,1200) needs rank 1's [400,800): 400 tokens. Q (and dO) of 132 tokens go 0 -> 1.
    assert nb.pair_bytes[(0, 1)] == 132 * 2 * qb + 466 * kvb
    assert nb.pair_bytes[(1, 0)] == 400 * kvb
    assert sorted(nb.shards[1]) == [(0, 334, 400), (0, 400, 600), (0, 600, 800), (0, 800, 866), (1, 0, 400)]


def test_nano_batches_balance_attention_flops() -> None:
    # Largest L^2 first to the nano-batch with fewer FLOPs: 1200 -> 0; 900, 400, 300 -> 1 (1.06M < 1.44M).
    assert split_nano_batches([1200, 400, 900, 300]) == ([0], [1, 2, 3])
    assert split_nano_batches([5, 5, 5, 5]) == ([0, 2], [1, 3])  # ties: nano-batch 0


@pytest.mark.parametrize("spec", ["1x2", "2x1"])
def test_ping_pong_layer_by_hand(spec: str) -> None:
    # 2 GPUs in one node (NVLink) or on two nodes (NICs), documents [1200, 400]:
    # nano 0 = [1200] (600 tokens per rank), nano 1 = [400].
    cost = _cost(spec)
    link = cost.nvlink_ms if spec == "1x2" else cost.nic_ms
    plan = distca_plan([1200, 400], cost.cluster, cost, min_tolerance=0.05)
    s: DistcaSchedule = plan.peer
    n0, n1 = s.nanos
    o = cost.call_overhead_ms
    copy = 2.0 / (cost.profile.hbm_GBps * 1e6)  # the profile's HBM bandwidth (read + write bytes per second)
    lin = [[cost.linear_ms(sum(e - b for _, b, e in nb.linear[r])) / 2 for r in range(2)] for nb in s.nanos]

    def comm(nb) -> float:  # both directions at once on separate NVLink ports; 0: no transfer
        return max((link(v) for (x, y), v in nb.pair_bytes.items() if x != y and v > 0), default=0.0)

    def att(nb, r: int) -> float:
        return 2 * nb.received[r] * copy + (max(nb.attention_ms[r], o) if nb.attention_ms[r] > 0 else 0.0)

    def pre(k: int, nb, r: int) -> float:
        return lin[k][r] + nb.sent[r] * copy
    # Tick k: each rank computes from its own start; the all-to-all starts when both ranks posted it.
    ticks = [([pre(0, n0, r) for r in range(2)], 0.0), ([pre(1, n1, r) for r in range(2)], comm(n0)),
             ([att(n0, r) for r in range(2)], comm(n1)), ([att(n1, r) for r in range(2)], comm(n0)),
             ([pre(0, n0, r) for r in range(2)], comm(n1)), ([pre(1, n1, r) for r in range(2)], 0.0)]
    t = [0.0, 0.0]
    for comp, c in ticks:
        start = max(t)
        t = [max(t[r] + comp[r], start + c if c > 0 else 0.0) for r in range(2)]
    res = simulate(plan, cost, attention_comm="distca")
    assert res.layer_ms == pytest.approx(max(t), rel=1e-9)
    # One fused attention call per nano-batch and rank.
    calls = [e for e in res.events if e.kind == "attention"]
    assert sorted((e.rank, e.label.split()[1]) for e in calls) == [(0, "0"), (0, "1"), (1, "0"), (1, "1")]
    assert (res.network_MB > 0) == (spec == "2x1") and (res.nvlink_MB > 0) == (spec == "1x2")


def test_tolerance_loop_rises_until_the_buffer_fits() -> None:
    cost = _cost("2x4")
    lens = [60000, 30000, 8000, 4000, 2000, 1000, 500, 300] * 2
    free = distca_schedule(lens, cost, buffer_bytes=2**50)
    assert free.tolerance == 0.05
    tight = distca_schedule(lens, cost, buffer_bytes=int(free.buffer_peak) - 1)
    assert tight.tolerance > 0.05 and tight.buffer_peak <= free.buffer_peak - 1
    with pytest.raises(PlanError, match="keeps the all-to-all buffer within"):
        distca_schedule(lens, cost, buffer_bytes=1)
    sp = plan_with("distca", lens, cost.cluster, cost)
    assert sp.attention_comm == "distca" and "tolerance=" in sp.note
