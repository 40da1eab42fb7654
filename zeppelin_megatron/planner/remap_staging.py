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
in order; only when it is the one entry) of the result. Origin :data:`SOURCE` (``-1``, the
last entry of ``sizes``) is the rank's source tensor itself: rows that stay on the rank
(``RankExchange.keep_src``) never enter the exchange and the destination reads them from there.
:func:`rank_staging` builds a rank's whole plan (direct or routed); the runtime
(``runtime/remap.py``) and the simulator's charges (:func:`~.engine_costs.remap_gathers`) both read it.

Example: a rank keeps 2 rows (``send`` rows 0, 1) through every phase and receives 1 row
in phase 1 and 1 in phase 3; its destination rows are ``[got_3 row 0, send row 1,
got_1 row 0, send row 0]``: ``final`` gathers ``send`` rows ``[1, 0]`` into positions
``[1, 3]``, all of ``got_1`` into ``[2]`` and all of ``got_3`` into ``[0]``.

Pure (numpy only, no torch) and deterministic, like the rest of the planner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .remap import RankExchange
from .remap_routing import RoutedExchange

if TYPE_CHECKING:
    from .lowering_parts import LocalChunk

__all__ = ["Gather", "StagingPlan", "SOURCE", "gather_plan", "staging_plan", "rank_staging", "drop_rows",
           "in_place_rows"]

SOURCE = -1
"""The origin of staying rows: the rank's source tensor (``sizes[-1]`` rows)."""

Gather = tuple[tuple[int, "np.ndarray | None", "np.ndarray | None"], ...]


@dataclass(frozen=True)
class StagingPlan:
    """A rank's remap without staging copies: ``sizes[o]`` rows of origin ``o`` (``send``, then
    ``got_1`` .. ``got_n`` (direct: ``n = 1``, the received buffer), then the source tensor,
    :data:`SOURCE`), ``phases[t - 1]`` the :data:`Gather` of routed phase ``t``'s send buffer (none
    when direct) and ``final`` the one of the destination buffer [T_dst]."""

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


def staging_plan(routed: RoutedExchange, send_rows: int, gather: np.ndarray, src_rows: int = 0) -> StagingPlan:
    """Follow ``routed``'s staging buffers for a rank sending ``send_rows`` rows in phase 0 order;
    ``gather`` [T_dst]: each destination row's row in the last staging buffer, or ``-1 - i`` for row
    ``i`` of the source tensor (``src_rows`` rows; origin :data:`SOURCE`)."""
    sizes = [send_rows] + [int(sum(p.recv_counts)) for p in routed.phases] + [src_rows]
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
    moved = g >= 0
    fo, fr = np.full(len(g), SOURCE, dtype=np.int64), -1 - g
    fo[moved], fr[moved] = origin[g[moved]], row[g[moved]]
    return StagingPlan(sizes=tuple(sizes), phases=tuple(phases), final=gather_plan(fo, fr, sizes))


def rank_staging(ex: RankExchange, routed: RoutedExchange | None, t_src: int, t_dst: int) -> StagingPlan:
    """A rank's remap in one direction as gathers (:class:`StagingPlan`): the direct exchange ``ex`` (its
    rows received, its staying rows ``keep_src`` -> ``keep_dst`` read from the source tensor of ``t_src``
    rows) or, with ``routed``, its phases. Raises ``ValueError`` unless the received and kept rows fill each
    of the ``t_dst`` destination rows once.

    Example (direct): 2 rows received into destination rows ``[1, 2]``, source row 4 kept as row 0 ->
    ``sizes (S, 2, t_src)``, ``final ((-1, [4], [0]), (1, None, [1, 2]))``.
    """
    recv = np.asarray(ex.recv_index, dtype=np.int64)
    keep_src, keep_dst = np.asarray(ex.keep_src, dtype=np.int64), np.asarray(ex.keep_dst, dtype=np.int64)
    filled = np.concatenate([recv, keep_dst])
    if len(filled) != t_dst or (t_dst and np.bincount(filled, minlength=t_dst).max() != 1):
        raise ValueError(f"the remap fills {len(recv)} received + {len(keep_dst)} kept rows, not each of the "
                         f"destination's {t_dst} rows once")
    if len(keep_src) and (keep_src.min() < 0 or keep_src.max() >= t_src):
        raise ValueError(f"kept source rows must lie in [0, {t_src}), got [{keep_src.min()}, {keep_src.max()}]")
    gather = np.empty(t_dst, dtype=np.int64)
    gather[keep_dst] = -1 - keep_src
    if routed is None:
        gather[recv] = np.arange(len(recv))
        sizes = (len(ex.send_index), len(recv), t_src)
        moved = gather >= 0
        origin = np.where(moved, 1, SOURCE)
        row = np.where(moved, gather, -1 - gather)
        return StagingPlan(sizes=sizes, phases=(), final=gather_plan(origin, row, sizes))
    gather[recv] = routed.final_index
    return staging_plan(routed, len(ex.send_index), gather, t_src)



def in_place_rows(chunks: "Sequence[LocalChunk]", direction: str) -> np.ndarray:
    """The destination rows of ``direction``'s remap that the *in-place* local chunks (``linear_rows`` not None:
    the engine runs them on the rank's linear rows) fill themselves: their attention rows for ``to_attention``
    (the output gradient's: backward reads it at the linear rows; the q/k/v remap in is run without them and
    gathers those rows, where backward reads q/k/v), their linear rows for ``to_linear`` (written by the
    call). Sorted int64.

    Example: one chunk of sequence 7 at attention rows ``[0, 4)`` and linear rows ``((5, 9),)``:
    ``to_attention`` -> ``[0, 1, 2, 3]``, ``to_linear`` -> ``[5, 6, 7, 8]``."""
    rows: list[int] = []
    for c in chunks:
        if c.linear_rows is None:
            continue
        if direction == "to_attention":
            rows += c.rows
        else:
            rows += [r for a, b in c.linear_rows for r in range(a, b)]
    return np.sort(np.asarray(rows, dtype=np.int64))


def drop_rows(st: StagingPlan, rows: np.ndarray, t_dst: int) -> StagingPlan:
    """``st`` without the destination ``rows`` (of ``t_dst``): they are not gathered (the caller fills them);
    every ``final`` entry then names its positions (the destination is a buffer allocated first). ``st`` itself
    when ``rows`` is empty. Example: ``final ((1, None, None),)`` over 4 rows, dropping ``[1, 2]`` ->
    ``((1, [0, 3], [0, 3]),)``."""
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows):
        return st
    origin = np.full(t_dst, -2, dtype=np.int64)
    row = np.zeros(t_dst, dtype=np.int64)
    for o, r, pos in st.final:
        p = np.arange(t_dst) if pos is None else pos
        origin[p] = o
        row[p] = np.arange(st.sizes[o]) if r is None else r
    keep = np.ones(t_dst, dtype=bool)
    keep[rows] = False
    out = []
    for o in np.unique(origin[keep]).tolist():
        pos = np.nonzero(keep & (origin == o))[0]
        r = row[pos]
        whole = len(r) == st.sizes[o] and bool(np.array_equal(r, np.arange(st.sizes[o])))
        out.append((int(o), None if whole else r, pos))
    return StagingPlan(sizes=st.sizes, phases=st.phases, final=tuple(out))
