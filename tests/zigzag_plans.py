"""Hand-made plans in the plain zigzag layout, for tests of head-parallel rings (lowering, planner, simulator)."""

from __future__ import annotations

from zeppelin_megatron.planner.plan import LocalSlot, SequencePlan, StepPlan
from zeppelin_megatron.planner.zigzag import zigzag_ranges


def zigzag_plan(items: list[tuple[int, tuple[int, ...], int]], nodes: int, gpn: int,
                local: tuple[tuple[int, int], ...] = (), slots: tuple[LocalSlot, ...] = ()) -> StepPlan:
    """Split sequences ``(length, ranks, a2a)`` in zigzag layout (ring order = ``ranks``), then local
    ``(length, rank)`` ones; linear layout = attention layout (no remap traffic).

    Example: ``zigzag_plan([(16, (0, 1, 2, 3), 2)], nodes=2, gpn=2)``: one hybrid ring of two blocks.
    """
    att: list[list[tuple[int, int, int]]] = [[] for _ in range(nodes * gpn)]
    seqs = []
    for i, (n, ranks, a2a) in enumerate(items):
        place = "intra_node" if len({r // gpn for r in ranks}) == 1 else "inter_node"
        seqs.append(SequencePlan(n, place, ranks, a2a))  # type: ignore[arg-type]
        for p, r in enumerate(ranks):
            att[r] += [(i, a, b) for a, b in zigzag_ranges(n, len(ranks), p)]
    for n, r in local:
        att[r].append((len(seqs), 0, n))
        seqs.append(SequencePlan(n, "local", (r,)))
    lay = tuple(tuple(x) for x in att)
    return StepPlan(nodes=nodes, gpus_per_node=gpn, sequences=tuple(seqs), attention_layout=lay, linear_layout=lay,
                    local_slots=slots)
