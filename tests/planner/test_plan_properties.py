"""Property tests: every token exactly once, balanced linear layout, exact remap, determinism."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from zeppelin_megatron.planner import StepPlan, plan_step
from zeppelin_megatron.planner import PlannerOptions
from zeppelin_megatron.planner.workloads import long_tailed_batch

from .conftest import make_cost

SHAPES = [(1, 1), (1, 2), (1, 8), (2, 2), (2, 4), (4, 2), (4, 8), (3, 5), (8, 8), (16, 8), (32, 8)]


def _tokens(plan: StepPlan, layout: str) -> list[list[tuple[int, int]]]:
    """Per rank, the (seq, position) of every token in buffer order."""
    lay = plan.linear_layout if layout == "linear" else plan.attention_layout
    return [[(q, t) for q, s, e in ranges for t in range(s, e)] for ranges in lay]


def check_plan(plan: StepPlan, lengths: list[int], capacity: int | None = None) -> None:
    """``capacity``: tokens_per_gpu, checked on the linear layout of a plan without remap."""
    world = plan.world_size
    total = sum(lengths)
    for layout in ("attention", "linear"):
        seen = [t for rank in _tokens(plan, layout) for t in rank]
        assert len(seen) == total
        assert sorted(seen) == [(q, t) for q, s in enumerate(lengths) for t in range(s)]
    counts = [plan.tokens(r, "linear") for r in range(world)]
    held = [plan.tokens(r, "attention") for r in range(world)]
    if plan.linear_layout == plan.attention_layout:   # no remap (remap=False, or chosen by "auto")
        if capacity is not None:
            assert max(counts) <= capacity
    elif plan.linear == "workload_balanced":  # some ranks keep their tokens, the rest even out (or per node)
        def even(ranks: list[int]) -> bool:
            rest = [r for r in ranks if counts[r] != held[r]]
            return not rest or max(counts[r] for r in rest) - min(counts[r] for r in rest) <= 1
        g = plan.gpus_per_node
        assert even(list(range(world))) or all(even(list(range(n, n + g))) for n in range(0, world, g))
        assert max(counts) <= max(held)
    else:                                              # remapped: token-balanced
        assert max(counts) <= -(-total // world) and min(counts) >= total // world
    # Remap moves every token to its attention position and back.
    lin, att = _tokens(plan, "linear"), _tokens(plan, "attention")
    outbox = {}
    for r in range(world):
        ex = plan.remap.exchange(r, "to_attention")
        buf = np.array([q * (1 << 32) + t for q, t in lin[r]], dtype=np.int64)
        sent = buf[ex.send_index] if len(buf) else buf[:0]
        off = 0
        for dst, c in enumerate(ex.send_counts):
            outbox[(r, dst)] = sent[off:off + c]
            off += c
    for r in range(world):
        ex = plan.remap.exchange(r, "to_attention")
        got = np.concatenate([outbox[(src, r)] for src in range(world)]) if world else np.zeros(0)
        assert [len(outbox[(src, r)]) for src in range(world)] == list(ex.recv_counts)
        out = np.full(len(att[r]), -1, dtype=np.int64)
        out[ex.recv_index] = got
        buf = np.array([q * (1 << 32) + t for q, t in lin[r]], dtype=np.int64)
        out[ex.keep_dst] = buf[ex.keep_src] if len(buf) else buf[:0]  # staying rows: never sent
        assert ex.send_counts[r] == 0
        assert out.tolist() == [q * (1 << 32) + t for q, t in att[r]]
        back = plan.remap.exchange(r, "to_linear")
        assert sorted(back.send_index.tolist()) == sorted(ex.recv_index.tolist())
        assert back.keep_src.tolist() == ex.keep_dst.tolist() and back.keep_dst.tolist() == ex.keep_src.tolist()
    # Placement kinds are consistent with the ranks.
    g = plan.gpus_per_node
    for s in plan.sequences:
        nodes = {r // g for r in s.ranks}
        assert (s.placement == "local") == (len(s.ranks) == 1)
        if s.placement == "intra_node":
            assert len(nodes) == 1
        if s.placement == "inter_node":
            assert len(nodes) >= 2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(SHAPES), seed=st.integers(0, 10_000),
       tokens=st.integers(1, 200_000), routing=st.booleans(), remap=st.sampled_from(["auto", True, False]))
def test_random_long_tailed_batches(
    shape: tuple[int, int], seed: int, tokens: int, routing: bool, remap: bool | str
) -> None:
    nodes, gpus = shape
    cost = make_cost(f"{nodes}x{gpus}", tokens_per_gpu=1 << 20)
    lengths = long_tailed_batch(tokens, seed, long_min=2_000, long_max=60_000, short_median=300)
    plan = plan_step(lengths, cost, PlannerOptions(routing=routing, remap=remap))  # type: ignore[arg-type]
    check_plan(plan, lengths, cost.cluster.tokens_per_gpu)
    if remap is False:
        assert plan.linear_layout == plan.attention_layout
    if remap is True:
        counts = [plan.tokens(r, "linear") for r in range(plan.world_size)]
        assert max(counts) - min(counts) <= 1
    assert StepPlan.from_json(plan.to_json()) == plan


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=60), shape=st.sampled_from(SHAPES[:7]))
def test_arbitrary_lengths(lengths: list[int], shape: tuple[int, int]) -> None:
    cost = make_cost(f"{shape[0]}x{shape[1]}")
    check_plan(plan_step(lengths, cost), lengths, cost.cluster.tokens_per_gpu)


def test_world_256_and_1m_tokens() -> None:
    cost = make_cost("32x8")
    lengths = long_tailed_batch(1 << 20, 7)
    plan = plan_step(lengths, cost)
    check_plan(plan, lengths, cost.cluster.tokens_per_gpu)


def test_deterministic_json() -> None:
    cost = make_cost("4x8")
    lengths = long_tailed_batch(1 << 19, 3)
    a = plan_step(lengths, cost).to_json()
    b = plan_step(list(lengths), make_cost("4x8")).to_json()
    assert a == b


def test_capacity_binds_attention_layout() -> None:
    cost = make_cost("2x4", tokens_per_gpu=20_000)
    lengths = long_tailed_batch(150_000, 11, long_min=10_000, long_max=40_000)
    for remap in ("auto", True, False):
        plan = plan_step(lengths, cost, PlannerOptions(remap=remap))  # type: ignore[arg-type]
        check_plan(plan, lengths, 20_000)
        assert max(plan.tokens(r, "attention") for r in range(8)) <= 20_000
        assert max(plan.tokens(r, "linear") for r in range(8)) <= 20_000
