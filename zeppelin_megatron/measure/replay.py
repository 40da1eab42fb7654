"""Replay a plan's per-rank compute on the local device and compare with the cost model.

For each rank, one after another on one device: build its kernel calls
(:func:`.workload.rank_work`), time one layer's attention (every call's
forward, then every call's backward, :class:`.attention.AttentionWork`) and
its linear GEMMs for its linear-layout tokens (:class:`.linear.LinearWork`).
Each is the median of ``repeats`` timings after ``warmup`` untimed runs.
Communication (ring hops, routing, remap all-to-alls) is NOT replayed: the
measured times are compute only, to be set against the cost model's compute
predictions (``predicted.attention_ms`` / ``linear_ms``, per step, divided
by the model's layer count to give per-layer values).
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..planner.model import ModelShape
from ..planner.plan import StepPlan
from ..runtime.kernels import AttentionKernel, VarlenBatch
from .attention import AttentionWork, KernelCall, call_pairs
from .linear import LinearWork
from .timing import time_ms
from .workload import RankWork, rank_work

__all__ = ["RankReplay", "ReplayResult", "replay_plan", "plan_works", "IdealResult", "measure_ideal", "COMM_NOTE"]

COMM_NOTE = ("communication (ring hops, routing, remap all-to-alls) is not replayed: measured times are "
             "kernel/GEMM compute only, ranks run one after another on one device")


@dataclass(frozen=True, kw_only=True)
class RankReplay:
    """One rank: its work and its measured and predicted per-layer milliseconds."""

    rank: int
    calls: int
    attention_tokens: int
    call_q_tokens: int      # query rows over all its calls (ring steps count the rank's rows again)
    head_pairs: int         # (query, key, query head) triples its calls compute (the attention work)
    linear_tokens: int
    attention_ms: float
    linear_ms: float
    predicted_attention_ms: float | None
    predicted_linear_ms: float | None

    @property
    def total_ms(self) -> float:
        return self.attention_ms + self.linear_ms

    @property
    def predicted_total_ms(self) -> float | None:
        if self.predicted_attention_ms is None or self.predicted_linear_ms is None:
            return None
        return self.predicted_attention_ms + self.predicted_linear_ms

    def error(self, what: str) -> float | None:
        """``measured / predicted - 1`` for ``attention``, ``linear`` or ``total``; None without a prediction."""
        measured = getattr(self, f"{what}_ms")
        pred = getattr(self, f"predicted_{what}_ms")
        if pred is None or pred <= 0:
            return None
        return measured / pred - 1.0


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    strategy: str
    attention_comm: str
    note: str
    ranks: tuple[RankReplay, ...]
    layers: int
    backend: str
    device: str
    dtype: str
    timer: str
    warmup: int
    repeats: int

    def _stats(self, key: Callable[[RankReplay], float]) -> dict[str, float]:
        values = [key(r) for r in self.ranks]
        total = sum(values)
        mean = total / len(values)
        slow = max(range(len(values)), key=lambda i: (values[i], -i))
        return {
            "slowest_rank": self.ranks[slow].rank, "max_ms": values[slow], "mean_ms": mean,
            "sum_ms": total,
            # perfect balance: the measured total spread evenly, total / ranks (= the mean)
            "perfect_balance_ms": mean,
            "max_over_mean": values[slow] / mean if mean > 0 else 1.0,
        }

    def summary(self) -> dict[str, Any]:
        """Measured balance (attention, linear, total) and prediction errors."""
        out: dict[str, Any] = {
            "attention": self._stats(lambda r: r.attention_ms),
            "linear": self._stats(lambda r: r.linear_ms),
            "total": self._stats(lambda r: r.total_ms),
        }
        for what in ("attention", "linear", "total"):
            errs = [e for e in (r.error(what) for r in self.ranks) if e is not None]
            out[what]["prediction_error_mean_abs"] = statistics.fmean(abs(e) for e in errs) if errs else None
            out[what]["prediction_error_max_abs"] = max((abs(e) for e in errs), default=None)
            preds = [getattr(r, f"predicted_{what}_ms") for r in self.ranks]
            out[what]["predicted_max_ms"] = max(preds) if all(p is not None for p in preds) else None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "attention_comm": self.attention_comm,
            "note": self.note,
            "measured": f"per layer, forward + backward, median of {self.repeats} after {self.warmup} warm-up "
                        f"({self.timer}), backend {self.backend}, {self.device}, {self.dtype}",
            "predicted": "cost model: plan.predicted attention_ms / linear_ms divided by the model's "
                         f"{self.layers} layers (per layer)",
            "communication": COMM_NOTE,
            "layers": self.layers,
            "summary": self.summary(),
            "ranks": [
                {**{k: v for k, v in vars(r).items()}, "total_ms": r.total_ms,
                 "predicted_total_ms": r.predicted_total_ms,
                 "error_attention": r.error("attention"), "error_linear": r.error("linear"),
                 "error_total": r.error("total")}
                for r in self.ranks
            ],
        }


def _heads(model: ModelShape, tp: int) -> tuple[int, int]:
    """(query heads, K/V heads) on one tensor-parallel rank."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel must be a positive integer, got {tp!r}")
    if model.q_heads % tp or model.kv_heads % tp:
        raise ValueError(f"q_heads = {model.q_heads} and kv_heads = {model.kv_heads} must be divisible by "
                         f"tensor_parallel = {tp}")
    return model.q_heads // tp, model.kv_heads // tp


