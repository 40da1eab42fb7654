"""Checks run inside spawned gloo ranks (module-level so spawn can pickle them)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from zeppelin_megatron.measure import ProfileOptions, measure_links, measure_profile, rank_work
from zeppelin_megatron.planner import CostModel, ModelShape, load_cluster, plan_step
from zeppelin_megatron.planner.profile import parse_profile
from zeppelin_megatron.planner.routing import Route
from zeppelin_megatron.runtime import ZeppelinGroup
from zeppelin_megatron.runtime.engine import AttentionEngine
from zeppelin_megatron.runtime.kernels import get_kernel
from zeppelin_megatron.sim.planbuild import build_plan

CPU = torch.device("cpu")


def run_all(rank: int, world: int) -> None:
    assert world == 4
    check_links(rank)
    check_replay_matches_engine(rank)


def check_links(rank: int) -> None:
    kw: dict[str, Any] = dict(device=CPU, nbytes=1 << 14, iters=2, warmup=1, repeats=2)
    both = measure_links(gpus_per_node=2, **kw)      # 2 nodes x 2: intra pair 0->1, inter pair 0->2
    one_node = measure_links(gpus_per_node=4, **kw)  # intra only
    try:
        measure_links(gpus_per_node=3, **kw)
        raise AssertionError("gpus_per_node=3 with 4 ranks was accepted")
    except ValueError as exc:
        assert "world size 4 is not a multiple of gpus_per_node = 3" in str(exc)
    if rank != 0:
        assert not both.measured and not one_node.measured  # rank 0 sends every timed pair and keeps the result
        return
    assert both.nvlink_GBps > 0 and both.nic_GBps > 0 and both.nvlink_latency_us > 0 and both.nic_latency_us > 0
    assert one_node.nvlink_GBps > 0 and one_node.nic_GBps is None
    assert both.backend == "gloo" and both.nbytes == 1 << 14
    m = ModelShape(layers=1, hidden=16, q_heads=2, kv_heads=2, ffn=32, head_dim=8)
    opts = ProfileOptions(model=m, lengths=(4, 8), linear_tokens=(8,), tokens_per_call=8, dtype=torch.float32,
                          dtype_name="float32", device=CPU, warmup=0, repeats=1, blocks=False)
    doc = measure_profile(opts, links=one_node)
    assert set(doc["links"]) == {"nvlink_GBps"} and "inter-node link not measured" in doc["source"]
    doc = measure_profile(opts, links=both)
    profile = parse_profile(doc)
    assert (profile.nvlink_GBps, profile.nic_GBps) == (doc["links"]["nvlink_GBps"], doc["links"]["nic_GBps"])


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.inner = get_kernel("reference", CPU, torch.float64)
        self.log: list[tuple[Any, ...]] = []

    def _entry(self, kind: str, q: torch.Tensor, k: torch.Tensor, batch: Any) -> tuple[Any, ...]:
        return (kind, batch.lens_q, batch.lens_k, batch.causal, tuple(q.shape), tuple(k.shape))

    def forward(self, q, k, v, batch, scale):  # type: ignore[no-untyped-def]
        self.log.append(self._entry("fwd", q, k, batch))
        return self.inner.forward(q, k, v, batch, scale)

    def backward(self, dout, q, k, v, out, lse, batch, scale):  # type: ignore[no-untyped-def]
        self.log.append(self._entry("bwd", q, k, batch))
        return self.inner.backward(dout, q, k, v, out, lse, batch, scale)


def check_replay_matches_engine(rank: int) -> None:
    """The runtime engine, run for real across 4 gloo ranks, makes exactly the kernel calls replay makes."""
    cluster = load_cluster("2x2", tokens_per_gpu=256)
    model = ModelShape(layers=1, hidden=32, q_heads=4, kv_heads=2, ffn=64, head_dim=8)
    cost = CostModel(model=model, cluster=cluster)
    # Inter-node rings in non-sorted rank order sharing ranks, an intra-node ring, locals; routes by hand
    # (the cost model routes nothing this small): ring (3, 0)'s hop 0 -> 3 goes half through rank 1,
    # which is not a member (a relay that computes nothing); ring (3, 0, 2, 1)'s hop 3 -> 0 half via rank 2.
    base = build_plan([90, 61, 40, 33, 9, 5, 2], [(3, 0, 2, 1), (3, 0), (2, 3), (2, 3), (0,), (1,), (0,)],
                      cluster, cost)
    routed = replace(base, routing=(Route((3, 0), 0, 3, (0, 1)), Route((3, 0, 2, 1), 3, 0, (1, 0))),
                     validate=False)
    # head-parallel rings: a hybrid over (0, 1 | 2, 3) and a Ulysses ring over (2, 3) (lane heads 2 and 1)
    heads = build_plan([96, 40, 9, 5], [(0, 1, 2, 3), (2, 3), (0,), (1,)], cluster, cost)
    heads = replace(heads, sequences=tuple(replace(s, a2a=2) if s.placement != "local" else s
                                           for s in heads.sequences))
    plans = [routed, plan_step([300, 120, 40, 30, 20, 9, 5, 3, 1], cost), heads]
    group = ZeppelinGroup(process_group=None, gpus_per_node=2)
    gen = torch.Generator().manual_seed(rank)
    for plan in plans:
        rec = Recorder()
        engine = AttentionEngine(plan, group, kernel=rec, scale=0.3, routes=plan.routing, hkv=2, head_dim=8,
                                 dtype=torch.float64, device=CPU)
        relays = [t for t in engine.program.rings if t.position is None]
        assert bool(relays) == (plan is routed and rank == 1), (rank, relays)
        n = plan.tokens(rank, "attention")
        q = torch.randn(n, 4, 8, generator=gen, dtype=torch.float64)
        k, v = (torch.randn(n, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
        out, saved = engine.forward(q, k, v)
        engine.backward(torch.randn_like(out), q, k, v, saved)
        calls = rank_work(plan, rank, q_heads=4, kv_heads=2, device=CPU).calls
        want = [(c.batch.lens_q, c.batch.lens_k, c.batch.causal, (c.q_tokens, c.q_heads, 8),
                 (c.k_tokens, c.kv_heads, 8)) for c in calls]
        if plan is heads:  # every ring call is a lane's: 2 of the 4 query heads, 1 of the 2 K/V heads
            assert {(c.q_heads, c.kv_heads) for c in calls if c.kind != "local"} == {(2, 1)}, rank
        assert [e[1:] for e in rec.log if e[0] == "fwd"] == want, (rank, rec.log, want)
        assert [e[1:] for e in rec.log if e[0] == "bwd"] == want, rank
        assert [e[0] for e in rec.log] == ["fwd"] * len(want) + ["bwd"] * len(want)
        dist.barrier()
