"""Strategies: Zeppelin, its ablations and the baselines, all as :class:`StepPlan` s.

``plan_with(name, lengths, cluster, cost_model, **options)`` returns a
:class:`StrategyPlan`: the plan plus how its attention communicates
(``ring``: zigzag ring P2P, what the runtime executes; ``allgather``: K/V
all-gathered over each group; ``ulysses``: head-scattering all-to-alls over
each group). The simulator reads ``attention_comm`` to model each group's
traffic; for non-ring kinds a "ring" of the plan is simply a group of ranks
sharing sequences.

``lower-bound`` is not a plan: it is computed by
:func:`zeppelin_megatron.sim.bounds.lower_bound_ms` and listed in
:data:`BOUND_NAMES`, not in :data:`STRATEGY_NAMES`; ``plan_with("lower-bound")``
raises ``ValueError`` saying so.

Options (keyword, all optional): ``cp_size`` (te-cp, te-cp-routing,
allgather-cp, wlb-llm: a fixed CP size instead of the per-batch best),
``max_seqlen_per_rank`` (hybrid-dp, megatron-hcp), ``max_group`` (flexsp),
``a2a`` and ``p2p`` (te-cp-a2a-p2p: both or neither), ``buffer_bytes`` and
``min_tolerance`` (distca: its all-to-all buffer, default no limit, and
``MIN_TOLERANCE_FACTOR``, default the best simulated per batch). Unknown options raise ``TypeError``.

The peers ``megatron-hcp``, ``te-cp-a2a-p2p`` and ``distca`` (``docs/peers.md``)
return a :class:`~.peer_plan.PeerPlan` whose ``peer`` field carries their own
schedule; their ``attention_comm`` (``hcp``, ``a2a_p2p``, ``distca``) selects their
program builders in :mod:`~.peer_programs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from ..planner.api import check_lengths, plan_step
from ..planner.options import PlannerOptions
from ..planner.cluster import Cluster
from ..planner.cost_model import CostModel
from ..planner.plan import StepPlan
from .peer_plan import PEER_COMMS

__all__ = ["StrategyPlan", "STRATEGY_NAMES", "PEER_NAMES", "BOUND_NAMES", "ATTENTION_COMMS", "plan_with", "describe"]

AttentionComm = Literal["ring", "allgather", "ulysses", "hcp", "a2a_p2p", "distca"]
ATTENTION_COMMS: tuple[str, ...] = ("ring", "allgather", "ulysses")
"""Kinds the runtime-shaped program (and ``zeppelin replay``) handle; the peers' kinds
(:data:`~.peer_plan.PEER_COMMS`) have their own programs (``sim/peer_programs.py``)."""
_PEER_COMMS: tuple[str, ...] = PEER_COMMS


@dataclass(frozen=True, kw_only=True)
class StrategyPlan:
    """A strategy's plan for one step and how its attention groups communicate."""

    name: str
    plan: StepPlan
    attention_comm: AttentionComm
    note: str = ""

    def __post_init__(self) -> None:
        if self.attention_comm not in ATTENTION_COMMS + _PEER_COMMS:
            raise ValueError(f"attention_comm is {self.attention_comm!r}, expected one of "
                             f"{list(ATTENTION_COMMS + _PEER_COMMS)}")
        if not isinstance(self.plan, StepPlan):
            raise ValueError(f"plan must be a StepPlan, got {type(self.plan).__name__}")


def _zeppelin(**kw: Any) -> Callable[..., StrategyPlan]:
    def make(name: str, lengths: list[int], cluster: Cluster, cost: CostModel) -> StrategyPlan:
        plan = plan_step(lengths, cost, PlannerOptions(**kw))
        return StrategyPlan(name=name, plan=plan, attention_comm="ring",
                            note=", ".join(f"{k}={v}" for k, v in kw.items()))
    return make


def _te_cp(routing: bool) -> Callable[..., StrategyPlan]:
    def make(name: str, lengths: list[int], cluster: Cluster, cost: CostModel,
             cp_size: int | None = None) -> StrategyPlan:
        from .te_cp import te_cp_plan
        plan, cp = te_cp_plan(lengths, cluster, cost, cp_size=cp_size, routing=routing)
        how = "fixed" if cp_size is not None else "best predicted power of two for this batch"
        return StrategyPlan(name=name, plan=plan, attention_comm="ring", note=f"cp={cp} ({how})")
    return make


