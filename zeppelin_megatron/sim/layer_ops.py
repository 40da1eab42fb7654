"""The simulated layer's vocabulary: compute ops, posts and waits, and the transfers they name.

Every layer program (Zeppelin's, :mod:`.program`; the non-ring baselines', :mod:`.group_programs`; the peers',
:mod:`.peer_programs`) is per-rank lists of :class:`Op` and a dict of :class:`Traffic` (named sets of chains of
:class:`Leg`: one flow each) that :mod:`.simulator` runs. Example: ``pairs_transfer(("x",), "group", cost,
{(0, 9): 4e6})`` on 8 GPUs per node is two chains: ``[Leg(0, 8, 4e6, "nic")]`` (rank 0 to the rail-aligned
GPU 8 of node 1) and, once it is done (``after``), ``[Leg(8, 9, 4e6, "nvl")]``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal, Mapping

from ..planner.cost_model import CostModel

__all__ = ["Link", "Leg", "Traffic", "Op", "LayerProgram", "hop", "nic_ports", "pairs_transfer"]

Link = Literal["nvl", "nic"]


@dataclass(frozen=True)
class Leg:
    """One flow of a chain: ``nbytes`` from ``src`` to ``dst`` over ``link``; ``messages``: the point-to-point
    messages it stands for, sent back to back between the same two ranks (NCCL runs a group's operations to
    one peer in order), each paying the link latency: the flow waits ``messages x`` the latency."""

    src: int
    dst: int
    nbytes: float
    link: Link
    messages: int = 1


@dataclass
class Traffic:
    """Named set of hop chains (``category``: ``ring``, ``relay``, ``remap``, ``group``)."""

    key: tuple
    category: str
    chains: list[list[Leg]] = field(default_factory=list)
    after: dict[int, int] = field(default_factory=dict)
    """Chain ``c`` starts only when chain ``after[c]`` has finished (fan-out after a shared hop)."""


@dataclass(frozen=True)
class Op:
    """``compute`` (``ms``, ``kind``), ``post`` or ``wait`` (``key``), or ``local``: the rank's
    local queue (whatever is left of it) as one call."""

    what: Literal["compute", "post", "wait", "local"]
    ms: float = 0.0
    kind: str = ""
    key: tuple = ()
    label: str = ""


@dataclass
class LayerProgram:
    """Per-rank ops, the transfers they name, and each rank's local queue (kernel ms per
    local sequence, longest first)."""

    ops: list[list[Op]]
    transfers: dict[tuple, Traffic]
    local_queue: list[list[float]] = field(default_factory=list)

    def local_queues(self) -> list[list[float]]:
        """Each rank's local queue (empty ones when the program has none), one list per rank of ``ops``."""
        return list(self.local_queue) or [[] for _ in self.ops]


def nic_ports(cost: CostModel, leg: Leg) -> tuple[tuple[str, int, int], tuple[str, int, int]]:
    """The NIC ports a network leg goes out of and into: ``("nic_out", node, nic)`` of its source GPU's NIC and
    ``("nic_in", node, nic)`` of its destination's (``cluster.gpu_nic``: GPUs that share a NIC share its ports).
    The one mapping of a hop to its ports: the simulator's flows, its byte counts and :mod:`.periodic`'s
    components use it. Example (8 GPUs and 8 NICs per node): ``Leg(3, 11, b, "nic")`` -> ``(("nic_out", 0, 3),
    ("nic_in", 1, 3))``."""
    cl = cost.cluster
    return ("nic_out", cl.node_of(leg.src), cl.nic_of(leg.src)), ("nic_in", cl.node_of(leg.dst), cl.nic_of(leg.dst))


def hop(cost: CostModel, src: int, dst: int, nbytes: float, messages: int = 1) -> Leg:
    cl = cost.cluster
    return Leg(src, dst, float(nbytes), "nvl" if cl.node_of(src) == cl.node_of(dst) else "nic", messages)


def pairs_transfer(key: tuple, category: str, cost: CostModel,
                    pair_bytes: Mapping[tuple[int, int], float]) -> Traffic:
    """One hop per pair, except that a rank's bytes to all GPUs of another node go as one NIC
    hop to the rail-aligned GPU there and on over NVLink (NCCL's PXN-style all-to-all):
    ``src -> (node(dst), local(src))`` carries the sum, then one NVLink hop per final GPU.
    Keeps a 128-rank all-to-all at ``128 x (nodes + 7)`` flows instead of ``128^2``.
    """
    cl = cost.cluster
    t = Traffic(key, category)
    remote: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    for (a, b), nbytes in sorted(pair_bytes.items()):
        if a == b or nbytes <= 0:
            continue
        if cl.node_of(a) == cl.node_of(b):
            t.chains.append([Leg(a, b, float(nbytes), "nvl")])
        else:
            remote[(a, cl.node_of(b))].append((b, float(nbytes)))
    for (a, node), items in sorted(remote.items()):
        rail = cl.rank_of(node, cl.local_of(a))
        total = sum(n for _, n in items)
        head = len(t.chains)
        t.chains.append([Leg(a, rail, total, "nic")])
        for b, n in items:
            if b != rail:
                t.after[len(t.chains)] = head
                t.chains.append([Leg(rail, b, n, "nvl")])
    return t
