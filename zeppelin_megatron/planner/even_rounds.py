"""Many equal items in a "least loaded bin first" greedy, placed whole rounds at a time (issue 14 item 4).

Both levels of the partitioner place sequences one by one on the least loaded bin (a node,
a GPU), ties to the lower index: bin ``b`` holding ``load[b]`` (float) and ``tokens[b]``
takes an item of cost ``c`` and ``s`` tokens, then holds ``load[b] + c`` and
``tokens[b] + s``. A run of equal items (a million one-token sequences) soon goes round
robin: every bin takes one item per round, in one fixed order. :func:`even_rounds` finds,
with array arithmetic, how many whole rounds do so exactly, so that the caller can place
them by slicing instead of item by item; the items after them go one by one as before.

Exactness: each bin's loads after ``k`` items are computed as the greedy computes them,
``((load + c) + c) + ...`` in float64 (``numpy.cumsum`` adds in sequence), and a round
is accepted only where the greedy provably picks the bins in the fixed order: at the
round's start the bins sort as ``(load, index)`` in that order, and every bin's load
after its item exceeds every load before (as ``(load, index)``), so no bin is picked twice
in a round. Each pick must also pass the caller's limits (``tokens + s <= token_limit``,
``load + c <= load_limit``); a round where one would fail is left to the item-by-item loop.

Example: loads ``[0.0, 0.0]``, ``c = 1.0``, 7 items: rounds of order ``[0, 1]``, 3 of them
(6 items), loads then ``[3.0, 3.0]``; the 7th item goes one by one (to bin 0).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["even_rounds", "MIN_ROUNDS"]

MIN_ROUNDS = 4
"""Fewer whole rounds than this are not worth the arrays: the caller goes item by item."""


def even_rounds(loads: Sequence[float], tokens: Sequence[int], cost: float, size: int, items: int, *,
                token_limit: float, load_limit: float = math.inf,
                subset: bool = False) -> tuple[list[int], int, list[float]]:
    """``(order, rounds, loads after)``: the greedy's next ``rounds * len(order)`` picks are ``order`` repeated.

    ``rounds`` is 0 (and ``order`` empty) when fewer than :data:`MIN_ROUNDS` whole rounds are
    exact (module docstring); ``loads after`` is each bin's load after ``rounds`` items.
    ``order`` holds every bin, unless ``subset``: then the rounds may go over the least loaded
    bins only (:func:`_subset`), while the others stay above every load they pick at.
    Example: ``even_rounds([0.0, 0.0], [0, 0], 1.0, 1, 7, token_limit=100)``: 3 rounds are
    fewer than 4, so ``([], 0, [0.0, 0.0])``; with 20 items: ``([0, 1], 10, [10.0, 10.0])``;
    ``even_rounds([0.0, 0.0, 9.5], [0] * 3, 1.0, 1, 30, token_limit=100, subset=True)``:
    ``([0, 1], 10, [10.0, 10.0, 9.5])``: the 10th round starts at ``(9.0, 1) < (9.5, 2)``, the
    11th would start at ``(10.0, 1)``, where the greedy picks bin 2.
    """
    if subset:
        return _subset(loads, tokens, cost, size, items, token_limit=token_limit, load_limit=load_limit)
    return _even(loads, tokens, cost, size, items, token_limit, load_limit)


def _subset(loads: Sequence[float], tokens: Sequence[int], cost: float, size: int, items: int, *,
            token_limit: float, load_limit: float) -> tuple[list[int], int, list[float]]:
    """:func:`even_rounds` over the ``m`` least loaded bins (as ``(load, index)``), ``m`` the most
    whose first round goes in order; with ``m < len(loads)`` a round is taken only while the
    greatest ``(load, index)`` it picks at is below the least of the other bins, which the
    greedy then never picks. Example: loads ``[5.0, 0.0, 0.2]``, cost 1, 30 items: bins 1 and 2
    (0.2 < 1.0), not bin 0; 5 rounds, the last starting at ``(4.2, 2) < (5.0, 0)``:
    ``([1, 2], 5, [5.0, 5.0, 5.2])``."""
    k = len(loads)
    if not k or not cost > 0.0:
        return [], 0, list(loads)
    order = sorted(range(k), key=lambda b: (loads[b], b))
    m, low = 0, (math.inf, k)
    for b in order:  # low: the least (load + cost, index) of the bins taken so far
        low = min(low, (loads[b] + cost, b))
        if low <= (loads[b], b):
            break
        m += 1
    if m == k:
        return _even(loads, tokens, cost, size, items, token_limit, load_limit)
    if m == 0:
        return [], 0, list(loads)
    first = order[m]  # the least of the bins left out
    turn, rounds, after = _even([loads[b] for b in order[:m]], [tokens[b] for b in order[:m]], cost, size, items,
                                token_limit, load_limit, below=(loads[first], first), ids=order[:m])
    if not rounds:
        return [], 0, list(loads)
    out = list(loads)
    for j, b in enumerate(order[:m]):
        out[b] = after[j]
    return [order[j] for j in turn], rounds, out


def _even(loads: Sequence[float], tokens: Sequence[int], cost: float, size: int, items: int, token_limit: float,
          load_limit: float, below: tuple[float, int] | None = None,
          ids: Sequence[int] | None = None) -> tuple[list[int], int, list[float]]:
    """:func:`even_rounds` over all of ``loads``; ``ids``: the bins' indices for ties (default
    ``0..k-1``); ``below``: a round's greatest ``(load, id)`` at its start must be less than it."""
    k = len(loads)
    ids = list(range(k)) if ids is None else list(ids)
    rounds = items // k if k else 0
    for t in tokens:  # rounds whose every pick keeps this bin within token_limit
        if rounds < MIN_ROUNDS:
            break
        if size > 0 and token_limit < math.inf:
            room = max(0, int((token_limit - t) // size))
            while t + (room + 1) * size <= token_limit:  # exact, as the greedy compares
                room += 1
            while room > 0 and t + room * size > token_limit:
                room -= 1
            rounds = min(rounds, room)
    if rounds < MIN_ROUNDS or not cost > 0.0:
        return [], 0, list(loads)
    order = sorted(range(k), key=lambda b: (loads[b], ids[b]))
    last = (loads[order[-1]], ids[order[-1]])
    if min((loads[b] + cost, ids[b]) for b in range(k)) <= last:  # not even the first round: one by one
        return [], 0, list(loads)
    v = np.empty((k, rounds + 1))
    v[:, 0] = loads
    v[:, 1:] = cost
    np.cumsum(v, axis=1, out=v)  # v[b, j]: bin b's load after j items, added in sequence
    idx = np.array(ids)
    p = v[order]
    later = idx[order[1:]] > idx[order[:-1]]
    in_order = ((p[1:] > p[:-1]) | ((p[1:] == p[:-1]) & later[:, None])).all(axis=0)  # per column
    top, top_bin = p[-1, :-1], ids[order[-1]]  # the greatest (load, index) at each round's start
    new = v[:, 1:]
    above = ((new > top) | ((new == top) & (idx > top_bin)[:, None])).all(axis=0)
    ok = in_order[:-1] & above & (new <= load_limit).all(axis=0)
    if below is not None:  # every pick of the round is below the bins left out
        ok &= (top < below[0]) | ((top == below[0]) & (top_bin < below[1]))
    done = rounds if ok.all() else int(np.argmin(ok))
    if done < MIN_ROUNDS:
        return [], 0, list(loads)
    return order, done, v[:, done].tolist()
