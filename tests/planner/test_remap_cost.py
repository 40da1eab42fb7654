"""remap_cost.py: the remap's time link by link, against hand counts, the routed parts, and the simulator."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from zeppelin_megatron.planner import PlannerOptions, plan_step
from zeppelin_megatron.planner.plan import SequencePlan, StepPlan
from zeppelin_megatron.planner.remap_cost import port_rows, remap_layer_ms, remap_pairs, remap_proxies_for
from zeppelin_megatron.planner.remap_routing import nic_proxies, proxy_parts
from zeppelin_megatron.planner.workloads import long_tailed_batch

from .conftest import make_cost


def test_docstring_examples() -> None:
    assert port_rows([(0, 3, 10)], 2, (0, 1), ()) == (10, 10)
    assert port_rows([(0, 3, 10)], 2, (0, 1), (0, 1)) == (5, 5)
    both = [(0, 3, 10), (2, 1, 4)]
    assert port_rows(both, 2, (0, 1), ()) == (10, 10)
    assert port_rows([(b, a, n) for a, b, n in both], 2, (0, 1), ()) == (10, 10)
    # GPUs sharing a NIC share its ports: both of node 0's GPUs send through NIC 0
    assert port_rows([(0, 2, 3), (1, 3, 4)], 2, (0, 0), ()) == (0, 7)


def test_remap_pairs_example() -> None:
    plan = StepPlan(nodes=2, gpus_per_node=1, sequences=(SequencePlan(4, "inter_node", (0, 1)),),
                    attention_layout=(((0, 0, 1), (0, 3, 4)), ((0, 1, 3),)), linear_layout=(((0, 0, 2),), ((0, 2, 4),)))
    assert remap_pairs(plan) == [(0, 1, 1), (1, 0, 1)]
    assert remap_pairs(plan.evolve(linear_layout=plan.attention_layout)) == []


def _reference(pairs: list[tuple[int, int, int]], gpn: int, gpu_nic: tuple[int, ...],
               proxies: tuple[int, ...]) -> tuple[int, int]:
    """The same port counts from remap_routing.proxy_parts, hop by hop."""
    nvl: dict[tuple[int, str], int] = defaultdict(int)
    nic: dict[tuple[int, int, str], int] = defaultdict(int)

    def hop(a: int, b: int, n: int, over_nic: bool) -> None:
        if over_nic:
            nic[(a // gpn, gpu_nic[a % gpn], "out")] += n
            nic[(b // gpn, gpu_nic[b % gpn], "in")] += n
        elif a != b:
            nvl[(a, "out")] += n
            nvl[(b, "in")] += n

    for a, b, n in pairs:
        if a // gpn == b // gpn:
            hop(a, b, n, False)
        elif not proxies:
            rail = (b // gpn) * gpn + a % gpn
            hop(a, rail, n, True)
            hop(rail, b, n, False)
        else:
            for _, rows, pa, pb in proxy_parts(a, b, n, gpn, proxies):
                hop(a, pa, rows, False)
                hop(pa, pb, rows, True)
                hop(pb, b, rows, False)
    return max(nvl.values(), default=0), max(nic.values(), default=0)


@pytest.mark.parametrize("seed", range(20))
def test_port_rows_match_the_routed_parts(seed: int) -> None:
    rng = random.Random(seed)
    nodes, gpn = rng.choice([(2, 2), (2, 4), (3, 8), (4, 8)])
    gpu_nic = rng.choice([tuple(range(gpn)), tuple(l // 2 for l in range(gpn))])
    world = nodes * gpn
    pairs = sorted({(a, b): rng.randint(1, 50) for a, b in ((rng.randrange(world), rng.randrange(world))
                                                            for _ in range(rng.randint(1, 40))) if a != b}.items())
    flat = [(a, b, n) for (a, b), n in pairs]
    for proxies in ((), nic_proxies(gpu_nic), tuple(range(gpn))[: max(1, gpn // 2)]):
        assert port_rows(flat, gpn, gpu_nic, proxies) == _reference(flat, gpn, gpu_nic, proxies)


def test_remap_layer_ms_is_in_plus_out() -> None:
    cost = make_cost("2x8")
    plan = plan_step(long_tailed_batch(1 << 19, 1), cost, PlannerOptions(remap=True, head_parallel=False))
    pairs = remap_pairs(plan)
    assert pairs, "this batch remaps"
    per = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    cl = cost.cluster
    expected = 0.0
    for moving in (pairs, [(b, a, n) for a, b, n in pairs]):
        nvl, nic = port_rows(moving, cl.gpus_per_node, cl.gpu_nic, plan.remap_proxies)
        expected += max(cost.nvlink_ms(nvl * per), cost.nic_ms(nic * per) if nic else 0.0)
    assert remap_layer_ms(plan, cost, plan.remap_proxies) == pytest.approx(expected)
    assert remap_layer_ms(plan.evolve(linear_layout=plan.attention_layout), cost, ()) == 0.0


def test_proxies_only_where_faster() -> None:
    cost = make_cost("2x8")
    plan = plan_step(long_tailed_batch(1 << 19, 1), cost, PlannerOptions(remap=True, head_parallel=False))
    px = remap_proxies_for(plan, cost)
    routed, direct = remap_layer_ms(plan, cost, nic_proxies(cost.cluster.gpu_nic)), remap_layer_ms(plan, cost, ())
    assert px == (nic_proxies(cost.cluster.gpu_nic) if routed < direct else ())
    one = make_cost("1x8")
    inside = plan_step(long_tailed_batch(1 << 18, 1), one, PlannerOptions(remap=True))
    assert remap_proxies_for(inside, one) == ()  # nothing crosses nodes


@pytest.mark.parametrize("spec,tokens,seed", [("2x8", 1 << 19, 1), ("4x8", 1 << 20, 2), ("16x8", 1 << 20, 0)])
def test_agrees_with_the_simulator(spec: str, tokens: int, seed: int) -> None:
    """The remap alone (both all-to-alls, nothing else) in the event simulator, direct and routed, one layer from
    a common start (``layers=1``, what remap_layer_ms prices; chained layers would also overlap one layer's remap
    out with the next one's remap in, and 32 of them routed over 128 ranks take minutes): within 25% of
    remap_layer_ms (the old per-rank rule charged 30-85% less on such plans)."""
    from zeppelin_megatron.planner.lowering import lower_remaps
    from zeppelin_megatron.sim.program import LayerProgram, Op, _remap_transfer
    from zeppelin_megatron.sim.simulator import simulate_program

    cost = make_cost(spec)
    plan = plan_step(long_tailed_batch(tokens, seed), cost, PlannerOptions(remap=True, head_parallel=False))
    per = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    for proxies in ((), nic_proxies(cost.cluster.gpu_nic)):
        q = plan.evolve(remap_proxies=proxies)
        t_in, t_out = (_remap_transfer(("remap", d), cost, x, per) for d, x in zip(("in", "out"), lower_remaps(q)))
        ops = [[Op("post", key=t.key), Op("wait", key=t.key, kind="remap")] for t in (t_in, t_out)]
        program = LayerProgram([ops[0] + ops[1] for _ in range(q.world_size)], {t_in.key: t_in, t_out.key: t_out},
                               [[] for _ in range(q.world_size)])
        simulated = simulate_program(program, cost, keep_events=False, layers=1).layer_ms
        assert remap_layer_ms(q, cost, proxies) == pytest.approx(simulated, rel=0.25), (spec, proxies)
