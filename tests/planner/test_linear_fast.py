"""The linear layout's shortcuts (issue 14 item 4) give what the plain loops give."""

from __future__ import annotations

import random

from zeppelin_megatron.planner import load_cluster
from zeppelin_megatron.planner.linear_layout import _coalesce, _take, _tokens, linear_layout

Range = tuple[int, int, int]


def _plain_coalesce(ranges: list[Range]) -> list[Range]:
    out: list[Range] = []
    for seq, s, e in ranges:
        if out and out[-1][0] == seq and out[-1][2] == s:
            out[-1] = (seq, out[-1][1], e)
        else:
            out.append((seq, s, e))
    return out


def test_tokens_and_take_with_total() -> None:
    ranges = [(0, 0, 4), (1, 2, 3), (2, 5, 9)]
    assert _tokens(ranges) == 9 and _tokens([]) == 0
    for count in range(11):
        assert _take(list(ranges), count, 9) == _take(list(ranges), count)
    whole = list(ranges)
    assert _take(whole, 9, 9)[0] is whole  # nothing to split: the list itself


def test_coalesce_returns_its_input_when_nothing_merges() -> None:
    rng = random.Random(1)
    for _ in range(300):
        ranges: list[Range] = []
        for _ in range(rng.randint(0, 8)):
            seq = rng.randrange(3)
            s = rng.choice((0, ranges[-1][2])) if ranges and ranges[-1][0] == seq else rng.randrange(4)
            ranges.append((seq, s, s + rng.randint(1, 3)))
        got = _coalesce(list(ranges))
        assert got == _plain_coalesce(ranges)
    same = [(0, 0, 2), (1, 0, 3), (0, 2, 4)]  # neighbours of different sequences never merge
    assert _coalesce(same) is same
    assert _coalesce([(0, 0, 2), (0, 2, 5), (1, 0, 3)]) == [(0, 0, 5), (1, 0, 3)]
    assert _coalesce([(0, 0, 2), (0, 3, 5)]) == [(0, 0, 2), (0, 3, 5)]  # same sequence, not contiguous


def test_balanced_ranks_share_their_attention_tuples() -> None:
    cluster = load_cluster("1x4")
    att = (((0, 0, 3), (1, 0, 1)), ((2, 0, 4),), ((3, 0, 2), (4, 0, 2)), ((5, 0, 1), (6, 0, 3)))
    lin = linear_layout(att, cluster)
    assert lin == att and all(a is b for a, b in zip(lin, att))
    uneven = (((0, 0, 6),), ((1, 0, 2),), ((2, 0, 4),), ((3, 0, 4),))
    lin = linear_layout(uneven, cluster)
    assert lin == (((0, 0, 4),), ((1, 0, 2), (0, 4, 6)), ((2, 0, 4),), ((3, 0, 4),))
    assert lin[2] is uneven[2] and lin[0] is not uneven[0]
    as_lists = [list(rs) for rs in att]  # lists in, tuples out
    assert linear_layout(as_lists, cluster) == att
