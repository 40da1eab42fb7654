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

from dataclasses import dataclass, field
from functools import partial
from operator import ge
from typing import Iterator, Sequence

from .node_moves import EPS as _EPS
from .node_moves import (
    TIE_BATCH, TIE_ONE, TIE_SEVERAL, Candidate, Item, Lend, LoView, Move, MoveKey, NodeState, RoundView, Shift,
    Trade, Widen, batch_trade, lends, lo_view_of, ring_moves, single_trades, swap_for_several, swaps, tie_lend,
)
from .partition_context import PartitionContext
from .zigzag import zigzag_tokens

__all__ = [
    "NodeState", "rebalance_nodes", "Trade", "Lend", "Shift", "Widen", "Move", "MoveKey", "Item", "RoundView",
    "LoView", "lo_view_of",
    "single_trades", "batch_trade", "swaps", "swap_for_several", "lends", "ring_moves",
    "TIE_BATCH", "TIE_SEVERAL", "TIE_ONE", "tie_lend",
]


def rebalance_nodes(ctx: PartitionContext, st: NodeState, rank_in_order: Sequence[int], *,
                    lend: bool = True) -> bool:
    """Apply improving moves to ``st`` (see the module docstring); True if any was made.

    Every move keeps each node's tokens within ``ctx.node_soft_cap``. ``lend``:
    whether :class:`Lend` moves are allowed.
    """
    n_nodes = ctx.cluster.nodes
    can_lend = lend and ctx.allow_inter and n_nodes > 1
    lend_ms: dict[int, tuple[tuple[int, float], ...]] = {}  # per length, computed once
    memo = NodeMemo()
    moved = False
    for _ in range(sum(len(s) for s in st.seqs) + len(st.inter)):
        if max(st.load) - min(st.load) <= _EPS:  # no node below the busiest: no move (_candidates)
            return moved
        view = _round_view(ctx, st, rank_in_order, lend_ms if can_lend else None, memo)
        top = st.load[view.hi] - _EPS
        best: Candidate | None = None
        bound = [float("inf")]  # the best peak so far: _candidates skips trades that cannot reach it
        for cand in _candidates(ctx, st, view, rank_in_order, memo, bound):
            if cand[0].peak < top and (best is None or cand[0] < best[0]):
                best = cand
                bound[0] = cand[0].peak
        if best is None:
            return moved
        move = best[1]
        _apply(ctx, st, move, rank_in_order)
        memo.drop(*((move.hi, move.lo) if isinstance(move, Trade) else (move.hi,) if isinstance(move, Lend) else ()))
        moved = True
    return moved


NodeItems = tuple[list[Item], list[float], list[Item], list[tuple[int, int] | None]]
"""A node's items, their costs, firsts and spans (:class:`RoundView`)."""


@dataclass
class NodeMemo:
    """What rounds of one :func:`rebalance_nodes` call compute from a node's sequences alone (their
    costs and lengths do not change within the call), kept until a move changes them.

    ``fill[n]``: ``(light work, holds heavy sequences)``; ``items[n]``: its :class:`Item` list
    (sorted), their costs, :attr:`RoundView.firsts` and ``spans``; ``lo_views[n]``: its
    :class:`LoView`; ``item_of[a]``: sequence ``a``'s :class:`Item` (kept across moves).
    """

    fill: dict[int, tuple[float, bool]] = field(default_factory=dict)
    items: dict[int, NodeItems] = field(default_factory=dict)
    lo_views: dict[int, LoView] = field(default_factory=dict)
    item_of: dict[int, Item] = field(default_factory=dict)

    def drop(self, *nodes: int) -> None:
        """Forget ``nodes`` (their sequences changed)."""
        for n in nodes:
            self.fill.pop(n, None)
            self.items.pop(n, None)
            self.lo_views.pop(n, None)


def _round_view(ctx: PartitionContext, st: NodeState, rank_in_order: Sequence[int],
                lend_ms: dict[int, tuple[tuple[int, float], ...]] | None, memo: NodeMemo | None = None) -> RoundView:
    n_nodes, gpn, w = ctx.cluster.nodes, ctx.gpn, ctx.w
    memo = NodeMemo() if memo is None else memo
    hi = max(range(n_nodes), key=lambda n: (st.load[n], -n))
    busy = _ring_busy(ctx, st)
    uneven = [sum(max(b) - x for x in b) for b in busy]
    fill, heavy, limit = [], [], ctx.limit
    light = partial(ge, limit)  # light(x): x <= limit (is_light)
    for n in range(n_nodes):
        if n not in memo.fill:
            times = list(map(w.__getitem__, st.seqs[n]))
            is_heavy = bool(times) and max(times) > limit
            memo.fill[n] = (sum(filter(light, times)) if is_heavy else sum(times), is_heavy)  # light work, in order
        fill.append(memo.fill[n][0])
        heavy.append(memo.fill[n][1])
    # How much light work a node may lose and still even out its GPUs (or be no worse).
    spare = [fill[n] - min(uneven[n], fill[n]) + _EPS for n in range(n_nodes)]
    if hi not in memo.items:
        memo.items[hi] = _node_items(ctx, st, hi, rank_in_order, lend_ms, memo)
    items, costs, firsts, spans = memo.items[hi]
    hi_rings = []
    for a, ring in st.inter.items():
        nodes = _ring_nodes(ring, gpn)
        if hi in nodes and len(ring) == len(nodes) * gpn:
            hi_rings.append((a, nodes))
    return RoundView(hi, busy, uneven, fill, heavy, spare, items, costs, hi_rings, firsts, spans)


