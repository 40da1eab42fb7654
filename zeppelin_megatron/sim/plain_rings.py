"""The simulator's same-plan ablation of head-parallel rings: :func:`plain_rings`."""

from __future__ import annotations

from dataclasses import replace

from ..planner.plan import LocalSlot, StepPlan

__all__ = ["plain_rings"]


def plain_rings(plan: StepPlan) -> StepPlan:
    """``plan`` with every head-parallel ring run as a plain ring (``a2a = 1``; same ranks, layouts and local
    sequences): the simulator's same-plan ablation of head-parallel rings (``simulate(..., head_parallel=False)``).
    Local slots follow their ring (by ranks; slots that land on one step of a merged ring join; a slot in a
    head-parallel ring's ``heads`` all-to-all, step -1, goes to step 0, where the plain ring waits); a plan
    without head-parallel rings is returned as is. Example: a Ulysses ring over ranks (0, 1, 2, 3) becomes
    the 4-position zigzag ring over the same ranks."""
    if all(s.a2a == 1 for s in plan.sequences):
        return plan
    old = plan.rings
    plain = replace(plan, sequences=tuple(replace(s, a2a=1) if s.a2a != 1 else s for s in plan.sequences),
                    local_slots=())
    index = {r.ranks: k for k, r in enumerate(plain.rings)}
    slots: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for x in plan.local_slots:
        at = (x.rank, index[old[x.ring].ranks], max(x.step, 0))
        slots[at] = slots.get(at, ()) + x.seqs
    return replace(plain, local_slots=tuple(LocalSlot(r, k, j, seqs) for (r, k, j), seqs in sorted(slots.items())))
