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
* Layers are chained (since 2026-11-27): every layer runs the same op lists, and each rank starts its next
  layer as soon as it finishes its previous one. Nothing else synchronises a layer's start: ranks wait only
  for the transfers they take part in (ring partners at their ring steps, group members at their
  all-to-alls, remap partners at the remap), so a rank with less work before a ring than its partners waits
  there once, not in every layer. The step is when the last rank finishes the last layer (all
  ``cost.model.layers`` of them are simulated). ``layers=1`` (:func:`simulate`) is the earlier model: one
  layer from a common start, times the layer count, which charged the skew of a ring's members' work around
  the ring in every layer: up to 6.6% on a packing of whole documents beside two rings (Llama-13B
  prolong-128k, 16 GPUs: 12 987 ms one-layer against 12 133 chained, predicted 12 213), nothing on plans
  whose members do alike (TE CP's rings, FlexSP's Ulysses groups). Optimizer, embedding and gradient
  all-reduce are not modelled (the same for every strategy).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..planner.cost_model import CostModel
from ..planner.plan import StepPlan
from .layer_ops import nic_ports
from .network import EPS_MS, Flow, FluidNetwork
from .periodic import LayerLog, components
from .program import Leg, LayerProgram, build_layer_program, plain_rings

__all__ = ["Event", "SimResult", "simulate", "simulate_program", "simulated_step", "compute_floor_ms",
           "link_capacities"]


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
    first_layer_ms: float
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
        return Flow(hop.nbytes, (("nvl_out", hop.src), ("nvl_in", hop.dst)),
                    hop.messages * cl.nvlink_latency_us * 1e-3, tag)
    return Flow(hop.nbytes, nic_ports(cost, hop), hop.messages * cl.nic_latency_us * 1e-3, tag)


def _layer_bytes(program: LayerProgram, cost: CostModel) -> tuple[float, dict[tuple[int, int], float]]:
    """Bytes one layer moves: over NVLink in all, and out of each ``(node, nic)``."""
    nvl = 0.0
    nic: dict[tuple[int, int], float] = {}
    for t in program.transfers.values():
        for chain in t.chains:
            for hop in chain:
                if hop.link == "nvl":
                    nvl += hop.nbytes
                else:
                    _, node, k = nic_ports(cost, hop)[0]
                    nic[(node, k)] = nic.get((node, k), 0.0) + hop.nbytes
    return nvl, nic


ENGINES: tuple[str, ...] = ("runtime", "fill")


def simulate(plan: StepPlan, cost: CostModel, *, attention_comm: str = "ring", routing: bool = True,
             engine: str = "runtime", keep_events: bool = True, charges: str = "zeppelin",
             head_parallel: bool = True, layers: int | None = None) -> SimResult:
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

    ``layers``: how many chained layers to simulate (default ``cost.model.layers``, the step; ``1``: one layer
    from a common start, times ``cost.model.layers``: the model before 2026-11-27, module docstring).

    ``head_parallel=False`` runs the plan's head-parallel rings as plain rings over the same ranks
    (:func:`~.program.plain_rings`): the same-plan ablation (the planner's ``PlannerOptions.head_parallel``
    instead plans without them).
    """
    _check_cluster(plan, cost)
    if engine not in ENGINES:
        raise ValueError(f"engine is {engine!r}, expected one of {list(ENGINES)}")
    if not head_parallel:
        plan = plain_rings(plan)
    program = build_layer_program(plan, cost, attention_comm, routing, interleave_local=engine == "runtime",
                                  charges=charges)
    return simulate_program(program, cost, engine=engine, keep_events=keep_events, layers=layers)


def _check_cluster(plan: StepPlan, cost: CostModel) -> None:
    """Refuse a plan made for another cluster than the cost model's."""
    if plan.nodes != cost.cluster.nodes or plan.gpus_per_node != cost.cluster.gpus_per_node:
        raise ValueError(f"the plan is for {plan.nodes}x{plan.gpus_per_node} GPUs but the cost model's cluster is "
                         f"{cost.cluster.nodes}x{cost.cluster.gpus_per_node}")


FLOOR_MARGIN = 1e-6
"""Relative slack under :func:`compute_floor_ms` for :func:`simulated_step`'s test: the simulator adds the same
kernel times in another order (and extrapolates settled layers to within 1e-9 of the step), far below this."""


