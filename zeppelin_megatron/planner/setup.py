"""One builder: cluster, model, profile, tensor parallelism, capacity, options -> what planning needs.

Every front end plans through :func:`build_planning`: ``zeppelin plan``,
``simulate`` and ``replay`` from their flags, training from the ``--zeppelin-*``
flags (:mod:`zeppelin_megatron.megatron.planning`), and ``zeppelin demo``. So
``zeppelin plan --tensor-parallel 2``, the simulator's ``zeppelin`` strategy and
a training run with ``--tensor-model-parallel-size 2`` plan the same lengths to
the same :class:`~zeppelin_megatron.planner.plan.StepPlan`.

Tensor parallelism. With TP size ``t`` a Zeppelin rank is one TP group of ``t``
GPUs: Megatron orders ranks TP-innermost, and the Zeppelin group is the
data-parallel ranks of one TP rank, so a node of ``G`` GPUs holds ``G / t``
Zeppelin ranks and Zeppelin local rank ``l`` of TP rank ``r`` is GPU
``l * t + r``::

    8 GPUs, TP = 2:  TP rank 0 -> GPUs 0 2 4 6 (Zeppelin locals 0 1 2 3)
                     TP rank 1 -> GPUs 1 3 5 7 (Zeppelin locals 0 1 2 3)

Every TP rank must run the same plan (a TP group shares its tokens), so the
reduced cluster must not depend on ``r``: its NIC map lists, for Zeppelin local
``l``, the NIC of GPU ``l * t + r`` renumbered over the NICs the group uses,
and it must come out the same for every ``r`` (it does for rail-aligned maps,
one NIC per GPU or per GPU pair). All TP groups send at once, so a NIC shared
with GPUs of other TP ranks gives this group only its share of the bandwidth
(the cluster's ``nic_Gbps`` and a profile's measured ``links.nic_GBps`` both)::

    A800, gpu_nic = [0,0,1,1,2,2,3,3], TP = 2
      TP rank 0 uses GPUs 0 2 4 6 -> NICs 0 1 2 3 -> reduced map [0,1,2,3]
      each NIC carries GPUs of both TP ranks -> share 1/2 -> nic_Gbps 200 -> 100
    H100, gpu_nic = [0..7], TP = 2 -> reduced map [0,1,2,3], share 1 (own rail)

With an uneven share (exotic maps) the smallest is used (conservative).
NVLink is not reduced: TP all-reduces also use it, which the cost model does
not see. The cost model divides heads and linear weights by ``t``.

Token capacity of a TP group (decided here, once). ``tokens_per_gpu`` (the
cluster file's, or a ``--tokens-per-gpu`` / ``--zeppelin-tokens-per-gpu``
override) is always *per GPU*: the attention-layout tokens one GPU's memory
holds for the model at TP 1. A Zeppelin rank of ``t`` GPUs holds the same
sequence tokens on all ``t`` GPUs, but each GPU keeps only ``1/t`` of the
heads (Q/K/V, attention output, the ring's K/V buffers) and ``1/t`` of the MLP
activations, and with sequence parallelism (which Megatron users turn on with
TP) ``1/t`` of the LayerNorm/dropout activations too: per token, a GPU of the
group stores ``1/t`` of what it stores at TP 1. So the rank's capacity is
``t x tokens_per_gpu``::

    h100.yaml tokens_per_gpu = 65536, TP = 2 -> 32 Zeppelin ranks of 131072 tokens on 4 x 8 GPUs

(without sequence parallelism the LayerNorm inputs are replicated over the TP
GPUs, so the figure is optimistic there: lower ``--tokens-per-gpu``). The
reduced cluster's ``tokens_per_gpu`` field is this per-rank capacity (for the
planner a Zeppelin rank is a "GPU").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from .api import plan_step
from .cluster import Cluster, ClusterError, load_cluster
from .cost_model import CostModel
from .model import ModelError, ModelShape, load_model
from .options import PlannerOptions
from .plan import PlanError, StepPlan
from .profile import CostProfile, ProfileError, load_profile

__all__ = ["PlanningSetup", "build_planning", "reduce_cluster_for_tp", "rank_capacity", "check_cluster_shape"]

_SHAPE = re.compile(r"^\s*(-?\d+)\s*[xX]\s*(-?\d+)\s*$")


def check_cluster_shape(spec: str | Path) -> None:
    """The ``NODESxGPUS`` part of a cluster spec (``4x8`` or ``4x8@file.yaml``), if any, has both numbers >= 1.

    >>> check_cluster_shape("4x0")
    Traceback (most recent call last):
    ...
    zeppelin_megatron.planner.cluster.ClusterError: cluster '4x0': GPUs per node is 0, expected at least 1
    """
    text = str(spec)
    shape, at, _ = text.partition("@")
    m = _SHAPE.match(shape)
    if not m:
        return
    for value, what in ((int(m.group(1)), "node count"), (int(m.group(2)), "GPUs per node")):
        if value < 1:
            raise ClusterError(f"cluster {text!r}: {what} is {value}, expected at least 1")


def _check_tp(tensor_parallel: object) -> int:
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) or tensor_parallel < 1:
        raise ClusterError(f"tensor parallel size is {tensor_parallel!r}, expected a positive integer")
    return tensor_parallel


def rank_capacity(tokens_per_gpu: int, tensor_parallel: int) -> int:
    """Attention-layout tokens one Zeppelin rank (a TP group) holds: ``tensor_parallel x tokens_per_gpu``.

    >>> rank_capacity(65536, 2)
    131072
    """
    return _check_tp(tensor_parallel) * tokens_per_gpu


def reduce_cluster_for_tp(cluster: Cluster, tensor_parallel: int) -> tuple[Cluster, float]:
    """The cluster one Zeppelin group sees under TP (NIC map and bandwidth), and its NIC share.

    See the module docstring for the map and the share; the token capacity is
    left as it is (:func:`build_planning` applies :func:`rank_capacity`).
    ``tensor_parallel == 1`` returns ``(cluster, 1.0)``.

    Raises:
        ClusterError: TP does not divide the GPUs of a node, or the TP ranks
            would see different NIC maps.
    """
    tp = _check_tp(tensor_parallel)
    gpn = cluster.gpus_per_node
    if gpn % tp:
        raise ClusterError(f"tensor parallel size {tp} does not divide the cluster's {gpn} GPUs per node "
                           "(a TP group must sit inside one node)")
    if tp == 1:
        return cluster, 1.0
    g = gpn // tp
    maps: list[tuple[int, ...]] = []
    share = 1.0
    for t in range(tp):
        nics = [cluster.gpu_nic[loc * tp + t] for loc in range(g)]
        used = sorted(set(nics))
        maps.append(tuple(used.index(n) for n in nics))
        for n in used:
            share = min(share, nics.count(n) / cluster.gpus_sharing_nic(n))
    if any(m != maps[0] for m in maps[1:]):
        raise ClusterError(
            f"cluster {cluster.name or '<unnamed>'}: with TP {tp} the TP ranks see different NIC maps "
            f"{[list(m) for m in maps]} (gpu_nic = {list(cluster.gpu_nic)}); every TP rank must run the same "
            "plan, so Zeppelin needs a NIC map that is the same for each TP rank's GPUs"
        )
    reduced = replace(cluster, gpus_per_node=g, nics_per_node=len(set(maps[0])), gpu_nic=maps[0],
                      nic_Gbps=cluster.nic_Gbps * share, name=f"{cluster.name or 'cluster'}/tp{tp}")
    return reduced, share


@dataclass(frozen=True, kw_only=True)
class PlanningSetup:
    """What planning a run needs; ``setup.plan(lengths)`` (or ``setup(lengths)``) plans one step.

    ``physical``: the cluster as described (GPUs, per-GPU ``tokens_per_gpu``);
    ``cluster``: the planner's cluster of Zeppelin ranks (TP-reduced, per-rank
    capacity); ``cost``: the cost model on ``cluster`` (heads and linear
    weights divided by TP, NIC bandwidth scaled by ``nic_share``).
    """

    physical: Cluster
    cluster: Cluster
    cost: CostModel
    options: PlannerOptions
    tensor_parallel: int
    nic_share: float

    def plan(self, lengths: Sequence[int]) -> StepPlan:
        """:func:`plan_step` with this setup's cost model and options (deterministic)."""
        return plan_step(lengths, self.cost, self.options)

    def __call__(self, lengths: Sequence[int]) -> StepPlan:
        return self.plan(lengths)

    @property
    def model(self) -> ModelShape:
        return self.cost.model

    def describe(self) -> str:
        """One line: ranks, capacity, links (e.g. for a start-up log)."""
        c, tp = self.cluster, self.tensor_parallel
        ranks = (f"{c.nodes} x {c.gpus_per_node} Zeppelin ranks" if tp == 1 else
                 f"{self.physical.nodes} x {self.physical.gpus_per_node} GPUs, TP {tp} -> {c.nodes} x "
                 f"{c.gpus_per_node} Zeppelin ranks")
        return (f"{ranks}, {c.tokens_per_gpu} tokens per rank, {c.nics_per_node} NICs per node at "
                f"{c.nic_Gbps:g} Gb/s")


