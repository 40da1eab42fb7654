"""Plans whose remap windows the planner chose (``plan_step``, not set by hand), run in spawned gloo ranks.

At a few hundred tokens the remap of an H100 cluster takes microseconds, below one attention call's
overhead, so ``plan_step`` opens no window; :func:`slow_links_plan` plans on the same topology with
NVLink at 0.5 GB/s and NICs at 4 Gb/s, where the exchanges take milliseconds and windows are chosen.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from plan_factory import small_batch
from runtime_workers import check_attention
from window_workers import check_same_without
from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.plan import StepPlan
from zeppelin_megatron.runtime import ZeppelinGroup

CASES = {8: [("2x4", 1), ("2x4", 2), ("4x2", 2)], 6: [("2x3", 3), ("2x3", 4), ("3x2", 2), ("3x2", 3)]}
"""Per world size, (topology, seed): on 8 ranks, plans with windows of the remap in (routed), the remap out
(direct), and of the remap in on four ranks (routed); on 6, the remap out of one rank (direct), the remap in of
two ranks (routed), of four (routed), and both directions on five ranks (direct)."""


def slow_links_plan(spec: str, seed: int, tokens_per_gpu: int = 96) -> StepPlan:
    """``plan_step`` (plain rings, ``remap=True``) of one long, one medium and up to 12 short sequences on
    ``spec`` with slow links (module docstring)."""
    cluster = replace(load_cluster(spec, tokens_per_gpu=tokens_per_gpu), nvlink_GBps=0.5, nic_Gbps=4.0)
    cost = CostModel(model=load_model(None), cluster=cluster)
    lens = small_batch(seed, cluster.world_size, tokens_per_gpu)
    return plan_step(lens, cost, PlannerOptions(remap=True, head_parallel=False))


def run_planned_windows(rank: int, world: int) -> None:
    """Outputs and dq/dk/dv against float64 SDPA (MHA and GQA, float64 and float32, ring routing on and
    off) and bitwise the same results without the windows, for every plan of :data:`CASES` of ``world``."""
    for spec, seed in CASES[world]:
        plan = slow_links_plan(spec, seed)
        assert plan.remap_slots, f"{spec} seed {seed}: the planner chose no window"
        group = ZeppelinGroup(process_group=None, gpus_per_node=plan.gpus_per_node)
        for dtype, routing, hq, hkv in ((torch.float64, True, 4, 4), (torch.float32, False, 4, 2)):
            check_attention(group, plan, dtype=dtype, routing=routing, hq=hq, hkv=hkv, seed=seed)
        check_same_without(group, plan, dtype=torch.float64, hq=4, hkv=2, routing=True)
