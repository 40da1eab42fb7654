"""Water-filling for a nearly full cluster: the capacity rule with a guarantee (:func:`level_fill`).

Longest sequence first; a sequence of ``s >= 4`` tokens goes on a ring over the ``g = min(P, s // 2)`` GPUs
with the most free tokens, *oriented*: its positions holding the most tokens (:func:`~.zigzag.zigzag_counts`) on
the GPUs with the most room; ``s <= 3`` (too short to split) goes whole on the GPU with the most room.

**Guarantee.** A batch of ``T`` tokens on ``P`` GPUs of ``C`` tokens each, with ``P * C - T >= LEVEL_MARGIN * P``
(on average at least 5 tokens of every GPU left free), is always placed. Why: the free tokens per GPU never spread
by more than 3 (max - min), since every placement takes from the GPUs with the most room:

* a ring over all ``P`` GPUs (``s >= 2P``) takes two adjacent counts (``2b, 2b + 1`` or ``2b + 1, 2b + 2``,
  ``b = s // 2P``), the larger ones from the roomier GPUs: the spread does not grow past 3;
* a ring over ``g = s // 2 < P`` GPUs (``s = 2g`` or ``2g + 1``) takes 2 tokens from each of the ``g`` roomiest
  (3 from the roomiest when ``s`` is odd), a whole sequence of ``s <= 3`` takes ``s`` from the roomiest: a GPU that
  loses tokens was at least as roomy as every GPU that does not, so the spread stays at most 3.

So before each sequence the least free GPU holds at least the mean free minus 3, and the mean, ``(P * C - T)`` plus
the tokens still to place over ``P``, is at least 5: a ring over all GPUs needs ``ceil(s / P) <= s / P + 1`` on
each (the mean counts ``s / P`` of them), a shorter ring 2 (3 on the roomiest), a whole sequence at most 3: all fit.
Example: 128 GPUs of 8192 tokens hold any batch of at most ``128 * 8187`` tokens whose sequences fit a ring.
Plans from it balance tokens, not time (a fallback, :mod:`.capacity_fill`).
"""

from __future__ import annotations

from typing import Sequence

from .partition_context import Assignment, PartitionContext, assignments_of
from .plan_parts import PlanError
from .zigzag import zigzag_counts, zigzag_tokens

__all__ = ["BUDGET_SHARE", "LEVEL_MARGIN", "budget_margin", "level_fill", "oriented", "placeable_budget", "ring_fits",
           "roomiest_ring"]

LEVEL_MARGIN = 5
"""Free tokens per GPU, on average over the cluster, under which :func:`level_fill` may strand a sequence."""


BUDGET_SHARE = 256
"""A step's budget keeps at least ``1 / BUDGET_SHARE`` of every GPU's capacity free (:func:`budget_margin`)."""


