"""DistCA (core attention disaggregation, arXiv 2510.18121) as its code plans and runs it.

Read from github hao-ai-lab/DistCA (``distca/planner/planner.py``,
``runtime/compute_metadata.py``, ``runtime/megatron/ping_pong/transformer_layer.py``);
our own implementation.

**Nano-batches.** The batch is split into two nano-batches (ping, pong); documents,
largest ``L^2`` first, go to the one with fewer attention FLOPs (DistCA's
``balance_ping_pong`` option), then keep their batch order inside it.

**Linear layout** (``batch_to_items_general``): a nano-batch's documents in order fill
the ranks, ``ceil(T_nb / P)`` tokens each; a document that does not fit whole on
the current rank is cut: each rank's piece of ``c`` tokens is a head part (the next
``c // 2`` tokens from the front) and a tail part (the next ``c - c // 2`` from the
back). Each piece is an *item*; a part of ``q`` query tokens ending at position
``kv`` costs ``q kv - q (q - 1) / 2`` (causal attention over its prefix).

**Balancing** (``Planner.plan_items``, tolerance ``tol``): ranks below the mean
FLOPs, most starved first, take work while their deficit exceeds ``tol x mean``:
among items on ranks with surplus, the one with the fewest bytes per FLOP moved
(``(q hidden + 2 (L+1) kv_hidden) / flops`` with ``q = flops / (L+1)``) moves,
whole when the wanted FLOPs cover it, else ``m = flops // (L+1)`` tokens from the
end of its head part and ``m`` from the start of its tail part (a new item on the
recipient). No topology term. ``tol`` runs through 0.05, 0.06, ..., 0.1, 0.2, ...,
1.0, from ``MIN_TOLERANCE_FACTOR`` on, until the all-to-all buffer needed (per rank,
forward: Q/K/V sent + received + output sent + received, its own included) fits
the NVSHMEM buffer (DistCA's scripts: 2 GiB; here no limit unless given, see
:func:`distca_plan`); none fits: ``PlanError``. A tighter
tolerance moves more work, hence more K/V bytes: not always faster. By default
``MIN_TOLERANCE_FACTOR`` is chosen per batch: every tolerance that fits the buffer
is simulated and the fastest kept (in DistCA's favour, as ``te-cp`` gets its best
CP size per batch).

**Traffic** (``from_planner_output``): a shard (a part on its attention rank) gets
its Q from its linear rank and the K/V of every shard of its document up to
itself, each K/V shard sent once per (linear rank, attention rank) pair
(deduplicated); its output goes back. Backward mirrors it (output gradient in;
dQ, dK/dV out). Merged forward + backward, per pair: in ``2 q + kv`` bytes per
query / per deduplicated K/V token, out the same.

**Execution** (per layer, ping-pong, each tick ends when its compute and its
all-to-all are both done): pre-attention linear of nano 0 | all-to-all in of 0
while linear of 1 | in of 1 while attention of 0 | out of 0 while attention of 1 |
out of 1 while post-attention linear of 0 | post-attention linear of 1. Attention
of a nano-batch on a rank is one fused varlen call (at least the per-call
overhead); the send/receive buffers are packed and unpacked by copy kernels
(``2 x bytes / HBM bandwidth`` each). All-to-alls run as the simulator's other
all-to-alls do (PXN-style, rail-aligned NIC hops, :func:`_pxn_pairs`); NVSHMEM's
direct puts would load the sender's own NIC instead (this reading favours DistCA).

Example: 2 ranks, one nano-batch of one 8-token document: budget 4 tokens; rank 0
holds head ``[0, 2)`` and tail ``[6, 8)`` (FLOPs 3 + 15 = 18), rank 1 holds
``[2, 4)`` and ``[4, 6)`` (7 + 11 = 18): balanced, nothing moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..planner.cluster import Cluster
from ..planner.cost_model import CostModel
from ..planner.plan import PlanError, SequencePlan, StepPlan
from .charges import hbm_ms
from .peer_plan import PeerPlan, as_peer_plan
from .peer_programs import ProgramBuilder
from .planbuild import placement_of
from .program import LayerProgram, Traffic

__all__ = ["Item", "DistcaSchedule", "NanoBatch", "TOLERANCES", "DEFAULT_BUFFER_BYTES", "split_nano_batches",
           "linear_items", "balance_items", "nano_batch", "distca_schedule", "distca_plan", "distca_program"]

TOLERANCES: tuple[float, ...] = (0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
DEFAULT_BUFFER_BYTES = 2 * 2**30


def _flops(q: int, kv: int) -> int:
    return q * kv - q * (q - 1) // 2


@dataclass
class Item:
    """Query tokens of document ``seq`` held on linear rank ``src``, attended on rank ``gpu``:
    ``parts`` = ``[q, kv]`` pairs (one whole part, or head and tail), each covering ``[kv - q, kv)``."""

    seq: int
    length: int
    src: int
    gpu: int
    parts: list[list[int]]
    complete: bool = True

    @property
    def flops(self) -> int:
        return sum(_flops(q, kv) for q, kv in self.parts if q > 0)


def split_nano_batches(lengths: Sequence[int]) -> tuple[list[int], list[int]]:
    """Indices of the two nano-batches (module docstring), each in batch order."""
    fl = [0, 0]
    tok = [0, 0]
    where = [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = 0 if (fl[0], tok[0]) <= (fl[1], tok[1]) else 1
        where[i] = k
        fl[k] += lengths[i] * lengths[i]
        tok[k] += lengths[i]
    return [i for i in range(len(lengths)) if where[i] == 0], [i for i in range(len(lengths)) if where[i] == 1]


def linear_items(seqs: Sequence[int], lengths: Sequence[int], world: int) -> list[Item]:
    """The equal-token linear layout of one nano-batch as items (module docstring)."""
    total = sum(lengths[i] for i in seqs)
    budget = [-(-total // world)] * world
    items: list[Item] = []
    r = 0
    for i in seqs:
        n = lengths[i]
        left, head, tail = n, 0, n
        while left > 0:
            while budget[r] == 0:
                r += 1
            c = min(left, budget[r])
            if c == n:
                items.append(Item(i, n, r, r, [[n, n]]))
            else:
                qh = c // 2
                qt = c - qh
                items.append(Item(i, n, r, r, [[qh, head + qh], [qt, tail]], complete=False))
                head += qh
                tail -= qt
            budget[r] -= c
            left -= c
    return items


def _priority(item: Item, surplus: float, deficit: float, hidden: int, kv_hidden: int) -> float:
    most = min(surplus, deficit, item.flops)
    q = most / (item.length + 1)
    return (q * hidden + 2 * (item.length + 1) * kv_hidden) / most


def _split(item: Item, flops: float, to: int) -> tuple[Item | None, int]:
    """Move ``flops`` of ``item`` to rank ``to`` (whole when they cover it); the new item and FLOPs moved."""
    total = item.flops
    if flops >= total:
        item.gpu = to
        return None, total
    m = int(flops / (item.length + 1))
    if item.complete:
        q, kv = item.parts[0]
        m = min(m, q // 2)
        if m <= 0:
            return None, 0
        hq, tq = (q + 1) // 2 - m, q // 2 - m
        item.parts = [[hq, hq], [tq, kv]]
        item.complete = False
    else:
        (hq, hkv), (tq, tkv) = item.parts
        m = min(m, hq, tq)
        if m <= 0:
            return None, 0
        item.parts = [[hq - m, hkv - m], [tq - m, tkv]]
    (hq, hkv), (tq, tkv) = item.parts
    new = Item(item.seq, item.length, item.src, to, [[m, hkv + m], [m, tkv - tq]], complete=False)
    return new, new.flops


def balance_items(items: list[Item], world: int, tolerance: float, hidden: int, kv_hidden: int) -> list[Item]:
    """DistCA's greedy FLOP balancing (module docstring, "Balancing"); ``items`` are changed in place."""
    per = [0.0] * world
    for it in items:
        per[it.gpu] += it.flops
    mean = sum(per) / world
    surplus = [f - mean for f in per]
    threshold = mean * tolerance
    for rcv, deficit in sorted(((r, s) for r, s in enumerate(surplus) if s < 0), key=lambda t: t[1]):
        need = -deficit
        while need > threshold:
            best: tuple[float, Item] | None = None
            for it in items:
                if surplus[it.gpu] > 0 and it.flops > 0:
                    p = _priority(it, surplus[it.gpu], need, hidden, kv_hidden)
                    if best is None or p < best[0]:
                        best = (p, it)
            if best is None:
                break
            it = best[1]
            donor = it.gpu
            new, moved = _split(it, min(need, it.flops, surplus[donor]), rcv)
            if moved <= 0:
                break
            if new is not None:
                items.append(new)
            surplus[donor] -= moved
            surplus[rcv] += moved
            need -= moved
    return [it for it in items if it.flops > 0]


