"""The ``zeppelin-plan/1`` JSON form of a :class:`~.plan.StepPlan`: writing, parsing, derived routes.

:func:`plan_to_dict` is what :meth:`~.plan.StepPlan.to_dict` returns;
:func:`plan_from_json` parses and validates a document (every error names the
key and the value, e.g. ``sequences[2].placement is 'ring', expected one of
['local', 'intra_node', 'inter_node']``); :func:`derive_routing` gives the
routes of a plan whose document has none.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .gc_pause import gc_paused
from .plan_parts import (
    LINEAR_LAYOUTS, ORIGINS, PLACEMENTS, PLAN_SCHEMA, LocalSlot, PlanError, Prediction, RemapSlot, SequencePlan,
    TokenRange,
)
from .routing import Route, plan_routing
from .zigzag import ring_chunk_pair_tokens

if TYPE_CHECKING:
    from .cluster import Cluster
    from .cost_model import CostModel
    from .plan import StepPlan

__all__ = ["plan_to_dict", "plan_to_json", "plan_from_json", "derive_routing"]


def plan_to_dict(plan: "StepPlan") -> dict[str, Any]:
    """The ``zeppelin-plan/1`` document of ``plan``.

    ``linear``, ``origin``, ``remap_proxies``, ``local_slots``, ``remap_slots`` and ``predicted`` appear only when
    present.
    """
    d: dict[str, Any] = {
        "schema": PLAN_SCHEMA,
        "nodes": plan.nodes,
        "gpus_per_node": plan.gpus_per_node,
        "sequences": [
            {"length": s.length, "placement": s.placement, "ranks": list(s.ranks),
             **({"a2a": s.a2a} if s.a2a != 1 else {}), **({"part": s.part} if s.part else {})}
            for s in plan.sequences
        ],
        "attention_layout": [[list(r) for r in rs] for rs in plan.attention_layout],
        "linear_layout": [[list(r) for r in rs] for rs in plan.linear_layout],
    }
    d.update(_tail(plan))
    return d


def _tail(plan: "StepPlan") -> dict[str, Any]:
    """The document's keys after the layouts, in order."""
    d: dict[str, Any] = {"linear": plan.linear} if plan.linear is not None else {}
    if plan.origin is not None:
        d["origin"] = plan.origin
    d.update({
        "routing": [
            {"ring": list(r.ring), "src": r.src, "dst": r.dst, "proxies": list(r.proxies)}
            for r in plan.routing
        ],
    })
    if plan.remap_proxies:  # absent when empty, like local_slots
        d["remap_proxies"] = list(plan.remap_proxies)
    if plan.local_slots:  # absent when empty: plans without slots keep their JSON and digest
        d["local_slots"] = [{"rank": x.rank, "ring": x.ring, "step": x.step, "seqs": list(x.seqs)}
                            for x in plan.local_slots]
    if plan.remap_slots:  # absent when empty, like local_slots
        d["remap_slots"] = [{"rank": x.rank, "direction": x.direction, "seqs": list(x.seqs)}
                            for x in plan.remap_slots]
    if plan.predicted is not None:
        d["predicted"] = plan.predicted.to_dict()
    return d


def plan_to_json(plan: "StepPlan") -> str:
    """``json.dumps(plan_to_dict(plan), separators=(",", ":"))``, byte for byte, written faster.

    The sequences and both layouts (a million entries in a large batch) are formatted
    directly; the rest goes through :mod:`json`. Example: one local sequence of 5 tokens
    on rank 0 of 1x1 starts ``{"schema":"zeppelin-plan/1","nodes":1,"gpus_per_node":1,
    "sequences":[{"length":5,"placement":"local","ranks":[0]}],"attention_layout":[[[0,0,5]]]``.
    """
    with gc_paused():
        return _plan_to_json(plan)


