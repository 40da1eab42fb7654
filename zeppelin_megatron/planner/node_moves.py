"""The moves of level 1's local search (:mod:`.node_balance`) and the functions offering them.

The state is a :class:`NodeState`; a move is a :class:`Trade`, :class:`Lend`, :class:`Shift` or
:class:`Widen`, offered as a :class:`Candidate` ``(MoveKey, move)`` by one function per kind
(:func:`single_trades`, :func:`batch_trade`, :func:`swaps`, :func:`swap_for_several`,
:func:`lends`, :func:`ring_moves`) from what the round knows (:class:`RoundView`, and
:class:`LoView` for the receiving node's sequences). What each move does and how the
lowest :class:`MoveKey` wins is in :mod:`.node_balance`'s docstring. Pure and deterministic.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat
from operator import eq, ge
from typing import Iterator, NamedTuple, Sequence, Union

from .partition_context import PartitionContext
from .zigzag import ring_max_tokens, ring_node_tokens

__all__ = [
    "EPS", "NodeState", "Trade", "Lend", "Shift", "Widen", "Move", "MoveKey", "Item", "RoundView", "Candidate",
    "LoView", "lo_view_of",
    "single_trades", "batch_trade", "swaps", "swap_for_several", "lends", "ring_moves",
    "TIE_BATCH", "TIE_SEVERAL", "TIE_ONE", "tie_lend",
]

EPS = 1e-9
"""Loads closer than this are equal."""


@dataclass
class NodeState:
    """Level 1's assignment of sequences to nodes (mutable; owned by one partition call).

    ``seqs[n]``: node ``n``'s node-local sequences in placement order;
    ``inter``: ranks (node-major ring order) of each node-spanning sequence;
    ``load[n]``: GPU-time node ``n`` carries; ``tokens[n]``: its tokens;
    ``cost[i]``: GPU-time node-local sequence ``i`` adds to its node.
    """

    seqs: list[list[int]]
    inter: dict[int, tuple[int, ...]]
    load: list[float]
    tokens: list[int]
    cost: dict[int, float]
    lends: int = 0
    """How many :class:`Lend` moves were applied."""
    spill: list[int] = field(default_factory=list)
    """Sequences no node had room for (its tokens too scattered): level 2 places them after the nodes
    (:func:`~.place_gpus.place_spilled`)."""


@dataclass(frozen=True)
class Trade:
    """Sequences ``out`` move from node ``hi`` to ``lo`` and ``back`` from ``lo`` to ``hi``."""

    out: tuple[int, ...]
    back: tuple[int, ...]
    hi: int
    lo: int


@dataclass(frozen=True)
class Lend:
    """Sequence ``seq`` of ``hi`` becomes a ring over ``hi``'s GPUs plus ``m`` GPUs of ``lo``."""

    seq: int
    hi: int
    lo: int
    m: int


@dataclass(frozen=True)
class Shift:
    """``hi``'s share of the whole-node ring of ``seq`` moves to ``lo``."""

    seq: int
    hi: int
    lo: int


@dataclass(frozen=True)
class Widen:
    """The whole-node ring of ``seq`` takes ``lo`` as one more node."""

    seq: int
    lo: int


Move = Union[Trade, Lend, Shift, Widen]

TIE_BATCH = -3
"""Tie rank of a :class:`Trade` of several light sequences at once."""
TIE_SEVERAL = -2
"""Tie rank of a swap for several sequences of ``lo`` and of a :class:`Widen`."""
TIE_ONE = -1
"""Tie rank of a :class:`Trade` of one sequence and of a :class:`Shift`."""


def tie_lend(m: int) -> int:
    """Tie rank of a :class:`Lend` of ``m`` GPUs: ``-3 - m`` (larger lends first). A swap for one
    sequence ``b`` of ``lo`` ranks by ``b``'s placement order (>= 0)."""
    return TIE_BATCH - m


class MoveKey(NamedTuple):
    """Order of candidate moves (lower wins): ``peak`` over the nodes touched, ``seq`` (the moved
    sequence's placement order), ``tie`` (the kind's tie rank), ``lo`` (the receiving node).

    Example: two moves reach the same peak 41.0 with the same sequence (order 3): a lend of
    2 GPUs, ``MoveKey(41.0, 3, -5, 1)``, wins over a single trade, ``MoveKey(41.0, 3, -1, 1)``.
    """

    peak: float
    seq: int
    tie: int
    lo: int


class Item(NamedTuple):
    """A node-local sequence of ``hi`` as the moves see it (sorted by cost, then placement order)."""

    cost: float
    order: int
    seq: int
    tokens: int
    light: float
    """Its whole time if it is light (:meth:`~.partition_context.PartitionContext.is_light`), else 0."""
    lends: tuple[tuple[int, float], ...]
    """``(m, per-rank ms of a G + m ring)`` for each allowed lend (empty when lends are off)."""


