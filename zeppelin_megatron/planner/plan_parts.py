"""The plan's parts: placements, sequences, rings, local slots, predictions and :class:`PlanError`.

:class:`~.plan.StepPlan` (``plan.py``) holds them; every name here is also
importable from :mod:`zeppelin_megatron.planner.plan`. No imports from the
rest of the planner: the JSON form (:mod:`.plan_json`), the checks
(:mod:`.plan_check`) and the ring order (:mod:`.ring_order`) build on this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["PlanError", "SequencePlan", "Ring", "LocalSlot", "RemapSlot", "REMAP_DIRECTIONS", "Prediction",
           "PLAN_SCHEMA", "PLACEMENTS",
           "Placement", "TokenRange", "LINEAR_LAYOUTS", "check_linear", "ORIGINS"]

PLAN_SCHEMA = "zeppelin-plan/1"
Placement = Literal["local", "intra_node", "inter_node"]
PLACEMENTS: tuple[str, ...] = ("local", "intra_node", "inter_node")
TokenRange = tuple[int, int, int]
LINEAR_LAYOUTS: tuple[str, ...] = ("token_balanced", "workload_balanced", "attention")
"""How a plan's linear layout was chosen (:attr:`~.plan.StepPlan.linear`; docs/planner.md, "Layouts"), in
the order ``plan_step`` prefers them on a tie."""
ORIGINS: tuple[str, ...] = ("packed", "grouped")
"""Where a plan's placement came from when not the partitioner's (:attr:`~.plan.StepPlan.origin`): a packed
candidate (:mod:`.packed`) or a CP-group candidate (:mod:`.grouped`)."""


class PlanError(ValueError):
    """A plan (or a request to make one) that is invalid."""


def check_linear(linear: object, linear_layout: object, attention_layout: object) -> None:
    """``linear`` is ``None`` or one of :data:`LINEAR_LAYOUTS`, and ``"attention"`` only with a linear
    layout equal to the attention layout.

    Raises:
        PlanError: naming the value, e.g. ``linear is 'balanced', expected one of [...]``.
    """
    if linear is None:
        return
    if not isinstance(linear, str) or linear not in LINEAR_LAYOUTS:
        raise PlanError(f"linear is {linear!r}, expected one of {list(LINEAR_LAYOUTS)}")
    if linear == "attention" and linear_layout != attention_layout:
        raise PlanError("linear is 'attention' but the linear layout differs from the attention layout")


@dataclass(frozen=True, slots=True)
class SequencePlan:
    """Sequence of ``length`` tokens: ``placement`` and its ``ranks`` (ring order when split);
    ``a2a``: block width of a head-parallel ring (:mod:`.head_parallel`; 1: a plain ring or local);
    ``part``: which part of its ring (:mod:`.ring_parts`): split sequences on the same ranks at the same
    width form one ring per part, run one after the other, each with its own transfers (0 for local ones).

    Example: ``SequencePlan(4096, "intra_node", (0, 1, 2, 3), a2a=4)``: one all-to-all over
    heads among ranks 0-3 (Ulysses), then one causal call per rank on its quarter of the heads.
    """

    length: int
    placement: Placement
    ranks: tuple[int, ...]
    a2a: int = 1
    part: int = 0


@dataclass(frozen=True, slots=True)
class Ring:
    """Split sequences that share one rank tuple, block width ``a2a`` and ``part``; executed as one ring
    (``a2a > 1``: head-parallel, :mod:`.head_parallel`, a ring of :attr:`blocks` blocks)."""

    ranks: tuple[int, ...]
    placement: Placement
    seqs: tuple[int, ...]
    a2a: int = 1
    part: int = 0

    @property
    def blocks(self) -> int:
        """Positions of the ring the K/V travel around: ``len(ranks) / a2a`` (1: Ulysses, no steps)."""
        return len(self.ranks) // self.a2a


@dataclass(frozen=True, slots=True)
class LocalSlot:
    """Local sequences ``seqs`` of ``rank`` run as one causal call inside ring ``ring``
    (an index into :attr:`StepPlan.rings`), after the rank's step-``step`` kernel and
    before that step's wait (``0 <= step <= g - 2``, ``g`` the ring's :attr:`Ring.blocks`),
    so they overlap the step's transfer or a late ring partner. ``step = -1`` (only in a
    head-parallel ring, ``a2a > 1``, Ulysses included): between the ``Post`` and the ``Wait``
    of the ring's ``heads`` all-to-all, before any of its kernels, so the call overlaps that
    all-to-all and the wait for the block's lanes still busy in earlier rings. The engine
    runs the call at the same place in backward.

    Example: ``LocalSlot(rank=3, ring=1, step=0, seqs=(7, 9))``: rank 3, a member of
    the second ring in queue order, runs sequences 7 and 9 right after that ring's
    diagonal (step 0) kernel; ``LocalSlot(rank=3, ring=2, step=-1, seqs=(4,))``, ring 2
    a Ulysses ring: sequence 4 runs while rank 3 waits in ring 2's ``heads`` all-to-all.
    """

    rank: int
    ring: int
    step: int
    seqs: tuple[int, ...]


REMAP_DIRECTIONS = ("to_attention", "to_linear")
"""The two layout exchanges of a layer: ``to_attention`` (the remap in, before attention) and
``to_linear`` (the remap out, after it)."""


@dataclass(frozen=True, slots=True)
class RemapSlot:
    """Local sequences ``seqs`` of ``rank`` run as one causal call while the layout exchange
    ``direction`` is in flight: after the rank posts it, before it waits (forward and backward).
    Each sequence is *staying*: local on ``rank`` and whole on ``rank`` in the linear layout too
    (one linear range ``(seq, 0, length)``), so its q/k/v rows are in the rank's linear buffers and
    need no remapped row (:mod:`.remap_windows`).

    Example: ``RemapSlot(rank=2, direction="to_attention", seqs=(5, 9))``: rank 2 computes the
    attention of sequences 5 and 9 from its linear rows while the remap in moves other rows.
    """

    rank: int
    direction: str
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
