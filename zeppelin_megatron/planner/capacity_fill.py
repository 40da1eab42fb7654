"""The partitioner's last resort: place every sequence where its tokens fit, time be damned.

:func:`~.partition.partition` prefers balanced placements; near full capacity
every one of them can strand a sequence, even after spilling it across nodes
(:func:`~.place_gpus.place_spilled`): ``[502, 354, 82, 7, 23, 56]`` on 1 x 2 GPUs of
512 tokens (full) fits only with every sequence on the 2-GPU ring, 7 and 23 oriented
against each other. Then this module packs the batch by tokens alone, checking every GPU's exact tokens
(:func:`~.zigzag.zigzag_tokens`) before it places anything, so whatever it
returns fits ``tokens_per_gpu`` by construction:

* sequences longest first (ties: lower index);
* whole (``local``) on a GPU with room: the fullest that still fits
  (best fit) or the emptiest (worst fit);
* otherwise a ring over the ``g`` GPUs with the most free tokens, for the
  smallest ``g >= 2`` whose every position fits (``intra_node`` when they share
  a node, else ``inter_node``; ring in rank order, or oriented where that strands
  a token: :func:`~.capacity_level.oriented`).

Four rules are tried in turn (:data:`RULES`, :func:`_fill`), then water-filling
(:func:`~.capacity_level.level_fill`, which places every batch that leaves at least
:data:`~.capacity_level.LEVEL_MARGIN` tokens per GPU free on average), then closing GPUs
in rank order (:func:`~.capacity_stream.stream_fill`, for batches that fill the cluster to
within a few tokens; again with the shortest sequences held back to the end), then, for
batches of up to :data:`SEARCH_MAX_SEQUENCES` sequences, a bounded
backtracking search (:func:`_search`); if all of them strand a sequence, the
refusal names it, its length and the free tokens left. Example: ``[64, 64,
64]`` on 2x3 GPUs of 48: the first 64 does not fit one GPU, so a ring over
ranks 0 and 1 (32 + 32); the second over ranks 2 and 3, the third over 4 and
5: every GPU holds 32 tokens.
"""

from __future__ import annotations

from .capacity_level import LEVEL_MARGIN, level_fill, oriented, roomiest_ring
from .capacity_stream import stream_fill
from .partition_context import Assignment, PartitionContext, assignments_of
from .plan_parts import PlanError
from .zigzag import ring_max_tokens, zigzag_tokens

__all__ = ["capacity_fill"]

RULES: tuple[str, ...] = ("best_fit", "worst_fit", "balanced", "whole_ring")
"""Rules tried in order (see :func:`_fill`)."""

FULL_RULES: tuple[str, ...] = ("level", "stream", "stream_reserve")
"""Tried after :data:`RULES`: :func:`~.capacity_level.level_fill`, then :func:`~.capacity_stream.stream_fill` without
a reserve and with one GPU's tokens of the shortest sequences held back."""


def capacity_fill(ctx: PartitionContext) -> list[Assignment]:
    """Every sequence's assignment, each GPU within ``tokens_per_gpu``; see the module docstring.

    Raises:
        PlanError: no rule places every sequence (names the first rule's stranded sequence,
            its length and the GPUs' free tokens at that point, then the batch's free tokens per GPU
            against the margin that guarantees a placement).
    """
    error: PlanError | None = None
    for rule in RULES + FULL_RULES:
        try:
            if rule == "level":
                return level_fill(ctx)
            if rule.startswith("stream"):
                return stream_fill(ctx, ctx.cap if rule == "stream_reserve" else 0)
            return _fill(ctx, rule)
        except PlanError as exc:
            error = error or exc
    assert error is not None
    found = _search(ctx) if len(ctx.lengths) <= SEARCH_MAX_SEQUENCES else None
    if found is None:
        world = ctx.cluster.world_size
        spare = world * ctx.cap - sum(ctx.lengths)
        raise PlanError(f"{error} (every fill rule tried: the batch leaves {spare} tokens free, {spare / world:.1f} "
                        f"per GPU; every batch leaving {LEVEL_MARGIN} per GPU fits)") from None
    return found


SEARCH_MAX_SEQUENCES = 400
"""Batches up to this many sequences get the backtracking search when every rule strands one."""

SEARCH_BUDGET = 20_000
"""Placements the search tries before it gives up."""

SEARCH_WORK = 3_000_000
"""GPUs the search visits (each ring it tries visits every GPU) before it gives up: at most about a second on
any cluster (a 128-GPU cluster's candidate rings cost 16x an 8-GPU one's, so placements alone do not bound it)."""


