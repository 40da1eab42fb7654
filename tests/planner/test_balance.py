"""The planner's headline properties on long-tailed batches (cost-model predictions)."""

from __future__ import annotations

from functools import lru_cache

import pytest

from zeppelin_megatron.planner import CostModel, StepPlan, load_cluster, load_model, plan_step
from zeppelin_megatron.planner import PlannerOptions
from zeppelin_megatron.planner.predict import attention_time, ring_loads
from zeppelin_megatron.planner.workloads import long_tailed_batch

# Batches of 32k tokens per GPU (1M on 4x8); ~97% of documents log-normal under 4k,
# ~3% uniform in 32k-128k. Issue 2: predicted attention max/mean <= 1.05 on 4x8, 7B.
# The partitioner keeps the fastest candidate within 1.05 (PlannerOptions.balance_target);
# seeds 0-299 all get there (slow test), as do the other shapes below.
SEEDS_4X8 = range(100)
OTHER_SHAPES = [("8x8", 1 << 21, seed) for seed in range(5)] + [("2x8", 1 << 19, seed) for seed in range(20)]


@lru_cache(maxsize=None)
def _cost(spec: str) -> CostModel:
    return CostModel(model=load_model(None), cluster=load_cluster(spec))


@lru_cache(maxsize=None)
def _plan(spec: str, tokens: int, seed: int) -> StepPlan:
    # The partitioner's balance, on plain rings: head-parallel rings, chosen after it, only shorten
    # some rings (max/mean can rise while the step falls; test_choose_heads.py checks the step). Remap
    # windows, also chosen after it, take local work out of the attention time of the ranks that have them.
    cost = _cost(spec)
    return plan_step(long_tailed_batch(tokens, seed), cost, PlannerOptions(head_parallel=False, remap_overlap=False,
                                                                                  packed=False))


def _partitioner_attention(plan: StepPlan, cost: CostModel) -> list[float]:
    """The prediction's attention time per rank less the relays' waits: the partitioner's score of the plan
    when the plan keeps the partitioner's routes. The prediction charges a relay (a proxy GPU outside a routed
    ring) the ring's transfers it waits for (``predict.ring_time``'s ``relay_wait``, since 2026-11-28); the
    partitioner scores ring work and routes without them (docs/planner.md, "Predicted step time")."""
    waits = ring_loads(plan, cost).relay
    return [a - cost.model.layers * w for a, w in zip(attention_time(plan.predicted), waits)]


def _max_over_mean(plan: StepPlan, cost: CostModel) -> float:
    """Attention max / mean of the plan's placement as the partitioner scores it (routed hops where routing
    pays, no relay waits): what it balances. The plan itself may drop the routes where the prediction, which
    charges the relays' waits, favours the unrouted variant (``layout_choice.py``): 4 x 8 seed 152's plan runs
    unrouted, its predicted attention max / mean 1.12, its step predicted the same (7349 against 7347 ms
    routed with the relays' waits uncharged) and simulated 2.5% faster (7761 against 7963)."""
    from zeppelin_megatron.planner.partition import Assignment, PartitionContext, attention_times

    lengths = [s.length for s in plan.sequences]
    att = attention_times(PartitionContext(lengths, cost, PlannerOptions(head_parallel=False)),
                          [Assignment(s.placement, s.ranks) for s in plan.sequences])
    return max(att) / (sum(att) / len(att))


@pytest.mark.parametrize("seed", SEEDS_4X8)
def test_attention_balanced_on_4x8_7b(seed: int) -> None:
    plan = _plan("4x8", 1 << 20, seed)
    assert sum(s.length < 4096 for s in plan.sequences) > 0.85 * len(plan.sequences)  # ~97% expected
    assert _max_over_mean(plan, _cost("4x8")) <= 1.05


@pytest.mark.slow
def test_attention_balanced_on_300_batches_4x8() -> None:
    worst = max((_max_over_mean(_plan("4x8", 1 << 20, seed), _cost("4x8")), seed) for seed in range(300))
    assert worst[0] <= 1.05, f"seed {worst[1]}: attention max/mean {worst[0]:.4f}"


@pytest.mark.parametrize("spec,tokens,seed", OTHER_SHAPES)
def test_attention_balanced_on_other_shapes(spec: str, tokens: int, seed: int) -> None:
    assert _max_over_mean(_plan(spec, tokens, seed), _cost(spec)) <= 1.05


