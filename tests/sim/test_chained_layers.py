"""Chained layers (sim/simulator.py, sim/periodic.py): each rank starts its next layer when it finishes its
previous one; a component that repeats itself is extrapolated, exactly as simulating every layer."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from zeppelin_megatron.planner import Cluster, CostModel, load_model
from zeppelin_megatron.sim import periodic
from zeppelin_megatron.sim.charges import charges_for
from zeppelin_megatron.sim.lengths import sample_steps
from zeppelin_megatron.sim.program import Leg, LayerProgram, Op, Traffic
from zeppelin_megatron.sim.simulator import link_capacities, simulate, simulate_program
from zeppelin_megatron.sim.strategies import STRATEGY_NAMES, plan_with


def _cost(nodes: int, gpus: int, layers: int, nics: int | None = None) -> CostModel:
    nics = gpus if nics is None else nics
    cl = Cluster(nodes=nodes, gpus_per_node=gpus, nics_per_node=nics,
                 gpu_nic=tuple(g * nics // gpus for g in range(gpus)), nvlink_GBps=400.0, nic_Gbps=400.0,
                 tokens_per_gpu=1 << 20, nvlink_latency_us=5.0, nic_latency_us=10.0)
    return CostModel(model=replace(load_model(None), layers=layers), cluster=cl)


def test_ranks_without_transfers_run_their_own_layers() -> None:
    cost = _cost(1, 2, layers=7)
    ops = [[Op("compute", 3.0, "linear")], [Op("compute", 5.0, "linear")]]
    res = simulate_program(LayerProgram(ops, {}), cost)
    assert res.step_ms == pytest.approx(35.0) and res.layer_ms == pytest.approx(5.0)
    assert res.compute_ms == (pytest.approx(21.0), pytest.approx(35.0))
    assert res.finish_ms == (pytest.approx(21.0), pytest.approx(35.0))
    assert res.first_layer_ms == pytest.approx(5.0)


def test_skewed_pair_waits_once_not_in_every_layer() -> None:
    """Rank 0 computes 2 ms before the transfer, rank 1 2 ms after it. One layer from a common start:
    ``2 + x + 2``; chained, every layer after the first adds ``2 + x`` (each rank's 2 ms overlaps the other's
    wait), so ``L`` layers take ``2 + L (2 + x)``, where the earlier model charged ``L (4 + x)``."""
    layers = 9
    cost = _cost(1, 2, layers=layers)
    nvl, _ = link_capacities(cost)
    nbytes = 3.0 * nvl  # 3 ms on NVLink, plus 5 us latency
    x = 3.0 + 5e-3
    t = {("k",): Traffic(("k",), "ring", [[Leg(0, 1, nbytes, "nvl")]])}
    ops = [[Op("compute", 2.0, "linear"), Op("post", key=("k",)), Op("wait", key=("k",), kind="ring")],
           [Op("post", key=("k",)), Op("wait", key=("k",), kind="ring"), Op("compute", 2.0, "linear")]]
    prog = LayerProgram(ops, t)
    chained = simulate_program(prog, cost)
    assert chained.step_ms == pytest.approx(2.0 + layers * (2.0 + x))
    assert chained.first_layer_ms == pytest.approx(4.0 + x)
    assert chained.wait_ms[1] == pytest.approx(2.0 + layers * x)  # rank 1 waits 2 ms once, then x a layer
    one = simulate_program(prog, cost, layers=1)
    assert one.step_ms == pytest.approx(layers * (4.0 + x))
    assert chained.network_MB == one.network_MB == 0.0
    assert chained.nvlink_MB == pytest.approx(layers * nbytes / 1e6) == one.nvlink_MB


def test_components_join_hop_ends_and_shared_nic_ports() -> None:
    cost = _cost(2, 4, layers=1, nics=1)  # one NIC per node: every GPU of a node shares it
    nvl_only = {("a",): Traffic(("a",), "ring", [[Leg(0, 1, 1.0, "nvl")]])}
    ops: list[list[Op]] = [[] for _ in range(8)]
    assert periodic.components(LayerProgram(ops, nvl_only), cost) == [0, 0, 1, 2, 3, 4, 5, 6]
    nic = {("b",): Traffic(("b",), "ring", [[Leg(2, 5, 1.0, "nic")], [Leg(3, 6, 1.0, "nic")]])}
    assert periodic.components(LayerProgram(ops, {**nvl_only, **nic}), cost) == [0, 0, 1, 1, 2, 1, 1, 3]


def _configs() -> list[Any]:
    # (cluster, tokens, tensor parallel, distribution, seed): the simulated benchmarks' shapes, small by default
    slow = pytest.mark.slow
    return [("2x8", 1 << 18, 1, "arxiv-64k", 0),
            pytest.param(("2x8", 1 << 18, 1, "github-64k", 1), marks=slow),
            pytest.param(("4x8", 1 << 19, 2, "prolong-128k", 0), marks=slow),
            pytest.param(("16x8", 1 << 20, 1, "arxiv-128k", 0), marks=slow)]


@pytest.mark.parametrize("cfg", _configs())
def test_settled_components_extrapolate_exactly(cfg: tuple[str, int, int, str, int],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every strategy's plan simulated with the periodic stop and with every layer run: the same step, per-rank
    finish, compute and waits (to 1e-9; absolutely, within what the stop admits: layers that differ by up to
    ``periodic.TOLERANCE`` of their times count as shifted alike, so an extrapolated time may drift by that much per
    layer at the step's scale; a wait, a difference of such times, is compared at that scale: Zeppelin's plan of
    2 x 8 arxiv-64k with three ring parts waits 2.3e-6 ms apart of 20.2 ms, 1.3e-9 of its 1791 ms step), and at
    least one plan stops early (the stop is taken)."""
    from zeppelin_megatron.commands.simulate import setup
    spec, tokens, tp, dist, seed = cfg
    cl, cost = setup(f"{spec}@configs/clusters/h100.yaml", "configs/models/llama_7b.yaml", None, tp)
    batch = sample_steps(dist, 1, tokens, seed)[0]
    real = periodic.LayerLog.rank_done
    calls: list[float | None] = []

    def spy(self: periodic.LayerLog, *a: Any, **k: Any) -> float | None:
        d = real(self, *a, **k)
        calls.append(d)
        return d
    for name in STRATEGY_NAMES:
        sp = plan_with(name, batch, cl, cost)
        kw = dict(attention_comm=sp.attention_comm, keep_events=False, charges=charges_for(name))
        monkeypatch.setattr(periodic.LayerLog, "rank_done", spy)
        fast = simulate(sp.plan, cost, **kw)  # type: ignore[arg-type]
        monkeypatch.setattr(periodic.LayerLog, "rank_done", lambda *a, **k: None)
        full = simulate(sp.plan, cost, **kw)  # type: ignore[arg-type]
        drift = cost.model.layers * periodic.TOLERANCE * full.step_ms  # what the stop admits at the step's scale
        for a, b in ((fast.step_ms, full.step_ms),) + tuple(zip(fast.finish_ms, full.finish_ms)) + \
                tuple(zip(fast.compute_ms, full.compute_ms)) + tuple(zip(fast.wait_ms, full.wait_ms)):
            assert a == pytest.approx(b, rel=1e-9, abs=max(1e-6, drift)), name
    assert any(d is not None for d in calls)


def test_layers_must_be_positive() -> None:
    cost = _cost(1, 2, layers=3)
    with pytest.raises(ValueError, match="layers = 0"):
        simulate_program(LayerProgram([[Op("compute", 1.0, "linear")]] * 2, {}), cost, layers=0)
