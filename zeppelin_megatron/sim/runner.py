"""Run strategies over sampled steps and summarise: mean step, speedup, ratio to the lower bound.

``run_strategies`` plans every step with every strategy (``plan_with``),
simulates it (:func:`~.simulator.simulate`) and averages. ``lower-bound`` is
computed (:func:`~.bounds.lower_bound_ms`). Deterministic for given inputs.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TextIO

from ..planner.cluster import Cluster
from ..planner.cost_model import CostModel
from .bounds import lower_bound_ms
from .charges import charges_for
from .simulator import simulate
from .strategies import BOUND_NAMES, STRATEGY_NAMES, plan_with

__all__ = ["StrategySummary", "run_strategies", "Progress", "parse_strategies"]


@dataclass(frozen=True, kw_only=True)
class StrategySummary:
    """Per-strategy results over the steps (times in ms per step, simulated)."""

    name: str
    step_ms: tuple[float, ...]
    exposed_comm_ms: tuple[float, ...] = ()
    max_compute_ms: tuple[float, ...] = ()
    nic_util_mean: tuple[float, ...] = ()
    notes: tuple[str, ...] = ()
    plan_s: float = 0.0
    sim_s: float = 0.0

    @property
    def mean_step_ms(self) -> float:
        return sum(self.step_ms) / len(self.step_ms)

    @staticmethod
    def _mean(xs: Sequence[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mean_step_ms": self.mean_step_ms, "step_ms": list(self.step_ms),
                "mean_exposed_comm_ms": self._mean(self.exposed_comm_ms),
                "mean_max_compute_ms": self._mean(self.max_compute_ms),
                "mean_nic_util": self._mean(self.nic_util_mean), "notes": list(self.notes),
                "plan_seconds": self.plan_s, "sim_seconds": self.sim_s}


class Progress:
    """A tiny progress bar on ``stream`` (stderr); silent when it is not a terminal."""

    def __init__(self, total: int, label: str = "", stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.total, self.label, self.done = total, label, 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.t0 = time.perf_counter()

    def step(self, what: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / max(1, self.total))
        el = time.perf_counter() - self.t0
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                          f"{el:5.1f}s {what[:30]:<30}")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def parse_strategies(text: str) -> list[str]:
    """Comma-separated names; ``all`` = every strategy plus ``lower-bound``. Unknown names: ValueError."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(STRATEGY_NAMES) + list(BOUND_NAMES)
    known = set(STRATEGY_NAMES) | set(BOUND_NAMES)
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"unknown strategies {bad or text!r}; known: {', '.join(STRATEGY_NAMES + BOUND_NAMES)}")
    return names


def run_strategies(
    batches: Sequence[Sequence[int]],
    cluster: Cluster,
    cost: CostModel,
    names: Sequence[str],
    *,
    options: dict[str, dict[str, Any]] | None = None,
    engine: str = "runtime",
    on_step: Callable[[str], None] | None = None,
) -> dict[str, StrategySummary]:
    """Simulate every strategy on every batch. ``options[name]`` go to ``plan_with``;
    ``engine`` to :func:`~.simulator.simulate` (``runtime`` or ``fill``)."""
    out: dict[str, StrategySummary] = {}
    options = options or {}
    for name in names:
        steps, exposed, comp, nic, notes = [], [], [], [], []
        plan_s = sim_s = 0.0
        for lengths in batches:
            if name in BOUND_NAMES:
                steps.append(lower_bound_ms(lengths, cost))
                exposed.append(0.0)
            else:
                t0 = time.perf_counter()
                sp = plan_with(name, lengths, cluster, cost, **options.get(name, {}))
                t1 = time.perf_counter()
                res = simulate(sp.plan, cost, attention_comm=sp.attention_comm, engine=engine, keep_events=False,
                               charges=charges_for(name))
                plan_s += t1 - t0
                sim_s += time.perf_counter() - t1
                steps.append(res.step_ms)
                exposed.append(res.exposed_comm_ms)
                comp.append(max(res.compute_ms))
                nic.append(res.nic_util_mean)
                notes.append(sp.note)
            if on_step is not None:
                on_step(name)
        out[name] = StrategySummary(name=name, step_ms=tuple(steps), exposed_comm_ms=tuple(exposed),
                                    max_compute_ms=tuple(comp), nic_util_mean=tuple(nic), notes=tuple(notes),
                                    plan_s=plan_s, sim_s=sim_s)
    return out