@dataclass(frozen=True)
class RoundView:
    """What one round knows before it looks at any ``lo``: the busiest node ``hi`` and, per node,
    the node-spanning ring time on each GPU (``busy``), its unevenness, its light work, whether it
    holds heavy sequences, and how much light work it may give away (``spare``); ``hi``'s items."""

    hi: int
    busy: list[list[float]]
    uneven: list[float]
    fill: list[float]
    heavy: list[bool]
    spare: list[float]
    items: list[Item]
    costs: list[float]
    hi_rings: list[tuple[int, list[int]]]
    """``(sequence, its nodes)`` of each ring over whole nodes through ``hi``."""
    firsts: list[Item]
    """The first of ``items`` with each (cost, tokens, light, lends): a later one offers the same
    swaps and lends with a later placement order, which never win."""
    spans: list[tuple[int, int] | None]
    """Per item, ``(start, end)`` of its run of equal cost in ``items`` when all of the run have the
    same tokens and light work (each can go where the others can), else ``None``."""


Candidate = tuple[MoveKey, Move]


def single_trades(ctx: PartitionContext, st: NodeState, view: RoundView, lo: int, gap: float) -> Iterator[Candidate]:
    """One sequence of cost ``c < gap`` from ``hi`` to ``lo``: the peak ``max(hi - c, lo + c)`` falls
    until ``c = gap / 2`` and rises after, so only the feasible costs nearest ``gap / 2`` on either
    side count (all sequences of that cost), and of those only the earliest in placement order is
    offered (the others reach the same peak with a later order and never win). Example: gap 10,
    costs 2, 4, 4, 7: the first 4 (below) and the 7 (above). A run of equal items (:attr:`RoundView.spans`)
    that cannot go is skipped whole."""
    hi, tok, load, items, spans = view.hi, st.tokens, st.load, view.items, view.spans
    soft_cap, spare = ctx.node_soft_cap - tok[lo], view.spare[hi]
    split = bisect_left(view.costs, gap / 2)
    j = split - 1  # below gap / 2: the costliest that can go, then the earliest of its cost that can
    while j >= 0:
        x = items[j]
        if x.tokens <= soft_cap and x.light <= spare:
            k = bisect_left(view.costs, x.cost, 0, j)
            while not (items[k].tokens <= soft_cap and items[k].light <= spare):
                k += 1
            yield _one_trade(items[k], load[hi], load[lo], hi, lo)
            break
        span = spans[j]
        j = j - 1 if span is None else span[0] - 1
    j, stop = split, bisect_left(view.costs, gap)
    while j < stop:  # from gap / 2 up to gap: the cheapest that can go (the earliest of its cost)
        x = items[j]
        if x.tokens <= soft_cap and x.light <= spare:
            yield _one_trade(x, load[hi], load[lo], hi, lo)
            break
        span = spans[j]
        j = j + 1 if span is None else span[1]


def _one_trade(x: Item, hi_load: float, lo_load: float, hi: int, lo: int) -> Candidate:
    return MoveKey(max(hi_load - x.cost, lo_load + x.cost), x.order, TIE_ONE, lo), Trade((x.seq,), (), hi, lo)


def batch_trade(ctx: PartitionContext, st: NodeState, view: RoundView, lo: int, gap: float,
                rank_in_order: Sequence[int]) -> Iterator[Candidate]:
    """Several light sequences of ``hi`` at once, largest first, up to ``gap / 2`` (saves rounds).

    Example: gap 10, costs 1, 2, 3, 6: 3 and 2 go (5 <= 5), 1 does not (6 > 5). What a batch
    holds only grows, so once an item does not fit, no later equal one does: the rest of its
    run (:attr:`RoundView.spans`) is skipped.
    """
    hi, tok, items, spans = view.hi, st.tokens, view.items, view.spans
    batch: list[int] = []
    got, batch_tok, batch_fill = 0.0, 0, 0.0
    j = bisect_left(view.costs, gap / 2) - 1
    while j >= 0:
        x = items[j]
        if (got + x.cost <= gap / 2 and tok[lo] + batch_tok + x.tokens <= ctx.node_soft_cap
                and batch_fill + x.light <= view.spare[hi]):
            batch.append(x.seq)
            got += x.cost
            batch_tok += x.tokens
            batch_fill += x.light
            j -= 1
        else:
            span = spans[j]
            j = j - 1 if span is None else span[0] - 1
    if len(batch) > 1:
        yield (MoveKey(max(st.load[hi] - got, st.load[lo] + got), rank_in_order[batch[0]], TIE_BATCH, lo),
               Trade(tuple(batch), (), hi, lo))


