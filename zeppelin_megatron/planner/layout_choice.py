"""The last step of ``plan_step``: which linear layout and which routing a step's plan uses.

Given the plan's placement and attention layout, the candidates are

* linear layout (``PlannerOptions.remap``): ``True``: token-balanced; ``False``: the attention layout;
  ``"auto"`` (default): token-balanced, workload-balanced (:mod:`.balanced_layout`: two of them, the
  others evening out across the cluster or within each node) and the attention layout;
* routing (``PlannerOptions.routing`` on): the routed plan (ring hops over proxies where that pays,
  :func:`~.plan_json.derive_routing`; the remap over the NICs' proxies where that pays,
  :func:`~.remap_cost.remap_proxies_for`) and the unrouted one (``routing=()``, ``remap_proxies=()``).

Each candidate gets its local slots (they follow the routing), its remap windows when it remaps
(``PlannerOptions.remap_overlap``, :mod:`.remap_windows`: they follow the linear layout) and its prediction
(:func:`~.predict.predict`); the lowest predicted step wins. Ties keep the earlier candidate in
this order: routed before unrouted; within each, token-balanced, workload-balanced, attention
(:data:`~.plan_parts.LINEAR_LAYOUTS`), so a plan that gains nothing from a change is today's plan.

Skipped, because they cannot predict a lower step (no prediction spent on them):

* the unrouted variant when the routed plan routes no ring hop (its remap proxies were chosen
  only where predicted faster, and the step grows with the remap time);
* the workload-balanced layout when the token-balanced layout equals the attention layout, when no
  choice of stay groups lies between them or it equals one of them, or when its lower bound (every
  rank's attention plus its linear time, :attr:`~.balanced_layout.StayChoice.bound_ms`) is not below
  the best step so far;
* the attention layout when it equals the token-balanced layout (the same plan).

Example (illustrative numbers; ``remap="auto"``, routing on, a batch with a routed inter-node ring):
eight candidates at most, predicted say token-balanced 1200 / 1210 ms (routed / unrouted),
workload-balanced 1150 and 1170 / 1160 and 1180, attention 1400 / 1405: the routed workload-balanced
plan of 1150 ms wins and its document says ``"linear": "workload_balanced"``. The hand-made plans
of ``tests/planner/test_remap_choice.py`` make each layout win.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .balanced_layout import choose_stays, quota_layout
from .local_schedule import with_local_slots
from .plan import Prediction, StepPlan
from .plan_json import derive_routing
from .predict import attention_time, predict
from .remap_cost import remap_proxies_for
from .remap_windows import with_remap_windows

if TYPE_CHECKING:
    from .cost_model import CostModel
    from .options import PlannerOptions

__all__ = ["choose_plan", "candidate_kinds"]

_EPS = 1e-6  # predictions are rounded to 1e-6 ms


def candidate_kinds(remap: object) -> tuple[str, ...]:
    """The linear layouts ``PlannerOptions.remap`` allows, in tie order.

    Example: ``candidate_kinds("auto")`` -> ``('token_balanced', 'workload_balanced', 'attention')``.
    """
    if remap is True:
        return ("token_balanced",)
    if remap is False:
        return ("attention",)
    return ("token_balanced", "workload_balanced", "attention")


def choose_plan(base: StepPlan, cost: "CostModel", options: "PlannerOptions") -> StepPlan:
    """The predicted-fastest candidate (module docstring) built on ``base``.

    ``base``: the plan of the step (not yet validated: ``plan_step`` checks the one it keeps), its ``linear_layout``
    the token-balanced layout (the
    attention layout when ``options.remap`` is ``False``), no routes, no slots, no prediction.
    Returns it with routing, remap proxies, local slots, ``linear`` and ``predicted`` set.
    """
    att = base.attention_layout
    kinds = candidate_kinds(options.remap)
    tb = base.linear_layout
    if "token_balanced" in kinds and tb == att:  # nothing to remap: one plan, token-balanced
        kinds = ("token_balanced",)
    routes = derive_routing(base, cost, enabled=options.routing)
    best: tuple[StepPlan, Prediction] | None = None
    workloads: list[tuple[tuple[int, ...], Layout]] | None = None  # chosen once, on the routed plan's times
    layers = cost.model.layers

    def offer(cand: StepPlan, routed: bool) -> tuple[StepPlan, Prediction]:
        nonlocal best
        if routed and cand.linear != "attention":
            proxies = remap_proxies_for(cand, cost)
            if proxies:
                cand = cand.evolve(remap_proxies=proxies)
        if options.remap_overlap and cand.linear != "attention":
            cand = with_remap_windows(cand, cost)
        pred = predict(cand, cost)
        if best is None or pred.step_ms < best[1].step_ms:
            best = (cand, pred)
        return cand, pred

    for rt in [routes, ()] if routes else [routes]:
        routed = rt is routes and options.routing
        plan_v = with_local_slots(base.evolve(routing=rt, remap_proxies=()), cost)
        ref: tuple[StepPlan, Prediction] | None = None  # this variant's token-balanced plan and prediction
        for kind in kinds:
            if kind == "token_balanced":
                ref = offer(plan_v.evolve(linear_layout=tb, linear=kind), routed)
            elif kind == "attention":
                offer(plan_v.evolve(linear_layout=att, linear=kind), routed)
            elif ref is not None:  # workload-balanced: from the token-balanced prediction
                att_ms = attention_time(ref[1])
                if workloads is None:
                    workloads = _workload_layouts(ref[0], att_ms, cost, ref[1].remap_ms, (tb, att))
                for quotas, layout in workloads:
                    bound = max(a + layers * cost.linear_ms(q) for a, q in zip(att_ms, quotas))
                    if best is not None and bound >= best[1].step_ms - _EPS:
                        continue  # cannot predict a lower step
                    offer(plan_v.evolve(linear_layout=layout, linear=kind), routed)
    assert best is not None
    return best[0].evolve(predicted=best[1])


Layout = tuple[tuple[tuple[int, int, int], ...], ...]


def _workload_layouts(plan: StepPlan, att_ms: list[float], cost: "CostModel", remap_ms: float,
                      others: tuple[Layout, ...]) -> list[tuple[tuple[int, ...], Layout]]:
    """The workload-balanced candidates: the others even out across the cluster (the token-balanced
    plan's remap assumed), then within each node (no row crosses nodes: its remap assumed free); each
    as ``(quotas, layout)``, without layouts equal to ``others`` or to each other."""
    out: list[tuple[tuple[int, ...], Layout]] = []
    for per_node, remap in ((False, remap_ms), (True, 0.0)):
        if per_node and plan.nodes == 1:
            continue
        choice = choose_stays(plan, att_ms, cost, remap, per_node=per_node)
        if choice is None:
            continue
        layout = quota_layout(plan.attention_layout, choice.quotas, plan.gpus_per_node)
        if all(layout != x for x in others) and all(layout != x for _, x in out):
            out.append((choice.quotas, layout))
    return out
