"""Per-step metrics: summaries of real plans, aggregation, the recorder's step timing, the writers."""

from __future__ import annotations

import pytest

from zeppelin_megatron.megatron.metrics import (
    MetricsWriter,
    StepMetricsRecorder,
    format_step,
    plan_metrics,
    scalars,
    step_metrics,
)
from zeppelin_megatron.megatron.batch_schedule import StepSchedule
from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, plan_step
from zeppelin_megatron.planner.model import LLAMA_7B
from zeppelin_megatron.planner.predict import attention_time

from .helpers import H100_YAML


@pytest.fixture(scope="module")
def plans():
    cluster = load_cluster(f"2x8@{H100_YAML}")
    cost = CostModel(model=LLAMA_7B, cluster=cluster)
    batches = [[90_000, 30_000] + [2_000] * 85, [4_096] * 64, [100_000, 500, 700, 9_000] + [1_000] * 50]
    # the partitioner's plans (rings across nodes to count); packed plans: tests/planner/test_packed.py
    return [plan_step(b, cost, PlannerOptions(packed=False)) for b in batches]


def test_plan_metrics_counts_and_bytes(plans) -> None:
    p = plans[0]
    m = plan_metrics(p)
    assert m.sequences == 87 and m.tokens == 290_000
    assert m.local + m.intra_node + m.inter_node == 87
    assert m.local == sum(1 for s in p.sequences if s.placement == "local")
    assert m.inter_node == sum(1 for s in p.sequences if s.placement == "inter_node") >= 1
    assert m.routed_hops == len(p.routing) >= 1
    assert m.predicted_ms == p.predicted.step_ms
    att = attention_time(p.predicted)
    assert m.attention_max_ms == max(att) and m.attention_mean_ms == pytest.approx(sum(att) / 16)
    assert m.inter_node_MB == pytest.approx(sum(p.predicted.inter_MB)) and m.inter_node_MB > 0
    assert m.intra_node_MB == pytest.approx(sum(p.predicted.intra_MB))
    assert m.tokens_max == max(p.tokens(r) for r in range(16))


def test_plan_without_prediction_rejected(plans) -> None:
    from dataclasses import replace
    with pytest.raises(ValueError, match="plan.predicted"):
        plan_metrics(replace(plans[0], predicted=None, validate=False))


def test_step_metrics_aggregates(plans) -> None:
    ms = [plan_metrics(p) for p in plans]
    s = step_metrics(3, ms, measured_ms=2000.0)
    assert s.micro_steps == 3 and s.sequences == sum(m.sequences for m in ms)
    assert s.predicted_ms == pytest.approx(sum(m.predicted_ms for m in ms))
    assert s.attention_imbalance == pytest.approx(
        sum(m.attention_max_ms for m in ms) / sum(m.attention_mean_ms for m in ms))
    assert s.attention_imbalance >= 1.0 and s.token_imbalance >= 1.0
    assert s.measured_over_predicted == pytest.approx(2000.0 / s.predicted_ms)
    sc = scalars(s)
    assert sc["zeppelin/measured_ms"] == 2000.0 and sc["zeppelin/inter_node_MB"] == s.inter_node_MB
    line = format_step(s)
    assert line.startswith("zeppelin step 3 |") and "measured 2000.0 ms" in line and "(cost model)" in line
    assert "zeppelin/measured_ms" not in scalars(step_metrics(3, ms))
    with pytest.raises(ValueError, match="no micro-step plans"):
        step_metrics(1, [])


class _TB:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []

    def add_scalar(self, name: str, value: float, step: int) -> None:
        self.calls.append((name, value, step))


class _WB:
    def __init__(self) -> None:
        self.calls: list[tuple[dict, int]] = []

    def log(self, values: dict, step: int) -> None:
        self.calls.append((values, step))


TWO = StepSchedule(samples_per_micro_step=1, global_batch_size=2)  # 2 micro-steps per step


def test_recorder_times_complete_steps(plans) -> None:
    t = [0.0]
    lines: list[str] = []
    tb, wb = _TB(), _WB()
    syncs = []
    writer = MetricsWriter(log=lines.append, tensorboard=tb, wandb=wb, log_interval=2, scalar_interval=1)
    rec = StepMetricsRecorder(schedule=TWO, writer=writer, clock=lambda: t[0], sync=lambda: syncs.append(1))
    out = []
    for micro, at in [(0, 0.0), (1, 0.4), (1, 0.5), (2, 1.5), (3, 1.6), (4, 4.0)]:
        t[0] = at
        out.append(rec.record(micro, plans[micro % 3]))
    # step 1 (micro 0,1) ends when micro 2 starts at 1.5 s; step 2 (micro 2,3) when micro 4 starts at 4.0 s
    assert [o is not None for o in out] == [False, False, False, True, False, True]
    s1, s2 = out[3], out[5]
    assert (s1.iteration, s1.micro_steps, s1.measured_ms) == (1, 2, pytest.approx(1500.0))
    assert (s2.iteration, s2.measured_ms) == (2, pytest.approx(2500.0))
    assert len(syncs) == 3  # once per step boundary
    assert len(lines) == 1 and lines[0].startswith("zeppelin step 2 ")  # log_interval 2
    assert {c[2] for c in tb.calls} == {1, 2} and [c[1] for c in wb.calls] == [1, 2]