def _cluster(cluster: str | Path | Cluster, tokens_per_gpu: int | None) -> Cluster:
    if tokens_per_gpu is not None and (isinstance(tokens_per_gpu, bool) or not isinstance(tokens_per_gpu, int)
                                       or tokens_per_gpu < 1):
        raise ClusterError(f"tokens per GPU is {tokens_per_gpu!r}, expected a positive integer")
    if isinstance(cluster, Cluster):
        return cluster if tokens_per_gpu is None else cluster.with_tokens_per_gpu(tokens_per_gpu)
    if isinstance(cluster, (str, Path)):
        check_cluster_shape(cluster)
        return load_cluster(cluster, tokens_per_gpu=tokens_per_gpu)
    raise ClusterError(f"cluster is a {type(cluster).__name__}, expected a Cluster, NODESxGPUS or a YAML path")


def _model(model: str | Path | ModelShape | None) -> ModelShape:
    if model is None or isinstance(model, (str, Path)):
        return load_model(model)
    if isinstance(model, ModelShape):
        return model
    raise ModelError(f"model is a {type(model).__name__}, expected a ModelShape or a model YAML path")


def _profile(profile: str | Path | CostProfile | None) -> CostProfile:
    if profile is None or isinstance(profile, (str, Path)):
        return load_profile(profile)
    if isinstance(profile, CostProfile):
        return profile
    raise ProfileError(f"profile is a {type(profile).__name__}, expected a CostProfile or a profile JSON path")


