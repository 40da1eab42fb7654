"""How a rank's local sequences are cut into chunks that fill its ring-step waits.

The runtime engine (:mod:`zeppelin_megatron.runtime.engine`) runs one chunk of
the rank's local (single-GPU) sequences in each ring it is a member of, after
the ring's step-0 (diagonal) kernel and before step 0's wait, so the local
kernel overlaps that step's K/V transfer; the simulator's ``runtime`` engine
model (:mod:`zeppelin_megatron.sim.program`) uses the same split. A rank has
one *slot* per ring it is a member of. (One chunk per ring rather than one
per ring step: every call pays the kernel's call overhead, and a chunk in
every step delays every step of the ring for its other members. Simulated,
one chunk per ring was within 0.4% of, or faster than, one chunk per ring
step on the configurations in ``docs/runtime.md``.)

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

__all__ = ["split_local"]


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
