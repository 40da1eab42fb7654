"""From Megatron's flags to a planner: model shape, Zeppelin cluster, cost model.

Pure apart from reading the cluster YAML and the profile JSON once.

Tensor parallelism. A Zeppelin group is the data-parallel ranks of one TP rank
(Megatron orders ranks TP-innermost), so a node holds ``G / TP`` Zeppelin ranks
and Zeppelin local rank ``l`` of TP rank ``t`` is GPU ``l * TP + t``::

    8 GPUs, TP = 2:  TP rank 0 -> GPUs 0 2 4 6 (Zeppelin locals 0 1 2 3)
                     TP rank 1 -> GPUs 1 3 5 7 (Zeppelin locals 0 1 2 3)

Every TP rank must run the same plan (a TP group shares its tokens), so the
reduced cluster must not depend on ``t``: its NIC map lists, for Zeppelin local
``l``, the NIC of GPU ``l * TP + t`` renumbered over the NICs the group uses,
and it must come out the same for every ``t`` (it does for rail-aligned maps,
one NIC per GPU or per GPU pair). All TP groups send at once, so a NIC shared
with GPUs of other TP ranks gives this group only its share of the bandwidth::

    A800, gpu_nic = [0,0,1,1,2,2,3,3], TP = 2
      TP rank 0 uses GPUs 0 2 4 6 -> NICs 0 1 2 3 -> reduced map [0,1,2,3]
      each NIC carries GPUs of both TP ranks -> share 1/2 -> nic_Gbps 200 -> 100
    H100, gpu_nic = [0..7], TP = 2 -> reduced map [0,1,2,3], share 1 (own rail)

With an uneven share (exotic maps) the smallest is used (conservative).
NVLink is not reduced: TP all-reduces also use it, which the cost model does
not see.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Literal, Sequence

from ..planner import (
    PlannerOptions,
    Cluster,
    ClusterError,
    CostModel,
    ModelError,
    ModelShape,
    ProfileError,
    StepPlan,
    load_cluster,
    load_profile,
    plan_step,
)
from .arguments import ZeppelinArgsError, ZeppelinConfig, ZeppelinParallel

__all__ = [
    "model_shape_from_args",
    "reduce_cluster_for_tp",
    "build_zeppelin_cluster",
    "build_cost_model",
    "make_planner",
    "Planner",
    "ZeppelinSetup",
    "build_setup",
]


def megatron_ffn_hidden_size(args: argparse.Namespace) -> int:
    """``--ffn-hidden-size`` or Megatron's default for it (as ``validate_args`` sets at core_v0.16.1)."""
    if getattr(args, "ffn_hidden_size", None):
        return int(args.ffn_hidden_size)
    h = args.hidden_size
    return int((4 * h * 2 / 3) / 64) * 64 if getattr(args, "swiglu", False) else 4 * h


def model_shape_from_args(args: argparse.Namespace) -> ModelShape:
    """The cost model's :class:`ModelShape` from Megatron's model flags.

    The cost model assumes a gated MLP (3 GEMMs of ``hidden x ffn``); a plain
    MLP of width ``F`` (2 GEMMs, no ``--swiglu``) has the weights of a gated one
    of width ``2F/3``, which is what is passed (e.g. F = 16384 -> 10923).
    """
    problems = [f"--{n.replace('_', '-')} is required" for n in ("num_layers", "hidden_size", "num_attention_heads")
                if not getattr(args, n, None)]
    if problems:
        raise ZeppelinArgsError("cannot build the Zeppelin cost model: " + "; ".join(problems))
    heads = args.num_attention_heads
    kv = args.num_query_groups if getattr(args, "group_query_attention", False) and args.num_query_groups else heads
    ffn = megatron_ffn_hidden_size(args)
    if not getattr(args, "swiglu", False):
        ffn = max(1, round(2 * ffn / 3))
    vocab = getattr(args, "padded_vocab_size", None) or getattr(args, "vocab_size", None) or 32000
    try:
        return ModelShape(name="megatron", layers=args.num_layers, hidden=args.hidden_size, q_heads=heads,
                          kv_heads=kv, ffn=ffn, vocab=vocab, head_dim=getattr(args, "kv_channels", None) or 0)
    except ModelError as exc:
        raise ZeppelinArgsError(f"model flags do not describe a model Zeppelin can cost: {exc}") from None


