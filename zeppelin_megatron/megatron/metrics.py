"""Per-step Zeppelin metrics: what the plans placed, predicted against measured time.

Pure parts: :func:`plan_metrics` (one micro-step's plan), :func:`step_metrics`
(one training step's micro-steps), :func:`scalars` and
:func:`format_step`. Stateful edge: :class:`StepMetricsRecorder` groups the
micro-steps of a step and times the step; :class:`MetricsWriter` prints a line
and writes scalars to Megatron's tensorboard / wandb writers when given. No
Megatron import: the writers and the print function are passed in.

Numbers (all from the plans' cost-model predictions, except ``measured_ms``):

* ``local`` / ``intra_node`` / ``inter_node``: sequences of the step per placement;
  ``ulysses`` / ``hybrid``: of the split ones, those run head-parallel (all-to-all over heads in one
  node; all-to-all in each node and a ring across nodes), the rest run as zigzag rings; ``in_parts``: of
  those, the ones in a head-parallel ring run as two or three rings whose all-to-alls overlap (planner/ring_parts.py);
  ``remapped``: micro-steps whose linear modules run on a layout of their own (a remap every layer);
  ``windowed``: local sequences run while a remap is in flight (``StepPlan.remap_slots``);
  ``packed``: micro-steps whose plan is a packed candidate (``StepPlan.origin``: attention + linear
  balanced per rank, no remap; ``planner/packed.py``).
* ``predicted_ms``: sum over micro-steps of ``plan.predicted.step_ms``
  (forward + backward, all layers; no optimizer, no data loading).
* ``measured_ms``: wall time from the start of this step's first micro-step to
  the start of the next step's (includes optimizer, data and logging).
* ``attention_imbalance``: ``sum_k max_r att_k[r] / sum_k mean_r att_k[r]`` over
  micro-steps ``k``, with ``att = attention compute + exposed ring waits``
  (1.0 = perfectly balanced attention); ``token_imbalance`` the same for the
  linear-layout token counts.
* ``intra_node_MB`` / ``inter_node_MB``: bytes all ranks send over NVLink / the
  network in the step (ring and remap traffic, all layers, forward + backward);
  ``max_rank_inter_node_MB``: the busiest rank's network bytes in one micro-step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..planner.plan import StepPlan
from ..planner.predict import attention_time
from ..planner.ring_parts import parted
from .batch_schedule import StepSchedule

__all__ = [
    "PlanMetrics",
    "StepMetrics",
    "plan_metrics",
    "step_metrics",
    "scalars",
    "format_step",
    "MetricsWriter",
    "StepMetricsRecorder",
]


@dataclass(frozen=True, kw_only=True)
class PlanMetrics:
    """One micro-step's plan, summarised."""

    sequences: int
    tokens: int
    local: int
    intra_node: int
    inter_node: int
    ulysses: int
    hybrid: int
    remapped: bool
    routed_hops: int
    windowed: int = 0
    packed: bool = False
    in_parts: int = 0
    """Split sequences in head-parallel rings run in parts (planner/ring_parts.py)."""
    predicted_ms: float
    attention_max_ms: float
    attention_mean_ms: float
    tokens_max: int
    tokens_mean: float
    intra_node_MB: float
    inter_node_MB: float
    max_rank_inter_node_MB: float


def plan_metrics(plan: StepPlan) -> PlanMetrics:
    """Summarise one plan; it must carry the planner's prediction (``plan.predicted``)."""
    pred = plan.predicted
    if pred is None or not pred.attention_ms:
        raise ValueError("plan_metrics needs a plan made by the planner (plan.predicted with the per-rank breakdown)")
    att = attention_time(pred)
    tokens = [plan.tokens(r, "linear") for r in range(plan.world_size)]
    kinds = {"local": 0, "intra_node": 0, "inter_node": 0}
    ulysses = hybrid = 0
    families = parted(plan.rings)  # rings run in parts (planner/ring_parts.py)
    for s in plan.sequences:
        kinds[s.placement] += 1
        if s.a2a > 1:
            ulysses += s.a2a == len(s.ranks)
            hybrid += s.a2a < len(s.ranks)
    return PlanMetrics(
        sequences=len(plan.sequences),
        tokens=plan.total_tokens,
        local=kinds["local"],
        intra_node=kinds["intra_node"],
        inter_node=kinds["inter_node"],
        ulysses=ulysses,
        hybrid=hybrid,
        remapped=plan.linear_layout != plan.attention_layout,
        routed_hops=len(plan.routing),
        windowed=sum(len(x.seqs) for x in plan.remap_slots),
        packed=plan.origin == "packed",
        in_parts=sum(len(r.seqs) for r in plan.rings if (r.ranks, r.a2a) in families),
        predicted_ms=pred.step_ms,
        attention_max_ms=max(att),
        attention_mean_ms=sum(att) / len(att),
        tokens_max=max(tokens),
        tokens_mean=sum(tokens) / len(tokens),
        intra_node_MB=sum(pred.intra_MB),
        inter_node_MB=sum(pred.inter_MB),
        max_rank_inter_node_MB=max(pred.inter_MB) if pred.inter_MB else 0.0,
    )


