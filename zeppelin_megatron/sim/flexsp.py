"""FlexSP-style planner: per-sequence Ulysses group sizes from a MILP (scipy.optimize.milp).

FlexSP (Wang et al., ASPLOS'25) splits the GPUs into sequence-parallel groups
of varied power-of-two sizes each step and assigns every sequence to one
group; a group runs Ulysses attention (all-to-all to scatter heads, whole
sequences per head group, all-to-all back). It chooses groups and assignment
with a MILP over bucketed sequence lengths. Our formulation:

* classes ``d`` in ``{1, 2, 4, ...}`` up to ``max_group`` (default: the
  largest power of two dividing the query heads per TP rank, at most the GPU
  count); ``n_d`` integer groups of size ``d``;
* buckets ``b`` of lengths (one per distinct length when there are at most
  ``exact_buckets`` of them, else 4 per octave of length), ``c_b`` sequences,
  ``y_bd`` integer sequences of bucket ``b`` in class ``d``;
* ``t_bd``: estimated time of one sequence on a ``d``-group: attention
  ``causal_ms(s) / d`` + linear ``linear_ms(s / d)`` + two all-to-alls of
  ``s/d (2 q + kv)`` bytes per GPU (NVLink inside a node, the NIC for peers on
  other nodes);
* for a makespan ``T``: ``sum_b y_bd t_bd <= T n_d`` (each class's work fits
  its groups), ``sum_b y_bd len_b <= d cap n_d`` (memory), ``sum_d y_bd = c_b``,
  ``y_bd = 0`` where one sequence alone exceeds ``T`` or ``d cap`` tokens, or is
  shorter than ``2 d`` tokens; minimise ``sum_d d n_d`` (GPUs used).

The smallest ``T`` whose optimum uses at most ``P`` GPUs is found by
bisection (relative tolerance ``1e-3``); every MILP is solved to optimality
(HiGHS through ``scipy.optimize.milp``; a non-optimal, non-infeasible status
raises). The groups are then laid out on consecutive aligned ranks (largest
first; unused GPUs become extra single-GPU groups) and each class's sequences
are packed onto its groups, longest estimated time first, to the least loaded
group with token room (when a class is full, because the MILP's memory rows use
bucket means, the least loaded group of any class with room). A group of ``d > 1`` holds its sequences as zigzag
token ranges (Ulysses balances heads, so any equal split is fine); a sequence
shorter than ``2 d`` tokens in such a group is kept whole on its least loaded
rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from ..planner.cluster import Cluster
from ..planner.cost_model import CostModel
from ..planner.plan import PlanError, StepPlan
from .planbuild import build_plan

__all__ = ["FlexSPSolution", "ulysses_seq_ms", "solve_groups", "flexsp_plan", "bucketize"]


@dataclass(frozen=True, kw_only=True)
class FlexSPSolution:
    """MILP outcome: group counts per class, bucket-to-class counts, makespan bound, solves."""

    classes: tuple[int, ...]
    groups: tuple[int, ...]                     # n_d per class
    counts: tuple[tuple[int, ...], ...]         # y[b][d]
    makespan_ms: float
    gpus_used: int
    solves: int
    statuses: tuple[int, ...]                   # scipy status of every solve (0 optimal, 2 infeasible)


def ulysses_seq_ms(cost: CostModel, s: int, d: int) -> float:
    """Estimated per-layer time of one ``s``-token sequence on a ``d``-GPU Ulysses group."""
    cl = cost.cluster
    share = -(-s // d)
    t = cost.causal_ms(s) / d + cost.linear_ms(share)
    if d > 1:
        per_phase = share * (2 * cost.q_bytes_per_token + cost.kv_bytes_per_token)
        g = min(d, cl.gpus_per_node)
        intra, inter = (g - 1) / d, (d - g) / d
        nic_share = cl.gpus_sharing_nic(0)
        phase = max(cost.nvlink_ms(per_phase * intra), cost.nic_ms(per_phase * inter * nic_share) if inter else 0.0)
        t += 2 * phase
    return t


def bucketize(lengths: Sequence[int], exact_buckets: int = 24) -> list[list[int]]:
    """Sequence indices grouped by length: exact when few distinct lengths, else 4 buckets per octave.

    Example: ``[100, 100, 5000]`` -> ``[[0, 1], [2]]`` (two distinct lengths).
    """
    distinct = sorted(set(lengths))
    if len(distinct) <= exact_buckets:
        key = {s: k for k, s in enumerate(distinct)}
        out: list[list[int]] = [[] for _ in distinct]
        for i, s in enumerate(lengths):
            out[key[s]].append(i)
        return out
    by: dict[int, list[int]] = {}
    for i, s in enumerate(lengths):
        by.setdefault(int(math.floor(4 * math.log2(s))), []).append(i)
    return [by[k] for k in sorted(by)]


def default_max_group(cost: CostModel) -> int:
    heads = cost.heads
    d = 1
    while heads % (2 * d) == 0 and 2 * d <= cost.cluster.world_size:
        d *= 2
    return d


@dataclass
class _Model:
    classes: list[int]
    buckets: list[list[int]]
    B: int
    D: int
    c: np.ndarray
    t: np.ndarray
    tmax: np.ndarray
    allowed: np.ndarray
    world: int
    solve: object
    statuses: list[int]


def milp_model(lengths: Sequence[int], cost: CostModel, *, max_group: int | None = None,
               exact_buckets: int = 24) -> _Model:
    """The bucketed MILP; ``model.solve(T)`` -> ``None`` (infeasible) or ``(gpus used, x)`` at optimum."""
    cl = cost.cluster
    world, cap = cl.world_size, cl.tokens_per_gpu
    dmax = max_group if max_group is not None else default_max_group(cost)
    if dmax < 1 or dmax & (dmax - 1) or dmax > world:
        raise PlanError(f"flexsp: max_group = {dmax} must be a power of two in [1, {world}]")
    classes = [1 << k for k in range(dmax.bit_length())]
    buckets = bucketize(lengths, exact_buckets)
    B, D = len(buckets), len(classes)
    c = np.array([len(b) for b in buckets], dtype=float)
    lmax = [max(lengths[i] for i in b) for b in buckets]
    lmin = [min(lengths[i] for i in b) for b in buckets]
    lmean = [sum(lengths[i] for i in b) / len(b) for b in buckets]
    t = np.array([[sum(ulysses_seq_ms(cost, lengths[i], d) for i in b) / len(b) for d in classes] for b in buckets])
    tmax = np.array([[max(ulysses_seq_ms(cost, lengths[i], d) for i in b) for d in classes] for b in buckets])
    allowed = np.array([[lmax[b] <= d * cap and (d == 1 or lmin[b] >= 2 * d) for d in classes] for b in range(B)])
    if not allowed.any(axis=1).all():
        b = int(np.where(~allowed.any(axis=1))[0][0])
        raise PlanError(f"flexsp: sequences of {lmax[b]} tokens fit no group of at most {dmax} GPUs "
                        f"x {cap} tokens")
    nv = D + B * D  # x = [n_d..., y_00, y_01, ..., y_{B-1,D-1}]

    def y(b: int, d: int) -> int:
        return D + b * D + d

    statuses: list[int] = []

    def solve(T: float):
        rows, lo, hi = [], [], []
        for b in range(B):  # each bucket fully assigned
            row = np.zeros(nv)
            for d in range(D):
                row[y(b, d)] = 1.0
            rows.append(row)
            lo.append(c[b])
            hi.append(c[b])
        for d in range(D):  # time and memory per class
            row = np.zeros(nv)
            row[d] = -T
            mem = np.zeros(nv)
            mem[d] = -classes[d] * cap
            for b in range(B):
                row[y(b, d)] = t[b, d]
                mem[y(b, d)] = lmean[b]
            rows += [row, mem]
            lo += [-np.inf, -np.inf]
            hi += [0.0, 0.0]
        ub = np.full(nv, np.inf)
        for d in range(D):
            ub[d] = world // classes[d]
            for b in range(B):
                ok = allowed[b, d] and tmax[b, d] <= T * (1 + 1e-12)
                ub[y(b, d)] = c[b] if ok else 0.0
        obj = np.zeros(nv)
        obj[:D] = classes
        res = milp(obj, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=np.ones(nv),
                   bounds=Bounds(np.zeros(nv), ub))
        statuses.append(int(res.status))
        if res.status == 2:
            return None
        if res.status != 0:
            raise PlanError(f"flexsp: MILP at T = {T:.3f} ms ended with status {res.status} ({res.message})")
        x = np.round(res.x).astype(int)
        return int(round(res.fun)), x

    return _Model(classes, buckets, B, D, c, t, tmax, allowed, world, solve, statuses)


def solve_groups(lengths: Sequence[int], cost: CostModel, *, max_group: int | None = None,
                 exact_buckets: int = 24, rel_tol: float = 1e-3) -> tuple[FlexSPSolution, list[list[int]]]:
    """Smallest makespan ``T`` (bisection) whose optimal MILP fits on the cluster; see module docstring."""
    m = milp_model(lengths, cost, max_group=max_group, exact_buckets=exact_buckets)
    classes, buckets, B, D, c, t, tmax, allowed, world, solve, statuses = (
        m.classes, m.buckets, m.B, m.D, m.c, m.t, m.tmax, m.allowed, m.world, m.solve, m.statuses)

    def y(b: int, d: int) -> int:
        return D + b * D + d

    lo_T = max(float(tmax[b][allowed[b]].min()) for b in range(B))
    lo_T = max(lo_T, float(sum(c[b] * min(classes[d] * t[b, d] for d in range(D) if allowed[b, d])
                                for b in range(B))) / world)
    hi_T = lo_T
    best = None
    for _ in range(60):
        got = solve(hi_T)
        if got is not None and got[0] <= world:
            best = (hi_T, got)
            break
        lo_T, hi_T = hi_T, hi_T * 2
    if best is None:
        raise PlanError(f"flexsp: no feasible grouping found up to T = {hi_T:.1f} ms")
    while best[0] - lo_T > rel_tol * best[0]:
        mid = (lo_T + best[0]) / 2
        got = solve(mid)
        if got is not None and got[0] <= world:
            best = (mid, got)
        else:
            lo_T = mid
    T, (used, x) = best
    sol = FlexSPSolution(classes=tuple(classes), groups=tuple(int(v) for v in x[:D]),
                         counts=tuple(tuple(int(x[y(b, d)]) for d in range(D)) for b in range(B)),
                         makespan_ms=T, gpus_used=used, solves=len(statuses), statuses=tuple(statuses))
    return sol, buckets


def flexsp_groups(lengths: Sequence[int], cost: CostModel, **kw: int) -> tuple[list[tuple[int, ...]], FlexSPSolution]:
    """Ranks of each sequence (see module docstring) and the MILP solution."""
    cl = cost.cluster
    world, cap = cl.world_size, cl.tokens_per_gpu
    sol, buckets = solve_groups(lengths, cost, **kw)
    # Lay groups out: largest class first on consecutive (hence aligned) ranks.
    blocks: dict[int, list[tuple[int, ...]]] = {d: [] for d in sol.classes}
    nxt = 0
    for d, n in sorted(zip(sol.classes, sol.groups), reverse=True):
        for _ in range(n):
            blocks[d].append(tuple(range(nxt, nxt + d)))
            nxt += d
    blocks[1] += [(r,) for r in range(nxt, world)]
    # Sequences of each bucket: the longest go to the largest classes.
    members: dict[int, list[int]] = {d: [] for d in sol.classes}
    for b, idx in enumerate(buckets):
        order = sorted(idx, key=lambda i: (-lengths[i], i))
        k = 0
        for di in range(len(sol.classes) - 1, -1, -1):
            cnt = sol.counts[b][di]
            members[sol.classes[di]] += order[k:k + cnt]
            k += cnt
    groups: list[tuple[int, ...]] = [()] * len(lengths)
    rank_load = [0.0] * world
    rank_tok = [0] * world
    load = {d: [0.0] * len(blocks[d]) for d in blocks}
    tok = {d: [0] * len(blocks[d]) for d in blocks}

    def place(i: int, s: int, ranks: tuple[int, ...], d: int) -> None:
        if d == 1 or s < 2 * d:
            r = min(ranks, key=lambda r: (rank_load[r], r))
            groups[i] = (r,)
            rank_load[r] += cost.local_ms(s)
            rank_tok[r] += s
        else:
            groups[i] = ranks
            for r in ranks:
                rank_load[r] += ulysses_seq_ms(cost, s, d)
                rank_tok[r] += -(-s // d)

    for d in sorted(members, reverse=True):
        gl, gt = load[d], tok[d]
        for i in sorted(members[d], key=lambda i: (-lengths[i], i)):
            s = lengths[i]
            best = -1
            for k in range(len(blocks[d])):
                if gt[k] + s <= d * cap and (best < 0 or gl[k] < gl[best] - 1e-12):
                    best = k
            if best < 0:
                # The MILP's memory rows use bucket means: when the class is full,
                # take the least loaded group of any class with room (never drop tokens).
                spill = [(load[d2][k], -d2, d2, k) for d2 in sorted(blocks, reverse=True)
                         for k in range(len(blocks[d2])) if tok[d2][k] + s <= d2 * cap]
                if not spill:
                    raise PlanError(f"flexsp: sequence {i} ({s} tokens) fits in no group: every group of "
                                    f"{sorted(blocks)} GPUs x {cap} tokens is full")
                _, _, d2, k = min(spill)
                load[d2][k] += ulysses_seq_ms(cost, s, d2)
                tok[d2][k] += s
                place(i, s, blocks[d2][k], d2)
                continue
            gl[best] += ulysses_seq_ms(cost, s, d)
            gt[best] += s
            place(i, s, blocks[d][best], d)
    return groups, sol


def flexsp_plan(
    lengths: Sequence[int], cluster: Cluster, cost: CostModel, **kw: int
) -> tuple[StepPlan, FlexSPSolution]:
    groups, sol = flexsp_groups(lengths, cost, **kw)
    return build_plan(lengths, groups, cluster, cost, with_prediction=False), sol
