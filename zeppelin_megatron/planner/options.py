"""``PlannerOptions``: the planner's settings, declared and validated once.

Every front end builds one of these: ``zeppelin plan`` / ``simulate`` from
their flags, training from ``--zeppelin-*`` flags
(:mod:`zeppelin_megatron.megatron.arguments`), the simulator's ablations
directly. :func:`~zeppelin_megatron.planner.api.plan_step` and the
partitioner read nothing else.

Example::

    >>> PlannerOptions(remap="auto", placements=("local", "intra_node")).remap
    'auto'
    >>> PlannerOptions(slack=1.5)
    Traceback (most recent call last):
    ...
    zeppelin_megatron.planner.plan.PlanError: slack is 1.5, expected a fraction in [0, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from .plan import PLACEMENTS, PlanError

__all__ = ["PlannerOptions", "REMAP_CHOICES", "REMAP_WORDS", "Remap"]

Remap = bool | Literal["auto"]

REMAP_CHOICES: tuple[Remap, ...] = ("auto", True, False)
"""Accepted values of :attr:`PlannerOptions.remap`."""

REMAP_WORDS: dict[Remap, str] = {True: "on", False: "off", "auto": "auto (per step, where predicted to pay)"}
"""How each remap setting reads in summaries and start-up messages."""


def _is_remap(value: object) -> bool:
    return value is True or value is False or (isinstance(value, str) and value == "auto")


@dataclass(frozen=True, kw_only=True)
class PlannerOptions:
    """Knobs of the planner (defaults are what users get).

    Raises:
        PlanError: a value outside its range (the message names the value and the limit).
    """

    routing: bool = True
    """Spread cross-node ring hops (and the remap's cross-node rows) over idle NICs where that pays."""
    remap: Remap = "auto"
    """``True``: linear modules on a token-balanced layout (remap all-to-alls every layer); ``False``:
    the linear layout is the attention layout; ``"auto"``: per step, the lowest predicted step among
    token-balanced, workload-balanced and the attention layout (:mod:`.layout_choice`)."""
    slack: float = 0.02
    """A GPU or node may exceed its target time by this fraction before splitting."""
    min_ratio: float = 1.0
    """Compute/communication ratio a split needs (1.0: the ring step's compute hides its transfer)."""
    placements: tuple[str, ...] = PLACEMENTS
    """Allowed placements (ablations; ``local`` always among them); sequences too long for one GPU still split."""
    balance_target: float = 1.05
    """Busiest-GPU over mean attention time a result should reach: results within it win over faster ones
    outside it (a more balanced plan may predict a step a few percent slower, through remap traffic)."""
    head_parallel: bool = True
    """Let each ring run head-parallel (:mod:`.choose_heads`): an all-to-all over heads inside blocks of
    its ranks, then a ring over the blocks (Ulysses when one block spans the ring), where the cost model
    predicts that ring faster than the plain one; ``False``: every ring plain (``a2a == 1``)."""
    remap_overlap: bool = True
    """Run staying local sequences while the layout exchanges are in flight (:mod:`.remap_windows`:
    ``StepPlan.remap_slots``), where the call fits the rank's predicted exchange time; ``False``: none."""
    packed: bool = True
    """Also try packed candidates (:mod:`.packed`: documents packed by attention + linear work per rank, WLB-LLM's
    placement, with the linear layout equal to the attention layout: no remap) and keep one whose predicted step
    under the engine's charges is lower. Not tried when ``remap`` is ``True`` (token-balanced layout forced)."""
    packed_threshold: bool = True
    """Among the packed candidates (with ``packed`` and head-parallel rings on), per CP size also the packing that
    shards every document from :func:`~.packed.head_parallel_threshold` on (ablation: ``False``)."""
    packed_share: bool = True
    """Among the packed candidates (with ``packed`` and head-parallel rings on), per CP size also the packing that
    shards only the documents from :func:`~.packed.share_threshold` on (those that kept whole would exceed a
    rank's mean work: FlexSP's choice of what to shard), where that is above the threshold packing's length
    (ablation: ``False``)."""
    packed_wide: bool = True
    """Among the packed candidates (with ``packed`` and head-parallel rings on), per CP size from 2 on also the
    threshold packing with wide spans (:func:`~.packed_wide.wide_spans`: the documents a CP group alone would load
    above the mean work per rank on rings over 2, 4, ... times the CP size, packed around; ablation: ``False``)."""
    ring_parts: bool = True
    """Split a head-parallel ring of several sequences into two or three parts run one after the other where
    the rank's timeline predicts it faster (:mod:`.ring_parts`: a later part's ``heads`` all-to-all flows under
    the earlier parts' calls, an earlier part's ``tokens`` one under the later parts'), on the chosen plan;
    ablation: ``False``."""
    packed_leads: bool = True
    """Among the packed candidates (with ``packed`` and head-parallel rings on), also the led packings
    (:mod:`.packed_search`: the longest documents on a leading group of nodes, the rest packed after it;
    ablation: ``False``)."""
    packed_fill: bool = True
    """Among the packed candidates (with ``packed`` and head-parallel rings on), also the filled-lead packings
    (:mod:`.packed_search`: the longest documents on a ring over the first 2, 4, ... ranks of a node or 1, 2, 4,
    ... whole nodes, which also take whole documents; the rest packed over the other ranks; ablation:
    ``False``)."""
    packed_absorb: bool = True
    """Zeppelin's packings (head-parallel work model) let a group's ring absorb whole documents from its busiest
    rank (:func:`~.packed.packed_groups`' ``absorb``: one more document on a ring costs its share of the work, no
    call of its own; ablation: ``False``)."""
    packed_moves: bool = True
    """The kept packed candidate's whole documents traded off its busiest ranks (moved, or swapped for shorter
    ones), documents moved between its head-parallel rings, and whole documents joining one, by the finished plan's
    own per-rank times (:mod:`.whole_moves`), kept where that predicts a lower step; ablation: ``False``."""
    packed_rerank: bool = False
    """Rank the packed candidates by their steps *after* their trades (:mod:`.packed_trades`, with ``packed_moves``):
    after the kept candidate's trades, candidates whose step before trades is up to
    :data:`~.packed_search.REACH` above that step, and whose :func:`~.packed_trades.trade_floor` is below it, are
    finished and traded too, and the lowest step after trades wins; led packings also offer their rest with wide
    spans. Off by default: simulated 0.2% faster steps on average on docs/BENCHMARKS.md's configurations (up to
    2%), for about 1.5x the planning time (over the 50 ms budget; docs/planner.md, "Post-trade ranking")."""
    grouped: bool = False
    """Also try TE-CP-a2a+p2p-style candidates (:mod:`.grouped`: every split sequence on a whole CP group of
    nodes, head-parallel) and keep one where it beats the partitioner's plan on both the predicted step and
    the rings' end with convoys (candidates whose :func:`~.grouped.step_floor` cannot win are not finished).
    Off by default: it raises planning time (1M long-tailed tokens on 128 GPUs: about 0.1 s CPU per step, 88-136
    ms per seed measured on 2026-11-24, against 38-40 ms median; over the 50 ms budget, because the winning
    candidate must be finished)
    and is simulated faster on prolong data at 64-128 GPUs only (docs/BENCHMARKS.md)."""

    def __post_init__(self) -> None:
        if not isinstance(self.routing, bool):
            raise PlanError(f"routing is {self.routing!r}, expected True or False")
        if not isinstance(self.head_parallel, bool):
            raise PlanError(f"head_parallel is {self.head_parallel!r}, expected True or False")
        if not isinstance(self.remap_overlap, bool):
            raise PlanError(f"remap_overlap is {self.remap_overlap!r}, expected True or False")
        if not isinstance(self.packed, bool):
            raise PlanError(f"packed is {self.packed!r}, expected True or False")
        for name in ("packed_threshold", "packed_share", "packed_wide", "packed_leads", "packed_fill", "packed_absorb",
                     "packed_moves", "packed_rerank", "ring_parts"):
            if not isinstance(getattr(self, name), bool):
                raise PlanError(f"{name} is {getattr(self, name)!r}, expected True or False")
        if not isinstance(self.grouped, bool):
            raise PlanError(f"grouped is {self.grouped!r}, expected True or False")
        if not _is_remap(self.remap):
            raise PlanError(f"remap is {self.remap!r}, expected one of {list(REMAP_CHOICES)}")
        if isinstance(self.slack, bool) or not isinstance(self.slack, (int, float)) or not 0 <= self.slack < 1:
            raise PlanError(f"slack is {self.slack!r}, expected a fraction in [0, 1)")
        if (isinstance(self.min_ratio, bool) or not isinstance(self.min_ratio, (int, float))
                or not self.min_ratio > 0):
            raise PlanError(f"min_ratio is {self.min_ratio!r}, expected a number > 0")
        if (isinstance(self.balance_target, bool) or not isinstance(self.balance_target, (int, float))
                or not self.balance_target >= 1.0):
            raise PlanError(f"balance_target is {self.balance_target!r}, expected a number >= 1.0")
        placements: Sequence[str] = self.placements
        if isinstance(placements, str):
            raise PlanError(f"placements is the string {placements!r}, expected a sequence of names "
                            f"from {list(PLACEMENTS)}")
        object.__setattr__(self, "placements", tuple(placements))
        bad = [p for p in self.placements if p not in PLACEMENTS]
        if bad or not self.placements or len(set(self.placements)) != len(self.placements):
            raise PlanError(f"placements {list(self.placements)}: expected distinct names from {list(PLACEMENTS)}, "
                            f"at least one")
        if "local" not in self.placements:
            raise PlanError(f"placements {list(self.placements)}: 'local' cannot be left out (the planner keeps a "
                            "sequence whole when no allowed split pays); drop intra_node or inter_node to ablate them")
