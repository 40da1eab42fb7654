"""What one rank holds of a ring and of its local sequences: :class:`RingPart`, :class:`LocalChunk`.

Part of :mod:`.lowering` (which re-exports these names): the row arithmetic of a
rank's attention buffer (its tokens in ``plan.attention_layout[rank]`` order) and
of a ring's seq-major buffers. Pure, standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

from .head_parallel import block_ranges, lane_runs
from .plan_parts import TokenRange
from .zigzag import zigzag_ranges, zigzag_tokens

__all__ = ["RingPart", "LocalChunk", "buffer_rows", "token_rows", "row_span", "ranges_span"]


@dataclass(frozen=True, kw_only=True)
class LocalChunk:
    """Whole local sequences ``seqs`` (``lens`` their lengths) run as one causal call;
    :attr:`rows`: their attention-buffer rows, sequence after sequence (derived on first use)."""

    seqs: tuple[int, ...]
    lens: tuple[int, ...]
    layout: tuple[TokenRange, ...] = field(repr=False, compare=False)
    """The rank's attention layout (``plan.attention_layout[rank]``)."""
    linear_rows: tuple[tuple[int, int], ...] | None = None
    """When every sequence of the chunk stays on the rank (whole there in the linear layout too) and the
    plan remaps: ``[start, end)`` of each sequence's rows in the rank's *linear* buffer, in ``seqs``
    order; the engine may then run the call on those rows in place. None otherwise. Example: linear
    ranges ``((3, 0, 5), (7, 0, 4))``, a chunk of sequence 7: ``((5, 9),)``."""

    @property
    def linear_span(self) -> tuple[int, int] | None:
        """``(start, end)`` when :attr:`linear_rows` are one contiguous range, else None."""
        lr = self.linear_rows
        if not lr or any(a[1] != b[0] for a, b in zip(lr, lr[1:])):
            return None
        return lr[0][0], lr[-1][1]

    @cached_property
    def rows(self) -> tuple[int, ...]:
        pieces = buffer_rows(self.layout)
        return tuple(r for s, n in zip(self.seqs, self.lens) for r in token_rows(pieces[s], 0, n))

    @cached_property
    def span(self) -> tuple[int, int] | None:
        """``row_span(rows)`` from the layout's ranges alone (no per-token rows): ``(start, end)`` when
        :attr:`rows` are one contiguous range (``plan_step``'s layouts), else None."""
        return ranges_span(self.layout, [(s, 0, n) for s, n in zip(self.seqs, self.lens)])


