"""Megatron hybrid context parallelism (``--hybrid-context-parallel``) as megatron-core 0.16 runs it.

**Grouping** (:func:`hcp_groups`): our re-implementation of
``megatron.core.pipeline_parallel.hybrid_cp_schedule.BalancedCPScheduler.get_groups_and_subsamples``,
step for step (its quirks kept, since they decide what Megatron runs):

* a sequence of ``L`` tokens gets ``cp(L) = max(1, 2^ceil(log2(L / S)))`` GPUs,
  ``S`` = ``--max-seqlen-per-dp-cp-rank``; its work estimate is ``L^2 / cp(L)``;
* sequences sorted longest first (stable); then, while any are left, one *group*
  (a sub-batch that ends with a barrier over DPxCP):

  1. buckets: ``k`` = number of distinct CP sizes, target = total work / ``k``;
     walking the sequences, a bucket is closed before a sequence when it would
     exceed ``1.1 x`` target or when only as many sequences remain as buckets
     still owed (``remaining_k - len(buckets)``, both counters moving);
  2. repeatedly take the head of the first bucket that can be placed (an existing
     CP group of its size, or enough never-used GPUs for a new one); put it on the
     least-loaded existing group of that size (first on ties), unless the first
     ``cp`` free GPUs (by load, then rank) would be less loaded than that group;
  3. once a sequence with a smaller CP size than the group's *first* one was
     placed, stop when ``max - min <= 5%`` of ``max`` load (buckets left);
  4. ``trim_overload``: while the slack exceeds 5% and no GPU is idle, drop the
     last sequence of the most loaded GPU's group if that lowers the slack;
  5. ``fill_empty_gpus``: while GPUs are idle, double the first smallest group
     (to ``min(2 cp, world)``) and shift the later groups' GPUs up; its sequences
     then run on the doubled group.

  Dropped and unplaced sequences (in bucket order, trimmed ones appended) form
  the next group's input, unsorted.

**Execution** (:func:`hcp_program`): groups one after another, a barrier over all
ranks between groups; every sequence is its own microbatch: its CP group runs
linear (first half), TE CP ring attention (p2p; ``cp`` steps, each a call of at least
the per-call overhead, ``3 x ring_step_bytes`` per step to the next rank), linear
(second half); ``cp = 1``: one causal call. A sequence shorter than ``2 cp`` tokens
(after ``fill_empty_gpus``) is padded to ``2 cp``, as TE pads.

**Setting** ``S``: the power of two (from 512 up to the cluster's tokens per GPU)
whose simulated step is fastest for this batch, among those whose largest CP size
is a group Megatron creates (power of two up to ``world / 2``, or the whole world).

Example (``S = 4``, 4 GPUs, lengths ``[8, 4, 4]``): CP sizes ``[2, 1, 1]``; one group:
sequence 0 on GPUs ``[0, 1]``, 1 on ``[2]``, 2 on ``[3]`` (``hcp_groups`` returns
``[[[0], [0], [1], [2]]]``: per group, per GPU, the sample ids in run order).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from ..planner.cluster import Cluster
from ..planner.cost_model import CostModel
from ..planner.plan import PlanError
from .peer_plan import PeerPlan, as_peer_plan
from .peer_programs import ProgramBuilder
from .planbuild import build_plan
from .program import LayerProgram

__all__ = ["HcpSchedule", "gpus_needed", "hcp_groups", "hcp_schedule", "hcp_plan", "hcp_program",
           "valid_group_sizes", "candidate_settings"]

_DELTA = 0.05


def gpus_needed(length: int, max_seqlen_per_rank: int) -> int:
    """``max(1, 2^ceil(log2(L / S)))``: Megatron's CP size of one sequence."""
    return int(max(1, 2 ** math.ceil(math.log2(length / max_seqlen_per_rank))))


def _work(length: int, cp: int) -> float:
    return (length * length) / cp


def _buckets(items: list[tuple[int, int]], S: int) -> list[deque[tuple[int, int]]]:
    k = len({gpus_needed(n, S) for _, n in items})
    total = sum(_work(n, gpus_needed(n, S)) for _, n in items)
    target = total / k
    buckets: list[deque[tuple[int, int]]] = []
    cur: list[tuple[int, int]] = []
    cur_work = 0.0
    remaining_k = k
    for i, (sid, n) in enumerate(items):
        w = _work(n, gpus_needed(n, S))
        if cur and (cur_work + w > target * 1.1 or len(items) - i <= remaining_k - len(buckets)):
            buckets.append(deque(cur))
            cur, cur_work = [], 0.0
            remaining_k -= 1
        cur.append((sid, n))
        cur_work += w
    if cur:
        buckets.append(deque(cur))
    return buckets


