from __future__ import annotations

from zeppelin_megatron.planner import CostModel, load_cluster, load_model, plan_step
from zeppelin_megatron.planner import PlannerOptions
from zeppelin_megatron.planner.routing import cross_hops, plan_routing, split_counts

from .conftest import make_cost


def test_split_counts() -> None:
    assert split_counts(10, 4) == [3, 3, 2, 2]
    assert split_counts(2, 4) == [1, 1, 0, 0]
    assert sum(split_counts(12345, 7)) == 12345


def test_whole_node_ring_uses_all_nics_rail_aligned() -> None:
    cost = make_cost("2x8")
    cl = cost.cluster
    ring = tuple(range(16))
    assert cross_hops(ring, cl) == [(7, 8), (15, 0)]
    routes = plan_routing([(ring, 64 << 20)], cl, cost)
    assert [(r.src, r.dst) for r in routes] == [(7, 8), (15, 0)]
    # One outgoing hop per node. Hop 7 -> 8 sends from NIC 7 and receives on node 1's
    # NIC 0, so rail 0 is busy at the destination: proxies are its own 7 plus rails 1-6.
    for r in routes:
        assert r.proxies[0] == cl.local_of(r.src)
        assert sorted(r.proxies) == list(range(1, 8))


def test_small_transfers_not_routed() -> None:
    cost = make_cost("2x8")
    assert plan_routing([(tuple(range(16)), 1024)], cost.cluster, cost) == ()
    assert plan_routing([(tuple(range(16)), 64 << 20)], cost.cluster, cost, enabled=False) == ()


def test_a800_one_proxy_per_nic() -> None:
    cl = load_cluster("2x8@configs/clusters/a800.yaml")
    cost = CostModel(model=load_model(None), cluster=cl)
    routes = plan_routing([(tuple(range(16)), 64 << 20)], cl, cost)
    # 4 NICs, two GPUs each; the hop's own NIC plus the two rails idle at both ends.
    for r in routes:
        nics = [cl.gpu_nic[p] for p in r.proxies]
        assert len(set(nics)) == len(nics) == 3


def test_busy_nics_not_reused() -> None:
    # Every hop crosses nodes: each GPU's own NIC is busy, so no idle NIC to borrow.
    cost = make_cost("2x2")
    ring = (0, 2, 1, 3)
    assert len(cross_hops(ring, cost.cluster)) == 4
    assert plan_routing([(ring, 64 << 20)], cost.cluster, cost) == ()


def test_plan_routes_inter_node_rings() -> None:
    # 60k tokens cannot fit on one node of 8 x 4000: the ring must cross nodes, and
    # without routing its network transfer is not hidden (compute/comm ~0.4).
    # Plain rings (head_parallel off): a head-parallel ring is never routed, and this one would
    # run at width 8 (two blocks, each lane over its own NIC), test_choose_heads.py.
    cost = make_cost("2x8", tokens_per_gpu=4000)
    plan = plan_step([60_000, 500, 700], cost, PlannerOptions(head_parallel=False))
    assert plan.sequences[0].placement == "inter_node"
    assert plan.routing and all(r.ring == plan.sequences[0].ranks for r in plan.routing)
    no = plan_step([60_000, 500, 700], cost, PlannerOptions(routing=False, head_parallel=False))
    assert no.routing == ()
    assert no.predicted.step_ms > plan.predicted.step_ms


def test_route_parts_paths_offsets_and_relays() -> None:
    from zeppelin_megatron.planner.routing import Route, RoutePart, route_parts

    # the docstring's example: 2 nodes x 4 GPUs, 1 -> 6 over proxies (1, 3), 10 elements
    parts = route_parts(Route((1, 6), 1, 6, (1, 3)), 10, 4)
    assert parts == [RoutePart(0, 0, 5, (1, 6)), RoutePart(1, 5, 5, (1, 3, 7, 6))]
    assert [p.relays for p in parts] == [(), (3, 7)]
    # a proxy at the destination's local index ends on the destination; empty parts are left out
    parts = route_parts(Route((0, 5), 0, 5, (0, 1, 2)), 2, 4)
    assert parts == [RoutePart(0, 0, 1, (0, 5)), RoutePart(1, 1, 1, (0, 1, 5))]
    assert sum(p.count for p in route_parts(Route((0, 5), 0, 5, (0, 1, 2, 3)), 1001, 4)) == 1001
