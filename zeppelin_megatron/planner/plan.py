"""Step plan dataclasses, the ``zeppelin-plan/1`` JSON form and its validation.

A plan says, for one global batch:

* ``sequences[i]``: length, placement (``local`` | ``intra_node`` |
  ``inter_node``) and the ranks that hold it (ring order for split ones);
* ``attention_layout[r]`` / ``linear_layout[r]``: rank ``r``'s tokens as
  ``(seq, start, end)`` ranges, concatenated in order;
* ``routing``: proxy routes for cross-node ring hops;
* ``remap_proxies``: local indices of the GPUs whose NICs carry the layout
  all-to-all's cross-node traffic (:mod:`~.remap_routing`; empty: direct);
* ``local_slots``: where local sequences run among their rank's ring steps
  (:class:`LocalSlot`; those named nowhere run after the rings);
* ``predicted``: the cost model's step and per-rank times (may be absent).

Derived on demand: :attr:`StepPlan.rings` (split sequences grouped by their
rank tuple) and :attr:`StepPlan.remap` (the layout-to-layout exchange lists).
"""

from __future__ import annotations

import hashlib
import heapq
import json
from dataclasses import InitVar, dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, Sequence

from .remap import RemapPlan, build_remap
from .routing import Route, plan_routing
from .zigzag import chunk_bounds, next_position, ring_chunk_pair_tokens

if TYPE_CHECKING:
    from .cluster import Cluster
    from .cost_model import CostModel

__all__ = [
    "PlanError", "SequencePlan", "Ring", "LocalSlot", "Prediction", "StepPlan", "derive_routing", "ring_order",
    "PLAN_SCHEMA", "PLACEMENTS",
]

PLAN_SCHEMA = "zeppelin-plan/1"
Placement = Literal["local", "intra_node", "inter_node"]
PLACEMENTS: tuple[str, ...] = ("local", "intra_node", "inter_node")
TokenRange = tuple[int, int, int]


class PlanError(ValueError):
    """A plan (or a request to make one) that is invalid."""


@dataclass(frozen=True)
class SequencePlan:
    length: int
    placement: Placement
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Ring:
    """Split sequences that share one rank tuple; executed as one ring."""

    ranks: tuple[int, ...]
    placement: Placement
    seqs: tuple[int, ...]


