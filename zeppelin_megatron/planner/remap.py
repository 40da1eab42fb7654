"""Remap plan: which tokens move between the linear and the attention layout.

Both layouts list, per rank, ``(seq, start, end)`` ranges whose concatenation
is the rank's token buffer. A *segment* is a maximal run of tokens that is
contiguous in both buffers:
``(lin_rank, lin_offset, att_rank, att_offset, length)``.

Worked example: sequence 0 has 6 tokens; the linear layout puts ``[0,3)`` on
rank 0 and ``[3,6)`` on rank 1; the attention layout keeps it whole on rank 1
after one 2-token sequence (``[(1,0,2), (0,0,6)]``). Segments::

    (lin 0 @0 -> att 1 @2, 3 tokens)   # [0,3) moves from rank 0 to rank 1
    (lin 1 @0 -> att 1 @5, 3 tokens)   # [3,6) stays on rank 1
    ... plus sequence 1's tokens

Direction ``"to_attention"`` sends from linear buffers to attention buffers;
``"to_linear"`` is the exact inverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Literal, NamedTuple, Sequence

import numpy as np

__all__ = ["Segment", "RemapPlan", "RankExchange", "build_remap"]

Direction = Literal["to_attention", "to_linear"]
Layout = Sequence[Sequence[tuple[int, int, int]]]


class Segment(NamedTuple):
    """A run of ``length`` tokens at ``lin_offset`` of rank ``lin_rank``'s linear buffer and at ``att_offset``
    of rank ``att_rank``'s attention buffer (a named tuple: a step's remap has thousands)."""

    lin_rank: int
    lin_offset: int
    att_rank: int
    att_offset: int
    length: int


@dataclass(frozen=True)
class RankExchange:
    """What one rank sends and receives in one direction (``all_to_all_single`` form), and what it keeps.

    Rows whose source and destination are this rank (*staying* rows) never enter the exchange: the
    counts to and from the rank itself are 0 and ``keep_src`` [K] / ``keep_dst`` [K] say where they
    are in the source buffer and where they go in the destination buffer (the runtime gathers them
    straight from the source tensor). ``send_index``: [sum(send_counts)] int64 positions into this
    rank's source buffer, grouped by destination rank in rank order. ``recv_index``:
    [sum(recv_counts)] int64 positions into this rank's destination buffer for the received tokens,
    grouped by source rank in rank order. ``recv_index`` and ``keep_dst`` together cover the
    destination buffer once.

    Example: rank 1 keeps its linear rows ``[0, 3)`` as attention rows ``[5, 8)`` and receives 5 rows
    from rank 0: ``send_counts[1] == recv_counts[1] == 0``, ``keep_src = [0, 1, 2]``,
    ``keep_dst = [5, 6, 7]``.
    """

    send_counts: tuple[int, ...]
    send_index: np.ndarray
    recv_counts: tuple[int, ...]
    recv_index: np.ndarray
    keep_src: np.ndarray
    keep_dst: np.ndarray


def _spans(layout: Layout) -> dict[int, list[tuple[int, int, int, int]]]:
    """Per sequence: sorted ``(start, end, rank, buffer_offset)`` spans."""
    out: dict[int, list[tuple[int, int, int, int]]] = {}
    for rank, ranges in enumerate(layout):
        off = 0
        for seq, start, end in ranges:
            out.setdefault(seq, []).append((start, end, rank, off))
            off += end - start
    for spans in out.values():
        spans.sort()
    return out


def build_remap(linear: Layout, attention: Layout) -> tuple[Segment, ...]:
    """Intersect the two layouts sequence by sequence (both must cover the same tokens)."""
    lin, att = _spans(linear), _spans(attention)
    segments: list[Segment] = []
    for seq in sorted(lin):
        a, b = lin[seq], att[seq]
        i = j = 0
        while i < len(a) and j < len(b):
            s0, e0, r0, o0 = a[i]
            s1, e1, r1, o1 = b[j]
            lo, hi = (s0 if s0 > s1 else s1), (e0 if e0 < e1 else e1)
            if lo < hi:
                segments.append(Segment(r0, o0 + lo - s0, r1, o1 + lo - s1, hi - lo))
            if e0 <= e1:
                i += 1
            else:
                j += 1
    segments.sort(key=itemgetter(0, 2, 1))  # lin_rank, att_rank, lin_offset
    return tuple(segments)


class RemapPlan:
    """Segments plus per-rank exchange lists, computed on demand and cached."""

    def __init__(self, segments: tuple[Segment, ...], world_size: int) -> None:
        self.segments = segments
        self.world_size = world_size
        self._cache: dict[tuple[int, str], RankExchange] = {}

    def counts(self, direction: Direction = "to_attention") -> np.ndarray:
        """[world, world] tokens sent from row rank to column rank (the diagonal: tokens that stay, which
        :meth:`exchange` keeps out of the ``all_to_all``)."""
        m = np.zeros((self.world_size, self.world_size), dtype=np.int64)
        for g in self.segments:
            if direction == "to_attention":
                m[g.lin_rank, g.att_rank] += g.length
            else:
                m[g.att_rank, g.lin_rank] += g.length
        return m

    def moves(self) -> bool:
        """Whether any token changes rank (else every rank's remap is a local reorder and no rank needs
        the collective; every rank knows this from the plan)."""
        m = self.counts()
        return bool(m.sum() != np.trace(m))

    def exchange(self, rank: int, direction: Direction = "to_attention") -> RankExchange:
        """Send/receive lists of ``rank`` (rows to and from itself are in ``keep_src`` / ``keep_dst``, never
        sent); ``to_linear`` is the inverse of ``to_attention``."""
        key = (rank, direction)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if direction not in ("to_attention", "to_linear"):
            raise ValueError(f"direction must be 'to_attention' or 'to_linear', got {direction!r}")
        fwd = direction == "to_attention"
        # (src, dst, src_off, dst_off, length) in the chosen direction; order
        # within a pair is by the linear offset so both sides agree.
        rows = [
            (g.lin_rank, g.att_rank, g.lin_offset, g.att_offset, g.length, g.lin_offset) if fwd
            else (g.att_rank, g.lin_rank, g.att_offset, g.lin_offset, g.length, g.lin_offset)
            for g in self.segments
        ]
        send = sorted((r for r in rows if r[0] == rank and r[1] != rank), key=lambda r: (r[1], r[5]))
        recv = sorted((r for r in rows if r[1] == rank and r[0] != rank), key=lambda r: (r[0], r[5]))
        keep = sorted((r for r in rows if r[0] == rank and r[1] == rank), key=lambda r: r[5])
        n = self.world_size
        send_counts = [0] * n
        recv_counts = [0] * n
        for r in send:
            send_counts[r[1]] += r[4]
        for r in recv:
            recv_counts[r[0]] += r[4]
        send_index = _concat_ranges([(r[2], r[4]) for r in send])
        recv_index = _concat_ranges([(r[3], r[4]) for r in recv])
        hit = RankExchange(tuple(send_counts), send_index, tuple(recv_counts), recv_index,
                           _concat_ranges([(r[2], r[4]) for r in keep]), _concat_ranges([(r[3], r[4]) for r in keep]))
        self._cache[key] = hit
        return hit


def _concat_ranges(pieces: list[tuple[int, int]]) -> np.ndarray:
    """Concatenate ``arange(off, off + n)`` for each ``(off, n)``."""
    if not pieces:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(o, o + n, dtype=np.int64) for o, n in pieces])
