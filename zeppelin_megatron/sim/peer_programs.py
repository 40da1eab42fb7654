"""Simulated layer programs of the peer baselines: Megatron HCP, TE CP a2a+p2p, DistCA.

The peers do not run Zeppelin's engine order, so each builds its own per-rank
op list (:class:`~.program.Op`) and transfers (:class:`~.program.Traffic`) for
one layer, forward + backward merged as the cost model times them (like every
other strategy). :func:`~.program.build_layer_program` calls a peer plan's own builder
(:class:`~.peer_plan.PeerPlan`: a ``StepPlan`` carrying the peer's schedule
in ``peer`` and its builder in ``build``).

Primitives shared by the three builders (:class:`ProgramBuilder`):

* ``pairs``: one hop per ``(src, dst)`` pair carrying its bytes, NVLink inside
  a node, the source GPU's NIC to the destination GPU's NIC across nodes
  (direct, no PXN aggregation: what NVSHMEM puts and intra-node all-to-alls do);
* ``ring``: the ring steps of one group (post step ``j``'s transfer, compute,
  wait), every kernel call at least the profile's per-call overhead;
* ``barrier``: all ranks meet: a 1-byte gather to rank 0 and a 1-byte release
  from it (two link latencies; see ``docs/peers.md`` for what that charges).

Example: ``ProgramBuilder(cost).ring((0, 1), 3e6, 2.0, 1.5, key=("x",), label="g")``
gives each of ranks 0 and 1 ``post, compute 2.0, wait, compute 1.5`` and one
transfer in which each sends 3 MB to the other.
"""

from __future__ import annotations


from ..planner.cost_model import CostModel
from ..planner.zigzag import next_position
from .charges import hbm_ms, shape_of, te_ring_bytes, te_step_bytes
from .layer_ops import Leg, LayerProgram, Op, Traffic

__all__ = ["ProgramBuilder", "CHARGE_LABELS"]

CHARGE_LABELS: tuple[str, ...] = ("output correction", "ring buffers", "permute")
"""How the labels of the device-memory charges in peer programs end (TE CP's per-step charges, its ring buffers,
the all-to-alls' permutes): ``build_layer_program(..., charges="none")`` drops them."""

class ProgramBuilder:
    """Accumulates per-rank ops and named transfers for one simulated layer."""

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.world = cost.cluster.world_size
        self.ops: list[list[Op]] = [[] for _ in range(self.world)]
        self.transfers: dict[tuple, Traffic] = {}

    # -- ops ---------------------------------------------------------------
    def compute(self, r: int, ms: float, kind: str, label: str) -> None:
        """A kernel (or kernels) of ``ms``; ``attention``/``local`` calls pay at least the call overhead."""
        if kind in ("attention", "local"):
            ms = max(ms, self.cost.call_overhead_ms)
        if ms > 0:
            self.ops[r].append(Op("compute", ms, kind, label=label))

    def post(self, r: int, key: tuple) -> None:
        self.ops[r].append(Op("post", key=key))

    def wait(self, r: int, key: tuple, kind: str, label: str) -> None:
        self.ops[r].append(Op("wait", key=key, kind=kind, label=label))

    # -- transfers -----------------------------------------------------------
    def hop(self, src: int, dst: int, nbytes: float) -> Leg:
        cl = self.cost.cluster
        return Leg(src, dst, float(nbytes), "nvl" if cl.node_of(src) == cl.node_of(dst) else "nic")

    def pairs(self, key: tuple, pair_bytes: dict[tuple[int, int], float], category: str = "group") -> tuple:
        """Register a transfer of one direct hop per pair with bytes (self-pairs and zeros skipped)."""
        t = Traffic(key, category)
        for (a, b), n in sorted(pair_bytes.items()):
            if a != b and n > 0:
                t.chains.append([self.hop(a, b, n)])
        self.transfers[key] = t
        return key

    def ring(self, ranks: tuple[int, ...], step_bytes: float, diag_ms: float, off_ms: float, *, key: tuple,
             label: str, members: tuple[int, ...] | None = None) -> None:
        """The ``g = len(ranks)`` steps of one ring, for ``members`` (default all ranks of the ring):
        step ``j``: post the transfer (each position sends ``step_bytes`` to the next; none
        after the last step), compute (``diag_ms`` at step 0, ``off_ms`` after), wait."""
        g = len(ranks)
        keys = []
        for j in range(g - 1):
            t = Traffic(key + (j,), "ring")
            for p, src in enumerate(ranks):
                t.chains.append([self.hop(src, ranks[next_position(p, g)], step_bytes)])
            self.transfers[t.key] = t
            keys.append(t.key)
        # TE CP's per-step charges (sim/charges.py, "te"): a member holds step_bytes / (3 kv bytes per token)
        # tokens' worth of rows (all heads); at a step whose source precedes it every row attends to the
        # source's early half (early), else its late half attends to all of the source's rows (late).
        sh = shape_of(self.cost)
        rows = step_bytes / (3 * self.cost.kv_bytes_per_token)
        for r in (members if members is not None else ranks):
            p = ranks.index(r)
            if g > 1:  # TE's ring buffers (the K/V send buffers, the output's zeros)
                self.compute(r, hbm_ms(self.cost, te_ring_bytes(sh, rows)), "copy", f"{label} ring buffers")
            for j in range(g):
                if j < g - 1:
                    self.post(r, keys[j])
                self.compute(r, diag_ms if j == 0 else off_ms, "attention", f"{label} step {j}")
                if g > 1:
                    kind = "diag" if j == 0 else "early" if (p - j) % g < p else "late"
                    q_rows, kv_rows = {"diag": (rows, rows), "early": (rows, rows / 2), "late": (rows / 2, rows)}[kind]
                    self.compute(r, hbm_ms(self.cost, te_step_bytes(sh, q_rows, kv_rows, kind)), "copy",
                                 f"{label} step {j} output correction")
                if j < g - 1:
                    self.wait(r, keys[j], "ring", f"{label} step {j}")

    def barrier(self, key: tuple, label: str) -> None:
        """Every rank waits until all have arrived: 1-byte gather to rank 0, then its release."""
        gather = Traffic(key + ("gather",), "group")
        release = Traffic(key + ("release",), "group")
        for r in range(1, self.world):
            gather.chains.append([self.hop(r, 0, 1.0)])
            release.chains.append([self.hop(0, r, 1.0)])
        self.transfers[gather.key] = gather
        self.transfers[release.key] = release
        for r in range(self.world):
            self.post(r, gather.key)
            self.wait(r, gather.key, "group", f"{label} (arrive)")
            self.post(r, release.key)
            self.wait(r, release.key, "group", f"{label} (release)")

    def program(self) -> LayerProgram:
        return LayerProgram(self.ops, self.transfers, [[] for _ in range(self.world)])
