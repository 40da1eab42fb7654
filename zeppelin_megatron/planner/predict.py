"""Predicted step time of a plan from the cost model (the engine's model, per layer).

Per layer, forward + backward, for each rank ``r``:

* Each ring (queue order: inter-node rings, then intra-node rings) runs ``g``
  steps. Step 0 is the diagonal call; steps ``1 .. g-1`` each overlap one
  off-diagonal call with the next K/V transfer. All sequences of a ring share
  one call per step; a call costs at least the profile's per-call overhead::

      ring_ms = max(diag, o) + (g - 1) * max(off, o, comm)

  where ``diag``/``off`` are the slowest member's kernel times (zigzag makes
  them equal up to one token) and ``comm`` the slowest hop: NVLink inside a
  node, the network across nodes, over the route's proxies when routed.
* The rank's own kernel time in a ring is ``max(diag, o) + (g-1) * max(off, o)``;
  the rest is waiting. Local sequences run in one call after the rings, and
  fill waiting time (the engine's local queue hides ring communication)::

      attn_r = sum(ring_ms) + max(0, local_r - sum(wait))

* Linear modules: ``linear_ms(tokens in the linear layout)``.
* Remap: four all-to-alls a layer (q/k/v in, output back, and their
  gradients); per token moved, each side sends ``2 * q_bytes + kv_bytes``.
  A rank's time is its NVLink bytes over NVLink bandwidth plus its network
  bytes over its NIC's share; the all-to-all finishes with the slowest rank.

Step time: ``layers * (max_r attn_r + max_r linear_r + remap)``; each rank's
``rank_ms = layers * (attn_r + linear_r + remap)``.
"""

from __future__ import annotations

from .cost_model import CostModel
from .plan import Prediction, StepPlan

__all__ = ["predict", "attention_time"]

_ROUND = 6


def predict(plan: StepPlan, cost: CostModel) -> Prediction:
    cl = cost.cluster
    world = plan.world_size
    layers = cost.model.layers
    o = cost.call_overhead_ms
    kvb = cost.kv_bytes_per_token
    ring_total = [0.0] * world
    ring_own = [0.0] * world
    intra_b = [0.0] * world
    inter_b = [0.0] * world
    for ring in plan.rings:
        g = len(ring.ranks)
        lengths = [plan.sequences[i].length for i in ring.seqs]
        diag = off = 0.0
        step_bytes = 0
        for s in lengths:
            d, f = cost.ring_compute_profile(s, g)
            diag += d
            off += f
            step_bytes += cost.ring_step_bytes(s, g)
        routes = plan.routes_for(ring.ranks)
        comm = 0.0
        for p, src in enumerate(ring.ranks):
            dst = ring.ranks[(p + 1) % g]
            nbytes = 3 * step_bytes
            if cl.node_of(src) == cl.node_of(dst):
                comm = max(comm, cost.nvlink_ms(nbytes))
                intra_b[src] += (g - 1) * nbytes
            else:
                route = routes.get((src, dst))
                comm = max(comm, cost.routed_ms(nbytes, len(route.proxies) if route else 1))
                inter_b[src] += (g - 1) * nbytes
        total = max(diag, o) + (g - 1) * max(off, o, comm)
        own = max(diag, o) + (g - 1) * max(off, o)
        for r in ring.ranks:
            ring_total[r] += total
            ring_own[r] += own

    local = [0.0] * world
    for i, s in enumerate(plan.sequences):
        if s.placement == "local":
            local[s.ranks[0]] += cost.local_ms(s.length)
    local = [max(t, o) if t > 0 else 0.0 for t in local]

    attn = [0.0] * world
    own_compute = [0.0] * world
    for r in range(world):
        wait = ring_total[r] - ring_own[r]
        attn[r] = ring_total[r] + max(0.0, local[r] - wait)
        own_compute[r] = ring_own[r] + local[r]
    linear = [cost.linear_ms(plan.tokens(r, "linear")) for r in range(world)]

    # Remap: bytes each rank sends, per direction of a token's move.
    per_token = 2 * cost.q_bytes_per_token + kvb
    remap_intra = [0.0] * world
    remap_inter = [0.0] * world
    for seg in plan.remap.segments:
        a, b = seg.lin_rank, seg.att_rank
        if a == b:
            continue
        target = remap_intra if cl.node_of(a) == cl.node_of(b) else remap_inter
        target[a] += seg.length * per_token
        target[b] += seg.length * per_token
    remap = 0.0
    for r in range(world):
        nic_share = cl.gpus_sharing_nic(cl.nic_of(r))
        t = cost.nvlink_ms(remap_intra[r]) + cost.nic_ms(remap_inter[r] * nic_share)
        remap = max(remap, t)
        intra_b[r] += remap_intra[r]
        inter_b[r] += remap_inter[r]

    step = layers * (max(attn) + max(linear) + remap)
    rank_ms = [layers * (attn[r] + linear[r] + remap) for r in range(world)]
    exposed = [layers * (attn[r] - own_compute[r]) for r in range(world)]
    return Prediction(
        step_ms=round(step, _ROUND),
        rank_ms=_r(rank_ms),
        attention_ms=_r([layers * t for t in own_compute]),
        linear_ms=_r([layers * t for t in linear]),
        exposed_comm_ms=_r(exposed),
        remap_ms=round(layers * remap, _ROUND),
        intra_MB=_r([layers * b / 1e6 for b in intra_b]),
        inter_MB=_r([layers * b / 1e6 for b in inter_b]),
    )


def _r(values: list[float]) -> tuple[float, ...]:
    return tuple(round(v, _ROUND) for v in values)


def attention_time(prediction: Prediction) -> list[float]:
    """Per-rank attention time of a step: kernel compute plus ring waits not hidden."""
    return [a + e for a, e in zip(prediction.attention_ms, prediction.exposed_comm_ms)]
