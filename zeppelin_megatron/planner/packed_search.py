"""Which packed candidate a step gets: :func:`best_packed` (the packings themselves: :mod:`.packed`).

Three families of candidates, each a placement without a remap (the linear layout is the attention layout):

* *Uniform* packings (:func:`~.packed.packed_groups` over every rank): per CP size ``cp`` of
  :func:`~.grouped.pack_sizes`, WLB-LLM's packing (plain rings' work), the same shards weighed by Zeppelin's
  rings (where any document is sharded), the threshold packing (every document from
  :func:`~.packed.head_parallel_threshold` on sharded) and, where the threshold packing is tried, the share
  packing (only the documents from :func:`~.packed.share_threshold` on sharded: those that kept whole would
  load a GPU above the mean work per rank).
* *Led* packings (:func:`lead_splits`): the ``n`` longest documents share one ring over a leading group of
  ``k`` ranks (whole nodes, any multiple of the node size up to ``P / 2``; powers of two only until
  2026-11-27), every other document is packed
  over the ranks after it (``packed_groups(..., first=k)``: per CP size the threshold packing, and at ``cp = 1``
  every other document whole).
  ``n`` makes the leading group's share of the batch's work (``local_ms(s) + lin * s`` per document, as the
  packing weighs a whole one) closest to its share of the ranks, ``k / P``: one ``n`` per ``k``. That is the
  shape of FlexSP's plans (a few wide groups for the long documents, narrow ones for the rest) with
  Zeppelin's rings in each group, where a uniform ``cp`` either leaves the long documents on too few ranks
  or spreads the short ones over rings that do not pay. Example: Llama-3B arxiv-128k on 64 GPUs, batch 0
  (124.7k, 47.9k, 40.7k, 36.1k, ... tokens): the four longest hold 49.5% of the work, so ``k = 32`` leads
  with them (a ring over 4 nodes, width 8) and the other 81 documents are packed over ranks 32-63 at
  ``cp = 2``: charged prediction 1583 ms against 1902 for the partitioner's plan and 2031 for the best uniform
  packing; simulated 1565 ms against 1886 before and FlexSP's 1606 (docs/planner.md).
* *Filled-lead* packings (:func:`fill_splits`, 2026-11-27): the ``n`` longest documents share one ring over
  ranks ``0 .. k-1``, ``k = 2, 4, ...`` below the node size (where FlexSP's small Ulysses groups win at 16-32
  GPUs) and ``gpn, 2 gpn, 4 gpn, ...`` up to ``P / 2``, ``n`` the most whose share of the work is at most
  ``k / P`` (at most :data:`LEAD_MAX`); the leading
  group then takes part in packing the rest as one more group (``packed_groups(..., first=k, lead=top)``,
  weighed per rank) that takes whole documents only, so its ranks are *filled* up to the others' load instead
  of idling beside a ring too small for a node. Example: Llama-7B prolong-64k on 1 x 8 GPUs, 256k tokens, batch
  1 of 4: the longest document (40.0k) leads on ranks 0-1; the search from that lead ends with it on a
  head-parallel ring over ranks 0-3 with two more documents, ranks 0 and 1 also holding whole ones: charged
  prediction 3662 ms against 3744 without filled leads. FlexSP's plan for
  Llama-13B TP 2 arxiv-64k on 16 GPUs (8 ranks) has that shape too: one Ulysses pair and six single GPUs
  (simulated 7009 ms; Zeppelin 7125 -> 7031 with filled leads).
* *Wide* packings (:mod:`.packed_wide`, 2026-11-27): per CP size from 2 on, the threshold packing with spans for
  the longest documents a CP group alone would load above the mean (:func:`~.packed_wide.wide_spans`: rings over
  ``2 cp, 4 cp, ...`` ranks that the packing fills around). They are bounded before the threshold is searched
  (a CP size whose longest document alone loses is then still tried with spans), and *deferred*: made only when
  their bound (:func:`_span_floor`) is the lowest left (below).

Every candidate is bounded from below before it is finished (:func:`~.packed.quick_floor` before packing,
the leading ring's :func:`~.grouped.ring_floor` before packing the rest, :func:`~.packed.packed_floor` after);
one is kept only where its predicted step under :data:`~.packed.CHARGES` is lower than the best so far (module
docstring of :mod:`.packed`: why charged). The search is *best first* (2026-11-28): after the uniform packings, the
candidates made (each at its floor) and the led, filled-lead and wide packings still to make (each at a bound on
the floors of what it can make: :func:`lead_floor`, :func:`_span_floor`) wait in one queue; the lowest is finished,
or made, until the lowest is at or above the best step so far. A candidate finished early can so rule out a
family before its sweep runs (the families were made before any candidate was finished until then), and what is
finished is what finishing every candidate made would keep, since no floor exceeds its prediction. On the 125
plans of docs/BENCHMARKS.md's 120 steps and ``benchmarks/plan_speed.py``'s five batches, the same plans;
``plan_speed.py``'s batches make 54 packings instead of 61 and finish 13 candidates instead of 14. The kept
candidate's whole documents are then traded off its busiest ranks by the finished plan's own times
(:mod:`.whole_moves`, ``options.packed_moves``), finished with its widths and kept where the step falls. With
``options.packed_rerank`` (opt-in) the search then goes on past the kept candidate, ranking candidates by their
steps after trades (:mod:`.packed_trades`, :data:`REACH`). Pure and deterministic.
"""

