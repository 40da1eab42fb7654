"""Build a :class:`StepPlan` from per-sequence ``(placement ranks)`` choices.

Baseline planners decide, for every sequence, the ranks that hold it: one rank
(kept whole) or an ordered group (zigzag-split over the group, ring order =
the tuple's order). This module turns that into a validated ``StepPlan`` the
simulator (and, for ring plans, the runtime) executes:

* placement: ``local`` for one rank, ``intra_node`` when the group lies in one
  node, ``inter_node`` otherwise;
* attention layout: whole sequences and zigzag chunks, exactly as
  :func:`zeppelin_megatron.planner.api.plan_step` writes them;
* linear layout: the attention layout (``remap=False``, what the baselines do:
  their linear modules run on the tokens the attention holds) or the planner's
  token-balanced layout (``remap=True``);
* routing: none, or the planner's cost-model routes (``routing=True``);
* local slots: where each rank's local sequences run among its ring steps,
  as the planner schedules them (:func:`~zeppelin_megatron.planner.local_schedule.schedule_local`),
  so ring baselines get the runtime engine's overlap too (``local_slots=False``:
  every local sequence after the rings).

Worked example, 1 node x 2 GPUs, lengths ``[10, 3]``, groups ``[(0, 1), (1,)]``:
sequence 0 is ``intra_node`` over ranks 0, 1 (chunks ``[0,3)+[8,10)`` on rank 0,
``[3,8)`` on rank 1), sequence 1 is ``local`` on rank 1.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..planner.cluster import Cluster
from ..planner.cost_model import CostModel
from ..planner.linear_layout import linear_layout
from ..planner.local_schedule import with_local_slots
from ..planner.plan import PlanError, SequencePlan, StepPlan, derive_routing
from ..planner.predict import predict
from ..planner.zigzag import position_ranges

__all__ = ["build_plan", "placement_of"]


def placement_of(ranks: Sequence[int], cluster: Cluster) -> str:
    """``local`` (one rank), ``intra_node`` (one node) or ``inter_node``."""
    if len(ranks) == 1:
        return "local"
    return "intra_node" if len({cluster.node_of(r) for r in ranks}) == 1 else "inter_node"


def build_plan(
    lengths: Sequence[int],
    groups: Sequence[Sequence[int]],
    cluster: Cluster,
    cost: CostModel,
    *,
    remap: bool = False,
    routing: bool = False,
    local_slots: bool = True,
    with_prediction: bool = True,
) -> StepPlan:
    """A validated plan holding sequence ``i`` on ``groups[i]`` (see module docstring).

    Raises:
        PlanError: a group too large for its sequence (zigzag needs ``2 g``
            tokens), repeated or out-of-range ranks (from ``StepPlan``).
    """
    if len(groups) != len(lengths):
        raise PlanError(f"build_plan: {len(lengths)} lengths but {len(groups)} groups")
    world = cluster.world_size
    attention: list[list[tuple[int, int, int]]] = [[] for _ in range(world)]
    sequences = []
    for i, (s, ranks) in enumerate(zip(lengths, groups)):
        ranks = tuple(int(r) for r in ranks)
        if not ranks:
            raise PlanError(f"build_plan: sequence {i} (length {s}) has no ranks")
        placement = placement_of(ranks, cluster)
        sequences.append(SequencePlan(int(s), placement, ranks))  # type: ignore[arg-type]
        if placement == "local":
            if not 0 <= ranks[0] < world:
                raise PlanError(f"build_plan: sequence {i}: rank {ranks[0]} is outside [0, {world})")
            attention[ranks[0]].append((i, 0, int(s)))
            continue
        g = len(ranks)
        if s < 2 * g:
            raise PlanError(f"build_plan: sequence {i} has {s} tokens, too short for a ring of {g} "
                            f"(zigzag needs >= {2 * g})")
        for p, r in enumerate(ranks):
            if not 0 <= r < world:
                raise PlanError(f"build_plan: sequence {i}: rank {r} is outside [0, {world})")
            attention[r].extend(position_ranges(i, int(s), g, p))
    att = tuple(tuple(rs) for rs in attention)
    lin = linear_layout(att, cluster) if remap else att
    plan = StepPlan(nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node, sequences=tuple(sequences),
                    attention_layout=att, linear_layout=lin)
    if routing:
        plan = replace(plan, routing=derive_routing(plan, cost, enabled=True), validate=False)
    if local_slots:
        plan = with_local_slots(plan, cost)
    if with_prediction:
        plan = replace(plan, predicted=predict(plan, cost), validate=False)
    return plan
