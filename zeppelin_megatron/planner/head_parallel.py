"""Head-parallel rings: all-to-all over heads inside blocks of a ring, ring across the blocks.

A split sequence (or a group of them sharing ranks) may run *head-parallel*:
its ``G`` ranks (ring order) form ``m = G / a`` blocks of ``a`` consecutive
ranks (``a``: :attr:`~.plan_parts.SequencePlan.a2a`, the block width); lane
``l`` of block ``b`` is ring position ``b * a + l``. The attention layout is the
plain zigzag layout over ``G`` positions (:mod:`.zigzag`), so capacities, the
remap and the layout checks are those of a plain ring. Execution:

1. *to heads*: inside each block, an all-to-all: every lane sends lane ``l``
   the rows it holds for ``l``'s head slice (:func:`lane_heads`); lane ``l``
   then holds its block's tokens of the ring's sequences (block order:
   :func:`block_ranges`) for its head slice only;
2. a ring over the ``m`` blocks, lane by lane (lane ``l`` of block ``b`` sends to
   lane ``l`` of block ``b + 1``), with the zigzag diag / early / late calls at
   block granularity; ``m = 1`` (``a = G``): one causal call over whole
   sequences, Ulysses; ``1 < a < G``: the hybrid (all-to-all inside each
   block, ring across blocks, like TE's ``a2a+p2p``);
3. *to tokens*: the reverse all-to-all of the output (backward: ``dq``,
   ``dk``, ``dv``; a K/V head that several lanes share sums their blocks).

Why the layout stays a zigzag: a block's positions ``b a .. b a + a - 1`` hold
chunks ``b a .. b a + a - 1`` (contiguous, early) and ``2G - 1 - (b a + a - 1)
.. 2G - 1 - b a`` (contiguous, late), which is the zigzag of the ``m``-block
ring with chunks ``a`` times as large. Worked example, length 16 over ``G = 4``
ranks, ``a = 2`` (8 chunks of 2 tokens): block 0 (positions 0, 1) holds early
``[0, 4)`` and late ``[12, 16)``; block 1 (positions 2, 3) holds ``[4, 8)`` and
``[8, 12)``.

Heads (per Zeppelin rank, i.e. per tensor-parallel rank): lane ``l`` takes
query heads ``[l hq / a, (l + 1) hq / a)``, which needs ``a | hq``; its K/V
heads are the ones those queries read: ``hkv / a`` of them when ``a | hkv``,
else one (replicated over ``a / hkv`` lanes) when ``hkv | a``. Other head
counts cannot run head-parallel at that width (:func:`head_split_error`); the
planner then keeps the plain ring, never refusing the batch.

Pure integer arithmetic, standard library only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .plan_parts import PlanError
from .zigzag import chunk_range, zigzag_ranges

if TYPE_CHECKING:
    from .plan import StepPlan
    from .plan_parts import SequencePlan

__all__ = ["block_ranges", "lane_runs", "lane_heads", "head_split_error", "lane_kv_heads", "lanes_share_kv",
           "check_head_parallel"]


def block_ranges(length: int, ring_size: int, a2a: int, block: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Early and late ``[start, end)`` token ranges block ``block`` of a head-parallel ring holds.

    ``ring_size``: ``G`` ranks; ``a2a``: block width (divides ``G``). The union of the
    zigzag chunks of positions ``block * a2a .. block * a2a + a2a - 1``. Example: length 16,
    ``G = 4``, ``a2a = 2``: block 0 -> ``((0, 4), (12, 16))``, block 1 -> ``((4, 8), (8, 12))``;
    ``a2a = 4``: block 0 -> ``((0, 8), (8, 16))``.
    """
    if a2a < 1 or ring_size % a2a:
        raise ValueError(f"block width {a2a} does not divide the ring size {ring_size}")
    m = ring_size // a2a
    if not 0 <= block < m:
        raise ValueError(f"block {block} is outside a ring of {m} blocks")
    first, last = block * a2a, block * a2a + a2a - 1
    early = (chunk_range(length, ring_size, first)[0], chunk_range(length, ring_size, last)[1])
    late = (chunk_range(length, ring_size, 2 * ring_size - 1 - last)[0],
            chunk_range(length, ring_size, 2 * ring_size - 1 - first)[1])
    return early, late



def lane_runs(lengths: Sequence[int], ring_size: int, a2a: int, block: int,
              lane: int) -> tuple[tuple[int, int, int], ...]:
    """Where lane ``lane``'s own tokens sit in block ``block``'s head buffer: ``(own, row, count)`` runs.

    The lane holds zigzag position ``p = block a2a + lane`` of the ring's sequences (``lengths``, seq-major:
    early chunk, then late, per sequence: its ``own`` rows, :attr:`~.lowering_parts.RingPart.rows` order);
    the head buffer holds the block's tokens seq-major (per sequence its early range, then its late one,
    :func:`block_ranges`). Own tokens ``[own, own + count)`` fill head rows ``[row, row + count)``; runs
    that continue each other in both are merged and empty chunks skipped, so a head-parallel all-to-all
    moves one message per run (:mod:`.lowering`) straight into place. Example: lengths ``(16,)``,
    ``ring_size = 4``, ``a2a = 2``, block 0 (early ``[0, 4)``, late ``[12, 16)``: rows 0-3 and 4-7): lane 0
    holds ``[0, 2)`` and ``[14, 16)`` -> ``((0, 0, 2), (2, 6, 2))``; lane 1 holds ``[2, 4)`` and ``[12, 14)``,
    which meet in the buffer -> ``((0, 2, 4),)``. Lengths ``(16, 8)``: lane 0's late chunk of the first
    sequence and early chunk of the second meet too -> ``((0, 0, 2), (2, 6, 3), (5, 11, 1))``.
    """
    runs: list[list[int]] = []
    own = off = 0
    p = block * a2a + lane
    for n in lengths:
        (e0, e1), (l0, l1) = block_ranges(n, ring_size, a2a, block)
        for (lo, base), (a, z) in zip(((e0, off), (l0, off + e1 - e0)), zigzag_ranges(n, ring_size, p)):
            if z > a:
                row = base + a - lo
                if runs and runs[-1][0] + runs[-1][2] == own and runs[-1][1] + runs[-1][2] == row:
                    runs[-1][2] += z - a
                else:
                    runs.append([own, row, z - a])
                own += z - a
        off += e1 - e0 + l1 - l0
    return tuple((o, r, c) for o, r, c in runs)