def plan_works(
    plan: StepPlan, *, model: ModelShape, device: torch.device, tensor_parallel: int = 1,
    attention_comm: str = "ring", ranks: Sequence[int] | None = None,
) -> tuple[RankWork, ...]:
    """Every (or each of ``ranks``') rank's work; raises before anything is timed if one cannot be replayed."""
    hq, hkv = _heads(model, tensor_parallel)
    which = list(range(plan.world_size)) if ranks is None else list(ranks)
    if not which:
        raise ValueError("no ranks to replay")
    return tuple(rank_work(plan, r, q_heads=hq, kv_heads=hkv, device=device, attention_comm=attention_comm)
                 for r in which)


def replay_plan(
    plan: StepPlan,
    *,
    model: ModelShape,
    kernel: AttentionKernel,
    dtype: torch.dtype,
    device: torch.device,
    tensor_parallel: int = 1,
    warmup: int = 1,
    repeats: int = 3,
    strategy: str = "plan",
    attention_comm: str = "ring",
    note: str = "",
    ranks: Sequence[int] | None = None,
    works: Sequence[RankWork] | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> ReplayResult:
    """Time every rank's (or ``ranks``') attention and linear work of one layer; see the module docstring.

    ``works``: from :func:`plan_works` (same plan, model, device, comm), when already built.
    """
    say = progress or (lambda _msg: None)
    tp = tensor_parallel
    _heads(model, tp)
    pred = plan.predicted
    pred_att = pred.attention_ms if pred is not None and pred.attention_ms else None
    pred_lin = pred.linear_ms if pred is not None and pred.linear_ms else None
    for name, values in (("attention_ms", pred_att), ("linear_ms", pred_lin)):
        if values is not None and len(values) != plan.world_size:
            raise ValueError(f"plan.predicted.{name} has {len(values)} entries for {plan.world_size} ranks")
    if works is None:
        works = plan_works(plan, model=model, device=device, tensor_parallel=tp, attention_comm=attention_comm,
                           ranks=ranks)
    rows: list[RankReplay] = []
    timer = ""
    for work in works:
        r = work.rank
        att = AttentionWork(work.calls, head_dim=model.head_dim, kernel=kernel, dtype=dtype, device=device,
                            seed=seed + r)
        t_att = time_ms(att.run, device=device, warmup=warmup, repeats=repeats)
        del att
        lin = LinearWork(model, work.linear_tokens, dtype=dtype, device=device, tensor_parallel=tp, seed=seed + r)
        t_lin = time_ms(lin.run, device=device, warmup=warmup, repeats=repeats)
        del lin
        gc.collect()
        timer = t_att.method
        rows.append(RankReplay(
            rank=r, calls=len(work.calls), attention_tokens=work.attention_tokens,
            call_q_tokens=sum(c.q_tokens for c in work.calls),
            head_pairs=sum(call_pairs(c.batch) * c.q_heads for c in work.calls),
            linear_tokens=work.linear_tokens, attention_ms=t_att.median, linear_ms=t_lin.median,
            predicted_attention_ms=pred_att[r] / model.layers if pred_att is not None else None,
            predicted_linear_ms=pred_lin[r] / model.layers if pred_lin is not None else None,
        ))
        say(f"{strategy}: rank {r}: {len(work.calls)} calls, attention {t_att.median:.3f} ms, "
            f"linear {t_lin.median:.3f} ms")
    if not rows:
        raise ValueError("no ranks to replay")
    return ReplayResult(
        strategy=strategy, attention_comm=attention_comm, note=note, ranks=tuple(rows), layers=model.layers,
        backend=kernel.name, device=str(device), dtype=str(dtype).replace("torch.", ""), timer=timer,
        warmup=warmup, repeats=repeats)


@dataclass(frozen=True, kw_only=True)
class IdealResult:
    """MEASURED reference shared by all strategies: every sequence whole, work spread perfectly.

    ``attention_ms``: the kernel time of all sequences as whole causal
    sequences (calls of at most ``tokens_per_call`` tokens, longest first),
    divided by ``ranks``; ``linear_ms``: the GEMMs for ``ceil(T / ranks)``
    tokens (a perfectly token-balanced rank).
    """

    ranks: int
    calls: int
    tokens_per_call: int
    attention_ms: float
    linear_ms: float

    @property
    def total_ms(self) -> float:
        return self.attention_ms + self.linear_ms

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "total_ms": self.total_ms}


