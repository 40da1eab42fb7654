"""The remap's time per layer, link by link, as the simulator and the runtime move its rows.

The remap runs twice per layer: *in* (linear -> attention layout) before attention and *out*
(attention -> linear) after it. Each moved row carries ``2 q + kv`` bytes each time (in: forward
q, k, v and backward output gradient; out: forward output and backward dq, dk, dv), and the two
are separate all-to-alls with attention between them, so their times add up.

Within one all-to-all every link carries its rows at once and the slowest link ends it::

    t(direction) = max(nvlink_ms(max NVLink port rows * b), nic_ms(max NIC port rows * b)),
    b = 2 q_bytes + kv_bytes,   layer remap = t(in) + t(out)

with a port per direction (a GPU's NVLink out and in, a NIC's out and in). Rows take the paths
the runtime and ``sim/program.py`` give them:

* inside a node: one NVLink hop ``a -> b``;
* across nodes, direct (``proxies = ()``): ``a``'s NIC to the GPU of ``b``'s node on ``a``'s
  rail (same local index), then NVLink to ``b`` (NCCL's PXN all-to-all): every row a node
  receives from local index ``l`` of other nodes enters through the NIC of its GPU ``l``;
* routed (``proxies``, :mod:`~.remap_routing`): each pair's rows split over the proxies
  (:func:`~.remap_routing.proxy_parts`), ``a -> P_a`` (NVLink), ``P_a -> P_b`` (the proxy's
  NIC), ``P_b -> b`` (NVLink).

Worked example, 2 nodes x 2 GPUs (one NIC per GPU): rank 0 sends 10 rows to rank 3 and rank 2
sends 4 rows to rank 1. In, direct: ``0 -> 2`` over NIC (0, 0) out and NIC (1, 0) in (rank 2
is local 0 of node 1), then ``2 -> 3`` over NVLink; ``2 -> 1`` over NIC (1, 0) out and NIC
(0, 0) in, then ``0 -> 1``. Busiest NIC port: 10 rows; busiest NVLink port: 10 rows. Out moves
the rows back: ``3 -> 0`` over NIC (1, 1) out and NIC (0, 1) in (rank 1 is local 1 of node 0),
then ``1 -> 0``; ``1 -> 2`` over NIC (0, 1) out and NIC (1, 1) in, then ``3 -> 2``: the busiest
ports carry 10 rows again, and the layer's remap is twice one direction's time.

An earlier rule (``nvlink(intra) + nic(out + in)`` per rank, once per layer) charged about half
of this, and none of the rail concentration (simulated remap 1.7-6x that rule on the plans of
``benchmarks/simulate_tables.py``; this one within about 20%).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .remap_routing import nic_proxies

if TYPE_CHECKING:
    from .cost_model import CostModel
    from .plan import StepPlan

__all__ = ["remap_pairs", "port_rows", "remap_layer_ms", "remap_ranks", "remap_links", "remap_couples",
           "coupled_ms", "remap_proxies_for"]


_PAIRS: dict[tuple[int, int], tuple[object, object, list[tuple[int, int, int]]]] = {}
"""Recent :func:`remap_pairs` by the layouts' identities (the layouts are kept in the value, so an id
is never reused while its entry lives): a step's candidates predict the same layouts several times."""


def remap_pairs(plan: "StepPlan") -> list[tuple[int, int, int]]:
    """Rows the *in* remap moves, ``(linear rank, attention rank, rows)`` per pair of distinct ranks,
    sorted; the *out* remap moves the same rows back. Empty when the layouts are equal.

    Example: linear ``[[(0, 0, 4)], []]``, attention ``[[(0, 0, 1)], [(0, 1, 4)]]``: ``[(0, 1, 3)]``.
    """
    lin, att = plan.linear_layout, plan.attention_layout
    hit = _PAIRS.get((id(lin), id(att)))
    if hit is not None and hit[0] is lin and hit[1] is att:
        return hit[2]
    if lin == att:
        return []
    pairs = list(plan.remap_pairs)
    if len(_PAIRS) >= 8:
        _PAIRS.pop(next(iter(_PAIRS)))
    _PAIRS[(id(lin), id(att))] = (lin, att, pairs)
    return pairs