@dataclass(frozen=True, kw_only=True)
class RingPart:
    """Ring ``ring`` as one rank sees it: ``position`` (None: relay only), ``lengths`` of ``seqs``;
    :attr:`rows`: attention-buffer rows of its ring tokens in seq-major order (empty for relays).

    Head-parallel rings (``a2a > 1``, :mod:`.head_parallel`): ``position`` is the rank's *block*
    (``ranks.index(rank) // a2a``), ``lane`` its index in the block; :attr:`size` counts blocks, and
    :meth:`lens` / :meth:`seq_major` describe block chunks: the rows of the rank's *head buffer*
    (its block's tokens, block-level seq-major, its lane's heads). :attr:`rows` stays the rank's own
    tokens (its zigzag position ``position * a2a + lane``), what it sends in the all-to-all; lane
    ``l``'s tokens land at :meth:`lane_rows` of the head buffer.
    """

    ring: int
    ranks: tuple[int, ...]
    placement: str
    seqs: tuple[int, ...]
    lengths: tuple[int, ...]
    position: int | None
    layout: tuple[TokenRange, ...] = field(repr=False, compare=False)
    """The rank's attention layout (``plan.attention_layout[rank]``)."""
    a2a: int = 1
    lane: int | None = None

    @property
    def size(self) -> int:
        """Positions the K/V travel around: ranks, or blocks of a head-parallel ring."""
        return len(self.ranks) // self.a2a

    @cached_property
    def _chunks(self) -> list[list[tuple[tuple[int, int], tuple[int, int]]]]:
        """[position][seq] -> (early, late) token ranges (blocks of a head-parallel ring)."""
        g, a = len(self.ranks), self.a2a
        if a == 1:
            return [[zigzag_ranges(n, g, p) for n in self.lengths] for p in range(g)]
        return [[block_ranges(n, g, a, b) for n in self.lengths] for b in range(g // a)]

    def fine_ranges(self, position: int) -> tuple[TokenRange, ...]:
        """``(seq, start, end)`` of zigzag ``position``'s tokens (of ``len(ranks)``), seq-major
        (early chunk, then late, per sequence): what that rank holds of the ring."""
        g = len(self.ranks)
        return tuple((s, a, b) for s, n in zip(self.seqs, self.lengths) for a, b in zigzag_ranges(n, g, position))

    def fine_tokens(self, position: int) -> int:
        """Tokens zigzag ``position`` holds of the ring."""
        return sum(zigzag_tokens(n, len(self.ranks), position) for n in self.lengths)

    def lane_runs(self, lane: int) -> tuple[tuple[int, int, int], ...]:
        """Lane ``lane``'s ``(own, row, count)`` runs in this rank's head buffer (block :attr:`position`):
        :func:`~.head_parallel.lane_runs`, one message each in the ring's all-to-alls."""
        assert self.position is not None and self.a2a > 1
        return lane_runs(self.lengths, len(self.ranks), self.a2a, self.position, lane)

    def lane_rows(self, lane: int) -> tuple[int, ...]:
        """Rows of this rank's head buffer (block :attr:`position`) that lane ``lane``'s tokens fill,
        in that lane's :meth:`fine_ranges` order (:meth:`lane_runs` row by row). Example: one sequence of
        16 over 4 ranks, ``a2a = 2``, block 0 (early [0, 4), late [12, 16): buffer rows 0-3 and 4-7): lane 0
        holds [0, 2) + [14, 16) -> rows (0, 1, 6, 7); lane 1 holds [2, 4) + [12, 14) -> rows (2, 3, 4, 5)."""
        return tuple(r for _, row, n in self.lane_runs(lane) for r in range(row, row + n))

    def tokens(self, position: int) -> int:
        """Ring tokens held at ``position``."""
        return sum(a1 - a0 + b1 - b0 for (a0, a1), (b0, b1) in self._chunks[position])

    def lens(self, position: int, which: str = "all") -> tuple[int, ...]:
        """Per sequence, ``position``'s tokens of its ``all``, ``early`` or ``late`` chunks."""
        return tuple((a1 - a0) * (which != "late") + (b1 - b0) * (which != "early")
                     for (a0, a1), (b0, b1) in self._chunks[position])

    def seq_major(self, position: int, which: str = "all") -> tuple[tuple[int, ...], tuple[TokenRange, ...]]:
        """``(rows, ranges)`` of ``position``'s ``all``/``early``/``late`` chunks: rows of its
        seq-major buffer and ``(seq, start, end)`` token ranges (memoised). Example: chunk lengths
        (2, 2) and (3, 2) -> early rows [0, 1, 4, 5, 6], late rows [2, 3, 7, 8]."""
        hit = self._memo.get((position, which))
        if hit is None:
            hit = self._memo[(position, which)] = self._seq_major(position, which)
        return hit

    @cached_property
    def _memo(self) -> dict[tuple[int, str], tuple[tuple[int, ...], tuple[TokenRange, ...]]]:
        return {}

    def _seq_major(self, position: int, which: str) -> tuple[tuple[int, ...], tuple[TokenRange, ...]]:
        rows: list[int] = []
        ranges: list[TokenRange] = []
        off = 0
        for s, ((a0, a1), (b0, b1)) in zip(self.seqs, self._chunks[position]):
            e, l = a1 - a0, b1 - b0
            if which != "late":
                rows += range(off, off + e)
                ranges.append((s, a0, a1))
            if which != "early":
                rows += range(off + e, off + e + l)
                ranges.append((s, b0, b1))
            off += e + l
        return tuple(rows), tuple(ranges)

    @cached_property
    def rows(self) -> tuple[int, ...]:
        if self.position is None:
            return ()
        pieces = buffer_rows(self.layout)
        return tuple(r for s, a, b in self._mine for r in token_rows(pieces[s], a, b))

    @property
    def _mine(self) -> tuple[TokenRange, ...]:
        assert self.position is not None
        return (self.seq_major(self.position)[1] if self.a2a == 1
                else self.fine_ranges(self.position * self.a2a + (self.lane or 0)))

    @cached_property
    def span(self) -> tuple[int, int] | None:
        """``row_span(rows)`` from the layout's ranges alone (no per-token rows): ``(start, end)`` when
        :attr:`rows` are one contiguous range (``plan_step``'s layouts), else None; ``(0, 0)`` for relays.
        Example: layout ``((1, 2, 6), (0, 0, 3))``, position 1 of sequence 1 (8 tokens) on 2 ranks
        (tokens [2, 4) then [4, 6)) -> ``(0, 4)``; layout ``((0, 0, 3), (1, 4, 6), (1, 2, 4))`` -> None."""
        if self.position is None:
            return (0, 0)
        return ranges_span(self.layout, self._mine)


def row_span(rows: tuple[int, ...]) -> tuple[int, int] | None:
    """``(start, end)`` when ``rows`` are ``range(start, end)`` (one contiguous run, ascending; empty rows
    give ``(0, 0)``), else None: the engine reads such rows as a view and writes them as a slice.
    Examples: ``(4, 5, 6)`` -> ``(4, 7)``; ``(4, 6)`` -> None; ``(5, 4)`` -> None."""
    if not rows:
        return (0, 0)
    a, n = rows[0], len(rows)
    return (a, a + n) if rows[-1] == a + n - 1 and rows == tuple(range(a, a + n)) else None


def ranges_span(layout: tuple[TokenRange, ...], ranges: Sequence[TokenRange]) -> tuple[int, int] | None:
    """:func:`row_span` of the buffer rows of token ``ranges`` (in order) in ``layout``'s buffer, computed
    range by range: each range must sit inside one layout range and start where the previous one ended.
    Example: layout ``((0, 0, 4), (1, 0, 3))``: ranges ``[(0, 2, 4), (1, 0, 2)]`` -> ``(2, 6)``;
    ``[(1, 0, 2), (0, 2, 4)]`` -> None. Raises ``ValueError`` when a range is not in the layout."""
    pieces = buffer_rows(layout)
    start = end = None
    for s, a, b in ranges:
        if a >= b:
            continue
        off = next((o + a - lo for lo, hi, o in pieces.get(s, ()) if lo <= a and b <= hi), None)
        if off is None:  # over several layout ranges (or not all in the layout: token_rows raises)
            rows = tuple(token_rows(pieces.get(s, []), a, b))
            if row_span(rows) is None:
                return None
            off = rows[0]
        if end is None:
            start = off
        elif off != end:
            return None
        end = off + b - a
    return (0, 0) if start is None or end is None else (start, end)


def buffer_rows(layout: tuple[TokenRange, ...]) -> dict[int, list[tuple[int, int, int]]]:
    """seq -> ``(start, end, buffer offset)`` pieces of a rank's attention buffer, in token order."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    off = 0
    for seq, start, end in layout:
        out.setdefault(seq, []).append((start, end, off))
        off += end - start
    for pieces in out.values():
        pieces.sort()
    return out


def token_rows(pieces: list[tuple[int, int, int]], a: int, b: int) -> list[int]:
    """Buffer rows of tokens ``[a, b)`` of one sequence; pieces ``[(0, 4, 10), (4, 6, 0)]``:
    tokens [3, 5) -> rows [13, 0]."""
    rows: list[int] = []
    for start, end, off in pieces:
        lo, hi = max(a, start), min(b, end)
        if lo < hi:
            rows += range(off + lo - start, off + hi - start)
    if len(rows) != b - a:
        raise ValueError(f"tokens [{a}, {b}) are not all in this rank's attention layout")
    return rows
