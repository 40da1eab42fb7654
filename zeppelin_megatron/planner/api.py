"""``plan_step``: one global batch of lengths -> a :class:`StepPlan`."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from .choose_heads import choose_widths
from .cluster import Cluster
from .cost_model import CostModel
from .gc_pause import gc_paused
from .grouped import best_plan
from .linear_layout import linear_layout
from .layout_check import engine_attention_layout
from .layout_choice import choose_plan
from .options import REMAP_CHOICES, PlannerOptions
from .packed import CHARGES
from .packed_search import best_packed
from .partition import partition
from .partition_context import Assignment
from .plan import PlanError, SequencePlan, StepPlan
from .predict import predict, ring_loads
from .ring_parts import split_rings
from .routing import outside_relays
from .zigzag import ring_ranges

__all__ = ["plan_step", "check_lengths", "engine_order", "REMAP_CHOICES"]


def check_lengths(lengths: Sequence[int], cluster: Cluster) -> list[int]:
    """Validate a batch against a cluster; returns the lengths as a list of ints."""
    lengths = list(lengths)
    if not lengths:
        raise PlanError("the batch is empty: plan_step needs at least one sequence")
    if not all(type(s) is int for s in lengths):  # the common case (plain ints) skips the per-item checks
        for i, s in enumerate(lengths):
            if isinstance(s, bool) or not isinstance(s, int) and not (hasattr(s, "__index__")):
                raise PlanError(f"sequence {i}: length {s!r} is not an integer")
        lengths = [int(s) for s in lengths]
    if min(lengths) <= 0:
        i = next(i for i, s in enumerate(lengths) if s <= 0)
        raise PlanError(f"sequence {i}: length {lengths[i]} must be >= 1")
    total, cap = sum(lengths), cluster.total_capacity()
    longest = max(lengths)
    if longest > cap:
        raise PlanError(
            f"sequence {lengths.index(longest)} has {longest} tokens, more than the cluster's total "
            f"capacity of {cap} ({cluster.world_size} ranks x {cluster.tokens_per_gpu} tokens per rank)"
        )
    if total > cap:
        raise PlanError(
            f"the batch has {total} tokens, more than the cluster's total capacity of {cap} "
            f"({cluster.world_size} ranks x {cluster.tokens_per_gpu} tokens per rank)"
        )
    quota = -(-total // cluster.world_size)
    if quota > cluster.tokens_per_gpu:
        raise PlanError(
            f"the linear layout needs {quota} tokens per GPU, more than tokens_per_gpu = "
            f"{cluster.tokens_per_gpu}"
        )
    return lengths


def plan_step(lengths: Sequence[int], cost_model: CostModel, options: PlannerOptions | None = None) -> StepPlan:
    """Plan one training step.

    Args:
        lengths: token count of each sequence of the global batch.
        cost_model: calibrated costs for the model on the cluster; its
            ``cluster`` (whose ``tokens_per_gpu`` bounds each rank's tokens)
            is the cluster planned for.
        options: the planner's settings (:class:`PlannerOptions`; default
            ``PlannerOptions()``). ``remap``: ``True`` (default): linear modules
            on a token-balanced layout (remap all-to-alls every layer);
            ``False``: the linear layout is the attention layout (no remap
            traffic); ``"auto"``: build both on the same attention layout and
            keep the one with the lower predicted step (ties: the remapped one).

    Raises:
        PlanError: bad lengths (empty, ``<= 0``, beyond capacity), arguments
            of the wrong type, or a batch that cannot be placed; never returns
            a partial plan.

    Example::

        plan = plan_step([60_000, 500, 700], CostModel(model=load_model("llama_7b"), cluster=load_cluster("2x8")),
                         PlannerOptions(remap="auto"))
    """
    if not isinstance(cost_model, CostModel):
        raise PlanError(f"plan_step(lengths, cost_model, options): cost_model is a {type(cost_model).__name__}, "
                        "expected a CostModel (build it with CostModel(model=..., cluster=...))")
    if options is None:
        options = PlannerOptions()
    if not isinstance(options, PlannerOptions):
        raise PlanError(f"plan_step(lengths, cost_model, options): options is a {type(options).__name__}, "
                        "expected a PlannerOptions")
    with gc_paused():  # a million sequences allocate millions of objects (gc_pause.py)
        return _plan_step(check_lengths(lengths, cost_model.cluster), cost_model, options)


REMAP_BOUND = 0.25
"""(Predicted remap + longest relay waits) / predicted step above which ``plan_step`` also partitions without
routing (:func:`_unrouted_partition`)."""


def _plan_step(lengths: list[int], cost_model: CostModel, options: PlannerOptions) -> StepPlan:
    # Candidates are compared unvalidated and in planner order (_candidate); only the winner is validated
    # and written in engine order (_final): a losing candidate's checks and reordering would be wasted work.
    placed = partition(lengths, cost_model, options)
    # with packing on, the partitioner's placement is first finished on the token-balanced layout alone: the bar the
    # packed candidates must beat; its other layouts (remap="auto") only where none does (_lazy_partition)
    lazy = options.packed and options.remap == "auto"
    plan = _partition_plan(lengths, placed, cost_model, replace(options, remap=True) if lazy else options)
    # packed and CP-group candidates balance tokens with attention (packed.py, grouped.py): finished without a remap
    no_remap = replace(options, remap=False)
    if options.packed:
        packed = best_packed(lengths, cost_model, options, plan, lambda a, widths=None: _candidate(
            lengths, a, cost_model, no_remap, widths).evolve(origin="packed"))
        plan = _lazy_partition(lengths, placed, cost_model, options, plan) if lazy and packed is plan else packed
    if options.grouped:  # opt-in
        plan = best_plan(lengths, cost_model, options, plan,
                         lambda a: _candidate(lengths, a, cost_model, no_remap).evolve(origin="grouped"))
    if options.ring_parts and options.head_parallel:  # the chosen plan's head-parallel rings in parts, where faster
        parted = split_rings(plan, cost_model)
        if parted is not plan:
            plan = parted.evolve(predicted=predict(parted, cost_model))
    return _final(plan)


def _partition_plan(lengths: list[int], placed: Sequence[Assignment], cost_model: CostModel,
                    options: PlannerOptions) -> StepPlan:
    """The partitioner's candidate: ``placed`` finished (:func:`_candidate`), or the unrouted partition's plan where
    that predicts lower (:func:`_unrouted_partition`)."""
    return _unrouted_partition(lengths, cost_model, options, _candidate(lengths, placed, cost_model, options))


def _lazy_partition(lengths: list[int], placed: Sequence[Assignment], cost_model: CostModel, options: PlannerOptions,
                    bar: StepPlan) -> StepPlan:
    """Where no packed candidate beats ``bar`` (the partitioner's plan on the token-balanced layout alone), the
    partitioner's plan with every linear layout ``options.remap`` allows (:func:`_partition_plan`), or ``bar`` where
    that predicts lower under :data:`~.packed.CHARGES` (``bar`` is one of its layouts, chosen there by the uncharged
    prediction; ties keep the full choice).

    The packed search runs against ``bar`` instead of the partitioner's full choice, which takes about a tenth of
    the planning time (the workload-balanced layouts and their remap windows): on the 120 steps of
    docs/BENCHMARKS.md's 60 configurations and ``benchmarks/plan_speed.py``'s batches a packed candidate beats
    ``bar`` (by 2-41%), so this is never called and the plans are those of the full choice first. Where it is,
    the step plans as if the choice had been made first, except that a packed candidate predicting between
    ``bar`` and the full choice loses to ``bar`` (the better of the two partitioner plans under the charges)."""
    full = _partition_plan(lengths, placed, cost_model, options)
    full_ms = predict(full, cost_model, charges=CHARGES).step_ms
    return bar if predict(bar, cost_model, charges=CHARGES).step_ms < full_ms - 1e-6 else full


def _unrouted_partition(lengths: list[int], cost_model: CostModel, options: PlannerOptions,
                        plan: StepPlan) -> StepPlan:
    """``plan``, or the plan of the partition made without routing where that predicts a lower step; tried
    only when routing is on and ``plan``'s predicted remap and its longest relay waits (:func:`_relay_ms`), the
    two costs of routing the partitioner does not score, exceed :data:`REMAP_BOUND` of its predicted step.

    The partitioner places sequences on attention time and ring costs (routed hops cheaper), not on the
    remap the placement then needs; where the remap dominates, a routed placement can predict slower
    than the unrouted one (Llama-7B prolong-64k on 128 GPUs with the NICs 30% slower: 2975 against
    1843 ms predicted, 3151 against 1856 simulated; remap 24% and relay waits 24% of its step). The second
    partition costs about one more planning pass, so it is not tried elsewhere (remap and relay waits are at
    most 15% of the predicted step on ``benchmarks/plan_speed.py``'s batches; one of the 120 steps of
    docs/BENCHMARKS.md's configurations at nominal bandwidths plans twice, Llama-13B github-64k on 128 GPUs,
    batch 0: remap 20% and relay waits 16%, the same plan). The unrouted
    partition's plan still gets routed and unrouted layout
    candidates (``options`` unchanged there); ties keep ``plan``."""
    pred = plan.predicted
    if not options.routing or pred is None or pred.remap_ms + _relay_ms(plan, cost_model) <= REMAP_BOUND * pred.step_ms:
        return plan
    plain = partition(lengths, cost_model, replace(options, routing=False))
    alt = _candidate(lengths, plain, cost_model, options)
    if alt.predicted is not None and alt.predicted.step_ms < pred.step_ms - 1e-6:
        return alt
    return plan


def _relay_ms(plan: StepPlan, cost_model: CostModel) -> float:
    """The step's longest relay waits: ``layers`` times the most any rank of ``plan`` waits a layer as a relay, a
    GPU outside a routed ring that carries part of its hops (:func:`~.predict.ring_time`); 0 without one."""
    if not any(outside_relays(ring.ranks, plan.routes_for(ring.ranks).values(), plan.gpus_per_node)
               for ring in plan.rings if ring.a2a == 1):
        return 0.0
    return cost_model.model.layers * max(ring_loads(plan, cost_model).relay)


def _finish(lengths: list[int], assignments: Sequence[Assignment], cost_model: CostModel,
            options: PlannerOptions) -> StepPlan:
    """The plan of ``assignments``: block widths, layouts, linear layout and routing, local slots, validated and
    in engine order (:func:`_final` of :func:`_candidate`)."""
    return _final(_candidate(lengths, assignments, cost_model, options))


def _final(plan: StepPlan) -> StepPlan:
    """A chosen candidate (:func:`_candidate`) as ``plan_step`` returns it: every check of a validated
    construction (:meth:`~.plan.StepPlan.validated`: both layouts cover every token once, the attention layout
    holds each sequence as placed, block widths allowed), then :func:`engine_order`."""
    return engine_order(plan.validated())


def _candidate(lengths: list[int], assignments: Sequence[Assignment], cost_model: CostModel,
               options: PlannerOptions, widths: Sequence[int] | None = None) -> StepPlan:
    """The plan of ``assignments`` (block widths, layouts, linear layout and routing, local slots) with its
    prediction, built without the layout checks and in planner order: a candidate to compare; :func:`_final`
    validates and orders the one kept. ``widths``: every sequence's block width as given (a placement whose
    rings are another plan's, :func:`~.packed_search.best_packed`'s moved documents), else chosen
    (:func:`~.choose_heads.choose_widths`)."""
    cluster = cost_model.cluster
    remap = options.remap
    world = cluster.world_size
    attention: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    for i, (a, s) in enumerate(zip(assignments, lengths)):
        if a.placement == "local":
            attention[a.ranks[0]].append((i, 0, s))
            continue
        for r, ranges in zip(a.ranks, ring_ranges(i, s, len(a.ranks))):
            attention[r].extend(ranges)
    att = tuple(tuple(rs) for rs in attention)
    held = max(sum(e - s for _, s, e in rs) for rs in att)
    if held > cluster.tokens_per_gpu:  # the partitioner keeps every rank within capacity
        raise PlanError(f"internal: a rank holds {held} attention tokens, more than tokens_per_gpu = "
                        f"{cluster.tokens_per_gpu}")
    if widths is None:
        widths = choose_widths(lengths, assignments, cost_model, options, att)  # head-parallel rings (choose_heads.py)
    sequences = tuple(SequencePlan(s, a.placement, a.ranks, w)  # type: ignore[arg-type]
                      for s, a, w in zip(lengths, assignments, widths))
    lin = att if remap is False else linear_layout(att, cluster)
    base = StepPlan(nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node, sequences=sequences,
                    attention_layout=att, linear_layout=lin, validate=False)  # checked in _final, if kept
    return choose_plan(base, cost_model, options)  # linear layout and routing (layout_choice.py)


def engine_order(plan: StepPlan) -> StepPlan:
    """``plan`` with each rank's attention ranges in engine order (:func:`~.layout_check.engine_attention_layout`:
    ring by ring, each member's ring tokens seq-major, then each local chunk's sequences, remap slots'
    last), so every ring's
    and every local chunk's rows are one contiguous range and the engine takes views instead of gathers
    (``runtime/engine.py``). Only the order within each rank changes: the same tokens on the same ranks,
    so the remap moves the same rows between the same ranks (its exchange lists are rebuilt: ``evolve``
    drops them); a linear layout equal to the attention layout (``linear == "attention"``, or nothing
    to remap) follows it. A plan already in that order (no rings and no slots: local sequences by index)
    is returned as is.

    Example: sequence 0 (3 tokens) local on rank 1 and sequence 1 (8 tokens) on a ring over ranks 0
    and 1: rank 1's ``((0, 0, 3), (1, 2, 6))`` becomes ``((1, 2, 6), (0, 0, 3))``.
    """
    if not plan.local_slots and not plan.rings and not plan.remap_slots:
        return plan
    att = tuple(map(tuple, engine_attention_layout(plan.sequences, plan.rings, plan.local_slots,
                                                   plan.world_size, plan.remap_slots)))
    if att == plan.attention_layout:
        return plan
    lin = att if plan.linear_layout == plan.attention_layout else plan.linear_layout
    return plan.reordered(attention_layout=att, linear_layout=lin, remap_slots=plan.remap_slots)  # same ranks' tokens