@dataclass(frozen=True, kw_only=True)
class StepMetrics:
    """One training step (``micro_steps`` plans). ``iteration`` counts from 1, as Megatron's log does."""

    iteration: int
    micro_steps: int
    sequences: int
    tokens: int
    local: int
    intra_node: int
    inter_node: int
    ulysses: int
    hybrid: int
    remapped: int
    routed_hops: int
    windowed: int = 0
    packed: int = 0
    in_parts: int = 0
    predicted_ms: float
    measured_ms: float | None
    attention_imbalance: float
    token_imbalance: float
    intra_node_MB: float
    inter_node_MB: float
    max_rank_inter_node_MB: float

    @property
    def measured_over_predicted(self) -> float | None:
        if self.measured_ms is None or self.predicted_ms <= 0:
            return None
        return self.measured_ms / self.predicted_ms


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 1.0


def step_metrics(iteration: int, plans: Sequence[PlanMetrics], measured_ms: float | None = None) -> StepMetrics:
    """Aggregate a step's micro-step summaries (see the module docstring for each number)."""
    if not plans:
        raise ValueError(f"step {iteration}: no micro-step plans to aggregate")
    return StepMetrics(
        iteration=iteration,
        micro_steps=len(plans),
        sequences=sum(p.sequences for p in plans),
        tokens=sum(p.tokens for p in plans),
        local=sum(p.local for p in plans),
        intra_node=sum(p.intra_node for p in plans),
        inter_node=sum(p.inter_node for p in plans),
        ulysses=sum(p.ulysses for p in plans),
        hybrid=sum(p.hybrid for p in plans),
        remapped=sum(p.remapped for p in plans),
        routed_hops=sum(p.routed_hops for p in plans),
        windowed=sum(p.windowed for p in plans),
        packed=sum(p.packed for p in plans),
        in_parts=sum(p.in_parts for p in plans),
        predicted_ms=sum(p.predicted_ms for p in plans),
        measured_ms=measured_ms,
        attention_imbalance=_ratio(sum(p.attention_max_ms for p in plans), sum(p.attention_mean_ms for p in plans)),
        token_imbalance=_ratio(sum(p.tokens_max for p in plans), sum(p.tokens_mean for p in plans)),
        intra_node_MB=sum(p.intra_node_MB for p in plans),
        inter_node_MB=sum(p.inter_node_MB for p in plans),
        max_rank_inter_node_MB=max(p.max_rank_inter_node_MB for p in plans),
    )


def scalars(m: StepMetrics) -> dict[str, float]:
    """Scalars for tensorboard / wandb, named ``zeppelin/<name>``."""
    out: dict[str, float] = {
        "zeppelin/sequences": float(m.sequences),
        "zeppelin/tokens": float(m.tokens),
        "zeppelin/local_sequences": float(m.local),
        "zeppelin/intra_node_sequences": float(m.intra_node),
        "zeppelin/inter_node_sequences": float(m.inter_node),
        "zeppelin/ulysses_sequences": float(m.ulysses),
        "zeppelin/hybrid_sequences": float(m.hybrid),
        "zeppelin/remapped_micro_steps": float(m.remapped),
        "zeppelin/routed_hops": float(m.routed_hops),
        "zeppelin/remap_window_sequences": float(m.windowed),
        "zeppelin/packed_micro_steps": float(m.packed),
        "zeppelin/ring_part_sequences": float(m.in_parts),
        "zeppelin/predicted_ms": m.predicted_ms,
        "zeppelin/attention_imbalance": m.attention_imbalance,
        "zeppelin/token_imbalance": m.token_imbalance,
        "zeppelin/intra_node_MB": m.intra_node_MB,
        "zeppelin/inter_node_MB": m.inter_node_MB,
        "zeppelin/max_rank_inter_node_MB": m.max_rank_inter_node_MB,
    }
    if m.measured_ms is not None:
        out["zeppelin/measured_ms"] = m.measured_ms
        ratio = m.measured_over_predicted
        if ratio is not None:
            out["zeppelin/measured_over_predicted"] = ratio
    return out


