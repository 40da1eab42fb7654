"""The step plan: :class:`StepPlan`, what the planner returns and the runtime executes.

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
* ``remap_slots``: staying local sequences run while a layout exchange is in flight
  (:class:`RemapSlot`, :mod:`.remap_windows`);
* ``predicted``: the cost model's step and per-rank times (may be absent).

Split by concern: the parts (:class:`SequencePlan`, :class:`Ring`,
:class:`LocalSlot`, :class:`Prediction`, :class:`PlanError`) live in
:mod:`.plan_parts`, the JSON form in :mod:`.plan_json`, the checks in
:mod:`.plan_check`, the ring order in :mod:`.ring_order`; all of these names
stay importable from here.

Derived on demand: :attr:`StepPlan.rings` (split sequences grouped by their
rank tuple) and :attr:`StepPlan.remap` (the layout-to-layout exchange lists).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import InitVar, dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from .head_parallel import check_head_parallel
from .plan_check import check_local_slots, check_remap_slots, check_routing, validate_plan
from .plan_json import derive_routing, plan_from_json, plan_to_dict, plan_to_json
from .plan_parts import (
    PLACEMENTS, PLAN_SCHEMA, REMAP_DIRECTIONS, LocalSlot, Placement, PlanError, Prediction, RemapSlot, Ring,
    SequencePlan, TokenRange, ORIGINS,
    check_linear,
)
from .remap import RemapPlan, build_remap
from .ring_order import ring_order
from .routing import Route

if TYPE_CHECKING:
    from .cluster import Cluster
    from .cost_model import CostModel

__all__ = [
    "PlanError", "SequencePlan", "Ring", "LocalSlot", "RemapSlot", "REMAP_DIRECTIONS", "Prediction",
    "StepPlan", "derive_routing", "ring_order",
    "PLAN_SCHEMA", "PLACEMENTS", "Placement", "TokenRange",
]


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """One step's plan (fields as in the module docstring); validated on construction.

    Example: 1 node x 2 GPUs, sequence 0 (8 tokens) on a ring over ranks 0 and 1, sequence 1
    (3 tokens) whole on rank 1: ``attention_layout = (((0, 0, 2), (0, 6, 8)), ((0, 2, 6), (1, 0, 3)))``.
    """

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
    remap_slots: tuple[RemapSlot, ...] = ()
    """Staying local sequences run inside a layout exchange (:class:`RemapSlot`; at most one per rank
    and direction; only when the remap moves rows); such a sequence is in no ``local_slots`` entry."""
    linear: str | None = None
    """How the linear layout was chosen (:data:`~.plan_parts.LINEAR_LAYOUTS`: ``token_balanced``,
    ``workload_balanced``, ``attention``); ``None``: not recorded (hand-made plans, older documents)."""
    origin: str | None = None
    """Where the placement came from (:data:`~.plan_parts.ORIGINS`): ``packed`` (:mod:`.packed`), ``grouped``
    (:mod:`.grouped`); ``None``: the partitioner's (or not recorded)."""
    predicted: Prediction | None = None
    validate: InitVar[bool | None] = True
    """``False`` skips the layout and sequence checks (only for plans built from a validated one with the
    same sequences, or sequences checked otherwise); ``None`` (what :meth:`evolve` passes) skips every check,
    and the caller runs those it owes."""

    def __post_init__(self, validate: bool | None) -> None:
        if validate is None:  # evolve(): it runs the checks whose fields changed (_check_changed)
            return
        if validate:
            validate_plan(self)
            check_head_parallel(self)  # a sequence check, like validate_plan's: evolve keeps the sequences valid
        else:
            check_routing(self)
        self._check_changed(None)

    _CHECKS: ClassVar[tuple[tuple[str, frozenset[str]], ...]] = (
        ("routing", frozenset({"routing", "sequences"})),
        ("local_slots", frozenset({"local_slots", "sequences"})),
        ("remap_slots", frozenset({"remap_slots", "local_slots", "linear_layout", "attention_layout", "sequences"})),
        ("linear", frozenset({"linear", "linear_layout", "attention_layout"})),
        ("origin", frozenset({"origin"})),
        ("remap_proxies", frozenset({"remap_proxies", "gpus_per_node"})),
    )
    """Each check a construction runs besides the layout and sequence checks, and the fields it reads: an
    :meth:`evolve` that changes none of them keeps the check's verdict."""

    def _check_changed(self, changed: "frozenset[str] | None") -> None:
        """The checks of :data:`_CHECKS` that read a field in ``changed`` (``None``: all of them)."""
        run = {name for name, reads in self._CHECKS if changed is None or reads & changed}
        if "routing" in run and changed is not None:  # a construction runs it above (or in validate_plan)
            check_routing(self)
        if "local_slots" in run:
            check_local_slots(self)
        if "remap_slots" in run:
            check_remap_slots(self)
        if "linear" in run:
            check_linear(self.linear, self.linear_layout, self.attention_layout)
        if "origin" in run and self.origin is not None and self.origin not in ORIGINS:
            raise PlanError(f"origin is {self.origin!r}, expected None or one of {list(ORIGINS)}")
        gpn = self.gpus_per_node
        if "remap_proxies" in run and (len(set(self.remap_proxies)) != len(self.remap_proxies)
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
        intra-node, by ranks, except that a ring whose members are free starts early. Sequences on the
        same ranks with different ``a2a`` (head-parallel block width) or ``part`` (:mod:`.ring_parts`) are
        different rings."""
        groups: dict[tuple[tuple[int, ...], int, int], list[int]] = {}
        for i, s in enumerate(self.sequences):
            if s.placement != "local":
                groups.setdefault((s.ranks, s.a2a, s.part), []).append(i)
        rings = [Ring(ranks, self.sequences[seqs[0]].placement, tuple(seqs), a2a, part)
                 for (ranks, a2a, part), seqs in groups.items()]
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

    @cached_property
    def remap_pairs(self) -> tuple[tuple[int, int, int], ...]:
        """Rows the *in* remap moves, ``(linear rank, attention rank, rows)`` per pair of distinct ranks,
        sorted (the *out* remap moves them back); empty when the layouts are equal. Example: linear
        ``[[(0, 0, 4)], []]``, attention ``[[(0, 0, 1)], [(0, 1, 4)]]``: ``((0, 1, 3),)``."""
        if self.linear_layout == self.attention_layout:
            return ()
        rows: dict[tuple[int, int], int] = {}
        for seg in self.remap.segments:
            if seg.lin_rank != seg.att_rank:
                key = (seg.lin_rank, seg.att_rank)
                rows[key] = rows.get(key, 0) + seg.length
        return tuple((a, b, n) for (a, b), n in sorted(rows.items()))

    @cached_property
    def staying_tokens(self) -> tuple[int, ...]:
        """Tokens on each rank in both layouts (the remap's diagonal: never sent). Example: linear
        ``[[(0, 0, 4)], []]``, attention ``[[(0, 0, 1)], [(0, 1, 4)]]``: ``(1, 0)``."""
        return tuple(int(x) for x in self.remap.counts().diagonal())

    REORDER_INVARIANT: ClassVar[tuple[str, ...]] = ("remap_traffic", "remap_pairs", "staying_tokens", "rank_tokens")
    """Derived values that depend on which tokens each rank holds in each layout, not on their order within
    a rank: :func:`~.api.engine_order` carries them to the reordered plan (a prediction then needs no
    remap rebuilt)."""

    def reordered(self, **changes: Any) -> "StepPlan":
        """:meth:`evolve` for a change of the order of tokens *within* each rank only (the same tokens on the
        same ranks in both layouts), carrying :data:`REORDER_INVARIANT` values already derived."""
        new = self.evolve(**changes)
        for name in self.REORDER_INVARIANT:
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name]
        return new

    def validated(self) -> "StepPlan":
        """This plan, after the checks a construction with ``validate=True`` runs (:func:`~.plan_check.validate_plan`,
        :func:`~.head_parallel.check_head_parallel`); raises :class:`PlanError` naming the first problem. For plans
        built with ``validate=False`` (``plan_step``'s candidates: only the one kept is checked)."""
        validate_plan(self)
        check_head_parallel(self)
        return self

    def evolve(self, **changes: Any) -> "StepPlan":
        """``dataclasses.replace`` without re-validating the layouts (only for changes that keep the plan
        valid), keeping the derived remap when neither layout changes (it is the costly one to rebuild) and
        the rings when the sequences do not change; of the other checks a construction runs (routes, slots,
        linear kind, origin, remap proxies) only those reading a changed field run again.
        A change of either layout drops ``remap_slots`` unless they are given too (they were chosen for the
        old layouts; their sequences then run after the rings)."""
        if self.remap_slots and "remap_slots" not in changes and {"attention_layout", "linear_layout"} & changes.keys():
            changes = dict(changes, remap_slots=())
        new = replace(self, validate=None, **changes)
        if not {"attention_layout", "linear_layout"} & changes.keys():
            for name in ("remap",) + self.REORDER_INVARIANT:
                if name in self.__dict__:
                    new.__dict__[name] = self.__dict__[name]
        if "sequences" not in changes:
            new.__dict__["rings"] = self.rings  # derived from the sequences alone (derived here once for the chain)
        new._check_changed(frozenset(changes))
        return new

    def routes_for(self, ring: Sequence[int]) -> dict[tuple[int, int], Route]:
        """The routed hops of the ring over ``ring`` by ``(src, dst)`` (empty when none is routed)."""
        return dict(self._routes_by_ring.get(tuple(ring), {}))

    @cached_property
    def _routes_by_ring(self) -> dict[tuple[int, ...], dict[tuple[int, int], Route]]:
        out: dict[tuple[int, ...], dict[tuple[int, int], Route]] = {}
        for r in self.routing:
            out.setdefault(r.ring, {})[(r.src, r.dst)] = r
        return out

    def tokens(self, rank: int, layout: str = "linear") -> int:
        """Tokens ``rank`` holds in the ``linear`` layout (default), or in the attention layout."""
        return self.rank_tokens[0 if layout == "linear" else 1][rank]

    @cached_property
    def rank_tokens(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(linear, attention)``: the tokens each rank holds in each layout (the same tuple twice when the
        layouts are one). Example: linear ``[[(0, 0, 4)], []]``, attention ``[[(0, 0, 1)], [(0, 1, 4)]]``:
        ``((4, 0), (1, 3))``."""
        att = tuple(sum(e - s for _, s, e in rs) for rs in self.attention_layout)
        if self.linear_layout == self.attention_layout:
            return att, att
        return tuple(sum(e - s for _, s, e in rs) for rs in self.linear_layout), att

    def digest(self) -> str:
        """SHA-256 of the canonical JSON (cheap cross-rank agreement check)."""
        return hashlib.sha256(self.to_json(indent=None).encode()).hexdigest()

    # -- JSON ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The ``zeppelin-plan/1`` document (:func:`~.plan_json.plan_to_dict`)."""
        return plan_to_dict(self)

    def to_json(self, indent: int | None = None) -> str:
        """The document as text: compact (the digest's form, :func:`~.plan_json.plan_to_json`) or indented."""
        if indent is None:
            return plan_to_json(self)
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(
        cls,
        text: str | bytes | dict[str, Any],
        *,
        cluster: "Cluster | None" = None,
        cost_model: "CostModel | None" = None,
    ) -> "StepPlan":
        """Parse and validate a ``zeppelin-plan/1`` document (:func:`~.plan_json.plan_from_json`).

        A document without ``routing`` gets routes derived from ``cost_model``
        (or, without one, every idle NIC of ``cluster``; without a cluster,
        no routes). A missing ``predicted`` stays ``None``.
        """
        return plan_from_json(cls, text, cluster=cluster, cost_model=cost_model)