def reduce_cluster_for_tp(cluster: Cluster, tensor_parallel: int) -> tuple[Cluster, float]:
    """The cluster one Zeppelin group sees under TP, and its NIC bandwidth share.

    See the module docstring for the map and the share. ``tensor_parallel == 1``
    returns ``(cluster, 1.0)``.
    """
    tp = tensor_parallel
    gpn = cluster.gpus_per_node
    if tp < 1 or gpn % tp:
        raise ZeppelinArgsError(
            f"--tensor-model-parallel-size {tp} does not divide the cluster's {gpn} GPUs per node"
        )
    if tp == 1:
        return cluster, 1.0
    g = gpn // tp
    maps: list[tuple[int, ...]] = []
    share = 1.0
    for t in range(tp):
        nics = [cluster.gpu_nic[l * tp + t] for l in range(g)]
        used = sorted(set(nics))
        maps.append(tuple(used.index(n) for n in nics))
        for n in used:
            share = min(share, nics.count(n) / cluster.gpus_sharing_nic(n))
    if any(m != maps[0] for m in maps[1:]):
        raise ZeppelinArgsError(
            f"cluster {cluster.name or '<unnamed>'}: with TP {tp} the TP ranks see different NIC maps "
            f"{[list(m) for m in maps]} (gpu_nic = {list(cluster.gpu_nic)}); every TP rank must run the same "
            "plan, so Zeppelin needs a NIC map that is the same for each TP rank's GPUs"
        )
    reduced = replace(
        cluster,
        gpus_per_node=g,
        nics_per_node=len(set(maps[0])),
        gpu_nic=maps[0],
        nic_Gbps=cluster.nic_Gbps * share,
        name=f"{cluster.name or 'cluster'}/tp{tp}",
    )
    return reduced, share


def _physical_cluster(cfg: ZeppelinConfig, *, world_size: int, gpus_per_node: int) -> Cluster:
    try:
        cluster = load_cluster(cfg.cluster, tokens_per_gpu=cfg.tokens_per_gpu)
    except ClusterError as exc:
        raise ZeppelinArgsError(f"--zeppelin-cluster {cfg.cluster}: {exc}") from None
    if cluster.gpus_per_node != gpus_per_node:
        raise ZeppelinArgsError(
            f"--zeppelin-cluster {cfg.cluster} has {cluster.gpus_per_node} GPUs per node but the job runs "
            f"{gpus_per_node} processes per node"
        )
    if cluster.world_size != world_size:
        raise ZeppelinArgsError(
            f"--zeppelin-cluster {cfg.cluster} describes {cluster.nodes} x {cluster.gpus_per_node} = "
            f"{cluster.world_size} GPUs but the job has world size {world_size}; set the node count, e.g. "
            f"--zeppelin-cluster {world_size // gpus_per_node}x{gpus_per_node}@<cluster.yaml>"
        )
    return cluster


def build_zeppelin_cluster(cfg: ZeppelinConfig, *, world_size: int, gpus_per_node: int,
                           tensor_parallel: int) -> Cluster:
    """The planner's cluster: ``--zeppelin-cluster`` checked against the job, reduced for TP."""
    physical = _physical_cluster(cfg, world_size=world_size, gpus_per_node=gpus_per_node)
    return reduce_cluster_for_tp(physical, tensor_parallel)[0]


