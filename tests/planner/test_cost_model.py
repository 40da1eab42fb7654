import math

import pytest

from zeppelin_megatron.planner import CostModel, ModelShape, default_profile, load_cluster
from zeppelin_megatron.planner.profile import ProfileError, parse_profile


def profile_shaped_model() -> ModelShape:
    p = default_profile()
    # The profiled attention: 32 q heads of dim 128 (kv expanded); linear: the 7B-like layer.
    return ModelShape(layers=1, hidden=p.lin_hidden, q_heads=p.lin_q_heads, kv_heads=p.lin_kv_heads,
                      ffn=p.lin_ffn, head_dim=p.lin_head_dim)


def test_reproduces_profile_points() -> None:
    cm = CostModel(model=profile_shaped_model(), cluster=load_cluster("1x8"))
    p = default_profile()
    for row in p.attention:
        if row.causal:
            assert cm.causal_ms(row.seqlen) * row.num_seqs == pytest.approx(row.fwd_bwd_ms, rel=1e-9)
    for row in p.linear:
        assert cm.linear_ms(row.tokens) == pytest.approx(row.fwd_bwd_ms, rel=1e-9)
    for row in p.blocks:
        # q x k and k x q rows share an area and the model averages their rates; the
        # two orientations differ by up to 20% at 128 x 64, so each row is within 12%.
        assert cm.block_ms(row.q_len, row.k_len) * row.num_seqs == pytest.approx(row.fwd_bwd_ms, rel=0.12)


def test_interpolation_and_extrapolation() -> None:
    cm = CostModel(model=profile_shaped_model(), cluster=load_cluster("1x8"))
    t = [cm.causal_ms(s) for s in (64, 128, 200, 256, 1000, 1 << 17, 1 << 18)]
    assert all(a < b for a, b in zip(t, t[1:]))
    # Below the first point: time proportional to length (tile-bound).
    assert cm.causal_ms(64) == pytest.approx(cm.causal_ms(128) / 2, rel=1e-9)
    # Above the last point: rate held, so time grows as s^2.
    assert cm.causal_ms(1 << 18) == pytest.approx(4 * cm.causal_ms(1 << 17), rel=1e-9)


def test_scales_with_heads_layers_and_tp() -> None:
    cl = load_cluster("1x8")
    base = CostModel(model=ModelShape(layers=2, hidden=4096, q_heads=32, kv_heads=8, ffn=11008), cluster=cl)
    wide = CostModel(model=ModelShape(layers=2, hidden=8192, q_heads=64, kv_heads=8, ffn=11008), cluster=cl)
    tp2 = CostModel(model=base.model, cluster=cl, tensor_parallel=2)
    assert wide.causal_ms(4096) == pytest.approx(2 * base.causal_ms(4096))
    assert tp2.causal_ms(4096) == pytest.approx(base.causal_ms(4096) / 2)
    assert tp2.linear_ms(4096) == pytest.approx(base.linear_ms(4096) / 2)
    assert tp2.kv_bytes_per_token == base.kv_bytes_per_token // 2


def test_ring_traffic_and_ratio() -> None:
    cl = load_cluster("2x8")
    cm = CostModel(model=ModelShape(layers=1, hidden=4096, q_heads=32, kv_heads=8, ffn=11008), cluster=cl)
    # 2 * kv_heads * head_dim * 2 bytes = 4096 bytes per token; chunk pair of 65536/16 tokens.
    assert cm.kv_bytes_per_token == 4096
    assert cm.ring_step_bytes(65536, 8) == 2 * 4096 * 4096
    nbytes = 3 * cm.ring_step_bytes(65536, 8)
    assert cm.ring_step_comm_ms(65536, 8, inter_node=False) == pytest.approx(
        nbytes / 450e6 + cl.nvlink_latency_us * 1e-3)
    assert cm.ring_step_comm_ms(65536, 16, inter_node=True) == pytest.approx(
        3 * cm.ring_step_bytes(65536, 16) / 50e6 + cl.nic_latency_us * 1e-3)
    # compute/comm grows with s / g; routing over 8 NICs makes it larger.
    assert cm.comm_ratio(1 << 17, 8, inter_node=False) > cm.comm_ratio(1 << 14, 8, inter_node=False)
    assert cm.comm_ratio(1 << 17, 16, inter_node=True, proxies=8) > cm.comm_ratio(1 << 17, 16, inter_node=True)
    assert cm.routed_ms(1e9, 8) < cm.routed_ms(1e9, 1)
    # Tiny transfers do not pay for routing (latency).
    assert cm.routed_ms(1e3, 8) > cm.routed_ms(1e3, 1)


