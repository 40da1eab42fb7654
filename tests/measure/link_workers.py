"""Link-measurement checks run inside spawned gloo ranks (module-level so spawn can pickle them)."""

from __future__ import annotations

import torch

from zeppelin_megatron.measure import ProfileOptions, measure_links, measure_profile
from zeppelin_megatron.planner import ModelShape
from zeppelin_megatron.planner.profile import parse_profile

CPU = torch.device("cpu")


def check_links(rank: int, world: int) -> None:
    kw = dict(device=CPU, nbytes=1 << 14, iters=2, warmup=1, repeats=2)
    one_node = measure_links(gpus_per_node=2, **kw)   # ranks 0, 1 on one node: the intra-node pair
    two_nodes = measure_links(gpus_per_node=1, **kw)  # one rank per node: the inter-node pair
    try:
        measure_links(gpus_per_node=3, **kw)
        raise AssertionError("gpus_per_node=3 with 2 ranks was accepted")
    except ValueError as exc:
        assert "world size 2 is not a multiple of gpus_per_node = 3" in str(exc)
    if rank != 0:
        assert not one_node.measured and not two_nodes.measured  # only rank 0 times (it is every pair's sender)
        return
    assert one_node.nvlink_GBps > 0 and one_node.nvlink_latency_us > 0 and one_node.nic_GBps is None
    assert two_nodes.nic_GBps > 0 and two_nodes.nic_latency_us > 0 and two_nodes.nvlink_GBps is None
    assert one_node.backend == "gloo" and one_node.nbytes == 1 << 14
    m = ModelShape(layers=1, hidden=16, q_heads=2, kv_heads=2, ffn=32, head_dim=8)
    opts = ProfileOptions(model=m, lengths=(4, 8), linear_tokens=(8,), tokens_per_call=8, dtype=torch.float32,
                          dtype_name="float32", device=CPU, warmup=0, repeats=1, blocks=False)
    doc = measure_profile(opts, links=two_nodes)
    assert set(doc["links"]) == {"nic_GBps"} and "inter-node rank 0 -> 1" in doc["source"]
    assert "intra-node link not measured" in doc["source"]
    profile = parse_profile(doc)
    assert profile.nic_GBps == doc["links"]["nic_GBps"] and profile.nvlink_GBps is None
