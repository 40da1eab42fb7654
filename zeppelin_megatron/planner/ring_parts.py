"""Ring parts: a head-parallel ring of several sequences run as two or three rings, so its all-to-alls overlap calls.

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

With three parts (``A``, ``B``, ``C``) the timeline goes on the same way: ``C`` starts when ``B`` ends and its
``heads`` has arrived (after ``B``'s), its ``tokens`` leaves after ``B``'s (:func:`parts_time`, any number).
:func:`split_rings` splits each head-parallel ring of two or more sequences where the faster of two and three
parts (:func:`best_parts`, at most :data:`PARTS_MAX`; ties: two) beats ``whole``: the all-to-alls it hides
must outweigh what each further part costs (a further call per step, at least the profile's call overhead, its
copies, the all-to-alls' latencies). The parts (:func:`shares`): the ring's sequences longest first, each to
the part with the least work (``sum s^2``) so far, ties to the earlier part. The parts run in order
(:func:`~.ring_order.ring_order` breaks ties by part), the ring's local slots go to part ``A``, and
nothing else changes (the same tokens on the same ranks, the same widths). :func:`~.predict.predict` times
a ring's parts by the same timeline (:func:`parts_time`). Pure, deterministic.

Worked example (Llama-7B, ``charges="zeppelin"``, one node of 8 H100s, Ulysses over ranks 0-7, ms per layer):
sequences of 32 768 and 24 576 tokens as one ring: heads 0.477 + body 19.153 + tokens 0.477 = 20.107. In
parts, ``A = [32768]`` (heads 0.271, body 12.184, tokens 0.271) and ``B = [24576]`` (0.206, 6.969, 0.206):
``A`` ends at 0.271 + 12.184 = 12.455, ``B``'s heads arrived at 0.477, ``B`` ends at 12.455 + 6.969 =
19.424, its tokens at 19.630 (``A``'s left at 12.726): 19.630 < 20.107, so the ring is split (the step
simulates 1031.1 -> 1016.4 ms over 32 layers; tests/planner/test_ring_parts.py). Two sequences of 8192 and
6144 tokens are not: their all-to-alls take 0.27 ms, less than a second call costs (at least the call
overhead, 1.09 ms): 2.409 against 1.648. With a third sequence of 16 384 tokens: whole 23.569, two parts
(32 768 | 24 576 + 16 384) 22.952, three 22.746: three parts.
"""

from __future__ import annotations

from typing import Sequence

from .cost_heads import head_ring_time
from .cost_model import CostModel
from .plan import StepPlan
from .plan_parts import LocalSlot, Ring, SequencePlan

__all__ = ["shares", "best_parts", "parts_time", "split_of", "family_time", "split_rings", "parted", "CHARGES",
           "PARTS_MAX"]

CHARGES = "zeppelin"
"""The charge model the split is decided under (the engine's copies and fp32 dK/dV, as the simulator runs it)."""


def parted(rings: Sequence[Ring]) -> set[tuple[tuple[int, ...], int]]:
    """``(ranks, a2a)`` of every ring run in parts (some ring over those ranks at that width has ``part > 0``).
    Example: parts 0 and 1 over ranks ``(0, 1)`` at width 2 and a plain ring over ``(2, 3)``: ``{((0, 1), 2)}``."""
    return {(r.ranks, r.a2a) for r in rings if r.part}


PARTS_MAX = 3
"""The most parts a ring is split into (:func:`best_parts`): on docs/BENCHMARKS.md's 60 configurations four gained
0.0002 over three in Zeppelin / best peer, three 0.0006 over two."""


