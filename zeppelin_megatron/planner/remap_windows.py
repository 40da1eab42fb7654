"""Remap windows: staying local sequences computed while a layout exchange is in flight.

Each layer moves rows from the linear to the attention layout (``to_attention``, the remap in)
and back (``to_linear``, the remap out). A rank waits in each exchange until the rows it sends,
receives or relays have arrived (``sim/program.py``; :func:`~.remap_cost.remap_ranks`). A local
sequence of the rank that is whole on the rank in the linear layout too (*staying*) needs none of
those rows: its q/k/v are in the rank's linear buffers, and its output goes to its linear rows.
So the rank can compute it between posting an exchange and waiting for it (the runtime's
``Post`` / ``Wait``, :class:`~.lowering.WindowCall`): a :class:`~.plan.RemapSlot`.

1. :func:`window_ms` estimates, per rank and direction, how long the exchange keeps the rank
   waiting: every moved row follows the runtime's path (inside a node one NVLink leg; across
   nodes direct, the source's NIC to its rail GPU at the destination node, then NVLink; routed,
   ``a -> P_a`` NVLink, ``P_a -> P_b`` the proxy's NIC, ``P_b -> b`` NVLink, rows split over the
   proxies as :func:`~.remap_routing.proxy_parts`); a leg lasts its busiest port's load (all the
   exchange's rows through that port, ``2 q + kv`` bytes each) over the port's bandwidth, a
   chain's legs one after another; the rank's window ends with the last leg it sends or
   receives. Contention beyond port sharing and partners that post late are not counted, so
   the estimate is on the short side (a call that fits it delays nothing in the model).
2. :func:`remap_slots` fills each rank's two windows with its staying sequences, best fit,
   largest first: first the sequences that would run after the rings (each one moved hides all
   of its time), then those in ring slots (moving one frees its ring gap; worth it where the slot
   overflowed). A call (``max(sum local_ms, overhead)``) goes only where it fits the window, so
   a window never delays the rank's rings or its share of the exchange.

Worked example, 1 node x 2 GPUs, NVLink 1 byte/ms, ``2 q + kv = 1`` byte per row: rank 0 sends
6 rows to rank 1; both windows of both ranks are 6 ms. Rank 1's staying sequence 3
(``local_ms`` 4 ms) goes to its ``to_attention`` window (4 <= 6, least room left among the two),
a second one of 5 ms to ``to_linear``.

Pure and deterministic (float arithmetic in a fixed order, explicit tie-breaks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .plan import LocalSlot, RemapSlot, StepPlan
from .remap_cost import remap_pairs
from .remap_routing import proxy_parts

if TYPE_CHECKING:
    from .cost_model import CostModel

__all__ = ["window_ms", "staying_sequences", "remap_slots", "with_remap_windows"]

_Leg = tuple[int, int, tuple[tuple[str, int], ...], int]  # (src rank, dst rank, ports, rows)


def _chains(pairs: Sequence[tuple[int, int, int]], gpus_per_node: int, gpu_nic: Sequence[int],
            proxies: Sequence[int]) -> list[list[_Leg]]:
    """The legs of every moved row's path (module docstring), chain by chain; ports are
    ``("nvl_out" | "nvl_in", rank)`` and ``("nic_out" | "nic_in", node * nics + nic)``."""
    g = gpus_per_node
    nics = max(gpu_nic) + 1

    def nvl(a: int, b: int, n: int) -> _Leg:
        return (a, b, (("nvl_out", a), ("nvl_in", b)), n)

    def nic(a: int, b: int, n: int) -> _Leg:
        x = gpu_nic[a % g]
        return (a, b, (("nic_out", (a // g) * nics + x), ("nic_in", (b // g) * nics + x)), n)

    out: list[list[_Leg]] = []
    for a, b, n in pairs:
        na, nb = a // g, b // g
        if na == nb:
            out.append([nvl(a, b, n)])
        elif not proxies:
            rail = nb * g + a % g
            out.append([nic(a, rail, n)] + ([nvl(rail, b, n)] if rail != b else []))
        else:
            for _, rows, pa, pb in proxy_parts(a, b, n, g, tuple(proxies)):
                chain = ([nvl(a, pa, rows)] if pa != a else []) + [nic(pa, pb, rows)]
                out.append(chain + ([nvl(pb, b, rows)] if pb != b else []))
    return out


def window_ms(plan: StepPlan, cost: "CostModel") -> tuple[list[float], list[float]]:
    """``(to_attention, to_linear)``: per rank, the estimated ms it waits in each exchange of one
    layer (module docstring, step 1); 0 for a rank no moved row touches, all 0 without a remap.

    Example (2 nodes x 1 GPU, one NIC each): 10 rows ``0 -> 1``: both ranks wait
    ``nic_ms(10 * (2 q + kv))`` in each direction.
    """
    world = plan.world_size
    pairs = remap_pairs(plan)
    result: list[list[float]] = []
    cl = cost.cluster
    per_row = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    for moving in (pairs, [(b, a, n) for a, b, n in pairs]):
        chains = _chains(moving, cl.gpus_per_node, cl.gpu_nic, plan.remap_proxies)
        load: dict[tuple[str, int], int] = {}
        for chain in chains:
            for _, _, ports, n in chain:
                for port in ports:
                    load[port] = load.get(port, 0) + n
        wait = [0.0] * world
        for chain in chains:
            end = 0.0
            for src, dst, ports, _ in chain:
                busiest = max(load[p] for p in ports) * per_row
                end += cost.nic_ms(busiest) if ports[0][0] == "nic_out" else cost.nvlink_ms(busiest)
                wait[src] = max(wait[src], end)
                wait[dst] = max(wait[dst], end)
        result.append(wait)
    return result[0], result[1]


def staying_sequences(plan: StepPlan) -> dict[int, list[int]]:
    """Per rank, its local sequences that are whole on it in the linear layout (ascending)."""
    whole: set[tuple[int, int, int]] = set()
    for r, ranges in enumerate(plan.linear_layout):
        for i, a, b in ranges:
            if a == 0 and b == plan.sequences[i].length:
                whole.add((r, i, b))
    out: dict[int, list[int]] = {}
    for i, s in enumerate(plan.sequences):
        if s.placement == "local" and (s.ranks[0], i, s.length) in whole:
            out.setdefault(s.ranks[0], []).append(i)
    return out


def remap_slots(plan: StepPlan, cost: "CostModel") -> tuple[tuple[RemapSlot, ...], tuple[LocalSlot, ...]]:
    """``(remap slots, local slots without the sequences moved into them)`` (module docstring, step 2);
    ``((), plan.local_slots)`` when the plan has no remap."""
    if plan.linear_layout == plan.attention_layout or not remap_pairs(plan):
        return (), plan.local_slots
    o = cost.call_overhead_ms
    gap_in, gap_out = window_ms(plan, cost)
    slot_of = {i: k for k, x in enumerate(plan.local_slots) for i in x.seqs}
    moved: set[int] = set()
    out: list[RemapSlot] = []
    for r, seqs in sorted(staying_sequences(plan).items()):
        gaps = {"to_attention": gap_in[r], "to_linear": gap_out[r]}
        if max(gaps.values()) <= o:
            continue
        ms = {i: cost.local_ms(plan.sequences[i].length) for i in seqs}
        order = sorted(seqs, key=lambda i: (i in slot_of, -ms[i], i))  # after-the-rings first, then largest
        used = {d: 0.0 for d in gaps}
        chosen: dict[str, list[int]] = {d: [] for d in gaps}
        for i in order:
            best: tuple[float, int, str] | None = None
            for n, (d, gap) in enumerate(gaps.items()):
                room = gap - max(used[d] + ms[i], o)
                if room >= 0 and (best is None or (room, n) < best[:2]):
                    best = (room, n, d)
            if best is not None:
                used[best[2]] += ms[i]
                chosen[best[2]].append(i)
                moved.add(i)
        out += [RemapSlot(r, d, tuple(sorted(v))) for d, v in chosen.items() if v]
    slots = tuple(x if not moved.intersection(x.seqs) else LocalSlot(x.rank, x.ring, x.step,
                                                                     tuple(i for i in x.seqs if i not in moved))
                  for x in plan.local_slots)
    return tuple(out), tuple(x for x in slots if x.seqs)


def with_remap_windows(plan: StepPlan, cost: "CostModel") -> StepPlan:
    """``plan`` with :func:`remap_slots` (and its local slots without the moved sequences)."""
    windows, slots = remap_slots(plan, cost)
    if not windows:
        return plan
    return plan.evolve(remap_slots=windows, local_slots=slots)