@dataclass(frozen=True)
class LocalSlot:
    """Local sequences ``seqs`` of ``rank`` run as one causal call inside ring ``ring``
    (an index into :attr:`StepPlan.rings`), after the rank's step-``step`` kernel and
    before that step's wait (``0 <= step <= g - 2``), so they overlap the step's transfer
    or a late ring partner. The engine runs the call at the same place in backward.

    Example: ``LocalSlot(rank=3, ring=1, step=0, seqs=(7, 9))``: rank 3, a member of
    the second ring in queue order, runs sequences 7 and 9 right after that ring's
    diagonal (step 0) kernel.
    """

    rank: int
    ring: int
    step: int
    seqs: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """Cost-model prediction for one training step (all layers), milliseconds / MB.

    Per-rank tuples: ``rank_ms`` (attention + linear + exposed communication),
    and, when the plan was made by the planner, the breakdown
    ``attention_ms`` (attention kernel compute), ``linear_ms``,
    ``exposed_comm_ms`` (ring waits not filled by local work), ``intra_MB`` and
    ``inter_MB`` (bytes each rank sends over NVLink and over the network), and
    the scalar ``remap_ms`` (layout all-to-alls, paid by every rank).
    """

    step_ms: float
    rank_ms: tuple[float, ...]
    attention_ms: tuple[float, ...] = ()
    linear_ms: tuple[float, ...] = ()
    exposed_comm_ms: tuple[float, ...] = ()
    intra_MB: tuple[float, ...] = ()
    inter_MB: tuple[float, ...] = ()
    remap_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step_ms": self.step_ms, "rank_ms": list(self.rank_ms)}
        if self.remap_ms:
            d["remap_ms"] = self.remap_ms
        for key in ("attention_ms", "linear_ms", "exposed_comm_ms", "intra_MB", "inter_MB"):
            if getattr(self, key):
                d[key] = list(getattr(self, key))
        return d


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    nodes: int
    gpus_per_node: int
    sequences: tuple[SequencePlan, ...]
    attention_layout: tuple[tuple[TokenRange, ...], ...]
    linear_layout: tuple[tuple[TokenRange, ...], ...]
    routing: tuple[Route, ...] = ()
    remap_proxies: tuple[int, ...] = ()
    """Local indices whose rail-aligned NICs carry the remap's cross-node rows (:mod:`~.remap_routing`);
    empty: every row goes straight from its source to its destination."""
    local_slots: tuple[LocalSlot, ...] = ()
    """Ring-step slots of local sequences (:class:`LocalSlot`); a local sequence in no slot runs
    after its rank's rings, with the other such sequences of that rank, in one call."""
    predicted: Prediction | None = None
    validate: InitVar[bool] = True
    """``False`` skips the layout checks (only for plans built from a validated one)."""

    def __post_init__(self, validate: bool) -> None:
        if validate:
            _validate(self)
        else:
            _check_routing(self)
        _check_local_slots(self)
        gpn = self.gpus_per_node
        if (len(set(self.remap_proxies)) != len(self.remap_proxies)
                or not all(isinstance(p, int) and 0 <= p < gpn for p in self.remap_proxies)):
            raise PlanError(f"remap_proxies must be distinct local indices in [0, {gpn}), "
                            f"got {list(self.remap_proxies)}")

    # -- derived -----------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def total_tokens(self) -> int:
        return sum(s.length for s in self.sequences)

    @cached_property
    def rings(self) -> tuple[Ring, ...]:
        """Rings in the engine's global queue order (:func:`ring_order`): inter-node, then
        intra-node, by ranks, except that a ring whose members are free starts early."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(self.sequences):
            if s.placement != "local":
                groups.setdefault(s.ranks, []).append(i)
        rings = [Ring(ranks, self.sequences[seqs[0]].placement, tuple(seqs)) for ranks, seqs in groups.items()]
        return ring_order(rings, [s.length for s in self.sequences])

    @cached_property
    def remap(self) -> RemapPlan:
        return RemapPlan(build_remap(self.linear_layout, self.attention_layout), self.world_size)

    @cached_property
    def remap_traffic(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """Tokens the remap moves per rank in one direction: ``(intra, out, into)``: inside the node
        (counted at both ends), and across nodes sent / received. All zero without a remap.

        Example: 2 nodes x 1 GPU, linear ``[[(0,0,4)], []]``, attention ``[[(0,0,1)], [(0,1,4)]]``:
        3 tokens cross nodes, ``out = (3, 0)``, ``into = (0, 3)``.
        """
        n, gpn = self.world_size, self.gpus_per_node
        intra, out, into = [0] * n, [0] * n, [0] * n
        if self.linear_layout != self.attention_layout:
            for seg in self.remap.segments:
                a, b = seg.lin_rank, seg.att_rank
                if a == b:
                    continue
                if a // gpn == b // gpn:
                    intra[a] += seg.length
                    intra[b] += seg.length
                else:
                    out[a] += seg.length
                    into[b] += seg.length
        return tuple(intra), tuple(out), tuple(into)

    def evolve(self, **changes: Any) -> "StepPlan":
        """``dataclasses.replace`` without re-validating the layouts (only for changes that keep the plan
        valid), keeping the derived remap when neither layout changes (it is the costly one to rebuild)."""
        new = replace(self, validate=False, **changes)
        if not {"attention_layout", "linear_layout"} & changes.keys():
            for name in ("remap", "remap_traffic"):
                if name in self.__dict__:
                    new.__dict__[name] = self.__dict__[name]
        return new

    def routes_for(self, ring: Sequence[int]) -> dict[tuple[int, int], Route]:
        key = tuple(ring)
        return {(r.src, r.dst): r for r in self.routing if r.ring == key}

    def tokens(self, rank: int, layout: str = "linear") -> int:
        lay = self.linear_layout if layout == "linear" else self.attention_layout
        return sum(e - s for _, s, e in lay[rank])

    def digest(self) -> str:
        """SHA-256 of the canonical JSON (cheap cross-rank agreement check)."""
        return hashlib.sha256(self.to_json(indent=None).encode()).hexdigest()

    # -- JSON ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": PLAN_SCHEMA,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "sequences": [
                {"length": s.length, "placement": s.placement, "ranks": list(s.ranks)} for s in self.sequences
            ],
            "attention_layout": [[list(r) for r in rs] for rs in self.attention_layout],
            "linear_layout": [[list(r) for r in rs] for rs in self.linear_layout],
            "routing": [
                {"ring": list(r.ring), "src": r.src, "dst": r.dst, "proxies": list(r.proxies)}
                for r in self.routing
            ],
        }
        if self.remap_proxies:  # absent when empty, like local_slots
            d["remap_proxies"] = list(self.remap_proxies)
        if self.local_slots:  # absent when empty: plans without slots keep their JSON and digest
            d["local_slots"] = [{"rank": x.rank, "ring": x.ring, "step": x.step, "seqs": list(x.seqs)}
                                for x in self.local_slots]
        if self.predicted is not None:
            d["predicted"] = self.predicted.to_dict()
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, separators=(",", ":") if indent is None else None)

    @classmethod
    def from_json(
        cls,
        text: str | bytes | dict[str, Any],
        *,
        cluster: "Cluster | None" = None,
        cost_model: "CostModel | None" = None,
    ) -> "StepPlan":
        """Parse and validate a ``zeppelin-plan/1`` document.

        A document without ``routing`` gets routes derived from ``cost_model``
        (or, without one, every idle NIC of ``cluster``; without a cluster,
        no routes). A missing ``predicted`` stays ``None``.
        """
        doc = text if isinstance(text, dict) else _loads(text)
        if not isinstance(doc, dict):
            raise PlanError("a plan document must be a JSON object")
        schema = doc.get("schema")
        if schema != PLAN_SCHEMA:
            raise PlanError(f"plan schema is {schema!r}, expected {PLAN_SCHEMA!r}")
        nodes = _int(doc, "nodes", "plan")
        gpus = _int(doc, "gpus_per_node", "plan")
        seqs_doc = _list(doc, "sequences", "plan")
        sequences = []
        for i, s in enumerate(seqs_doc):
            where = f"sequences[{i}]"
            if not isinstance(s, dict):
                raise PlanError(f"{where}: expected an object")
            placement = s.get("placement")
            if placement not in PLACEMENTS:
                raise PlanError(f"{where}.placement is {placement!r}, expected one of {list(PLACEMENTS)}")
            ranks = _list(s, "ranks", where)
            if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
                raise PlanError(f"{where}.ranks must be integers, got {ranks!r}")
            sequences.append(SequencePlan(_int(s, "length", where), placement, tuple(ranks)))
        att = _layout(doc, "attention_layout")
        lin = _layout(doc, "linear_layout")
        predicted = None
        if doc.get("predicted") is not None:
            predicted = _prediction(doc["predicted"])
        slots = _local_slots(doc)
        proxies = tuple(_list(doc, "remap_proxies", "plan")) if "remap_proxies" in doc else ()
        if "routing" in doc:
            routing = []
            for i, r in enumerate(_list(doc, "routing", "plan")):
                where = f"routing[{i}]"
                if not isinstance(r, dict):
                    raise PlanError(f"{where}: expected an object")
                routing.append(Route(tuple(_list(r, "ring", where)), _int(r, "src", where, 0),
                                     _int(r, "dst", where, 0), tuple(_list(r, "proxies", where))))
            return cls(nodes=nodes, gpus_per_node=gpus, sequences=tuple(sequences), attention_layout=att,
                       linear_layout=lin, routing=tuple(routing), remap_proxies=proxies, local_slots=slots,
                       predicted=predicted)
        plan = cls(nodes=nodes, gpus_per_node=gpus, sequences=tuple(sequences), attention_layout=att,
                   linear_layout=lin, routing=(), remap_proxies=proxies, local_slots=slots,
                   predicted=predicted)
        if cost_model is not None:
            cluster = cost_model.cluster
        if cluster is None:
            return plan
        if cluster.nodes != nodes or cluster.gpus_per_node != gpus:
            raise PlanError(
                f"the plan is for {nodes}x{gpus} GPUs but the cluster is "
                f"{cluster.nodes}x{cluster.gpus_per_node}"
            )
        return replace(plan, routing=derive_routing(plan, cost_model, cluster=cluster), validate=False)


def ring_order(rings: Sequence[Ring], lengths: Sequence[int]) -> tuple[Ring, ...]:
    """The global order in which every rank runs its rings (each rank keeps this order).

    A rank in two rings runs them one after the other, so the members of its second
    ring wait for its first one ("convoys"); a chain of such rings costs the sum of their
    times. The order is list scheduling on an estimate of each ring's time, its per-member
    attention work ``w = sum(s^2) // g`` (token^2; integers, so every machine orders alike):
    repeatedly take the ring that can start earliest (the latest estimated free time of
    its members); ties: inter-node before intra-node, then lower ranks (the order a plain
    sort would give); its members are then busy until ``start + w``. A ring whose members
    are free thus never queues behind rings it shares no rank with.

    Example: equal rings ``A = (0, 1)``, ``B = (1, 2)``, ``C = (2, 3)``: ``A`` (start 0,
    lower ranks), ``C`` (start 0; ``B`` now starts at ``w``), then ``B``: two ring times,
    where the sorted order ``A, B, C`` chains all three (``B`` waits for ``A``, ``C`` for ``B``).
    """
    work = [sum(lengths[i] ** 2 for i in r.seqs) // len(r.ranks) for r in rings]
    heap = [(0, 0 if r.placement == "inter_node" else 1, r.ranks, k) for k, r in enumerate(rings)]
    heapq.heapify(heap)
    free: dict[int, int] = {}
    out: list[Ring] = []
    while heap:
        start, kind, ranks, k = heapq.heappop(heap)
        now = max(free.get(r, 0) for r in ranks)
        if now > start:  # its members got busier since it was queued: requeue at its real start
            heapq.heappush(heap, (now, kind, ranks, k))
            continue
        out.append(rings[k])
        for r in ranks:
            free[r] = now + work[k]
    return tuple(out)


def derive_routing(
    plan: StepPlan, cost: "CostModel | None", *, cluster: "Cluster | None" = None, enabled: bool = True
) -> tuple[Route, ...]:
    """Routes for ``plan``'s rings: the cost model decides where routing pays.

    Without a cost model every idle NIC of ``cluster`` is used.
    """
    cluster = cost.cluster if cost is not None else cluster
    if cluster is None:
        raise PlanError("derive_routing needs a cost model or a cluster")
    g_bytes = cost.ring_step_bytes if cost is not None else ring_chunk_pair_tokens
    payloads = [(r.ranks, sum(g_bytes(plan.sequences[i].length, len(r.ranks)) for i in r.seqs))
                for r in plan.rings]
    return plan_routing(payloads, cluster, cost, enabled=enabled)


# -- parsing helpers ---------------------------------------------------------------


def _loads(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"plan is not valid JSON: {exc}") from None


def _int(d: dict[str, Any], key: str, where: str, minimum: int = 1) -> int:
    if key not in d:
        raise PlanError(f"{where}: missing key {key!r}")
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise PlanError(f"{where}.{key} must be an integer >= {minimum}, got {v!r}")
    return v


def _list(d: dict[str, Any], key: str, where: str) -> list[Any]:
    if key not in d:
        raise PlanError(f"{where}: missing key {key!r}")
    v = d[key]
    if not isinstance(v, list):
        raise PlanError(f"{where}.{key} must be a list, got {type(v).__name__}")
    return v


def _layout(doc: dict[str, Any], key: str) -> tuple[tuple[TokenRange, ...], ...]:
    out = []
    for r, ranges in enumerate(_list(doc, key, "plan")):
        if not isinstance(ranges, list):
            raise PlanError(f"{key}[{r}] must be a list of [seq, start, end]")
        rs = []
        for k, item in enumerate(ranges):
            if (not isinstance(item, list) or len(item) != 3
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)):
                raise PlanError(f"{key}[{r}][{k}] must be [seq, start, end] integers, got {item!r}")
            rs.append((item[0], item[1], item[2]))
        out.append(tuple(rs))
    return tuple(out)


def _local_slots(doc: dict[str, Any]) -> tuple[LocalSlot, ...]:
    out = []
    for k, x in enumerate(_list(doc, "local_slots", "plan") if "local_slots" in doc else []):
        where = f"local_slots[{k}]"
        if not isinstance(x, dict):
            raise PlanError(f"{where}: expected an object")
        seqs = _list(x, "seqs", where)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in seqs):
            raise PlanError(f"{where}.seqs must be integers, got {seqs!r}")
        out.append(LocalSlot(_int(x, "rank", where, 0), _int(x, "ring", where, 0), _int(x, "step", where, 0),
                             tuple(seqs)))
    return tuple(out)


def _prediction(d: Any) -> Prediction:
    if not isinstance(d, dict):
        raise PlanError("predicted must be an object")
    step = d.get("step_ms")
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        raise PlanError(f"predicted.step_ms must be a number, got {step!r}")
    kw: dict[str, Any] = {}
    remap = d.get("remap_ms", 0.0)
    if isinstance(remap, bool) or not isinstance(remap, (int, float)):
        raise PlanError(f"predicted.remap_ms must be a number, got {remap!r}")
    kw["remap_ms"] = float(remap)
    for key in ("rank_ms", "attention_ms", "linear_ms", "exposed_comm_ms", "intra_MB", "inter_MB"):
        v = d.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            raise PlanError(f"predicted.{key} must be a list of numbers")
        kw[key] = tuple(float(x) for x in v)
    return Prediction(step_ms=float(step), **kw)


# -- validation ------------------------------------------------------------------


def _validate(plan: StepPlan) -> None:
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
    att = _check_cover(plan, plan.attention_layout, "attention_layout")
    _check_cover(plan, plan.linear_layout, "linear_layout")
    # Attention layout must follow each sequence's placement.
    for i, s in enumerate(plan.sequences):
        held = att[i]  # rank -> sorted merged ranges
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
    _check_routing(plan)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _check_cover(
    plan: StepPlan, layout: Sequence[Sequence[TokenRange]], name: str
) -> list[dict[int, list[tuple[int, int]]]]:
    """Every token of every sequence exactly once; returns per-seq rank -> merged spans."""
    n = len(plan.sequences)
    per_seq: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    for r, ranges in enumerate(layout):
        for seq, start, end in ranges:
            if not 0 <= seq < n:
                raise PlanError(f"{name}[{r}]: sequence index {seq} is outside [0, {n})")
            length = plan.sequences[seq].length
            if not 0 <= start < end <= length:
                raise PlanError(
                    f"{name}[{r}]: range [{start}, {end}) of sequence {seq} is empty or outside [0, {length})"
                )
            per_seq[seq].append((start, end, r))
    held: list[dict[int, list[tuple[int, int]]]] = []
    for seq, spans in enumerate(per_seq):
        spans.sort()
        pos = 0
        for start, end, r in spans:
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


def _check_local_slots(plan: StepPlan) -> None:
    """Each slot names a ring step of one of its rank's rings and local sequences of that rank;
    no sequence in two slots, no two slots at one ring step of a rank."""
    if not plan.local_slots:
        return
    rings = plan.rings
    seen: dict[int, int] = {}
    places: set[tuple[int, int, int]] = set()
    for k, x in enumerate(plan.local_slots):
        where = f"local_slots[{k}] (rank {x.rank}, ring {x.ring}, step {x.step})"
        if not 0 <= x.ring < len(rings):
            raise PlanError(f"{where}: ring index {x.ring} is outside [0, {len(rings)})")
        ranks = rings[x.ring].ranks
        if x.rank not in ranks:
            raise PlanError(f"{where}: rank {x.rank} is not a member of ring {list(ranks)}")
        if not 0 <= x.step <= len(ranks) - 2:
            raise PlanError(f"{where}: step must be in [0, {len(ranks) - 2}] for a ring of {len(ranks)}")
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


def _check_routing(plan: StepPlan) -> None:
    gpn = plan.gpus_per_node
    rings = {r.ranks: r for r in plan.rings}
    seen: set[tuple[tuple[int, ...], int, int]] = set()
    for k, route in enumerate(plan.routing):
        where = f"routing[{k}]"
        if route.ring not in rings:
            raise PlanError(f"{where}: ring {list(route.ring)} is not a ring of this plan")
        ring = route.ring
        hops = [(ring[i], ring[next_position(i, len(ring))]) for i in range(len(ring))]
        if (route.src, route.dst) not in hops or route.src // gpn == route.dst // gpn:
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