def shares(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Indices into ``lengths`` of ``k`` parts: longest first (ties: lower index), each to the part with the least
    ``sum s^2`` so far (ties: the lower part). Example: ``[3000, 8192, 6144, 100]``, ``k = 2``: ``[[1], [2, 0, 3]]``;
    ``k = 3``: ``[[1], [2], [0, 3]]``."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    parts: list[list[int]] = [[] for _ in range(k)]
    work = [0] * k
    for i in order:
        p = min(range(k), key=lambda j: (work[j], j))
        parts[p].append(i)
        work[p] += lengths[i] ** 2
    return parts


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


def best_parts(cost: CostModel, ranks: tuple[int, ...], lengths: Sequence[int], a2a: int,
               charges: str = CHARGES) -> tuple[float, float, list[list[int]]]:
    """``(whole, best, parts)``: one member's per-layer time in the ring of ``lengths`` over ``ranks`` at width
    ``a2a`` as one ring, and the lowest of its splits into ``k = 2 .. PARTS_MAX`` parts (:func:`shares`, at least one
    sequence a part; ties: fewer parts) with those parts (indices into ``lengths``). Needs two or more lengths."""
    if len(lengths) < 2:
        raise ValueError(f"a ring of {len(lengths)} sequence(s) has no two parts; need at least 2")
    whole = head_ring_time(cost, ranks, list(lengths), a2a, charges).total
    best: tuple[float, list[list[int]]] | None = None
    for k in range(2, min(PARTS_MAX, len(lengths)) + 1):
        parts = shares(lengths, k)
        t = parts_time(cost, ranks, [[lengths[i] for i in p] for p in parts], a2a, charges)[0]
        if best is None or t < best[0]:
            best = (t, parts)
    assert best is not None
    return whole, best[0], best[1]


def split_of(cost: CostModel, ranks: tuple[int, ...], lengths: Sequence[int], a2a: int) -> list[list[int]]:
    """The parts :func:`split_rings` runs a head-parallel ring of ``lengths`` in (indices into ``lengths``): those of
    :func:`best_parts` where they beat the whole ring, else one part of every index. Example: one length: ``[[0]]``."""
    if len(lengths) >= 2:
        whole, parted, parts = best_parts(cost, ranks, lengths, a2a)
        if parted < whole:
            return parts
    return [list(range(len(lengths)))]


def family_time(cost: CostModel, ranks: tuple[int, ...], family: Sequence[Sequence[int]], a2a: int,
                charges: str = CHARGES) -> tuple[float, float, float]:
    """``(total, own, a2a_ms)`` of one member of a head-parallel ring over ``ranks`` at width ``a2a`` run as the
    parts ``family`` (their lengths, in queue order; one part: the ring whole, :func:`~.cost_heads.head_ring_time`):
    the parts' :func:`parts_time` and the sum of their own times. What :func:`~.predict.ring_loads` charges a ring
    run in parts on its first part."""
    if len(family) == 1:
        h = head_ring_time(cost, ranks, list(family[0]), a2a, charges)
        return h.total, h.own, h.a2a_ms
    total, a2a_ms = parts_time(cost, ranks, family, a2a, charges)
    return total, sum(head_ring_time(cost, ranks, list(ls), a2a, charges).own for ls in family), a2a_ms


def split_rings(plan: StepPlan, cost: CostModel) -> StepPlan:
    """``plan`` with each head-parallel ring of two or more sequences split into parts where :func:`best_parts`
    predicts a split faster (module docstring; two or three parts, the faster); ``plan`` itself when none is.
    Sequences of part ``p`` get ``part = p``; the ring's local slots move to part 0's ring (same step). The
    prediction is not redone (the caller's)."""
    rings = plan.rings
    moved: dict[int, int] = {}  # sequence -> its part (> 0)
    for ring in rings:
        if ring.a2a < 2 or len(ring.seqs) < 2 or any(plan.sequences[i].part for i in ring.seqs):
            continue
        lengths = [plan.sequences[i].length for i in ring.seqs]
        parts = split_of(cost, ring.ranks, lengths, ring.a2a)
        moved.update((ring.seqs[j], p) for p, part in enumerate(parts) if p for j in part)
    if not moved:
        return plan
    seqs = tuple(SequencePlan(s.length, s.placement, s.ranks, s.a2a, moved[i]) if i in moved else s
                 for i, s in enumerate(plan.sequences))
    out = plan.evolve(sequences=seqs, local_slots=())
    index = {(r.ranks, r.a2a, r.part): k for k, r in enumerate(out.rings)}
    slots = tuple(LocalSlot(x.rank, index[(rings[x.ring].ranks, rings[x.ring].a2a, 0)], x.step, x.seqs)
                  for x in plan.local_slots)
    return out.evolve(local_slots=slots) if slots else out