def test_short_sequences_stay_local() -> None:
    cost = _cost("4x8")
    for seed in SEEDS_4X8:
        plan = _plan("4x8", 1 << 20, seed)
        for s in plan.sequences:
            g = len(s.ranks)
            if s.placement == "intra_node":
                assert cost.comm_ratio(s.length, g, inter_node=False) >= 1.0
            if s.placement == "inter_node":  # whole nodes, or a node plus some GPUs of another
                assert cost.comm_ratio(s.length, g, inter_node=True, proxies=8) >= 1.0
            if s.placement != "local":
                assert cost.ring_ms(s.length, g, inter_node=s.placement == "inter_node",
                                    proxies=8) < cost.local_ms(s.length)
        # Anything that cannot hide its NVLink ring transfer even on 2 GPUs is local.
        for s in plan.sequences:
            if s.length < 4 or cost.comm_ratio(s.length, 2, inter_node=False) < 1.0:
                assert s.placement == "local"


def test_plans_are_deterministic() -> None:
    # A fresh cost model (cold caches) gives byte-identical JSON.
    for seed in (22, 50, 74):
        cost = CostModel(model=load_model(None), cluster=load_cluster("4x8"))
        again = plan_step(long_tailed_batch(1 << 20, seed), cost)
        assert again.to_json() == plan_step(long_tailed_batch(1 << 20, seed), _cost("4x8")).to_json()  # warm


def test_partitioner_scores_plans_as_predict_does() -> None:
    """The partitioner balances what the prediction reports (per layer vs per step)."""
    from zeppelin_megatron.planner.options import PlannerOptions
    from zeppelin_megatron.planner.partition import Assignment, PartitionContext, attention_times

    relayed = 0
    for spec, tokens, seed in [("4x8", 1 << 20, 22), ("4x8", 1 << 20, 50), ("2x8", 1 << 19, 4)]:
        plan, cost = _plan(spec, tokens, seed), _cost(spec)
        lengths = [s.length for s in plan.sequences]
        mine = attention_times(PartitionContext(lengths, cost, PlannerOptions()),
                               [Assignment(s.placement, s.ranks) for s in plan.sequences])
        layers = cost.model.layers
        assert [layers * a for a in mine] == pytest.approx(_partitioner_attention(plan, cost), abs=1e-4)
        relayed += max(ring_loads(plan, cost).relay) > 0  # relays' waits, which only the prediction charges
    assert relayed == 2  # 4x8 seed 22 and 2x8 seed 4 route through GPUs outside their rings


def test_partitioner_remap_time_is_the_per_rank_rule() -> None:
    """The partitioner scores a placement's remap node by node (score.py): each GPU's NVLink rows plus its
    cross-node rows on its own NIC share (routed: the node's cross rows over ``k`` NICs), once per layer.
    That is an estimate, not the plan's remap time (remap_cost.py: in and out, link by link); it must
    equal that per-rank rule applied to the token-balanced layout the plan really builds."""
    from zeppelin_megatron.planner.options import PlannerOptions
    from zeppelin_megatron.planner.partition import Assignment, PartitionContext
    from zeppelin_megatron.planner.remap_routing import nic_proxies
    from zeppelin_megatron.planner.score import rank_tokens, remap_time

    def per_rank_rule(plan: StepPlan, cost: CostModel, k: int) -> float:
        cl, per = cost.cluster, 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
        intra, out, into = plan.remap_traffic
        node_out, node_in = [0] * cl.nodes, [0] * cl.nodes
        for r in range(plan.world_size):
            node_out[cl.node_of(r)] += out[r]
            node_in[cl.node_of(r)] += into[r]
        if k > 1:
            return max(cost.nvlink_ms((intra[r] + 2 * max(out[r], into[r]) * (k - 1) / k) * per)
                       + cost.nic_ms(max(node_out[cl.node_of(r)], node_in[cl.node_of(r)]) * per / k)
                       for r in range(plan.world_size))
        return max(cost.nvlink_ms(intra[r] * per)
                   + cost.nic_ms((out[r] + into[r]) * per * cl.gpus_sharing_nic(cl.gpu_nic[r % cl.gpus_per_node]))
                   for r in range(plan.world_size))

    for spec, tokens, seed in [("4x8", 1 << 20, 8), ("4x8", 1 << 20, 22), ("8x8", 1 << 21, 1)]:
        cost = _cost(spec)
        plan = plan_step(long_tailed_batch(tokens, seed), cost, PlannerOptions(remap=True))
        ctx = PartitionContext([s.length for s in plan.sequences], cost, PlannerOptions())
        held = rank_tokens(ctx, [Assignment(s.placement, s.ranks) for s in plan.sequences])
        assert held == [plan.tokens(r, "attention") for r in range(plan.world_size)]
        k = len(nic_proxies(cost.cluster.gpu_nic))
        expected = min(per_rank_rule(plan, cost, 1), per_rank_rule(plan, cost, k))
        assert remap_time(ctx, held) == pytest.approx(expected, rel=1e-9)