def port_rows(pairs: Sequence[tuple[int, int, int]], gpus_per_node: int, gpu_nic: Sequence[int],
              proxies: Sequence[int]) -> tuple[int, int]:
    """``(busiest NVLink port, busiest NIC port)`` in rows for one all-to-all moving ``pairs``
    (``(src, dst, rows)``) along the paths of the module docstring. ``gpu_nic[l]``: the NIC of
    local GPU ``l`` (GPUs sharing a NIC share its ports).

    Example: 2 nodes x 2 GPUs, ``gpu_nic = (0, 1)``, pairs ``[(0, 3, 10)]``: direct ``(10, 10)``
    (NVLink ``2 -> 3`` after the NIC); over proxies ``(0, 1)``: ``(5, 5)`` (rows split 5 + 5, each
    NIC carries 5, NVLink ``0 -> 1`` and ``2 -> 3`` 5 each).
    """
    if not pairs:
        return 0, 0
    g = gpus_per_node
    nic_of = np.asarray(gpu_nic, dtype=np.int64)
    nics = int(nic_of.max()) + 1
    a, b, n = (np.asarray(col, dtype=np.int64) for col in zip(*pairs))
    na, nb = a // g, b // g
    nodes = int(max(na.max(), nb.max())) + 1
    world = nodes * g
    nvl_out = np.zeros(world, dtype=np.int64)
    nvl_in = np.zeros(world, dtype=np.int64)
    nic_out = np.zeros(nodes * nics, dtype=np.int64)
    nic_in = np.zeros(nodes * nics, dtype=np.int64)

    def nvl(src: np.ndarray, dst: np.ndarray, rows: np.ndarray) -> None:
        moved = src != dst
        np.add.at(nvl_out, src[moved], rows[moved])
        np.add.at(nvl_in, dst[moved], rows[moved])

    local = na == nb
    nvl(a[local], b[local], n[local])
    a, b, n, na, nb = a[~local], b[~local], n[~local], na[~local], nb[~local]
    if not len(proxies):
        nic = nic_of[a % g]
        np.add.at(nic_out, na * nics + nic, n)
        np.add.at(nic_in, nb * nics + nic, n)
        nvl(nb * g + a % g, b, n)  # on from the rail GPU
    else:
        k = len(proxies)
        base, extra = n // k, n % k  # split_counts: the first ``extra`` parts one row more
        for p, x in enumerate(proxies):
            part = base + (p < extra)
            pa, pb = na * g + x, nb * g + x
            nvl(a, pa, part)
            np.add.at(nic_out, na * nics + int(nic_of[x]), part)
            np.add.at(nic_in, nb * nics + int(nic_of[x]), part)
            nvl(pb, b, part)
    return int(max(nvl_out.max(), nvl_in.max())), int(max(nic_out.max(), nic_in.max()))

def remap_ranks(plan: "StepPlan", proxies: Sequence[int]) -> set[int]:
    """Every rank on a path of the remap's rows (module docstring), in either direction: the rows' sources
    and destinations and the GPUs that relay them (the rail GPU of a direct cross-node row, the proxies of
    a routed one). A rank outside this set waits for nobody at the remap; one inside waits for the legs it
    sends, receives or relays (``sim/program.py``).

    Example: 2 nodes x 2 GPUs, rows ``0 -> 3`` only: direct ``{0, 2, 3}`` in (rail GPU 2) and ``{3, 1, 0}``
    out (rail GPU 1): ``{0, 1, 2, 3}``; nothing moved: ``set()``. Every rank of :func:`remap_links`, the one
    derivation of the paths.
    """
    src, dst = remap_links(plan, proxies)
    return set(np.unique(np.concatenate([src.ravel(), dst.ravel()])).tolist())


def remap_layer_ms(plan: "StepPlan", cost: "CostModel", proxies: Sequence[int],
                   pairs: Sequence[tuple[int, int, int]] | None = None) -> float:
    """The remap's time per layer (in + out, module docstring); 0 without a remap.

    ``pairs``: :func:`remap_pairs` of ``plan`` when the caller has them (they depend only on the
    layouts, not on ``proxies``).
    """
    if pairs is None:
        pairs = remap_pairs(plan)
    if not pairs:
        return 0.0
    key = (id(pairs), id(cost), tuple(proxies))
    hit = _MS.get(key)
    if hit is not None and hit[0] is pairs and hit[1] is cost:
        return hit[2]
    ms = _layer_ms(pairs, cost, proxies)
    if len(_MS) >= 16:
        _MS.pop(next(iter(_MS)))
    _MS[key] = (pairs, cost, ms)
    return ms


_MS: dict[tuple[int, int, tuple[int, ...]], tuple[object, object, float]] = {}
"""Recent :func:`remap_layer_ms` results (pairs and cost model kept alive in the value, as in ``_PAIRS``)."""


def _layer_ms(pairs: Sequence[tuple[int, int, int]], cost: "CostModel", proxies: Sequence[int]) -> float:
    cl = cost.cluster
    per_row = 2 * cost.q_bytes_per_token + cost.kv_bytes_per_token
    total = 0.0
    for moving in (pairs, [(b, a, n) for a, b, n in pairs]):  # in, then out (the same rows back)
        nvl, nic = port_rows(moving, cl.gpus_per_node, cl.gpu_nic, proxies)
        total += max(cost.nvlink_ms(nvl * per_row) if nvl else 0.0, cost.nic_ms(nic * per_row) if nic else 0.0)
    return total