def _node_items(ctx: PartitionContext, st: NodeState, n: int, rank_in_order: Sequence[int],
                lend_ms: dict[int, tuple[tuple[int, float], ...]] | None, memo: NodeMemo) -> NodeItems:
    """Node ``n``'s :class:`Item` list sorted, their costs, the first item of each (cost, tokens,
    light, lends) and each item's run: :attr:`RoundView.items`, ``costs``, ``firsts``, ``spans``.
    An :class:`Item` depends on its sequence alone: each is built once per call (``memo.item_of``)."""
    gpn, w, item_of = ctx.gpn, ctx.w, memo.item_of
    for a in st.seqs[n]:
        if a in item_of:
            continue
        s = ctx.lengths[a]
        if lend_ms is not None and s not in lend_ms:
            # The ratio falls as the ring grows: if G + 1 ranks cannot hide the transfer, none can.
            lend_ms[s] = tuple((m, ctx.inter_ms(s, gpn + m)) for m in range(1, gpn + 1)
                               if s >= 2 * (gpn + m) and ctx.inter_ok(s, gpn + m)) \
                if ctx.inter_ok(s, gpn + 1) else ()
        item_of[a] = Item(st.cost[a], rank_in_order[a], a, s, w[a] if ctx.is_light(a) else 0.0,
                          lend_ms[s] if lend_ms is not None else ())
    items = sorted(map(item_of.__getitem__, st.seqs[n]))
    costs = [x.cost for x in items]
    firsts, seen = [], set()
    spans: list[tuple[int, int] | None] = []
    start = 0
    for j, x in enumerate(items):
        key = (x.cost, x.tokens, x.light, x.lends)
        if key not in seen:
            seen.add(key)
            firsts.append(x)
        if j + 1 == len(items) or costs[j + 1] != x.cost:  # a run of equal cost ends at j
            kinds = {(y.tokens, y.light) for y in items[start:j + 1]} if j > start else ()
            span = (start, j + 1) if len(kinds) <= 1 else None
            spans.extend([span] * (j + 1 - start))
            start = j + 1
    return items, costs, firsts, spans


def _candidates(ctx: PartitionContext, st: NodeState, view: RoundView,
                rank_in_order: Sequence[int], memo: NodeMemo | None = None,
                bound: list[float] | None = None) -> Iterator[Candidate]:
    """Every move of this round that can win, receiving nodes from the least loaded up (until none
    is lower). Swaps and lends are offered for ``view.firsts`` only (and swaps for one sequence of
    ``lo`` only for :attr:`LoView.firsts`): an item like an earlier one offers the same moves
    with a later placement order, which never win (:class:`MoveKey`).

    ``bound`` (the caller's best peak so far, kept up to date between candidates): a trade between
    ``hi`` and ``lo`` moves work from one to the other, so its peak is at least their mean load; once
    ``bound[0]`` is below that mean (by more than rounding), ``lo``'s trades and swaps are not offered
    (they would lose on the peak), its lends and ring moves still are. Example: loads hi 10, lo 6 and a
    best peak of 7.5 so far: every trade with ``lo`` peaks at 8 or more, so none is offered."""
    memo = NodeMemo() if memo is None else memo
    for lo in sorted(range(ctx.cluster.nodes), key=lambda n: (st.load[n], n)):
        gap = st.load[view.hi] - st.load[lo]
        if gap <= _EPS:
            return
        mean = (st.load[view.hi] + st.load[lo]) / 2
        trades = bound is None or bound[0] >= mean - 1e-9 * (1.0 + abs(mean))
        if trades:
            yield from single_trades(ctx, st, view, lo, gap)
            yield from batch_trade(ctx, st, view, lo, gap, rank_in_order)
        lo_busy = sorted(view.busy[lo])
        for item in view.firsts:
            if trades and item.cost >= gap:
                if lo not in memo.lo_views:
                    memo.lo_views[lo] = lo_view_of(ctx, st, lo, rank_in_order)
                yield from swaps(ctx, st, view, lo, gap, item, memo.lo_views[lo], rank_in_order)
                yield from swap_for_several(ctx, st, view, lo, gap, item, memo.lo_views[lo])
            yield from lends(ctx, st, view, lo, item, lo_busy)
        yield from ring_moves(ctx, st, view, lo, gap, rank_in_order)


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
        out, back = set(move.out), set(move.back)
        st.seqs[hi], st.seqs[lo] = ([i for i in st.seqs[hi] if i not in out] + list(move.back),
                                    [i for i in st.seqs[lo] if i not in back] + list(move.out))
        for i, src, dst in [(a, hi, lo) for a in move.out] + [(b, lo, hi) for b in move.back]:
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