def budget_margin(capacity: int) -> int:
    """Tokens per GPU a step's budget keeps free: ``max(LEVEL_MARGIN, capacity // BUDGET_SHARE)`` (256 of 65,536,
    32 of 8,192, 5 of 1,000). ``LEVEL_MARGIN`` guarantees a placement; the share keeps steps off the last tokens,
    where no time-balanced candidate may fit and the guaranteed placement spreads every document over all GPUs
    (Llama-7B, 4 x 8 GPUs of 65,536, arxiv-64k, training's sampler: a micro-step left with 8 tokens per GPU free
    simulated 38.1 s against 7.7-9.3 s for its neighbours; docs/planner.md, "Nearly full clusters")."""
    return max(LEVEL_MARGIN, capacity // BUDGET_SHARE)


def placeable_budget(tokens: int, gpus: int, capacity: int) -> int:
    """The most tokens, up to ``tokens``, that a step on ``gpus`` GPUs of ``capacity`` tokens should hold: always
    placed (the guarantee above) and off the last tokens (:func:`budget_margin`):
    ``min(tokens, gpus * (capacity - budget_margin(capacity)))``, or ``tokens`` on one GPU (it holds whole sequences
    only, each of at most ``capacity``). Training's micro-step budget and ``zeppelin simulate``'s steps are cut with
    it. Example: 32 GPUs of 65,536 and ``32 * 65,536`` tokens -> ``32 * 65,280 = 2,088,960``."""
    return tokens if gpus < 2 else min(tokens, gpus * (capacity - budget_margin(capacity)))


def ring_fits(s: int, ring: Sequence[int], free: Sequence[int], spare: int = 0) -> bool:
    """Whether every position of a ring of ``s`` over ``ring`` (position ``p`` on ``ring[p]``) fits, keeping ``spare``
    free on each GPU."""
    return all(c <= free[r] - spare for c, r in zip(zigzag_counts(s, len(ring)), ring))


def oriented(s: int, gpus: Sequence[int], free: Sequence[int], spare: int = 0, *,
             level: bool = False) -> tuple[int, ...] | None:
    """A ring of sequence ``s`` over ``gpus`` whose every position fits (keeping ``spare`` free on each GPU), or
    ``None``. In rank order where that fits (as every other placement orders a ring), unless ``level``; else the
    positions holding the most tokens on the GPUs with the most room (ties: lower position, lower rank). A ring runs
    in any order of its ranks (its positions follow ``ranks``), and this matching fits whenever some order does
    (sorted needs against sorted rooms). Example: ``s = 7`` on 2 GPUs: positions hold 3 and 4 tokens; free
    ``[4, 3]``: rank order ``(0, 1)`` puts 4 on GPU 1, which has 3; oriented ``(1, 0)`` puts 3 there and 4 on GPU 0.
    """
    ring = tuple(sorted(gpus))
    if not level and ring_fits(s, ring, free, spare):
        return ring
    counts = zigzag_counts(s, len(ring))
    out = [0] * len(ring)
    for p, r in zip(sorted(range(len(ring)), key=lambda p: (-counts[p], p)), sorted(ring, key=lambda r: (-free[r], r))):
        out[p] = r
    return tuple(out) if ring_fits(s, out, free, spare) else None


def roomiest_ring(s: int, free: Sequence[int], ranks: Sequence[int], spare: int = 0) -> tuple[int, ...] | None:
    """The smallest ring (``g >= 2``) of sequence ``s`` over the roomiest of ``ranks`` (ties: lower rank) whose every
    position fits keeping ``spare`` free on each GPU (:func:`oriented`), or ``None``. Example: ``s = 60``, free
    ``[40, 40, 5, 5]``, ranks 0-3: ``(0, 1)`` (30 + 30 tokens)."""
    order = sorted(ranks, key=lambda r: (-free[r], r))
    for g in range(2, min(len(order), s // 2) + 1):
        ring = oriented(s, order[:g], free, spare)
        if ring is not None:
            return ring
    return None


def level_fill(ctx: PartitionContext) -> list[Assignment]:
    """Every sequence's assignment by water-filling (module docstring); raises :class:`PlanError` naming the sequence
    that finds no room (possible only with fewer than ``LEVEL_MARGIN`` free tokens per GPU on average). A sort of the
    GPUs per sequence: about 2 s for 100,000 sequences on 128 GPUs (it runs only after the other rules fail)."""
    lengths, cap, world = ctx.lengths, ctx.cap, ctx.cluster.world_size
    free = [cap] * world
    groups: list[tuple[int, ...]] = [()] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        s = lengths[i]
        g = min(world, s // 2)
        roomy = sorted(range(world), key=free.__getitem__, reverse=True)[:max(1, g)]  # ties: lower rank (stable)
        ring: tuple[int, ...] | None
        if g < 2:
            ring = (roomy[0],) if free[roomy[0]] >= s else None
        else:
            ring = oriented(s, roomy, free, level=True)
        if ring is None:
            raise PlanError(
                f"sequence {i} of length {s} does not fit: the free tokens per GPU are {free} (tokens_per_gpu = "
                f"{cap}) after placing the longer sequences level (a batch of {sum(lengths)} tokens leaves "
                f"{world * cap - sum(lengths)} free, fewer than {LEVEL_MARGIN} per GPU); raise tokens_per_gpu or add "
                "GPUs"
            )
        for p, r in enumerate(ring):
            free[r] -= s if len(ring) == 1 else zigzag_tokens(s, len(ring), p)
        groups[i] = ring
    return assignments_of(groups, ctx.cluster)