def remap_links(plan: "StepPlan", proxies: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)``, int arrays ``[pairs, k]``: per moved pair ``a -> b`` (:func:`remap_pairs` order), the ranks
    on its source side and on its destination side, ``a`` / ``b`` and the relays on its paths (the rail GPUs
    of a direct cross-node row, ``P_a`` and ``P_b`` of each proxy part of a routed one), padded with ``a`` /
    ``b``. Relays sit on both sides (a relay posts its part after its own work, whichever direction).
    Empty (shape ``[0, 1]``) without moved rows.

    Example: 2 nodes x 2 GPUs, rows ``0 -> 3``, direct: ``src = [[0, 2, 1]]``, ``dst = [[3, 2, 1]]`` (in: 0's rail
    at node 1 is 2; out: 3's rail at node 0 is 1); rows ``0 -> 1`` only: ``[[0, 0, 0]]``, ``[[1, 1, 1]]``.
    """
    lin, att = plan.linear_layout, plan.attention_layout
    key = (id(lin), id(att), tuple(proxies), plan.gpus_per_node)
    hit = _LINKS.get(key)
    if hit is not None and hit[0] is lin and hit[1] is att:
        return hit[2]
    out = _links(remap_pairs(plan), plan.gpus_per_node, proxies)
    if len(_LINKS) >= 8:
        _LINKS.pop(next(iter(_LINKS)))
    _LINKS[key] = (lin, att, out)
    return out


_LINKS: dict[tuple[int, int, tuple[int, ...], int], tuple[object, object, tuple[np.ndarray, np.ndarray]]] = {}
"""Recent :func:`remap_links` by the layouts' identities (kept in the value, as :data:`_PAIRS`), the proxies
and the node size: ``predict`` asks twice per plan (the ranks on the paths, the coupled pairs)."""


def _links(pairs: Sequence[tuple[int, int, int]], g: int, proxies: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`remap_links` of the moved ``pairs`` on nodes of ``g`` GPUs."""
    if not pairs:
        return np.zeros((0, 1), dtype=np.int64), np.zeros((0, 1), dtype=np.int64)
    a, b, n = (np.asarray(col, dtype=np.int64) for col in zip(*pairs))
    na, nb = a // g, b // g
    cross = na != nb
    relays = []
    if not len(proxies):
        relays = [nb * g + a % g, na * g + b % g]  # in: a's rail at b's node; out: b's rail at a's node
    else:
        for j, x in enumerate(proxies):  # the parts with rows: the first min(n, k)
            part = cross & (n > j)
            relays += [np.where(part, na * g + x, -1), np.where(part, nb * g + x, -1)]
    src = np.stack([a] + [np.where(cross & (r >= 0), r, a) for r in relays], axis=1)
    dst = np.stack([b] + [np.where(cross & (r >= 0), r, b) for r in relays], axis=1)
    return src, dst


def remap_couples(plan: "StepPlan", proxies: Sequence[int]) -> set[tuple[int, int]]:
    """``(s, r)``: rank ``r``'s attention waits for rank ``s``'s linear modules at the remap in, or ``s``'s
    linear modules wait for ``r``'s attention at the remap out, because a row moves between them or through
    a relay on its path: for every moved pair, every source-side rank with every destination-side rank of
    :func:`remap_links`. :func:`~.predict.predict` takes the layer time over these pairs
    (:func:`coupled_ms`, without building the set).

    Example: 2 nodes x 2 GPUs, rows ``0 -> 3`` only, direct: ``{0, 2, 1} x {3, 2, 1}``, nine pairs; rows
    ``0 -> 1`` only: ``{(0, 1)}``.
    """
    src, dst = remap_links(plan, proxies)
    return {(int(x), int(y)) for s_row, d_row in zip(src, dst) for x in s_row for y in d_row}


def coupled_ms(plan: "StepPlan", proxies: Sequence[int], before: Sequence[float], attn: Sequence[float]) -> float:
    """``max over (s, r) in remap_couples of before[s] + attn[r]`` (0 without moved rows): per moved pair, its
    source side's largest ``before`` plus its destination side's largest ``attn`` (:func:`remap_links`)."""
    src, dst = remap_links(plan, proxies)
    if not len(src):
        return 0.0
    return float((np.asarray(before)[src].max(axis=1) + np.asarray(attn)[dst].max(axis=1)).max())


def remap_proxies_for(plan: "StepPlan", cost: "CostModel") -> tuple[int, ...]:
    """The proxies ``plan``'s remap should use: :func:`~.remap_routing.nic_proxies` of the cluster when
    the routed remap is predicted faster than the direct one (:func:`remap_layer_ms`; only when rows
    cross nodes and a node has more than one NIC), else ``()`` (direct; also on a tie)."""
    proxies = nic_proxies(cost.cluster.gpu_nic)
    if len(proxies) < 2:
        return ()
    pairs = remap_pairs(plan)
    if not any(a // plan.gpus_per_node != b // plan.gpus_per_node for a, b, _ in pairs):
        return ()
    return proxies if remap_layer_ms(plan, cost, proxies, pairs) < remap_layer_ms(plan, cost, (), pairs) else ()