def _next_group(items: list[tuple[int, int]], S: int, world: int) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """One group: per GPU the sample ids it runs, and the leftover ``(id, length)`` pairs."""
    buckets = _buckets(items, S)
    lens: list[list[int]] = [[] for _ in range(world)]
    ids: list[list[int]] = [[] for _ in range(world)]
    load = [0.0] * world
    gid_of: list[int | None] = [None] * world
    members: dict[int, list[int]] = {}
    size: dict[int, int] = {}
    next_gid = 0
    first_needed: int | None = None
    check = False
    while buckets:
        pick = None
        for idx in range(len(buckets)):
            if not buckets[idx]:
                continue
            need = gpus_needed(buckets[idx][0][1], S)
            if any(sz == need for sz in size.values()) or sum(g is None for g in gid_of) >= need:
                pick = idx
                break
        if pick is None:
            break
        sid, n = buckets[pick][0]
        need = gpus_needed(n, S)
        if first_needed is None:
            first_needed = need
        cands = [gid for gid, sz in size.items() if sz == need]
        best_gid: int | None = None
        best_load = math.inf
        if cands:
            best_gid, best_load = min(((gid, max(load[r] for r in members[gid])) for gid in cands),
                                      key=lambda t: t[1])
        free = [r for r, g in enumerate(gid_of) if g is None]
        if len(free) >= need:
            new = sorted(free, key=lambda r: load[r])[:need]
            if load[new[-1]] < best_load:
                best_gid = None
                chosen = new
            else:
                assert best_gid is not None
                chosen = members[best_gid]
        else:
            assert best_gid is not None
            chosen = members[best_gid]
        if best_gid is None:
            best_gid = next_gid
            next_gid += 1
            members[best_gid] = chosen
            size[best_gid] = need
            for r in chosen:
                gid_of[r] = best_gid
        cost = _work(n, need)
        for r in chosen:
            lens[r].append(n)
            load[r] += cost
            ids[r].append(sid)
        buckets[pick].popleft()
        while buckets and not buckets[0]:
            buckets.pop(0)
        if need < first_needed:
            check = True
        if check and buckets and max(load) - min(load) <= _DELTA * max(load):
            break
    leftovers = [t for b in buckets for t in b]
    # trim_overload
    while True:
        hi, lo = max(load), min(load)
        if hi - lo <= _DELTA * hi or lo == 0:
            break
        r_max = load.index(hi)
        gid = gid_of[r_max]
        assert gid is not None
        if len(lens[r_max]) <= 1:
            break
        n = lens[r_max][-1]
        cost = _work(n, gpus_needed(n, S))
        proj = load[:]
        for r in members[gid]:
            proj[r] -= cost
        if max(proj) - min(proj) < hi - lo:
            sid = ids[r_max][-1]
            for r in members[gid]:
                lens[r].pop()
                load[r] -= cost
                ids[r].pop()
            leftovers.append((sid, n))
        else:
            break
    # fill_empty_gpus
    while any(not x for x in lens):
        if not size:
            raise PlanError(f"megatron-hcp: no sequence fits a CP group at S = {S} on {world} GPUs")
        smallest = min(size.values())
        grown = min(smallest * 2, world)
        gid = next(g for g, sz in size.items() if sz == smallest)
        extra = grown - smallest
        start, end = members[gid][0], members[gid][-1]
        empty = next(i for i, x in enumerate(lens) if not x)
        pushed = list(range(end + 1, empty))
        if empty + extra > world or end + extra + len(pushed) >= world + 1:
            raise PlanError(f"megatron-hcp: cannot double a {smallest}-GPU group at S = {S} on {world} GPUs")
        new_lens: list[list[int]] = [[] for _ in range(world)]
        new_ids: list[list[int]] = [[] for _ in range(world)]
        for i in range(start):
            new_lens[i], new_ids[i] = lens[i], ids[i]
        for i in range(start, end + extra + 1):
            new_lens[i], new_ids[i] = lens[end], ids[end]
        for k, i in enumerate(pushed):
            new_lens[end + extra + 1 + k], new_ids[end + extra + 1 + k] = lens[i], ids[i]
        size[gid] = grown
        members[gid] = list(range(start, end + extra + 1))
        for g in size:
            if g > gid:
                members[g] = [x + extra for x in members[g]]
        lens, ids = new_lens, new_ids
    return ids, leftovers


def hcp_groups(lengths: Sequence[int], max_seqlen_per_rank: int, world: int) -> list[list[list[int]]]:
    """Per group, per GPU, the sample ids (indices into ``lengths``) it runs, in order.

    Raises:
        PlanError: ``S < 1``, or a sequence whose CP size exceeds ``world``.
    """
    S = max_seqlen_per_rank
    if not isinstance(S, int) or S < 1:
        raise PlanError(f"megatron-hcp: max_seqlen_per_rank must be a positive integer, got {S!r}")
    worst = max(gpus_needed(n, S) for n in lengths)
    if worst > world:
        raise PlanError(f"megatron-hcp: a sequence of {max(lengths)} tokens needs {worst} GPUs at "
                        f"max_seqlen_per_rank = {S}, more than the {world} GPUs")
    items = sorted(enumerate(int(n) for n in lengths), key=lambda t: t[1], reverse=True)
    groups = []
    while items:
        ids, items = _next_group(items, S, world)
        groups.append(ids)
    return groups