from __future__ import annotations

import heapq
import math
from itertools import count
from typing import Callable, Literal, Protocol, Sequence, cast

from .cost_model import CostModel
from .options import PlannerOptions
from .packed import (
    CHARGES, QUICK, head_parallel_threshold, packed_assignments, packed_floor, quick_floor, share_threshold,
    split_pays,
)
from .packed_wide import WideBasis, wide_basis, wide_spans
from .partition_context import Assignment
from .plan import StepPlan
from .predict import predict
from .packed_leads import LEAD_MAX, fill_splits, lead_floor, lead_splits
from .packed_trades import trade_floor, traded, trades
from .whole_moves import Moved

__all__ = ["best_packed", "lead_splits", "fill_splits", "lead_floor", "LEAD_MAX"]

Emit = Callable[[list[Assignment], int], "float | None"]

Deferred = tuple[float, int, int, tuple[tuple[int, int], ...]]
"""A wide packing not yet made: its bound (:func:`_span_floor`), ``cp``, ``shard_from`` and spans."""


class Finish(Protocol):
    """Turns a placement into a finished plan whose linear layout is its attention layout; ``widths``: every
    sequence's block width as given (default: chosen, :func:`~.choose_heads.choose_widths`)."""

    def __call__(self, assignments: Sequence[Assignment], *, widths: Sequence[int] | None = None) -> StepPlan: ...


