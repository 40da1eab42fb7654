"""Whole documents moved or swapped off the busiest ranks of a finished packed plan, documents moved between its
head-parallel rings, and whole documents joining one (:func:`move_whole`).

A packing (:mod:`.packed`) places documents by *estimates*: a group's work is the sum of its documents' work
at one linear cost per token, and whole documents go, heaviest first, to the least-loaded rank of the group
the group-level pass chose, never to another group's. The finished plan's prediction then differs: the linear
time per token depends on a rank's tokens, a whole document on a ring's rank pays the engine's row copies, a
ring's waits hide local work, and the last documents placed are not small against the gaps left (Llama-7B
arxiv-64k on 16 GPUs, 512k tokens, batch 0: ranks 5-7 at 123.2 ms a layer under a head-parallel ring with
nothing else, ranks 12, 13 and 15 of the other node at 131.0-131.5, predicted under the engine's charges).

:func:`move_whole` corrects that on the finished plan with :func:`~.predict.predict`'s own per-rank terms.
Without a remap a rank ``r`` takes ``attn_r + linear_ms(t_r)`` a layer, ``attn_r = tot_r + max(0, max(loc_r, o)
- (tot_r - own_r))`` when it holds whole documents, else ``tot_r`` (:func:`~.predict.rank_attention`; ``tot_r``,
``own_r`` its rings', :func:`~.predict.ring_loads`, which no move changes; ``loc_r`` its whole documents'
``local_ms`` plus their row copies where it pays them, :func:`~.predict.copied_ranks`; ``o`` a call's overhead;
``t_r`` its tokens). So ``L`` times the busiest rank's layer *is* the predicted step under those charges, before
and after the moves (:class:`Moved`; checked against ``predict`` in ``tests/planner/test_whole_moves.py``).

The busiest rank ``b`` (ties: the lower rank) gives a whole document of ``s`` tokens to a receiver ``r``, taking
back one of ``u < s`` tokens or none, where ``r`` has room (``tokens_per_gpu``) and both end below ``b``'s time
now; receivers are tried least-loaded first (ties: the lower rank) among the :data:`TARGETS` least-loaded ranks
and every ring rank whose waits would hide part of a document, and the first receiver with such a trade makes
the one with the lowest ``max(new b, new r)`` (ties: the shorter ``s``, then ``u``). One document per distinct
length is tried on each side (the lowest index); for each ``s`` the best ``u`` is found by bisection where the cost
model's times rise with tokens (:func:`_swaps`). Where no such trade exists and ``b`` is a member of a
head-parallel ring, one of that ring's documents may move to another head-parallel ring over as many ranks at
the same width, sharing no rank with it, where every member of both ends below ``b``'s time (the lowest such
maximum; receivers least-loaded first; :data:`RING_TRIES` receivers timed in all): at 128 GPUs the busiest ranks
are often a ring holding two long documents beside rings holding one (Llama-3B prolong-64k, batch 0: a ring over
16 ranks with 53.1k and 50.8k tokens at 32.2 ms a layer, others at 28.1-29.5). Where neither lowers ``b``, one of
``b``'s whole documents may *join* a head-parallel ring ``b`` is not a member of (sharded over its ranks at its
width, in two zigzag chunks per member, ``s >= 2 g``, within every member's room) where ``b`` and every member end
below ``b``'s time (the lowest such maximum, ties: the shorter document; ``b``'s documents longest first, rings
least-loaded first, :data:`RING_TRIES` timed in all): a document too long for any rank's gap is not too long for a
ring's (Llama-7B prolong-128k on 128 GPUs, batch 0: rank 0, a member of the ring over ranks 0-31 that holds one
122k-token document, also holds a 6478-token one whole, 65.7 ms a layer, charged, against 60.8 and 61.6 on the
members of two other rings of 32 ranks that hold no whole document; a single rank taking it would end above 70, the
ring over ranks 64-95 at 61.5; rank 1's 6107 tokens then join the other one). :attr:`Moved.widths` names each
joined document with its ring's width, which the finished plan gives it. A ring is timed as
:func:`~.predict.ring_loads` times it (:meth:`RingMoves.terms`: in parts where
:func:`~.ring_parts.split_rings` would split it), so the step stays exact. Each trade or move lowers the rank
times sorted in descending order (lexicographically), so the loop ends; it stops after ``2 P`` of them at most.
Routes and widths stay as they were (a moved document keeps its width, its receiver's; a joined one takes its ring's):
:func:`~.packed_search.best_packed` finishes the traded placement with the same widths and keeps it where its
step is lower.

Example (4 GPUs, no rings, no linear time, no call overhead, ``local_ms(s) = s / 1000``): ranks 0-3 holding
``[5000, 3000]``, ``[4000]``, ``[4000]``, ``[2000]`` (8, 4, 4, 2 ms). Rank 0 is busiest; the least-loaded
receiver, rank 3, can take 3000 (``max(5, 5) = 5``), take 5000 (``max(3, 7) = 7``) or swap 5000 for 2000
(``max(5, 5) = 5``; the tie goes to the shorter ``s``): 3000 moves, times (5, 4, 4, 5).
Then rank 0 (5 ms, the lower of the two busiest) holds only 5000: moving it (``max(0, 9)``), or swapping it for
4000 (``max(4, 5)``, not below 5), 2000 (``max(2, 8)``) or 3000 (``max(3, 7)``) lowers nothing: the loop ends,
the step 8 -> 5.

Pure and deterministic.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from functools import partial
from typing import Callable, NamedTuple, Sequence

from .cost_model import CostModel
from .engine_ring import local_copy_ms_per_token
from .packed import sharded_ms
from .partition_context import Assignment
from .plan import StepPlan
from .predict import copied_ranks, ring_loads
from .ring_parts import family_time, split_of
from .zigzag import zigzag_counts

__all__ = ["move_whole", "trade_whole", "Moved", "TARGETS"]

TARGETS = 8
"""How many of the least-loaded ranks are offered a trade (besides ring ranks whose waits would hide a document)."""


class Moved(NamedTuple):
    """What :func:`move_whole` made: the traded placement, and the step before and after the trades (``L`` layers
    times the busiest rank's layer, :func:`~.predict.predict`'s step of a plan without a remap)."""

    assignments: list[Assignment]
    before_ms: float
    after_ms: float
    widths: dict[int, int] = {}
    """The block width of each whole document that joined a head-parallel ring (its ring's), by index."""


def move_whole(lengths: Sequence[int], assignments: Sequence[Assignment], plan: StepPlan, cost: CostModel,
               charges: str, *, parts: bool = True) -> Moved | None:
    """``assignments`` (the placement ``plan`` was finished from, linear layout = attention layout) with whole
    documents traded off the busiest ranks, and documents moved between head-parallel rings (module docstring),
    and the step before and after, or ``None`` when nothing lowers the step or
    ``plan`` has a remap. Times under ``charges`` (:func:`~.predict.predict`'s); ``parts``: rings of several
    documents are timed in parts where :func:`~.ring_parts.split_rings` would split them (``plan_step`` splits
    them when ``ring_parts`` and ``head_parallel`` are on)."""
    if plan.linear_layout != plan.attention_layout:
        return None
    world = cost.cluster.world_size
    loads = ring_loads(plan, cost, charges)
    tot, own = loads.total, loads.own
    copied = copied_ranks(plan)
    per_token = local_copy_ms_per_token(cost, charges)
    pays = [per_token if copied is None or r in copied else 0.0 for r in range(world)]
    rings = RingMoves(cost, charges, parts, {})
    for i, x in enumerate(plan.sequences):
        if x.placement != "local" and x.a2a > 1:
            rings.members.setdefault((x.ranks, x.a2a), []).append(i)
    return trade_whole(lengths, assignments, list(tot), list(own), pays, list(plan.rank_tokens[1]), cost, rings)


class RingShift(NamedTuple):
    """Document ``seq`` moved from the ring ``old`` to the ring ``new`` (``(ranks, width)`` keys); ``before`` and
    ``after``: the ``(total, own)`` terms of ``(old, new)``."""

    seq: int
    old: tuple[tuple[int, ...], int]
    new: tuple[tuple[int, ...], int]
    before: tuple[tuple[float, float], tuple[float, float]]
    after: tuple[tuple[float, float], tuple[float, float]]


class RingJoin(NamedTuple):
    """Whole document ``seq`` joined the head-parallel ring ``ring`` (a ``(ranks, width)`` key); ``before`` and
    ``after``: the ring's ``(total, own)`` terms without and with it."""

    seq: int
    ring: tuple[tuple[int, ...], int]
    before: tuple[float, float]
    after: tuple[float, float]


class RingMoves(NamedTuple):
    """What :func:`trade_whole` needs to move a document between head-parallel rings: the charges, whether rings of
    several documents run in parts where that pays (:func:`~.ring_parts.split_rings`), and each ring's documents
    by ``(ranks, width)`` (updated in place)."""

    cost: CostModel
    charges: str
    parts: bool
    members: dict[tuple[tuple[int, ...], int], list[int]]

    def terms(self, ranks: tuple[int, ...], lengths: Sequence[int], a2a: int) -> tuple[float, float]:
        """A head-parallel ring's ``(total, own)`` on each member as :func:`~.predict.ring_loads` adds them
        (``own`` with the all-to-alls), in parts where :func:`~.ring_parts.split_rings` would split it; zeros for no
        documents. ``lengths`` in sequence order."""
        if not lengths:
            return 0.0, 0.0
        cost, charges = self.cost, self.charges
        key = ("ring_terms", ranks, tuple(lengths), a2a, charges, self.parts)
        hit = cost._cache.get(key)
        if hit is not None:  # memoised: a ring is timed again at every try
            return hit  # type: ignore[no-any-return]
        split = split_of(cost, ranks, lengths, a2a) if self.parts else [list(range(len(lengths)))]
        total, own, a2a_ms = family_time(cost, ranks, [[lengths[j] for j in sorted(p)] for p in split], a2a, charges)
        cost._cache[key] = out = (total, own + a2a_ms)
        return out


def trade_whole(lengths: Sequence[int], assignments: Sequence[Assignment], tot: list[float], own: list[float],
                pays: Sequence[float], tokens: list[int], cost: CostModel,
                rings: RingMoves | None = None) -> Moved | None:
    """The trades of :func:`move_whole` (module docstring) given each rank's ring ``tot`` and ``own`` ms a layer,
    the row-copy ms per token ``pays`` its whole documents cost on top of ``local_ms``, and its ``tokens``
    (updated in place); ``None`` when no trade lowers the step. ``cost`` gives ``local_ms``, ``linear_ms``, the
    call overhead, the layers, the cluster's ranks and ``tokens_per_gpu``, and ``times_increase`` (swaps found by
    bisection, :func:`_swaps`, where it holds; else every swap tried)."""
    world, cap = cost.cluster.world_size, cost.cluster.tokens_per_gpu
    oh = cost.call_overhead_ms
    bisect = cost.times_increase()  # swaps found by bisection (_swaps)
    loc = [0.0] * world
    held: list[list[int]] = [[] for _ in range(world)]
    for i, a in enumerate(assignments):
        if a.placement == "local":
            r = a.ranks[0]
            loc[r] += cost.local_ms(lengths[i]) + lengths[i] * pays[r]
            held[r].append(i)
    linear_ms = cost.linear_ms

    def layer(t: float, o: float, local: float, n: int, tok: int) -> float:
        """A rank's layer with rings of total ``t`` and own ``o`` ms, ``n`` whole documents of ``local`` ms (which fill
        the rings' waits, :func:`~.predict.rank_attention`) and ``tok`` tokens."""
        return (t + max(0.0, max(local, oh) - (t - o)) if n else t) + linear_ms(tok)

    def time(r: int, local: float, t: int, n: int) -> float:
        """Rank ``r``'s layer with ``n`` whole documents of ``local`` ms and ``t`` tokens."""
        return layer(tot[r], own[r], local, n, t)

    def call(r: int, s: int) -> float:
        """What a whole document of ``s`` tokens adds to rank ``r``'s local work."""
        return cost.local_ms(s) + s * pays[r]

    times = [time(r, loc[r], tokens[r], len(held[r])) for r in range(world)]
    order = sorted((t, r) for r, t in enumerate(times))  # (time, rank), ascending

    def give(b: int, s: int, u: int, j: int, drop: dict[tuple[int, int], float]) -> float:
        """Rank ``b``'s time after giving ``s`` and taking ``u`` (``j = -1``: taking nothing), memoised in ``drop``
        (``b``'s, while its work stays)."""
        after_b = drop.get((s, u))
        if after_b is None:
            after_b = drop[(s, u)] = time(b, loc[b] - call(b, s) + (call(b, u) if j >= 0 else 0.0),
                                          tokens[b] - s + u, len(held[b]) - (j < 0))
        return after_b

    def take(r: int, s: int, u: int, j: int) -> float:
        """Rank ``r``'s time after taking ``s`` and giving ``u`` (``j = -1``: giving nothing)."""
        return time(r, loc[r] + call(r, s) - (call(r, u) if j >= 0 else 0.0), tokens[r] + s - u,
                    len(held[r]) + (j < 0))

    def crossed(b: int, r: int, s: int, drop: dict[tuple[int, int], float], u: int) -> bool:
        """Whether swapping ``s`` of ``b`` for ``u`` of ``r`` leaves ``b`` at least as busy as ``r``."""
        return give(b, s, u, 0, drop) >= take(r, s, u, 0)

    def hides(r: int) -> bool:
        """Whether rank ``r``'s ring waits have room for more local work."""
        return tot[r] - own[r] > (max(loc[r], oh) if held[r] else 0.0)

    spare = {r for r in range(world) if hides(r)}  # ranks whose ring waits would hide part of a document
    where = [a.ranks[0] if a.placement == "local" else -1 for a in assignments]
    ring_of: dict[int, Assignment] = {}  # documents moved to another ring, or whole ones that joined one
    widths: dict[int, int] = {}  # whole documents that joined a head-parallel ring: its width
    on_ring = {k: assignments[v[0]] for k, v in rings.members.items()} if rings else {}  # each ring's assignment
    first = order[-1][0]
    moved = False
    kinds: list[list[tuple[int, int]] | None] = [None] * world  # _distinct(held[r]), until r changes

    def shifted(x: int, d_tot: float, d_own: float, d_tok: int) -> float:
        """Rank ``x``'s layer with its rings' ``tot`` and ``own`` and its tokens changed by these amounts."""
        return layer(tot[x] + d_tot, own[x] + d_own, loc[x], len(held[x]), tokens[x] + d_tok)

    def retime(x: int) -> None:
        """Rank ``x``'s time, its place in ``order`` and in ``spare`` after its work changed."""
        del order[bisect_left(order, (times[x], x))]
        times[x] = time(x, loc[x], tokens[x], len(held[x]))
        insort(order, (times[x], x))
        if hides(x):
            spare.add(x)
        else:
            spare.discard(x)

    def taking(rings: RingMoves, key: tuple[tuple[int, ...], int], i: int,
               shares: Sequence[int]) -> tuple[tuple[float, float], tuple[float, float], float]:
        """The head-parallel ring ``key`` taking document ``i`` (``shares``: its zigzag tokens per member): the ring's
        ``(total, own)`` terms before and after, and its busiest member's time after."""
        ranks, a2a = key
        theirs = rings.members[key]
        before = rings.terms(ranks, [lengths[j] for j in theirs], a2a)
        after = rings.terms(ranks, [lengths[j] for j in sorted(theirs + [i])], a2a)
        grown = (after[0] - before[0], after[1] - before[1])
        return before, after, max(shifted(x, *grown, t) for x, t in zip(ranks, shares))

    def ring_move(b: int, top: float, rings: RingMoves) -> RingShift | None:
        """A document of a head-parallel ring holding ``b`` moved to another ring over as many ranks at the same
        width where every member of both ends below ``top``: the lowest such maximum (ties: the shorter document,
        then the receiver whose busiest member is less loaded), trying receivers least-loaded first and at most
        :data:`RING_TRIES` pairs; ``None`` when none lowers ``b``."""
        best: tuple[float, int, int, RingShift] | None = None
        tries = 0
        for key in [k for k, seqs in rings.members.items() if seqs and b in k[0]]:
            ranks, a2a = key
            seqs = rings.members[key]
            others = sorted((max(times[x] for x in k[0]), k[0], k) for k in rings.members
                            if k != key and len(k[0]) == len(ranks) and k[1] == a2a and not set(k[0]) & set(ranks))
            if not others or others[0][0] >= top - 1e-9:
                continue  # no receiver below b: none can end below it
            before = rings.terms(ranks, [lengths[j] for j in seqs], a2a)
            for i in sorted(seqs, key=lambda j: (lengths[j], j)):
                if others[0][0] + RING_SHARE * sharded_ms(cost, lengths[i], len(ranks)) >= top - 1e-9:
                    break  # longer documents cost a receiver more (estimated: the document alone on its ring)
                shares = zigzag_counts(lengths[i], len(ranks))
                after = rings.terms(ranks, [lengths[j] for j in seqs if j != i], a2a)
                giver = max(shifted(x, after[0] - before[0], after[1] - before[1], -t) for x, t in zip(ranks, shares))
                if giver >= top - 1e-9:
                    continue
                gain = before[1] - after[1]  # what the document costs each member of its ring
                for peak, _, other in others:
                    if peak + RING_SHARE * gain >= top - 1e-9 or (best is not None and peak >= best[0]):
                        break  # a receiver only gains (about what the giver loses, on a ring of its shape)
                    if any(tokens[x] + t > cap for x, t in zip(other[0], shares)):
                        continue
                    if tries >= RING_TRIES:
                        return None if best is None else best[3]
                    tries += 1
                    o0, o1, taker = taking(rings, other, i, shares)
                    value = max(giver, taker)
                    cand = (value, lengths[i], i, RingShift(i, key, other, (before, o0), (after, o1)))
                    if value < top - 1e-9 and (best is None or cand[:3] < best[:3]):
                        best = cand
        return None if best is None else best[3]

    def reprice(ring: tuple[int, ...], before: tuple[float, float], after: tuple[float, float], s: int,
                sign: int) -> None:
        """The members of ``ring`` after a document of ``s`` tokens left it (``sign = -1``) or came (``1``): its
        ``(total, own)`` terms ``before`` -> ``after``, each member's zigzag share of the tokens, their times."""
        for x, t in zip(ring, zigzag_counts(s, len(ring))):
            tot[x] += after[0] - before[0]
            own[x] += after[1] - before[1]
            tokens[x] += sign * t
            retime(x)

    def ring_join(b: int, top: float, rings: RingMoves) -> RingJoin | None:
        """A whole document of ``b`` sharded over a head-parallel ring ``b`` is not a member of, where ``b`` and every
        member end below ``top``: the lowest such maximum (ties: the shorter document), trying ``b``'s documents
        longest first and rings least-loaded first, at most :data:`RING_TRIES` pairs timed; ``None`` when none
        lowers ``b``. A document joins only a ring it can be zigzag-split over (two chunks per member) within every
        member's room."""
        mine = _distinct(held[b], lengths)
        if not mine:
            return None
        best: tuple[float, int, RingJoin] | None = None
        keys = sorted((max(times[x] for x in k[0]), k) for k, seqs in rings.members.items() if seqs and b not in k[0])
        if not keys or keys[0][0] >= top - 1e-9:
            return None  # no ring below b: none can end below it
        tries = 0
        for i, s in reversed(mine):
            giver = time(b, loc[b] - call(b, s), tokens[b] - s, len(held[b]) - 1)
            if giver >= top - 1e-9:
                continue
            for peak, key in keys:
                if peak >= top - 1e-9 or (best is not None and peak >= best[0]):
                    break  # the rest are busier: a receiver ends above its busiest member
                ranks = key[0]
                if s < 2 * len(ranks):
                    continue
                shares = zigzag_counts(s, len(ranks))
                if any(tokens[x] + t > cap for x, t in zip(ranks, shares)):
                    continue
                if tries >= RING_TRIES:
                    return None if best is None else best[2]
                tries += 1
                t0, t1, taker = taking(rings, key, i, shares)
                value = max(giver, taker)
                if value < top - 1e-9 and (best is None or (value, s) < best[:2]):
                    best = (value, s, RingJoin(i, key, t0, t1))
        return None if best is None else best[2]

    for _ in range(2 * world):
        top = order[-1][0]
        b = order[bisect_left(order, (top, -1))][1]  # the busiest (ties: the lowest rank)
        targets = sorted({r for _, r in order[:TARGETS]}.union(spare), key=lambda r: (times[r], r))
        mine = _distinct(held[b], lengths)
        drop: dict[tuple[int, int], float] = {}  # (s, u) -> b's time after giving s and taking u
        best: tuple[float, int, int, int, int, int] | None = None  # value, s, u, r, i, j (j = -1: a move)
        for r in targets:
            if best is not None:
                break  # the least-loaded receiver with a move that lowers b
            if r == b:
                continue
            theirs = kinds[r]
            if theirs is None:
                theirs = kinds[r] = [(-1, 0)] + _distinct(held[r], lengths)
            room = cap - tokens[r]
            halve = bisect and len(theirs) > BISECT_FROM
            for i, s in mine:
                for j, u in _swaps(s, room, theirs, partial(crossed, b, r, s, drop)) if halve else theirs:
                    if u >= s:
                        break  # a swap for a longer one moves work toward b
                    if s - u > room:
                        continue
                    after_b = drop.get((s, u))
                    if after_b is None:
                        after_b = give(b, s, u, j, drop)
                    if after_b > (top - 1e-9 if best is None else best[0]):
                        continue  # no lower than b now, or than the best so far
                    key = (max(after_b, take(r, s, u, j)), s, u, r, i, j)
                    if key[0] < top - 1e-9 and (best is None or key < best):
                        best = key
        if best is None:
            if rings is None:
                break
            shift = ring_move(b, top, rings)
            if shift is None:
                join = ring_join(b, top, rings)
                if join is None:
                    break
                i, joined, before, after = join
                s = lengths[i]
                loc[b] -= call(b, s)
                tokens[b] -= s
                held[b].remove(i)
                retime(b)
                kinds[b] = None
                ring_of[i] = on_ring[joined]
                widths[i] = joined[1]
                rings.members[joined].append(i)
                rings.members[joined].sort()
                reprice(joined[0], before, after, s, 1)
                moved = True
                continue
            i, old_key, new_key, old_terms, new_terms = shift
            rings.members[old_key].remove(i)
            ring_of[i] = on_ring[new_key]
            rings.members[new_key].append(i)
            rings.members[new_key].sort()
            reprice(old_key[0], old_terms[0], new_terms[0], lengths[i], -1)
            reprice(new_key[0], old_terms[1], new_terms[1], lengths[i], 1)
            moved = True
            continue
        _, s, u, r, i, j = best
        for x, out, into in ((b, i, j), (r, j, i)):
            if out >= 0:
                loc[x] -= call(x, lengths[out])
                tokens[x] -= lengths[out]
                held[x].remove(out)
            if into >= 0:
                loc[x] += call(x, lengths[into])
                tokens[x] += lengths[into]
                held[x].append(into)
                where[into] = x
            retime(x)
            kinds[x] = None
        moved = True
    layers = cost.model.layers
    if not moved or layers * order[-1][0] >= layers * first - 1e-6:  # predictions are rounded to 1e-6 ms
        return None
    traded = [ring_of[i] if i in ring_of else Assignment("local", (where[i],)) if a.placement == "local" else a
              for i, a in enumerate(assignments)]
    return Moved(traded, layers * first, layers * order[-1][0], widths)


BISECT_FROM = 8
"""A receiver holding more than this many distinct lengths (and the move) has its swaps found by bisection
(:func:`_swaps`); fewer are all tried (as fast)."""

RING_TRIES = 6
"""At most this many (document, receiving ring) pairs are timed for one ring move (each times two rings)."""

RING_SHARE = 0.5
"""A receiving ring is timed only where its busiest member plus this share of what the document costs each member of
its own ring stays below the busiest rank (a ring of the same shape gains about that much)."""


def _swaps(s: int, room: int, theirs: Sequence[tuple[int, int]],
           crossed: Callable[[int], bool]) -> list[tuple[int, int]]:
    """The pairs of ``theirs`` (``(-1, 0)``, then ``(index, length)`` by length, :func:`_distinct`) among which
    :func:`trade_whole`'s lowest ``(max(after_b, after_r), u)`` for a document of ``s`` tokens lies: the move
    (``(-1, 0)``) where ``s`` fits ``room``, and the two swaps around the crossing of ``after_b``, which rises with the
    length ``u`` taken back, and ``after_r``, which falls (``crossed(u)``: ``after_b >= after_r``), among the ``u`` with
    ``s - room <= u < s``. Exact where :meth:`~.cost_model.CostModel.times_increase` holds: below the crossing the
    maximum is ``after_r``, falling, above it ``after_b``, rising. ``O(log n)`` calls of ``crossed`` instead of the
    ``n`` swaps. Example: lengths ``u`` of ``[100, 200, 300, 400]``, ``s = 350``, room 200: ``u`` from 150 to 349,
    so 200 and 300; ``crossed(200)`` false, ``crossed(300)`` true: both are returned."""
    out = [theirs[0]] if s <= room else []
    lo = bisect_left(theirs, s - room, 1, key=lambda x: x[1])
    hi = bisect_left(theirs, s, lo, key=lambda x: x[1])
    a, z = lo, hi
    while a < z:  # the first swap at or past the crossing
        m = (a + z) // 2
        if crossed(theirs[m][1]):
            z = m
        else:
            a = m + 1
    out.extend(theirs[k] for k in (a - 1, a) if lo <= k < hi)
    return out


def _distinct(held: Sequence[int], lengths: Sequence[int]) -> list[tuple[int, int]]:
    """``(index, length)`` of one document per distinct length of ``held`` (the lowest index), shortest first."""
    seen: dict[int, int] = {}
    for i in held:
        s = lengths[i]
        if s not in seen or i < seen[s]:
            seen[s] = i
    return sorted(((i, s) for s, i in seen.items()), key=lambda x: (x[1], x[0]))
