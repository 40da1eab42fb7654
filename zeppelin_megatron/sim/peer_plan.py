"""``PeerPlan``: a ``StepPlan`` of a peer baseline, carrying the peer's schedule and its program builder.

The peer baselines (Megatron HCP, TE CP a2a+p2p, DistCA; ``sim/megatron_hcp.py``,
``sim/te_cp_a2a_p2p.py``, ``sim/distca.py``) do not run Zeppelin's engine order,
so each strategy returns a :class:`PeerPlan` whose ``peer`` field holds its own
schedule (groups and their order for HCP, the ``(a2a, p2p)`` sizes for TE CP
a2a+p2p, the attention shards and nano-batches for DistCA) and whose ``build``
turns the plan into one simulated layer. :func:`~.program.build_layer_program`
calls ``plan.build(plan, cost)`` for these plans; this module imports neither
the program builder nor the peers, so the simulator and the peers import each
other in one direction only.

Example::

    plan = as_peer_plan(base, schedule, build=hcp_program)   # in megatron_hcp.py
    program = plan.build(plan, cost)                          # in program.py
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable

from ..planner.plan import StepPlan

if TYPE_CHECKING:
    from ..planner.cost_model import CostModel
    from .program import LayerProgram

__all__ = ["PEER_COMMS", "PeerPlan", "as_peer_plan"]

PEER_COMMS: tuple[str, ...] = ("hcp", "a2a_p2p", "distca")
"""``attention_comm`` kinds of the peer baselines (their plans are :class:`PeerPlan`)."""


@dataclass(frozen=True, kw_only=True)
class PeerPlan(StepPlan):
    """A ``StepPlan`` plus the peer's own schedule (``peer``) and the function building its layer program."""

    peer: Any = None
    build: "Callable[[PeerPlan, CostModel], LayerProgram] | None" = None


def as_peer_plan(plan: StepPlan, peer: Any, *, build: "Callable[[PeerPlan, CostModel], LayerProgram]") -> PeerPlan:
    """``plan`` (already validated, or built on purpose unvalidated) with ``peer`` and its builder attached."""
    values = {f.name: getattr(plan, f.name) for f in fields(StepPlan)}
    return PeerPlan(**values, peer=peer, build=build, validate=False)