def best_packed(lengths: Sequence[int], cost: CostModel, options: PlannerOptions, plan: StepPlan,
                finish: Finish) -> StepPlan:
    """``plan`` or the packed candidate (module docstring) with the lowest predicted step under :data:`CHARGES`,
    where that is below ``plan``'s by more than rounding (ties keep the earlier: ``plan``, then the lower floor,
    the smaller ``cp``). ``finish`` turns assignments into a finished plan whose linear layout is its attention
    layout. ``plan`` unchanged when ``options.remap`` is ``True`` (token-balanced layout forced) or ``plan`` has
    no prediction. Led, filled-lead and wide packings only with head-parallel rings on (their wider rings run
    head-parallel). The uniform packings are made first, against ``plan``'s step; then best first (module
    docstring): the candidates and the led, filled-lead and wide families in one queue by floor or bound (at equal
    values a family before a candidate, candidates by ``cp`` then the order made, families leads, filled leads,
    wide), each family made against the best step when it comes up. Then the kept candidate's trades
    (``options.packed_moves``), and with ``options.packed_rerank`` the post-trade ranking (:mod:`.packed_trades`):
    the finished candidates, and the queue's up to :data:`REACH` above the lowest step after trades (with the led
    packings' wide-span rests, made during the search), each whose :func:`~.packed_trades.trade_floor` is below that
    step finished and traded; the lowest step after trades wins (ties: the kept candidate, then the order finished).

    Per CP size, smallest first: a ``cp`` whose longest document is sharded in every packing and alone puts
    the floor at the step to beat is skipped whole (no threshold searched) unless its wide spans' bound is
    below that step (then only its wide packing is offered); the threshold packing
    (``shard_from``) is tried until its :func:`packed_floor` rises from one ``cp`` to the next (its rings'
    costs then grow faster than the balance gains; on 120 plans, Llama-3B / 7B / 13B shapes at 16-128 GPUs,
    five length distributions, two batches each, stopping there changed none)."""
    if options.remap is True or plan.predicted is None:
        return plan
    best, best_ms = plan, predict(plan, cost, charges=CHARGES).step_ms
    seen: set[tuple[Assignment, ...]] = set()
    floors: list[tuple[float, int, list[Assignment]]] = []

    def keep(assignments: list[Assignment], cp: int, floor: float | None = None) -> float | None:
        """Record a candidate with its floor (computed unless given), or ``None`` for a placement already
        recorded."""
        key = tuple(assignments)
        if key in seen:
            return None
        seen.add(key)
        if floor is None:
            floor = packed_floor(lengths, assignments, cost, options)
        floors.append((floor, cp, assignments))
        return floor

    deferred: list[Deferred] = []
    _sweep(lengths, cost, options, best_ms, 0, keep, threshold="with" if options.packed_threshold else "without",
           defer=deferred if options.head_parallel and options.packed_wide else None)
    # best first: the kept candidates (each at its floor) and the families still to make (leads, filled leads, wide
    # packings: each at a bound on the floors of what it makes) in one queue, lowest first, so that a candidate
    # judged first can rule a family out before it is made. Keys: (bound, 0 for a family / 1 for a candidate, ...):
    # at equal bounds a family first (it may make a candidate that sorts before), candidates by (floor, cp, order
    # recorded), families by kind (leads, filled leads, wide) and order
    queue: list[tuple[float, int, int, object, object]] = []
    order = count()

    def push_floors() -> None:
        for floor, cp, assignments in floors:
            heapq.heappush(queue, (floor, 1, cp, next(order), assignments))
        floors.clear()

    push_floors()
    if options.head_parallel and options.packed_leads:
        for j, (k, top) in enumerate(lead_splits(lengths, cost)):
            lead = Assignment("intra_node" if k <= cost.cluster.gpus_per_node else "inter_node", tuple(range(k)))
            if lead.placement in options.placements:
                bound = lead_floor([lengths[i] for i in top], k, cost, options)
                heapq.heappush(queue, (bound, 0, 0, j, (top, lead)))
    if options.head_parallel and options.packed_fill:
        for j, (k, top) in enumerate(fill_splits(lengths, cost)):
            if ("intra_node" if k <= cost.cluster.gpus_per_node else "inter_node") in options.placements:
                bound = lead_floor([lengths[i] for i in top], k, cost, options)
                heapq.heappush(queue, (bound, 0, 1, j, (top, k)))
    for bound, cp, shard_from, spans in deferred:
        heapq.heappush(queue, (bound, 0, 2, (cp, shard_from, spans), (cp, shard_from, spans)))
    placed: Sequence[Assignment] = ()  # the kept candidate's placement
    judged: list[tuple[float, StepPlan, Sequence[Assignment]]] = []  # every finished candidate, its step
    later: list[tuple[float, int, list[Assignment]]] = []  # led packings with wide spans: post-trade ranking only

    def judge(assignments: Sequence[Assignment]) -> None:
        """Finish a candidate and keep it where its predicted step is below the best so far."""
        nonlocal best, best_ms, placed
        cand = finish(assignments)
        ms = predict(cand, cost, charges=CHARGES).step_ms
        judged.append((ms, cand, assignments))
        if ms < best_ms - 1e-6:
            best, best_ms, placed = cand, ms, assignments

    def make(kind: int, item: object, bound: float, against: float) -> None:
        """Make a family's candidate (``kind``: 0 led, 1 filled lead, 2 wide) where its floor is below ``against``,
        and queue it."""
        chosen: list[tuple[float, int, list[Assignment]]] = []
        if kind == 0:
            led_top, lead = cast("tuple[list[int], Assignment]", item)
            chosen, wide_led = _led(lengths, led_top, lead, cost, options, against, bound)
            later.extend(wide_led)
        elif kind == 1:
            fill_top, k = cast("tuple[list[int], int]", item)
            filled = _filled(lengths, fill_top, k, cost, options, against)
            chosen = [filled] if filled is not None else []
        else:
            size, shard_from, spans = cast("tuple[int, int, tuple[tuple[int, int], ...]]", item)
            wide = packed_assignments(lengths, cost, size, head_parallel=True, shard_from=shard_from,
                                      absorb=options.packed_absorb, wide=spans)
            if wide is not None and all(a.placement in options.placements for a in wide):
                keep(wide, size)
        for floor, size, made in chosen:
            keep(made, size, floor)
        push_floors()

    # a candidate whose floor is at least best_ms predicts (rounded to 1e-6 ms) above best_ms - 1e-6: no win; nor
    # anything a family at or above it makes
    while queue and queue[0][0] < best_ms:
        bound, candidate, kind, _, item = heapq.heappop(queue)
        if candidate:
            judge(item)  # type: ignore[arg-type]
        else:
            make(kind, item, bound, best_ms)
    if not (placed and options.packed_moves):
        return best
    if not options.packed_rerank:
        return _finished(best, trades(lengths, placed, best, cost, options, CHARGES)[1], finish)
    # post-trade ranking (packed_trades.py): the kept candidate after its trades, then every candidate whose trade
    # floor is below the lowest step after trades so far, finished (where not yet) and traded, the queue's up to
    # REACH above that step
    top_ms, first_trades = traded(lengths, placed, best, best_ms, cost, options, CHARGES)
    kept: tuple[StepPlan, Moved | None] = (best, first_trades)
    for floor, size, made in later:
        keep(made, size, floor)
    push_floors()

    def promising(placement: Sequence[Assignment]) -> bool:
        return trade_floor(lengths, placement, cost, options, CHARGES) < top_ms - 1e-6

    def retrade(cand: StepPlan, ms: float, placement: Sequence[Assignment]) -> None:
        """Trade a finished candidate (``ms`` its step) and keep it where its step after trades is the lowest."""
        nonlocal top_ms, kept
        after, moved = traded(lengths, placement, cand, ms, cost, options, CHARGES)
        if after < top_ms - 1e-6:
            top_ms, kept = after, (cand, moved)

    for ms, cand, placement in judged:
        if cand is not best and promising(placement):
            retrade(cand, ms, placement)
    while queue and queue[0][0] < top_ms * (1 + REACH):
        bound, candidate, kind, _, item = heapq.heappop(queue)
        if not candidate:
            make(kind, item, bound, top_ms * (1 + REACH))
            continue
        placement = cast("list[Assignment]", item)
        if promising(placement):
            cand = finish(placement)
            retrade(cand, predict(cand, cost, charges=CHARGES).step_ms, placement)
    return _finished(*kept, finish)