def _search(ctx: PartitionContext) -> list[Assignment] | None:
    """Depth-first search over placements, longest sequence first, or ``None`` past :data:`SEARCH_BUDGET` or
    :data:`SEARCH_WORK`.

    At each sequence it tries, in order: whole on a GPU (one per distinct free-token count,
    fullest first: GPUs with equal room are interchangeable for fit), then rings of
    ``g = 2, 3, ...`` over the fullest GPUs that hold ``ceil(s / g)`` and over the emptiest.
    Tiny capacities need it: ``[11, 7, 3, 3, 2, 1]`` on 6 GPUs of 5 tokens (90% full) fits only
    with 11 on a ring of 5 (3, 2, 2, 2, 2 tokens) and 7 on a ring of 3 including the sixth GPU.
    """
    lengths, cap, cl = ctx.lengths, ctx.cap, ctx.cluster
    world = cl.world_size
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    free = [cap] * world
    chosen: list[tuple[int, ...]] = []
    tries = work = 0

    def options(s: int) -> list[tuple[int, ...]]:
        nonlocal work
        work += world * (2 * min(world, s // 2) + 1)  # the sorts below, then two rings per size
        out: list[tuple[int, ...]] = []
        seen: set[int] = set()
        orders = {fullest: _by_room(free, fullest) for fullest in (True, False)}
        for r in orders[True]:
            if free[r] >= s and free[r] not in seen:
                seen.add(free[r])
                out.append((r,))
        for g in range(2, min(world, s // 2) + 1):
            for fullest in (True, False):
                ring = _ring_of(s, g, free, orders[fullest], fullest)
                if ring is not None and ring not in out:
                    out.append(ring)
        return out

    def place(k: int) -> bool:
        nonlocal tries
        if k == len(order):
            return True
        s = lengths[order[k]]
        for ring in options(s):
            tries += 1
            if tries > SEARCH_BUDGET or work > SEARCH_WORK:
                return False
            taken = [s] if len(ring) == 1 else [zigzag_tokens(s, len(ring), p) for p in range(len(ring))]
            for r, n in zip(ring, taken):
                free[r] -= n
            chosen.append(ring)
            if place(k + 1):
                return True
            chosen.pop()
            for r, n in zip(ring, taken):
                free[r] += n
        return False

    if not place(0):
        return None
    groups: list[tuple[int, ...]] = [()] * len(lengths)
    for i, ring in zip(order, chosen):
        groups[i] = ring
    return assignments_of(groups, cl)


def _by_room(free: list[int], fullest: bool) -> list[int]:
    """The GPUs fullest first (``fullest``) or emptiest first; ties: lower rank."""
    return sorted(range(len(free)), key=lambda r: (free[r], r) if fullest else (-free[r], r))


def _ring_of(s: int, g: int, free: list[int], order: list[int], fullest: bool, spare: int = 0
             ) -> tuple[int, ...] | None:
    """A ring of exactly ``g`` GPUs (ascending, else oriented) whose positions fit, keeping ``spare`` free on each:
    the first ``g`` of ``order`` (:func:`_by_room`) that hold ``ceil(s / g) + spare`` (``fullest``), or its first
    ``g``; ``None`` if that choice does not fit."""
    need = ring_max_tokens(s, g) + spare
    ring = [r for r in order if free[r] >= need][:g] if fullest else order[:g]
    return oriented(s, ring, free, spare) if len(ring) == g else None


def _fill(ctx: PartitionContext, rule: str) -> list[Assignment]:
    """One packing, longest sequence first. ``rule``:

    * ``best_fit``: whole on the fullest GPU with room, else the smallest ring over the emptiest GPUs;
    * ``worst_fit``: whole on the emptiest GPU with room, else the same ring;
    * ``balanced``: as ``worst_fit`` but first within ``ceil(T / P)`` tokens per GPU (the linear
      layout's quota), so rings take the long sequences and free tokens stay even; only a sequence
      that fits nowhere so is placed against ``tokens_per_gpu``;
    * ``whole_ring``: every sequence of at least ``2P`` tokens on one ring over all ``P`` GPUs
      (each GPU takes at most ``ceil(s / P)``; its positions holding the most tokens on the GPUs with the most room,
      :func:`~.capacity_level.oriented`), the shorter ones whole on the emptiest GPU.
    """
    lengths, cap, cl = ctx.lengths, ctx.cap, ctx.cluster
    world = cl.world_size
    limits = [-(-sum(lengths) // world), cap] if rule == "balanced" else [cap]
    free = [cap] * world
    groups: list[tuple[int, ...]] = [()] * len(lengths)  # each sequence's GPU, or its ring (two or more)
    everyone = tuple(range(world))
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        s = lengths[i]
        ring: tuple[int, ...] | None = None
        if rule == "whole_ring" and world > 1 and s >= 2 * world:
            ring = oriented(s, everyone, free, level=True)
        for lim in limits:
            if ring is not None:
                break
            spare = cap - lim  # tokens each GPU keeps free under this limit
            fit = [r for r in range(world) if free[r] - spare >= s]
            if fit:
                r = min(fit, key=lambda r: (free[r], r) if rule == "best_fit" else (-free[r], r))
                free[r] -= s
                groups[i] = (r,)
                break
            ring = _ring(s, free, spare, fullest=rule == "best_fit")
        if groups[i]:
            continue
        if ring is None:
            raise PlanError(
                f"sequence {i} of length {s} does not fit: the free tokens per GPU are {free} "
                f"(tokens_per_gpu = {cap}) after placing the longer sequences, and no ring over GPUs "
                "with room holds it; raise tokens_per_gpu or add GPUs"
            )
        for p, r in enumerate(ring):
            free[r] -= zigzag_tokens(s, len(ring), p)
        groups[i] = ring
    return assignments_of(groups, cl)


def _ring(s: int, free: list[int], spare: int = 0, *, fullest: bool = False) -> tuple[int, ...] | None:
    """Ranks (ascending, else oriented) of the smallest ring whose every position fits (keeping ``spare`` free on
    each GPU), or ``None``: over the GPUs with the most free tokens, or (``fullest``) over the
    fullest GPUs that still hold ``ceil(s / g)`` (best fit: the emptier GPUs stay free).
    Example: ``s = 41``, free ``[21, 21]``: ``(0, 1)`` (21 + 20 tokens); ``s = 4``, free
    ``[2, 2, 3, 3]``, ``fullest``: ``(0, 1)``, leaving 3 tokens free on GPUs 2 and 3."""
    if not fullest:
        return roomiest_ring(s, free, range(len(free)), spare)
    order = _by_room(free, fullest)
    for g in range(2, min(len(free), s // 2) + 1):
        found = _ring_of(s, g, free, order, fullest, spare)
        if found is not None:
            return found
    return None
