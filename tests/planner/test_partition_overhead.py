"""Level 1's node cost of a sequence that must split, with the per-call overhead in mind."""

from __future__ import annotations

import pytest

from zeppelin_megatron.planner.options import PlannerOptions
from zeppelin_megatron.planner.partition_context import PartitionContext

from .conftest import make_cost


def test_node_cost_uses_the_fastest_ring_when_none_meets_the_limit() -> None:
    """A sequence no ring brings under the limit costs its fastest ring, not the whole node's
    (each ring step pays the per-call overhead, so 8 GPUs can be slower than 5)."""
    cost = make_cost("1x8", model="configs/models/llama_3b.yaml")
    s = 17_686
    lengths = [s] + [500] * 200
    ctx = PartitionContext(lengths, cost, PlannerOptions())
    times = {g: cost.ring_ms(s, g, inter_node=False) for g in range(2, 9)}
    assert min(times.values()) > ctx.limit  # no ring meets the limit
    g = ctx.fastest_intra(s)
    assert times[g] == min(times.values()) and g < 8
    assert times[8] > times[g] + cost.call_overhead_ms  # overhead-bound: the whole node is slower
    assert ctx.node_cost(0) == pytest.approx(g * times[g])


def test_node_cost_keeps_the_smallest_ring_that_meets_the_limit() -> None:
    """With a limit some ring meets, the smallest such ring is charged (unchanged rule)."""
    cost = make_cost("1x8", model="configs/models/llama_3b.yaml")
    s = 17_686
    lengths = [s] + [3_000] * 60  # limit ~9 ms: 3 GPUs (7.9 ms) meet it, the fastest ring is 5 GPUs
    ctx = PartitionContext(lengths, cost, PlannerOptions())
    fitting = [g for g in range(2, 9) if cost.ring_ms(s, g, inter_node=False) <= ctx.limit]
    assert fitting and ctx.w[0] > ctx.limit and fitting[0] != ctx.fastest_intra(s)
    assert ctx.node_cost(0) == pytest.approx(fitting[0] * cost.ring_ms(s, fitting[0], inter_node=False))


def test_fastest_intra_respects_token_capacity() -> None:
    """Ring sizes whose positions would exceed tokens_per_gpu are not candidates."""
    cost = make_cost("1x8", tokens_per_gpu=4_000, model="configs/models/llama_3b.yaml")
    ctx = PartitionContext([17_686], cost, PlannerOptions())
    g = ctx.fastest_intra(17_686)
    assert -(-17_686 // g) <= 4_000 and g >= 5


def test_chained_rings() -> None:
    """A node-spanning ring sharing GPUs with two other node-spanning rings is chained."""
    from zeppelin_megatron.planner.partition import Assignment, _chained

    a = Assignment("inter_node", tuple(range(0, 16)))
    b = Assignment("inter_node", tuple(range(16, 32)))
    lent = Assignment("inter_node", tuple(range(8, 24)))
    local = Assignment("local", (5,))
    intra = Assignment("intra_node", (0, 1))
    assert _chained([a, b, lent, local])
    assert not _chained([a, b, local, intra])  # disjoint rings; intra-node rings do not count
    assert not _chained([a, lent])  # one overlap: the second ring waits for the first on all its GPUs alike
    assert _chained([a, Assignment("inter_node", tuple(range(8, 20))), b])  # 8-19 meets both


def test_chained_plans_lose_to_unchained_ones() -> None:
    """On a batch where level 1 lends across two node-spanning rings, the winner has no chained ring
    when an unchained result exists within the same balance class (7B, 4x8, long-tailed seed 17)."""
    from zeppelin_megatron.planner.partition import _chained, partition
    from zeppelin_megatron.planner.workloads import long_tailed_batch

    cost = make_cost("4x8")
    assignments = partition(long_tailed_batch(1 << 20, 17), cost, PlannerOptions())
    assert not _chained(assignments)
