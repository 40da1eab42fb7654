from hypothesis import given, strategies as st

import pytest

from zeppelin_megatron.planner.zigzag import (
    chunk_bounds, chunk_range, next_position, prev_position, ring_chunk_pair_tokens, ring_max_tokens, ring_node_tokens,
    ring_source, zigzag_ranges, zigzag_tokens,
)


def test_worked_example() -> None:
    assert chunk_bounds(10, 2) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert zigzag_ranges(10, 2, 0) == ((0, 3), (8, 10))
    assert zigzag_ranges(10, 2, 1) == ((3, 6), (6, 8))
    assert [ring_source(1, j, 4) for j in range(4)] == [1, 0, 3, 2]


@given(g=st.integers(1, 64), extra=st.integers(0, 5000))
def test_chunks_cover_and_balance(g: int, extra: int) -> None:
    s = 2 * g + extra
    b = chunk_bounds(s, g)
    assert b[0][0] == 0 and b[-1][1] == s
    assert all(b[i][1] == b[i + 1][0] for i in range(len(b) - 1))
    sizes = [e - a for a, e in b]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert [chunk_range(s, g, c) for c in range(2 * g)] == b
    tokens = [zigzag_tokens(s, g, p) for p in range(g)]
    assert sum(tokens) == s and max(tokens) - min(tokens) <= 2


def test_too_short_to_split_names_values() -> None:
    with pytest.raises(ValueError, match="length 5 .* ring of 3"):
        chunk_bounds(5, 3)


def test_position_ranges_merge_adjacent_chunks() -> None:
    from zeppelin_megatron.planner.zigzag import position_ranges

    assert position_ranges(3, 8, 2, 0) == [(3, 0, 2), (3, 6, 8)]
    assert position_ranges(3, 8, 2, 1) == [(3, 2, 6)]
    for length in (8, 9, 17):
        held = sorted(t for p in range(4) for _, a, b in position_ranges(0, length, 4, p) for t in range(a, b))
        assert held == list(range(length))


@given(g=st.integers(1, 64), extra=st.integers(0, 5000))
def test_ring_max_tokens_is_the_exact_largest_position(g: int, extra: int) -> None:
    s = 2 * g + extra
    exact = max(zigzag_tokens(s, g, p) for p in range(g))
    assert ring_max_tokens(s, g) == exact
    assert ring_chunk_pair_tokens(s, g) in (exact, exact + 1)


def test_ring_max_tokens_issue_example() -> None:
    # 41 tokens over 2 ranks: chunks 11, 10, 10, 10; positions hold 21 and 20 (the old estimate said 22).
    assert [zigzag_tokens(41, 2, p) for p in range(2)] == [21, 20]
    assert ring_max_tokens(41, 2) == 21
    assert ring_chunk_pair_tokens(41, 2) == 22
    with pytest.raises(ValueError, match="length 3 .* ring of 2"):
        ring_max_tokens(3, 2)


@given(nodes=st.integers(1, 6), gpn=st.integers(1, 8), extra=st.integers(0, 3000))
def test_ring_node_tokens_sums_positions(nodes: int, gpn: int, extra: int) -> None:
    g = nodes * gpn
    s = 2 * g + extra
    share = ring_node_tokens(s, nodes, gpn)
    assert sum(share) == s
    assert list(share) == [sum(zigzag_tokens(s, g, k * gpn + l) for l in range(gpn)) for k in range(nodes)]


def test_neighbours() -> None:
    assert [next_position(p, 4) for p in range(4)] == [1, 2, 3, 0]
    assert [prev_position(p, 4) for p in range(4)] == [3, 0, 1, 2]
    # a position receives at step j the K/V its predecessor held at step j - 1
    assert all(ring_source(p, j, 5) == ring_source(prev_position(p, 5), j - 1, 5)
               for p in range(5) for j in range(1, 5))


def test_ring_ranges_are_position_ranges_of_every_position() -> None:
    import random

    from zeppelin_megatron.planner.zigzag import position_ranges, ring_ranges
    rng = random.Random(0)
    cases = [(8, 2), (2, 1), (5, 1), (9, 2), (16, 8), (17, 8)] + [
        (rng.randint(2 * g, 5000), g) for g in (1, 2, 3, 4, 7, 8, 16, 32, 64) for _ in range(20)]
    for length, g in cases:
        assert ring_ranges(3, length, g) == [position_ranges(3, length, g, p) for p in range(g)], (length, g)
    assert ring_ranges(0, 8, 2) == [[(0, 0, 2), (0, 6, 8)], [(0, 2, 6)]]
    with pytest.raises(ValueError, match="zigzag needs at least 2 \\* 4 = 8 tokens"):
        ring_ranges(0, 7, 4)
    with pytest.raises(ValueError, match="ring size must be >= 1"):
        ring_ranges(0, 7, 0)