@dataclass
class NanoBatch:
    """One nano-batch's layouts, per-rank work and all-to-all bytes (one layer, fwd + bwd)."""

    linear: list[list[tuple[int, int, int]]]       # rank -> (seq, start, end)
    shards: list[list[tuple[int, int, int]]]       # attention rank -> (seq, start, end)
    attention_ms: list[float]
    pair_bytes: dict[tuple[int, int], float]       # in-phase (linear -> attention); out-phase is its reverse
    sent: list[float] = field(default_factory=list)       # bytes each rank packs (its own included), in-phase
    received: list[float] = field(default_factory=list)
    buffer_bytes: float = 0.0                      # DistCA's forward buffer need, worst rank


def nano_batch(items: list[Item], linear: list[Item], world: int, cost: CostModel) -> NanoBatch:
    """Traffic and work of a balanced nano-batch (module docstring, "Traffic")."""
    qb, kvb = cost.q_bytes_per_token, cost.kv_bytes_per_token
    lin = [[] for _ in range(world)]  # type: list[list[tuple[int, int, int]]]
    for it in linear:
        for q, kv in it.parts:
            if q > 0:
                lin[it.src].append((it.seq, kv - q, kv))
    shards: dict[int, list[tuple[int, int, int, int]]] = {}   # seq -> (kv, q, src, gpu)
    for it in items:
        for q, kv in it.parts:
            if q > 0:
                shards.setdefault(it.seq, []).append((kv, q, it.src, it.gpu))
    att = [[] for _ in range(world)]  # type: list[list[tuple[int, int, int]]]
    ms = [0.0] * world
    q_tok: dict[tuple[int, int], int] = {}
    kv_tok: dict[tuple[int, int], int] = {}
    for seq, sh in shards.items():
        sh.sort()
        seen: set[tuple[int, int]] = set()   # (K/V shard, attention rank) already sent
        for k, (kv, q, src, gpu) in enumerate(sh):
            att[gpu].append((seq, kv - q, kv))
            ms[gpu] += cost.causal_ms(q) + cost.block_ms(q, kv - q)
            q_tok[(src, gpu)] = q_tok.get((src, gpu), 0) + q
            for j in range(k + 1):
                if (j, gpu) not in seen:
                    seen.add((j, gpu))
                    key = (sh[j][2], gpu)
                    kv_tok[key] = kv_tok.get(key, 0) + sh[j][1]
    pairs = set(q_tok) | set(kv_tok)
    fwd = {p: q_tok.get(p, 0) * (qb + qb) + kv_tok.get(p, 0) * kvb for p in pairs}  # qkv in + out back
    nb = NanoBatch(lin, att, ms, {p: q_tok.get(p, 0) * 2 * qb + kv_tok.get(p, 0) * kvb for p in pairs})
    nb.sent = [0.0] * world
    nb.received = [0.0] * world
    need = [0.0] * world
    for (a, b), v in nb.pair_bytes.items():
        nb.sent[a] += v
        nb.received[b] += v
    for (a, b), v in fwd.items():
        need[a] += v
        need[b] += v
    nb.buffer_bytes = max(need)
    return nb


