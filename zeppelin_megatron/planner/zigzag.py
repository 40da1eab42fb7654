"""Zigzag chunk arithmetic: the one place that knows how a split sequence is cut.

A sequence of length ``s`` split over a ring of ``g`` ranks is cut into ``2g``
contiguous chunks whose sizes differ by at most one token (the first ``s % 2g``
chunks are one token longer). The rank at ring position ``i`` holds chunks ``i``
and ``2g - 1 - i``, so every rank does the same causal work.

Worked example, ``s = 10``, ``g = 2`` (4 chunks, ``10 = 3 + 3 + 2 + 2``)::

    chunk:     0       1       2     3
    tokens:  [0,3)   [3,6)   [6,8) [8,10)
    ring position 0 holds chunks 0 and 3 -> [0,3) + [8,10)  (5 tokens)
    ring position 1 holds chunks 1 and 2 -> [3,6) + [6,8)   (5 tokens)

Pure integer arithmetic: no torch, no numpy.
"""

from __future__ import annotations

__all__ = [
    "chunk_bounds",
    "chunk_range",
    "zigzag_ranges",
    "zigzag_tokens",
    "ring_source",
]


def chunk_bounds(length: int, ring_size: int) -> list[tuple[int, int]]:
    """Return the ``2 * ring_size`` chunk bounds ``[start, end)`` of a sequence.

    Raises ``ValueError`` when ``length < 2 * ring_size`` (an empty chunk would
    leave a ring rank with nothing to compute on its diagonal block).
    """
    if ring_size < 1:
        raise ValueError(f"ring size must be >= 1, got {ring_size}")
    n_chunks = 2 * ring_size
    if length < n_chunks:
        raise ValueError(
            f"a sequence of length {length} cannot be split over a ring of "
            f"{ring_size} ranks: zigzag needs at least 2 * {ring_size} = {n_chunks} tokens"
        )
    base, extra = divmod(length, n_chunks)
    bounds: list[tuple[int, int]] = []
    start = 0
    for c in range(n_chunks):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def chunk_range(length: int, ring_size: int, chunk: int) -> tuple[int, int]:
    """Bounds of one chunk in O(1): chunk ``c`` starts at ``c * base + min(c, extra)``.

    Example, ``s = 10``, ``g = 2``: ``base = 2``, ``extra = 2``; chunk 2 starts
    at ``2 * 2 + 2 = 6`` and ends at ``8``.
    """
    n_chunks = 2 * ring_size
    if length < n_chunks or ring_size < 1:
        chunk_bounds(length, ring_size)  # raises the explanatory error
    base, extra = divmod(length, n_chunks)
    start = chunk * base + min(chunk, extra)
    return start, start + base + (1 if chunk < extra else 0)


def zigzag_ranges(length: int, ring_size: int, position: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two ``[start, end)`` ranges held by ring ``position`` (early chunk first)."""
    if not 0 <= position < ring_size:
        raise ValueError(f"ring position {position} is outside a ring of {ring_size} ranks")
    return chunk_range(length, ring_size, position), chunk_range(length, ring_size, 2 * ring_size - 1 - position)


def position_ranges(seq: int, length: int, ring_size: int, position: int) -> list[tuple[int, int, int]]:
    """``(seq, start, end)`` ranges of ring ``position``'s tokens of sequence ``seq``, as a layout lists them.

    The two zigzag chunks, merged into one range when adjacent (the middle
    position when the two chunks meet). Example: length 8 on a ring of 2:
    position 0 -> ``[(seq, 0, 2), (seq, 6, 8)]``, position 1 -> ``[(seq, 2, 6)]``.
    """
    (s0, e0), (s1, e1) = zigzag_ranges(length, ring_size, position)
    return [(seq, s0, e1)] if e0 == s1 else [(seq, s0, e0), (seq, s1, e1)]


def zigzag_tokens(length: int, ring_size: int, position: int) -> int:
    """Number of tokens held by ring ``position``."""
    (a0, a1), (b0, b1) = zigzag_ranges(length, ring_size, position)
    return (a1 - a0) + (b1 - b0)


def ring_source(position: int, step: int, ring_size: int) -> int:
    """Ring position whose K/V chunks ``position`` holds at ring ``step``.

    At step 0 a rank holds its own K/V; at each step K/V move one position
    forward (``p -> p + 1``), so at step ``j`` position ``i`` holds the K/V of
    position ``(i - j) mod g``. Example, ``g = 4``: position 1 sees 1, 0, 3, 2.
    """
    return (position - step) % ring_size