def _finished(plan: StepPlan, moved: Moved | None, finish: Finish) -> StepPlan:
    """``plan``, or where ``moved`` its traded placement finished with ``plan``'s widths (a whole document that
    joined a head-parallel ring with its ring's: :attr:`~.whole_moves.Moved.widths`)."""
    if moved is None:
        return plan
    return finish(moved.assignments, widths=[moved.widths.get(i, x.a2a) for i, x in enumerate(plan.sequences)])


REACH = 0.05
"""How far above the lowest step after trades so far the post-trade ranking (:mod:`.packed_trades`) still makes
families and finishes candidates, by their floors (a packed candidate's floor is its step before trades; trades
lowered the finished candidates' steps by up to 8% on docs/BENCHMARKS.md's 120 steps). 2%, 3%, 5% and 10% gave the
60 configurations' mean step 0.23%, 0.29%, 0.31% and 0.34% faster in an experiment finishing every candidate in
reach (the planning time growing with it)."""


def _led(lengths: Sequence[int], top: list[int], lead: Assignment, cost: CostModel, options: PlannerOptions,
         best_ms: float, bound: float) -> tuple[list[tuple[float, int, list[Assignment]]],
                                                list[tuple[float, int, list[Assignment]]]]:
    """The led packing with the lowest :func:`~.packed.packed_floor` (ties: the smaller ``cp``) whose leading
    ring over ``lead.ranks`` holds the sequences ``top``, the rest packed after it by threshold packings
    (:func:`_sweep`, ``threshold="only"``), and (with ``options.packed_rerank`` and ``packed_wide``) the lowest of
    those with wide spans in the rest (:func:`~.packed_wide.wide_spans`), each where its floor is below ``best_ms``:
    ``(floor, cp, assignments)`` lists of at most one each. The sweep stops at a floor equal to ``bound``
    (:func:`lead_floor`: the leading ring then sets it, no packing of the rest can lower it)."""
    chosen = set(top)
    rest = [i for i in range(len(lengths)) if i not in chosen]
    sub = [lengths[i] for i in rest]
    first = lead.ranks[-1] + 1
    found: list[tuple[float, int, list[Assignment]]] = []
    lowest = _lowest(lengths, cost, options, best_ms, found)

    def merged(part: list[Assignment], cp: int) -> float | None:
        full = [lead] * len(lengths)
        for i, a in zip(rest, part):
            full[i] = a
        return lowest(full, cp)

    deferred: list[Deferred] = []
    _sweep(sub, cost, options, best_ms, first, merged, threshold="only",
           done=lambda: bool(found) and found[0][0] <= bound * (1 + 1e-12),
           bar=lambda: found[0][0] if found else math.inf,
           defer=deferred if options.packed_wide and options.packed_rerank else None)
    narrow = found[:]
    found.clear()
    for floor, cp, shard_from, spans in sorted(deferred):
        if floor >= min(best_ms, found[0][0] if found else math.inf):
            break
        part = packed_assignments(sub, cost, cp, head_parallel=True, shard_from=shard_from, first=first,
                                  absorb=options.packed_absorb, wide=spans)
        if part is not None and all(a.placement in options.placements for a in part):
            merged(part, cp)
    return narrow, found