@dataclass(frozen=True)
class DistcaSchedule:
    """The two nano-batches at the tolerance the buffer allowed."""

    tolerance: float
    nanos: tuple[NanoBatch, NanoBatch]
    shards: int
    buffer_peak: float


def _schedule_at(halves: tuple[list[int], list[int]], lengths: Sequence[int], cost: CostModel,
                 tol: float) -> DistcaSchedule:
    world = cost.cluster.world_size
    m = cost.model
    hidden, kv_hidden = m.q_heads * m.head_dim, m.kv_heads * m.head_dim
    nanos = []
    for seqs in halves:
        base = linear_items(seqs, lengths, world)
        work = [Item(it.seq, it.length, it.src, it.gpu, [list(p) for p in it.parts], it.complete) for it in base]
        nanos.append(nano_batch(balance_items(work, world, tol, hidden, kv_hidden), base, world, cost))
    shards = sum(len(s) for n in nanos for s in n.shards)
    return DistcaSchedule(tol, (nanos[0], nanos[1]), shards, max(n.buffer_bytes for n in nanos))


def distca_schedule(lengths: Sequence[int], cost: CostModel, *, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                    min_tolerance: float = TOLERANCES[0]) -> DistcaSchedule:
    """DistCA's loop: the smallest tolerance ``>= min_tolerance`` whose buffer need fits ``buffer_bytes``."""
    if not isinstance(buffer_bytes, int) or buffer_bytes < 1:
        raise PlanError(f"distca: buffer_bytes must be a positive integer, got {buffer_bytes!r}")
    if not TOLERANCES[0] <= min_tolerance <= TOLERANCES[-1]:
        raise PlanError(f"distca: min_tolerance must be in [{TOLERANCES[0]}, {TOLERANCES[-1]}], got {min_tolerance}")
    halves = split_nano_batches(lengths)
    worst = 0.0
    for tol in TOLERANCES:
        if tol < min_tolerance:
            continue
        sched = _schedule_at(halves, lengths, cost, tol)
        worst = sched.buffer_peak
        if worst <= buffer_bytes:
            return sched
    raise PlanError(f"distca: no tolerance in {list(TOLERANCES)} (from {min_tolerance}) keeps the all-to-all buffer "
                    f"within {buffer_bytes / 2**30:.2f} GiB (needs {worst / 2**30:.2f} GiB at tolerance 1.0)")