def measure_ideal(
    lengths: Sequence[int],
    ranks: int,
    *,
    model: ModelShape,
    kernel: AttentionKernel,
    dtype: torch.dtype,
    device: torch.device,
    tensor_parallel: int = 1,
    tokens_per_call: int = 131072,
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 0,
) -> IdealResult:
    """See :class:`IdealResult`. Sequences go, longest first, into the current call until it would exceed
    ``tokens_per_call`` (a longer sequence is a call of its own); e.g. cap 10, lengths [8, 5, 4, 1] ->
    calls [8], [5, 4, 1]."""
    hq, hkv = _heads(model, tensor_parallel)
    if not lengths or min(lengths) < 1:
        raise ValueError("measure_ideal needs at least one sequence, all of length >= 1")
    if ranks < 1 or tokens_per_call < 1:
        raise ValueError(f"need ranks >= 1 and tokens_per_call >= 1, got {ranks} and {tokens_per_call}")
    groups: list[list[int]] = []
    for s in sorted(lengths, reverse=True):
        if groups and sum(groups[-1]) + s <= tokens_per_call:
            groups[-1].append(s)
        else:
            groups.append([s])
    total = 0.0
    for i, g in enumerate(groups):
        batch = VarlenBatch(lens_q=tuple(g), lens_k=tuple(g), causal=True, device=device)
        call = KernelCall(queue=0, kind="local", step=0, batch=batch, q_heads=hq, kv_heads=hkv)
        work = AttentionWork([call], head_dim=model.head_dim, kernel=kernel, dtype=dtype, device=device,
                             seed=seed + i)
        total += time_ms(work.run, device=device, warmup=warmup, repeats=repeats).median
        del work
    tokens = -(-sum(lengths) // ranks)
    lin = LinearWork(model, tokens, dtype=dtype, device=device, tensor_parallel=tensor_parallel, seed=seed)
    t_lin = time_ms(lin.run, device=device, warmup=warmup, repeats=repeats).median
    return IdealResult(ranks=ranks, calls=len(groups), tokens_per_call=tokens_per_call,
                       attention_ms=total / ranks, linear_ms=t_lin)
