"""The Zeppelin process group: plan ranks, nodes, local indices and global ranks.

A *Zeppelin rank* is the rank number a :class:`~zeppelin_megatron.planner.plan.StepPlan`
uses. Plans number ranks node-major (``node = rank // gpus_per_node``). The torch
process group under us may number its members differently (a launcher that
interleaves nodes, a sub-group of a bigger job), so the group keeps a rank map
``rank_map[zeppelin_rank] = process-group rank`` and this file is the one place
that converts between Zeppelin ranks, process-group ranks and global ranks.

Worked example: 2 nodes x 2 GPUs whose launcher numbered processes
``node0: 0, 2`` and ``node1: 1, 3``. With ``rank_map = (0, 2, 1, 3)``, Zeppelin
rank 1 (node 0, local 1) is process-group rank 2, and process-group rank 1 is
Zeppelin rank 2 (node 1, local 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from .errors import RuntimeInputError

__all__ = ["ZeppelinGroup", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 300.0  # seconds; ``--zeppelin-timeout``


@dataclass(frozen=True, kw_only=True)
class ZeppelinGroup:
    """A torch process group seen as ``nodes x gpus_per_node`` Zeppelin ranks.

    ``process_group``: the torch group (``None``: the default group).
    ``gpus_per_node``: ranks per node. ``rank_map``: process-group rank of each
    Zeppelin rank (``None``: the identity). ``timeout_s``: seconds a host-blocking
    wait of the runtime (every wait on gloo; the start-of-call check on NCCL) lasts
    before it raises :class:`~.errors.ZeppelinTimeoutError` naming the step and the
    peers (create ``process_group`` with the same timeout, as
    :func:`zeppelin_megatron.megatron.groups.zeppelin_group_over` does, so that NCCL's
    stream-ordered waits give up then too). ``torch.distributed`` must be
    initialised before construction; nothing is read from the environment.
    """

    process_group: dist.ProcessGroup | None
    gpus_per_node: int
    rank_map: tuple[int, ...] | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    # derived in __post_init__
    size: int = field(init=False)
    rank: int = field(init=False)
    nodes: int = field(init=False)
    backend: str = field(init=False)
    _global: tuple[int, ...] = field(init=False, repr=False)
    _from_group: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeInputError("torch.distributed must be initialised before building a ZeppelinGroup")
        gpn = self.gpus_per_node
        if not isinstance(gpn, int) or isinstance(gpn, bool) or gpn < 1:
            raise RuntimeInputError(f"gpus_per_node must be a positive integer, got {gpn!r}")
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise RuntimeInputError(f"timeout_s must be a positive number of seconds, got {t!r}")
        pg = self.process_group if self.process_group is not None else dist.group.WORLD
        size = dist.get_world_size(pg)
        if size % gpn:
            raise RuntimeInputError(
                f"the process group has {size} ranks, not a multiple of gpus_per_node={gpn}"
            )
        rmap = tuple(range(size)) if self.rank_map is None else tuple(self.rank_map)
        if sorted(rmap) != list(range(size)):
            raise RuntimeInputError(
                f"rank_map must be a permutation of 0..{size - 1} (one entry per Zeppelin rank), got {list(rmap)}"
            )
        from_group = [0] * size
        for zr, gr in enumerate(rmap):
            from_group[gr] = zr
        global_ranks = tuple(
            gr if pg is dist.group.WORLD else dist.get_global_rank(pg, gr) for gr in rmap
        )
        set_ = object.__setattr__
        set_(self, "rank_map", rmap)
        set_(self, "size", size)
        set_(self, "nodes", size // gpn)
        set_(self, "rank", from_group[dist.get_rank(pg)])
        set_(self, "backend", str(dist.get_backend(pg)).lower())
        set_(self, "_global", global_ranks)
        set_(self, "_from_group", tuple(from_group))

    # -- the one place for rank arithmetic --------------------------------------
    @property
    def pg(self) -> dist.ProcessGroup:
        """The torch process group (the default group when none was given)."""
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def node_of(self, rank: int) -> int:
        """Node of Zeppelin rank ``rank``."""
        return rank // self.gpus_per_node

    def local_of(self, rank: int) -> int:
        """Local index of Zeppelin rank ``rank`` within its node."""
        return rank % self.gpus_per_node

    def rank_at(self, node: int, local: int) -> int:
        """Zeppelin rank of GPU ``local`` of ``node``."""
        return node * self.gpus_per_node + local

    def global_rank(self, rank: int) -> int:
        """torch.distributed global rank of Zeppelin rank ``rank`` (for point-to-point peers)."""
        return self._global[rank]

    def group_rank(self, rank: int) -> int:
        """Process-group rank of Zeppelin rank ``rank`` (for collective split lists)."""
        return self.rank_map[rank]  # type: ignore[index]

    def zeppelin_rank(self, group_rank: int) -> int:
        """Zeppelin rank of process-group rank ``group_rank``."""
        return self._from_group[group_rank]

    @property
    def timeout(self) -> timedelta:
        """``timeout_s`` as the ``timedelta`` torch's waits take."""
        return timedelta(seconds=self.timeout_s)

    def describe_ranks(self, ranks: "list[int] | tuple[int, ...]") -> str:
        """``'rank 3 (node 1, local 1)'`` or ``'ranks 1, 2, 3'`` for Zeppelin ranks ``ranks``."""
        ranks = sorted(ranks)
        if len(ranks) == 1:
            r = ranks[0]
            return f"rank {r} (node {self.node_of(r)}, local {self.local_of(r)})"
        return "ranks " + ", ".join(str(r) for r in ranks)

    @property
    def is_identity_map(self) -> bool:
        return self.rank_map == tuple(range(self.size))

    @property
    def async_waits(self) -> bool:
        """True when ``Work.wait()`` does not block the host (NCCL: it orders CUDA streams)."""
        return self.backend == "nccl"
