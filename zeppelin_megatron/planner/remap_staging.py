"""Where each row of a rank's remap comes from, so the runtime copies only rows that move again.

The routed remap (:mod:`.remap_routing`) is written as staging buffers:
``buf_0 = send`` (the rank's rows in direct send order) and, per phase ``t = 1, 2, 3``,
``buf_t = cat(buf_{t-1}[keep_index], got_t)`` with ``got_t`` the rows the phase's
``all_to_all`` delivers. Materialising every ``buf_t`` copies every staged row three
times although most rows never move again (rows of the rank's own node arrive in phase
1 and are only kept afterwards). :func:`staging_plan` follows every row of every
``buf_t`` back to its *origin*, the tensor it really lives in (``0``: ``send``,
``t``: ``got_t``) and its row there, and says, for each phase's send buffer and for the
destination buffer, which rows of which origin to read: the runtime gathers those
directly and never builds ``buf_t``.

A :data:`Gather` is a tuple of ``(origin, rows, positions)``: read ``rows`` (None: all
rows of the origin, in order) of ``origin`` into ``positions`` (None: the whole result,
in order; only when it is the one entry) of the result.

Example: a rank keeps 2 rows (``send`` rows 0, 1) through every phase and receives 1 row
in phase 1 and 1 in phase 3; its destination rows are ``[got_3 row 0, send row 1,
got_1 row 0, send row 0]``: ``final`` gathers ``send`` rows ``[1, 0]`` into positions
``[1, 3]``, all of ``got_1`` into ``[2]`` and all of ``got_3`` into ``[0]``.

Pure (numpy only, no torch) and deterministic, like the rest of the planner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .remap_routing import RoutedExchange

__all__ = ["Gather", "StagingPlan", "gather_plan", "staging_plan"]

Gather = tuple[tuple[int, "np.ndarray | None", "np.ndarray | None"], ...]


@dataclass(frozen=True)
class StagingPlan:
    """A rank's routed remap without staging copies: ``sizes[o]`` rows of origin ``o`` (``send``,
    ``got_1``, ``got_2``, ``got_3``), ``phases[t - 1]`` the :data:`Gather` of phase ``t``'s send
    buffer and ``final`` the one of the destination buffer [T_dst]."""

    sizes: tuple[int, ...]
    phases: tuple[Gather, ...]
    final: Gather

    def rows_read(self) -> tuple[int, int]:
        """``(rows gathered for the phases' send buffers, rows gathered for the destination)``."""
        def count(g: Gather) -> int:
            return sum(self.sizes[o] if r is None else len(r) for o, r, _ in g)
        return sum(count(g) for g in self.phases), count(self.final)


def gather_plan(origin: np.ndarray, row: np.ndarray, sizes: Sequence[int]) -> Gather:
    """The :data:`Gather` of a result whose row ``j`` is row ``row[j]`` of origin ``origin[j]``."""
    origin = np.asarray(origin, dtype=np.int64)
    row = np.asarray(row, dtype=np.int64)
    if origin.shape != row.shape:
        raise ValueError(f"origin {origin.shape} and row {row.shape} must have one entry per result row")
    ids = np.unique(origin)
    out = []
    for o in ids.tolist():
        pos = np.nonzero(origin == o)[0] if len(ids) > 1 else None
        rows = row if pos is None else row[pos]
        whole = len(rows) == sizes[o] and bool(np.array_equal(rows, np.arange(sizes[o])))
        out.append((int(o), None if whole else rows, pos))
    return tuple(out)


def staging_plan(routed: RoutedExchange, send_rows: int, gather: np.ndarray) -> StagingPlan:
    """Follow ``routed``'s staging buffers for a rank sending ``send_rows`` rows in phase 0 order;
    ``gather`` [T_dst]: each destination row's row in the last staging buffer."""
    sizes = [send_rows] + [int(sum(p.recv_counts)) for p in routed.phases]
    origin = np.zeros(send_rows, dtype=np.int64)
    row = np.arange(send_rows, dtype=np.int64)
    phases = []
    for t, p in enumerate(routed.phases, 1):
        si = np.asarray(p.send_index, dtype=np.int64)
        ki = np.asarray(p.keep_index, dtype=np.int64)
        phases.append(gather_plan(origin[si], row[si], sizes))
        origin = np.concatenate([origin[ki], np.full(sizes[t], t, dtype=np.int64)])
        row = np.concatenate([row[ki], np.arange(sizes[t], dtype=np.int64)])
    g = np.asarray(gather, dtype=np.int64)
    return StagingPlan(sizes=tuple(sizes), phases=tuple(phases), final=gather_plan(origin[g], row[g], sizes))
