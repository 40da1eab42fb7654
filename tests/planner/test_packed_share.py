"""Share packings (planner/packed.py's share_threshold, PlannerOptions.packed_share): per CP size, shard only the
documents that kept whole would load their GPU above the mean work per rank."""

from __future__ import annotations

import pytest

from zeppelin_megatron.commands.simulate import setup
from zeppelin_megatron.planner import CostModel, PlanError, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.packed import CHARGES, share_threshold
from zeppelin_megatron.planner.predict import predict
from zeppelin_megatron.sim.lengths import sample_steps


def test_share_threshold_against_the_definition() -> None:
    cost = CostModel(model=load_model(None), cluster=load_cluster("2x8"))
    lengths = [40000, 20000, 9000, 3000, 3000, 1000] + [500] * 40
    share = max(1, sum(lengths) // 16)
    lin = cost.linear_ms(share) / share
    work = [cost.local_ms(s) + lin * s for s in lengths]
    mean = sum(work) / 16
    over = [s for s, w in zip(lengths, work) if w > mean]
    assert over and share_threshold(lengths, cost, 16) == min(over)
    assert share_threshold([4096] * 16, cost, 16) is None  # each is exactly the mean: none exceeds it
    assert share_threshold(lengths, cost, 1) is None  # one rank: nothing exceeds the whole batch


def test_plan_step_shards_only_what_would_overload_a_gpu() -> None:
    """Llama-7B github-64k on 2 x 8 H100s, 256k tokens, batch 1 (232 documents): two documents (23 477 and 16 495
    tokens) exceed a rank's mean work; the share packing shards those two over rings of 4 (and absorbs a short
    one), where the best packing without it shards four over rings of 8: 0.6% faster under the engine's charges."""
    _, cost = setup("2x8@configs/clusters/h100.yaml", "configs/models/llama_7b.yaml", None, 1)
    b = sample_steps("github-64k", 2, 1 << 18, 0)[1]
    m = share_threshold(b, cost, 16)
    assert m is not None and sorted(s for s in b if s >= m) == [16495, 23477]
    taken = plan_step(b, cost, PlannerOptions(ring_parts=False))  # the packings alone
    plain = plan_step(b, cost, PlannerOptions(packed_share=False, ring_parts=False))
    assert predict(taken, cost, charges=CHARGES).step_ms < 0.995 * predict(plain, cost, charges=CHARGES).step_ms
    ringed = [b[i] for i, s in enumerate(taken.sequences) if s.placement != "local"]
    assert sorted(s for s in ringed if s >= 1000) == [16495, 23477]  # and short ones the rings absorbed
    assert {len(s.ranks) for s in taken.sequences if s.placement != "local"} == {4}
    with pytest.raises(PlanError, match="packed_share is 0, expected True or False"):
        PlannerOptions(packed_share=0)  # type: ignore[arg-type]
