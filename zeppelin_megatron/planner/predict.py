"""Predicted step time of a plan from the cost model (the engine's model, per layer).

Per layer, forward + backward, for each rank ``r``:

* Each ring (in :attr:`StepPlan.rings` order; the prediction assumes a rank's
  rings never wait for each other's members, see :func:`~.plan.ring_order`) runs ``g``
  steps. Step 0 is the diagonal call; steps ``1 .. g-1`` each overlap one
  off-diagonal call with the next K/V transfer. All sequences of a ring share
  one call per step; a call costs at least the profile's per-call overhead::

      ring_ms = diag + (g - 1) * max(off, comm) + first_late

  where ``diag``/``off``/``first_late`` are :func:`~.engine_ring.ring_steps` under the
  engine's charges (``charges="zeppelin"`` of :func:`predict`): each step's kernel
  (at least ``o``; off-diagonal steps timed by orientation, ``block_fitted_ms``) plus its merges
  and row copies, step 0 with the ring's gathers; ``comm`` the slowest hop of the ring's
  wire bytes (``2 + a/b`` times the forward K/V: the dK/dV accumulator travels in fp32): NVLink
  inside a node, the network across nodes, over the route's proxies when routed. Under
  ``charges="none"`` (the default: ``plan_step`` and the baselines' plans) ``diag = max(diag
  kernel, o)``, ``off = max(off, o)`` (area-averaged), no copies, ``3x`` K/V on the wire.
* The rank's own time in a ring is ``diag + (g-1) * off + first_late``;
  the rest is waiting. Local sequences (each ``local_ms`` plus the engine's copies around
  local calls, :func:`~.engine_ring.local_copy_ms_per_token`) run in one call after the rings, and
  fill waiting time (the engine's local queue hides ring communication)::

      attn_r = sum(ring_ms) + max(0, local_r - sum(wait))

* A head-parallel ring (``ring.a2a = a > 1``, :mod:`.cost_heads`) of ``m`` blocks costs
  ``heads + copies + diag + (m-1) * max(off, comm) + first_late + tokens`` (the lane's steps over
  ``1/a`` of the heads, its lane hop, the two all-to-alls and the copies around them); its all-to-alls count
  whole, as the rank's own time in the rule above (local work does not fill them) and as ``exposed_comm_ms``.
  That is an upper bound: the lowering posts a rank's ``heads`` all-to-alls first and waits its ``tokens``
  ones last (:mod:`.lowering`), so the engine and the simulator run them under the rank's other rings, its
  ``-1`` slots and its local sequences after the rings. A timeline of that in this prediction (with floors
  to match, :func:`~.grouped.ring_floor`) was tried before ring parts: Zeppelin / best peer 0.9305 -> 0.9299
  on docs/BENCHMARKS.md's 60 configurations (simulated), for 15% more planning time on ``plan_speed.py``'s
  batches (the floors of ranks in several rings lose the all-to-alls, so more candidates are finished).
  The exception: the parts of one ring (:mod:`.ring_parts`: head-parallel rings over the same ranks at the
  same width) are timed together by :func:`~.ring_parts.parts_time`, a later part's ``heads`` all-to-all
  under the calls before it, an earlier part's ``tokens`` under those after it; what no call covers counts
  as above. Parts are made on the chosen plan, after every floor is used, so no floor needs them.
* Local sequences in :attr:`~.plan.StepPlan.remap_slots` run while an exchange is in flight, within
  the rank's estimated wait there (:mod:`.remap_windows`): they cost nothing above the remap.
* Linear modules: ``linear_ms(tokens in the linear layout)``; with them, the remap's row gathers
  and copies (``copy_r``, :func:`~.engine_costs.remap_copy_bytes`, the planner's count of what the
  simulator charges exactly: staying rows are never sent, in-place local sequences' rows never copied,
  none when the linear layout is the attention layout; ``zeppelin`` charges only).
* Remap (:mod:`.remap_cost`): in before attention and out after it, each moved row carrying
  ``2 * q_bytes + kv_bytes`` each time; each all-to-all ends with its busiest NVLink or NIC port,
  rows on the runtime's paths (direct: the source's rail GPU at the destination node, then
  NVLink; routed over ``plan.remap_proxies``: ``a -> P_a -> P_b -> b``); layer remap = in + out.

Step time: the ranks on a path of the remap's rows (sources, destinations, relays:
:func:`~.remap_cost.remap_ranks`) wait for each other there, pair by pair: rank ``r``'s attention waits
at the remap in for the linear modules of every rank ``s`` it receives rows from (or through), and ``s``'s
next linear modules wait at the remap out for ``r``'s attention (:func:`~.remap_cost.remap_couples`). Every
such pair closes a cycle of one layer, ``before_s + attn_r + remap`` (``before = linear + copy``), and every
longer cycle of these waits alternates linear and attention over pairs, so its mean per layer is at most
its slowest pair's: the layers settle at ``layers * (max over pairs and over each rank with itself of
(before_s + attn_r) + remap)``. (It was ``max attn_r + max before_r + remap`` over the path, a barrier:
the same where the busiest attention rank exchanges with the busiest linear one, too slow where a
workload-balanced layout gives the attention-heavy ranks few linear rows: Llama-3B / 7B github-64k on 128
GPUs predicted 535 / 951 ms charged against 471 / 850 simulated, now 480 / 869.) A rank on no path waits
for nobody and takes ``layers * (attn_r + linear_r + copy_r)``; the step is the larger. Without a remap (the linear
layout *is* the attention layout) that is every rank: ``layers * max_r (attn_r + linear_r + copy_r)``
(ring partners already wait for each other inside ``attn_r``). ``rank_ms = layers * (attn_r + linear_r
+ copy_r + remap)``, the remap only for ranks on its paths.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

from .cost_heads import head_ring_time
from .cost_model import CostModel
from .engine_costs import hbm_ms, remap_copy_bytes, shape_of
from .engine_ring import local_copy_ms_per_token, ring_steps
from .lowering import participants
from .plan import Prediction, StepPlan
from .remap_cost import coupled_ms, remap_layer_ms, remap_ranks
from .remap_windows import staying_rows
from .ring_parts import family_time
from .routing import Route, outside_relays
from .zigzag import next_position

__all__ = ["predict", "attention_time", "ring_time", "RingTime", "rank_attention", "remap_time", "ring_loads",
           "RingLoads", "copied_ranks"]

_SCALE = 1e6
"""Predictions are rounded to ``1 / _SCALE`` ms (and MB): :func:`_round`."""


def predict(plan: StepPlan, cost: CostModel, charges: str = "none") -> Prediction:
    """The predicted step of ``plan`` (module docstring); ``charges``: the engine's charge model
    (:mod:`.engine_ring`): ``zeppelin``, this project's engine with its copies and fp32 dK/dV on the
    wire (closer to the simulator: mean |error| 3.8% against 6.1%, docs/planner.md); ``te``; ``none``
    (the default, which ``plan_step``, the layout choice and the baselines still use: the cost model's
    own terms). Example: ``predict(plan, cost, charges="zeppelin").step_ms``."""
    world = plan.world_size
    layers = cost.model.layers
    o = cost.call_overhead_ms
    ring_total, ring_own, fixed, intra_b, inter_b, _ = ring_loads(plan, cost, charges)
    local = [0.0] * world
    by_length: dict[int, float] = {}  # batches repeat lengths
    per_token = local_copy_ms_per_token(cost, charges)  # the engine's copies around local calls
    windowed = {i for x in plan.remap_slots for i in x.seqs}  # hidden by the exchanges (remap_windows.py)
    # without a remap (identical layouts) a rank in no ring, as member or relay, runs its local sequences as one
    # call on its buffers (lowering.RankProgram.whole_chunk, for plan_step's layouts): no copies
    ringed = copied_ranks(plan) if per_token else None
    for i, s in enumerate(plan.sequences):
        if s.placement == "local" and i not in windowed:
            t = by_length.get(s.length)
            if t is None:
                t = by_length[s.length] = cost.local_ms(s.length)
            r = s.ranks[0]
            local[r] += t if ringed is not None and r not in ringed else t + s.length * per_token
    attn, own_compute = rank_attention(ring_total, ring_own, local, o)
    own_compute = [c - f for c, f in zip(own_compute, fixed)]  # the all-to-alls are communication
    lin_t, att_t = plan.rank_tokens
    linear = [cost.linear_ms(t) for t in lin_t]
    # the remap's row gathers and copies (none when the layouts are one: no remap runs; staying rows are never
    # sent; local sequences whole on their rank in both layouts run in place on the linear rows: not copied)
    sh = shape_of(cost)
    copies = [0.0] * world
    if charges == "zeppelin" and plan.linear_layout != plan.attention_layout:
        stay = plan.staying_tokens  # tokens that stay on each rank
        whole = staying_rows(plan)  # the staying local sequences, run in place
        in_place = [sum(b - a for a, b in whole.get(r, {}).values()) for r in range(world)]
        copies = [hbm_ms(cost, remap_copy_bytes(
            sh, lin_t[r], att_t[r], staying=int(stay[r]), in_place=in_place[r],
            identity=in_place[r] == 0 and plan.linear_layout[r] == plan.attention_layout[r])) for r in range(world)]
    before = [t + c for t, c in zip(linear, copies)]  # all of a rank's work outside attention

    remap, remap_intra, remap_inter = remap_time(plan, cost, plan.remap_proxies)
    for r in range(world):
        intra_b[r] += remap_intra[r]
        inter_b[r] += remap_inter[r]

    # A rank on no path of the remap's rows waits for nobody there (the all-to-alls' waits are pairwise);
    # on the paths, the layer lasts as long as the slowest coupled pair's linear + attention (module docstring).
    on_path = remap_ranks(plan, plan.remap_proxies)
    moving = [r in on_path for r in range(world)]
    rank_ms = [layers * (attn[r] + before[r] + (remap if moving[r] else 0.0)) for r in range(world)]
    step = max((rank_ms[r] for r in range(world) if not moving[r]), default=0.0)
    if any(moving):
        coupled = coupled_ms(plan, plan.remap_proxies, before, attn)
        own = max(t + a for t, a, m in zip(before, attn, moving) if m)
        step = max(step, layers * (max(coupled, own) + remap))
    exposed = [layers * (attn[r] - own_compute[r]) for r in range(world)]
    return Prediction(
        step_ms=_round(step),
        rank_ms=_r(rank_ms),
        attention_ms=_r([layers * t for t in own_compute]),
        linear_ms=_r([layers * t for t in linear]),
        exposed_comm_ms=_r(exposed),
        remap_ms=_round(layers * remap),
        intra_MB=_r([layers * b / 1e6 for b in intra_b]),
        inter_MB=_r([layers * b / 1e6 for b in inter_b]),
    )


class RingLoads(NamedTuple):
    """Per rank, one layer, what its rings cost (:func:`ring_loads`): ``total`` the summed ring totals (the
    time its rings hold it, waits included), ``own`` its kernels, copies, head-parallel all-to-alls and relay
    waits, ``fixed`` those all-to-alls and waits (neither kernel time nor a wait that local work fills), the
    bytes it sends over NVLink and the network, and ``relay`` its relay waits alone (:func:`ring_time`)."""

    total: list[float]
    own: list[float]
    fixed: list[float]
    intra_bytes: list[float]
    inter_bytes: list[float]
    relay: list[float]


def ring_loads(plan: StepPlan, cost: CostModel, charges: str = "none") -> RingLoads:
    """The rings' share of :func:`predict` per rank (:class:`RingLoads`): plain rings by :func:`ring_time` on
    their routes, head-parallel ones by :func:`~.cost_heads.head_ring_time` (a ring in parts,
    :mod:`.ring_parts`, timed once by :func:`~.ring_parts.parts_time` on its first part). Example: a plan
    without rings gives zeros on every rank."""
    cl = cost.cluster
    world = plan.world_size
    ring_total = [0.0] * world
    ring_own = [0.0] * world
    intra_b = [0.0] * world
    inter_b = [0.0] * world
    fixed = [0.0] * world  # head-parallel all-to-alls, relay waits: neither kernel time nor a wait local work fills
    relays = [0.0] * world  # relay waits alone
    # ring parts (ring_parts.py): head-parallel rings over the same ranks at the same width, in queue order
    parts: dict[tuple[tuple[int, ...], int], list[list[int]]] = {}
    for ring in plan.rings:
        if ring.a2a > 1:
            parts.setdefault((ring.ranks, ring.a2a), []).append([plan.sequences[i].length for i in ring.seqs])
    seen: set[tuple[tuple[int, ...], int]] = set()
    for ring in plan.rings:
        g = len(ring.ranks)
        lengths = [plan.sequences[i].length for i in ring.seqs]
        if ring.a2a > 1:
            h = head_ring_time(cost, ring.ranks, lengths, ring.a2a, charges)
            family = parts[(ring.ranks, ring.a2a)]
            if (ring.ranks, ring.a2a) in seen:  # a later part: timed with the first, bytes only
                total = own = a2a_ms = 0.0
            else:  # the first part (or the ring whole) carries the parts' timeline and all their own time
                seen.add((ring.ranks, ring.a2a))
                total, own, a2a_ms = family_time(cost, ring.ranks, family, ring.a2a, charges)
            m = ring.blocks
            for p, src in enumerate(ring.ranks):
                b, lane = divmod(p, ring.a2a)
                dst = ring.ranks[next_position(b, m) * ring.a2a + lane]
                side = intra_b if cl.node_of(src) == cl.node_of(dst) else inter_b
                side[src] += (m - 1) * h.lane_bytes
                intra_b[src] += h.a2a_bytes
                ring_total[src] += total
                ring_own[src] += own + a2a_ms
                fixed[src] += a2a_ms
            continue
        routes = plan.routes_for(ring.ranks)
        total, own, nbytes, relay = ring_time(cost, ring.ranks, lengths, routes, charges)
        for p, src in enumerate(ring.ranks):
            side = intra_b if cl.node_of(src) == cl.node_of(ring.ranks[next_position(p, g)]) else inter_b
            side[src] += (g - 1) * nbytes
        for r in ring.ranks:
            ring_total[r] += total
            ring_own[r] += own
        # a relay waits for the ring's transfers and runs nothing meanwhile: no local work fills it
        for r in outside_relays(ring.ranks, routes.values(), plan.gpus_per_node):
            ring_total[r] += relay
            ring_own[r] += relay
            fixed[r] += relay
            relays[r] += relay

    return RingLoads(ring_total, ring_own, fixed, intra_b, inter_b, relays)


def copied_ranks(plan: StepPlan) -> set[int] | None:
    """The ranks whose local sequences pay the engine's row copies around their call under the ``zeppelin``
    charges (:func:`~.engine_ring.local_copy_ms_per_token`), or ``None`` for every rank: with a remap all of
    them; without one (identical layouts) only a ring's members and relays, since a rank in no ring runs its
    local sequences as one call on its buffers (:attr:`~.lowering.RankProgram.whole_chunk`)."""
    if plan.linear_layout != plan.attention_layout:
        return None
    return {r for k in range(len(plan.rings)) for r in participants(plan, k, True)}


def remap_time(
    plan: StepPlan, cost: CostModel, proxies: Sequence[int]
) -> tuple[float, list[int], list[int]]:
    """The remap's per-layer time with ``proxies`` (``()``: direct), and each rank's NVLink and network
    bytes (module docstring). A plan without a remap (linear layout = attention layout) costs 0."""
    per_token = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    tokens_intra, tokens_out, tokens_into = plan.remap_traffic
    intra = [t * per_token for t in tokens_intra]
    out = [t * per_token for t in tokens_out]  # network bytes a rank sends / receives
    into = [t * per_token for t in tokens_into]
    inter = [a + b for a, b in zip(out, into)]
    return remap_layer_ms(plan, cost, proxies), intra, inter


class RingTime(NamedTuple):
    """One plain ring's per-layer times (:func:`ring_time`): ``total`` (what each member pays), ``own`` (its
    kernels and copies), ``wire_bytes`` (what one hop moves per step) and ``relay_wait`` (what a relay of its
    routed hops, a proxy GPU outside the ring, waits in its program: :func:`ring_time`)."""

    total: float
    own: float
    wire_bytes: int
    relay_wait: float


def ring_time(
    cost: CostModel, ranks: Sequence[int], lengths: Sequence[int], routes: Mapping[tuple[int, int], Route],
    charges: str = "none",
) -> RingTime:
    """One ring's per-layer times (:class:`RingTime`): total, own kernel and copy time, bytes one hop moves per
    step, and a relay's wait.

    ``lengths``: the sequences sharing the ring (one call per step for all of
    them); ``routes``: the routed cross-node hops by ``(src, dst)`` (a hop
    without a route goes over the source's own NIC); ``charges``: the engine's
    charge model (:mod:`.engine_ring`; the default ``none`` is the rule the partitioner and the
    block-width choice score with: charging them made simulated steps slower, up to 5% on 13B
    arxiv-64k at 128 GPUs, docs/planner.md). Every member pays
    ``total = diag + (g-1) * max(off, comm) + first_late``, its own time is
    ``diag + (g-1) * off + first_late`` (:func:`~.engine_ring.ring_steps`: each step at
    least the call overhead, plus its copies). Example: one sequence alone on a
    ring under ``charges="none"`` is :meth:`CostModel.ring_ms` when each hop has the same proxies.

    A relay (:attr:`~.routing.RoutePart.relays`) waits for the ring's transfers one after the other and runs
    nothing of its own meanwhile (its program's relay waits, :mod:`.lowering`): transfer ``j`` leaves when the
    members start step ``j`` (step 1 once the diagonal block and the first transfer are done, each later step
    ``max(off, comm)`` after), so the last, ``g - 2``, arrives ``relay_wait = max(diag, comm) + (g - 3) *
    max(off, comm) + comm`` after the ring starts (``comm`` for ``g = 2``). Example (Llama-7B on 2 x 4 H100s,
    zeppelin charges, 65536 tokens over ranks 0, 1, 4, 5, both cross hops routed over two proxies: diag 26.9 ms,
    off 25.5, comm 13.1): ``relay_wait = 26.9 + 25.5 + 13.1 = 65.5`` ms a layer; simulated, the relay waits
    from the ring's start to 64.9 ms after it.
    """
    cl = cost.cluster
    g = len(ranks)
    st = ring_steps(cost, lengths, g, charges=charges)
    nbytes = st.wire_bytes
    comm = 0.0
    for p, src in enumerate(ranks):
        dst = ranks[next_position(p, g)]
        if cl.node_of(src) == cl.node_of(dst):
            comm = max(comm, cost.nvlink_ms(nbytes))
        else:
            route = routes.get((src, dst))
            comm = max(comm, cost.routed_ms(nbytes, len(route.proxies) if route else 1))
    total = st.diag + (g - 1) * max(st.off, comm) + st.first_late
    own = st.diag + (g - 1) * st.off + st.first_late
    relay = comm if g == 2 else max(st.diag, comm) + (g - 3) * max(st.off, comm) + comm
    return RingTime(total, own, nbytes, relay)


def rank_attention(
    ring_total: Sequence[float], ring_own: Sequence[float], local: Sequence[float], overhead_ms: float
) -> tuple[list[float], list[float]]:
    """Per-rank ``(attention time, own kernel time)`` of one layer.

    ``ring_total``/``ring_own``: each rank's summed :func:`ring_time` totals and
    own times; ``local``: its summed whole-sequence kernel times (run in one
    call, at least ``overhead_ms`` when non-empty), which fill its ring waits:
    ``attn = ring_total + max(0, local - (ring_total - ring_own))``.
    """
    attn, own = [], []
    for tot, mine, loc in zip(ring_total, ring_own, local):
        loc = max(loc, overhead_ms) if loc > 0 else 0.0
        attn.append(tot + max(0.0, loc - (tot - mine)))
        own.append(mine + loc)
    return attn, own


def _round(value: float) -> float:
    """``value`` to the nearest multiple of ``1 / _SCALE`` (1e-6 ms): one multiply, an integer round and a
    divide, about 5x faster than ``round(value, 6)``'s correctly rounded decimal (a prediction is rounded for
    stable plan documents, and ``predict`` rounds seven per-rank lists a call, about half its time that way).
    Deterministic (IEEE arithmetic, the same on every rank); it can differ from ``round(value, 6)`` in the last
    bit where ``value * 1e6`` is inexact at a half (2 in 10^6 random values). Example: ``_round(1.23456789)``
    -> ``1.234568``."""
    return round(value * _SCALE) / _SCALE


def _r(values: list[float]) -> tuple[float, ...]:
    return tuple([round(v * _SCALE) / _SCALE for v in values])


def attention_time(prediction: Prediction) -> list[float]:
    """Per-rank attention time of a step: kernel compute plus ring waits not hidden."""
    return [a + e for a, e in zip(prediction.attention_ms, prediction.exposed_comm_ms)]

