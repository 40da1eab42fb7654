"""Device-memory work of the attention engines, in bytes: the elementwise passes and row copies besides the kernels.

One derivation for the simulator (:mod:`zeppelin_megatron.sim.charges` re-exports these functions and charges them op
by op) and the planner (:mod:`.engine_ring` prices a ring's steps with them; :func:`~.predict.predict` charges the
remap's and the local calls' copies). Pure: numpy and the planner's own modules.

Every charge is ``bytes / hbm_GBps`` (:attr:`~zeppelin_megatron.planner.profile.CostProfile.hbm_GBps`,
bytes read + bytes written per second; 2951.7 GB/s measured for the bundled H100 profile). Elementwise
kernel launches are counted in the docstrings but not charged: the profile has no figure for them (its
``call_overhead_ms`` is one attention call through autograd), and a few-microsecond launch overlaps the
GPU work already queued.

Notation: ``b`` = bytes of the training dtype (2 for bf16), ``a`` = bytes of the accumulation dtype
(``acc_dtype``: 4, 8 for float64); per token ``Eq = Hq * D`` query elements, ``Ekv = 2 * Hkv * D``
packed K/V elements, ``Hq`` log-sum-exp values (heads after tensor parallelism). All charges are
forward + backward of one layer, as the cost model's kernel times are.

**Zeppelin's engine** (counted from ``runtime/ring.py``, ``runtime/engine.py``, ``runtime/remap.py``,
``runtime/attention.py``; :func:`zeppelin_call_bytes`, :func:`zeppelin_ring_bytes`,
:func:`zeppelin_local_bytes`, :func:`zeppelin_remap_bytes`):

* ``merge_lse_`` (in place, ``ring.py``) after every ring call but the diagonal, over the call's ``T``
  query rows. Charged as the fused pass (``runtime/kernels/fused_merge.py``), which the engine takes only
  with Triton importable, on CUDA, with fp32 accumulators (``a = 4``): it reads ``out`` (``a``), ``out_b``
  (``b``), ``lse``, ``lse_b`` and writes ``out``, ``lse`` once: ``T Eq (2a + b) + 3 a T Hq`` bytes (10 B per
  output element and 12 per lse value in bf16), 1 launch. That kernel was checked with the Triton
  interpreter on CPU tensors and compiled for sm_90, never run or timed on a GPU: the charge is its bytes at
  the profile's copy bandwidth, not a measurement. Otherwise (``fused=False``, or ``a != 4``) the torch
  path: ``lse_b - lse`` (r 2, w 1) and ``sigmoid_`` (r 1, w 1) over ``T Hq`` values of ``a`` bytes,
  ``logaddexp(..., out=lse)`` (r 2, w 1), ``out_b.to(fp32)`` (r ``b``, w ``a``; only when ``b != a``), then
  ``out.lerp_(out_b, w)`` (r ``2a``, w ``a`` per ``T Eq``, plus the broadcast ``w``):
  ``T Eq (3a + [a + b]) + 9 a T Hq`` bytes (18 B per output element and 36 per lse value in bf16; was
  34 and 60 with the out-of-place merge), 5 launches (4 without the cast). ``late`` calls (late rows
  only) merge into a held copy of those rows (``RingState.held``): the ring's first ``late`` call
  gathers the ``q``, ``out`` and ``lse`` rows (``T (2b Eq + 2a Eq + 2a Hq)``) and ``ring.finish`` writes
  ``out``, ``lse`` back once at the ring's end (``T (2a Eq + 2a Hq)``), 5 launches per ring (before:
  ``out``/``lse`` gathered and written back and ``q`` gathered at every ``late`` call).
* per call: the held K/V rows (``early``: ``2 b Tk Ekv``) by ``index_select``; backward: the kernel's
  ``lse.transpose(0, 1).float().contiguous()`` (``2 a Tq Hq``),
  ``dq += dq_b`` (``Tq Eq (2a + b)``; ``late``: ``.to`` + ``index_add_``, ``Tq Eq (4a + b)``), the dK/dV
  block added per half by ``add_block`` (no ``cat``): the diagonal's block becomes the accumulator
  (``copy_``, ``Tk Ekv (a + b)``), a block over all held rows is added in place (``acc[:, :Hkv] += dk``,
  ``Tk Ekv (2a + b)``), an ``early`` block over some rows is cast and ``index_add_`` -ed
  (``Tk Ekv (b + 4a)``); the held K/V rows
  again for ``early``, ``(dout, q, out, lse)`` rows at the ring's first ``late`` call (``2 Tq (3b Eq + a
  Hq)``, cached per index tensor after that); the diagonal call's ``o.to(fp32)`` (``Tq Eq (a + b)``).
* per ring (``n`` ring rows of the rank): forward ``q`` rows and ``k``, ``v`` rows gathered straight into
  the packed K/V buffer (``engine._ring_kv``, no ``cat``: ``2 b n (Eq + Ekv)``), the result ``.to(dtype)``
  and ``index_copy_`` (``n Eq (a + 3b)``); backward ``q``, ``dout``, ``k``, ``v`` gathers
  (``2 b n (2 Eq + Ekv)``), ``dq`` zeros (``a n Eq``; the accumulator starts as the diagonal's block),
  the final ``dq``/``dk``/``dv`` ``.to`` + ``index_copy_`` (``n (Eq + Ekv)(a + 3b)``). When the ring rows
  are one contiguous range of the attention buffer (``RingPart.span``, what ``plan_step`` writes:
  ``api.engine_order``), ``q`` and ``dout`` are ``narrow`` views and the results are cast straight into
  their slices: ``2 b n Ekv + n Eq (a + b)`` forward, ``2 b n Ekv + a n Eq + n (Eq + Ekv)(a + b)`` backward
  (the packed K/V buffer is what the ring sends: a copy on both paths).
* per local call of ``T`` tokens: forward ``q``, ``k``, ``v`` gathers and ``out.index_copy_``
  (``2 b T (Eq + Ekv) + 2 b T Eq``); backward ``dout``, ``q``, ``k``, ``v`` gathers and three
  ``index_copy_`` (``2 b T (2 Eq + Ekv) + 2 b T (Eq + Ekv)``). Rows in one range (``LocalChunk.span``):
  views instead of the gathers, slice copies instead of the ``index_copy_`` (the same bytes; an in-place
  chunk: its ``linear_span``, on the linear buffers):
  ``2 b T Eq + 2 b T (Eq + Ekv)``.
* the layer's remap: four ``remap_parts`` (``runtime/remap.py``: ``q``, ``k``, ``v`` in as one packed
  buffer, out back, and both again in backward), each one ``index_select`` per part of the rows that
  *move* (change rank) straight into its column slice of the send buffer (``2 b F' S``, ``S`` moving
  source rows, ``F' = Eq + Ekv`` for q/k/v, ``Eq`` for out; no ``cat``) and the destination gathered per
  part from the buffer(s) its rows arrived in and, for the rows that stay on the rank (never sent), from
  the source tensor itself (no split copies; counted per rank from the plan the runtime reads,
  :func:`remap_gathers` / ``remap_staging.rank_staging``: ``2 b F_i`` per row read by one
  ``index_select``, ``4 b F_i`` per row of an ``index_select`` + ``index_copy_`` when rows come from
  several buffers, ``2 b F_i`` per row of a whole buffer ``index_copy_`` -ed or of an entry whose
  positions are one range (read straight into that slice), nothing when one part's received buffer
  already is its result or the destination is its own source in order: a rank whose
  linear and attention ranges are one, in order, copies nothing, and when no row changes rank no
  collective runs). The rows of *in-place* chunks (``LocalChunk.linear_rows``: local sequences staying on
  the rank, run on its linear rows by ``runtime/overlap.py``) are gathered neither in nor out (pass the
  lowered programs); a plan whose linear layout is its attention layout runs no remap at all. A routed
  remap (``plan.remap_proxies``) also gathers each phase's send buffer from where its rows arrived
  (the same rules, exact per rank): rows that stay in
  the node are never copied again, no staging buffer is built (before: three ``index_select`` + ``cat``
  of every staged row, ``12 b F' T_src``).
* head-parallel rings (``a2a = a > 1``; the lowering's ``heads`` / ``tokens`` transfers; ``runtime/heads.py``):
  every per-call charge above at the lane's shape (:func:`shape_of` ``(cost, a)``: ``Hq / a`` query heads,
  ``lane_kv_heads`` K/V heads) over the rank's head-buffer rows (its block's tokens); instead of the per-ring
  gathers, the copies around the two all-to-alls (``HeadIndex``: the send buffers' row and head selects, the
  own slot, the head buffer's permutation, the result and gradient casts, the per-lane writes home),
  :func:`zeppelin_a2a_bytes`, charged before each post and after each wait. A ring of one block (Ulysses)
  runs one kernel call on the head buffer and keeps the kernel's dtype throughout (``engine.ulysses_forward``
  / ``ulysses_backward``: no merge, no accumulator, no casts; dq, dk, dv go home in the training dtype):
  its call pays only the kernel's log-sum-exp transpose (:func:`ulysses_call_bytes`).
* the router's relays: none. A relay receives into a buffer and sends that buffer on; a message part is
  a view of the payload (``runtime/router.py``). Its bytes are network traffic, charged as such.

**TE CP's ring and the peers' all-to-alls**: :mod:`.peer_costs` (what the simulator charges the baselines).

Not charged anywhere: GQA K/V head expansion inside the ``torch_varlen`` backend (the ``flash_attn``
backend needs none). DistCA charges its own buffer packing (``sim/distca.py``).

Example (bf16, ``Hq = 32``, ``D = 128``): merging a 4096-row ``early`` call costs
``4096 * 4096 * 10 + 4096 * 32 * 12 = 169 MB`` of traffic -> 0.057 ms at 2951.7 GB/s (the torch path:
``4096 * 4096 * 18 + 4096 * 32 * 36 = 307 MB``, 0.104 ms).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np


from .head_parallel import head_split_error, lane_kv_heads
from .remap import Direction
from .remap_routing import routed_exchange
from .remap_staging import SOURCE, Gather, StagingPlan, drop_rows, in_place_rows, rank_staging

if TYPE_CHECKING:
    from .cost_model import CostModel
    from .lowering import RankProgram, RingCall
    from .plan import StepPlan

__all__ = ["hbm_ms", "Shape", "shape_of", "merge_bytes", "call_bytes", "zeppelin_call_bytes", "wire_factor",
           "zeppelin_ring_bytes", "zeppelin_local_bytes", "zeppelin_remap_bytes", "remap_copy_bytes", "remap_gathers",
           "a2a_token_bytes", "ulysses_call_bytes", "zeppelin_a2a_bytes", "A2A_PARTS", "lane_shape"]


class Shape:
    """Per-token element counts on one rank: ``eq`` query, ``ekv`` packed K/V, ``hq`` lse values;
    ``b`` / ``a`` bytes of the training / accumulation dtype."""

    __slots__ = ("eq", "ekv", "hq", "b", "a")

    def __init__(self, *, eq: int, ekv: int, hq: int, b: int, a: int) -> None:
        self.eq, self.ekv, self.hq, self.b, self.a = eq, ekv, hq, b, a


def shape_of(cost: "CostModel", a2a: int = 1) -> Shape:
    """The :class:`Shape` of ``cost``'s model after tensor parallelism, in its profile's dtype; ``a2a > 1``:
    what one lane of a head-parallel ring of that width holds per token (``Hq / a2a`` query heads,
    :func:`~zeppelin_megatron.planner.head_parallel.lane_kv_heads` K/V heads). Example (Llama-7B, MHA):
    ``a2a = 4`` -> ``hq = 8``, ``eq = 1024``, ``ekv = 2048``. Raises ``ValueError`` when the heads do not split."""
    key = ("shape_of", a2a)
    hit = cost._cache.get(key)
    if hit is not None:  # memoised: every ring time asks (shapes are never changed after construction)
        return hit  # type: ignore[no-any-return]
    m, tp = cost.model, cost.tensor_parallel
    b = cost.profile.dtype_bytes
    sh = Shape(eq=(m.q_heads // tp) * m.head_dim, ekv=2 * (m.kv_heads // tp) * m.head_dim, hq=m.q_heads // tp,
               b=b, a=max(4, b))
    cost._cache[key] = out = sh if a2a == 1 else lane_shape(sh, a2a)
    return out


def hbm_ms(cost: "CostModel", nbytes: float) -> float:
    """Milliseconds to move ``nbytes`` (read + written) through device memory."""
    return nbytes / (cost.profile.hbm_GBps * 1e6) if nbytes > 0 else 0.0


def _cast(sh: Shape) -> int:
    """Bytes per element of a ``.to(acc dtype)`` copy: read ``b``, write ``a``; 0 when the dtypes agree."""
    return sh.a + sh.b if sh.a != sh.b else 0


def merge_bytes(sh: Shape, rows: int, *, late: bool, fused: bool = True) -> float:
    """Bytes of one ``merge_lse_`` over ``rows`` query rows (``late``: the ring's first ``late`` call, with
    ``ring.forward_step``'s gather of the held ``out``/``lse`` rows and ``ring.finish``'s write-back).

    ``fused`` (default): the engine's Triton pass where it runs (fp32 accumulators, ``a = 4``; module docstring);
    ``fused=False``: the torch path. Example (bf16, ``Eq = 4096``, ``Hq = 32``, 1 row): 41 344 B fused,
    74 880 B torch."""
    a = sh.a
    if fused and a == 4:
        # fused_merge_triton: r out (a), out_b (b), w out (a) per output element; r lse, lse_b, w lse
        total = rows * sh.eq * (2 * a + sh.b) + 3 * a * rows * sh.hq
    else:
        # ring.merge_lse_: sub + sigmoid_ + logaddexp(out=lse) on lse (3a + 2a + 3a), lerp_'s broadcast w read
        # (a); out_b.to(out.dtype) (skipped when b == a) and out.lerp_(out_b, w) (r 2a, w a) per output element
        total = rows * sh.eq * (3 * a + _cast(sh)) + 9 * a * rows * sh.hq
    if late:
        total += rows * (4 * a * sh.eq + 4 * a * sh.hq)
    return float(total)


def call_bytes(sh: Shape, kind: str, tq: int, tk: int, *, kv_all: bool, first_late: bool) -> float:
    """Forward + backward elementwise bytes of one ring call besides its kernel (module docstring): a call of
    ``kind`` (``diag`` / ``early`` / ``late``) over ``tq`` query rows and ``tk`` key rows, ``kv_all`` when
    the keys are all of the held K/V rows (``diag`` and ``late`` in a zigzag ring), ``first_late`` when it
    is the ring's first ``late`` call (backward gathers ``dout, q, out, lse`` rows once). The simulator
    charges it per lowered call (:func:`zeppelin_call_bytes`), the planner per zigzag step
    (:mod:`.engine_ring`). Example (Llama-7B bf16: ``Eq = 4096``, ``Ekv = 8192``, ``Hq = 32``): an ``early``
    call of 2 query rows and 1 key row: forward merge 82 688 (fused) + held K/V 32 768, backward held K/V
    32 768 + ``dq`` 81 920 + lse 512 + dK/dV cast and ``index_add_`` 147 456 = 378 112 B.
    """
    if kind not in ("diag", "early", "late"):
        raise ValueError(f"ring call kind is {kind!r}, expected diag, early or late")
    a, b, eq, ekv, hq = sh.a, sh.b, sh.eq, sh.ekv, sh.hq
    fwd = bwd = 0.0
    if kind == "diag":
        fwd += tq * eq * (a + b)
    else:
        fwd += merge_bytes(sh, tq, late=first_late)
    if kind == "early":
        fwd += 2 * b * tk * ekv
        bwd += 2 * b * tk * ekv
    if kind == "late":
        if first_late:
            fwd += 2 * b * tq * eq  # the held q rows (ring.forward_step)
            bwd += 2 * tq * (3 * b * eq + a * hq)
        bwd += tq * eq * (4 * a + b)
    else:
        bwd += tq * eq * (2 * a + b)
    bwd += 2 * a * tq * hq  # the kernel's lse.transpose(0, 1).float().contiguous()
    # ring.add_block: the diagonal's block is copied into a new accumulator (engine backward: the first
    # acc Post follows the diagonal call); a block over all held rows is added per half in place; an
    # early block (kv rows) is cast and index_add_-ed per half
    if kind == "diag" and kv_all:
        bwd += tk * ekv * (a + b)
    elif kv_all:
        bwd += tk * ekv * (2 * a + b)
    else:
        bwd += tk * ekv * (_cast(sh) + 3 * a) + (tk * ekv * a if kind == "diag" else 0)  # diag: zero_()
    return fwd + bwd


def zeppelin_call_bytes(sh: Shape, call: "RingCall", *, first_late: bool) -> float:
    """Forward + backward elementwise bytes of one lowered ring call besides its kernel: :func:`call_bytes`
    of its kind, rows and keys (``first_late``: this is the ring's first ``late`` call)."""
    return call_bytes(sh, call.kind, sum(call.lens_q), sum(call.lens_k), kv_all=call.kv_all, first_late=first_late)


def wire_factor(sh: Shape, charges: str = "zeppelin") -> float:
    """Bytes a ring step puts on the wire per forward K/V byte: forward K/V, backward K/V and the dK/dV
    accumulator, which the engine sends in the accumulator dtype (``runtime/engine.py``: ``acc_dtype``), so
    ``2 + a / b`` under ``zeppelin`` charges (4 in bf16), 3 otherwise (TE CP keeps it in the training dtype;
    ``none``: the cost model's old ``3x`` rule). Example: bf16 -> 4.0; fp32 (``a = b = 4``) -> 3.0."""
    return 2 + sh.a / sh.b if charges == "zeppelin" else 3.0


def zeppelin_ring_bytes(sh: Shape, n: int, *, contiguous: bool = False) -> float:
    """Per-ring bytes (gathers into the ring buffers, zeros, results back) for a rank with ``n`` ring rows.

    ``contiguous``: the rank's ring rows are one range of its attention buffer (``RingPart.span``;
    ``plan_step``'s layouts): ``q`` and ``dout`` are ``narrow`` views (no gather), the result and the final
    ``dq``/``dk``/``dv`` are cast straight into their slice (``rows.put``: one ``copy_``, ``n F (a + b)``, no
    ``.to`` copy first); the packed K/V buffer (``_ring_kv``, ``2 b n Ekv`` each way) and the ``dq`` zeros stay.
    Example (Llama-7B bf16, ``n = 1``): 294 912 B gathered, 180 224 B contiguous."""
    a, b, eq, ekv = sh.a, sh.b, sh.eq, sh.ekv
    if contiguous:
        # engine._ring_kv (slice copies into the send buffer); forward res.copy_(s.out) into out's slice;
        # backward dq zeros, rows.put of dq, dk, dv (cast in the copy)
        fwd = 2 * b * n * ekv + n * eq * (a + b)
        bwd = 2 * b * n * ekv + a * n * eq + n * (eq + ekv) * (a + b)
        return float(fwd + bwd)
    # engine.forward / backward: q (and dout) index_select, engine._ring_kv (k, v into one buffer);
    # dq zeros; results .to(dtype) + index_copy_
    fwd = 2 * b * n * (eq + ekv) + n * eq * (a + 3 * b)
    bwd = 2 * b * n * (2 * eq + ekv) + a * n * eq + n * (eq + ekv) * (a + 3 * b)
    return float(fwd + bwd)


def zeppelin_local_bytes(sh: Shape, tokens: int, *, contiguous: bool = False) -> float:
    """Row gathers and copies around one local call of ``tokens`` tokens (forward + backward).

    ``contiguous``: the call's rows are one range (``LocalChunk.span``): ``q``, ``k``, ``v`` (backward also
    ``dout``) are views, only the writes of ``out`` and ``dq``, ``dk``, ``dv`` into their slices remain
    (``2 b T Eq + 2 b T (Eq + Ekv)``). Example (Llama-7B bf16, 1 token): 180 224 B gathered, 65 536 B
    contiguous."""
    b, eq, ekv = sh.b, sh.eq, sh.ekv
    fwd = 2 * b * tokens * eq  # rows.put(out, ...): index_copy_ or a slice copy_
    bwd = 2 * b * tokens * (eq + ekv)  # rows.put of dq, dk, dv
    if not contiguous:  # index_select of q, k, v forward and dout, q, k, v backward
        fwd += 2 * b * tokens * (eq + ekv)
        bwd += 2 * b * tokens * (2 * eq + ekv)
    return float(fwd + bwd)


def remap_gathers(plan: "StepPlan", direction: Direction,
                  programs: "Sequence[RankProgram] | None" = None) -> list[StagingPlan]:
    """Every rank's gathers of ``runtime/remap.py``'s ``remap_parts`` in ``direction``: the plan its ``_indices``
    reads too (:func:`~zeppelin_megatron.planner.remap_staging.rank_staging`): direct, the destination read
    from the received buffer and, for rows that stay on the rank, from the source tensor (they are never sent);
    routed, each phase's send buffer and the destination read from the buffers their rows arrived in.
    ``programs`` (every rank's lowered program): the rows of each rank's in-place local chunks
    (``LocalChunk.linear_rows``, run on the linear rows by ``runtime/overlap.py``) are not gathered
    (:func:`~.remap_staging.drop_rows`)."""
    src, dst = ("linear", "attention") if direction == "to_attention" else ("attention", "linear")
    world = plan.world_size
    routed = (routed_exchange(plan.remap, direction, plan.gpus_per_node, plan.remap_proxies)
              if plan.remap_proxies and world > 1 else None)
    out = [rank_staging(plan.remap.exchange(r, direction), None if routed is None else routed[r],
                        plan.tokens(r, src), plan.tokens(r, dst)) for r in range(world)]
    return out if programs is None else _without_in_place(plan, direction, out, programs)


def _without_in_place(plan: "StepPlan", direction: Direction, gathers: list[StagingPlan],
                      programs: "Sequence[RankProgram]") -> list[StagingPlan]:
    """``gathers`` (:func:`remap_gathers` without programs) less the rows each rank's in-place local chunks fill
    (:func:`~.remap_staging.drop_rows`)."""
    dst = "attention" if direction == "to_attention" else "linear"
    return [drop_rows(st, in_place_rows(programs[r].local_chunks, direction), plan.tokens(r, dst))
            for r, st in enumerate(gathers)]


def _gather_bytes(g: Gather, sizes: Sequence[int], n: int, row_bytes: int, *, whole_is_free: bool) -> float:
    """Bytes ``remap._assemble`` moves to build an ``n``-row buffer of ``row_bytes`` per row: one entry
    over all rows in order is the source itself (free when ``whole_is_free`` (a full-width view) or when it
    is the rank's own source tensor (:data:`~.remap_staging.SOURCE`, a contiguous part); else a
    ``.contiguous()`` copy), one over some rows an ``index_select``; several entries (or given positions) an
    ``index_select`` each (skipped for all rows) and an ``index_copy_`` each, or one ``index_select`` (a
    ``copy_``) straight into the slice when the entry's positions are one range."""
    if len(g) == 1 and g[0][2] is None:
        rows = g[0][1]
        if rows is None:
            return 0.0 if whole_is_free or g[0][0] == SOURCE else 2.0 * row_bytes * n
        return 2.0 * row_bytes * len(rows)
    total = 0.0
    for o, rows, pos in g:
        k = sizes[o] if rows is None else len(rows)
        one_range = pos is not None and len(pos) > 0 and bool(np.all(np.diff(pos) == 1))
        total += (2 if rows is None or one_range else 4) * row_bytes * k
    return total


def zeppelin_remap_bytes(sh: Shape, plan: "StepPlan", programs: "Sequence[RankProgram] | None" = None) -> list[float]:
    """Per rank: the layer's four ``remap_parts`` (module docstring): q, k, v in (three parts), out back (one
    part), and their backward runs (the inverse directions). ``programs``: every rank's lowered program, as
    ``runtime/overlap.py`` runs it: its in-place chunks' rows are gathered by the q/k/v remap in only (their
    backward reads q/k/v in the attention buffers), not by the output, output-gradient or dq/dk/dv remaps
    (pass them: the runtime always does when the plan remaps). A plan whose linear layout is its attention
    layout runs no remap: 0 on every rank."""
    if plan.linear_layout == plan.attention_layout:
        return [0.0] * plan.world_size
    b = sh.b
    q, kv = sh.eq, sh.ekv // 2
    qkv_in = remap_gathers(plan, "to_attention")  # every attention row, in-place chunks' too
    dout_in = qkv_in if programs is None else _without_in_place(plan, "to_attention", qkv_in, programs)
    back = remap_gathers(plan, "to_linear", programs)
    out = []
    for r in range(plan.world_size):
        total = 0.0
        for d, parts, st in (("to_attention", (q, kv, kv), qkv_in[r]), ("to_linear", (q,), back[r]),
                             ("to_attention", (q,), dout_in[r]), ("to_linear", (q, kv, kv), back[r])):
            width = sum(parts)
            total += 2 * b * width * st.sizes[0]  # index_select of each part's moving rows into the send buffer
            for g in st.phases:  # routed: each phase's send buffer
                n = sum(st.sizes[o] if rows is None else len(rows) for o, rows, _ in g)
                total += _gather_bytes(g, st.sizes, n, b * width, whole_is_free=True)
            n_dst = plan.tokens(r, "attention" if d == "to_attention" else "linear")
            for f in parts:  # each part out of the received / arrived buffers
                total += _gather_bytes(st.final, st.sizes, n_dst, b * f, whole_is_free=len(parts) == 1)
        out.append(total)
    return out


def remap_copy_bytes(sh: Shape, linear_tokens: int, attention_tokens: int, *, staying: int = 0,
                     in_place: int = 0, identity: bool = False) -> float:
    """The planner's count of one rank's remap copies (:func:`zeppelin_remap_bytes` needs every rank's gathers,
    0.6 s per candidate plan at 128 GPUs). Per row of each of the four ``remap_parts`` (width ``F``, ``2 b F``
    per row read or written): a moving source row is read into the send buffer, a received row gathered out
    of the received buffer and copied into the destination (two copies: received rows land scattered); of
    the ``staying`` rows (on this rank in both layouts: never sent), the ``in_place`` ones
    (tokens of the rank's in-place local chunks, run on the linear rows) are copied only by the q/k/v remap in
    (``Eq + Ekv`` per row, read and written among the received rows: backward reads them in the attention
    buffers) and the others are read from the
    source once (into a slice of the destination, or the whole source: ``plan_step``'s layouts keep a rank's
    staying rows in runs). With ``F`` summed (q/k/v in and dq/dk/dv back, out back and dout in: ``2 Eq +
    Ekv`` per direction) and ``K`` staying, ``I`` in place::

        rows(src, dst) = (src - K) + 2 (dst - K) + (K - I)
        bytes = 2 b (2 Eq + Ekv) (rows(T_lin, T_att) + rows(T_att, T_lin)) + 4 b (Eq + Ekv) I

    (``6 b (2 Eq + Ekv)(T_lin + T_att)`` with no staying row). ``identity`` (the plan's linear layout is its
    attention layout: no remap runs, or the rank's ranges are one and it has no in-place chunk): 0. It does
    not know which gathers write one range nor a routed remap's relay gathers: against
    :func:`zeppelin_remap_bytes` (with the lowered programs) on 32-GPU direct plans it is 0.64-1.16x.
    Example (Llama-7B bf16, 8192 linear and 8192 attention tokens, none staying):
    ``6 * 2 * 16384 * 16384`` = 3.22 GB; all 8192 rows staying and in place: ``4 * 2 * 12288 * 8192`` = 0.81 GB."""
    if identity:
        return 0.0
    k, kept = staying, staying - in_place

    def rows(src: int, dst: int) -> int:
        return (src - k) + 2 * (dst - k) + kept

    return float(2 * sh.b * (2 * sh.eq + sh.ekv) * (rows(linear_tokens, attention_tokens)
                                                      + rows(attention_tokens, linear_tokens))
                 + 4 * sh.b * (sh.eq + sh.ekv) * in_place)


def a2a_token_bytes(sh: Shape, charges: str = "zeppelin", blocks: int = 2, shared: bool = False) -> tuple[int, int]:
    """Bytes per token of one lane's slice in a head-parallel ring's two all-to-alls, forward + backward
    merged (``sh``: the lane's :func:`shape_of`): ``heads`` carries the q, k, v slices forward and the
    output-gradient slice backward, ``b (2 Eq + Ekv)``; ``tokens`` carries the output slice forward
    (``b Eq``) and dq, dk, dv backward, in the training dtype (``b (Eq + Ekv)``: the engine casts a ring's
    accumulators once before sending, ``runtime/heads.py: grads_wire_dtype``; one block's kernel gradients go
    as they are; TE's a2a likewise), except under ``zeppelin`` charges on a ring of several ``blocks`` whose
    lanes share K/V heads (``shared``: :func:`~.head_parallel.lanes_share_kv`), whose gradients travel in the
    accumulator dtype to be summed at home (``a (Eq + Ekv)``). Example (Llama-7B bf16, lane of width 4:
    ``Eq = 1024``, ``Ekv = 2048``): ``(8192, 8192)``; lanes sharing K/V heads, several blocks: ``(8192,
    14336)``."""
    acc = sh.a if charges == "zeppelin" and blocks > 1 and shared else sh.b
    return sh.b * (2 * sh.eq + sh.ekv), sh.b * sh.eq + acc * (sh.eq + sh.ekv)


def ulysses_call_bytes(sh: Shape, rows: int) -> float:
    """The one call of a one-block head-parallel ring (``engine.ulysses_*``) besides its kernel, ``rows``
    head-buffer rows at the lane's shape: the kernel wrapper's backward ``lse.transpose(0, 1).float()
    .contiguous()`` (``2 a rows Hq``), as every ring call pays it (:func:`call_bytes`); nothing else (the
    kernel's out, dq, dk, dv are used as they are). Example (lane of 8 query heads, fp32 ``a = 4``): 1000
    rows -> 64 000 B."""
    return float(2 * sh.a * rows * sh.hq)


A2A_PARTS: tuple[str, ...] = ("heads pack", "heads unpack", "tokens pack", "tokens unpack")
"""Where :func:`zeppelin_a2a_bytes` splits a head-parallel ring's own copies: before / after each all-to-all."""


def zeppelin_a2a_bytes(sh: Shape, a2a: int, own: int, block: int, *, contiguous: bool = False,
                       blocks: int = 2) -> dict[str, float]:
    """A head-parallel ring member's copies around its two all-to-alls, forward + backward (module docstring),
    by :data:`A2A_PARTS`; they replace :func:`zeppelin_ring_bytes` (the ring's gathers, zeros and results).

    ``sh``: the rank's full :func:`shape_of` (``Eq``, ``Ekv``); ``a2a``: the width ``a``; ``own``: ``n``
    tokens the rank holds of the ring; ``block``: ``N`` rows of its head buffer; ``contiguous``: the rank's
    ring rows are one range of its attention buffer (``RingPart.span``, ``plan_step``'s layouts: ``narrow``
    views and slice copies, ``HeadIndex._own`` / ``_home``); ``blocks``: the ring's blocks (one: Ulysses, the
    kernel's dtype throughout, ``x = b``; several: an fp32 accumulator, ``x = a``). Lane ``Eq' = Eq / a``,
    ``Ekv' = 2 lane_kv_heads D``; ``P = a Ekv'`` K/V elements a sender packs per token (``Ekv`` when
    ``a | Hkv``: each K/V head in one lane; more when lanes share a K/V head, ``kv_pick``). Counted from
    ``runtime/heads.py`` (``HeadIndex``) and ``runtime/engine.py``:

    * heads pack: forward ``qkv_to_heads``: the own q rows (``2 b n Eq`` gathered; a view when contiguous)
      and their copy into the send buffer (``2 b n Eq``), the own ``k``, ``v`` rows (``2 b n Ekv`` gathered;
      views), [``kv_pick`` select ``2 b n P``], copies into the send buffer (``2 b n P``), ``_to_heads``' own
      slot (``2 b n (Eq' + Ekv')``); backward ``dout_to_heads`` (own rows ``2 b n Eq`` gathered or a view,
      copy ``2 b n Eq``, own slot ``2 b n Eq'``);
    * heads unpack: every message lands at its head-buffer rows (one per run of a lane's tokens,
      :func:`~.head_parallel.lane_runs`), so one block reads ``q_h``, ``k_h``, ``v_h`` and ``dout_h`` as views
      of what arrived (nothing); several blocks copy ``q_h`` and the packed ``kv_h`` out once
      (``2 b N (Eq' + Ekv')``) and zero the ``dq`` accumulator (``a N Eq'``); ``dout_h`` is what arrived;
    * tokens pack: forward, on several blocks the result's ``.to`` (``N Eq' (a + b)``); the output rows go
      as they are, and the own slot's runs are copied (``2 b n Eq'``); backward in the wire dtype ``w``
      (``runtime/heads.py: grads_wire_dtype``: ``w = b`` when each K/V head is in one lane, else ``w = x``):
      one block's kernel writes dq, dK, dV straight into the send buffer (flash-attn's ``backward_into``:
      nothing), several blocks' accumulators are copied in once, cast on the way (``N (Eq' + Ekv')(x + w)``);
      the own slot's runs (``2 w n (Eq' + Ekv')``);
    * tokens unpack: forward ``tokens_out`` (per lane, ``2 b n Eq`` in all); backward ``tokens_grads``: dq per
      lane home (``c n Eq``, ``c`` = ``w + b`` cast in a slice copy when contiguous, ``w + 3b`` as ``.to`` +
      ``index_copy_`` when gathered, ``2b`` when ``w = b``: no cast), dK/dV per lane home when each K/V head
      is in one lane (``c n Ekv``), else summed in ``f = max(x, 4)`` bytes: zeros ``f n Ekv``, per lane
      ``.to`` (``n P (x + f)`` when ``x != f``) and ``index_add_`` (``3 f n P``), the halves home
      (``n Ekv (f + b)`` contiguous, ``(f + 3b)`` gathered).

    The router sends and receives the slices in place (no copies). Example (Llama-7B bf16, ``a = 4``,
    ``n = 2048``, ``N = 8192``, several blocks, gathered rows): heads pack 302 MB, unpack 134 MB, tokens pack
    235 MB, unpack 134 MB; one block, contiguous rows: 168, 0, 34 and 134 MB (with one message per lane
    and a permuting copy after each all-to-all they were 168, 134, 168 and 134 MB).
    """
    a, b, eq, ekv = sh.a, sh.b, sh.eq, sh.ekv
    lane = lane_shape(sh, a2a)
    eql, ekvl = lane.eq, lane.ekv
    n, big = own, block
    packed = a2a * ekvl
    pick = 2 * b * n * packed if packed != ekv else 0
    gather = 0 if contiguous else 2 * b * n * (2 * eq + ekv)  # the own q, k, v rows and dout rows, gathered
    x = b if blocks == 1 else a
    w = x if packed != ekv else b  # the gradients' wire dtype (runtime/heads.py: grads_wire_dtype)

    def home(f: int) -> int:  # bytes per element written home from dtype f into the training dtype
        return f + b if contiguous or f == b else f + 3 * b  # a slice copy casting, or .to + index_copy_

    if packed == ekv:
        kv_home = n * ekv * home(w)
    else:
        f = max(x, 4)
        kv_home = f * n * ekv + (n * packed * (x + f) if x != f else 0) + 3 * f * n * packed + n * ekv * home(f)
    several = blocks > 1
    return {
        "heads pack": float(gather + 2 * b * n * eq + pick + 2 * b * n * packed + 2 * b * n * (eql + ekvl)
                            + 2 * b * n * eq + 2 * b * n * eql),
        "heads unpack": float(2 * b * big * (eql + ekvl) + a * big * eql if several else 0),
        "tokens pack": float((big * eql * (a + b) + big * (eql + ekvl) * (x + w) if several else 0)
                             + 2 * b * n * eql + 2 * w * n * (eql + ekvl)),
        "tokens unpack": float(2 * b * n * eq + n * eq * home(w) + kv_home),
    }


def lane_shape(sh: Shape, a2a: int) -> Shape:
    """The lane :class:`Shape` of full shape ``sh`` at width ``a2a`` (as :func:`shape_of` ``(cost, a2a)``)."""
    d = sh.eq // sh.hq
    hkv = sh.ekv // (2 * d)
    why = head_split_error(sh.hq, hkv, a2a)
    if why is not None:
        raise ValueError(f"a head-parallel ring of width {a2a} cannot split {sh.hq} query and {hkv} K/V heads "
                         f"per rank: {why}")
    hq = sh.hq // a2a
    return Shape(eq=hq * d, ekv=2 * lane_kv_heads(hkv, a2a) * d, hq=hq, b=sh.b, a=sh.a)
