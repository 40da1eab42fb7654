"""Wide spans for packed candidates: the few documents a CP group alone would load above the mean work per rank get
a ring over more ranks (2 cp, 4 cp, ...), which the packing then fills around (:func:`~.packed.packed_groups`'
``wide``).

A uniform packing gives every sharded document ``cp`` ranks; a document whose ring over ``cp`` ranks loads each
above the mean work per rank leaves those ranks the step's busiest whatever else is packed (Llama-3B github-64k on
128 GPUs, batch 0: 27.5k tokens over 4 ranks, 21.0 ms a layer against a mean of 13.0). A *span* puts it on ``z``
consecutive ranks instead (``z`` a multiple of ``cp``, so the span covers whole CP groups), which then take part in
the packing with that load: FlexSP's per-sequence group sizes, with Zeppelin's packing around them. Offered by
:func:`~.packed_search.best_packed` per CP size from 2 on (the threshold packing's shards, plus spans), judged
after the other candidates against the best of them.

Pure and deterministic.
"""

from __future__ import annotations

from typing import Sequence

from .cost_model import CostModel
from .packed import linear_per_token, sharded_ms, whole_work

__all__ = ["WideBasis", "SPANS_MAX", "wide_basis", "wide_spans"]


WideBasis = tuple[list[int], float, float]
"""What :func:`wide_spans` needs of a batch whatever ``cp``: the sequences longest first (ties: the lower index,
at most :data:`SPANS_MAX`), the linear ms per token and the mean work per rank (:func:`wide_basis`)."""

SPANS_MAX = 16
"""The most sequences :func:`wide_spans` gives spans (only the longest few load a CP group above the mean)."""


def wide_basis(lengths: Sequence[int], cost: CostModel, ranks: int) -> WideBasis:
    """:data:`WideBasis` of ``lengths`` over ``ranks`` ranks (:func:`linear_per_token`, :func:`whole_work`)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))[:SPANS_MAX]
    return order, linear_per_token(lengths, cost, ranks), sum(whole_work(lengths, cost, ranks)) / ranks


def wide_spans(lengths: Sequence[int], cost: CostModel, cp: int, ranks: int, shard_from: int,
               basis: WideBasis | None = None) -> tuple[tuple[int, int], ...]:
    """The wide spans a packing with CP size ``cp`` over ``ranks`` ranks offers (:func:`~.packed.packed_groups`'
    ``wide``): ``(sequence, z)`` for each of the :data:`SPANS_MAX` longest sequences from ``shard_from`` on, longest
    first (ties: the lower index), while one sharded alone over ``cp`` ranks loads each above the mean work per rank
    (``narrow = sharded_ms(s, cp) + lin * s / cp`` against the mean of :func:`~.packed.whole_work`). Its ``z`` is
    the first of ``2 cp, 4 cp, ...`` (at most half the ranks and ``s / 2``) whose load ``sharded_ms(s, z) + lin * s /
    z`` is at most the mean, or the last while wider rings keep lowering it; none where ``2 cp`` ranks load more than
    ``narrow``. The search starts at the first ``z`` where ``narrow * cp / z`` (what ``z`` ranks would carry if
    their ring cost no more in all than ``cp`` ranks': it costs no less) is at most the mean. The spans leave ``cp``
    ranks or more outside them (on 120 plans a packing whose spans covered every rank won once, by 0.2%), so a
    sequence whose ``z`` does not fit gets none. ``basis``: :func:`wide_basis` of the batch, computed when not given
    (a packing search computes it once for every ``cp``).

    Example (Llama-3B on 16 x 8 H100s, batch 0 of docs/BENCHMARKS.md's github-64k, ``cp = 4``): the mean is 13.0 ms
    a layer; 27.5k, 26.0k and 23.7k tokens over 4 ranks load each 21.0, 19.2 and 16.6 ms, over 8 10.6, 9.7 and 8.3;
    the next, 19.9k, 12.6: spans of 8 ranks for the three, where the step's plan had put them on one ring over 16
    ranks (15.9 ms a layer)."""
    order, lin, mean = basis if basis is not None else wide_basis(lengths, cost, ranks)
    out: list[tuple[int, int]] = []
    left = ranks - cp
    for i in order:
        s = lengths[i]
        if s < shard_from or s < 4 * cp or left < 2 * cp:
            break  # shorter ones have no span of 2 cp ranks or more (s >= 2 z)
        narrow = sharded_ms(cost, s, cp) + lin * s / cp
        if narrow <= mean:
            break  # shorter ones load their CP group less
        best, z = None, 2 * cp
        while 2 * z <= ranks // 2 and 4 * z <= s and narrow * cp / z > mean:
            z *= 2  # z ranks share out at most cp / z of the work (their rings cost no less): start where that is
        while z <= ranks // 2 and 2 * z <= s:
            load = sharded_ms(cost, s, z) + lin * s / z
            if load >= (narrow if best is None else best[0]):
                break  # wider rings cost more than they share out from here
            best = (load, z)
            if load <= mean:
                break
            z *= 2
        if best is not None and best[1] <= left:
            out.append((i, best[1]))
            left -= best[1]
    return tuple(out)
