"""Which rings run head-parallel, and at which block width (the plan's ``SequencePlan.a2a``).

For each group of split sequences the partitioner put on one rank tuple (one
ring), :func:`choose_widths` picks the block width ``a`` with the lowest
predicted time of that ring for its members, among

* ``a = 1``: the plain ring, :func:`~.predict.ring_time` with its cross-node
  hops routed as :func:`~.routing.plan_routing` routes that ring (what the plan
  will do, routing being per ring);
* every ``a >= 2`` of :func:`~.cost_heads.head_widths` (``a`` divides the ring,
  each block of ``a`` consecutive ranks inside one node, the heads split over
  ``a`` lanes): :func:`~.cost_heads.head_ring_time`.

Ties go to the smaller width (the plain ring first). The width changes neither
the attention layout nor any rank's tokens (the layout of a head-parallel ring
is the plain zigzag), so no batch the plain ring can run is refused.
``PlannerOptions(head_parallel=False)`` keeps every ring plain.

Example (Llama-7B, one H100 node, call overhead 1.09 ms): one sequence of 8192
tokens on ranks 0-7: the plain ring pays the overhead at each of its 8 steps
(8.74 ms); Ulysses (``a = 8``) is one call over ``1/8`` of the heads plus two
all-to-alls (1.28 ms): ``a = 8`` is chosen.

Pure and deterministic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .cost_heads import head_ring_time, head_widths
from .cost_model import CostModel
from .options import PlannerOptions
from .predict import ring_time
from .routing import Route, plan_routing

if TYPE_CHECKING:
    from .partition_context import Assignment

__all__ = ["choose_widths", "choose_width", "plain_ring_ms", "fastest_ring_times"]


def plain_ring_ms(cost: CostModel, ranks: tuple[int, ...], lengths: Sequence[int], routing: bool) -> float:
    """Per-member time of the plain ring (``a = 1``), cross-node hops routed as the plan routes them."""
    cl = cost.cluster
    routes: dict[tuple[int, int], Route] = {}
    if routing and len({cl.node_of(r) for r in ranks}) > 1:
        step_bytes = sum(cost.ring_step_bytes(s, len(ranks)) for s in lengths)
        routes = {(rt.src, rt.dst): rt for rt in plan_routing([(ranks, step_bytes)], cl, cost, enabled=True)}
    return ring_time(cost, ranks, lengths, routes)[0]


def choose_width(cost: CostModel, ranks: tuple[int, ...], lengths: Sequence[int], routing: bool) -> int:
    """The block width of the ring over ``ranks`` holding ``lengths`` (module docstring): 1 or one of
    :func:`~.cost_heads.head_widths`, the lowest predicted time, ties to the smaller width."""
    best_ms, best = plain_ring_ms(cost, ranks, lengths, routing), 1
    for a in head_widths(cost, ranks):
        ms = head_ring_time(cost, ranks, lengths, a).total
        if ms < best_ms:
            best_ms, best = ms, a
    return best


def fastest_ring_times(cost: CostModel, ranks: tuple[int, ...], lengths: Sequence[int],
                       plain: tuple[float, float]) -> tuple[float, float]:
    """``(total, own)`` of the ring in the width :func:`choose_width` picks, for the partitioner's scores
    (:func:`~.predict.rank_attention`'s rule): ``plain`` (the plain ring's :func:`~.predict.ring_time`)
    unless a head-parallel width is faster; then its total, and as ``own`` its kernels plus its
    all-to-alls (local work fills none of them)."""
    best = plain
    for a in head_widths(cost, ranks):
        h = head_ring_time(cost, ranks, lengths, a)
        if h.total < best[0]:
            best = (h.total, h.own + h.a2a_ms)
    return best


def choose_widths(lengths: Sequence[int], assignments: "Sequence[Assignment]", cost: CostModel,
                  options: PlannerOptions) -> list[int]:
    """``a2a`` of every sequence: 1 for local ones (and everywhere when ``options.head_parallel`` is
    off); for split ones, the width :func:`choose_width` picks for the ring of their rank tuple.

    Example: ``[8192, 100]`` on one node of 8 GPUs, sequence 0 on ranks 0-7, sequence 1 local on rank
    0: ``[8, 1]`` (Llama-7B: Ulysses beats the plain ring, see the module docstring).
    """
    out = [1] * len(lengths)
    if not options.head_parallel:
        return out
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, a in enumerate(assignments):
        if a.placement != "local":
            groups.setdefault(a.ranks, []).append(i)
    for ranks, seqs in groups.items():
        width = choose_width(cost, ranks, [lengths[i] for i in seqs], options.routing)
        if width != 1:
            for i in seqs:
                out[i] = width
    return out
