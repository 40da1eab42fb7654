"""Ring parts: a head-parallel ring of several sequences run as two rings, so its all-to-alls overlap calls.

A head-parallel ring (:mod:`.head_parallel`) exchanges its members' rows in a ``heads`` all-to-all before
its calls and a ``tokens`` all-to-all after them. The lowering posts every ``heads`` all-to-all of a rank
first and waits every ``tokens`` one last (:mod:`.lowering`), so when the ring's sequences are split into
two rings over the same ranks at the same width (parts ``A`` and ``B``, :attr:`~.plan_parts.SequencePlan.part`),
``B``'s ``heads`` all-to-all flows while ``A``'s calls run and ``A``'s ``tokens`` one while ``B``'s run.
Per member, from :func:`~.cost_heads.head_ring_time` of each (``heads``, ``tokens``: the all-to-alls;
``body``: the rest, calls, lane steps and copies), the all-to-alls of one rank one after the other on its
NVLink::

    whole = heads + body + tokens
    A_end = heads_A + body_A
    B_end = max(A_end, heads_A + heads_B) + body_B
    split = max(B_end, A_end + tokens_A) + tokens_B

:func:`split_rings` splits each head-parallel ring of two or more sequences where ``split < whole``: the
two all-to-alls it hides must outweigh what the second part costs (a second call per step, at least the
profile's call overhead, its copies, the all-to-alls' latencies). The parts: the ring's sequences longest
first, each to the part with less work (``sum s^2``) so far, ties to ``A``. The parts run in order
(:func:`~.ring_order.ring_order` breaks ties by part), the ring's local slots go to part ``A``, and
nothing else changes (the same tokens on the same ranks, the same widths). :func:`~.predict.predict` times
a ring's parts by the same timeline (:func:`parts_time`). Pure, deterministic.

Worked example (Llama-7B, ``charges="zeppelin"``, one node of 8 H100s, Ulysses over ranks 0-7, ms per layer):
sequences of 32 768 and 24 576 tokens as one ring: heads 0.462 + body 19.472 + tokens 0.462 = 20.395. In
parts, ``A = [32768]`` (heads 0.266, body 12.366, tokens 0.266) and ``B = [24576]`` (0.201, 7.105, 0.201):
``A`` ends at 0.266 + 12.366 = 12.632, ``B``'s heads arrived at 0.467, ``B`` ends at 12.632 + 7.105 =
19.738 (rounded), its tokens at 19.938 (``A``'s left at 12.898): 19.938 < 20.395, so the ring is split (the step
simulates 1040.3 -> 1026.2 ms over 32 layers; tests/planner/test_ring_parts.py). Two sequences of 8192 and
6144 tokens are not: their all-to-alls take 0.24 ms, less than a second call costs (at least the call
overhead, 1.09 ms): 2.478 against 1.698.
"""

from __future__ import annotations

from typing import Sequence

from .cost_heads import head_ring_time
from .cost_model import CostModel
from .plan import StepPlan
from .plan_parts import LocalSlot, Ring, SequencePlan

__all__ = ["halves", "part_times", "parts_time", "split_rings", "parted", "CHARGES"]

CHARGES = "zeppelin"
"""The charge model the split is decided under (the engine's copies and fp32 dK/dV, as the simulator runs it)."""


def parted(rings: Sequence[Ring]) -> set[tuple[tuple[int, ...], int]]:
    """``(ranks, a2a)`` of every ring run in parts (some ring over those ranks at that width has ``part > 0``).
    Example: parts 0 and 1 over ranks ``(0, 1)`` at width 2 and a plain ring over ``(2, 3)``: ``{((0, 1), 2)}``."""
    return {(r.ranks, r.a2a) for r in rings if r.part}


