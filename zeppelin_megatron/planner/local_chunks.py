"""Where a rank's local sequences run among its rings, and how they are cut into chunks.

The runtime engine (:mod:`zeppelin_megatron.runtime.engine`) runs one chunk of
the rank's local (single-GPU) sequences in each *filling* ring it is a member
of, after the ring's step-0 (diagonal) kernel and before step 0's wait, so
the local kernel overlaps that step's K/V transfer; the simulator's
``runtime`` engine model (:mod:`zeppelin_megatron.sim.program`) uses the same
rules. A ring *fills* (:func:`filling_rings`) when none of its members is a
member of a later ring in queue order: a chunk there can hold up the ring's
other members, but no later ring waits on them. A rank has one *slot* per
filling ring it is a member of (filling rings share no rank, so at most
one); with no slot its local work runs after the rings.
(Simulated in ``docs/runtime.md``: a chunk in every ring, or in every ring
step, delays rings whose members go on to later rings and made 5 of 12
configurations slower than running all local work after the rings.)

Split: whole sequences, greedy longest-processing-time by causal work
``L^2``: sequences in order of decreasing ``L^2`` (ties: lower index first)
each go to the chunk with the least work so far (ties: lower chunk index).
``min(slots, len(lengths))`` chunks, so every chunk is non-empty; chunk ``c``
fills slot ``c``. Within a chunk, sequences keep their input order.

Worked example: lengths ``[10, 30, 20, 5]``, 2 slots. By work: 30 (900) ->
chunk 0; 20 (400) -> chunk 1; 10 (100) -> chunk 1 (500 < 900); 5 (25) ->
chunk 1 (500 < 900): chunks ``((1,), (0, 2, 3))`` (works 900 and 525).

Pure integer arithmetic: no torch, no numpy.
"""

from __future__ import annotations

import heapq
from typing import Sequence

__all__ = ["filling_rings", "split_local"]


def filling_rings(rings: Sequence[Sequence[int]]) -> tuple[bool, ...]:
    """Per ring (member ranks, in queue order): True when no member is in a later ring.

    Example: rings ``[(0, 1), (2, 3), (1, 2)]`` -> ``(False, False, True)``
    (ranks 1 and 2 go on to ring ``(1, 2)``).
    """
    out: list[bool] = []
    later: set[int] = set()
    for ranks in reversed(rings):
        out.append(not later.intersection(ranks))
        later.update(ranks)
    return tuple(reversed(out))


def split_local(lengths: Sequence[int], slots: int) -> tuple[tuple[int, ...], ...]:
    """Indices into ``lengths``, one tuple per chunk (see module docstring).

    ``slots == 0`` (no ring step to fill) or no sequences: one chunk holding
    every sequence, or none when ``lengths`` is empty.
    """
    if slots < 0:
        raise ValueError(f"slots must be >= 0, got {slots}")
    for i, n in enumerate(lengths):
        if n < 1:
            raise ValueError(f"local sequence {i} has length {n}; lengths must be >= 1")
    if not lengths:
        return ()
    n_chunks = max(1, min(slots, len(lengths)))
    heap = [(0, c) for c in range(n_chunks)]  # (work so far, chunk): the least loaded, lowest index on top
    members: list[list[int]] = [[] for _ in range(n_chunks)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i] * lengths[i], i)):
        load, c = heapq.heappop(heap)
        members[c].append(i)
        heapq.heappush(heap, (load + lengths[i] * lengths[i], c))
    return tuple(tuple(sorted(m)) for m in members)
