"""Event-driven simulation of one training step of a plan.

Model (see ``docs/simulator.md``):

* Every rank runs its :mod:`~zeppelin_megatron.sim.program` op list for one
  layer: compute ops one after another on its GPU (durations from the
  :class:`CostModel`'s per-kernel costs), ``post`` of a transfer (non-blocking),
  ``wait`` for it (blocks until every hop the rank sends or receives is done).
* Hops are flows of a :class:`~zeppelin_megatron.sim.network.FluidNetwork`:
  NVLink ports per GPU, NIC ports per ``(node, nic)`` (GPUs share NICs per
  ``cluster.gpu_nic``), max-min fair sharing, link latency before the first byte.
  A hop starts when both ends have posted its transfer and the previous hop of
  its chain (routed parts: dispatch, NIC, combine) is done.
* Layers are identical and start together (separated by the remap all-to-all,
  or, without remapping, by the ring and data-parallel synchronisation), so
  the step is ``layers x`` the simulated layer. Optimizer, embedding and
  gradient all-reduce are not modelled (the same for every strategy).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from ..planner.cost_model import CostModel
from ..planner.plan import StepPlan
from .network import EPS_MS, Flow, FluidNetwork
from .program import Leg, LayerProgram, build_layer_program, plain_rings

__all__ = ["Event", "SimResult", "simulate", "simulate_program", "link_capacities"]


@dataclass(frozen=True)
class Event:
    """One interval of a rank's timeline in the simulated layer (ms from layer start).

    ``kind``: ``linear``, ``attention`` (ring/group kernels), ``local``, or a
    wait: ``ring``, ``group``, ``remap``.
    """

    rank: int
    kind: str
    start: float
    end: float
    label: str = ""


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """Simulated step (all layers). Times in ms, bytes in MB.

    ``exposed_comm_ms``: ``step_ms - max(compute_ms)``, the time the step spends
    beyond its busiest GPU's kernels (communication not hidden, and waits it
    causes). ``wait_ms[r]``: time rank ``r`` spent blocked in waits.
    ``nic_util``: per ``(node, nic)``, bytes sent / (bandwidth x step time);
    ``events``: rank timelines of one layer.
    """

    step_ms: float
    layer_ms: float
    layers: int
    finish_ms: tuple[float, ...]
    compute_ms: tuple[float, ...]
    wait_ms: tuple[float, ...]
    exposed_comm_ms: float
    nic_util: dict[tuple[int, int], float]
    nvlink_MB: float
    network_MB: float
    events: tuple[Event, ...] = field(repr=False, default=())

    @property
    def nic_util_mean(self) -> float:
        return sum(self.nic_util.values()) / len(self.nic_util) if self.nic_util else 0.0

    @property
    def nic_util_max(self) -> float:
        return max(self.nic_util.values(), default=0.0)

    def summary(self) -> dict[str, Any]:
        return {"step_ms": self.step_ms, "layer_ms": self.layer_ms, "layers": self.layers,
                "max_compute_ms": max(self.compute_ms), "mean_compute_ms": sum(self.compute_ms) / len(self.compute_ms),
                "exposed_comm_ms": self.exposed_comm_ms, "nic_util_mean": self.nic_util_mean,
                "nic_util_max": self.nic_util_max, "nvlink_MB": self.nvlink_MB, "network_MB": self.network_MB}


def link_capacities(cost: CostModel) -> tuple[float, float]:
    """``(NVLink, NIC)`` bandwidth in bytes per ms, as the cost model uses them."""
    cl, p = cost.cluster, cost.profile
    return (p.nvlink_GBps or cl.nvlink_GBps) * 1e6, (p.nic_GBps or cl.nic_GBps) * 1e6


def _resources(cost: CostModel) -> dict[tuple, float]:
    cl = cost.cluster
    nvl, nic = link_capacities(cost)
    caps: dict[tuple, float] = {}
    for r in range(cl.world_size):
        caps[("nvl_out", r)] = nvl
        caps[("nvl_in", r)] = nvl
    for n in range(cl.nodes):
        for k in range(cl.nics_per_node):
            caps[("nic_out", n, k)] = nic
            caps[("nic_in", n, k)] = nic
    return caps


def _flow(cost: CostModel, hop: Leg, tag: object) -> Flow:
    cl = cost.cluster
    if hop.link == "nvl":
        return Flow(hop.nbytes, (("nvl_out", hop.src), ("nvl_in", hop.dst)), cl.nvlink_latency_us * 1e-3, tag)
    res = (("nic_out", cl.node_of(hop.src), cl.nic_of(hop.src)), ("nic_in", cl.node_of(hop.dst), cl.nic_of(hop.dst)))
    return Flow(hop.nbytes, res, cl.nic_latency_us * 1e-3, tag)


ENGINES: tuple[str, ...] = ("runtime", "fill")


def simulate(plan: StepPlan, cost: CostModel, *, attention_comm: str = "ring", routing: bool = True,
             engine: str = "runtime", keep_events: bool = True, charges: str = "zeppelin",
             head_parallel: bool = True) -> SimResult:
    """Simulate one step of ``plan`` (see module docstring). Deterministic.

    ``engine="runtime"``: the order ``zeppelin_megatron.runtime`` executes:
    rings one after another, each rank's local sequences in step 0 of its
    filling ring (between the step's compute and its wait) or after the rings
    (a fixed order, not reacting to waits). ``engine="fill"``: local sequences run from a queue
    whenever a rank is blocked on a ring/group wait (the paper's three-queue
    engine).

    ``charges``: whose merges and copies ring plans pay (:mod:`.charges`): ``zeppelin`` (this project's
    engine) or ``te`` (TE CP's ring; what the ring baselines run); :func:`~.charges.charges_for` maps a
    strategy name to it.

    ``head_parallel=False`` runs the plan's head-parallel rings as plain rings over the same ranks
    (:func:`~.program.plain_rings`): the same-plan ablation (the planner's ``PlannerOptions.head_parallel``
    instead plans without them).
    """
    if plan.nodes != cost.cluster.nodes or plan.gpus_per_node != cost.cluster.gpus_per_node:
        raise ValueError(f"the plan is for {plan.nodes}x{plan.gpus_per_node} GPUs but the cost model's cluster is "
                         f"{cost.cluster.nodes}x{cost.cluster.gpus_per_node}")
    if engine not in ENGINES:
        raise ValueError(f"engine is {engine!r}, expected one of {list(ENGINES)}")
    if not head_parallel:
        plan = plain_rings(plan)
    program = build_layer_program(plan, cost, attention_comm, routing, interleave_local=engine == "runtime",
                                  charges=charges)
    return simulate_program(program, cost, engine=engine, keep_events=keep_events)


def simulate_program(program: LayerProgram, cost: CostModel, *, engine: str = "runtime",
                     keep_events: bool = True) -> SimResult:
    """Run one layer's op lists to completion; scale by ``cost.model.layers``."""
    if engine not in ENGINES:
        raise ValueError(f"engine is {engine!r}, expected one of {list(ENGINES)}")
    fill = engine == "fill"
    o = cost.call_overhead_ms
    queue = [list(q) for q in program.local_queue] or [[] for _ in program.ops]
    world = len(program.ops)
    net = FluidNetwork(_resources(cost))
    # Leg bookkeeping: hop id -> (transfer key, chain index, hop index).
    need: dict[tuple, int] = {}          # (key, c, h) -> ends not yet posted
    pending: dict[tuple, dict[int, int]] = {}   # key -> rank -> hops of rank not done
    by_rank: dict[tuple, dict[int, list[tuple[int, int]]]] = {}  # key -> rank -> [(c, h)]
    done_prev: set[tuple] = set()        # (key, c, h) whose predecessor is done (or first)
    for key, t in program.transfers.items():
        pend: dict[int, int] = {}
        idx: dict[int, list[tuple[int, int]]] = {}
        for c, chain in enumerate(t.chains):
            for h, hop in enumerate(chain):
                ends = {hop.src, hop.dst}
                need[(key, c, h)] = len(ends)
                for e in ends:
                    pend[e] = pend.get(e, 0) + 1
                    idx.setdefault(e, []).append((c, h))
                if h == 0 and c not in t.after:
                    done_prev.add((key, c, 0))
        pending[key] = pend
        by_rank[key] = idx

    dependents: dict[tuple, dict[int, list[int]]] = {}
    for key, t in program.transfers.items():
        for c2, c1 in sorted(t.after.items()):
            dependents.setdefault(key, {}).setdefault(c1, []).append(c2)

    def start_hop(key: tuple, c: int, h: int) -> None:
        hop = program.transfers[key].chains[c][h]
        net.start(_flow(cost, hop, (key, c, h)))

    pc = [0] * world
    blocked: dict[int, tuple[tuple, float, str, str]] = {}   # rank -> (key, since, kind, label)
    waiting_on: dict[tuple, set[int]] = {}
    compute_heap: list[tuple[float, int]] = []
    compute = [0.0] * world
    waited = [0.0] * world
    finish = [0.0] * world
    events: list[Event] = []

    def busy(r: int, ms: float, kind: str, label: str) -> None:
        now = net.now
        compute[r] += ms
        if keep_events:
            events.append(Event(r, kind, now, now + ms, label))
        heapq.heappush(compute_heap, (now + ms, r))

    def run(r: int) -> None:
        ops = program.ops[r]
        now = net.now
        while pc[r] < len(ops):
            op = ops[pc[r]]
            if op.what == "compute":
                pc[r] += 1
                busy(r, op.ms, op.kind, op.label)
                return
            if op.what == "local":
                pc[r] += 1
                if queue[r]:
                    busy(r, max(sum(queue[r]), o), "local", op.label)
                    queue[r].clear()
                    return
                continue
            if op.what == "post":
                pc[r] += 1
                for c, h in by_rank[op.key].get(r, ()):
                    need[(op.key, c, h)] -= 1
                    if need[(op.key, c, h)] == 0 and (op.key, c, h) in done_prev:
                        start_hop(op.key, c, h)
                continue
            # wait
            if pending[op.key].get(r, 0) == 0:
                pc[r] += 1
                continue
            if fill and queue[r] and op.kind in ("ring", "group"):
                take = 0.0
                while queue[r] and take < o:
                    take += queue[r].pop(0)
                busy(r, max(take, o), "local", "local sequences (filling a wait)")
                return
            blocked[r] = (op.key, now, op.kind, op.label)
            waiting_on.setdefault(op.key, set()).add(r)
            return
        finish[r] = now

    for r in range(world):
        run(r)
    while True:
        t_net = net.next_event_time()
        t_cmp = compute_heap[0][0] if compute_heap else math.inf
        t = min(t_net, t_cmp)
        if t == math.inf:
            break
        ready: set[int] = set()
        for f in net.advance(t):
            key, c, h = f.tag  # type: ignore[misc]
            hop = program.transfers[key].chains[c][h]
            for e in {hop.src, hop.dst}:
                pending[key][e] -= 1
                if pending[key][e] == 0 and e in waiting_on.get(key, ()):
                    ready.add(e)
            tr = program.transfers[key]
            if h + 1 < len(tr.chains[c]):
                done_prev.add((key, c, h + 1))
                if need[(key, c, h + 1)] == 0:
                    start_hop(key, c, h + 1)
            else:
                for c2 in dependents.get(key, {}).get(c, ()):
                    done_prev.add((key, c2, 0))
                    if need[(key, c2, 0)] == 0:
                        start_hop(key, c2, 0)
        while compute_heap and compute_heap[0][0] <= t + EPS_MS:
            ready.add(heapq.heappop(compute_heap)[1])
        for r in sorted(ready):
            if r in blocked:
                key, since, kind, label = blocked.pop(r)
                waiting_on[key].discard(r)
                pc[r] += 1
                waited[r] += t - since
                if keep_events and t - since > EPS_MS:
                    events.append(Event(r, kind, since, t, label))
            run(r)
    stuck = [r for r in range(world) if pc[r] < len(program.ops[r])]
    if stuck:
        r = stuck[0]
        raise RuntimeError(f"simulation deadlocked: {len(stuck)} ranks never finished; rank {r} is at op "
                           f"{pc[r]} of {len(program.ops[r])}: {program.ops[r][pc[r]]}")
    layers = cost.model.layers
    layer_ms = max(finish) if finish else 0.0
    step = layers * layer_ms
    _, nic_cap = link_capacities(cost)
    util: dict[tuple[int, int], float] = {}
    for n in range(cost.cluster.nodes):
        for k in range(cost.cluster.nics_per_node):
            b = net.bytes_through.get(("nic_out", n, k), 0.0)
            util[(n, k)] = b / (nic_cap * layer_ms) if layer_ms > 0 else 0.0
    nvl_b = sum(v for k, v in net.bytes_through.items() if k[0] == "nvl_out")
    nic_b = sum(v for k, v in net.bytes_through.items() if k[0] == "nic_out")
    comp = tuple(layers * c for c in compute)
    return SimResult(
        step_ms=step, layer_ms=layer_ms, layers=layers, finish_ms=tuple(layers * f for f in finish),
        compute_ms=comp, wait_ms=tuple(layers * w for w in waited),
        exposed_comm_ms=max(0.0, step - max(comp, default=0.0)), nic_util=util,
        nvlink_MB=layers * nvl_b / 1e6, network_MB=layers * nic_b / 1e6,
        events=tuple(sorted(events, key=lambda e: (e.rank, e.start, e.end))) if keep_events else (),
    )