def build_planning(cluster: str | Path | Cluster, model: str | Path | ModelShape | None = None,
                   profile: str | Path | CostProfile | None = None, *, tensor_parallel: int = 1,
                   tokens_per_gpu: int | None = None, options: PlannerOptions | None = None) -> PlanningSetup:
    """The one way from a run's description to a :class:`PlanningSetup`.

    Args:
        cluster: ``"4x8"``, a cluster YAML, ``"4x8@configs/clusters/h100.yaml"`` or a :class:`Cluster`
            (GPUs; its ``tokens_per_gpu`` per GPU).
        model: a model YAML, a :class:`ModelShape`, or ``None`` (Llama-7B shape).
        profile: a ``zeppelin-profile/1`` JSON, a :class:`CostProfile`, or ``None`` (bundled H100 bf16).
        tensor_parallel: TP size ``t``: a Zeppelin rank is a TP group of ``t`` GPUs (module docstring).
        tokens_per_gpu: per-GPU capacity overriding the cluster's; a rank holds ``t`` times it.
        options: planner settings (default ``PlannerOptions()``).

    Raises:
        ClusterError, ModelError, ProfileError, PlanError: the piece that is wrong, named in the message.

    Example::

        >>> s = build_planning("2x8", tensor_parallel=2, tokens_per_gpu=4096)
        >>> (s.cluster.world_size, s.cluster.tokens_per_gpu, s.cost.tensor_parallel)
        (8, 8192, 2)
    """
    physical = _cluster(cluster, tokens_per_gpu)
    shape, prof = _model(model), _profile(profile)
    if options is None:
        options = PlannerOptions()
    if not isinstance(options, PlannerOptions):
        raise PlanError(f"options is a {type(options).__name__}, expected a PlannerOptions")
    reduced, share = reduce_cluster_for_tp(physical, tensor_parallel)
    reduced = reduced.with_tokens_per_gpu(rank_capacity(physical.tokens_per_gpu, tensor_parallel))
    if prof.nic_GBps and share != 1.0:
        prof = replace(prof, nic_GBps=prof.nic_GBps * share)
    try:
        cost = CostModel(model=shape, cluster=reduced, profile=prof, tensor_parallel=tensor_parallel)
    except ModelError:
        raise
    except ValueError as exc:  # heads not divisible by TP
        raise ModelError(f"model {shape.name or '<unnamed>'} with tensor parallel size {tensor_parallel}: {exc}") \
            from None
    return PlanningSetup(physical=physical, cluster=reduced, cost=cost, options=options,
                         tensor_parallel=tensor_parallel, nic_share=share)