def _plan_to_json(plan: "StepPlan") -> str:
    def layout(lay: Any) -> str:
        return "[" + ",".join("[" + ",".join(f"[{q},{a},{b}]" for q, a, b in rs) + "]" for rs in lay) + "]"

    seqs = ",".join(f'{{"length":{s.length},"placement":"{s.placement}","ranks":[{",".join(map(str, s.ranks))}]'
                    + (f',"a2a":{s.a2a}' if s.a2a != 1 else "") + (f',"part":{s.part}}}' if s.part else "}")
                    for s in plan.sequences)
    rest = _tail(plan)
    head = (f'{{"schema":{json.dumps(PLAN_SCHEMA)},"nodes":{int(plan.nodes)},'
            f'"gpus_per_node":{int(plan.gpus_per_node)},"sequences":[{seqs}],'
            f'"attention_layout":{layout(plan.attention_layout)},"linear_layout":{layout(plan.linear_layout)}')
    return head + "," + json.dumps(rest, separators=(",", ":"))[1:]


def plan_from_json(
    cls: "type[StepPlan]",
    text: str | bytes | dict[str, Any],
    *,
    cluster: "Cluster | None" = None,
    cost_model: "CostModel | None" = None,
) -> "StepPlan":
    """Parse and validate a ``zeppelin-plan/1`` document.

    A document without ``routing`` gets routes derived from ``cost_model``
    (or, without one, every idle NIC of ``cluster``; without a cluster,
    no routes). A missing ``predicted`` or ``linear`` stays ``None``.
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
        a2a = _int(s, "a2a", where) if "a2a" in s else 1
        part = _int(s, "part", where) if "part" in s else 0
        sequences.append(SequencePlan(_int(s, "length", where), placement, tuple(ranks), a2a, part))
    att = _layout(doc, "attention_layout")
    lin = _layout(doc, "linear_layout")
    predicted = None
    if doc.get("predicted") is not None:
        predicted = _prediction(doc["predicted"])
    slots = _local_slots(doc)
    windows = _remap_slots(doc)
    proxies = tuple(_list(doc, "remap_proxies", "plan")) if "remap_proxies" in doc else ()
    linear = doc.get("linear")
    if "linear" in doc and (not isinstance(linear, str) or linear not in LINEAR_LAYOUTS):
        raise PlanError(f"plan.linear is {linear!r}, expected one of {list(LINEAR_LAYOUTS)}")
    origin = doc.get("origin")
    if "origin" in doc and (not isinstance(origin, str) or origin not in ORIGINS):
        raise PlanError(f"plan.origin is {origin!r}, expected one of {list(ORIGINS)}")
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
                   remap_slots=windows, linear=linear, origin=origin, predicted=predicted)
    plan = cls(nodes=nodes, gpus_per_node=gpus, sequences=tuple(sequences), attention_layout=att,
               linear_layout=lin, routing=(), remap_proxies=proxies, local_slots=slots,
               remap_slots=windows, linear=linear, origin=origin, predicted=predicted)
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
                for r in plan.rings if r.a2a == 1]  # head-parallel rings: each lane on its own NIC, unrouted
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


def _slot_items(doc: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any], tuple[int, ...]]]:
    """``(where, item, seqs)`` of each object of the document's ``key`` list (absent: none), its ``seqs``
    checked to be integers."""
    out = []
    for k, x in enumerate(_list(doc, key, "plan") if key in doc else []):
        where = f"{key}[{k}]"
        if not isinstance(x, dict):
            raise PlanError(f"{where}: expected an object")
        seqs = _list(x, "seqs", where)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in seqs):
            raise PlanError(f"{where}.seqs must be integers, got {seqs!r}")
        out.append((where, x, tuple(seqs)))
    return out


def _local_slots(doc: dict[str, Any]) -> tuple[LocalSlot, ...]:
    # step -1: inside a head-parallel ring's heads all-to-all (checked against the ring by check_local_slots)
    return tuple(LocalSlot(_int(x, "rank", where, 0), _int(x, "ring", where, 0), _int(x, "step", where, -1), seqs)
                 for where, x, seqs in _slot_items(doc, "local_slots"))


def _remap_slots(doc: dict[str, Any]) -> tuple[RemapSlot, ...]:
    out = []
    for where, x, seqs in _slot_items(doc, "remap_slots"):
        direction = x.get("direction")
        if not isinstance(direction, str):
            raise PlanError(f"{where}.direction must be a string, got {direction!r}")
        out.append(RemapSlot(_int(x, "rank", where, 0), direction, seqs))  # checked by check_remap_slots
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
