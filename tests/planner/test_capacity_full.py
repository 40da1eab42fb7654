"""A cluster filled to (almost) every token: oriented rings, water-filling's guarantee, closing GPUs in rank order,
and the search's bound (:mod:`~zeppelin_megatron.planner.capacity_level`, :mod:`~.capacity_stream`,
:mod:`~.capacity_fill`)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import zeppelin_megatron.planner.capacity_fill as capacity_fill
from zeppelin_megatron.planner import CostModel, PlanError, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.capacity_level import LEVEL_MARGIN, level_fill, oriented
from zeppelin_megatron.planner.capacity_stream import stream_fill
from zeppelin_megatron.planner.partition_context import PartitionContext
from zeppelin_megatron.planner.zigzag import zigzag_tokens
from zeppelin_megatron.sim.lengths import get_distribution, split_steps

from .test_feasibility import check_plan_tokens, fits, placeable

MODEL = load_model(None)


def _ctx(lengths: list[int], spec: str, cap: int) -> PartitionContext:
    return PartitionContext(lengths, CostModel(model=MODEL, cluster=load_cluster(spec, tokens_per_gpu=cap)),
                            PlannerOptions())


def _held(assignments, lengths: list[int], world: int) -> list[int]:  # type: ignore[no-untyped-def]
    held = [0] * world
    for a, s in zip(assignments, lengths):
        for p, r in enumerate(a.ranks):
            held[r] += s if len(a.ranks) == 1 else zigzag_tokens(s, len(a.ranks), p)
    return held


def test_oriented_matches_position_counts_to_room() -> None:
    assert oriented(7, [0, 1], [4, 4]) == (0, 1)  # rank order fits: kept
    assert oriented(7, [0, 1], [4, 3]) == (1, 0)  # 3 + 4 tokens: the 4 on GPU 0
    assert oriented(7, [0, 1], [3, 3]) is None
    assert oriented(8, [2, 5, 7], [0, 0, 3, 0, 0, 4, 0, 2], level=True) == (5, 2, 7)  # 3, 3, 2 tokens: roomiest first
    assert oriented(8, [2, 5, 7], [0, 0, 2, 0, 0, 4, 0, 2], level=True) is None  # two positions of 3, one GPU with 3+


def test_full_pair_needs_oriented_rings() -> None:
    """Every sequence on the 2-GPU ring, 7 and 23 (3 + 4, 11 + 12 tokens) oriented against each other: 512 + 512
    (rank order: 511 + 513). The planner refused it before rings could be oriented."""
    lengths = [502, 354, 82, 7, 23, 56]
    assert placeable(lengths, 2, 512)
    plan = plan_step(lengths, CostModel(model=MODEL, cluster=load_cluster("1x2", tokens_per_gpu=512)))
    check_plan_tokens(plan, 512)
    assert any(s.ranks == (1, 0) for s in plan.sequences)


def test_level_fill_places_every_batch_with_its_margin() -> None:
    """The guarantee of capacity_level's docstring, on random batches of every kind of length (too short to split,
    shorter than 2P, longer than a GPU) that leave exactly LEVEL_MARGIN free tokens per GPU (or 1-2 more); the free
    tokens end within 3 of each other."""
    rng = random.Random(11)
    tried = 0
    for _ in range(400):
        nodes, gpn = rng.choice([(1, 2), (1, 3), (2, 2), (1, 8), (2, 4), (3, 5), (4, 8), (16, 8)])
        world = nodes * gpn
        cap = rng.choice([LEVEL_MARGIN + 1, 9, 17, 64, 300, 2048])
        total = world * (cap - LEVEL_MARGIN) - rng.randint(0, 2)
        lengths: list[int] = []
        while sum(lengths) < total:
            r = rng.random()
            hi = rng.choice([3, 2 * world + 1, cap, 3 * cap])
            lengths.append(min(rng.randint(1, max(1, hi)) if r < 0.9 else world * cap, total - sum(lengths)))
        if not fits(lengths, world, cap):
            continue
        tried += 1
        held = _held(level_fill(_ctx(lengths, f"{nodes}x{gpn}", cap)), lengths, world)
        assert max(held) <= cap and sum(held) == sum(lengths)
        assert max(held) - min(held) <= 3
    assert tried > 300


def test_level_fill_refusal_names_the_numbers() -> None:
    # [3, 3, 2] on 2 GPUs of 4 (full): each 3 takes a GPU, and 2 is too short to split (no placement exists).
    with pytest.raises(PlanError, match=r"sequence 2 of length 2 does not fit: the free tokens per GPU are \[1, 1\] "
                                        r"\(tokens_per_gpu = 4\) .* leaves 0 free, fewer than 5 per GPU"):
        level_fill(_ctx([3, 3, 2], "1x2", 4))
    assert not placeable([3, 3, 2], 2, 4)


def test_stream_fill_docstring_example() -> None:
    lengths = [2, 15, 8, 2]
    ctx = _ctx(lengths, "1x3", 9)
    for rule in capacity_fill.RULES:
        with pytest.raises(PlanError):
            capacity_fill._fill(ctx, rule)
    with pytest.raises(PlanError):
        level_fill(ctx)
    got = stream_fill(ctx)
    assert [a.ranks for a in got] == [(0,), (0, 1, 2), (1, 2), (0,)]
    assert _held(got, lengths, 3) == [9, 9, 9]
    check_plan_tokens(plan_step(lengths, CostModel(model=MODEL, cluster=load_cluster("1x3", tokens_per_gpu=9))), 9)


def test_capacity_fill_refusal_names_the_margin() -> None:
    """The refusal after every rule: the first rule's stranded sequence, then the batch's spare tokens against the
    margin. [3, 3, 2] on 2 GPUs of 4 has no placement (test_level_fill_refusal_names_the_numbers)."""
    with pytest.raises(PlanError, match=r"^sequence 2 of length 2 does not fit: .* \(every fill rule tried: the batch "
                                        r"leaves 0 tokens free, 0\.0 per GPU; every batch leaving 5 per GPU fits\)$"):
        capacity_fill.capacity_fill(_ctx([3, 3, 2], "1x2", 4))
    with pytest.raises(PlanError, match=r"every fill rule tried: the batch leaves 0 tokens free"):
        plan_step([3, 3, 2], CostModel(model=MODEL, cluster=load_cluster("1x2", tokens_per_gpu=4)))


def test_stream_fill_refusal_names_the_numbers() -> None:
    with pytest.raises(PlanError, match=r"sequence 0 of length 12 does not fit: every GPU is full or holds too few "
                                        r"free tokens for the sequences left \(12 tokens free on 2 GPUs, "
                                        r"tokens_per_gpu = 10"):
        stream_fill(_ctx([12, 5, 3], "1x2", 10))


@pytest.mark.parametrize(("dist", "spec", "cap"), [("github-64k", "4x8", 4096), ("arxiv-64k", "2x8", 16384),
                                                   ("prolong-64k", "1x8", 32768)])
def test_micro_steps_at_the_margin_all_plan(dist: str, spec: str, cap: int) -> None:
    """Steps of exactly the budget the Megatron integration keeps when ``mbs * seq_length`` is the whole capacity,
    ``N * (tokens_per_gpu - LEVEL_MARGIN)`` (documents of at most ``tokens_per_gpu``, the one crossing a step's end cut
    there: the fullest a step gets). Every one plans; at 10e680a the balanced candidates fit none of them (all 24 were
    the capacity rules' plans), with spilling (place_gpus.place_spilled) 2, 6 and 5 of 8 still reach those rules."""
    cost = CostModel(model=MODEL, cluster=load_cluster(spec, tokens_per_gpu=cap))
    budget = cost.cluster.world_size * (cap - LEVEL_MARGIN)
    docs = get_distribution(dist).documents(np.random.default_rng(4), 8 * budget)
    for step in split_steps(docs, 8, budget, max_len=cap):
        check_plan_tokens(plan_step(step, cost), cap)


def test_search_work_is_bounded_on_a_large_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """On 128 GPUs every candidate ring visits 128 GPUs: the search stops at SEARCH_WORK GPU visits (it ran for
    minutes on 20,000 placements before). 40 sequences of 3000-12000 tokens filling the GPUs to within a
    token each, which the search does not place."""
    calls = []
    real = capacity_fill._ring_of

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(capacity_fill, "_ring_of", counted)
    rng = random.Random(2)
    lengths = [rng.randint(3000, 12000) for _ in range(40)]
    cap = -(-sum(lengths) // 128)
    assert capacity_fill._search(_ctx(lengths, "16x8", cap)) is None
    assert 128 * len(calls) <= capacity_fill.SEARCH_WORK + 128 * 2 * 128
