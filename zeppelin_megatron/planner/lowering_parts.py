"""What one rank holds of a ring and of its local sequences: :class:`RingPart`, :class:`LocalChunk`.

Part of :mod:`.lowering` (which re-exports these names): the row arithmetic of a
rank's attention buffer (its tokens in ``plan.attention_layout[rank]`` order) and
of a ring's seq-major buffers. Pure, standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .head_parallel import block_ranges
from .plan_parts import TokenRange
from .zigzag import zigzag_ranges

__all__ = ["RingPart", "LocalChunk", "buffer_rows", "token_rows"]


@dataclass(frozen=True, kw_only=True)
class LocalChunk:
    """Whole local sequences ``seqs`` (``lens`` their lengths) run as one causal call;
    :attr:`rows`: their attention-buffer rows, sequence after sequence (derived on first use)."""

    seqs: tuple[int, ...]
    lens: tuple[int, ...]
    layout: tuple[TokenRange, ...] = field(repr=False, compare=False)
    """The rank's attention layout (``plan.attention_layout[rank]``)."""

    @cached_property
    def rows(self) -> tuple[int, ...]:
        pieces = buffer_rows(self.layout)
        return tuple(r for s, n in zip(self.seqs, self.lens) for r in token_rows(pieces[s], 0, n))


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
        return sum(b - a for _, a, b in self.fine_ranges(position))

    def lane_rows(self, lane: int) -> tuple[int, ...]:
        """Rows of this rank's head buffer (block :attr:`position`) that lane ``lane``'s tokens fill,
        in that lane's :meth:`fine_ranges` order. Example: one sequence of 16 over 4 ranks,
        ``a2a = 2``, block 0 (early [0, 4), late [12, 16): buffer rows 0-3 and 4-7): lane 0 holds
        [0, 2) + [14, 16) -> rows (0, 1, 6, 7); lane 1 holds [2, 4) + [12, 14) -> rows (2, 3, 4, 5)."""
        b = self.position
        assert b is not None and self.a2a > 1
        rows: list[int] = []
        off = 0
        ranges = iter(self.fine_ranges(b * self.a2a + lane))
        for (e0, e1), (l0, l1) in self._chunks[b]:
            for lo, base in ((e0, off), (l0, off + e1 - e0)):
                _, a, z = next(ranges)
                rows += range(base + a - lo, base + z - lo)
            off += e1 - e0 + l1 - l0
        return tuple(rows)

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
        mine = (self.seq_major(self.position)[1] if self.a2a == 1
                else self.fine_ranges(self.position * self.a2a + (self.lane or 0)))
        return tuple(r for s, a, b in mine for r in token_rows(pieces[s], a, b))


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
