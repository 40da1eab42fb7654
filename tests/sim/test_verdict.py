"""``--strategies peers`` and the verdict line of ``zeppelin simulate``: Zeppelin against the fastest peer simulated
beside it (sim/runner.py: parse_strategies, verdict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zeppelin_megatron.cli import main
from zeppelin_megatron.sim.runner import StrategySummary, parse_strategies, verdict
from zeppelin_megatron.sim.strategies import PEER_NAMES, STRATEGY_NAMES


def _summary(name: str, *steps: float) -> StrategySummary:
    return StrategySummary(name=name, step_ms=tuple(steps))


def test_peers_expands_to_zeppelin_every_peer_and_the_bound_in_place_once() -> None:
    assert set(PEER_NAMES) <= set(STRATEGY_NAMES) and "te-cp-routing" not in PEER_NAMES
    assert not any(n.startswith("zeppelin") for n in PEER_NAMES)
    assert parse_strategies("peers") == ["zeppelin", *PEER_NAMES, "lower-bound"]
    assert parse_strategies("zeppelin-rerank, peers,flexsp") == ["zeppelin-rerank", "zeppelin", *PEER_NAMES,
                                                                  "lower-bound"]
    assert parse_strategies("all") == [*STRATEGY_NAMES, "lower-bound"]
    assert parse_strategies("te-cp,zeppelin,te-cp") == ["te-cp", "zeppelin"]
    with pytest.raises(ValueError, match=r"unknown strategies \['peer'\].*or all, peers"):
        parse_strategies("zeppelin,peer")
    with pytest.raises(ValueError, match="unknown strategies"):
        parse_strategies(" , ")


def test_verdict_picks_the_fastest_peer_by_mean_and_the_worst_step() -> None:
    # the docstring's example: flexsp's mean equals zeppelin's, te-cp is slower; zeppelin's second step is the worse
    results = {n: _summary(n, *s) for n, s in (("te-cp", (150, 150)), ("zeppelin", (100, 120)),
                                              ("flexsp", (110, 110)), ("lower-bound", (90, 90)))}
    v = verdict(results)
    assert v is not None
    assert (v.strategy, v.best_peer, v.peers) == ("zeppelin", "flexsp", ("te-cp", "flexsp"))
    assert v.ratio == pytest.approx(1.0) and v.worst_step_ratio == pytest.approx(120 / 110)
    assert v.line().startswith("zeppelin / best peer: 1.000 (110 ms a step against flexsp's 110: as fast; "
                               "worst step 1.091), best of 2 of the 8 peers (--strategies peers runs all 8)")
    assert v.to_dict()["ratio"] == pytest.approx(1.0)


def test_verdict_faster_with_every_peer_ties_and_variants() -> None:
    results = {n: _summary(n, 200.0) for n in PEER_NAMES}
    results["distca"] = _summary("distca", 100.0)
    results["wlb-llm"] = _summary("wlb-llm", 100.0)  # a tie: the first of PEER_NAMES wins
    results = {"zeppelin-rerank": _summary("zeppelin-rerank", 80.0), **results, "zeppelin": _summary("zeppelin", 1.0)}
    v = verdict(results)
    assert v is not None and (v.strategy, v.best_peer) == ("zeppelin-rerank", "wlb-llm")
    assert v.line() == ("zeppelin-rerank / best peer: 0.800 (80 ms a step against wlb-llm's 100: 1.25x faster; "
                        "worst step 0.800), best of all 8 peers")


def test_no_verdict_without_zeppelin_or_a_peer() -> None:
    assert verdict({"te-cp": _summary("te-cp", 1.0), "lower-bound": _summary("lower-bound", 1.0)}) is None
    assert verdict({"zeppelin": _summary("zeppelin", 1.0), "te-cp-routing": _summary("te-cp-routing", 1.0)}) is None


def test_simulate_prints_and_writes_the_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim.json"
    assert main(["simulate", "--dist", "arxiv-64k", "--cluster", "1x4", "--strategies", "zeppelin,te-cp,hybrid-dp",
                 "--steps", "2", "--tokens-per-step", "65536", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    steps = {n: r["step_ms"] for n, r in doc["results"].items()}
    best = min(("te-cp", "hybrid-dp"), key=lambda n: sum(steps[n]))
    got = doc["verdict"]
    assert got["best_peer"] == best and got["peers"] == ["te-cp", "hybrid-dp"]
    assert got["ratio"] == pytest.approx(sum(steps["zeppelin"]) / sum(steps[best]))
    assert got["worst_step_ratio"] == pytest.approx(max(a / b for a, b in zip(steps["zeppelin"], steps[best])))
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("zeppelin / best peer: "))
    assert f"against {best}'s" in line and "best of 2 of the 8 peers" in line


def test_jobs_give_the_same_results_in_the_same_order() -> None:
    from zeppelin_megatron.commands.simulate import setup
    from zeppelin_megatron.sim.lengths import sample_steps
    from zeppelin_megatron.sim.runner import run_strategies

    cluster, cost = setup("1x4", None, None, 1)
    batches = sample_steps("arxiv-64k", 2, 65536, 0)
    names = ["te-cp", "zeppelin", "flexsp", "lower-bound"]
    seen: list[str] = []
    one = run_strategies(batches, cluster, cost, names)
    two = run_strategies(batches, cluster, cost, names, jobs=3, on_step=seen.append)
    assert list(two) == names and sorted(seen) == sorted(names * len(batches))
    assert all(two[n].step_ms == one[n].step_ms and two[n].notes == one[n].notes for n in names)
    with pytest.raises(ValueError, match="jobs is 0, expected at least 1"):
        run_strategies(batches, cluster, cost, names, jobs=0)