def _lowest(lengths: Sequence[int], cost: CostModel, options: PlannerOptions, best_ms: float,
            found: list[tuple[float, int, list[Assignment]]]) -> Emit:
    """An ``emit`` for :func:`_sweep` that returns a packing's :func:`~.packed.packed_floor` and keeps in ``found``
    the one with the lowest floor below ``best_ms`` (ties: the first, the smaller ``cp``)."""
    def emit(assignments: list[Assignment], cp: int) -> float | None:
        floor = packed_floor(lengths, assignments, cost, options)
        if floor < best_ms and (not found or floor < found[0][0]):
            found[:] = [(floor, cp, assignments)]
        return floor
    return emit


def _filled(lengths: Sequence[int], top: list[int], k: int, cost: CostModel, options: PlannerOptions,
            best_ms: float) -> tuple[float, int, list[Assignment]] | None:
    """The filled-lead packing with the lowest :func:`~.packed.packed_floor` (ties: the smaller ``cp``): the
    sequences ``top`` on one ring over ranks ``0 .. k-1``, which also take whole sequences in the packing of
    the rest over every rank (:func:`~.packed.packed_groups` with ``lead=top``; the other ranks in CP groups of
    ``cp``, threshold packings, :func:`_sweep` with ``threshold="only"``, and ``cp = 1``: every other sequence
    whole); ``None`` when none is below ``best_ms``."""
    found: list[tuple[float, int, list[Assignment]]] = []
    emit = _lowest(lengths, cost, options, best_ms, found)
    _sweep(lengths, cost, options, best_ms, k, emit, threshold="only", lead=top,
           bar=lambda: found[0][0] if found else math.inf)
    return found[0] if found else None


