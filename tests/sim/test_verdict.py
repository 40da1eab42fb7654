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


def test_a_peer_that_cannot_run_a_step_is_reported_not_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    """Six sequences of 600 tokens on 4 GPUs of 1000: whole-sequence peers (hybrid-dp, flexsp's groups) cannot pack
    them; with ``peer_refusals`` (the simulate command) they are reported as refused, the others and the verdict
    go on; without it (the benchmarks), the refusal propagates; Zeppelin's own refusal always propagates."""
    from zeppelin_megatron.commands.simulate import setup
    from zeppelin_megatron.planner.plan import PlanError
    from zeppelin_megatron.sim.runner import run_strategies

    cluster, cost = setup("1x4", None, None, 1, 1000)
    batches = [[600] * 6, [500] * 7 + [300]]
    names = ["zeppelin", "te-cp", "hybrid-dp", "flexsp"]
    seen: list[str] = []
    got = run_strategies(batches, cluster, cost, names, peer_refusals=True, on_step=seen.append)
    assert sorted(seen) == sorted(names * 2)
    assert got["hybrid-dp"].refused.startswith("step 0: hybrid-dp: sequence 4 (600 tokens on 1 GPUs) fits in no "
                                               "block of 1000 tokens per GPU")
    assert got["flexsp"].refused.startswith("step 0: flexsp: ") and len(got["te-cp"].step_ms) == 2
    assert got["hybrid-dp"].to_dict() == {"name": "hybrid-dp", "refused": got["hybrid-dp"].refused}
    with pytest.raises(ValueError, match="hybrid-dp has no step time: it refused step 0"):
        got["hybrid-dp"].mean_step_ms  # noqa: B018
    v = verdict(got)
    assert v is not None and v.best_peer == "te-cp" and v.peers == ("te-cp",) and v.refused == ("hybrid-dp", "flexsp")
    two = run_strategies(batches, cluster, cost, names, peer_refusals=True, jobs=2)
    assert [(r.step_ms, r.refused) for r in two.values()] == [(r.step_ms, r.refused) for r in got.values()]
    with pytest.raises(PlanError, match="hybrid-dp: sequence 4"):
        run_strategies(batches, cluster, cost, ["hybrid-dp"])
    with pytest.raises(PlanError):  # more tokens than the GPUs hold: Zeppelin's refusal is an error, never a row
        run_strategies([[1000] * 4 + [1]], cluster, cost, ["zeppelin"], peer_refusals=True)
    out = tmp_path / "r.json"
    lengths = tmp_path / "l.txt"
    lengths.write_text("600\n" * 12)
    assert main(["simulate", "--lengths", str(lengths), "--cluster", "1x4", "--tokens-per-gpu", "1000", "--steps",
                 "2", "--tokens-per-step", "3600", "--strategies", "peers", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| hybrid-dp | refused | - | - | - | - | cannot run step 0: hybrid-dp: sequence" in text
    assert "best of the 6 of the 8 peers that run these steps (hybrid-dp, flexsp cannot)" in text
    assert json.loads(out.read_text())["verdict"]["refused"] == ["hybrid-dp", "flexsp"]


def test_a_verdict_within_half_a_percent_keeps_three_digits() -> None:
    slower = verdict({"zeppelin": _summary("zeppelin", 1003.0), "te-cp": _summary("te-cp", 1000.0)})
    faster = verdict({"zeppelin": _summary("zeppelin", 997.0), "te-cp": _summary("te-cp", 1000.0)})
    assert slower is not None and "1.003x slower" in slower.line()
    assert faster is not None and "1.003x faster" in faster.line()