def _wrap(lengths: Sequence[int], cluster: Cluster, sched: DistcaSchedule) -> PeerPlan:
    world = cluster.world_size
    lin: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    att: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    for nb in sched.nanos:
        for r in range(world):
            lin[r] += nb.linear[r]
            att[r] += nb.shards[r]
    holders: dict[int, set[int]] = {}
    for r in range(world):
        for seq, _, _ in att[r]:
            holders.setdefault(seq, set()).add(r)
    seqs = []
    for i, n in enumerate(lengths):
        ranks = tuple(sorted(holders[i]))
        seqs.append(SequencePlan(int(n), placement_of(ranks, cluster), ranks))  # type: ignore[arg-type]
    base = StepPlan(nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node, sequences=tuple(seqs),
                    attention_layout=tuple(tuple(x) for x in att), linear_layout=tuple(tuple(x) for x in lin),
                    validate=False)
    return as_peer_plan(base, sched, build=distca_program)


def distca_plan(lengths: Sequence[int], cluster: Cluster, cost: CostModel, *,
                buffer_bytes: int | None = None, min_tolerance: float | None = None) -> PeerPlan:
    """DistCA's schedule wrapped in a (not zigzag-validated) ``StepPlan``: the linear layout is
    DistCA's, the attention layout its shards; ``placement`` follows the shards' ranks.

    ``min_tolerance`` (DistCA's ``MIN_TOLERANCE_FACTOR``): ``None`` tries every tolerance that
    fits the buffer and keeps the fastest simulated (in DistCA's favour). ``buffer_bytes``:
    ``None`` = no limit (in DistCA's favour: its scripts set 2 GiB, :data:`DEFAULT_BUFFER_BYTES`,
    which batches of 16k tokens per rank and nano-batch of an MHA 7B model overflow even at
    tolerance 1.0, where DistCA stops with an error; the note reports the buffer used)."""
    if min_tolerance is not None:
        return _wrap(lengths, cluster, distca_schedule(
            lengths, cost, buffer_bytes=DEFAULT_BUFFER_BYTES if buffer_bytes is None else buffer_bytes,
            min_tolerance=min_tolerance))
    from .simulator import Fastest

    if buffer_bytes is not None and (not isinstance(buffer_bytes, int) or buffer_bytes < 1):
        raise PlanError(f"distca: buffer_bytes must be a positive integer, got {buffer_bytes!r}")
    halves = split_nano_batches(lengths)
    fastest: Fastest[PeerPlan] = Fastest()
    worst = 0.0
    for tol in TOLERANCES:
        sched = _schedule_at(halves, lengths, cost, tol)
        worst = sched.buffer_peak
        if buffer_bytes is not None and worst > buffer_bytes:
            continue
        plan = _wrap(lengths, cluster, sched)
        fastest.simulate(plan, cost, plan, attention_comm="distca")
    if fastest.kept is None:
        assert buffer_bytes is not None
        raise PlanError(f"distca: no tolerance in {list(TOLERANCES)} keeps the all-to-all buffer within "
                        f"{buffer_bytes / 2**30:.2f} GiB (needs {worst / 2**30:.2f} GiB at tolerance 1.0)")
    return fastest.kept