def format_step(m: StepMetrics) -> str:
    """One log line, e.g. ``zeppelin step 12 | seqs 246 (230 local / 12 intra / 4 inter; split: 9 ring,
    5 all-to-all, 2 hybrid[, 4 in ring parts]), tokens ..., remap 1 of 1 micro-steps (4 seqs in remap windows),
    packed 0 of 1, routed hops 3 |
    ...``."""
    measured = "n/a" if m.measured_ms is None else f"{m.measured_ms:.1f} ms"
    ratio = m.measured_over_predicted
    rings = m.intra_node + m.inter_node - m.ulysses - m.hybrid
    return (
        f"zeppelin step {m.iteration} | seqs {m.sequences} ({m.local} local / {m.intra_node} intra / "
        f"{m.inter_node} inter; split: {rings} ring, {m.ulysses} all-to-all, {m.hybrid} hybrid"
        + (f", {m.in_parts} in ring parts" if m.in_parts else "") + "), "
        f"tokens {m.tokens}, micro-steps {m.micro_steps}, remap {m.remapped} of {m.micro_steps} "
        f"({m.windowed} seqs in remap windows), packed {m.packed} of {m.micro_steps}, "
        f"routed hops {m.routed_hops} | "
        f"predicted {m.predicted_ms:.1f} ms (cost model), measured {measured}"
        + (f" ({ratio:.2f}x)" if ratio is not None else "")
        + f" | imbalance attn {m.attention_imbalance:.3f} tokens {m.token_imbalance:.3f} | "
        f"MB intra {m.intra_node_MB:.1f} inter {m.inter_node_MB:.1f} (max rank {m.max_rank_inter_node_MB:.1f})"
    )


class MetricsWriter:
    """Writes step metrics: a line through ``log`` every ``log_interval`` steps, scalars to
    ``tensorboard`` (``add_scalar(name, value, step)``) and ``wandb`` (``log(dict, step)``)
    every ``scalar_interval`` steps. Any sink may be ``None``."""

    def __init__(
        self,
        *,
        log: Callable[[str], None] | None = None,
        tensorboard: Any = None,
        wandb: Any = None,
        log_interval: int = 1,
        scalar_interval: int = 1,
    ) -> None:
        for name, v in (("log_interval", log_interval), ("scalar_interval", scalar_interval)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.log, self.tensorboard, self.wandb = log, tensorboard, wandb
        self.log_interval, self.scalar_interval = log_interval, scalar_interval

    def write(self, m: StepMetrics) -> None:
        if self.log is not None and m.iteration % self.log_interval == 0:
            self.log(format_step(m))
        if m.iteration % self.scalar_interval:
            return
        values = scalars(m)
        if self.tensorboard is not None:
            for name, value in values.items():
                self.tensorboard.add_scalar(name, value, m.iteration)
        if self.wandb is not None:
            self.wandb.log(values, m.iteration)


class StepMetricsRecorder:
    """Groups micro-steps into training steps and times them.

    ``record(micro_step, plan)`` is called for each training micro-step in
    order (``micro_step`` = global micro-step index); ``schedule`` says which
    step holds it (:meth:`~.batch_schedule.StepSchedule.locate`: step ``i`` holds
    micro-steps ``i*M .. i*M + M-1`` for ``M`` micro-steps per step, other
    counts under Megatron's ``--rampup-batch-size`` or ``--step-batch-size-schedule``;
    a resumed run: :meth:`follow` its resumed schedule). When the
    first micro-step of step ``i+1`` arrives, step ``i`` is complete: its
    metrics, timed from its first micro-step to now, go to ``writer`` and are
    returned. ``sync`` (e.g. ``torch.cuda.synchronize``) runs before reading the
    clock so GPU work is counted. The last step of a run is not reported (no
    next step starts). A repeated or older micro-step index is ignored.
    """

    def __init__(
        self,
        *,
        schedule: StepSchedule,
        writer: MetricsWriter | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sync: Callable[[], None] | None = None,
    ) -> None:
        self.writer, self.clock, self.sync = writer, clock, sync
        self.follow(schedule)

    def follow(self, schedule: StepSchedule, *, micro_step_offset: int = 0) -> None:
        """Group the micro-steps from now on by ``schedule`` (a resumed run's: ``StepSchedule.resumed``);
        ``micro_step_offset`` is added to every recorded index (the run's micro-steps before its data's first, under
        Megatron's phase transitions)."""
        if not isinstance(schedule, StepSchedule):
            raise TypeError(f"schedule must be a StepSchedule, got {type(schedule).__name__}")
        if isinstance(micro_step_offset, bool) or not isinstance(micro_step_offset, int) or micro_step_offset < 0:
            raise ValueError(f"micro_step_offset must be a non-negative integer, got {micro_step_offset!r}")
        self.schedule, self._offset = schedule, micro_step_offset
        self._step: int | None = None
        self._count = 0
        self._start: float | None = None
        self._last = -1
        self._plans: list[PlanMetrics] = []

    def record(self, micro_step: int, plan: StepPlan) -> StepMetrics | None:
        micro_step += self._offset
        if micro_step <= self._last:
            return None
        self._last = micro_step
        step, index, count = self.schedule.locate(micro_step)
        done: StepMetrics | None = None
        if step != self._step:
            if self.sync is not None:
                self.sync()
            now = self.clock()
            complete = (self._step is not None and step == self._step + 1 and self._start is not None
                        and len(self._plans) == self._count)
            if complete:
                assert self._step is not None and self._start is not None
                done = step_metrics(self._step + 1, self._plans, (now - self._start) * 1e3)
                if self.writer is not None:
                    self.writer.write(done)
            self._step, self._plans, self._count = step, [], count
            self._start = now if index == 0 else None
        self._plans.append(plan_metrics(plan))
        return done
