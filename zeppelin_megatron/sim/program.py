"""What every rank does in one simulated layer: compute ops, transfers, waits.

One layer, forward + backward merged the way the cost model times them (all
kernel times are forward + backward; a ring step moves 3x the forward K/V
bytes). Per rank, in this order (the runtime engine's order,
``docs/runtime.md``):

1. linear modules, first half: ``linear_ms(linear-layout tokens) / 2``;
2. remap in (plans whose linear layout differs from the attention layout):
   flows linear rank -> attention rank, ``(2 q + kv)`` bytes per moved token
   (forward q, k, v in and backward output-gradient in); with ``remap_proxies``
   each cross-node pair is split over the proxies' NICs as the runtime routes it;
3. attention, group by group in ``plan.rings`` order (inter-node rings, then
   intra-node rings), with the rank's local sequences interleaved:

   * ``ring``: step ``j = 0 .. g-1``: post the transfer of step ``j`` (each
     position sends ``3 * sum ring_step_bytes`` to the next, over NVLink or a
     NIC, or split over proxies when routed), compute the step's block
     (``sum diag`` at step 0, ``sum off`` after; at least the call overhead),
     then (``interleave_local``, the runtime engine) the local sequences the
     plan's ``local_slots`` put at this rank's step ``j`` of this ring
     (:mod:`~zeppelin_megatron.planner.local_schedule`), one call of
     ``max(sum local_ms, call overhead)``, then wait for the transfer (none
     after the last step). The rank's other local sequences run as one call after
     the groups. Proxy
     ranks of routed hops walk the ring's transfers as relays (post, wait)
     without compute.
   * ``ulysses``: all-to-all in (each member sends ``t_i (2 q + kv) / g`` bytes
     to each other member), one call over the group's sequences with
     ``1/g`` of the heads (``sum causal_ms(s) / g``), all-to-all out (same bytes).
   * ``allgather``: post the K/V all-gather (``2 t_i kv`` bytes from each
     member to each other: forward, and again in backward), compute the
     rank's own diagonal blocks meanwhile, wait, compute the rest of its rows
     (``block_ms(s/g, s) / 2`` in total per sequence), reduce-scatter dK/dV
     (``t_j kv`` bytes to each member ``j``).

   Without ``interleave_local`` (the ``fill`` engine) local sequences form a
   queue, run as one call after the groups; with ``fill`` (simulator option)
   a rank blocked on a ring or group wait first runs local sequences from its
   queue (longest first, at least one call overhead's worth per call, not
   preempted): the three-queue engine of the paper, which
   :func:`~zeppelin_megatron.planner.predict.predict` assumes. The
   ``ulysses`` and ``allgather`` groups interleave nothing.

4. remap out: attention rank -> linear rank, ``(2 q + kv)`` bytes per token;
5. linear modules, second half.

Transfers are sets of hop chains: a hop starts when both its ends have posted
the transfer and the previous hop of its chain is done; a rank's wait ends
when every hop it sends or receives is done.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from ..planner.cost_model import CostModel
from ..planner.plan import Ring, StepPlan
from ..planner.remap_routing import proxy_parts
from ..planner.routing import route_parts
from ..planner.zigzag import zigzag_tokens

__all__ = ["Hop", "Transfer", "Op", "LayerProgram", "build_layer_program"]

Link = Literal["nvl", "nic"]


@dataclass(frozen=True)
class Hop:
    src: int
    dst: int
    nbytes: float
    link: Link


@dataclass
class Transfer:
    """Named set of hop chains (``category``: ``ring``, ``relay``, ``remap``, ``group``)."""

    key: tuple
    category: str
    chains: list[list[Hop]] = field(default_factory=list)
    after: dict[int, int] = field(default_factory=dict)
    """Chain ``c`` starts only when chain ``after[c]`` has finished (fan-out after a shared hop)."""


@dataclass(frozen=True)
class Op:
    """``compute`` (``ms``, ``kind``), ``post`` or ``wait`` (``key``), or ``local``: the rank's
    local queue (whatever is left of it) as one call."""

    what: Literal["compute", "post", "wait", "local"]
    ms: float = 0.0
    kind: str = ""
    key: tuple = ()
    label: str = ""


@dataclass
class LayerProgram:
    """Per-rank ops, the transfers they name, and each rank's local queue (kernel ms per
    local sequence, longest first)."""

    ops: list[list[Op]]
    transfers: dict[tuple, Transfer]
    local_queue: list[list[float]] = field(default_factory=list)


def _hop(cost: CostModel, src: int, dst: int, nbytes: float) -> Hop:
    cl = cost.cluster
    return Hop(src, dst, float(nbytes), "nvl" if cl.node_of(src) == cl.node_of(dst) else "nic")


def _pairs_transfer(key: tuple, category: str, cost: CostModel, pair_bytes: dict[tuple[int, int], float]) -> Transfer:
    """One hop per pair, except that a rank's bytes to all GPUs of another node go as one NIC
    hop to the rail-aligned GPU there and on over NVLink (NCCL's PXN-style all-to-all):
    ``src -> (node(dst), local(src))`` carries the sum, then one NVLink hop per final GPU.
    Keeps a 128-rank all-to-all at ``128 x (nodes + 7)`` flows instead of ``128^2``.
    """
    cl = cost.cluster
    t = Transfer(key, category)
    remote: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    for (a, b), nbytes in sorted(pair_bytes.items()):
        if a == b or nbytes <= 0:
            continue
        if cl.node_of(a) == cl.node_of(b):
            t.chains.append([Hop(a, b, float(nbytes), "nvl")])
        else:
            remote[(a, cl.node_of(b))].append((b, float(nbytes)))
    for (a, node), items in sorted(remote.items()):
        rail = cl.rank_of(node, cl.local_of(a))
        total = sum(n for _, n in items)
        head = len(t.chains)
        t.chains.append([Hop(a, rail, total, "nic")])
        for b, n in items:
            if b != rail:
                t.after[len(t.chains)] = head
                t.chains.append([Hop(rail, b, n, "nvl")])
    return t


def _remap_transfer(key: tuple, cost: CostModel, rows: dict[tuple[int, int], int], per_token: float,
                    proxies: tuple[int, ...]) -> Transfer:
    """The remap all-to-all: direct (:func:`_pairs_transfer`), or routed as the runtime routes it
    (:mod:`~zeppelin_megatron.planner.remap_routing`): each cross-node pair's rows split over
    ``proxies`` with ``split_counts``, part ``p`` on the chain ``src -> P_src(p)`` (NVLink),
    ``P_src(p) -> P_dst(p)`` (the proxy's NIC), ``P_dst(p) -> dst`` (NVLink)."""
    if not proxies:
        return _pairs_transfer(key, "remap", cost, {ab: n * per_token for ab, n in rows.items()})
    cl = cost.cluster
    t = Transfer(key, "remap")
    for (a, b), n in sorted(rows.items()):
        if a == b or n <= 0:
            continue
        if cl.node_of(a) == cl.node_of(b):
            t.chains.append([Hop(a, b, n * per_token, "nvl")])
            continue
        for _, part, pa, pb in proxy_parts(a, b, n, cl.gpus_per_node, proxies):
            nbytes = part * per_token
            chain = [Hop(a, pa, nbytes, "nvl")] if pa != a else []
            chain.append(Hop(pa, pb, nbytes, "nic"))
            if pb != b:
                chain.append(Hop(pb, b, nbytes, "nvl"))
            t.chains.append(chain)
    return t


def _ring_transfer(plan: StepPlan, ring: Ring, step: int, nbytes: float, cost: CostModel,
                   routing: bool) -> Transfer:
    cl = cost.cluster
    g = len(ring.ranks)
    routes = plan.routes_for(ring.ranks) if routing else {}
    t = Transfer(("ring", ring.ranks, step), "ring")
    for p, src in enumerate(ring.ranks):
        dst = ring.ranks[(p + 1) % g]
        route = routes.get((src, dst))
        if route is None or len(route.proxies) < 2:
            t.chains.append([_hop(cost, src, dst, nbytes)])
            continue
        # Parts of whole bytes, split as the runtime's router splits elements.
        for rp in route_parts(route, int(round(nbytes)), cl.gpus_per_node):
            t.chains.append([_hop(cost, a, b, rp.count) for a, b in zip(rp.path, rp.path[1:])])
    return t


def _tokens_by_rank(plan: StepPlan, seq: int) -> dict[int, int]:
    s = plan.sequences[seq]
    g = len(s.ranks)
    return {r: zigzag_tokens(s.length, g, p) for p, r in enumerate(s.ranks)}


def build_layer_program(plan: StepPlan, cost: CostModel, attention_comm: str = "ring",
                        routing: bool = True, interleave_local: bool = True) -> LayerProgram:
    """Per-rank op lists and the transfers they name (see module docstring).

    ``routing=False`` ignores the plan's routes (every hop direct).
    ``interleave_local``: local sequences run in the plan's ``local_slots`` as
    the runtime engine runs them (``True``), or every local sequence goes to the
    end-of-attention queue (``False``; what the ``fill`` engine draws from).
    """
    # Peer baselines (megatron-hcp, te-cp-a2a-p2p, distca) build their own programs: sim/peer_programs.py.
    if attention_comm in ("hcp", "a2a_p2p", "distca"):
        from .peer_programs import build_peer_program
        return build_peer_program(plan, cost, attention_comm)
    world = plan.world_size
    o = cost.call_overhead_ms
    per_token = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    kvb = cost.kv_bytes_per_token
    ops: list[list[Op]] = [[] for _ in range(world)]
    transfers: dict[tuple, Transfer] = {}

    def add(t: Transfer) -> tuple:
        transfers[t.key] = t
        return t.key

    lin_half = [cost.linear_ms(plan.tokens(r, "linear")) / 2 for r in range(world)]
    for r in range(world):
        if lin_half[r] > 0:
            ops[r].append(Op("compute", lin_half[r], "linear", label="linear (first half)"))

    # Remap in/out: per (linear rank, attention rank) pair, tokens moved.
    moved: dict[tuple[int, int], int] = defaultdict(int)
    for seg in plan.remap.segments:
        if seg.lin_rank != seg.att_rank:
            moved[(seg.lin_rank, seg.att_rank)] += seg.length
    remap_keys: tuple[tuple, tuple] | None = None
    if moved:
        tin = add(_remap_transfer(("remap", "in"), cost, moved, per_token, plan.remap_proxies))
        tout = add(_remap_transfer(("remap", "out"), cost, {(b, a): v for (a, b), v in moved.items()}, per_token,
                                   plan.remap_proxies))
        remap_keys = (tin, tout)
        for r in range(world):
            ops[r] += [Op("post", key=tin), Op("wait", key=tin, kind="remap", label="remap in")]

    # Attention groups in queue order.
    relays: dict[tuple[int, ...], set[int]] = defaultdict(set)
    if attention_comm == "ring" and routing:
        for route in plan.routing:  # one element per proxy names every part's path
            for rp in route_parts(route, len(route.proxies), cost.cluster.gpus_per_node):
                relays[route.ring].update(rp.relays)
    # Local sequences per rank in plan order; with interleave_local, the plan's slots get theirs.
    local_lens: list[list[int]] = [[] for _ in range(world)]
    slotted: dict[tuple[int, int, int], float] = {}
    in_slot: set[int] = set()
    if interleave_local and attention_comm == "ring":
        for x in plan.local_slots:
            slotted[(x.rank, x.ring, x.step)] = max(sum(cost.local_ms(plan.sequences[i].length) for i in x.seqs), o)
            in_slot.update(x.seqs)
    for i, s in enumerate(plan.sequences):
        if s.placement == "local" and i not in in_slot:
            local_lens[s.ranks[0]].append(s.length)
    for k, ring in enumerate(plan.rings):
        g = len(ring.ranks)
        lengths = [plan.sequences[i].length for i in ring.seqs]
        label = f"{ring.placement} group {list(ring.ranks)[:4]}{'...' if g > 4 else ''} ({len(lengths)} seqs)"
        if attention_comm == "ring":
            diag = sum(cost.ring_compute_profile(s, g)[0] for s in lengths)
            off = sum(cost.ring_compute_profile(s, g)[1] for s in lengths)
            nbytes = 3 * sum(cost.ring_step_bytes(s, g) for s in lengths)
            keys = [add(_ring_transfer(plan, ring, j, nbytes, cost, routing)) for j in range(g - 1)]
            members = set(ring.ranks)
            for r in sorted(members | relays.get(ring.ranks, set())):
                for j in range(g):
                    if j < g - 1:
                        ops[r].append(Op("post", key=keys[j]))
                    if r in members:
                        ops[r].append(Op("compute", max(diag if j == 0 else off, o), "attention",
                                         label=f"{label} step {j}"))
                        if (r, k, j) in slotted:
                            ops[r].append(Op("compute", slotted[(r, k, j)], "local",
                                             label=f"local slot (in {label} step {j})"))
                    if j < g - 1:
                        ops[r].append(Op("wait", key=keys[j], kind="ring", label=f"{label} step {j}"))
        elif attention_comm == "ulysses":
            held: dict[int, int] = defaultdict(int)
            for i in ring.seqs:
                for r, t in _tokens_by_rank(plan, i).items():
                    held[r] += t
            a2a = {(a, b): held[a] * per_token / g for a in ring.ranks for b in ring.ranks if a != b}
            tin = add(_pairs_transfer(("ulysses", ring.ranks, "in"), "group", cost, a2a))
            tout = add(_pairs_transfer(("ulysses", ring.ranks, "out"), "group", cost,
                                       {(b, a): v for (a, b), v in a2a.items()}))
            comp = max(sum(cost.causal_ms(s) for s in lengths) / g, o)
            for r in ring.ranks:
                ops[r] += [Op("post", key=tin), Op("wait", key=tin, kind="group", label=f"{label} all-to-all in"),
                           Op("compute", comp, "attention", label=f"{label} ulysses"),
                           Op("post", key=tout), Op("wait", key=tout, kind="group", label=f"{label} all-to-all out")]
        elif attention_comm == "allgather":
            held = defaultdict(int)
            diag: dict[int, float] = defaultdict(float)
            rest: dict[int, float] = defaultdict(float)
            for i in ring.seqs:
                s = plan.sequences[i].length
                for r, t in _tokens_by_rank(plan, i).items():
                    held[r] += t
                    d = cost.causal_ms(t)
                    diag[r] += d
                    rest[r] += max(cost.block_ms(t, s) / 2 - d, 0.0)
            ag = {(a, b): 2 * held[a] * kvb for a in ring.ranks for b in ring.ranks if a != b}
            rs = {(a, b): held[b] * kvb for a in ring.ranks for b in ring.ranks if a != b}
            tag = add(_pairs_transfer(("allgather", ring.ranks, "ag"), "group", cost, ag))
            trs = add(_pairs_transfer(("allgather", ring.ranks, "rs"), "group", cost, rs))
            for r in ring.ranks:
                ops[r] += [Op("post", key=tag),
                           Op("compute", max(diag[r], o), "attention", label=f"{label} own chunks"),
                           Op("wait", key=tag, kind="group", label=f"{label} all-gather K/V"),
                           Op("compute", max(rest[r], o), "attention", label=f"{label} gathered K/V"),
                           Op("post", key=trs), Op("wait", key=trs, kind="group", label=f"{label} reduce-scatter dK/dV")]
        else:
            raise ValueError(f"attention_comm is {attention_comm!r}, expected ring, ulysses or allgather")

    queue: list[list[float]] = [[] for _ in range(world)]
    for r in range(world):
        if interleave_local:
            if local_lens[r]:
                ops[r].append(Op("compute", max(sum(cost.local_ms(n) for n in local_lens[r]), o), "local",
                                 label="local sequences after the rings"))
            continue
        queue[r] = sorted((cost.local_ms(n) for n in local_lens[r]), reverse=True)
        if queue[r]:
            ops[r].append(Op("local", kind="local", label="local sequences"))
    if remap_keys is not None:
        tout = remap_keys[1]
        for r in range(world):
            ops[r] += [Op("post", key=tout), Op("wait", key=tout, kind="remap", label="remap out")]
    for r in range(world):
        if lin_half[r] > 0:
            ops[r].append(Op("compute", lin_half[r], "linear", label="linear (second half)"))
    return LayerProgram(ops, transfers, queue)