def compute_floor_ms(program: LayerProgram, cost: CostModel) -> float:
    """A lower bound on :func:`simulate_program`'s step of ``program`` (runtime engine, every layer): the busiest
    rank's kernels one after another, ``layers x max_r (compute ops + local call)``, no wait and no transfer. A
    rank runs one op at a time, so its last layer ends no earlier. The local call is what the runtime engine runs
    at the rank's first ``local`` op of a layer: its queue as one call, at least the call overhead. Example: a
    rank with 2 and 3 ms of compute ops and a local queue of 0.1 + 0.2 ms (overhead 1 ms), 32 layers:
    ``32 x (5 + 1) = 192`` ms."""
    o = cost.call_overhead_ms
    queues = program.local_queues()
    busiest = 0.0
    for ops, queue in zip(program.ops, queues):
        per_layer = sum(op.ms for op in ops if op.what == "compute")
        if queue and any(op.what == "local" for op in ops):
            per_layer += max(sum(queue), o)
        busiest = max(busiest, per_layer)
    return cost.model.layers * busiest


def simulated_step(plan: StepPlan, cost: CostModel, *, beat: float = math.inf, attention_comm: str = "ring",
                   charges: str = "zeppelin") -> float:
    """``simulate(plan, cost, attention_comm=..., charges=...).step_ms`` (runtime engine, every layer), or
    ``math.inf`` without simulating when :func:`compute_floor_ms` shows the step is at least ``beat``: for a
    search that keeps the fastest of several plans (a baseline's CP sizes), passing the step to beat (e.g. the
    best so far less the search's tie margin) skips the plans that cannot beat it and changes no choice."""
    _check_cluster(plan, cost)
    program = build_layer_program(plan, cost, attention_comm, True, interleave_local=True, charges=charges)
    if compute_floor_ms(program, cost) * (1 - FLOOR_MARGIN) >= beat:
        return math.inf
    return simulate_program(program, cost, keep_events=False).step_ms


TIE_MS = 1e-9
"""A search's tie margin: a later candidate replaces the kept one only when faster by more than this."""

T = TypeVar("T")


class Fastest(Generic[T]):
    """The fastest of candidates offered one after another (within :data:`TIE_MS`: the earlier one), for the
    peers' searches over their settings. :meth:`simulate` simulates a plan with ``beat`` = the kept step less
    the tie margin, the same rule :meth:`offer` keeps by, so a setting whose compute floor cannot win is not
    simulated and no choice changes (``tests/sim/test_search_floor.py``).

    Example: offering 10.0 ms (item ``a``), 9.5 (``b``) and 9.5 - 1e-10 (``c``) keeps ``b``; a plan simulated
    next must come under ``beat`` = 9.5 - 1e-9 or it is not kept (and is not simulated when its floor says so)."""

    def __init__(self) -> None:
        self.ms = math.inf
        self.kept: T | None = None
        self._found = False

    @property
    def beat(self) -> float:
        """The step a candidate must come under to be kept: ``math.inf`` until one is kept."""
        return self.ms - TIE_MS if self._found else math.inf

    def offer(self, ms: float, item: T) -> bool:
        """Keep ``item`` if it is the first offered or faster than the kept one by more than the tie margin."""
        if self._found and not ms < self.beat:
            return False
        self.ms, self.kept, self._found = ms, item, True
        return True

    def simulate(self, plan: StepPlan, cost: CostModel, item: T, *, attention_comm: str = "ring",
                 charges: str = "zeppelin") -> float:
        """:func:`simulated_step` of ``plan`` with this search's ``beat``, offered with ``item``; its step
        (``math.inf`` when skipped)."""
        ms = simulated_step(plan, cost, beat=self.beat, attention_comm=attention_comm, charges=charges)
        self.offer(ms, item)
        return ms