def _allgather(name: str, lengths: list[int], cluster: Cluster, cost: CostModel,
               cp_size: int | None = None) -> StrategyPlan:
    from .te_cp import allgather_estimate_ms, te_cp_plan

    plan, cp = te_cp_plan(lengths, cluster, cost, cp_size=cp_size,
                          score=lambda plan, cp: allgather_estimate_ms(plan, cost))
    how = "fixed" if cp_size is not None else "best estimated power of two for this batch"
    return StrategyPlan(name=name, plan=plan, attention_comm="allgather", note=f"cp={cp} ({how})")


def _hybrid_dp(name: str, lengths: list[int], cluster: Cluster, cost: CostModel,
               max_seqlen_per_rank: int | None = None) -> StrategyPlan:
    from .baselines import hybrid_dp_plan
    m = max_seqlen_per_rank if max_seqlen_per_rank is not None else -(-sum(lengths) // cluster.world_size)
    return StrategyPlan(name=name, plan=hybrid_dp_plan(lengths, cluster, cost, m), attention_comm="ring",
                        note=f"max_seqlen_per_rank={m}")


def _wlb_llm(name: str, lengths: list[int], cluster: Cluster, cost: CostModel,
             cp_size: int | None = None) -> StrategyPlan:
    from .baselines import wlb_llm_plan
    plan, cp, rule = wlb_llm_plan(lengths, cluster, cost, cp_size=cp_size)
    how = "fixed" if cp_size is not None else "best simulated power of two for this batch"
    return StrategyPlan(name=name, plan=plan, attention_comm="ring", note=f"cp={cp} ({how}), sharding rule {rule}")


def _flexsp(name: str, lengths: list[int], cluster: Cluster, cost: CostModel,
            max_group: int | None = None) -> StrategyPlan:
    from .flexsp import flexsp_plan
    kw = {} if max_group is None else {"max_group": max_group}
    plan, sol = flexsp_plan(lengths, cluster, cost, **kw)
    sizes = ", ".join(f"{n}x{d}" for d, n in zip(sol.classes, sol.groups) if n)
    return StrategyPlan(name=name, plan=plan, attention_comm="ulysses",
                        note=f"groups {sizes}; MILP T={sol.makespan_ms:.2f} ms/layer, {sol.solves} optimal solves")


def _megatron_hcp(name: str, lengths: list[int], cluster: Cluster, cost: CostModel,
                  max_seqlen_per_rank: int | None = None) -> StrategyPlan:
    from .megatron_hcp import hcp_plan
    plan, S = hcp_plan(lengths, cluster, cost, max_seqlen_per_rank=max_seqlen_per_rank)
    how = "fixed" if max_seqlen_per_rank is not None else "best simulated power of two for this batch"
    return StrategyPlan(name=name, plan=plan, attention_comm="hcp",
                        note=f"max_seqlen_per_rank={S} ({how}), {len(plan.peer.groups)} groups")


def _te_cp_a2a_p2p(name: str, lengths: list[int], cluster: Cluster, cost: CostModel,
                   a2a: int | None = None, p2p: int | None = None) -> StrategyPlan:
    from .te_cp_a2a_p2p import a2a_p2p_plan
    plan, sizes = a2a_p2p_plan(lengths, cluster, cost, a2a=a2a, p2p=p2p)
    how = "fixed" if a2a is not None else "best simulated sizes for this batch"
    return StrategyPlan(name=name, plan=plan, attention_comm="a2a_p2p",
                        note=f"cp={sizes.cp} = a2a {sizes.a2a} x p2p {sizes.p2p} ({how})")


def _distca(name: str, lengths: list[int], cluster: Cluster, cost: CostModel,
            buffer_bytes: int | None = None, min_tolerance: float | None = None) -> StrategyPlan:
    from .distca import distca_plan
    kw: dict[str, Any] = {"min_tolerance": min_tolerance}
    if buffer_bytes is not None:
        kw["buffer_bytes"] = buffer_bytes
    plan = distca_plan(lengths, cluster, cost, **kw)
    sched = plan.peer
    how = "from min_tolerance" if min_tolerance is not None else "best simulated that fits the buffer"
    return StrategyPlan(name=name, plan=plan, attention_comm="distca",
                        note=f"tolerance={sched.tolerance:g} ({how}), {sched.shards} attention shards, "
                             f"a2a buffer {sched.buffer_peak / 2**30:.2f} GiB")


_DESCRIPTIONS: dict[str, str] = {
    "zeppelin": "Zeppelin: hierarchical partitioning + routing + remapping (per step, where predicted to pay)",
    "zeppelin-no-routing": "Zeppelin without NIC-aware routing",
    "zeppelin-no-remap": "Zeppelin without remapping (linear modules on the attention layout, every step)",
    "zeppelin-partition-only": "Zeppelin partitioning + engine only (no routing, no remapping, no packed candidates)",
    "zeppelin-no-inter": "Zeppelin with local and intra-node placements only",
    "zeppelin-local-only": "Zeppelin with the local placement only (sequences too long for a GPU still split)",
    "zeppelin-no-head-parallel": "Zeppelin without head-parallel rings (every split sequence a plain zigzag ring)",
    "zeppelin-no-remap-overlap": "Zeppelin without remap windows (no staying local sequence runs while the layout "
                                 "exchanges are in flight; PlannerOptions(remap_overlap=False))",
    "zeppelin-remap-always": "Zeppelin with the linear layout forced token-balanced (a remap every step; no per-step "
                             "choice of layout)",
    "zeppelin-no-packed": "Zeppelin without packed candidates (no WLB-LLM-style placement balancing attention + "
                          "linear work with no remap; PlannerOptions(packed=False))",
    "zeppelin-no-threshold-packing": "Zeppelin without the packed candidates that shard every document from the "
                                     "head-parallel threshold on (PlannerOptions(packed_threshold=False))",
    "zeppelin-no-share-packing": "Zeppelin without the packed candidates that shard only the documents that kept "
                                 "whole would exceed a rank's mean work (PlannerOptions(packed_share=False))",
    "zeppelin-no-wide-groups": "Zeppelin without the packed candidates whose longest documents get wide spans, rings "
                               "over 2, 4, ... times the CP size (PlannerOptions(packed_wide=False))",
    "zeppelin-no-ring-parts": "Zeppelin without ring parts (a head-parallel ring of several documents always one "
                              "ring: its all-to-alls never overlap a second part's calls; PlannerOptions(ring_parts="
                              "False))",
    "zeppelin-no-led-packing": "Zeppelin without led packed candidates (the longest documents on a leading group "
                               "of nodes, the rest packed after it; PlannerOptions(packed_leads=False))",
    "zeppelin-no-filled-lead": "Zeppelin without filled-lead packed candidates (the longest documents on a ring "
                               "over 2, 4, ... ranks of a node or 1, 2, 4, ... whole nodes, that also take whole "
                               "documents; PlannerOptions(packed_fill=False))",
    "zeppelin-no-packed-absorb": "Zeppelin's packings without rings absorbing whole documents from their group's "
                                 "busiest rank (PlannerOptions(packed_absorb=False))",
    "zeppelin-no-whole-moves": "Zeppelin without trading the kept packing's whole documents off its busiest ranks "
                               "or moving documents between its head-parallel rings "
                               "(PlannerOptions(packed_moves=False))",
    "zeppelin-rerank": "Zeppelin ranking its packed candidates by their steps after whole-document trades "
                       "(PlannerOptions(packed_rerank=True), opt-in)",
    "zeppelin-grouped": "Zeppelin also trying TE-CP-a2a+p2p-style whole-node CP groups as candidates "
                        "(PlannerOptions(grouped=True), opt-in)",
    "te-cp": "TE CP: fixed CP groups, every sequence zigzag-split over its group, packed by tokens",
    "te-cp-routing": "TE CP plus Zeppelin's NIC-aware routing of cross-node ring hops (routing alone)",
    "allgather-cp": "all-gather K/V CP (LLaMA-3 style): TE CP's groups, K/V all-gathered, dK/dV reduce-scattered",
    "hybrid-dp": "Hybrid DP (Megatron --hybrid-context-parallel, simplified): short sequences whole, long ones on "
                 "power-of-two CP groups",
    "wlb-llm": "WLB-LLM: workload-aware packing into CP groups + per-document sharding where it pays",
    "flexsp": "FlexSP: per-sequence Ulysses group sizes from a MILP (scipy.optimize.milp)",
    "megatron-hcp": "Megatron --hybrid-context-parallel as megatron-core 0.16 runs it: BalancedCPScheduler groups, "
                    "one microbatch per sequence, a barrier per group, TE CP ring per CP group",
    "te-cp-a2a-p2p": "TE CP a2a+p2p: all-to-all head parallelism inside a node, a ring across nodes (sizes per batch)",
    "distca": "DistCA: equal-token linear layout, attention shards balanced by FLOPs and moved by all-to-alls, "
              "two nano-batches ping-ponging communication and compute",
}

_MAKERS: dict[str, Callable[..., StrategyPlan]] = {
    "zeppelin": _zeppelin(),
    "zeppelin-no-routing": _zeppelin(routing=False),
    "zeppelin-no-remap": _zeppelin(remap=False),
    "zeppelin-partition-only": _zeppelin(routing=False, remap=False, packed=False),
    "zeppelin-no-inter": _zeppelin(placements=("local", "intra_node")),
    "zeppelin-local-only": _zeppelin(placements=("local",)),
    "zeppelin-no-head-parallel": _zeppelin(head_parallel=False),
    "zeppelin-no-remap-overlap": _zeppelin(remap_overlap=False),
    "zeppelin-remap-always": _zeppelin(remap=True),
    "zeppelin-no-packed": _zeppelin(packed=False),
    "zeppelin-no-threshold-packing": _zeppelin(packed_threshold=False),
    "zeppelin-no-share-packing": _zeppelin(packed_share=False),
    "zeppelin-no-wide-groups": _zeppelin(packed_wide=False),
    "zeppelin-no-ring-parts": _zeppelin(ring_parts=False),
    "zeppelin-no-led-packing": _zeppelin(packed_leads=False),
    "zeppelin-no-filled-lead": _zeppelin(packed_fill=False),
    "zeppelin-no-packed-absorb": _zeppelin(packed_absorb=False),
    "zeppelin-no-whole-moves": _zeppelin(packed_moves=False),
    "zeppelin-rerank": _zeppelin(packed_rerank=True),
    "zeppelin-grouped": _zeppelin(grouped=True),
    "te-cp": _te_cp(routing=False),
    "te-cp-routing": _te_cp(routing=True),
    "allgather-cp": _allgather,
    "hybrid-dp": _hybrid_dp,
    "wlb-llm": _wlb_llm,
    "flexsp": _flexsp,
    "megatron-hcp": _megatron_hcp,
    "te-cp-a2a-p2p": _te_cp_a2a_p2p,
    "distca": _distca,
}

STRATEGY_NAMES: tuple[str, ...] = tuple(_MAKERS)
PEER_NAMES: tuple[str, ...] = ("te-cp", "allgather-cp", "hybrid-dp", "wlb-llm", "flexsp", "megatron-hcp",
                               "te-cp-a2a-p2p", "distca")
"""The peers: what a Megatron user would run instead of Zeppelin, each as its code runs (docs/peers.md), and what a
*best peer* is chosen from (``zeppelin simulate``'s verdict line, docs/BENCHMARKS.md's tables). Not the Zeppelin
ablations, nor ``te-cp-routing`` (TE CP with Zeppelin's routing: an ablation of routing, not a peer)."""
BOUND_NAMES: tuple[str, ...] = ("lower-bound",)


def describe(name: str) -> str:
    """One line saying what strategy (or bound) ``name`` is."""
    if name == "lower-bound":
        return "lower bound: total work / GPUs, no exposed communication (computed, not planned)"
    _check_name(name)
    return _DESCRIPTIONS[name]


def _check_name(name: str) -> None:
    if name in BOUND_NAMES:
        raise ValueError(f"{name!r} is computed, not planned: use zeppelin_megatron.sim.bounds.lower_bound_ms")
    if name not in _MAKERS:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGY_NAMES)}")


def plan_with(
    name: str, lengths: Sequence[int], cluster: Cluster, cost_model: CostModel, **options: Any
) -> StrategyPlan:
    """Plan one step of ``lengths`` on ``cluster`` with strategy ``name``.

    Raises:
        ValueError: unknown ``name`` (the message lists the known ones).
        PlanError: lengths the strategy cannot place (empty, ``<= 0``, beyond capacity).
        TypeError: an option the strategy does not take.
    """
    _check_name(name)
    if cost_model.cluster != cluster:
        raise ValueError("cost_model was built for another cluster; build it with this cluster")
    lengths = check_lengths(lengths, cluster)
    return _MAKERS[name](name, lengths, cluster, cost_model, **options)
