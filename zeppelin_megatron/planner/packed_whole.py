"""What a packing (:func:`~.packed.packed_groups`) does with whole documents after choosing their groups.

* :func:`spill_whole` (Zeppelin's packings only): a whole document whose group has token room but no rank of it
  holds it goes whole to the least-loaded rank with room of any group, else on a ring over the roomiest ranks,
  where WLB-LLM's packing fails;
* :func:`absorb_whole` (``absorb``): each group's ring takes whole sequences off the group's busiest rank while
  that lowers the group's busiest load.

Both update the packing's per-rank ``load`` and ``tok`` in place. Pure and deterministic.
"""

from __future__ import annotations

from typing import Sequence

from .capacity_level import roomiest_ring
from .plan import PlanError
from .zigzag import zigzag_counts

__all__ = ["absorb_whole", "spill_whole"]


def spill_whole(i: int, s: int, w: float, b: int, cap: int, load: list[float], tok: list[int],
                members: Sequence[Sequence[int]], whole_max: int) -> tuple[int, ...]:
    """Where sequence ``i`` (``s`` tokens, work ``w``) goes when no GPU of its group ``b`` has room for it whole: whole
    on the least-loaded rank with room of any group (the ranks that take whole sequences, ``members``, by group; ties:
    the lower rank); else, where a sequence of at least ``s`` tokens already went whole (``whole_max >= s``), on the
    smallest ring over the roomiest ranks of its group, else of every group (:func:`~.capacity_level.roomiest_ring`;
    ``w`` spread evenly). ``load`` and ``tok`` of the ranks taken are updated (the caller re-sorts their groups).

    Why ``whole_max``: :func:`~.packed.quick_floor` counts the packing's longest whole sequence whole on one rank; a
    shorter one on a ring leaves that bound true, the longest itself would not. Example: ranks 0-3 in groups
    ``(0, 1)`` and ``(2, 3)`` of 100 tokens, 10, 10, 70 and 60 held, loads 0, 0, 1, 2: 50 tokens for group 1 go
    whole to rank 0; with 60, 60, 70, 60 held, 60 tokens fit no rank whole and go on the ring ``(2, 3)``
    (30 + 30) if ``whole_max >= 60``.

    Raises:
        PlanError: neither fits (the packing is no candidate).
    """
    room = [(load[r], r) for ranks in members for r in ranks if tok[r] + s <= cap]
    if room:
        _, r = min(room)
        load[r] += w
        tok[r] += s
        return (r,)
    free = [cap - t for t in tok]
    ring = None
    if whole_max >= s:
        ring = roomiest_ring(s, free, members[b]) or roomiest_ring(s, free, sorted(r for rs in members for r in rs))
    if ring is None:
        raise PlanError(f"sequence {i} ({s} tokens) fits on no GPU of group {b} nor of the others ({cap} tokens per "
                        "GPU)" + ("" if whole_max >= s else " and may not take a ring (it is the longest kept whole)"))
    for r, n in zip(ring, zigzag_counts(s, len(ring))):
        load[r] += w / len(ring)
        tok[r] += n
    return ring


def absorb_whole(lengths: Sequence[int], cap: int, groups: list[tuple[int, ...]], work: Sequence[float],
                 load: list[float], tok: list[int], skip: frozenset[tuple[int, ...]] = frozenset()) -> None:
    """Rings take whole sequences off their group's busiest rank (``groups``, ``load`` and ``tok`` updated in place).
    Rings in ``skip`` (:func:`spill_whole`'s) take none: :func:`~.packed.quick_floor` counts a whole sequence at
    best on a ring of its group, and a spilled ring may be another size.

    A packing weighs a sharded sequence by its own ring (:func:`~.packed.sharded_ms`: a call's overhead and the
    all-to-alls' latency) and a whole one by ``local_ms``; a whole sequence then sits as a lump on one rank of its
    group, while one more sequence on a ring that runs anyway costs each of its ``g`` ranks about ``work / g`` (the
    ring's calls run all its sequences together). Per ring (rank tuples of split sequences, sorted), while its busiest
    rank ``b`` (ties: the lower rank) holds a whole sequence of at least ``2 g`` tokens that fits every rank of
    the ring afterwards (``tok`` against ``cap``; zigzag shares) and whose move gives ``max(load_b - w,
    load_2) + w / g < load_b`` (``w`` its work, ``load_2`` the next busiest rank's load), the one with the
    lowest such estimate joins the ring. The estimate is the packing's; the candidate's floor and predicted step
    (:func:`~.packed.packed_floor`, :func:`~.predict.predict`) judge the result.

    Example (weights of 1 per token, ``cap`` large): ring ``(0, 1)`` holding 8000 tokens (loads 4000 each), rank
    0 also 3000 and 1000 whole (load 8000), rank 1 nothing else: moving 3000 gives ``max(5000, 4000) + 1500 =
    6500``, moving 1000 ``max(7000, 4000) + 500 = 7500``: 3000 joins (loads 6500 and 5500); then rank 0's 1000
    gives ``max(5500, 5500) + 500 = 6000 < 6500``: it joins too (loads 6000, 6000)."""
    rings = sorted({g for g in groups if len(g) >= 2} - skip)
    on: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        if len(g) == 1:
            on.setdefault(g[0], []).append(i)
    for ring in rings:
        n = len(ring)
        while True:
            top = max(ring, key=lambda r: (load[r], -r))
            second = max((load[r] for r in ring if r != top), default=0.0)
            best = None
            for i in on.get(top, ()):
                s = lengths[i]
                if s < 2 * n:
                    continue
                est = max(load[top] - work[i], second) + work[i] / n
                if not (est < load[top] - 1e-9 and (best is None or (est, i) < best)):
                    continue  # no better than the best so far: its room need not be checked
                if any(tok[r] - (s if r == top else 0) + t > cap for r, t in zip(ring, zigzag_counts(s, n))):
                    continue
                best = (est, i)
            if best is None:
                break
            i = best[1]
            s = lengths[i]
            on[top].remove(i)
            load[top] -= work[i]
            tok[top] -= s
            for r, t in zip(ring, zigzag_counts(s, n)):
                load[r] += work[i] / n
                tok[r] += t
            groups[i] = ring