def simulate_program(program: LayerProgram, cost: CostModel, *, engine: str = "runtime",
                     keep_events: bool = True, layers: int | None = None) -> SimResult:
    """Run ``layers`` chained copies of one layer's op lists to completion (default ``cost.model.layers``: the
    whole step; module docstring, "Layers are chained").

    Layer ``l``'s transfers are its own (keys ``(l, key)``): a rank posts and waits on them when it reaches them in
    its own ``l``-th copy, so ranks drift apart as far as their transfers let them. Each rank's local queue
    (``program.local_queue``) is refilled at the start of each of its layers. ``events``: the first layer's
    intervals. Example: two ranks that share no transfer, 3 and 5 ms of compute a layer, 4 layers: the step is
    20 ms (the busier rank, ``layer_ms`` 5); two ranks of one ring, the one with 2 ms of linear work before it
    and the other 2 ms after: the first layer ends at 2 + ring + 2, every later one ``ring + 2`` after it."""
    if engine not in ENGINES:
        raise ValueError(f"engine is {engine!r}, expected one of {list(ENGINES)}")
    n_layers = cost.model.layers if layers is None else layers
    if n_layers < 1:
        raise ValueError(f"layers = {n_layers}: a step simulates at least one layer")
    fill = engine == "fill"
    o = cost.call_overhead_ms
    local_queue = program.local_queues()
    queue: list[list[float]] = [[] for _ in program.ops]
    world = len(program.ops)
    net = FluidNetwork(_resources(cost))
    transfers = program.transfers
    # Hop bookkeeping per layer's transfer ``lk = (l, key)``: a transfer's hops numbered chain by chain (hop ``h`` of
    # chain ``c`` is ``first[key][c] + h``); per opened ``lk``, ``need[lk][n]``: ends of hop ``n`` not yet posted,
    # ``ready_prev[lk][n]``: its predecessor (the hop before it in its chain, or the chain it runs ``after``) done
    first: dict[tuple, list[int]] = {}               # key -> chain -> number of its first hop
    hop_at: dict[tuple, list[tuple[int, int]]] = {}  # key -> hop number -> (chain, hop in chain)
    need_of: dict[tuple, list[int]] = {}             # key -> hop -> its ends (1 or 2), every layer alike
    prev_of: dict[tuple, list[bool]] = {}            # key -> hop -> starts without waiting for another hop
    by_rank: dict[tuple, dict[int, list[int]]] = {}  # key -> rank -> hops it is an end of (every layer alike)
    ends_of: dict[tuple, dict[int, int]] = {}        # key -> rank -> hops it is an end of
    dependents: dict[tuple, dict[int, list[int]]] = {}  # key -> chain -> chains that run after it
    for key, tr in transfers.items():
        pend: dict[int, int] = {}
        idx: dict[int, list[int]] = {}
        starts: list[int] = []
        needs: list[int] = []
        free: list[bool] = []
        numbered: list[tuple[int, int]] = []
        for c, chain in enumerate(tr.chains):
            starts.append(len(needs))
            for h, hop in enumerate(chain):
                for e in {hop.src, hop.dst}:
                    pend[e] = pend.get(e, 0) + 1
                    idx.setdefault(e, []).append(len(needs))
                needs.append(len({hop.src, hop.dst}))
                free.append(h == 0 and c not in tr.after)
                numbered.append((c, h))
        first[key], need_of[key], prev_of[key], hop_at[key] = starts, needs, free, numbered
        ends_of[key] = pend
        by_rank[key] = idx
        for c2, c1 in sorted(tr.after.items()):
            dependents.setdefault(key, {}).setdefault(c1, []).append(c2)
    need: dict[tuple, list[int]] = {}
    ready_prev: dict[tuple, list[bool]] = {}
    pending: dict[tuple, dict[int, int]] = {}   # lk -> rank -> hops of rank not done

    def open_layer(lk: tuple) -> None:
        """Bookkeeping of layer ``l``'s transfer ``key`` (``lk = (l, key)``), made when a rank first posts it."""
        key = lk[1]
        need[lk] = list(need_of[key])
        ready_prev[lk] = list(prev_of[key])
        pending[lk] = dict(ends_of[key])

    def start_hop(lk: tuple, c: int, h: int) -> None:
        hop = transfers[lk[1]].chains[c][h]
        log.hop_start(hop.src, lk[0], (lk[1], c, h), net.now)
        net.start(_flow(cost, hop, (lk, c, h)))

    # components that interact with no other rank, and the layer each settles at (periodic.py)
    component = components(program, cost)
    log = LayerLog(component)
    settled: dict[int, tuple[int, float]] = {}  # component -> (layer, delta)
    at_layer_end: list[list[tuple[float, float, float]]] = [[] for _ in range(world)]  # (finish, compute, waited)

    pc = [0] * world
    layer = [0] * world
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
        log.compute(r, layer[r], now)
        if keep_events and layer[r] == 0:
            events.append(Event(r, kind, now, now + ms, label))
        heapq.heappush(compute_heap, (now + ms, r))

    def run(r: int) -> None:
        ops = program.ops[r]
        now = net.now
        if not ops:  # nothing to do in any layer
            layer[r] = n_layers
        if component[r] in settled:
            return  # its component's remaining layers are extrapolated
        while ops:
            if pc[r] == len(ops):  # the rank's layer is done: the next one starts now
                at_layer_end[r].append((now, compute[r], waited[r]))
                delta = log.rank_done(r, layer[r], now)
                if delta is not None and layer[r] + 1 < n_layers:
                    settled[component[r]] = (layer[r], delta)
                    return
                layer[r] += 1
                if layer[r] == n_layers:
                    break
                pc[r] = 0
            if pc[r] == 0:
                queue[r] = list(local_queue[r])
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
            lk = (layer[r], op.key)
            if op.what == "post":
                pc[r] += 1
                if lk not in pending:
                    open_layer(lk)
                needs, free = need[lk], ready_prev[lk]
                for n in by_rank[op.key].get(r, ()):
                    needs[n] -= 1
                    if needs[n] == 0 and free[n]:
                        start_hop(lk, *hop_at[op.key][n])
                continue
            # wait
            if lk not in pending:
                open_layer(lk)
            if pending[lk].get(r, 0) == 0:
                pc[r] += 1
                continue
            if fill and queue[r] and op.kind in ("ring", "group"):
                take = 0.0
                while queue[r] and take < o:
                    take += queue[r].pop(0)
                busy(r, max(take, o), "local", "local sequences (filling a wait)")
                return
            blocked[r] = (lk, now, op.kind, op.label)
            waiting_on.setdefault(lk, set()).add(r)
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
            lk: tuple[int, tuple]
            lk, c, h = f.tag  # type: ignore[misc]
            tr = transfers[lk[1]]
            hop = tr.chains[c][h]
            log.hop_end(hop.src, lk[0], (lk[1], c, h), t)
            for e in {hop.src, hop.dst}:
                pending[lk][e] -= 1
                if pending[lk][e] == 0 and e in waiting_on.get(lk, ()):
                    ready.add(e)
            needs, free = need[lk], ready_prev[lk]
            if h + 1 < len(tr.chains[c]):
                n = first[lk[1]][c] + h + 1
                free[n] = True
                if needs[n] == 0:
                    start_hop(lk, c, h + 1)
            else:
                for c2 in dependents.get(lk[1], {}).get(c, ()):
                    n = first[lk[1]][c2]
                    free[n] = True
                    if needs[n] == 0:
                        start_hop(lk, c2, 0)
        while compute_heap and compute_heap[0][0] <= t + EPS_MS:
            ready.add(heapq.heappop(compute_heap)[1])
        for r in sorted(ready):
            if r in blocked:
                lk, since, kind, label = blocked.pop(r)
                waiting_on[lk].discard(r)
                pc[r] += 1
                waited[r] += t - since
                if keep_events and layer[r] == 0 and t - since > EPS_MS:
                    events.append(Event(r, kind, since, t, label))
            run(r)
    for c, (at, delta) in settled.items():  # layer ``at`` repeats: each later one adds delta and its work
        for r in log.members[c]:
            end, comp_ms, wait_ms = at_layer_end[r][at]
            prev = at_layer_end[r][at - 1]
            more = n_layers - 1 - at
            finish[r] = end + more * delta
            compute[r] = comp_ms + more * (comp_ms - prev[1])
            waited[r] = wait_ms + more * (wait_ms - prev[2])
            layer[r] = n_layers
    stuck = [r for r in range(world) if layer[r] < n_layers]
    if stuck:
        r = stuck[0]
        raise RuntimeError(f"simulation deadlocked: {len(stuck)} ranks never finished; rank {r} is at op "
                           f"{pc[r]} of {len(program.ops[r])} of layer {layer[r]}: {program.ops[r][pc[r]]}")
    layers = cost.model.layers
    scale = layers / n_layers  # 1 when every layer is simulated (the default)
    span = max(finish) if finish else 0.0  # the simulated layers, end to end
    step = scale * span
    _, nic_cap = link_capacities(cost)
    nvl_b, nic_out = _layer_bytes(program, cost)  # every simulated layer moves its transfers' bytes once
    util: dict[tuple[int, int], float] = {}
    for n in range(cost.cluster.nodes):
        for k in range(cost.cluster.nics_per_node):
            util[(n, k)] = nic_out.get((n, k), 0.0) / (nic_cap * span / n_layers) if span > 0 else 0.0
    nic_b = sum(nic_out.values())
    comp = tuple(scale * c for c in compute)
    return SimResult(
        step_ms=step, layer_ms=step / layers, layers=layers,
        first_layer_ms=max((ends[0][0] for ends in at_layer_end if ends), default=0.0),
        finish_ms=tuple(scale * f for f in finish),
        compute_ms=comp, wait_ms=tuple(scale * w for w in waited),
        exposed_comm_ms=max(0.0, step - max(comp, default=0.0)), nic_util=util,
        nvlink_MB=layers * nvl_b / 1e6, network_MB=layers * nic_b / 1e6,
        events=tuple(sorted(events, key=lambda e: (e.rank, e.start, e.end))) if keep_events else (),
    )