class LoView(NamedTuple):
    """The sequences of a receiving node ``lo`` as the swaps see them (:func:`lo_view_of`).

    Example: costs ``{4: 2.0, 5: 3.0, 6: 2.0}``, all of one length, order = index:
    ``items [5, 4, 6]``, ``firsts [5, 4]``, ``runs [(0, 1), (1, 3)]``, ``total 7.0``, ``first_keys`` and
    ``run_keys [-3.0, -2.0]``.
    """

    items: list[int]
    """``lo``'s sequences, costliest first (ties: placement order)."""
    firsts: list[int]
    """The first of ``items`` with each cost and length (hence light work): a later one offers the
    same swap with a later tie rank (:func:`swaps`), which never wins."""
    runs: list[tuple[int, int]]
    """``(start, end)`` in ``items`` of each run of equal cost."""
    total: float
    """Their cost summed in ``items`` order."""
    first_keys: list[float]
    """``-cost`` of each of ``firsts`` (ascending: ``firsts`` are costliest first), for :func:`swaps`' bisection."""
    run_keys: list[float]
    """``-cost`` of each run (ascending), for :func:`swap_for_several`'s bisection."""


def lo_view_of(ctx: PartitionContext, st: NodeState, lo: int, rank_in_order: Sequence[int]) -> LoView:
    """:class:`LoView` of node ``lo``: its sequences grouped by cost (C-level passes when the costs
    are few), each group in placement order. A sequence's light work follows from its length, so
    the first of each length in a group stands for the group's others."""
    cost, seqs, lengths = st.cost, st.seqs[lo], ctx.lengths
    costs = list(map(cost.__getitem__, seqs))
    distinct = sorted(set(costs), reverse=True)
    if len(distinct) <= 8:
        groups = [list(compress(seqs, map(eq, costs, repeat(c)))) for c in distinct]
    else:
        by_cost: dict[float, list[int]] = {}
        for b, c in zip(seqs, costs):
            by_cost.setdefault(c, []).append(b)
        groups = [by_cost[c] for c in distinct]
    items: list[int] = []
    firsts: list[int] = []
    runs: list[tuple[int, int]] = []
    for g in groups:
        g.sort(key=rank_in_order.__getitem__)
        runs.append((len(items), len(items) + len(g)))
        items.extend(g)
        first = dict(zip(reversed(list(map(lengths.__getitem__, g))), reversed(g)))  # length -> its first
        firsts.extend(sorted(first.values(), key=rank_in_order.__getitem__))
    return LoView(items, firsts, runs, sum(map(cost.__getitem__, items)), [-cost[b] for b in firsts],
                  [-cost[items[a]] for a, _ in runs])


def swaps(ctx: PartitionContext, st: NodeState, view: RoundView, lo: int, gap: float, item: Item,
          lo_view: LoView, rank_in_order: Sequence[int]) -> Iterator[Candidate]:
    """``item`` (cost ``c >= gap``) for one sequence ``b`` of ``lo`` with ``0 < c - cost(b) < gap``
    (``b`` among ``lo_view.firsts``: the others lose to them)."""
    hi, tok, load = view.hi, st.tokens, st.load
    # only b with c - gap < cost(b) < c can pass (bisection, with a margin: the exact test below decides)
    keys, c = lo_view.first_keys, item.cost
    margin = 1e-9 * (1.0 + abs(c) + gap)  # far above the rounding of c - cost(b)
    start = bisect_left(keys, -c - margin)
    end = bisect_left(keys, gap - c + margin)
    for b in lo_view.firsts[start:end]:
        m = item.cost - st.cost[b]
        if not 0 < m < gap:
            continue
        tb = ctx.lengths[b]
        fb = ctx.w[b] if ctx.is_light(b) else 0.0
        if (tok[lo] + item.tokens - tb <= ctx.node_soft_cap and tok[hi] - item.tokens + tb <= ctx.node_soft_cap
                and item.light - fb <= view.spare[hi] and fb - item.light <= view.spare[lo]):
            yield (MoveKey(max(load[hi] - m, load[lo] + m), item.order, rank_in_order[b], lo),
                   Trade((item.seq,), (b,), hi, lo))


