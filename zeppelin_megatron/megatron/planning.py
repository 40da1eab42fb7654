"""From Megatron's flags to a planner: model shape, then :func:`~zeppelin_megatron.planner.setup.build_planning`.

Pure apart from reading the cluster YAML and the profile JSON once. The
cluster, tensor-parallel and capacity rules are the planner's
(:mod:`zeppelin_megatron.planner.setup`), the same for ``zeppelin plan``,
``zeppelin simulate`` and training: with ``--tensor-model-parallel-size t`` a
Zeppelin rank is one TP group of ``t`` GPUs (``G / t`` ranks per node) holding
``t x`` the per-GPU token capacity. What is checked here is the job itself
(the cluster matches the world size and the processes per node; a micro-batch
fits a rank), and every error names the flag.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..planner import (
    Cluster,
    ClusterError,
    CostModel,
    ModelError,
    ModelShape,
    PlanError,
    ProfileError,
    load_cluster,
    load_profile,
)
from ..planner.capacity_level import budget_margin, placeable_budget
from ..planner.options import REMAP_WORDS
from ..planner.setup import PlanningSetup, build_planning, check_cluster_shape
from .arguments import ZeppelinArgsError, ZeppelinConfig
from .run_shape import ZeppelinParallel

__all__ = [
    "model_shape_from_args",
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


def _not_a_directory(path: str | None, flag: str) -> None:
    if path and Path(path).is_dir():
        raise ZeppelinArgsError(f"{flag} {path}: is a directory, expected a file")


def _physical_cluster(cfg: ZeppelinConfig, *, world_size: int, gpus_per_node: int) -> Cluster:
    _not_a_directory(cfg.cluster.partition("@")[2] or cfg.cluster, "--zeppelin-cluster")
    try:
        check_cluster_shape(cfg.cluster)
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


HEADROOM = 1.05
"""Rank capacity over ``mbs * seq_length`` below which the start-up line warns that the fullest micro-steps are
balanced with few tokens to spare (predicted on the sampler's micro-steps at 1.0 against 1.05: mean steps at most
0.7% slower on five of seven settings, 5% slower on one, and one micro-step 99.94% full packed by tokens on the seventh;
docs/planner.md, "When tokens are tight")."""


@dataclass(frozen=True, kw_only=True)
class ZeppelinSetup:
    """Everything a Zeppelin run derives at start-up (identical on every rank).

    ``planning`` is the planner's :class:`PlanningSetup`; ``planner`` (the
    same object) plans a micro-step: ``setup.planner(lengths) -> StepPlan``.
    """

    config: ZeppelinConfig
    parallel: ZeppelinParallel
    model: ModelShape
    planning: PlanningSetup

    @property
    def cluster(self) -> Cluster:
        """The planner's cluster of Zeppelin ranks (TP-reduced, per-rank capacity)."""
        return self.planning.cluster

    @property
    def cost(self) -> CostModel:
        return self.planning.cost

    @property
    def planner(self) -> PlanningSetup:
        return self.planning

    @property
    def token_budget(self) -> int:
        """Tokens of one micro-step over the group (the sampler's budget): Megatron's ``mbs * seq_length * N``
        (:attr:`ZeppelinParallel.token_budget`), capped at ``N * (capacity - margin)`` when ``N >= 2``, ``margin`` =
        :func:`~zeppelin_megatron.planner.capacity_level.budget_margin` (``capacity / 256``, at least 5), so that
        every micro-step gets a plan (the guarantee of ``capacity_level``) balanced in time (off the last tokens).
        Example: ``--seq-length 8192 --micro-batch-size 1``, ``--zeppelin-tokens-per-gpu 8192``, 32 ranks:
        ``32 * 8160 = 261,120`` tokens (Megatron's 262,144 less 1024); with 8224 or more per rank, Megatron's
        262,144."""
        return placeable_budget(self.parallel.token_budget, self.parallel.zeppelin_ranks, self.cluster.tokens_per_gpu)

    def _budget_note(self) -> str:
        p, cap = self.parallel, self.cluster.tokens_per_gpu
        cut = p.token_budget - self.token_budget
        note = "" if cut == 0 else (f" ({cut} fewer than --micro-batch-size x --seq-length x {p.zeppelin_ranks}, so "
                                    f"that every micro-step leaves {budget_margin(cap)} tokens per rank free and "
                                    "gets a plan balanced in time)")
        if p.zeppelin_ranks > 1 and cap < HEADROOM * p.micro_batch_size * p.seq_length:
            note += (f" [{cap} tokens per rank is within {HEADROOM - 1:.0%} of --micro-batch-size x --seq-length: "
                     "the fullest micro-steps are balanced with few tokens to spare, predicted up to 5% slower "
                     "(docs/planner.md, 'When tokens are tight')]")
        return note

    def _schedule_note(self) -> str:
        p = self.parallel
        r, steps = p.rampup, p.step_batch_size_schedule
        spm = p.samples_per_micro_step
        notes = "".join(f" [{n}]" for n in p.notes)
        if r is not None:
            flag = f"--rampup-batch-size {r[0]} {r[1]} {r[2]}"
        elif steps is not None:
            flag = f"--step-batch-size-schedule {steps!r} (thresholds in tokens)"
        else:
            return notes
        return f" ({p.schedule.first_micro_steps} at first: {flag}, micro-steps of {spm} samples){notes}"

    def describe(self) -> str:
        c, p, o = self.cluster, self.parallel, self.planning.options
        return (
            f"zeppelin: {p.nodes} nodes x {p.gpus_per_node} GPUs, TP {p.tensor_parallel} -> {p.zeppelin_ranks} "
            f"Zeppelin ranks ({c.gpus_per_node} per node, {c.nics_per_node} NICs per node at {c.nic_Gbps:g} Gb/s "
            f"for the group), {c.tokens_per_gpu} tokens per rank; micro-step budget {self.token_budget} tokens"
            f"{self._budget_note()}, "
            f"{p.num_micro_batches} micro-steps per step{self._schedule_note()}; "
            f"routing {'on' if o.routing else 'off'}, "
            f"remap {REMAP_WORDS[o.remap]}{self._padding_note()}"
        )

    def _padding_note(self) -> str:
        p = self.parallel
        if p.pad_to_multiple == 1:
            return ""
        why = [w for w, on in ((f"sequence parallelism over TP {p.tensor_parallel}", p.sequence_parallel),
                               (f"low-precision GEMMs need multiples of {p.gemm_row_align} rows",
                                p.gemm_row_align > 1)) if on]
        return f"; each rank's rows padded to a multiple of {p.pad_to_multiple} ({', '.join(why)})"