def _pxn_pairs(b: ProgramBuilder, key: tuple, pair_bytes: dict[tuple[int, int], float]) -> tuple:
    """An all-to-all as the simulator's other all-to-alls run (PXN-style, rail-aligned): bytes for a GPU
    of another node go over NVLink to the sender node's GPU on the destination's rail, then in one NIC
    hop per (that GPU, destination), summed over the node's senders; same-node pairs: one NVLink hop.
    The NVLink gather is not serialised before the NIC hop (in DistCA's favour, as is the spreading of
    a hot sender's bytes over its node's NICs: NVSHMEM's direct puts would all leave through the
    sender's own NIC); keeps the flows rail-separated (a 128-GPU all-to-all simulates in seconds)."""
    cl = b.cost.cluster
    agg: dict[tuple[int, int], float] = {}
    for (a, d), v in pair_bytes.items():
        if a == d or v <= 0:
            continue
        if cl.node_of(a) == cl.node_of(d):
            agg[(a, d)] = agg.get((a, d), 0.0) + v
            continue
        c = cl.rank_of(cl.node_of(a), cl.local_of(d))
        if c != a:
            agg[(a, c)] = agg.get((a, c), 0.0) + v
        agg[(c, d)] = agg.get((c, d), 0.0) + v
    t = Traffic(key, "group")
    for (x, y), v in sorted(agg.items()):
        t.chains.append([b.hop(x, y, v)])
    b.transfers[key] = t
    return key


def distca_program(plan: PeerPlan, cost: CostModel) -> LayerProgram:
    """One layer of DistCA's ping-pong (module docstring, "Execution")."""
    sched: DistcaSchedule = plan.peer
    b = ProgramBuilder(cost)
    copy_ms_per_byte = 2 * hbm_ms(cost, 1.0)  # a copy reads and writes its bytes
    world = plan.world_size
    n0, n1 = sched.nanos
    keys = {}
    for k, nb in enumerate(sched.nanos):
        keys[(k, "in")] = _pxn_pairs(b, ("distca", k, "in"), nb.pair_bytes)
        keys[(k, "out")] = _pxn_pairs(b, ("distca", k, "out"), {(y, x): v for (x, y), v in nb.pair_bytes.items()})

    def lin(r: int, nb: NanoBatch) -> float:
        return cost.linear_ms(sum(e - s for _, s, e in nb.linear[r])) / 2

    for r in range(world):
        # tick 1
        b.compute(r, lin(r, n0) + n0.sent[r] * copy_ms_per_byte, "linear", "nano 0 linear (pre-attention) + pack")
        # tick 2: all-to-all in of 0 while nano 1's linear runs
        b.post(r, keys[(0, "in")])
        b.compute(r, lin(r, n1) + n1.sent[r] * copy_ms_per_byte, "linear", "nano 1 linear (pre-attention) + pack")
        b.wait(r, keys[(0, "in")], "group", "nano 0 all-to-all in")
        # ticks 3 and 4: in of 1 while attention of 0, out of 0 while attention of 1
        for k, nb, nxt in ((0, n0, (1, "in")), (1, n1, (0, "out"))):
            b.post(r, keys[nxt])
            b.compute(r, 2 * nb.received[r] * copy_ms_per_byte, "copy", f"nano {k} unpack in + pack out")
            if nb.attention_ms[r] > 0:
                b.compute(r, nb.attention_ms[r], "attention", f"nano {k} core attention (one fused call)")
            b.wait(r, keys[nxt], "group", f"nano {nxt[0]} all-to-all {nxt[1]}")
        # tick 5: out of 1 while nano 0's post-attention linear runs
        b.post(r, keys[(1, "out")])
        b.compute(r, lin(r, n0) + n0.sent[r] * copy_ms_per_byte, "linear", "nano 0 unpack + linear (post-attention)")
        b.wait(r, keys[(1, "out")], "group", "nano 1 all-to-all out")
        # tick 6
        b.compute(r, lin(r, n1) + n1.sent[r] * copy_ms_per_byte, "linear", "nano 1 unpack + linear (post-attention)")
    return b.program()