def head_split_error(hq: int, hkv: int, a2a: int) -> str | None:
    """Why ``hq`` query and ``hkv`` K/V heads cannot be split over ``a2a`` lanes (None: they can).

    Example: ``(32, 8, 8)``, ``(32, 8, 16)`` and ``(32, 2, 8)`` split; ``(12, 4, 8)`` does not
    (8 does not divide 12 query heads); ``(24, 6, 4)`` neither (4 K/V-head lanes of 6 heads).
    """
    if a2a < 1 or hq < 1 or hkv < 1 or hq % hkv:
        return f"heads hq={hq}, hkv={hkv} (hq must be a multiple of hkv) over {a2a} lanes"
    if hq % a2a:
        return f"{a2a} lanes do not divide {hq} query heads"
    if hkv % a2a and a2a % hkv:
        return f"{a2a} lanes and {hkv} K/V heads: neither divides the other"
    return None


def lane_kv_heads(hkv: int, a2a: int) -> int:
    """K/V heads each lane holds: ``hkv / a2a`` when ``a2a | hkv``, else 1 (``hkv | a2a``)."""
    return hkv // a2a if hkv % a2a == 0 else 1


def lanes_share_kv(hkv: int, a2a: int) -> bool:
    """Whether lanes share K/V heads at width ``a2a`` (``hkv % a2a != 0``: each lane holds one K/V head that
    ``a2a / hkv`` lanes hold, :func:`lane_kv_heads`): their dK/dV are then summed at home over the lanes.
    Example: ``(8, 4)`` -> False (two K/V heads per lane), ``(2, 8)`` -> True (four lanes per K/V head)."""
    return hkv % a2a != 0


def lane_heads(hq: int, hkv: int, a2a: int, lane: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Query and K/V head ranges ``[start, end)`` of ``lane``.

    Example: ``hq = 32``, ``hkv = 8``: ``a2a = 4``, lane 1 -> ``((8, 16), (2, 4))``; ``a2a = 16``,
    lane 5 -> ``((10, 12), (2, 3))`` (query heads 10, 11 read K/V head ``10 // 4 = 2``).
    Raises ``ValueError`` (:func:`head_split_error`) when the heads do not split.
    """
    why = head_split_error(hq, hkv, a2a)
    if why is not None:
        raise ValueError(f"cannot split heads over {a2a} lanes: {why}")
    if not 0 <= lane < a2a:
        raise ValueError(f"lane {lane} is outside [0, {a2a})")
    per_q = hq // a2a
    q = (lane * per_q, (lane + 1) * per_q)
    if hkv % a2a == 0:
        per_kv = hkv // a2a
        return q, (lane * per_kv, (lane + 1) * per_kv)
    kv = lane * hkv // a2a
    return q, (kv, kv + 1)


def check_head_parallel(plan: "StepPlan") -> None:
    """Every sequence's ``a2a``: 1 for local ones; for split ones a divisor of its rank count whose
    blocks each lie in one node (the all-to-all runs over NVLink); its ``part``: an integer >= 0, 0 for
    local ones (:mod:`.ring_parts`). Raises :class:`PlanError` naming the sequence, the value and the limit."""
    gpn = plan.gpus_per_node

    def named(i: int, s: "SequencePlan") -> str:
        return f"sequence {i} (length {s.length}, {s.placement} on ranks {list(s.ranks)})"

    for i, s in enumerate(plan.sequences):
        a = s.a2a
        if s.part != 0:
            where = named(i, s)
            if not isinstance(s.part, int) or isinstance(s.part, bool) or s.part < 0:
                raise PlanError(f"{where}: part is {s.part!r}, expected an integer >= 0")
            if s.placement == "local":
                raise PlanError(f"{where}: part is {s.part}, but a local sequence is in no ring (part must be 0)")
        if a == 1:
            continue
        where = named(i, s)
        if not isinstance(a, int) or isinstance(a, bool) or a < 1:
            raise PlanError(f"{where}: a2a is {a!r}, expected an integer >= 1")
        if s.placement == "local":
            raise PlanError(f"{where}: a2a is {a}, but a local sequence runs whole (a2a must be 1)")
        if len(s.ranks) % a:
            raise PlanError(f"{where}: a2a is {a}, which does not divide its {len(s.ranks)} ranks")
        for b in range(len(s.ranks) // a):
            block = s.ranks[b * a:(b + 1) * a]
            if len({r // gpn for r in block}) != 1:
                raise PlanError(f"{where}: a2a block {b} (ranks {list(block)}) spans nodes; "
                                f"each block of {a} must lie in one node of {gpn} GPUs")
