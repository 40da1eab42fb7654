"""Validation of a :class:`~.plan.StepPlan` (run on construction and on every parsed document).

:func:`validate_plan`: ranks in range, placements consistent with their ranks,
both layouts covering every token exactly once, the attention layout holding
each split sequence's zigzag chunks (:mod:`.zigzag`) on its ring's ranks in
order, routes on cross-node hops; :func:`check_local_slots` and
:func:`check_routing` are also run on plans built without the layout checks.
Each error names the sequence, rank or entry and the expected value. An attention
layout in :func:`~.api.plan_step`'s own order passes both of its checks in one
comparison (:mod:`.layout_check`), and a linear layout equal to it is not checked again;
any other layout gets the full checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .gc_pause import gc_paused
from .layout_check import attention_in_planner_order
from .plan_parts import REMAP_DIRECTIONS, PlanError, TokenRange
from .zigzag import chunk_bounds, next_position

if TYPE_CHECKING:
    from .plan import StepPlan

__all__ = ["validate_plan", "check_local_slots", "check_remap_slots", "check_routing"]


def validate_plan(plan: "StepPlan") -> None:
    """Check ``plan`` (module docstring); raises :class:`PlanError` naming the first problem."""
    with gc_paused():
        _validate_plan(plan)


def _validate_plan(plan: "StepPlan") -> None:
    world = plan.nodes * plan.gpus_per_node
    if not plan.sequences:
        raise PlanError("the plan has no sequences (an empty batch)")
    for name in ("attention_layout", "linear_layout"):
        layout = getattr(plan, name)
        if len(layout) != world:
            raise PlanError(
                f"{name} has {len(layout)} rank lists but the plan is for "
                f"{plan.nodes} x {plan.gpus_per_node} = {world} ranks"
            )
    gpn = plan.gpus_per_node
    for i, s in enumerate(plan.sequences):
        if s.placement == "local" and len(s.ranks) == 1 and 0 <= s.ranks[0] < world and s.length >= 1:
            continue  # the common case, checked in one line (large batches: a million sequences)
        where = f"sequence {i} (length {s.length}, {s.placement})"
        if s.length < 1:
            raise PlanError(f"{where}: length must be >= 1")
        if len(set(s.ranks)) != len(s.ranks) or not s.ranks:
            raise PlanError(f"{where}: ranks {list(s.ranks)} must be non-empty and distinct")
        for r in s.ranks:
            if not 0 <= r < world:
                raise PlanError(f"{where}: rank {r} is outside [0, {world})")
        nodes = {r // gpn for r in s.ranks}
        if s.placement == "local" and len(s.ranks) != 1:
            raise PlanError(f"{where}: a local sequence has exactly one rank, got {list(s.ranks)}")
        if s.placement == "intra_node" and (len(s.ranks) < 2 or len(nodes) != 1):
            raise PlanError(f"{where}: an intra_node sequence needs >= 2 ranks of one node, got {list(s.ranks)}")
        if s.placement == "inter_node" and len(nodes) < 2:
            raise PlanError(f"{where}: an inter_node sequence needs ranks on >= 2 nodes, got {list(s.ranks)}")
        if s.placement != "local" and s.length < 2 * len(s.ranks):
            raise PlanError(
                f"{where}: too short to split over {len(s.ranks)} ranks "
                f"(zigzag needs >= {2 * len(s.ranks)} tokens)"
            )
    if attention_in_planner_order(plan):  # both attention checks below hold (layout_check.py)
        if plan.linear_layout != plan.attention_layout:  # equal: covered as well
            _check_cover(plan, plan.linear_layout, "linear_layout")
        check_routing(plan)
        return
    att = _check_cover(plan, plan.attention_layout, "attention_layout")
    _check_cover(plan, plan.linear_layout, "linear_layout")
    # Attention layout must follow each sequence's placement.
    for i, s in enumerate(plan.sequences):
        one = att[i]
        held: dict[int, list[tuple[int, int]]]
        if isinstance(one, tuple):  # held as one span (rank, start, end)
            if s.placement == "local" and one == (s.ranks[0], 0, s.length):
                continue
            held = {one[0]: [(one[1], one[2])]}
        else:
            held = one  # rank -> sorted merged ranges
        expected: dict[int, list[tuple[int, int]]]
        if s.placement == "local":
            expected = {s.ranks[0]: [(0, s.length)]}
        else:
            g = len(s.ranks)
            b = chunk_bounds(s.length, g)
            expected = {r: _merge([b[p], b[2 * g - 1 - p]]) for p, r in enumerate(s.ranks)}
        if held != expected:
            what = "the whole sequence on its rank" if s.placement == "local" else \
                f"the zigzag chunks of a ring over ranks {list(s.ranks)} in that order"
            raise PlanError(
                f"attention_layout: sequence {i} (length {s.length}, {s.placement}) is held as "
                f"{ {r: v for r, v in sorted(held.items())} }, expected {what}: "
                f"{ {r: v for r, v in sorted(expected.items())} }"
            )
    check_routing(plan)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _check_cover(
    plan: "StepPlan", layout: Sequence[Sequence[TokenRange]], name: str
) -> list[tuple[int, int, int] | dict[int, list[tuple[int, int]]]]:
    """Every token of every sequence exactly once; returns per sequence its spans: ``(rank, start, end)``
    when it is held in one range (then ``(r, 0, length)``), else rank -> merged spans."""
    n = len(plan.sequences)
    lengths = [s.length for s in plan.sequences]  # each >= 1 (checked before)
    whole = [-1] * n  # the rank of a range [0, length) of the sequence (the first one seen)
    parts: dict[int, list[tuple[int, int, int]]] = {}  # every other range: (start, end, rank)
    for r, ranges in enumerate(layout):
        for seq, start, end in ranges:
            if start == 0 and 0 <= seq < n and end == lengths[seq] and whole[seq] < 0:
                whole[seq] = r  # the common case (a local sequence), checked in one line
                continue
            if not 0 <= seq < n:
                raise PlanError(f"{name}[{r}]: sequence index {seq} is outside [0, {n})")
            length = lengths[seq]
            if not 0 <= start < end <= length:
                raise PlanError(
                    f"{name}[{r}]: range [{start}, {end}) of sequence {seq} is empty or outside [0, {length})"
                )
            if seq in parts:
                parts[seq].append((start, end, r))
            else:
                parts[seq] = [(start, end, r)]
    held: list[tuple[int, int, int] | dict[int, list[tuple[int, int]]]] = []
    for seq in range(n):
        spans = parts.get(seq)
        if spans is None and whole[seq] >= 0:
            held.append((whole[seq], 0, lengths[seq]))
            continue
        spans = spans or []
        if whole[seq] >= 0:
            spans.append((0, lengths[seq], whole[seq]))
        spans.sort()
        pos = 0
        for start, end, _r in spans:
            if start < pos:
                raise PlanError(f"{name}: tokens [{start}, {min(pos, end)}) of sequence {seq} appear twice")
            if start > pos:
                raise PlanError(f"{name}: tokens [{pos}, {start}) of sequence {seq} are missing")
            pos = end
        length = plan.sequences[seq].length
        if pos != length:
            raise PlanError(f"{name}: tokens [{pos}, {length}) of sequence {seq} are missing")
        by_rank: dict[int, list[tuple[int, int]]] = {}
        for start, end, r in spans:
            by_rank.setdefault(r, []).append((start, end))
        held.append({r: _merge(v) for r, v in by_rank.items()})
    return held


def check_local_slots(plan: "StepPlan") -> None:
    """Each slot names a ring step of one of its rank's rings and local sequences of that rank;
    no sequence in two slots, no two slots at one ring step of a rank. Steps: ``0 .. blocks - 2``,
    and ``-1`` (inside the ``heads`` all-to-all) only on a head-parallel ring (``a2a > 1``); a
    Ulysses ring (one block) has only ``-1``."""
    if not plan.local_slots:
        return
    rings = plan.rings
    seen: dict[int, int] = {}
    places: set[tuple[int, int, int]] = set()
    for k, x in enumerate(plan.local_slots):
        where = f"local_slots[{k}] (rank {x.rank}, ring {x.ring}, step {x.step})"
        if not 0 <= x.ring < len(rings):
            raise PlanError(f"{where}: ring index {x.ring} is outside [0, {len(rings)})")
        ranks, steps = rings[x.ring].ranks, rings[x.ring].blocks  # a head-parallel ring steps over its blocks
        if x.rank not in ranks:
            raise PlanError(f"{where}: rank {x.rank} is not a member of ring {list(ranks)}")
        if x.step == -1 and rings[x.ring].a2a == 1:
            raise PlanError(f"{where}: step -1 (inside the heads all-to-all) needs a head-parallel ring, "
                            f"ring {x.ring} is plain (a2a 1): step must be in [0, {steps - 2}]")
        first = -1 if rings[x.ring].a2a > 1 else 0
        if not first <= x.step <= steps - 2:
            raise PlanError(f"{where}: step must be in [{first}, {steps - 2}] for a ring of {steps} positions"
                            + (f" (a2a {rings[x.ring].a2a}; -1: inside its heads all-to-all)" if first < 0 else ""))
        if (x.rank, x.ring, x.step) in places:
            raise PlanError(f"{where}: a second slot at the same ring step of the same rank")
        places.add((x.rank, x.ring, x.step))
        if not x.seqs:
            raise PlanError(f"{where}: no sequences")
        for i in x.seqs:
            if not 0 <= i < len(plan.sequences):
                raise PlanError(f"{where}: sequence index {i} is outside [0, {len(plan.sequences)})")
            s = plan.sequences[i]
            if s.placement != "local" or s.ranks != (x.rank,):
                raise PlanError(f"{where}: sequence {i} ({s.placement} on ranks {list(s.ranks)}) is not a local "
                                f"sequence of rank {x.rank}")
            if i in seen:
                raise PlanError(f"{where}: sequence {i} is already in local_slots[{seen[i]}]")
            seen[i] = k


def check_remap_slots(plan: "StepPlan") -> None:
    """Each remap slot names a rank, a direction (``to_attention`` | ``to_linear``) and local sequences of
    that rank that stay on it (the rank's linear layout holds each whole, as ``(seq, 0, length)``); no
    sequence in two slots or also in ``local_slots``; at most one slot per rank and direction; the plan's
    remap moves rows (otherwise there is no exchange to overlap).

    Example: sequence 4 (10 tokens) local on rank 1, whose linear ranges are ``((4, 0, 6), (2, 0, 3))``:
    ``RemapSlot(1, "to_attention", (4,))`` fails (rows 6..10 of sequence 4 are on another rank)."""
    if not plan.remap_slots:
        return
    if plan.linear_layout == plan.attention_layout:
        raise PlanError(f"remap_slots given ({len(plan.remap_slots)}) but the linear layout is the attention "
                        f"layout: no exchange to overlap")
    world = plan.world_size
    slotted = {i for x in plan.local_slots for i in x.seqs}
    seen: dict[int, int] = {}
    places: set[tuple[int, str]] = set()
    for k, x in enumerate(plan.remap_slots):
        where = f"remap_slots[{k}] (rank {x.rank}, {x.direction})"
        if not (isinstance(x.rank, int) and 0 <= x.rank < world):
            raise PlanError(f"{where}: rank {x.rank!r} is outside [0, {world})")
        if x.direction not in REMAP_DIRECTIONS:
            raise PlanError(f"{where}: direction {x.direction!r}, expected one of {list(REMAP_DIRECTIONS)}")
        if (x.rank, x.direction) in places:
            raise PlanError(f"{where}: a second slot of rank {x.rank} in {x.direction}")
        places.add((x.rank, x.direction))
        if not x.seqs:
            raise PlanError(f"{where}: no sequences")
        linear = set(plan.linear_layout[x.rank])
        for i in x.seqs:
            if not (isinstance(i, int) and 0 <= i < len(plan.sequences)):
                raise PlanError(f"{where}: sequence index {i!r} is outside [0, {len(plan.sequences)})")
            s = plan.sequences[i]
            if s.placement != "local" or s.ranks != (x.rank,):
                raise PlanError(f"{where}: sequence {i} ({s.placement} on ranks {list(s.ranks)}) is not a local "
                                f"sequence of rank {x.rank}")
            if (i, 0, s.length) not in linear:
                raise PlanError(f"{where}: sequence {i} ({s.length} tokens) is not whole on rank {x.rank} in the "
                                f"linear layout, so its rows move in the remap")
            if i in slotted:
                raise PlanError(f"{where}: sequence {i} is also in local_slots")
            if i in seen:
                raise PlanError(f"{where}: sequence {i} is already in remap_slots[{seen[i]}]")
            seen[i] = k


def check_routing(plan: "StepPlan") -> None:
    gpn = plan.gpus_per_node
    rings = {r.ranks: r for r in plan.rings} if plan.routing else {}  # no routes: nothing to look up
    seen: set[tuple[tuple[int, ...], int, int]] = set()
    following: dict[tuple[int, ...], dict[int, int]] = {}
    for k, route in enumerate(plan.routing):
        where = f"routing[{k}]"
        if route.ring not in rings:
            raise PlanError(f"{where}: ring {list(route.ring)} is not a ring of this plan")
        ring = route.ring
        nxt = following.get(ring)
        if nxt is None:  # each rank's successor on the ring, once per ring
            nxt = following[ring] = {ring[i]: ring[next_position(i, len(ring))] for i in range(len(ring))}
        if nxt.get(route.src) != route.dst or route.src // gpn == route.dst // gpn:
            raise PlanError(f"{where}: {route.src} -> {route.dst} is not a cross-node hop of ring {list(ring)}")
        key = (ring, route.src, route.dst)
        if key in seen:
            raise PlanError(f"{where}: hop {route.src} -> {route.dst} of ring {list(ring)} is routed twice")
        seen.add(key)
        if not route.proxies or route.proxies[0] != route.src % gpn:
            raise PlanError(f"{where}: proxies must start with the source's local index {route.src % gpn}")
        if len(set(route.proxies)) != len(route.proxies) or not all(
            isinstance(p, int) and 0 <= p < gpn for p in route.proxies
        ):
            raise PlanError(f"{where}: proxies {list(route.proxies)} must be distinct local indices in [0, {gpn})")