def build_cost_model(cfg: ZeppelinConfig, model: ModelShape, cluster: Cluster, tensor_parallel: int,
                     *, nic_share: float = 1.0) -> CostModel:
    """Cost model for ``model`` on the (reduced) ``cluster`` with ``--zeppelin-profile``.

    ``nic_share`` scales a measured NIC bandwidth in the profile (``links.nic_GBps``,
    which overrides the cluster's) the way :func:`reduce_cluster_for_tp` scaled the
    cluster's.
    """
    try:
        profile = load_profile(cfg.profile)
    except ProfileError as exc:
        raise ZeppelinArgsError(f"--zeppelin-profile {cfg.profile}: {exc}") from None
    if profile.nic_GBps and nic_share != 1.0:
        profile = replace(profile, nic_GBps=profile.nic_GBps * nic_share)
    try:
        return CostModel(model=model, cluster=cluster, profile=profile, tensor_parallel=tensor_parallel)
    except ValueError as exc:
        raise ZeppelinArgsError(f"cannot build the Zeppelin cost model: {exc}") from None


_REMAP_WORDS = {True: "on", False: "off", "auto": "auto (per micro-step, where predicted to pay)"}


@dataclass(frozen=True)
class Planner:
    """``planner(lengths) -> StepPlan``: :func:`plan_step` with the run's options bound."""

    cluster: Cluster
    cost: CostModel
    routing: bool = True
    remap: bool | Literal["auto"] = True
    slack: float = 0.02
    min_ratio: float = 1.0
    placements: tuple[str, ...] = ("local", "intra_node", "inter_node")

    def __call__(self, lengths: Sequence[int]) -> StepPlan:
        return plan_step(lengths, self.cost, PlannerOptions(routing=self.routing, remap=self.remap, slack=self.slack, min_ratio=self.min_ratio, placements=self.placements))


def make_planner(cfg: ZeppelinConfig, cluster: Cluster, cost: CostModel) -> Planner:
    """The per-micro-step planner of a run (deterministic: same lengths, same plan)."""
    return Planner(cluster=cluster, cost=cost, routing=cfg.routing, remap=cfg.remap, slack=cfg.slack,
                   min_ratio=cfg.min_ratio, placements=cfg.placements)


@dataclass(frozen=True, kw_only=True)
class ZeppelinSetup:
    """Everything a Zeppelin run derives at start-up (identical on every rank)."""

    config: ZeppelinConfig
    parallel: ZeppelinParallel
    model: ModelShape
    cluster: Cluster
    cost: CostModel
    planner: Planner

    def describe(self) -> str:
        c, p = self.cluster, self.parallel
        return (
            f"zeppelin: {p.nodes} nodes x {p.gpus_per_node} GPUs, TP {p.tensor_parallel} -> {p.zeppelin_ranks} "
            f"Zeppelin ranks ({c.gpus_per_node} per node, {c.nics_per_node} NICs per node at {c.nic_Gbps:g} Gb/s "
            f"for the group), {c.tokens_per_gpu} tokens per rank; micro-step budget {p.token_budget} tokens, "
            f"{p.num_micro_batches} micro-steps per step; routing {'on' if self.config.routing else 'off'}, "
            f"remap {_REMAP_WORDS[self.config.remap]}"
        )


def build_setup(cfg: ZeppelinConfig, parallel: ZeppelinParallel, model: ModelShape) -> ZeppelinSetup:
    """Cluster, cost model and planner of a run; raises :class:`ZeppelinArgsError` on any mismatch."""
    physical = _physical_cluster(cfg, world_size=parallel.world_size, gpus_per_node=parallel.gpus_per_node)
    cluster, share = reduce_cluster_for_tp(physical, parallel.tensor_parallel)
    per_rank = parallel.micro_batch_size * parallel.seq_length
    if per_rank > cluster.tokens_per_gpu:
        raise ZeppelinArgsError(
            f"--micro-batch-size {parallel.micro_batch_size} x --seq-length {parallel.seq_length} = {per_rank} "
            f"tokens per Zeppelin rank exceeds the rank's capacity of {cluster.tokens_per_gpu} tokens "
            "(--zeppelin-tokens-per-gpu or tokens_per_gpu in the cluster file)"
        )
    cost = build_cost_model(cfg, model, cluster, parallel.tensor_parallel, nic_share=share)
    return ZeppelinSetup(config=cfg, parallel=parallel, model=model, cluster=cluster, cost=cost,
                         planner=make_planner(cfg, cluster, cost))