def test_recorder_skips_partial_first_step(plans) -> None:
    # Resuming mid-step (micro 3 of M=2 -> step 1 index 1): step 1 is incomplete, not reported.
    rec = StepMetricsRecorder(schedule=TWO, clock=lambda: 0.0)
    assert rec.record(3, plans[0]) is None
    assert rec.record(4, plans[1]) is None
    assert rec.record(5, plans[1]) is None
    assert rec.record(6, plans[2]).iteration == 3


def test_writer_validation() -> None:
    with pytest.raises(ValueError, match="log_interval"):
        MetricsWriter(log_interval=0)
    with pytest.raises(TypeError, match="schedule must be a StepSchedule, got int"):
        StepMetricsRecorder(schedule=2)  # type: ignore[arg-type]


def test_recorder_follows_the_ramp_up(plans) -> None:
    """--rampup-batch-size 1 1 2 to 3 samples of one micro-step each (micro-steps 0 | 1 2 | 3 4 5 | 6 7 8 | ...,
    batch_schedule.py): each step reported with its own micro-steps, numbered as Megatron's iterations."""
    t = [0.0]
    rec = StepMetricsRecorder(schedule=StepSchedule(samples_per_micro_step=1, global_batch_size=3, rampup=(1, 1, 2)),
                              clock=lambda: t[0])
    done = []
    for micro in range(10):
        t[0] = float(micro)
        out = rec.record(micro, plans[micro % 3])
        if out is not None:
            done.append((out.iteration, out.micro_steps, out.measured_ms))
    assert done == [(1, 1, 1000.0), (2, 2, 2000.0), (3, 3, 3000.0), (4, 3, 3000.0)]


def test_recorder_follows_a_resumed_step_schedule(plans) -> None:
    """--step-batch-size-schedule "0:1 5:2" in samples, a run resumed at iteration 4 with 4 samples consumed (its
    schedule's steps from there: micro-steps 4 | 5 6 | 7 8 | 9 10 | ...). A run that changed the schedule on resuming
    follows the new one from where it stands, as Megatron does; the recorder starts afresh."""
    t = [0.0]
    steps = StepSchedule(samples_per_micro_step=1, global_batch_size=1, step_batch_sizes=((0, 1), (5, 2)))
    rec = StepMetricsRecorder(schedule=TWO, clock=lambda: t[0])
    rec.record(0, plans[0])
    rec.follow(steps.resumed(step=4, consumed=4))
    done = []
    for micro in range(4, 11):
        t[0] = float(micro)
        out = rec.record(micro, plans[micro % 3])
        if out is not None:
            done.append((out.iteration, out.micro_steps, out.measured_ms))
    assert done == [(5, 1, 1000.0), (6, 2, 2000.0), (7, 2, 2000.0)]
    with pytest.raises(TypeError, match="schedule must be a StepSchedule, got str"):
        rec.follow("0:1")  # type: ignore[arg-type]


def test_recorder_numbers_a_phases_micro_steps_from_the_run(plans) -> None:
    """Under Megatron's phase transitions the data of a phase starts at its own micro-step 0 while the run has
    taken earlier ones: a run resumed at iteration 3 of 2 micro-steps a step, its phase begun at iteration 2, reads
    the phase's micro-steps 2, 3, ... which are the run's 6, 7, ... (offset 4): reported as iterations 4, 5."""
    t = [0.0]
    rec = StepMetricsRecorder(schedule=TWO, clock=lambda: t[0])
    rec.follow(TWO.resumed(step=3, consumed=6), micro_step_offset=4)
    done = []
    for micro in range(2, 8):
        t[0] = float(micro)
        out = rec.record(micro, plans[micro % 3])
        if out is not None:
            done.append((out.iteration, out.micro_steps))
    assert done == [(4, 2), (5, 2)]
    with pytest.raises(ValueError, match="micro_step_offset must be a non-negative integer, got -1"):
        rec.follow(TWO, micro_step_offset=-1)


def test_paths_counted_per_sequence(plans) -> None:
    """Split sequences run as a ring, an all-to-all over heads (a2a = ranks) or a hybrid (1 < a2a < ranks)."""
    from dataclasses import replace
    p = plans[0]  # 90k on all 16 ranks of 2 x 8, 30k on ranks 0-8 (routed), the rest local
    seqs = [replace(s, a2a=1) for s in p.sequences]
    (big,) = [i for i, s in enumerate(seqs) if len(s.ranks) == 16]
    seqs[big] = replace(seqs[big], a2a=8)  # all-to-all in each node, ring over the 2 nodes
    m = plan_metrics(replace(p, sequences=tuple(seqs), validate=False))
    assert (m.ulysses, m.hybrid, m.inter_node) == (0, 1, 2)
    s = step_metrics(1, [m, plan_metrics(p)])
    assert s.remapped == m.remapped + plan_metrics(p).remapped
    line = format_step(s)
    rings = s.intra_node + s.inter_node - s.ulysses - s.hybrid
    assert f"split: {rings} ring, {s.ulysses} all-to-all, {s.hybrid} hybrid" in line
    assert f"remap {s.remapped} of 2" in line
