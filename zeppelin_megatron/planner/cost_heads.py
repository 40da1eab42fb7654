"""Cost of a head-parallel ring (:mod:`.head_parallel`): all-to-alls over heads, a ring over blocks.

Conventions of :meth:`~.cost_model.CostModel.ring_ms`: milliseconds per layer,
forward + backward merged, every kernel call at least the profile's call
overhead ``o``, a transfer ``bytes / bandwidth + latency``. A ring of ``G``
ranks run head-parallel at block width ``a`` has ``m = G / a`` blocks; lane
``l`` of block ``b`` is ring position ``b a + l`` and computes ``hq / a`` of
the rank's ``hq`` query heads (per tensor-parallel rank). Per member::

    total = heads + max(diag, o) + (m - 1) * max(off, o, comm) + tokens

* ``heads`` / ``tokens``: the two all-to-alls inside each block (NVLink). A
  lane sends each of the ``a - 1`` other lanes of its block the rows it holds,
  restricted to the receiver's head slice; per token and peer, ``heads``
  carries forward ``q`` (``hq/a`` heads), ``k`` and ``v`` (``lane_kv_heads``
  each) and backward ``dout`` (``hq/a``), in the training dtype; ``tokens``
  carries forward ``out`` (``hq/a``, training dtype) and backward ``dq``,
  ``dk``, ``dv`` in the accumulator dtype (fp32: ``max(4, dtype)`` bytes).
  Forward and backward are merged into one transfer each (one latency, as a
  ring step is). A rank holds at most ``ceil(s / G)`` tokens of each sequence
  (:func:`~.zigzag.ring_max_tokens`); its time is ``nvlink_ms((a - 1) *
  held * bytes per token)``: its NVLink egress (and ingress) carries all of it.
* ``diag`` / ``off``: the lane's kernels, :meth:`~.cost_model.CostModel.ring_compute_profile`
  at block granularity (``m`` positions) divided by ``a`` (kernel time
  scales with query heads), summed over the ring's sequences (one call per
  step). ``m = 1`` (Ulysses): one causal call over whole sequences.
* ``comm``: one lane ring step, ``3 * ring_chunk_pair_tokens(s, m) * 2 *
  lane_kv_heads * D * dtype`` bytes per lane hop (forward K/V, backward K/V
  and dK/dV, as :meth:`~.cost_model.CostModel.ring_step_comm_ms`); lane ``l``
  of block ``b`` sends to lane ``l`` of block ``b + 1`` over NVLink when both
  are in one node, else over its own GPU's NIC (``cluster.gpu_nic``), which
  the block's lanes on the same NIC share (never routed); the slowest hop.

Worked example (Llama-7B: 32 query and 32 K/V heads of 128, bf16; one node of
8 GPUs, NVLink 450 GB/s, 5 us): one sequence of 8192 tokens on ranks 0-7 at
``a = 8`` (Ulysses, ``m = 1``): each rank holds 1024 tokens; ``heads`` sends 7
peers ``1024 * (4 + 8 + 4) * 128 * 2`` bytes each, 29.4 MB in all, in two
messages a peer (the rank's two zigzag chunks land apart in the head buffer,
:func:`~.head_parallel.lane_runs`), 0.075 ms (5 us a message); ``tokens`` as
many (forward out, backward dq, dk, dv in bf16: one call's gradients are final),
0.075 ms; the kernel is ``causal_ms(8192) / 8``.

Pure, standard library only.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .cost_model import CostModel
from .engine_costs import a2a_token_bytes, hbm_ms, shape_of, zeppelin_a2a_bytes
from .engine_ring import ring_steps
from .head_parallel import head_split_error, lane_kv_heads, lanes_share_kv
from .peer_costs import te_a2a_bytes
from .zigzag import next_position, ring_chunk_pair_tokens, ring_max_tokens

__all__ = ["HeadRingTime", "head_ring_time", "head_widths", "lane_hops", "a2a_bytes_per_token",
           "lane_kv_bytes_per_token", "kv_heads_per_rank"]


def kv_heads_per_rank(cost: CostModel) -> int:
    """K/V heads on one Zeppelin rank (one tensor-parallel rank): ``kv_heads / tp``."""
    return cost.model.kv_heads // cost.tensor_parallel


def lane_kv_bytes_per_token(cost: CostModel, a2a: int) -> int:
    """K and V bytes of one token in one lane's head slice: ``2 * lane_kv_heads * D * dtype``.

    Example: Llama-7B (32 K/V heads, ``D = 128``, bf16), ``a2a = 4``: ``2 * 8 * 128 * 2 = 4096``.
    """
    return 2 * lane_kv_heads(kv_heads_per_rank(cost), a2a) * cost.model.head_dim * cost.profile.dtype_bytes


def a2a_bytes_per_token(cost: CostModel, a2a: int, blocks: int = 2) -> tuple[int, int]:
    """``(heads, tokens)``: bytes per token one lane sends one peer lane in each all-to-all, forward +
    backward (module docstring): :func:`~.engine_costs.a2a_token_bytes` at the lane's shape (the backward
    ``tokens`` gradients in the training dtype, in the accumulator dtype only on a ring of several ``blocks``
    whose lanes share K/V heads, :func:`~.head_parallel.lanes_share_kv`).

    Example: Llama-7B (32 / 32 heads of 128, bf16), ``a2a = 8``: heads ``(4 + 2 * 4 + 4) * 128 * 2 =
    4096``; tokens ``4 * 128 * 2 + (4 + 2 * 4) * 128 * 2 = 4096``; 32 / 4 heads (GQA), several blocks:
    tokens ``4 * 128 * 2 + (4 + 2 * 1) * 128 * 4 = 4096``.
    """
    key = ("a2a_bytes_per_token", a2a, blocks > 1)
    hit = cost._cache.get(key)
    if hit is None:  # memoised: every head-parallel ring time asks
        hit = cost._cache[key] = a2a_token_bytes(shape_of(cost, a2a), "zeppelin", blocks,
                                                 lanes_share_kv(kv_heads_per_rank(cost), a2a))
    return hit  # type: ignore[no-any-return]


def head_widths(cost: CostModel, ranks: Sequence[int]) -> tuple[int, ...]:
    """Block widths ``a >= 2`` a ring over ``ranks`` (ring order) may run head-parallel at: ``a`` divides
    ``len(ranks)``, every block of ``a`` consecutive ranks lies in one node, and the rank's heads split
    over ``a`` lanes (:func:`~.head_parallel.head_split_error`). Ascending.

    Example: 32 / 8 heads, ranks ``(0, 1, 2, 3)`` of one node: ``(2, 4)``; ranks ``(6, 7, 8, 9)`` on
    nodes of 8: ``(2,)`` (a block of 4 would span two nodes); 12 / 4 heads, 8 ranks: ``(2, 4)``.
    """
    key = ("head_widths", tuple(ranks))
    hit = cost._cache.get(key)
    if hit is not None:  # memoised: every ring time asks, and plans repeat rings
        return hit  # type: ignore[no-any-return]
    cl = cost.cluster
    g = len(ranks)
    hq, hkv = cost.heads, kv_heads_per_rank(cost)
    nodes = [cl.node_of(r) for r in ranks]
    out = []
    for a in range(2, g + 1):
        if g % a or head_split_error(hq, hkv, a) is not None:
            continue
        if all(len(set(nodes[b * a:(b + 1) * a])) == 1 for b in range(g // a)):
            out.append(a)
    cost._cache[key] = widths = tuple(out)
    return widths


class HeadRingTime(NamedTuple):  # a NamedTuple: made on every head-parallel ring priced (see RingSteps)
    """One head-parallel ring's per-layer times (ms) and bytes, per member (module docstring).

    ``total``: what every member spends in the ring; ``own``: its kernel time
    ``max(diag, o) + (m - 1) * max(off, o)``; ``a2a_ms``: the two all-to-alls
    (``heads_ms + tokens_ms``, not hidden by anything); ``step_comm_ms``: the
    slowest lane hop of one step; ``a2a_bytes``: what a rank sends in both
    all-to-alls (NVLink); ``lane_bytes``: what one lane hop moves per step
    (``m - 1`` steps); ``copy_ms``: the engine's device-memory copies included in ``own`` (steps and
    all-to-alls; 0 under ``charges="none"``). ``diag`` / ``off``: the lane's kernels under ``none``; under
    ``zeppelin`` the charged steps of :func:`~.engine_ring.ring_steps` (at least ``o``, copies included),
    so ``own = copy of the all-to-alls + diag + (m - 1) * off + first late call``.
    """

    total: float
    own: float
    diag: float
    off: float
    a2a_ms: float
    heads_ms: float
    tokens_ms: float
    step_comm_ms: float
    a2a_bytes: float
    lane_bytes: float
    copy_ms: float = 0.0


def head_ring_time(cost: CostModel, ranks: Sequence[int], lengths: Sequence[int], a2a: int,
                   charges: str = "none") -> HeadRingTime:
    """Times of sequences ``lengths`` sharing a ring over ``ranks`` run head-parallel at width ``a2a``.

    ``charges``: the engine's charge model (:mod:`.engine_ring`; ``none``, the default, is the rule the
    local schedule uses; the block-width choice passes :data:`~.choose_heads.CHOICE_CHARGES`,
    :func:`~.predict.predict` passes ``zeppelin``): under
    ``zeppelin`` the lane's steps carry their merges and row copies and the fp32 dK/dV on the wire
    (:func:`~.engine_ring.ring_steps` at ``m`` blocks), and every member copies around the two all-to-alls
    (:func:`~.engine_costs.zeppelin_a2a_bytes` of the ``held`` tokens and its block's rows), both in
    ``own`` and ``total`` (``copy_ms``); under ``te`` TE's steps and all-to-all permutes instead
    (:func:`~.peer_costs.te_a2a_bytes`, as the simulator charges them). Raises ``ValueError`` when ``a2a``
    is not one of :func:`head_widths` (the message names the limit). Memoised in the cost model's cache (plans
    repeat rings).
    """
    key = ("hring", tuple(ranks), tuple(lengths), a2a, charges)
    hit = cost._cache.get(key)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    g = len(ranks)
    if a2a < 2 or a2a not in head_widths(cost, ranks):
        raise ValueError(f"block width {a2a} is not allowed for a ring of {g} ranks {list(ranks)[:8]}: allowed "
                         f"{list(head_widths(cost, ranks))} (divides the ring, blocks inside one node, heads "
                         f"{cost.heads}/{kv_heads_per_rank(cost)} split)")
    m = g // a2a
    st = ring_steps(cost, lengths, m, a2a=a2a, charges=charges)
    held = sum(ring_max_tokens(s, g) for s in lengths)
    block = sum(ring_chunk_pair_tokens(s, m) for s in lengths)  # rows of a member's head buffer
    heads_b, tokens_b = a2a_bytes_per_token(cost, a2a, m)
    # a pair's messages, one per run of a lane's tokens (head_parallel.lane_runs), each pay the latency (nvlink_ms
    # counts one): two runs per sequence for a middle lane; a = 2: one per sequence and one more (lane 0's late and
    # the next sequence's early chunk meet, lane 1's two chunks meet); fewer where short sequences leave chunks empty
    extra = (2 * len(lengths) - 1 if a2a > 2 else len(lengths)) * cost.cluster.nvlink_latency_us * 1e-3
    heads_ms = cost.nvlink_ms((a2a - 1) * held * heads_b) + extra
    tokens_ms = cost.nvlink_ms((a2a - 1) * held * tokens_b) + extra
    lane_bytes = st.wire_bytes
    comm = _lane_comm_ms(cost, ranks, a2a, lane_bytes) if m > 1 else 0.0
    # plan_step's layouts give every ring contiguous rows (api.engine_order), so the all-to-alls' copies are priced
    # so; a plain ring's gathers are still priced on the gathered path (engine_ring.ring_steps: about 0.3 ms more
    # per ring of 8192 rows a rank on Llama-7B, a small bias toward head-parallel widths in choose_widths)
    a2a_copy = 0.0
    if charges == "zeppelin":
        per_own, per_row = _a2a_copy_rates(cost, a2a, m)
        a2a_copy = hbm_ms(cost, per_own * held + per_row * block)
    elif charges == "te":
        a2a_copy = hbm_ms(cost, sum(te_a2a_bytes(shape_of(cost), a2a, held, block).values()))
    own = a2a_copy + st.diag + (m - 1) * st.off + st.first_late
    a2a_ms = heads_ms + tokens_ms
    total = a2a_ms + a2a_copy + st.diag + (m - 1) * max(st.off, comm) + st.first_late
    diag, off = st.diag, st.off  # charged steps (at least o)
    if charges == "none":  # the lane's bare kernels, as this rule always reported them
        diag = sum(cost.ring_compute_profile(s, m)[0] for s in lengths) / a2a
        off = sum(cost.ring_compute_profile(s, m)[1] for s in lengths) / a2a
    hit = HeadRingTime(total=total, own=own, diag=diag, off=off, a2a_ms=a2a_ms, heads_ms=heads_ms,
                       tokens_ms=tokens_ms, step_comm_ms=comm, a2a_bytes=(a2a - 1) * held * (heads_b + tokens_b),
                       lane_bytes=float(lane_bytes), copy_ms=a2a_copy + st.copy_ms)
    cost._cache[key] = hit
    return hit


def _a2a_copy_rates(cost: CostModel, a2a: int, blocks: int) -> tuple[float, float]:
    """:func:`~.engine_costs.zeppelin_a2a_bytes` (contiguous rows) per held token and per head-buffer row: each of
    its terms is one of the two counts times a size, so a member's copies are ``held * x + block * y`` exactly
    (integers, in floats). Memoised per width and whether the ring has one block (all the bytes depend on)."""
    key = ("a2a_copy_rates", a2a, blocks == 1)
    hit = cost._cache.get(key)
    if hit is None:
        sh = shape_of(cost)
        hit = cost._cache[key] = tuple(sum(zeppelin_a2a_bytes(sh, a2a, n, rows, contiguous=True, blocks=blocks)
                                           .values()) for n, rows in ((1, 0), (0, 1)))
    return hit  # type: ignore[no-any-return]


def lane_hops(cost: CostModel, ranks: Sequence[int], a2a: int, nbytes: float) -> list[tuple[int, int, float]]:
    """``(p, q, ms)`` of every lane hop of one step, by ring position: lane ``l`` of block ``b``
    (``p = b a + l``) to lane ``l`` of block ``b + 1`` (``q``). Example: 4 ranks, ``a = 2``: hops
    ``0 -> 2``, ``1 -> 3``, ``2 -> 0``, ``3 -> 1``. NVLink inside a node, else the source GPU's NIC,
    shared by the lanes of its block on that NIC (and the destination's, by the next block's lanes on
    it): ``nic_ms(nbytes * sharing)``."""
    cl = cost.cluster
    m = len(ranks) // a2a
    share = _lane_shares(cost, ranks, a2a)
    out = []
    for p, src in enumerate(ranks):
        b, l = divmod(p, a2a)
        q = next_position(b, m) * a2a + l
        dst = ranks[q]
        if cl.node_of(src) == cl.node_of(dst):
            out.append((p, q, cost.nvlink_ms(nbytes)))
        else:
            out.append((p, q, cost.nic_ms(nbytes * max(share[p], share[q]))))
    return out


def _lane_comm_ms(cost: CostModel, ranks: Sequence[int], a2a: int, nbytes: float) -> float:
    """The slowest of :func:`lane_hops`' times, from the ring's hop shape alone: whether a hop stays in a node,
    and the largest NIC sharing of one that leaves it (memoised per ``(ranks, a2a)``, or per ``(len(ranks), a2a)``
    for consecutive ranks from a node's first GPU, whose shape does not depend on which node; both link times grow with
    the bytes, so the slowest hop is one of those two whatever ``nbytes``; the same values as the maximum over
    every hop)."""
    g, first = len(ranks), ranks[0]
    # consecutive from a node's first GPU: a packing's group
    aligned = first % cost.cluster.gpus_per_node == 0 and tuple(ranks) == tuple(range(first, first + g))
    key = ("lane_shape_aligned", g, a2a) if aligned else ("lane_shape", tuple(ranks), a2a)
    shape = cost._cache.get(key)
    if shape is None:
        cost._cache[key] = shape = _lane_shape(cost, ranks, a2a)
    intra, share = shape  # type: ignore[misc]
    return max(cost.nvlink_ms(nbytes) if intra else 0.0, cost.nic_ms(nbytes * share) if share else 0.0)


def _lane_shares(cost: CostModel, ranks: Sequence[int], a2a: int) -> list[int]:
    """Per ring position ``p``, how many lanes of its block share ``p``'s NIC. Example: 8 ranks of one node
    with a NIC per GPU, ``a = 4``: ``[1] * 8``; two GPUs per NIC: ``[2] * 8``."""
    cl = cost.cluster
    nics = [cl.nic_of(r) for r in ranks]
    share = [0] * len(ranks)
    for b in range(len(ranks) // a2a):
        block = nics[b * a2a:(b + 1) * a2a]
        for l, n in enumerate(block):
            share[b * a2a + l] = block.count(n)
    return share


def _lane_shape(cost: CostModel, ranks: Sequence[int], a2a: int) -> tuple[bool, int]:
    """Over :func:`lane_hops`' hops: whether one stays inside a node, and the largest ``max(share[p], share[q])``
    of one that leaves it (0 without one): all a hop's time depends on besides the bytes."""
    cl = cost.cluster
    m = len(ranks) // a2a
    share = _lane_shares(cost, ranks, a2a)
    intra, out = False, 0
    for p, src in enumerate(ranks):
        b, l = divmod(p, a2a)
        q = next_position(b, m) * a2a + l
        if cl.node_of(src) == cl.node_of(ranks[q]):
            intra = True
        else:
            out = max(out, share[p], share[q])
    return intra, out