def _sweep(lengths: Sequence[int], cost: CostModel, options: PlannerOptions, best_ms: float, first: int,
           emit: Emit, *, threshold: Literal["with", "without", "only"] = "with",
           done: Callable[[], bool] = lambda: False, bar: Callable[[], float] = lambda: math.inf,
           lead: Sequence[int] = (), defer: list[Deferred] | None = None) -> None:
    """The packings of ``lengths`` over ranks ``first .. P-1`` per CP size (powers of two dividing the
    ``P - first`` ranks whose GPUs hold the longest document), passed to ``emit(assignments, cp)``,
    which returns the candidate's floor (``None``: not kept). Per ``cp``: WLB-LLM's packing (plain rings'
    work); with head-parallel rings on, the same shards weighed by Zeppelin's rings, and every document from
    :func:`head_parallel_threshold` on sharded; identical placements once (``emit``). Skips what cannot win
    (:func:`quick_floor` at ``best_ms``; :func:`best_packed`'s rules). ``threshold``: ``"without"`` leaves the
    threshold packing out (``PlannerOptions.packed_threshold``, an ablation), ``"only"`` makes it alone (what a
    led packing's rest uses, until its floor stops falling); ``done()``: stop when it says so (checked after each
    packing); ``bar()``: a floor a packing must also be below to be made (a led packing keeps its lowest floor only)."""
    cl = cost.cluster
    cap, ranks = cl.tokens_per_gpu, cl.world_size - first
    allowed = set(options.placements)
    led = set(lead)
    rest = [s for i, s in enumerate(lengths) if i not in led] if led else lengths
    descending = sorted(rest, reverse=True)
    longest = descending[:QUICK]
    if not longest:
        return
    rising, last = False, math.inf  # the threshold packings' floors over cp: tried until they rise
    must: int | None = None  # share_threshold of the rest, once
    basis: WideBasis | None = None  # what wide_spans needs, once
    cp = 1
    while cp <= ranks:
        size, cp = cp, 2 * cp
        if ranks % size or -(-longest[0] // size) > cap:
            continue
        only = threshold == "only"
        # "only": the threshold packings, and at cp = 1 (no threshold) every other sequence whole, weighed by
        # Zeppelin's rings (a filled lead's ring, and its absorbing)
        variants: list[tuple[bool, int | None]] = [] if only and size > 1 else [(only, None)]
        if options.head_parallel:
            top = longest[0]
            # the longest sequence is sharded in every packing of this cp, and that alone loses: only wide spans
            # (packed_wide.wide_spans, bounded before the threshold is searched) can still win
            narrow = not ((split_pays(cost, top, size) or top > cap)
                          and quick_floor(longest[:1], cost, size, options) >= best_ms)
            wide = False
            if defer is not None and size >= 2 and 4 * size <= ranks:
                if basis is None:
                    basis = wide_basis(rest, cost, ranks)
                spans = wide_spans(rest, cost, size, ranks, 0, basis)
                wide = bool(spans) and _span_floor(rest, descending, spans, cost, size, options, None) < best_ms
            if not (narrow or wide):
                continue
            if not narrow:
                variants = []
            elif not only and any(s > cap or split_pays(cost, s, size) for s in descending):
                variants.append((True, None))  # nothing sharded: both work models make WLB-LLM's packing
            shard_from = None if rising or threshold == "without" else head_parallel_threshold(rest, cost, size)
            if shard_from is not None:
                if narrow:
                    variants.append((True, shard_from))
                if wide and defer is not None:  # what a CP group alone would load above the mean: wider spans
                    spans = wide_spans(rest, cost, size, ranks, shard_from, basis)
                    if spans:
                        defer.append((_span_floor(rest, descending, spans, cost, size, options, shard_from),
                                      size, shard_from, spans))
                if narrow and options.packed_share and not only:  # shard only what, kept whole, would overload its GPU
                    if must is None:
                        must = share_threshold(rest, cost, ranks) or 0
                    if must > shard_from:
                        variants.append((True, must))
        # Zeppelin's work model packs with absorbing rings (packed_whole.absorb_whole)
        quick = {v: quick_floor(longest, cost, size, options, shard_from=v[1], absorb=v[0] and options.packed_absorb,
                                one_group=size == ranks) for v in variants}
        shards = True
        for head_parallel, shard_from in variants:
            if quick[(head_parallel, shard_from)] >= min(best_ms, bar()):
                continue  # cannot win: not even packed
            if head_parallel and shard_from is None and not shards:
                continue  # nothing sharded: the work models agree
            assignments = packed_assignments(lengths, cost, size, head_parallel=head_parallel, shard_from=shard_from,
                                             first=first, lead=lead, absorb=head_parallel and options.packed_absorb)
            if assignments is None or any(a.placement not in allowed for a in assignments):
                continue
            if shard_from is None:
                shards = any(a.placement != "local" for a in assignments)
            floor = emit(assignments, size)
            if floor is not None and shard_from is not None and shard_from != must:  # until the floor stops falling
                rising, last = floor >= last if only else floor > last, floor
            if done():
                return


def _span_floor(lengths: Sequence[int], descending: Sequence[int], spans: Sequence[tuple[int, int]], cost: CostModel,
                cp: int, options: PlannerOptions, shard_from: int | None) -> float:
    """A lower bound on :func:`~.packed.packed_floor` of the wide packing of ``lengths`` (``descending``: them sorted,
    longest first) with CP size ``cp`` and ``spans``: :func:`~.packed.quick_floor` of the sequences not on a span
    with the spans' rings; ``shard_from=None`` (the threshold not yet searched): of the longest sequence not on a span
    only, the lesser of it sharded and kept whole. :func:`_sweep` takes the latter with the spans searched from no
    threshold, which are the threshold's spans and any span of a sequence below the threshold after them (the
    search goes longest first); with none such, as on every batch of docs/BENCHMARKS.md (a span's sequence loads a
    CP group above the mean, far above the threshold), it bounds the packing the threshold then makes."""
    taken = [lengths[i] for i, _ in spans]
    rest = _without(descending, taken)[:QUICK]
    on = list(zip(taken, (z for _, z in spans)))
    if shard_from is not None:
        return quick_floor(rest, cost, cp, options, shard_from=shard_from, absorb=options.packed_absorb, spans=on)
    if not rest:
        return quick_floor([], cost, cp, options, spans=on)
    s = rest[0]
    return min(quick_floor([s], cost, cp, options, shard_from=z, absorb=options.packed_absorb, spans=on)
               for z in ((s, s + 1) if s >= 2 * cp else (s + 1,)))  # sharded (where it can be) or whole


def _without(descending: Sequence[int], taken: Sequence[int]) -> list[int]:
    """``descending`` with one occurrence of each of ``taken`` removed."""
    out = list(descending)
    for s in taken:
        out.remove(s)
    return out
