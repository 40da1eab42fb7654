"""How many of the longest documents lead a packed candidate, and on how many ranks: :func:`lead_splits` (led
packings) and :func:`fill_splits` (filled-lead packings), with :func:`lead_floor`, the bound the best-first search
(:func:`~.packed_search.best_packed`, module docstring of :mod:`.packed_search`) queues their families at.

Pure and deterministic.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Sequence

from .cost_model import CostModel
from .grouped import ring_floor
from .options import PlannerOptions
from .packed import CHARGES, whole_work
from .zigzag import zigzag_counts

__all__ = ["LEAD_MAX", "lead_splits", "fill_splits", "lead_floor"]


LEAD_MAX = 8
"""The most documents a leading group holds (:func:`lead_splits`): more are short against the batch, which the
uniform packings place well (on github-64k batches at 128 GPUs leads of up to 800 documents were offered, whose
floors and packings cost planning time and never won)."""


def lead_splits(lengths: Sequence[int], cost: CostModel) -> list[tuple[int, list[int]]]:
    """``(k, top)`` per leading group size ``k`` (:mod:`.packed_search`'s module docstring): ``k`` a multiple of the
    GPUs per node up to half the world; ``top`` the indices of the ``n`` longest sequences (ties: the lower index)
    whose share of the work is closest to ``k / P`` (ties: the smaller ``n``), each at least ``2 k`` tokens (fewer
    when the ``n``-th is shorter) and their zigzag chunks within every rank's capacity; offered only with ``2 <= n
    <=`` :data:`LEAD_MAX`. Example: 64 GPUs (8 per node), shares of the longest 0.351, 0.412, 0.458, 0.495, 0.527:
    ``k = 32`` takes 4 (0.495 is closest to 0.5), ``k = 24`` 1 (0.351 is closest to 0.375), as do ``k = 16`` and
    ``8`` (not offered)."""
    cl = cost.cluster
    world, gpn, cap = cl.world_size, cl.gpus_per_node, cl.tokens_per_gpu
    order, cum = _by_work(lengths, cost)
    share = [c / cum[-1] for c in cum]
    out = []
    for k in range(gpn, world // 2 + 1, gpn):
        target = k / world
        n = min(range(1, len(order)), key=lambda m: (abs(share[m - 1] - target), m), default=0)
        while n and lengths[order[n - 1]] < 2 * k:
            n -= 1
        top = order[:n]
        if 2 <= n <= LEAD_MAX and _peak([lengths[i] for i in top], k) <= cap:
            out.append((k, top))
    return out


def _by_work(lengths: Sequence[int], cost: CostModel) -> tuple[list[int], list[float]]:
    """The sequences longest first (ties: the lower index) and their cumulative work, each weighed as the packing
    weighs a whole one (``local_ms(s) + lin * s``, ``lin`` the linear ms per token at the batch's per-rank
    share): what :func:`lead_splits` and :func:`fill_splits` size their leads by."""
    work = whole_work(lengths, cost, cost.cluster.world_size)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return order, list(accumulate(work[i] for i in order))


def _peak(top: Sequence[int], k: int) -> int:
    """The tokens of the busiest rank of a ring over ``k`` ranks holding sequences of lengths ``top`` (zigzag)."""
    return max(map(sum, zip(*(zigzag_counts(s, k) for s in top))))


def lead_floor(top: Sequence[int], k: int, cost: CostModel, options: PlannerOptions) -> float:
    """A lower bound on :func:`~.packed.packed_floor` of any led packing whose leading ring over ranks
    ``0 .. k-1`` holds the sequences ``top``: the ring's :func:`~.grouped.ring_floor` total under :data:`CHARGES`
    plus the least linear ms per token times the tokens its busiest rank holds, for every layer (the leading
    ranks hold nothing else)."""
    per_token = cost.least_linear_ms_per_token()
    total = ring_floor(cost, tuple(range(k)), list(top), options.head_parallel, CHARGES)[0]
    return cost.model.layers * (total + per_token * _peak(top, k))


def fill_splits(lengths: Sequence[int], cost: CostModel) -> list[tuple[int, list[int]]]:
    """``(k, top)`` per filled leading group size ``k`` (:mod:`.packed_search`'s module docstring): ``k = 2, 4, ...``
    below the GPUs per node, then whole nodes, ``gpn, 2 gpn, 4 gpn, ...`` up to half the world; ``top`` the indices
    of the ``n`` longest sequences (ties: the lower index), ``n`` the most whose share of the batch's work
    (``local_ms(s) + lin * s`` each, as :func:`lead_splits` weighs them) is at most ``k / P`` (at least 1, at most
    :data:`LEAD_MAX`: the group's whole documents fill the rest of its share), fewer while the ``n``-th is under ``2
    k`` tokens, none when their zigzag chunks overflow a rank. Example: 16 GPUs (8 per node), shares of the longest
    0.070, 0.131, 0.188, 0.240, 0.290, ...: ``k = 2`` (0.125) takes 1, ``k = 4`` (0.25) 4, ``k = 8`` (0.5) those five
    and the next ones while their share stays at most 0.5 (eight at most)."""
    cl = cost.cluster
    world, gpn, cap = cl.world_size, cl.gpus_per_node, cl.tokens_per_gpu
    order, cum = _by_work(lengths, cost)
    sizes = [k for k in (2 ** j for j in range(1, 8)) if k < min(gpn, world)]
    sizes += [k for k in (gpn * 2 ** j for j in range(8)) if k <= world // 2]
    out: list[tuple[int, list[int]]] = []
    for k in sizes:
        n = min(LEAD_MAX, max([m for m in range(1, len(order)) if cum[m - 1] <= k / world * cum[-1]] or [1]))
        while n and lengths[order[n - 1]] < 2 * k:
            n -= 1
        top = order[:n]
        if top and _peak([lengths[i] for i in top], k) <= cap:
            out.append((k, top))
    return out
