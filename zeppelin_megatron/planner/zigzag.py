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

Everything else asks this module: the chunk ranges (:func:`chunk_range`), a
position's tokens (:func:`zigzag_tokens`) and the most any position holds
(:func:`ring_max_tokens`, exactly ``ceil(s / g)``), a node's share of a
node-major ring (:func:`ring_node_tokens`), the neighbours a ring step sends to
and receives from (:func:`next_position`, :func:`prev_position`) and whose K/V
a position sees at a step (:func:`ring_source`).

Pure integer arithmetic: no torch, no numpy.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate, chain, repeat

__all__ = [
    "chunk_bounds",
    "chunk_range",
    "zigzag_ranges",
    "zigzag_tokens",
    "position_ranges",
    "ring_max_tokens",
    "ring_chunk_pair_tokens",
    "ring_node_tokens",
    "next_position",
    "prev_position",
    "ring_source",
    "ring_ranges",
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


def ring_ranges(seq: int, length: int, ring_size: int) -> list[list[tuple[int, int, int]]]:
    """:func:`position_ranges` of every position at once (``out[p]``), one ``divmod`` for the sequence instead
    of one per chunk: the ``2g + 1`` chunk starts ``e`` are listed once (``extra`` chunks of ``base + 1``,
    then ``base``), position ``p`` takes chunks ``p`` and ``2g - 1 - p``, and only the middle position
    ``g - 1`` holds two adjacent chunks (``g - 1`` and ``g``: one range; every chunk has ``base >= 1``
    tokens, so no other pair touches). Example: length 8 on a ring of 2: ``e = [0, 2, 4, 6, 8]``,
    ``[[(seq, 0, 2), (seq, 6, 8)], [(seq, 2, 6)]]``. Raises as :func:`chunk_bounds` does."""
    g = ring_size
    if g < 1 or length < 2 * g:
        chunk_bounds(length, g)  # raises the explanatory error
    base, extra = divmod(length, 2 * g)
    e = list(accumulate(chain((0,), repeat(base + 1, extra), repeat(base, 2 * g - extra))))
    # position p < g - 1: early chunk (e[p], e[p+1]), late chunk (e[2g-1-p], e[2g-p])
    out = [[(seq, a, b), (seq, c, d)] for a, b, c, d in zip(e[:g - 1], e[1:g], e[2 * g - 1:g:-1], e[2 * g:g + 1:-1])]
    out.append([(seq, e[g - 1], e[g + 1])])
    return out


def zigzag_tokens(length: int, ring_size: int, position: int) -> int:
    """Number of tokens held by ring ``position``: chunks ``p`` and ``2g - 1 - p`` of ``base`` tokens, one more
    each below ``extra`` (``base, extra = divmod(length, 2g)``). Example: ``s = 41``, ``g = 2``: chunks 11,
    10, 10, 10; position 0 holds 11 + 10 = 21, position 1 holds 20. Raises as :func:`zigzag_ranges` does."""
    g = ring_size
    if not 0 <= position < g or length < 2 * g:
        zigzag_ranges(length, ring_size, position)  # raises the explanatory error
    return _position_tokens(*divmod(length, 2 * g), g, position)


def _position_tokens(base: int, extra: int, g: int, p: int) -> int:
    """Position ``p``'s tokens of a ring of ``g`` (:func:`zigzag_tokens`), from ``divmod(length, 2g)``."""
    return 2 * base + (p < extra) + (2 * g - 1 - p < extra)


@lru_cache(maxsize=65536)
def zigzag_counts(length: int, ring_size: int) -> tuple[int, ...]:
    """:func:`zigzag_tokens` of every position, by position (memoised: packings ask for every sharded sequence
    at every position). Example: ``s = 41``, ``g = 2``: ``(21, 20)``. Raises as :func:`zigzag_ranges` does."""
    if ring_size < 1:
        chunk_bounds(length, ring_size)  # raises the explanatory error (a ring of no position)
    g = ring_size
    if length < 2 * g:
        zigzag_ranges(length, g, 0)  # raises the explanatory error
    base, extra = divmod(length, 2 * g)  # checked once for every position
    return tuple(_position_tokens(base, extra, g, p) for p in range(g))


def ring_max_tokens(length: int, ring_size: int) -> int:
    """The most tokens any position of the ring holds: exactly ``ceil(length / ring_size)``.

    With ``base, extra = divmod(length, 2g)`` position ``p`` holds
    ``2 * base + [p < extra] + [2g - 1 - p < extra]`` tokens. Both extra tokens
    land on one position only when ``extra > g`` (then ``p = g - 1`` has both),
    so the maximum is ``2 base + 2`` if ``extra > g``, ``2 base + 1`` if
    ``0 < extra <= g``, ``2 base`` if ``extra = 0``: that is ``ceil(length / g)``.
    Example: ``s = 41``, ``g = 2``: chunks 11, 10, 10, 10; positions hold 21
    and 20, and ``ceil(41 / 2) = 21`` (``2 * ceil(41 / 4) = 22`` overestimates).
    Raises ``ValueError`` like :func:`chunk_bounds` when the ring is too large.
    """
    if ring_size < 1 or length < 2 * ring_size:
        chunk_bounds(length, ring_size)  # raises the explanatory error
    return -(-length // ring_size)


def ring_chunk_pair_tokens(length: int, ring_size: int) -> int:
    """Two chunks of the largest chunk size, ``2 * ceil(length / 2g)``: the cost model's K/V payload per step.

    An upper bound of :func:`ring_max_tokens` by at most one token (the two
    chunks a position holds are rarely both the longer size). The cost model
    times ring steps with it (:meth:`~.cost_model.CostModel.ring_step_bytes`);
    feasibility (does a ring fit ``tokens_per_gpu``?) uses the exact
    :func:`ring_max_tokens`. Example: ``s = 41``, ``g = 2``: 22 (exact maximum 21).
    """
    return 2 * -(-length // (2 * ring_size))


@lru_cache(maxsize=4096)
def ring_node_tokens(length: int, nodes: int, gpus_per_node: int) -> tuple[int, ...]:
    """Tokens each node of a node-major ring over ``nodes`` whole nodes holds (by node position).

    The ring has ``nodes * gpus_per_node`` positions; node ``k`` holds
    positions ``k * G .. k * G + G - 1``. Example: ``s = 40``, 2 nodes of 2
    GPUs: chunks of 5 tokens; positions 0-1 on the first node hold chunks
    {0, 7} and {1, 6}: ``(20, 20)``.
    """
    ring = nodes * gpus_per_node
    return tuple(sum(zigzag_tokens(length, ring, k * gpus_per_node + l) for l in range(gpus_per_node))
                 for k in range(nodes))


def next_position(position: int, ring_size: int) -> int:
    """The ring position a rank sends its K/V to at every step: ``(p + 1) mod g``.

    Example, ``g = 4``: 0 -> 1, 3 -> 0.
    """
    return (position + 1) % ring_size


def prev_position(position: int, ring_size: int) -> int:
    """The ring position a rank receives K/V from at every step: ``(p - 1) mod g``.

    Example, ``g = 4``: 1 -> 0, 0 -> 3.
    """
    return (position - 1) % ring_size


def ring_source(position: int, step: int, ring_size: int) -> int:
    """Ring position whose K/V chunks ``position`` holds at ring ``step``.

    At step 0 a rank holds its own K/V; at each step K/V move one position
    forward (``p -> p + 1``), so at step ``j`` position ``i`` holds the K/V of
    position ``(i - j) mod g``. Example, ``g = 4``: position 1 sees 1, 0, 3, 2.
    """
    return (position - step) % ring_size
