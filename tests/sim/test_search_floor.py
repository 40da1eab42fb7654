"""``compute_floor_ms`` (the busiest rank's kernels bound a simulated step from below) and the peers' searches
that use it (``simulated_step``'s ``beat``) to skip sizes that cannot win: the same choice, fewer simulations."""

from __future__ import annotations

import math
import random

import pytest

import zeppelin_megatron.sim.simulator as simulator
from zeppelin_megatron.planner import CostModel, load_cluster, load_model
from zeppelin_megatron.sim.baselines import wlb_llm_plan
from zeppelin_megatron.sim.distca import distca_plan
from zeppelin_megatron.sim.layer_ops import LayerProgram, Leg, Op, Traffic
from zeppelin_megatron.sim.megatron_hcp import hcp_plan
from zeppelin_megatron.sim.program import build_layer_program
from zeppelin_megatron.sim.simulator import compute_floor_ms, simulate, simulate_program, simulated_step
from zeppelin_megatron.sim.te_cp_a2a_p2p import a2a_p2p_plan


def _cost(spec: str = "2x4") -> CostModel:
    return CostModel(model=load_model(None), cluster=load_cluster(spec, tokens_per_gpu=65536))


def test_floor_worked_example() -> None:
    # rank 0: 2 + 3 ms of kernels and a local queue of 0.1 + 0.2 ms run as one call (at least the overhead);
    # rank 1: 4 ms and a transfer; the floor is rank 0's layers x (5 + max(0.3, overhead))
    cost = _cost("1x2")
    o = cost.call_overhead_ms
    key = ("x",)
    program = LayerProgram(
        ops=[[Op("compute", 2.0), Op("local"), Op("compute", 3.0), Op("post", key=key), Op("wait", key=key)],
             [Op("post", key=key), Op("compute", 4.0), Op("wait", key=key)]],
        transfers={key: Traffic(key, "ring", [[Leg(0, 1, 1e6, "nvl")]])},
        local_queue=[[0.1, 0.2], []])
    layers = cost.model.layers
    assert compute_floor_ms(program, cost) == pytest.approx(layers * (5.0 + max(0.3, o)))
    assert simulate_program(program, cost, keep_events=False).step_ms >= compute_floor_ms(program, cost)


def _batch(rng: random.Random, tokens: int) -> list[int]:
    out: list[int] = []
    while sum(out) < tokens:
        out.append(min(rng.choice([rng.randint(64, 2048), rng.randint(2048, 16384), rng.randint(8192, 30000)]),
                       tokens - sum(out) if tokens - sum(out) >= 64 else 64))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_floor_is_below_every_peers_simulated_step(seed: int) -> None:
    """On random batches, every size each searching peer tries: the floor never exceeds the simulated step."""
    cost = _cost()
    lengths = _batch(random.Random(seed), 8 * 16384)
    plans = [(a2a_p2p_plan(lengths, cost.cluster, cost)[0], "a2a_p2p", "zeppelin"),
             (hcp_plan(lengths, cost.cluster, cost)[0], "hcp", "zeppelin"),
             (distca_plan(lengths, cost.cluster, cost), "distca", "zeppelin"),
             (wlb_llm_plan(lengths, cost.cluster, cost)[0], "ring", "te")]
    for plan, comm, charges in plans:
        program = build_layer_program(plan, cost, comm, True, interleave_local=True, charges=charges)
        step = simulate(plan, cost, attention_comm=comm, keep_events=False, charges=charges).step_ms
        floor = compute_floor_ms(program, cost)
        assert 0 < floor <= step * (1 + 1e-12)
        assert simulated_step(plan, cost, attention_comm=comm, charges=charges) == step
        assert simulated_step(plan, cost, attention_comm=comm, charges=charges, beat=floor * 0.999) == math.inf
        assert simulated_step(plan, cost, attention_comm=comm, charges=charges, beat=floor * 1.01) == step


def _searches(lengths: list[int], cost: CostModel) -> list[object]:
    """What each searching peer chooses: its plan's sequences' ranks and the size it reports."""
    a2a, sizes = a2a_p2p_plan(lengths, cost.cluster, cost)
    hcp, setting = hcp_plan(lengths, cost.cluster, cost)
    distca = distca_plan(lengths, cost.cluster, cost)
    wlb, cp, rule = wlb_llm_plan(lengths, cost.cluster, cost)
    return [[s.ranks for s in a2a.sequences], sizes, [s.ranks for s in hcp.sequences], setting,
            distca.peer, [s.ranks for s in distca.sequences], [s.ranks for s in wlb.sequences], cp, rule]


@pytest.mark.parametrize("seed", range(2))
def test_searches_choose_as_without_the_floor(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every searching peer picks the same plan with the floor as when it simulates every size, and the floor
    skipped some simulations."""
    cost = _cost()
    lengths = _batch(random.Random(100 + seed), 8 * 16384)
    calls = {"n": 0}
    real = simulator.simulate_program

    def counted(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(simulator, "simulate_program", counted)
    with_floor = _searches(lengths, cost)
    skipped = calls["n"]
    monkeypatch.setattr(simulator, "compute_floor_ms", lambda program, cost: 0.0)
    calls["n"] = 0
    assert _searches(lengths, cost) == with_floor
    assert skipped < calls["n"]


def test_fastest_keeps_the_earlier_of_a_tie_and_beats_by_the_same_rule() -> None:
    fastest: simulator.Fastest[str] = simulator.Fastest()
    assert fastest.kept is None and fastest.beat == math.inf
    assert fastest.offer(math.inf, "never faster") and fastest.kept == "never faster"  # the first is kept
    assert fastest.offer(10.0, "a") and fastest.offer(9.5, "b")
    assert not fastest.offer(9.5 - 1e-10, "c")  # within the tie margin: the earlier stays
    assert not fastest.offer(9.5 - simulator.TIE_MS, "d")  # exactly the margin is no gain
    assert fastest.kept == "b" and fastest.ms == 9.5 and fastest.beat == 9.5 - simulator.TIE_MS
    assert fastest.offer(9.4, "e") and fastest.kept == "e"


def test_fastest_simulate_keeps_what_simulating_everything_keeps() -> None:
    """Offering every simulated step in order and simulating with ``beat`` keep the same candidate."""
    cost = _cost()
    lengths = _batch(random.Random(7), 8 * 16384)
    plans = [hcp_plan(lengths, cost.cluster, cost, max_seqlen_per_rank=s)[0] for s in (4096, 8192, 16384, 32768)]
    full: simulator.Fastest[int] = simulator.Fastest()
    floored: simulator.Fastest[int] = simulator.Fastest()
    for i, plan in enumerate(plans + plans[::-1]):
        full.offer(simulate(plan, cost, attention_comm="hcp", keep_events=False).step_ms, i)
        floored.simulate(plan, cost, i, attention_comm="hcp")
    assert floored.kept == full.kept and floored.ms == full.ms