def test_ring_ms_sums_steps() -> None:
    cm = CostModel(model=profile_shaped_model(), cluster=load_cluster("1x8"))
    s, g = 65536, 4
    diag, off = cm.ring_compute_profile(s, g)
    comm = cm.ring_step_comm_ms(s, g, inter_node=False)
    o = cm.call_overhead_ms
    assert cm.ring_ms(s, g, inter_node=False) == pytest.approx(max(diag, o) + (g - 1) * max(off, o, comm))
    # Zigzag: every position's step work equals the profile's (up to one token).
    for pos in range(g):
        for step in range(1, g):
            assert cm.ring_step_compute_ms(s, g, pos, step) == pytest.approx(off, rel=1e-3)


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(schema="x"), "schema"),
    (lambda d: d["attention"]["rows"].clear(), "at least one row"),
    (lambda d: d["attention"]["rows"][0].update(fwd_bwd_ms=-1), "must be > 0"),
    (lambda d: d["attention"]["rows"][0].update(seqlen="big"), "expected a number"),
    (lambda d: d["linear"].pop("hidden"), "missing key 'hidden'"),
    (lambda d: d["linear"]["rows"].reverse(), "strictly increasing"),
    (lambda d: d.update(dtype="int3"), "int3"),
])
def test_malformed_profile(mutate, match) -> None:  # type: ignore[no-untyped-def]
    doc = default_profile().to_dict()
    mutate(doc)
    with pytest.raises(ProfileError, match=match):
        parse_profile(doc)


def test_profile_round_trip() -> None:
    p = default_profile()
    assert parse_profile(p.to_dict()) == p
    assert math.isclose(p.call_overhead_ms, 1.0925)


def test_link_times_are_link_ms_with_the_links_terms() -> None:
    """nvlink_ms / nic_ms apply link_ms with the profile's bandwidth (else the cluster's) and the cluster's latency,
    the terms computed once; nic_ms splits the bytes over the NICs."""
    from dataclasses import replace as dc_replace

    from zeppelin_megatron.planner import CostModel, load_cluster, load_model
    base = CostModel(model=load_model(None), cluster=load_cluster("2x8"))
    for cost in (base, CostModel(model=base.model, cluster=base.cluster,
                                 profile=dc_replace(base.profile, nvlink_GBps=None, nic_GBps=None))):
        p, c = cost.profile, cost.cluster
        for nbytes in (0, 1, 4096, 3.5e8):
            assert cost.nvlink_ms(nbytes) == cost.link_ms(nbytes, p.nvlink_GBps or c.nvlink_GBps, c.nvlink_latency_us)
            for nics in (1, 3):
                assert cost.nic_ms(nbytes, nics) == cost.link_ms(nbytes / nics, p.nic_GBps or c.nic_GBps,
                                                                 c.nic_latency_us)
    assert base.nvlink_ms(0) == base.nic_ms(-1.0) == 0.0


@pytest.mark.parametrize("model", ["llama_3b", "llama_7b", "llama_13b"])
def test_ring_may_beat_local_rules_out_only_rings_that_lose(model: str) -> None:
    """Where ``ring_may_beat_local`` says no, every ring of that size (inside a node, across nodes, routed or
    not) is at least as slow as one GPU: the partitioner and the packings skip pricing it on that word. And it
    does rule out the short documents of a batch (else it would save nothing)."""
    from zeppelin_megatron.planner import load_model

    cost = CostModel(model=load_model(f"configs/models/{model}.yaml"), cluster=load_cluster("4x8"))
    ruled_out = 0
    for s in [64, 500, 1000, 2047, 4096, 6000, 9000, 16384, 40000]:
        for g in (2, 4, 8, 16, 32):
            if s < 2 * g or cost.ring_may_beat_local(s, g):
                continue
            ruled_out += 1
            for inter, proxies in ((False, 1), (True, 1), (True, 4)):
                assert cost.ring_ms(s, g, inter_node=inter, proxies=proxies) >= cost.local_ms(s), (s, g, inter)
    assert ruled_out >= 5
    assert cost.ring_may_beat_local(40000, 2)


def test_least_linear_ms_per_token_bounds_linear_ms() -> None:
    cost = CostModel(model=profile_shaped_model(), cluster=load_cluster("1x8"))
    least = cost.least_linear_ms_per_token()
    rates = [cost.linear_ms(t) / t for t in (1, 7, 100, 1000, 3000, 8192, 12345, 65536, 10 ** 6)]
    assert all(least <= r * (1 + 1e-12) for r in rates)
    assert any(math.isclose(least, cost.linear_ms(r.tokens) / r.tokens) for r in cost.profile.linear)


def test_bundled_model_shapes_load_and_gqa_shrinks_kv() -> None:
    """Every ``configs/models/*.yaml`` loads; Llama-3 8B shares 8 K/V heads among 32 query heads, so a token's K/V
    (2 x 8 x 128 x 2 bytes = 4096) is half its query (32 x 128 x 2 = 8192), against twice it for Llama-7B (MHA):
    K/V traffic 4x smaller at the same attention FLOPs."""
    from pathlib import Path

    from zeppelin_megatron.planner import load_model

    root = Path(__file__).resolve().parents[2] / "configs" / "models"
    shapes = {p.stem: load_model(str(p)) for p in sorted(root.glob("*.yaml"))}
    assert {"llama_3b", "llama_7b", "llama_13b", "llama_30b", "llama3_8b", "tiny"} <= set(shapes)
    cluster = load_cluster("1x8")
    gqa, mha = (CostModel(model=shapes[k], cluster=cluster) for k in ("llama3_8b", "llama_7b"))
    assert (shapes["llama3_8b"].q_heads, shapes["llama3_8b"].kv_heads, shapes["llama3_8b"].head_dim) == (32, 8, 128)
    assert (gqa.q_bytes_per_token, gqa.kv_bytes_per_token) == (8192, 4096)
    assert (mha.q_bytes_per_token, mha.kv_bytes_per_token) == (8192, 16384)
    assert gqa.causal_ms(8192) == pytest.approx(mha.causal_ms(8192))