def test_worked_example_of_docs() -> None:
    """docs/planner.md's example: 24000 tokens lent as a ring over node 0 plus one GPU of node 1."""
    cluster = load_cluster("2x4", tokens_per_gpu=40_000)
    cost = CostModel(model=load_model(None), cluster=cluster)
    lengths = [60000, 24000, 3000, 2000, 1500, 900, 700, 400, 300, 200]
    plan = plan_step(lengths, cost, PlannerOptions(packed=False))  # the partitioner's plan
    assert [(s.placement, s.ranks) for s in plan.sequences[:3]] == [
        ("inter_node", tuple(range(8))), ("inter_node", (0, 1, 2, 3, 4)), ("local", (5,))]
    assert all(s.placement == "local" for s in plan.sequences[2:])
    assert [s.a2a for s in plan.sequences[:2]] == [4, 1]  # ranks 5-7's local work fits the heads wait (docs)
    assert {(x.rank, x.ring, x.step) for x in plan.local_slots} == {(5, 1, -1), (6, 1, -1), (7, 1, -1)}
    att = attention_time(plan.predicted)
    assert att == pytest.approx([1686.01] * 5 + [1647.47] * 3, abs=0.01)  # 5-7 relay the ring over 0-4: waits
    assert plan.predicted.step_ms == pytest.approx(2347.90, abs=0.01)
    # the packed candidate (docs): both long sequences over all 8 ranks at a = 4, one short each
    packed = plan_step(lengths, cost, PlannerOptions(packed_absorb=False))
    assert packed.origin == "packed" and packed.linear == "attention"
    assert [(s.ranks, s.a2a) for s in packed.sequences[:2]] == [(tuple(range(8)), 4)] * 2
    assert [s.ranks for s in packed.sequences[2:]] == [(r,) for r in range(8)]
    assert [s.part for s in packed.sequences[:2]] == [0, 1]  # its ring in two parts (ring_parts.py)
    assert packed.predicted.step_ms == pytest.approx(2291.93, abs=0.01)
    whole = plan_step(lengths, cost, PlannerOptions(packed_absorb=False, ring_parts=False))
    assert whole.predicted.step_ms == pytest.approx(2310.92, abs=0.01)
    # by default the packing's ring absorbs the short ones, one by one from the busiest rank: all ten on it
    absorbed = plan_step(lengths, cost)
    assert absorbed.origin == "packed" and absorbed.linear == "attention"
    assert [(s.ranks, s.a2a) for s in absorbed.sequences] == [(tuple(range(8)), 4)] * 10
    assert absorbed.predicted.step_ms == pytest.approx(2192.46, abs=0.01)


def test_all_three_placements_occur() -> None:
    from .conftest import make_cost

    cost = make_cost("4x8", tokens_per_gpu=40_000)
    kinds = set()
    for seed in range(10):
        plan = plan_step(long_tailed_batch(1 << 20, seed), cost)
        kinds |= {s.placement for s in plan.sequences}
    assert kinds == {"local", "intra_node", "inter_node"}


def test_remap_off_keeps_attention_layout(cost_4x8: CostModel) -> None:
    lengths = long_tailed_batch(1 << 18, 1)
    plan = plan_step(lengths, cost_4x8, PlannerOptions(remap=False))
    assert plan.linear_layout == plan.attention_layout
    assert plan.predicted.remap_ms == 0.0