def build_setup(cfg: ZeppelinConfig, parallel: ZeppelinParallel, model: ModelShape) -> ZeppelinSetup:
    """Cluster, cost model and planner of a run; raises :class:`ZeppelinArgsError` (naming the flag) on any
    mismatch."""
    physical = _physical_cluster(cfg, world_size=parallel.world_size, gpus_per_node=parallel.gpus_per_node)
    _not_a_directory(cfg.profile, "--zeppelin-profile")
    try:
        profile = load_profile(cfg.profile)
    except ProfileError as exc:
        raise ZeppelinArgsError(f"--zeppelin-profile {cfg.profile}: {exc}") from None
    tp = parallel.tensor_parallel
    try:
        planning = build_planning(physical, model, profile, tensor_parallel=tp, options=cfg.options)
    except ClusterError as exc:
        raise ZeppelinArgsError(f"--tensor-model-parallel-size {tp} on --zeppelin-cluster {cfg.cluster}: {exc}") \
            from None
    except (ModelError, PlanError) as exc:
        raise ZeppelinArgsError(f"cannot build the Zeppelin cost model: {exc}") from None
    per_rank = parallel.micro_batch_size * parallel.seq_length
    cap = planning.cluster.tokens_per_gpu
    if per_rank > cap:
        raise ZeppelinArgsError(
            f"--micro-batch-size {parallel.micro_batch_size} x --seq-length {parallel.seq_length} = {per_rank} "
            f"tokens per Zeppelin rank exceeds the rank's capacity of {cap} tokens ({tp} GPU(s) x "
            f"{physical.tokens_per_gpu} tokens per GPU: --zeppelin-tokens-per-gpu or tokens_per_gpu in the "
            "cluster file)"
        )
    setup = ZeppelinSetup(config=cfg, parallel=parallel, model=model, planning=planning)
    if setup.token_budget < parallel.seq_length:
        raise ZeppelinArgsError(
            f"a micro-step of {setup.token_budget} tokens ({parallel.zeppelin_ranks} ranks x ({cap} - "
            f"{budget_margin(cap)}) tokens kept free per rank) cannot hold a sequence of --seq-length "
            f"{parallel.seq_length}: raise --zeppelin-tokens-per-gpu"
        )
    return setup
