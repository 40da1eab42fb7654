"""Remap windows at the edges: ``zeppelin plan`` / ``zeppelin simulate`` ``--no-remap-overlap`` and the
step metrics' count of sequences run inside remap windows."""

from __future__ import annotations

from pathlib import Path

import pytest

from zeppelin_megatron.cli import main
from zeppelin_megatron.commands.simulate import no_head_parallel
from zeppelin_megatron.megatron.metrics import format_step, plan_metrics, step_metrics
from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.workloads import long_tailed_batch

ROOT = Path(__file__).resolve().parents[1]


def _windows_line(text: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith("local sequences in remap windows:"))


def test_plan_prints_windows_and_the_flag_turns_them_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "l.txt"
    f.write_text("\n".join(map(str, long_tailed_batch(1 << 19, 0))) + "\n")
    args = ["plan", "--lengths", str(f), "--cluster", "2x8", "--remap", "on"]
    assert main(args) == 0
    on = _windows_line(capsys.readouterr().out)
    assert main(args + ["--no-remap-overlap"]) == 0
    off = _windows_line(capsys.readouterr().out)
    assert off == "local sequences in remap windows: 0 (remap in: 0 calls, remap out: 0 calls)"
    assert on != off and int(on.split(":")[1].split()[0]) > 0


def test_simulate_flag_maps_the_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    assert no_head_parallel(["zeppelin", "te-cp"], "zeppelin-no-remap-overlap") == \
        ["zeppelin-no-remap-overlap", "te-cp"]
    with pytest.raises(ValueError, match="--no-remap-overlap applies to the zeppelin strategy only"):
        no_head_parallel(["zeppelin-no-routing"], "zeppelin-no-remap-overlap")
    assert main(["simulate", "--dist", "github-64k", "--cluster", "1x8", "--no-head-parallel",
                 "--no-remap-overlap"]) == 2
    assert "--no-head-parallel and --no-remap-overlap each replace the zeppelin strategy" in capsys.readouterr().err


def test_step_metrics_count_window_sequences() -> None:
    cost = CostModel(model=load_model(None), cluster=load_cluster("2x8"))
    plans = [plan_step(long_tailed_batch(1 << 19, s), cost, PlannerOptions(remap=True)) for s in (0, 3)]
    counts = [sum(len(x.seqs) for x in p.remap_slots) for p in plans]
    assert all(plan_metrics(p).windowed == c for p, c in zip(plans, counts)) and sum(counts) > 0
    line = format_step(step_metrics(1, [plan_metrics(p) for p in plans]))
    assert f"({sum(counts)} seqs in remap windows)" in line
