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
from ..planner.plan import PlanError
from .bounds import lower_bound_ms
from .charges import charges_for
from .simulator import simulate
from .strategies import BOUND_NAMES, PEER_NAMES, STRATEGY_NAMES, plan_with

__all__ = ["StrategySummary", "run_strategies", "Progress", "parse_strategies", "Verdict", "verdict"]


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
    refused: str = ""
    """Why the strategy cannot run the steps (a peer's planner refused one: ``"step 3: ..."``); then no times."""

    @property
    def mean_step_ms(self) -> float:
        if self.refused:
            raise ValueError(f"{self.name} has no step time: it refused {self.refused}")
        return sum(self.step_ms) / len(self.step_ms)

    @staticmethod
    def _mean(xs: Sequence[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    def to_dict(self) -> dict[str, Any]:
        if self.refused:
            return {"name": self.name, "refused": self.refused}
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
    """Comma-separated names, in order, each once; ``all`` stands for every strategy plus ``lower-bound``, ``peers``
    for ``zeppelin``, every peer (:data:`~.strategies.PEER_NAMES`) and ``lower-bound``. Unknown names: ValueError.

    Example: ``"peers,zeppelin-rerank"`` -> ``["zeppelin", "te-cp", ..., "distca", "lower-bound", "zeppelin-rerank"]``.
    """
    groups = {"all": list(STRATEGY_NAMES) + list(BOUND_NAMES), "peers": ["zeppelin", *PEER_NAMES, *BOUND_NAMES]}
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = set(STRATEGY_NAMES) | set(BOUND_NAMES) | set(groups)
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"unknown strategies {bad or text!r}; known: {', '.join(STRATEGY_NAMES + BOUND_NAMES)}, "
                         f"or all, peers")
    return list(dict.fromkeys(x for n in names for x in groups.get(n, [n])))


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """A Zeppelin strategy against the fastest peer simulated beside it (:func:`verdict`); times in ms per step."""

    strategy: str
    step_ms: float
    best_peer: str
    best_peer_ms: float
    worst_step_ratio: float
    """The highest per-step ``strategy / best_peer`` ratio (the steps are the same batches)."""
    peers: tuple[str, ...]
    """The peers simulated (of :data:`~.strategies.PEER_NAMES`), in that order."""
    refused: tuple[str, ...] = ()
    """Peers simulated that refused a step (not among ``peers``): they cannot run these batches."""

    @property
    def ratio(self) -> float:
        """Mean step over the best peer's mean step (< 1: faster)."""
        return self.step_ms / self.best_peer_ms

    def line(self) -> str:
        """One line saying it, e.g. ``zeppelin / best peer: 0.874 (2080 ms a step against flexsp's 2380: 1.14x
        faster; worst step 0.910), best of all 8 peers``."""
        r = self.ratio
        digits = 2 if abs(r - 1) >= 0.005 else 3  # 1.003: "1.003x slower", not "1.00x slower"
        how = ("as fast" if f"{r:.3f}" == "1.000" else f"{1 / r:.{digits}f}x faster" if r < 1
               else f"{r:.{digits}f}x slower")
        n, total = len(self.peers), len(PEER_NAMES)
        which = (f"all {total} peers" if n == total
                 else f"the {n} of the {total} peers that run these steps ({', '.join(self.refused)} cannot)"
                 if n + len(self.refused) == total
                 else f"{n} of the {total} peers (--strategies peers runs all {total})")
        return (f"{self.strategy} / best peer: {r:.3f} ({self.step_ms:.0f} ms a step against "
                f"{self.best_peer}'s {self.best_peer_ms:.0f}: {how}; worst step {self.worst_step_ratio:.3f}), best of "
                f"{which}")

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "step_ms": self.step_ms, "best_peer": self.best_peer,
                "best_peer_ms": self.best_peer_ms, "ratio": self.ratio, "worst_step_ratio": self.worst_step_ratio,
                "peers": list(self.peers), "refused": list(self.refused)}


def _is_zeppelin(name: str) -> bool:
    """``zeppelin`` or one of its variants (``zeppelin-*``), not a peer."""
    return name == "zeppelin" or name.startswith("zeppelin-")


