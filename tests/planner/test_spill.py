"""Sequences a placement could not fit where it chose go where there is room (spill), before the candidate fails:
the partitioner's levels (:func:`~zeppelin_megatron.planner.place_gpus.place_spilled`) and the packed candidates
(:func:`~zeppelin_megatron.planner.packed_whole.spill_whole`)."""

from __future__ import annotations

import numpy as np
import pytest

import zeppelin_megatron.planner.partition as partition
from zeppelin_megatron.planner import CostModel, PlanError, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.packed import packed_assignments, packed_groups
from zeppelin_megatron.planner.packed_whole import spill_whole
from zeppelin_megatron.planner.partition_context import Assignment, PartitionContext
from zeppelin_megatron.planner.place_gpus import place_spilled
from zeppelin_megatron.planner.score import rank_tokens
from zeppelin_megatron.sim.baselines import wlb_llm_groups
from zeppelin_megatron.sim.lengths import get_distribution

from .test_feasibility import check_plan_tokens

MODEL = load_model(None)


def _ctx(lengths: list[int], spec: str, cap: int) -> PartitionContext:
    return PartitionContext(lengths, CostModel(model=MODEL, cluster=load_cluster(spec, tokens_per_gpu=cap)),
                            PlannerOptions())


def test_place_spilled_docstring_example() -> None:
    """2 nodes x 2 GPUs of 100 tokens, free [40, 40, 5, 5]: 60 tokens fit no GPU; node 0's two GPUs take 30 + 30."""
    ctx = _ctx([60], "2x2", 100)
    load, tok = [1.0, 2.0, 0.5, 0.5], [60, 60, 95, 95]
    assert place_spilled(ctx, 0, load, tok) == Assignment("intra_node", (0, 1))
    assert tok == [90, 90, 95, 95]
    per_rank = ctx.cost.ring_ms(60, 2, inter_node=False)
    assert load == pytest.approx([1.0 + per_rank, 2.0 + per_rank, 0.5, 0.5])  # each ring GPU adds its per-rank time


def test_place_spilled_takes_the_least_loaded_gpu_with_room_whole() -> None:
    ctx = _ctx([30, 30], "2x2", 100)
    load, tok = [0.1, 3.0, 2.0, 0.0], [90, 50, 60, 80]  # rank 3 is the least loaded but has 20 free
    assert place_spilled(ctx, 0, load, tok) == Assignment("local", (2,))
    assert tok == [90, 50, 90, 80] and load[2] == pytest.approx(2.0 + ctx.w[0])


def test_place_spilled_refusal_names_the_numbers() -> None:
    ctx = _ctx([60], "2x2", 100)
    with pytest.raises(PlanError, match=r"sequence 0 of length 60 does not fit: the GPUs have \[20, 10, 10, 10\] "
                                        r"free tokens of 100"):
        place_spilled(ctx, 0, [0.0] * 4, [80, 90, 90, 90])  # 2 GPUs x 30 or 3 x 20 would be needed


