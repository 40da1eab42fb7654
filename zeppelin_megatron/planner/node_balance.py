"""Level 1's local search: lower the busiest node's load by moving work between nodes.

The state (:class:`NodeState`) is level 1's outcome: each node's node-local
sequences (level 2 places them on the node's GPUs), the node-spanning rings,
and each node's load (GPU-time summed over its GPUs) and tokens. Each round
takes the busiest node ``hi`` and, for every less loaded node ``lo``
(``gap`` = their load difference), considers these moves (one function each):

* :class:`Trade` (:func:`single_trades`, :func:`batch_trade`, :func:`swaps`,
  :func:`swap_for_several`): light sequences of ``hi`` go to ``lo`` (one, or
  several largest first up to ``gap / 2``); or one sequence too costly to move
  alone goes to ``lo`` for one cheaper sequence of ``lo``, or for several taken
  largest first up to ``c - gap / 2``, where ``c`` is its cost (net move
  ``0 < m < gap``). Example: gap 114, ``c = 203``, ``lo`` holds 60, 50, 30, 9
  (sum 149): ``lo`` gives back 60 + 50 + 30 = 140 <= 146, ``hi`` sheds 63;
* :class:`Lend` (:func:`lends`): a sequence of ``hi`` becomes a ring over all
  ``G`` GPUs of ``hi`` and ``m`` GPUs of ``lo`` (``1 <= m <= G``), only where
  that ring hides its transfer and beats keeping the sequence whole
  (:meth:`~.partition_context.PartitionContext.inter_ok`). With per-rank time
  ``r = inter_ms(s, G + m)``, ``hi`` carries ``G * r`` and ``lo`` ``m * r``.
  Example: a 49k-token sequence costing 218 GPU-ms over ``G + 4 = 12`` ranks
  (``r ~ 20``): ``hi`` sheds 58, ``lo`` takes 80. A small ``m`` moves a thin
  slice of a huge sequence, which whole-node moves cannot;
* :class:`Shift` (:func:`ring_moves`): ``hi``'s share of a ring over whole
  nodes moves to ``lo``;
* :class:`Widen` (:func:`ring_moves`): a ring over ``k`` whole nodes through
  ``hi`` takes ``lo`` as one more node (a lower share on each; only where the
  larger ring is allowed).

A lend leaves ``lo``'s GPUs uneven. Level 2 evens them out with light
sequences (:meth:`~.partition_context.PartitionContext.is_light`), so a move
may not leave a node with less light work than its unevenness (the sum over its
GPUs of the gap to its busiest one); a node without heavy sequences may take
the unevenness anyway, its level then being ``G`` times its busiest GPU.

A round applies the move with the lowest :class:`MoveKey`: the resulting peak
over the nodes it touches, then the earlier sequence in the placement order,
then the move's tie rank (:func:`tie_lend`, :data:`TIE_BATCH`, ...), then the
lower node. The search stops when no move lowers the busiest node (at most
one round per sequence). Pure and deterministic.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from functools import partial
from operator import ge
from typing import Iterator, NamedTuple, Sequence, Union

from .partition_context import PartitionContext
from .zigzag import ring_max_tokens, ring_node_tokens, zigzag_tokens

__all__ = [
    "NodeState", "rebalance_nodes", "Trade", "Lend", "Shift", "Widen", "Move", "MoveKey", "Item", "RoundView",
    "single_trades", "batch_trade", "swaps", "swap_for_several", "lends", "ring_moves",
    "TIE_BATCH", "TIE_SEVERAL", "TIE_ONE", "tie_lend",
]

_EPS = 1e-9


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


Candidate = tuple[MoveKey, Move]


def rebalance_nodes(ctx: PartitionContext, st: NodeState, rank_in_order: Sequence[int], *,
                    lend: bool = True) -> bool:
    """Apply improving moves to ``st`` (see the module docstring); True if any was made.

    Every move keeps each node's tokens within ``ctx.node_soft_cap``. ``lend``:
    whether :class:`Lend` moves are allowed.
    """
    n_nodes = ctx.cluster.nodes
    can_lend = lend and ctx.allow_inter and n_nodes > 1
    lend_ms: dict[int, tuple[tuple[int, float], ...]] = {}  # per length, computed once
    moved = False
    for _ in range(sum(len(s) for s in st.seqs) + len(st.inter)):
        if max(st.load) - min(st.load) <= _EPS:  # no node below the busiest: no move (_candidates)
            return moved
        view = _round_view(ctx, st, rank_in_order, lend_ms if can_lend else None)
        top = st.load[view.hi] - _EPS
        best: Candidate | None = None
        for cand in _candidates(ctx, st, view, rank_in_order):
            if cand[0].peak < top and (best is None or cand[0] < best[0]):
                best = cand
        if best is None:
            return moved
        _apply(ctx, st, best[1], rank_in_order)
        moved = True
    return moved


def _round_view(ctx: PartitionContext, st: NodeState, rank_in_order: Sequence[int],
                lend_ms: dict[int, tuple[tuple[int, float], ...]] | None) -> RoundView:
    n_nodes, gpn, w = ctx.cluster.nodes, ctx.gpn, ctx.w
    hi = max(range(n_nodes), key=lambda n: (st.load[n], -n))
    busy = _ring_busy(ctx, st)
    uneven = [sum(max(b) - x for x in b) for b in busy]
    fill, heavy, limit = [], [], ctx.limit
    light = partial(ge, limit)  # light(x): x <= limit (is_light)
    for n in range(n_nodes):
        times = list(map(w.__getitem__, st.seqs[n]))
        heavy.append(bool(times) and max(times) > limit)
        fill.append(sum(filter(light, times)) if heavy[-1] else sum(times))  # light work, in order
    # How much light work a node may lose and still even out its GPUs (or be no worse).
    spare = [fill[n] - min(uneven[n], fill[n]) + _EPS for n in range(n_nodes)]
    items = []
    for a in st.seqs[hi]:
        s = ctx.lengths[a]
        if lend_ms is not None and s not in lend_ms:
            # The ratio falls as the ring grows: if G + 1 ranks cannot hide the transfer, none can.
            lend_ms[s] = tuple((m, ctx.inter_ms(s, gpn + m)) for m in range(1, gpn + 1)
                               if s >= 2 * (gpn + m) and ctx.inter_ok(s, gpn + m)) \
                if ctx.inter_ok(s, gpn + 1) else ()
        items.append(Item(st.cost[a], rank_in_order[a], a, s, w[a] if ctx.is_light(a) else 0.0,
                          lend_ms[s] if lend_ms is not None else ()))
    items.sort()
    hi_rings = []
    for a, ring in st.inter.items():
        nodes = _ring_nodes(ring, gpn)
        if hi in nodes and len(ring) == len(nodes) * gpn:
            hi_rings.append((a, nodes))
    return RoundView(hi, busy, uneven, fill, heavy, spare, items, [x.cost for x in items], hi_rings)


def _candidates(ctx: PartitionContext, st: NodeState, view: RoundView,
                rank_in_order: Sequence[int]) -> Iterator[Candidate]:
    """Every move of this round, receiving nodes from the least loaded up (until none is lower)."""
    for lo in sorted(range(ctx.cluster.nodes), key=lambda n: (st.load[n], n)):
        gap = st.load[view.hi] - st.load[lo]
        if gap <= _EPS:
            return
        yield from single_trades(ctx, st, view, lo, gap)
        yield from batch_trade(ctx, st, view, lo, gap, rank_in_order)
        lo_items: list[int] | None = None
        lo_busy = sorted(view.busy[lo])
        for item in view.items:
            if item.cost >= gap:
                if lo_items is None:  # lo's sequences, costliest first
                    lo_items = sorted(st.seqs[lo], key=lambda b: (-st.cost[b], rank_in_order[b]))
                yield from swaps(ctx, st, view, lo, gap, item, lo_items, rank_in_order)
                yield from swap_for_several(ctx, st, view, lo, gap, item, lo_items)
            yield from lends(ctx, st, view, lo, item, lo_busy)
        yield from ring_moves(ctx, st, view, lo, gap, rank_in_order)


def single_trades(ctx: PartitionContext, st: NodeState, view: RoundView, lo: int, gap: float) -> Iterator[Candidate]:
    """One sequence of cost ``c < gap`` from ``hi`` to ``lo``: the peak ``max(hi - c, lo + c)`` falls
    until ``c = gap / 2`` and rises after, so only the feasible costs nearest ``gap / 2`` on either
    side are offered (all sequences of that cost). Example: gap 10, costs 2, 4, 4, 7: the two 4s
    (below) and the 7 (above)."""
    hi, tok, load = view.hi, st.tokens, st.load
    split = bisect_left(view.costs, gap / 2)
    for side in (range(split - 1, -1, -1), range(split, bisect_left(view.costs, gap))):
        found = None
        for j in side:
            x = view.items[j]
            if found is not None and x.cost != found:
                break
            if tok[lo] + x.tokens <= ctx.node_soft_cap and x.light <= view.spare[hi]:
                yield (MoveKey(max(load[hi] - x.cost, load[lo] + x.cost), x.order, TIE_ONE, lo),
                       Trade((x.seq,), (), hi, lo))
                found = x.cost


def batch_trade(ctx: PartitionContext, st: NodeState, view: RoundView, lo: int, gap: float,
                rank_in_order: Sequence[int]) -> Iterator[Candidate]:
    """Several light sequences of ``hi`` at once, largest first, up to ``gap / 2`` (saves rounds).

    Example: gap 10, costs 1, 2, 3, 6: 3 and 2 go (5 <= 5), 1 does not (6 > 5).
    """
    hi, tok = view.hi, st.tokens
    batch: list[int] = []
    got, batch_tok, batch_fill = 0.0, 0, 0.0
    for j in range(bisect_left(view.costs, gap / 2) - 1, -1, -1):
        x = view.items[j]
        if (got + x.cost <= gap / 2 and tok[lo] + batch_tok + x.tokens <= ctx.node_soft_cap
                and batch_fill + x.light <= view.spare[hi]):
            batch.append(x.seq)
            got += x.cost
            batch_tok += x.tokens
            batch_fill += x.light
    if len(batch) > 1:
        yield (MoveKey(max(st.load[hi] - got, st.load[lo] + got), rank_in_order[batch[0]], TIE_BATCH, lo),
               Trade(tuple(batch), (), hi, lo))


def swaps(ctx: PartitionContext, st: NodeState, view: RoundView, lo: int, gap: float, item: Item,
          lo_items: list[int], rank_in_order: Sequence[int]) -> Iterator[Candidate]:
    """``item`` (cost ``c >= gap``) for one sequence ``b`` of ``lo`` with ``0 < c - cost(b) < gap``."""
    hi, tok, load = view.hi, st.tokens, st.load
    for b in lo_items:
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
                     lo_items: list[int]) -> Iterator[Candidate]:
    """``item`` (cost ``c >= gap``) for several sequences of ``lo``, largest first up to ``c - gap / 2``
    (see the module docstring's example)."""
    if sum(st.cost[b] for b in lo_items) <= item.cost - gap:
        return
    hi, tok, load = view.hi, st.tokens, st.load
    back: list[int] = []
    got, back_tok = 0.0, 0
    for b in lo_items:
        if got + st.cost[b] <= item.cost - gap / 2:
            back.append(b)
            got += st.cost[b]
            back_tok += ctx.lengths[b]
    m = item.cost - got
    fb = sum(ctx.w[b] for b in back if ctx.is_light(b))
    if (len(back) > 1 and 0 < m < gap and tok[lo] + item.tokens - back_tok <= ctx.node_soft_cap
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
        if sum(max(after) - x for x in after) > max(view.fill[lo], view.uneven[lo]) + _EPS:
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


def _ring_nodes(ring: tuple[int, ...], gpn: int) -> list[int]:
    return sorted({r // gpn for r in ring})


def _ring_busy(ctx: PartitionContext, st: NodeState) -> list[list[float]]:
    """Node-spanning ring time on each GPU: ``busy[node][local index]``."""
    gpn = ctx.gpn
    busy = [[0.0] * gpn for _ in range(ctx.cluster.nodes)]
    for a, ring in st.inter.items():
        r = ctx.inter_ms(ctx.lengths[a], len(ring))
        for rank in ring:
            busy[rank // gpn][rank % gpn] += r
    return busy


def _set_ring(ctx: PartitionContext, st: NodeState, a: int, ranks: tuple[int, ...] | None) -> None:
    """Put sequence ``a``'s node-spanning ring on ``ranks`` (``None``: take it off).

    Each node carries ``inter_ms(s, len(ranks))`` per rank it holds and the
    tokens of those ring positions.
    """
    gpn, s = ctx.gpn, ctx.lengths[a]
    for ring, sign in ((st.inter.pop(a, None), -1), (ranks, 1)):
        if ring is None:
            continue
        r = ctx.inter_ms(s, len(ring))
        for p, rank in enumerate(ring):
            st.load[rank // gpn] += sign * r
            st.tokens[rank // gpn] += sign * zigzag_tokens(s, len(ring), p)
    if ranks is not None:
        st.inter[a] = ranks


def _whole_nodes(ctx: PartitionContext, nodes: Sequence[int]) -> tuple[int, ...]:
    return tuple(ctx.cluster.rank_of(n, l) for n in sorted(nodes) for l in range(ctx.gpn))


def _apply(ctx: PartitionContext, st: NodeState, move: Move, rank_in_order: Sequence[int]) -> None:
    if isinstance(move, Trade):
        hi, lo = move.hi, move.lo
        for i, src, dst in [(a, hi, lo) for a in move.out] + [(b, lo, hi) for b in move.back]:
            st.seqs[src].remove(i)
            st.seqs[dst].append(i)
            st.load[src] -= st.cost[i]
            st.load[dst] += st.cost[i]
            st.tokens[src] -= ctx.lengths[i]
            st.tokens[dst] += ctx.lengths[i]
        st.seqs[hi].sort(key=rank_in_order.__getitem__)
        st.seqs[lo].sort(key=rank_in_order.__getitem__)
    elif isinstance(move, Lend):
        a, hi, lo = move.seq, move.hi, move.lo
        st.lends += 1
        st.seqs[hi].remove(a)
        st.load[hi] -= st.cost[a]
        st.tokens[hi] -= ctx.lengths[a]
        busy = _ring_busy(ctx, st)[lo]  # the m GPUs of lo carrying the least ring time (ties: lower index)
        lent = sorted(sorted(range(ctx.gpn), key=lambda l: (busy[l], l))[:move.m])
        ranks = [ctx.cluster.rank_of(lo, l) for l in lent] + [ctx.cluster.rank_of(hi, l) for l in range(ctx.gpn)]
        _set_ring(ctx, st, a, tuple(sorted(ranks)))
    elif isinstance(move, Shift):
        nodes = set(_ring_nodes(st.inter[move.seq], ctx.gpn)) - {move.hi} | {move.lo}
        _set_ring(ctx, st, move.seq, _whole_nodes(ctx, sorted(nodes)))
    else:
        _set_ring(ctx, st, move.seq, _whole_nodes(ctx, _ring_nodes(st.inter[move.seq], ctx.gpn) + [move.lo]))