@dataclass(frozen=True)
class HcpSchedule:
    """What Megatron runs: ``groups[k]`` = the microbatches of group ``k`` as
    ``(sample id, ranks)`` in run order (every rank of ``ranks`` runs them in this order)."""

    max_seqlen_per_rank: int
    groups: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]


def hcp_schedule(lengths: Sequence[int], max_seqlen_per_rank: int, world: int) -> HcpSchedule:
    out = []
    for ids in hcp_groups(lengths, max_seqlen_per_rank, world):
        ranks: dict[int, list[int]] = {}
        order: list[int] = []
        for r, xs in enumerate(ids):
            for sid in xs:
                if sid not in ranks:
                    ranks[sid] = []
                    order.append(sid)
                ranks[sid].append(r)
        # Run order: by the first rank's position of each sample (ranks of a CP group share it).
        pos = {sid: ids[ranks[sid][0]].index(sid) for sid in order}
        order.sort(key=lambda s: (ranks[s][0], pos[s]))
        out.append(tuple((sid, tuple(ranks[sid])) for sid in order))
    return HcpSchedule(max_seqlen_per_rank, tuple(out))


def valid_group_sizes(world: int) -> set[int]:
    """CP sizes megatron-core creates process groups for: powers of two up to ``world / 2``, and ``world``."""
    return {1 << i for i in range(int(math.log2(world)))} | {world}


def candidate_settings(lengths: Sequence[int], cluster: Cluster) -> list[int]:
    """Powers of two ``S`` in ``[512, tokens_per_gpu]`` (and ``tokens_per_gpu``) whose largest CP size
    Megatron has a group for."""
    world, cap = cluster.world_size, cluster.tokens_per_gpu
    out = sorted({1 << k for k in range(9, 31) if (1 << k) <= cap} | {cap})
    ok = valid_group_sizes(world)
    return [S for S in out if gpus_needed(max(lengths), S) in ok]


def _plan_for(lengths: Sequence[int], cluster: Cluster, cost: CostModel, sched: HcpSchedule) -> PeerPlan:
    where: list[tuple[int, ...]] = [()] * len(lengths)
    for group in sched.groups:
        for sid, ranks in group:
            # A sequence too short to zigzag over its group is shown whole on its first rank
            # (the program pads it to 2 cp tokens, as TE does).
            where[sid] = ranks if lengths[sid] >= 2 * len(ranks) else ranks[:1]
    base = build_plan(lengths, where, cluster, cost, local_slots=False, with_prediction=False)
    return as_peer_plan(base, sched, build=hcp_program)


def hcp_plan(lengths: Sequence[int], cluster: Cluster, cost: CostModel, *,
             max_seqlen_per_rank: int | None = None) -> tuple[PeerPlan, int]:
    """HCP plan at ``max_seqlen_per_rank`` (``None``: the fastest simulated candidate) and the setting used."""
    from .simulator import Fastest

    world = cluster.world_size
    if max_seqlen_per_rank is not None:
        sched = hcp_schedule(lengths, max_seqlen_per_rank, world)
        return _plan_for(lengths, cluster, cost, sched), max_seqlen_per_rank
    fastest: Fastest[tuple[PeerPlan, int]] = Fastest()
    for S in candidate_settings(lengths, cluster):
        plan = _plan_for(lengths, cluster, cost, hcp_schedule(lengths, S, world))
        fastest.simulate(plan, cost, (plan, S), attention_comm="hcp")
    if fastest.kept is None:
        raise PlanError(f"megatron-hcp: no max_seqlen_per_rank in [512, {cluster.tokens_per_gpu}] gives the longest "
                        f"sequence ({max(lengths)} tokens) a CP size Megatron has a group for on {world} GPUs")
    return fastest.kept


def hcp_program(plan: PeerPlan, cost: CostModel) -> LayerProgram:
    """One layer of :class:`HcpSchedule` (module docstring, "Execution")."""
    sched: HcpSchedule = plan.peer
    b = ProgramBuilder(cost)
    lengths = [s.length for s in plan.sequences]
    for k, group in enumerate(sched.groups):
        if k:
            b.barrier(("hcp", "barrier", k), f"barrier before group {k}")
        for sid, ranks in group:
            n, c = lengths[sid], len(ranks)
            label = f"group {k} seq {sid} ({n} tokens, cp {c})"
            lin = cost.linear_ms(-(-n // c)) / 2
            for r in ranks:
                b.compute(r, lin, "linear", f"{label} linear (first half)")
            if c == 1:
                b.compute(ranks[0], cost.causal_ms(n), "attention", label)
            else:
                padded = max(n, 2 * c)
                diag, off = cost.ring_compute_profile(padded, c)
                b.ring(ranks, 3 * cost.ring_step_bytes(padded, c), diag, off, key=("hcp", k, sid), label=label)
            for r in ranks:
                b.compute(r, lin, "linear", f"{label} linear (second half)")
    return b.program()