def verdict(results: dict[str, StrategySummary]) -> Verdict | None:
    """The first Zeppelin strategy of ``results`` (``zeppelin`` or a ``zeppelin-*`` variant, in ``results``' order)
    against the peer with the lowest mean step among those in ``results`` that ran every step (ties: the first of
    :data:`~.strategies.PEER_NAMES`); ``None`` without a Zeppelin strategy that ran every step or such a peer.

    Example: ``zeppelin`` at steps (100, 120) ms, ``flexsp`` at (110, 110), ``te-cp`` at (150, 150): best peer
    ``flexsp``, ratio 220 / 220 = 1.0, worst step 120 / 110 = 1.091."""
    ours = next((n for n in results if _is_zeppelin(n)), None)
    peers = tuple(n for n in PEER_NAMES if n in results and not results[n].refused)
    refused = tuple(n for n in PEER_NAMES if n in results and results[n].refused)
    if ours is None or results[ours].refused or not peers:
        return None
    best = min(peers, key=lambda n: results[n].mean_step_ms)
    z, p = results[ours], results[best]
    return Verdict(strategy=ours, step_ms=z.mean_step_ms, best_peer=best, best_peer_ms=p.mean_step_ms,
                   worst_step_ratio=max(a / b for a, b in zip(z.step_ms, p.step_ms)), peers=peers, refused=refused)


def run_strategies(
    batches: Sequence[Sequence[int]],
    cluster: Cluster,
    cost: CostModel,
    names: Sequence[str],
    *,
    options: dict[str, dict[str, Any]] | None = None,
    engine: str = "runtime",
    on_step: Callable[[str], None] | None = None,
    jobs: int = 1,
    peer_refusals: bool = False,
) -> dict[str, StrategySummary]:
    """Simulate every strategy on every batch. ``options[name]`` go to ``plan_with``;
    ``engine`` to :func:`~.simulator.simulate` (``runtime`` or ``fill``). ``on_step(name)`` after each batch of a
    strategy. ``jobs > 1``: the strategies in that many processes (each with a copy of ``cost``; the same results,
    in ``names``' order; ``on_step`` then runs once per batch when a strategy's last batch is done). A planner's
    :class:`~zeppelin_megatron.planner.plan.PlanError` propagates, unless ``peer_refusals`` and the strategy is not
    Zeppelin's: then its summary records the refusal (:attr:`StrategySummary.refused`, its first refused step and the
    reason) and its later steps are not planned (e.g. hybrid-dp, whole sequences per GPU, cannot pack a step that
    leaves few tokens per GPU free; Zeppelin places every step that leaves 5). Raises ``ValueError`` for
    ``jobs < 1``."""
    if jobs < 1:
        raise ValueError(f"jobs is {jobs}, expected at least 1")
    options = options or {}
    if jobs > 1 and len(names) > 1:
        return _in_processes(batches, cluster, cost, names, options, engine, on_step, jobs, peer_refusals)
    out: dict[str, StrategySummary] = {}
    for name in names:
        steps, exposed, comp, nic, notes = [], [], [], [], []
        plan_s = sim_s = 0.0
        refused = ""
        for k, lengths in enumerate(batches):
            if name in BOUND_NAMES:
                steps.append(lower_bound_ms(lengths, cost))
                exposed.append(0.0)
            elif not refused:  # after a refused step the later ones are not planned
                t0 = time.perf_counter()
                try:
                    sp = plan_with(name, lengths, cluster, cost, **options.get(name, {}))
                except PlanError as exc:
                    if not peer_refusals or _is_zeppelin(name):
                        raise
                    refused = f"step {k}: {exc}"
                else:
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
        if refused:
            out[name] = StrategySummary(name=name, step_ms=(), refused=refused, plan_s=plan_s, sim_s=sim_s)
            continue
        out[name] = StrategySummary(name=name, step_ms=tuple(steps), exposed_comm_ms=tuple(exposed),
                                    max_compute_ms=tuple(comp), nic_util_mean=tuple(nic), notes=tuple(notes),
                                    plan_s=plan_s, sim_s=sim_s)
    return out


def _in_processes(batches: Sequence[Sequence[int]], cluster: Cluster, cost: CostModel, names: Sequence[str],
                  options: dict[str, dict[str, Any]], engine: str, on_step: Callable[[str], None] | None,
                  jobs: int, peer_refusals: bool) -> dict[str, StrategySummary]:
    """:func:`run_strategies` of each strategy alone, in up to ``jobs`` processes (``spawn``: no forked state)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    context = multiprocessing.get_context("spawn")
    done: dict[str, StrategySummary] = {}
    with ProcessPoolExecutor(max_workers=min(jobs, len(names)), mp_context=context) as pool:
        futures = {pool.submit(run_strategies, batches, cluster, cost, [name], options=options, engine=engine,
                               peer_refusals=peer_refusals): name for name in names}
        try:
            for future in as_completed(futures):
                name = futures[future]
                done[name] = future.result()[name]
                if on_step is not None:
                    for _ in batches:
                        on_step(name)
        except BaseException:
            for future in futures:  # a strategy failed (or the user interrupted): the ones not started do not run
                future.cancel()
            raise
    return {name: done[name] for name in names}
