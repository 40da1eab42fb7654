"""A zigzag ring's steps priced as the engine runs them and the simulator charges them.

One rank of a ring of ``g`` positions (or a head-parallel ring's lane over ``g = m`` blocks at width
``a``), all the ring's sequences in one call per step (milliseconds, one layer, forward + backward):

* step 0, ``diag``: ``max(sum causal diagonal / a, o)`` plus the diagonal call's copies and, for a
  plain ring, the ring's gathers into its buffers and results back
  (:func:`~.engine_costs.zeppelin_ring_bytes`; a head-parallel ring copies around its all-to-alls
  instead, :mod:`.cost_heads`);
* an ``early`` step (the K/V source is an earlier position: both local chunks, ``2c`` rows, attend its
  early chunk, ``c`` keys) and a ``late`` step (the local late chunk, ``c`` rows, attends both of the
  source's chunks): ``max(sum block_fitted_ms / a, o)`` (each block timed on the measured blocks of its
  orientation, tall or wide, as the simulator times a lowered call) plus the call's merge and row
  copies (:func:`~.engine_costs.call_bytes`). At every step of a ring of ``g >= 2`` some positions
  run ``early`` calls and others ``late`` ones, so a step ends with ``off = max(early, late)``;
* ``first_late``: the extra copies of a rank's first ``late`` call (held rows gathered once);
* ``wire_bytes``: what one hop moves per step, :func:`~.engine_costs.wire_factor` times the
  forward K/V chunk pair (4x in bf16: the dK/dV accumulator travels in fp32).

with ``c = ceil(s / 2g)`` and ``2c`` the chunk pair (:func:`~.zigzag.ring_chunk_pair_tokens`), summed
over the ring's sequences. Copies are ``bytes / hbm_GBps`` (:func:`~.engine_costs.hbm_ms`).

Charge models (as the simulator's ``charges``): ``zeppelin`` (above), ``te`` (TE CP's fused
corrections and THD half-tensor copies at every step, :func:`~.peer_costs.te_step_bytes`, its ring buffers at
step 0, :func:`~.peer_costs.te_ring_bytes`, no gathers, 3x on the wire) and ``none``: the cost
model before these charges (steps timed with the area-averaged ``ring_compute_profile``, no copies, 3x
on the wire). Who uses which: :func:`~.predict.predict` prices a plan with ``zeppelin`` when asked
(``charges="zeppelin"``: within 0.4% of the simulator on one-node ring plans, mean |error| 3.8%
against 6.1% on the planner's plans of the simulated benchmarks); ``plan_step`` (its prediction and
layout choice), the partitioner's scores (:func:`~.predict.ring_time`) and the simulator's baselines
keep the default ``none`` (the block-width choice charges both sides, :data:`~.choose_heads.CHOICE_CHARGES`):
charging the partitioner's scores made simulated steps slower, and charging the layout choice either
slower (with the cheap remap count) or far slower to plan (with the exact one); docs/planner.md, "The
engine's charges".

Worked example (Llama-7B bf16, H100 profile, one 65 536-token sequence on 8 positions, ``c = 4096``):
``early`` is ``block_fitted_ms(8192, 4096)`` = 6.22 ms plus 8192 rows merged, 4096 held K/V rows
gathered and the dq / dK/dV accumulations (1.55 GB with the fused merge, 0.52 ms at 2951.7 GB/s):
6.74 ms, against 6.23 ms of the area-averaged block alone; the wire carries ``4 * 8192 * 16 384 =
537 MB`` per step (the cost model's ``3x`` rule: 403 MB).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

from .engine_costs import (
    call_bytes, hbm_ms, shape_of, ulysses_call_bytes, wire_factor, zeppelin_local_bytes, zeppelin_ring_bytes,
)
from .peer_costs import te_ring_bytes, te_step_bytes
from .zigzag import ring_chunk_pair_tokens

if TYPE_CHECKING:
    from .cost_model import CostModel

__all__ = ["RingSteps", "ring_steps", "ENGINE_CHARGES", "local_copy_ms_per_token"]

ENGINE_CHARGES: tuple[str, ...] = ("zeppelin", "te", "none")
"""Charge models the planner can price (the simulator's ``sim.charges.CHARGES``)."""


class RingSteps(NamedTuple):  # a NamedTuple: made on every ring priced, about twice as fast as a frozen dataclass
    """One ring's step times on one rank (ms, module docstring) and its bytes per hop and step.

    ``diag``: step 0 (at least the call overhead, plus copies); ``early`` / ``late``: one off-diagonal
    step of each kind; ``first_late``: the first ``late`` call's extra copies; ``copy_ms``: the copies
    included in ``diag + (g - 1) * off + first_late`` of the slowest member (device-memory work, not
    kernels); ``wire_bytes``: one hop's bytes per step.
    """

    diag: float
    early: float
    late: float
    first_late: float
    copy_ms: float
    wire_bytes: int

    @property
    def off(self) -> float:
        """An off-diagonal step: the slower of the two kinds (both run at every step)."""
        return max(self.early, self.late)


def ring_steps(cost: "CostModel", lengths: Sequence[int], g: int, *, a2a: int = 1,
               charges: str = "zeppelin") -> RingSteps:
    """:class:`RingSteps` of sequences ``lengths`` sharing a ring of ``g`` positions (head-parallel: ``g``
    blocks, lanes of width ``a2a``), under charge model ``charges``. Memoised in the cost model's cache.

    Raises ``ValueError`` for an unknown ``charges`` or ``g < 1`` / ``a2a < 1`` (naming the value).
    Example: ``ring_steps(cost, [65536], 8).wire_bytes`` is ``4 * 8192 * kv_bytes_per_token`` in bf16.
    """
    if charges not in ENGINE_CHARGES:
        raise ValueError(f"charges is {charges!r}, expected one of {list(ENGINE_CHARGES)}")
    if g < 1 or a2a < 1:
        raise ValueError(f"a ring needs g >= 1 positions and a2a >= 1 lanes, got g = {g}, a2a = {a2a}")
    key = ("ring_steps", tuple(lengths), g, a2a, charges)
    hit = cost._cache.get(key)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    o = cost.call_overhead_ms
    sh = shape_of(cost, a2a)
    diag_k = off_k = early_k = late_k = 0.0
    pair = chunk = 0
    for s in lengths:
        d, f = cost.ring_compute_profile(s, g)
        diag_k += d
        off_k += f
        p = ring_chunk_pair_tokens(s, g)
        c = -(-s // (2 * g))
        pair, chunk = pair + p, chunk + c
        if g > 1 and charges != "none":
            fit = cost._cache.get(("fitted", s, g))
            if fit is None:  # memoised: a sequence's blocks recur in every ring, width and charge model it is priced in
                fit = cost._cache[("fitted", s, g)] = (cost.block_fitted_ms(p, c), cost.block_fitted_ms(c, p))
            early_k += fit[0]
            late_k += fit[1]
    wire = int(round(wire_factor(sh, charges) * sh.b * sh.ekv * pair)) if g > 1 else 0
    diag = max(diag_k / a2a, o)
    if charges == "none":
        off = max(off_k / a2a, o)
        hit = RingSteps(diag=diag, early=off, late=off, first_late=0.0, copy_ms=0.0, wire_bytes=wire)
    elif charges == "te":  # rings of g > 1: the ring's buffers and step 0's charges, then every step's
        buf = hbm_ms(cost, te_ring_bytes(sh, pair) + te_step_bytes(sh, pair, pair, "diag")) if g > 1 else 0.0
        early = max(early_k / a2a, o) + hbm_ms(cost, te_step_bytes(sh, pair, chunk, "early"))
        late = max(late_k / a2a, o) + hbm_ms(cost, te_step_bytes(sh, chunk, pair, "late"))
        copy = buf + (g - 1) * max(early - max(early_k / a2a, o), late - max(late_k / a2a, o))
        hit = RingSteps(diag=diag + buf, early=early, late=late, first_late=0.0, copy_ms=copy, wire_bytes=wire)
    else:
        d, e, lt, fl = _zeppelin_bytes(cost, a2a, g == 1)
        diag_c = hbm_ms(cost, d * pair)
        early_c = hbm_ms(cost, e[0] * pair + e[1] * chunk)
        late_c = hbm_ms(cost, lt[0] * pair + lt[1] * chunk)
        first = hbm_ms(cost, fl[0] * pair + fl[1] * chunk) - late_c if g > 1 else 0.0
        early, late = max(early_k / a2a, o) + early_c, max(late_k / a2a, o) + late_c
        copy = diag_c + (g - 1) * (early_c if early >= late else late_c) + first
        hit = RingSteps(diag=diag + diag_c, early=early, late=late, first_late=first, copy_ms=copy, wire_bytes=wire)
    cost._cache[key] = hit
    return hit


Coef = tuple[float, float]


def _zeppelin_bytes(cost: "CostModel", a2a: int, one: bool) -> tuple[float, Coef, Coef, Coef]:
    """The ``zeppelin`` charges' call bytes of :func:`ring_steps` per row, memoised per ``(a2a, one)`` (``one``: a
    ring of one position): every term of :func:`~.engine_costs.call_bytes`, :func:`~.engine_costs.zeppelin_ring_bytes`
    and :func:`~.engine_costs.ulysses_call_bytes` is rows times a per-row size, so the bytes of ``pair`` rows and
    ``chunk`` keys are ``pair * x + chunk * y`` exactly (integers, in floats). Returns the diagonal call's bytes per
    pair row, then ``(x, y)`` of the ``early``, ``late`` and first ``late`` calls. Example: the ``early`` call of
    2 query rows and 1 key row is ``2 * call_bytes(early, 1, 0) + call_bytes(early, 0, 1)``."""
    key = ("zeppelin_bytes", a2a, one)
    hit = cost._cache.get(key)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    sh = shape_of(cost, a2a)

    def rates(nbytes: Callable[[int, int], float]) -> Coef:  # bytes of (pair, chunk) = pair * x + chunk * y
        return nbytes(1, 0), nbytes(0, 1)

    # the calls as ring_steps makes them: early, both chunks' queries (pair) against one chunk's keys; late, one
    # chunk's queries against both chunks' keys
    diag = rates(lambda p, c: ulysses_call_bytes(sh, p) if a2a > 1 and one else  # Ulysses: one call
                 call_bytes(sh, "diag", p, p, kv_all=True, first_late=False)
                 + (zeppelin_ring_bytes(sh, p) if a2a == 1 else 0.0))[0]  # over the pair rows alone
    early = rates(lambda p, c: call_bytes(sh, "early", p, c, kv_all=False, first_late=False))
    late = rates(lambda p, c: call_bytes(sh, "late", c, p, kv_all=True, first_late=False))
    first = rates(lambda p, c: call_bytes(sh, "late", c, p, kv_all=True, first_late=True))
    cost._cache[key] = out = (diag, early, late, first)
    return out


def local_copy_ms_per_token(cost: "CostModel", charges: str = "zeppelin") -> float:
    """The engine's row gathers and copies around a local call, ms per token (forward + backward; linear
    in tokens, so a rank's local sequences cost ``tokens *`` this however they are batched into calls);
    0 under ``te`` / ``none`` charges. Example (Llama-7B bf16, 2951.7 GB/s):
    :func:`~.engine_costs.zeppelin_local_bytes` of one token is 180 224 B, 6.1e-5 ms.
    """
    if charges != "zeppelin":
        return 0.0
    return hbm_ms(cost, zeppelin_local_bytes(shape_of(cost), 1))