def swap_for_several(ctx: PartitionContext, st: NodeState, view: RoundView, lo: int, gap: float, item: Item,
                     lo_view: LoView) -> Iterator[Candidate]:
    """``item`` (cost ``c >= gap``) for several sequences of ``lo``, largest first up to ``c - gap / 2``
    (see the module docstring's example). Within a run of equal cost the first that does not
    fit ends the run (the rest cannot fit either), so this costs the runs plus the sequences taken."""
    if lo_view.total <= item.cost - gap:
        return
    hi, tok, load, cost, items = view.hi, st.tokens, st.load, st.cost, lo_view.items
    budget = item.cost - gap / 2
    taken: list[tuple[int, int]] = []
    got = 0.0
    keys, runs = lo_view.run_keys, lo_view.runs
    margin = 1e-9 * (1.0 + 2 * abs(budget))  # far above the rounding of got + c (0 <= got <= budget)
    j = 0
    while j < len(runs):
        # runs costlier than what is left take nothing: skip them (bisection, with a margin)
        j = max(j, bisect_left(keys, got - budget - margin))
        if j == len(runs):
            break
        start, end = runs[j]
        j += 1
        c = cost[items[start]]
        k = start
        while k < end and got + c <= budget:  # the sums one by one, as the plain greedy adds them
            got += c
            k += 1
        if k > start:
            taken.append((start, k))
    m = item.cost - got
    if not (0 < m < gap and sum(k - a for a, k in taken) > 1):
        return
    back = [b for a, k in taken for b in items[a:k]]
    back_tok = sum(map(ctx.lengths.__getitem__, back))
    fb = sum(filter(partial(ge, ctx.limit), map(ctx.w.__getitem__, back)))  # light work (is_light), in order
    if (tok[lo] + item.tokens - back_tok <= ctx.node_soft_cap
            and tok[hi] - item.tokens + back_tok <= ctx.node_soft_cap
            and item.light - fb <= view.spare[hi] and fb - item.light <= view.spare[lo]):
        yield (MoveKey(max(load[hi] - m, load[lo] + m), item.order, TIE_SEVERAL, lo),
               Trade((item.seq,), tuple(back), hi, lo))


def lends(ctx: PartitionContext, st: NodeState, view: RoundView, lo: int, item: Item,
          lo_busy: list[float]) -> Iterator[Candidate]:
    """``item`` as a ring over ``hi``'s ``G`` GPUs plus the ``m`` least busy GPUs of ``lo``.

    ``lo`` takes ``m * r`` (``r``: per-rank time); if its light work cannot even out the
    ``m`` lent GPUs, a node with heavy sequences refuses, one without is charged ``G`` times
    its busiest GPU. ``lo``'s tokens grow by at most ``m`` times the ring's largest position.
    """
    if not item.lends or item.light > view.spare[view.hi]:
        return
    hi, gpn, load = view.hi, ctx.gpn, st.load
    for m, r in item.lends:
        after = [x + r for x in lo_busy[:m]] + lo_busy[m:]
        lo_new = load[lo] + m * r
        if sum(max(after) - x for x in after) > max(view.fill[lo], view.uneven[lo]) + EPS:
            if view.heavy[lo]:
                continue  # lo's light work could not even out the lent GPUs
            lo_new = max(lo_new, gpn * max(after))  # its busiest GPU sets its level
        if st.tokens[lo] + m * ring_max_tokens(item.tokens, gpn + m) <= ctx.node_soft_cap:
            yield (MoveKey(max(load[hi] - item.cost + gpn * r, lo_new), item.order, tie_lend(m), lo),
                   Lend(item.seq, hi, lo, m))


def ring_moves(ctx: PartitionContext, st: NodeState, view: RoundView, lo: int, gap: float,
               rank_in_order: Sequence[int]) -> Iterator[Candidate]:
    """:class:`Shift` and :class:`Widen` of each ring over whole nodes through ``hi`` and not ``lo``."""
    hi, gpn, load, tok = view.hi, ctx.gpn, st.load, st.tokens
    for a, nodes in view.hi_rings:
        if lo in nodes:
            continue  # already on lo
        s, k, order = ctx.lengths[a], len(nodes), rank_in_order[a]
        share = gpn * ctx.inter_ms(s, k * gpn)
        if share < gap and tok[lo] + max(ring_node_tokens(s, k, gpn)) <= ctx.node_soft_cap:
            yield MoveKey(max(load[hi] - share, load[lo] + share), order, TIE_ONE, lo), Shift(a, hi, lo)
        if ctx.inter_ok(s, (k + 1) * gpn) and tok[lo] + max(ring_node_tokens(s, k + 1, gpn)) <= ctx.node_soft_cap:
            new_share = gpn * ctx.inter_ms(s, (k + 1) * gpn)
            peak = max(max(load[n] for n in nodes) - share + new_share, load[lo] + new_share)
            yield MoveKey(peak, order, TIE_SEVERAL, lo), Widen(a, lo)