@pytest.mark.parametrize(("spec", "cap", "lengths"), [
    ("2x2", 64, [50, 62, 31, 51, 13, 45]),  # 98% full: level 1 finds no node with room for the 13 whole
    ("3x2", 64, [50, 38, 26, 56, 1, 30, 52, 63, 58]),  # 95% full: nor for the 26
])
def test_level_one_spill_keeps_a_balanced_plan(spec: str, cap: int, lengths: list[int],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Before spilling, level 1 refused these batches and the capacity rules put every sequence on a ring over all
    GPUs; now a balanced candidate fits (the capacity rules are not reached) with every token placed once."""
    ctx = _ctx(lengths, spec, cap)
    order, ends = partition.placement_runs(lengths, ctx.w)
    rank_in_order = sorted(range(len(order)), key=order.__getitem__)
    st = partition._assign_nodes(ctx, order, ctx.limit, rank_in_order, ends=ends)
    assert st.spill  # level 1 spilled a sequence
    monkeypatch.setattr(partition, "capacity_fill", _unreached)
    placed = partition.partition(lengths, ctx.cost, PlannerOptions())
    assert max(rank_tokens(ctx, placed)) <= cap and sum(rank_tokens(ctx, placed)) == sum(lengths)
    assert any(a.placement != "inter_node" or len(a.ranks) < ctx.cluster.world_size for a in placed)


def _unreached(*args: object) -> None:
    raise AssertionError("the capacity rules were reached")


@pytest.mark.parametrize(("dist", "spec", "cap"), [("github-64k", "4x8", 8192), ("prolong-64k", "4x8", 32768)])
def test_sampler_micro_steps_at_tokens_per_gpu_get_balanced_plans(dist: str, spec: str, cap: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Micro-steps as the Megatron sampler cuts them (documents truncated at seq_length, in order while they fit the
    budget ``N * (tokens_per_gpu - 5)``, the next one starting the next step) with ``tokens_per_gpu = seq_length``:
    at 10e680a, before spilling, 5 of these 6 went to the capacity rules (level 2 found a node's free tokens
    scattered: e.g. 89 tokens and no GPU of the node with 89 free); now every one gets a balanced plan."""
    cost = CostModel(model=MODEL, cluster=load_cluster(spec, tokens_per_gpu=cap))
    budget = cost.cluster.world_size * (cap - 5)
    docs = [min(d, cap) for d in get_distribution(dist).documents(np.random.default_rng(1), 7 * budget)]
    monkeypatch.setattr(partition, "capacity_fill", _unreached)
    steps, step = [], []
    for d in docs:
        if sum(step) + d > budget:
            steps.append(step)
            step = []
        step.append(d)
    for lengths in steps[:3]:
        check_plan_tokens(plan_step(lengths, cost), cap)


def test_spill_whole_docstring_example() -> None:
    """Groups (0, 1) and (2, 3) of 100 tokens holding 10, 10, 70, 60 (loads 0, 0, 1, 2): 50 tokens that group 1
    cannot hold whole go whole to rank 0 (least loaded with room; ties: the lower rank), which carries its work."""
    load, tok = [0.0, 0.0, 1.0, 2.0], [10, 10, 70, 60]
    members = [(0, 1), (2, 3)]
    assert spill_whole(0, 50, 4.0, 1, 100, load, tok, members, 0) == (0,)
    assert tok == [60, 10, 70, 60] and load == [4.0, 0.0, 1.0, 2.0] and members == [(0, 1), (2, 3)]


def test_spill_whole_skips_ranks_without_room_or_names_the_numbers() -> None:
    load, tok = [0.0, 5.0, 1.0, 2.0], [60, 10, 70, 90]
    members = [(0, 1), (2, 3)]
    assert spill_whole(0, 50, 1.5, 1, 100, load, tok, members, 0) == (1,)  # rank 0 (40 free): less loaded, too full
    assert tok == [60, 60, 70, 90] and load == [0.0, 6.5, 1.0, 2.0]
    with pytest.raises(PlanError, match=r"sequence 0 \(50 tokens\) fits on no GPU of group 1 nor of the others "
                                        r"\(100 tokens per GPU\)"):
        spill_whole(0, 50, 1.5, 1, 100, load, tok, members, 0)


def test_spill_whole_takes_a_ring_only_behind_a_longer_whole_one() -> None:
    """Held 60, 60, 70, 60 of 100: 60 tokens fit no rank whole. With a sequence of 60 or more already whole
    (``whole_max``), they go on the ring over their group (2, 3), 30 + 30, work split; without, the packing fails:
    :func:`quick_floor` counts the longest whole sequence whole, and on a ring it could run under that bound."""
    load, tok = [0.0, 0.0, 1.0, 2.0], [60, 60, 70, 60]
    members = [(0, 1), (2, 3)]
    with pytest.raises(PlanError, match=r"sequence 0 \(60 tokens\) fits on no GPU of group 1 nor of the others "
                                        r"\(100 tokens per GPU\) and may not take a ring"):
        spill_whole(0, 60, 4.0, 1, 100, load, tok, members, 59)
    assert spill_whole(0, 60, 4.0, 1, 100, load, tok, members, 60) == (2, 3)
    assert tok == [60, 60, 100, 90] and load == [0.0, 0.0, 3.0, 4.0]
    load, tok = [0.0, 0.0, 1.0, 2.0], [60, 60, 80, 90]  # group 1 has 30 free: the ring goes over the roomiest of all
    assert spill_whole(0, 60, 4.0, 1, 100, load, tok, members, 60) == (0, 1)


def test_packed_candidates_spill_and_wlb_llm_does_not() -> None:
    """86% full, cp = 2: group 1 (ranks 2, 3) takes the 532 tokens by its room (it holds 1630 and 1473: 897 free), but
    neither GPU holds them whole (370 and 527 free). Zeppelin's packing puts them whole on rank 1, the one GPU with
    room (598 free); WLB-LLM's (the simulator's baseline, :func:`packed_groups` without ``spill``) refuses, as the
    real one would."""
    lengths = [1810, 532, 1473, 1630, 1402]
    cost = CostModel(model=MODEL, cluster=load_cluster("2x2", tokens_per_gpu=2000))
    with pytest.raises(PlanError, match="fits on no GPU of group 1"):
        packed_groups(lengths, cost, 2)
    with pytest.raises(PlanError, match="wlb-llm: sequence 1 .* fits on no GPU of group 1"):
        wlb_llm_groups(lengths, cost.cluster, cost, 2)
    placed = packed_assignments(lengths, cost, 2)
    assert placed is not None and placed[1] == Assignment("local", (1,))
    ctx = PartitionContext(lengths, cost, PlannerOptions())
    assert max(rank_tokens(ctx, placed)) <= 2000 and sum(rank_tokens(ctx, placed)) == sum(lengths)
