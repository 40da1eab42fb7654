"""Level 1's local search: lower the busiest node's load by moving work between nodes.

The state (:class:`NodeState`) is level 1's outcome: each node's node-local
sequences (level 2 places them on the node's GPUs), the node-spanning rings,
and each node's load (GPU-time summed over its GPUs) and tokens. Each round
takes the busiest node ``hi`` and, for every less loaded node ``lo``
(``gap`` = their load difference), considers:

* ``trade``: light sequences of ``hi`` go to ``lo`` (one, or several largest
  first up to ``gap / 2``); or one sequence too costly to move alone goes
  to ``lo`` for one cheaper sequence of ``lo``, or for several taken largest
  first up to ``c - gap / 2``, where ``c`` is its cost (net move ``0 < m <
  gap``). Example: gap 114, ``c = 203``, ``lo`` holds 60, 50, 30, 9 (sum 149):
  ``lo`` gives back 60 + 50 + 30 = 140 <= 146, ``hi`` sheds 63;
* ``lend``: a sequence of ``hi`` becomes a ring over all ``G`` GPUs of ``hi``
  and ``m`` GPUs of ``lo`` (``1 <= m <= G``; the ``m`` with the least
  node-spanning ring time), only where that ring hides its transfer and beats
  keeping the sequence whole (:meth:`_Ctx.inter_ok`). With per-rank time
  ``r = inter_ms(s, G + m)``, ``hi`` carries ``G * r`` and ``lo`` ``m * r``.
  Example: a 49k-token sequence costing 218 GPU-ms over ``G + 4 = 12`` ranks
  (``r ~ 20``): ``hi`` sheds 58, ``lo`` takes 80. A small ``m`` moves a thin
  slice of a huge sequence, which whole-node moves cannot;
* ``shift``: ``hi``'s share of a ring over whole nodes moves to ``lo``;
* ``widen``: a ring over ``k`` whole nodes through ``hi`` takes ``lo`` as one
  more node (a lower share on each; only where the larger ring is allowed).

A lend leaves ``lo``'s GPUs uneven. Level 2 evens them out with light
sequences (whole-sequence time at most the limit, :func:`_is_fill`), so a
move may not leave a node with less light work than its unevenness (the sum
over its GPUs of the gap to its busiest one); a node without heavy sequences
may take the unevenness anyway, its level then being ``G`` times its
busiest GPU.

A round applies the move with the lowest resulting peak over the nodes it
touches; ties go to the earlier sequence in the placement order, then a fixed
order of move kinds, then the lower node. The search stops when no move lowers
the busiest node (at most one round per sequence). Pure and deterministic.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .zigzag import ring_max_tokens, ring_node_tokens, zigzag_tokens

if TYPE_CHECKING:
    from .partition import _Ctx

__all__ = ["NodeState", "rebalance_nodes"]

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
    """How many ``lend`` moves were applied."""


def _ring_nodes(ring: tuple[int, ...], gpn: int) -> list[int]:
    return sorted({r // gpn for r in ring})


def rebalance_nodes(ctx: "_Ctx", st: NodeState, rank_in_order: dict[int, int], *, lend: bool = True) -> bool:
    """Apply improving moves to ``st`` (see the module docstring); True if any was made.

    Every move keeps each node's tokens within ``ctx.node_soft_cap``. ``lend``:
    whether ``lend`` moves are allowed.
    """
    n_nodes, gpn = ctx.cluster.nodes, ctx.gpn
    cap_node = ctx.node_soft_cap
    lengths, load, tok, w = ctx.lengths, st.load, st.tokens, ctx.w
    can_span = lend and ctx.allow_inter and n_nodes > 1
    lend_ms: dict[int, list[tuple[int, float]]] = {}  # seq -> [(m, per-rank ms of a G + m ring)] allowed
    moved = False
    for _ in range(sum(len(s) for s in st.seqs) + len(st.inter)):
        hi = max(range(n_nodes), key=lambda n: (load[n], -n))
        top = load[hi] - _EPS
        # key: (peak of the touched nodes, sequence order, kind: the other sequence's order or a
        # negative code, lo); then the move itself.
        best: tuple[tuple, tuple] | None = None
        busy = _ring_busy(ctx, st)
        uneven = [sum(max(b) - x for x in b) for b in busy]
        fill = [sum(w[b] for b in st.seqs[n] if _is_fill(ctx, b)) for n in range(n_nodes)]
        heavy = [any(not _is_fill(ctx, b) for b in st.seqs[n]) for n in range(n_nodes)]
        # How much light work a node may lose and still even out its GPUs (or be no worse).
        spare = [fill[n] - min(uneven[n], fill[n]) + _EPS for n in range(n_nodes)]
        hi_items = []
        for a in st.seqs[hi]:
            ta = lengths[a]
            if can_span and a not in lend_ms:
                # The ratio falls as the ring grows: if G + 1 ranks cannot hide the transfer, none can.
                lend_ms[a] = [(m, ctx.inter_ms(ta, gpn + m)) for m in range(1, gpn + 1)
                              if ta >= 2 * (gpn + m) and ctx.inter_ok(ta, gpn + m)] \
                    if ctx.inter_ok(ta, gpn + 1) else []
            hi_items.append((st.cost[a], rank_in_order[a], a, ta, w[a] if _is_fill(ctx, a) else 0.0,
                             lend_ms.get(a, ())))
        hi_items.sort()
        hi_costs = [x[0] for x in hi_items]

        def consider(key: tuple, move: tuple) -> None:
            nonlocal best
            if key[0] < top and (best is None or key < best[0]):
                best = (key, move)

        for lo in sorted(range(n_nodes), key=lambda n: (load[n], n)):
            gap = load[hi] - load[lo]
            if gap <= _EPS:
                break
            # Moves of one sequence of cost c < gap: the peak max(hi - c, lo + c) falls until
            # c = gap / 2 and rises after, so only the feasible costs nearest gap / 2 matter.
            split = bisect_left(hi_costs, gap / 2)
            for side in (range(split - 1, -1, -1), range(split, bisect_left(hi_costs, gap))):
                found = None
                for j in side:
                    ca, ka, a, ta, fa, _ = hi_items[j]
                    if found is not None and ca != found:
                        break
                    if tok[lo] + ta <= cap_node and fa <= spare[hi]:
                        consider((max(load[hi] - ca, load[lo] + ca), ka, -1, lo), ("trade", (a,), (), hi, lo))
                        found = ca
            # Several light sequences at once, largest first, up to gap / 2 (saves rounds).
            batch, got, batch_tok, batch_fill = [], 0.0, 0, 0.0
            for j in range(split - 1, -1, -1):
                ca, ka, a, ta, fa, _ = hi_items[j]
                if got + ca <= gap / 2 and tok[lo] + batch_tok + ta <= cap_node and batch_fill + fa <= spare[hi]:
                    batch.append(a)
                    got += ca
                    batch_tok += ta
                    batch_fill += fa
            if len(batch) > 1:
                consider((max(load[hi] - got, load[lo] + got), rank_in_order[batch[0]], -3, lo),
                         ("trade", tuple(batch), (), hi, lo))
            lo_items: list[int] | None = None
            lo_busy = sorted(busy[lo])
            for ca, ka, a, ta, fa, lends in hi_items:
                if ca >= gap:
                    if lo_items is None:
                        lo_items = sorted(st.seqs[lo], key=lambda b: (-st.cost[b], rank_in_order[b]))
                        lo_total = sum(st.cost[b] for b in lo_items)
                    for b in lo_items:
                        m = ca - st.cost[b]
                        if not 0 < m < gap:
                            continue
                        tb = lengths[b]
                        fb = w[b] if _is_fill(ctx, b) else 0.0
                        if tok[lo] + ta - tb <= cap_node and tok[hi] - ta + tb <= cap_node \
                                and fa - fb <= spare[hi] and fb - fa <= spare[lo]:
                            consider((max(load[hi] - m, load[lo] + m), ka, rank_in_order[b], lo),
                                     ("trade", (a,), (b,), hi, lo))
                    if lo_total > ca - gap:
                        back, got, back_tok = _trade_back(st, lo_items, ca - gap / 2, lengths)
                        m = ca - got
                        fb = sum(w[b] for b in back if _is_fill(ctx, b))
                        if len(back) > 1 and 0 < m < gap and tok[lo] + ta - back_tok <= cap_node \
                                and tok[hi] - ta + back_tok <= cap_node \
                                and fa - fb <= spare[hi] and fb - fa <= spare[lo]:
                            consider((max(load[hi] - m, load[lo] + m), ka, -2, lo),
                                     ("trade", (a,), tuple(back), hi, lo))
                if lends and fa <= spare[hi]:
                    for m, r in lends:
                        after = [x + r for x in lo_busy[:m]] + lo_busy[m:]
                        lo_new = load[lo] + m * r
                        if sum(max(after) - x for x in after) > max(fill[lo], uneven[lo]) + _EPS:
                            if heavy[lo]:
                                continue  # lo's light work could not even out the lent GPUs
                            lo_new = max(lo_new, gpn * max(after))  # its busiest GPU sets its level
                        if tok[lo] + m * ring_max_tokens(ta, gpn + m) <= cap_node:
                            consider((max(load[hi] - ca + gpn * r, lo_new), ka, -3 - m, lo),
                                     ("lend", a, hi, lo, m))
            for a, ring in st.inter.items():
                nodes = _ring_nodes(ring, gpn)
                if hi not in nodes or lo in nodes or len(ring) != len(nodes) * gpn:
                    continue  # not through hi, already on lo, or not over whole nodes
                s, k, ka = lengths[a], len(nodes), rank_in_order[a]
                share = gpn * ctx.inter_ms(s, len(ring))
                if share < gap and tok[lo] + max(ring_node_tokens(s, k, gpn)) <= cap_node:
                    consider((max(load[hi] - share, load[lo] + share), ka, -1, lo), ("shift", a, hi, lo))
                if ctx.inter_ok(s, (k + 1) * gpn) and tok[lo] + max(ring_node_tokens(s, k + 1, gpn)) <= cap_node:
                    new_share = gpn * ctx.inter_ms(s, (k + 1) * gpn)
                    peak = max(max(load[n] for n in nodes) - share + new_share, load[lo] + new_share)
                    consider((peak, ka, -2, lo), ("widen", a, lo))
        if best is None:
            return moved
        _apply(ctx, st, best[1], rank_in_order)
        moved = True
    return moved


def _is_fill(ctx: "_Ctx", i: int) -> bool:
    """Sequence ``i`` is light enough for level 2 to keep whole on one GPU (it evens out GPU loads)."""
    return ctx.w[i] <= ctx.limit


def _ring_busy(ctx: "_Ctx", st: NodeState) -> list[list[float]]:
    """Node-spanning ring time on each GPU: ``busy[node][local index]``."""
    gpn = ctx.gpn
    busy = [[0.0] * gpn for _ in range(ctx.cluster.nodes)]
    for a, ring in st.inter.items():
        r = ctx.inter_ms(ctx.lengths[a], len(ring))
        for rank in ring:
            busy[rank // gpn][rank % gpn] += r
    return busy


def _trade_back(st: NodeState, lo_items: list[int], want: float,
                lengths: Sequence[int]) -> tuple[list[int], float, int]:
    """Largest-first subset of ``lo_items`` whose cost stays within ``want``: (items, cost, tokens)."""
    back: list[int] = []
    got, back_tok = 0.0, 0
    for b in lo_items:
        cb = st.cost[b]
        if got + cb <= want:
            back.append(b)
            got += cb
            back_tok += lengths[b]
    return back, got, back_tok


def _set_ring(ctx: "_Ctx", st: NodeState, a: int, ranks: tuple[int, ...] | None) -> None:
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


def _whole_nodes(ctx: "_Ctx", nodes: list[int]) -> tuple[int, ...]:
    return tuple(ctx.cluster.rank_of(n, l) for n in sorted(nodes) for l in range(ctx.gpn))


def _lent_gpus(ctx: "_Ctx", st: NodeState, node: int, m: int) -> list[int]:
    """The ``m`` GPUs of ``node`` carrying the least node-spanning ring time (ties: lower local index)."""
    busy = _ring_busy(ctx, st)[node]
    return sorted(sorted(range(ctx.gpn), key=lambda l: (busy[l], l))[:m])


def _apply(ctx: "_Ctx", st: NodeState, move: tuple, rank_in_order: dict[int, int]) -> None:
    kind = move[0]
    if kind == "trade":
        _, out, back, hi, lo = move
        for i, src, dst in [(a, hi, lo) for a in out] + [(b, lo, hi) for b in back]:
            st.seqs[src].remove(i)
            st.seqs[dst].append(i)
            st.load[src] -= st.cost[i]
            st.load[dst] += st.cost[i]
            st.tokens[src] -= ctx.lengths[i]
            st.tokens[dst] += ctx.lengths[i]
        st.seqs[hi].sort(key=rank_in_order.__getitem__)
        st.seqs[lo].sort(key=rank_in_order.__getitem__)
    elif kind == "lend":
        _, a, hi, lo, m = move
        st.lends += 1
        st.seqs[hi].remove(a)
        st.load[hi] -= st.cost[a]
        st.tokens[hi] -= ctx.lengths[a]
        lent = [ctx.cluster.rank_of(lo, l) for l in _lent_gpus(ctx, st, lo, m)]
        _set_ring(ctx, st, a, tuple(sorted(lent + [ctx.cluster.rank_of(hi, l) for l in range(ctx.gpn)])))
    elif kind == "shift":
        _, a, hi, lo = move
        _set_ring(ctx, st, a, _whole_nodes(ctx, sorted(set(_ring_nodes(st.inter[a], ctx.gpn)) - {hi} | {lo})))
    else:  # widen
        _, a, lo = move
        _set_ring(ctx, st, a, _whole_nodes(ctx, _ring_nodes(st.inter[a], ctx.gpn) + [lo]))
