"""The Zeppelin process group of a Megatron job: the data-parallel ranks of one TP rank.

Zeppelin treats every data-parallel replica of a tensor-parallel shard as one
GPU of a ``nodes x ranks_per_node`` cluster: the plan splits the global batch
over them. With TP = 2 on nodes of 8 GPUs, global ranks ``0, 2, 4, 6`` (node 0)
and ``8, 10, 12, 14`` (node 1) form one Zeppelin group of 2 nodes x 4 ranks
(TP rank 0) and the odd ranks another (TP rank 1).

The group gets its own communicator (``dist.new_group`` over the same ranks as
Megatron's data-parallel group), so Zeppelin's point-to-point traffic never
interleaves with the gradient all-reduces Megatron issues on its DP group. That
communicator is created with the Zeppelin timeout (``--zeppelin-timeout``,
default 300 s) instead of the job's 30 minutes: a rank that fails makes the others
raise within that time (see ``docs/failures.md``).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from ..runtime.group import DEFAULT_TIMEOUT_S, ZeppelinGroup

__all__ = ["zeppelin_group_from_megatron", "zeppelin_group_over"]

_CACHE: dict[tuple[int, tuple[int, ...], float], ZeppelinGroup] = {}


def zeppelin_group_over(
    dp_groups: list[tuple[int, ...]], gpus_per_node: int, timeout_s: float = DEFAULT_TIMEOUT_S
) -> ZeppelinGroup:
    """Create one process group per entry of ``dp_groups`` (global ranks) and return this rank's.

    Collective over the default group: every rank must call it with the same
    ``dp_groups`` (sorted lists of global ranks, disjoint, covering the world).
    ``gpus_per_node`` is the number of *GPUs* per node (``LOCAL_WORLD_SIZE``);
    node of global rank ``g`` = ``g // gpus_per_node``. Raises ``ValueError`` when
    a group's ranks are spread unevenly over nodes (the plan's cluster is
    ``nodes x ranks_per_node``). ``timeout_s``: the process groups' timeout and
    the returned group's ``timeout_s``.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < float("inf"):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    me = dist.get_rank()
    mine = None
    for ranks in dp_groups:
        per_node: dict[int, int] = {}
        for g in ranks:
            per_node[g // gpus_per_node] = per_node.get(g // gpus_per_node, 0) + 1
        if len(set(per_node.values())) != 1:
            raise ValueError(
                f"data-parallel group {list(ranks)} has {per_node} ranks per node (node: count) with "
                f"{gpus_per_node} GPUs per node; Zeppelin needs the same number of ranks on every node"
            )
        # collective: every rank creates every group, in order
        pg = dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))
        if me in ranks:
            mine = ZeppelinGroup(process_group=pg, gpus_per_node=next(iter(per_node.values())), timeout_s=timeout_s)
    if mine is None:
        raise ValueError(f"rank {me} is in none of the data-parallel groups {dp_groups}")
    return mine


def zeppelin_group_from_megatron(gpus_per_node: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> ZeppelinGroup:
    """This rank's Zeppelin group, from Megatron's initialised parallel state (cached).

    Must be called on every rank (it creates process groups collectively),
    after ``megatron.core.parallel_state.initialize_model_parallel``.
    """
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() != 1:
        raise ValueError(
            f"pipeline parallelism (size {parallel_state.get_pipeline_model_parallel_world_size()}) is not "
            "supported with Zeppelin"
        )
    dp_ranks = tuple(sorted(dist.get_process_group_ranks(parallel_state.get_data_parallel_group(
        with_context_parallel=True))))
    key = (gpus_per_node, dp_ranks, float(timeout_s))
    if key in _CACHE:
        return _CACHE[key]
    gathered: list[tuple[int, ...] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, dp_ranks)
    groups = sorted({g for g in gathered if g is not None})
    group = zeppelin_group_over(groups, gpus_per_node, timeout_s)
    _CACHE[key] = group
    return group