def halves(lengths: Sequence[int]) -> tuple[list[int], list[int]]:
    """Indices into ``lengths`` of parts ``A`` and ``B``: longest first (ties: lower index), each to the part with
    less ``sum s^2`` so far (ties: ``A``). Example: ``[3000, 8192, 6144, 100]``: ``A = [1]``, ``B = [2, 0, 3]``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    a: list[int] = []
    b: list[int] = []
    wa = wb = 0
    for i in order:
        if wa <= wb:
            a.append(i)
            wa += lengths[i] ** 2
        else:
            b.append(i)
            wb += lengths[i] ** 2
    return a, b


def parts_time(cost: CostModel, ranks: tuple[int, ...], parts: Sequence[Sequence[int]], a2a: int,
               charges: str = CHARGES) -> tuple[float, float]:
    """``(total, exposed)``: one member's per-layer time in consecutive head-parallel rings over ``ranks`` at width
    ``a2a``, part ``p`` holding the lengths ``parts[p]``, and how much of it is all-to-all time no call covers.
    Every ``heads`` all-to-all starts at 0 and they end one after the other; part ``p`` starts when the previous
    part ends and its own ``heads`` has arrived; its ``tokens`` leaves at its end, after the previous ``tokens``
    (module docstring). One part: ``head_ring_time(...).total`` and its ``a2a_ms``."""
    heads = clock = tokens = busy = 0.0
    for lengths in parts:
        h = head_ring_time(cost, ranks, list(lengths), a2a, charges)
        heads += h.heads_ms
        body = h.total - h.a2a_ms
        clock = max(clock, heads) + body
        tokens = max(tokens, clock) + h.tokens_ms
        busy += body
    return tokens, tokens - busy


def part_times(cost: CostModel, ranks: tuple[int, ...], lengths: Sequence[int], a2a: int,
               charges: str = CHARGES) -> tuple[float, float]:
    """``(whole, split)``: one member's per-layer time in the ring of ``lengths`` over ``ranks`` at width ``a2a``,
    as one ring and as the two parts of :func:`halves` (module docstring). Needs two or more lengths."""
    if len(lengths) < 2:
        raise ValueError(f"a ring of {len(lengths)} sequence(s) has no two parts; need at least 2")
    ia, ib = halves(lengths)
    whole = head_ring_time(cost, ranks, list(lengths), a2a, charges).total
    return whole, parts_time(cost, ranks, [[lengths[i] for i in ia], [lengths[i] for i in ib]], a2a, charges)[0]


def split_rings(plan: StepPlan, cost: CostModel) -> StepPlan:
    """``plan`` with each head-parallel ring of two or more sequences split into parts where :func:`part_times`
    predicts the split faster (module docstring); ``plan`` itself when none is. Sequences of part ``B`` get
    ``part = 1``; the ring's local slots move to part ``A``'s ring (same step). The prediction is not redone
    (the caller's)."""
    rings = plan.rings
    split: dict[int, set[int]] = {}  # ring index -> sequences of part B
    for k, ring in enumerate(rings):
        if ring.a2a < 2 or len(ring.seqs) < 2 or any(plan.sequences[i].part for i in ring.seqs):
            continue
        lengths = [plan.sequences[i].length for i in ring.seqs]
        whole, parted = part_times(cost, ring.ranks, lengths, ring.a2a)
        if parted < whole:
            split[k] = {ring.seqs[j] for j in halves(lengths)[1]}
    if not split:
        return plan
    moved = set().union(*split.values())
    seqs = tuple(SequencePlan(s.length, s.placement, s.ranks, s.a2a, 1) if i in moved else s
                 for i, s in enumerate(plan.sequences))
    out = plan.evolve(sequences=seqs, local_slots=())
    index = {(r.ranks, r.a2a, r.part): k for k, r in enumerate(out.rings)}
    slots = tuple(LocalSlot(x.rank, index[(rings[x.ring].ranks, rings[x.ring].a2a, 0)], x.step, x.seqs)
                  for x in plan.local_slots)
    return out.evolve(local_slots=slots) if slots else out
