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
6 rows to rank 1; both windows of both ranks are 6 ms. Rank 1's staying sequences of 5 and 4 ms
(``local_ms``, above the overhead): the 5 ms one (largest first) goes to ``to_attention`` (equal
room: the first window), the 4 ms one no longer fits there (9 > 6) and goes to ``to_linear``.

Pure and deterministic (float arithmetic in a fixed order, explicit tie-breaks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .plan import LocalSlot, RemapSlot, StepPlan
from .remap_cost import remap_pairs

if TYPE_CHECKING:
    from .cost_model import CostModel

__all__ = ["window_ms", "staying_rows", "staying_sequences", "remap_slots", "with_remap_windows"]

def _direction_wait(pairs: Sequence[tuple[int, int, int]], cost: "CostModel", proxies: Sequence[int],
                    world: int) -> list[float]:
    """Per rank, when the last leg it sends or receives ends in one exchange moving ``pairs``
    (``(src, dst, rows)``; module docstring, step 1). Vectorised over pairs: legs are arrays of
    ``(src, dst, rows, out port, in port)``, ports numbered NVLink out ``[0, W)``, NVLink in
    ``[W, 2W)``, NIC out ``[2W, 2W + P)``, NIC in ``[2W + P, 2W + 2P)`` (``P = nodes * nics``)."""
    cl = cost.cluster
    g = cl.gpus_per_node
    nic_of = np.asarray(cl.gpu_nic, dtype=np.int64)
    nics = int(nic_of.max()) + 1
    nports = world // g * nics
    per_row = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    a, b, n = (np.asarray(col, dtype=np.int64) for col in zip(*pairs))
    na, nb = a // g, b // g
    legs: list[list[tuple[np.ndarray, ...]]] = []  # chains of equal shape: [leg 1, leg 2, ...]

    def nvl(src: np.ndarray, dst: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        return src, dst, rows, src, world + dst

    def nic(src: np.ndarray, dst: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        x = nic_of[src % g]
        return src, dst, rows, 2 * world + (src // g) * nics + x, 2 * world + nports + (dst // g) * nics + x

    local = na == nb
    legs.append([nvl(a[local], b[local], n[local])])
    a, b, n, na, nb = a[~local], b[~local], n[~local], na[~local], nb[~local]
    if not proxies:
        rail = nb * g + a % g
        legs.append([nic(a, rail, n), nvl(rail, b, n)])  # rail == b: an empty NVLink leg (0 ms, same end)
    else:
        k = len(proxies)
        for p, x in enumerate(proxies):  # split_counts: the first n % k parts one row more
            part = n // k + (p < n % k)
            pa, pb = na * g + x, nb * g + x
            legs.append([nvl(a, pa, part), nic(pa, pb, part), nvl(pb, b, part)])
    load = np.zeros(2 * world + 2 * nports, dtype=np.int64)
    for chain in legs:
        for src, dst, rows, po, pi in chain:
            moved = src != dst
            np.add.at(load, po[moved], rows[moved])
            np.add.at(load, pi[moved], rows[moved])
    port_ms = np.zeros(len(load))
    for i in np.flatnonzero(load):
        nbytes = float(load[i]) * per_row
        port_ms[i] = cost.nvlink_ms(nbytes) if i < 2 * world else cost.nic_ms(nbytes)
    wait = np.zeros(world)
    for chain in legs:
        end = np.zeros(len(chain[0][0]))
        for src, dst, rows, po, pi in chain:
            moved = (src != dst) & (rows > 0)
            end = end + np.where(moved, np.maximum(port_ms[po], port_ms[pi]), 0.0)
            np.maximum.at(wait, src[moved], end[moved])
            np.maximum.at(wait, dst[moved], end[moved])
    return [float(x) for x in wait]


def window_ms(plan: StepPlan, cost: "CostModel") -> tuple[list[float], list[float]]:
    """``(to_attention, to_linear)``: per rank, the estimated ms it waits in each exchange of one
    layer (module docstring, step 1); 0 for a rank no moved row touches, all 0 without a remap.

    Example (2 nodes x 1 GPU, one NIC each): 10 rows ``0 -> 1``: both ranks wait
    ``nic_ms(10 * (2 q + kv))`` in each direction.
    """
    world = plan.world_size
    pairs = remap_pairs(plan)
    if not pairs:
        return [0.0] * world, [0.0] * world
    back = [(b, a, n) for a, b, n in pairs]
    return (_direction_wait(pairs, cost, plan.remap_proxies, world),
            _direction_wait(back, cost, plan.remap_proxies, world))


def staying_rows(plan: StepPlan) -> dict[int, dict[int, tuple[int, int]]]:
    """Per rank, ``seq -> [start, end)``: the rows in the rank's linear buffer of each of its local sequences
    that is whole on it in the linear layout too (a *staying* sequence), in linear-buffer order. The one
    derivation the lowering (``LocalChunk.linear_rows``), the windows and the prediction share.

    Example: sequence 4 (5 tokens) local on rank 1, whose linear ranges are ``((2, 3, 9), (4, 0, 5))``:
    ``{1: {4: (6, 11)}}``.
    """
    out: dict[int, dict[int, tuple[int, int]]] = {}
    seqs = plan.sequences
    for r, ranges in enumerate(plan.linear_layout):
        row = 0
        for i, a, b in ranges:
            s = seqs[i]
            if a == 0 and b == s.length and s.placement == "local" and s.ranks[0] == r:
                out.setdefault(r, {})[i] = (row, row + b)
            row += b - a
    return out


def staying_sequences(plan: StepPlan) -> dict[int, list[int]]:
    """Per rank, its staying local sequences (:func:`staying_rows`), ascending."""
    return {r: sorted(rows) for r, rows in staying_rows(plan).items()}


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
