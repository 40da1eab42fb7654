"""Collective and point-to-point primitives over a :class:`ZeppelinGroup`.

* :func:`all_to_all_uneven`: ``all_to_all_single`` with per-rank token counts
  (gloo and NCCL both accept uneven splits of one flat tensor);
* :class:`P2P` / :func:`post`: ``batch_isend_irecv`` with Zeppelin-rank peers;
* :class:`CommStream`: on CUDA, a side stream so that posted transfers and the
  waits between routing rounds do not queue behind compute; a no-op on CPU;
* :func:`check_plan_agreement`: one small ``all_reduce`` that catches ranks
  holding different plans before any point-to-point call can hang.

Every function has a group-of-one fast path that issues no communication.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from .errors import PlanMismatchError, RuntimeInputError
from .group import ZeppelinGroup

__all__ = ["P2P", "Posted", "post", "all_to_all_uneven", "CommStream", "plan_hash", "check_plan_agreement"]


# -- all-to-all --------------------------------------------------------------------


def all_to_all_uneven(
    send: torch.Tensor,
    send_counts: Sequence[int],
    recv_counts: Sequence[int],
    group: ZeppelinGroup,
) -> torch.Tensor:
    """Exchange rows of ``send`` ([sum(send_counts), *F]) -> [sum(recv_counts), *F].

    ``send_counts[r]`` / ``recv_counts[r]`` are indexed by *Zeppelin* rank; rows
    of ``send`` are grouped by destination in Zeppelin-rank order and the result
    is grouped by source in Zeppelin-rank order. A rank map that is not the
    identity is handled here by permuting the blocks into process-group order.
    """
    feat = tuple(send.shape[1:])
    if group.size == 1:
        return send.clone()
    recv = send.new_empty((sum(recv_counts), *feat))
    if group.is_identity_map:
        dist.all_to_all_single(recv, send.contiguous(), list(recv_counts), list(send_counts), group=group.pg)
        return recv
    # Reorder blocks from Zeppelin-rank order to process-group-rank order and back.
    order = [group.zeppelin_rank(g) for g in range(group.size)]
    send_blocks = list(torch.split(send, list(send_counts)))
    send_pg = torch.cat([send_blocks[z] for z in order]) if send.shape[0] else send
    recv_pg = send.new_empty((sum(recv_counts), *feat))
    dist.all_to_all_single(
        recv_pg, send_pg.contiguous(), [recv_counts[z] for z in order], [send_counts[z] for z in order],
        group=group.pg,
    )
    blocks = dict(zip(order, torch.split(recv_pg, [recv_counts[z] for z in order])))
    if recv.shape[0]:
        torch.cat([blocks[z] for z in range(group.size)], out=recv)
    return recv


# -- point-to-point ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class P2P:
    """One send (``send=True``) or receive of a contiguous ``tensor`` with Zeppelin rank ``peer``."""

    peer: int
    tensor: torch.Tensor
    send: bool
    tag: int = 0


class Posted:
    """Outstanding point-to-point work; :meth:`wait` blocks (gloo) or orders streams (NCCL)."""

    def __init__(self, works: list[dist.Work]) -> None:
        self._works = works

    def wait(self) -> None:
        for w in self._works:
            w.wait()
        self._works = []


def post(ops: Sequence[P2P], group: ZeppelinGroup) -> Posted:
    """Post ``ops`` in one ``batch_isend_irecv`` (nothing when ``ops`` is empty)."""
    if not ops:
        return Posted([])
    p2p = []
    for op in ops:
        if op.peer == group.rank:
            raise ValueError(f"rank {group.rank} cannot send to or receive from itself")
        fn = dist.isend if op.send else dist.irecv
        p2p.append(dist.P2POp(fn, op.tensor, group.global_rank(op.peer), group.pg, op.tag))
    return Posted(list(dist.batch_isend_irecv(p2p)))


# -- streams -------------------------------------------------------------------------


class CommStream:
    """Where communication is issued.

    On CUDA: a dedicated side stream. :meth:`issue` makes it wait for the
    current (compute) stream so tensors to send are ready, then makes it
    current; :meth:`join` makes the compute stream wait for everything issued.
    On CPU both are no-ops and ordering comes from blocking waits.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None

    @contextlib.contextmanager
    def issue(self) -> Iterator[None]:
        if self._stream is None:
            yield
            return
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            yield

    def keep_alive(self, t: torch.Tensor) -> None:
        """Tell the caching allocator that ``t`` is used on the side stream."""
        if self._stream is not None and t.is_cuda:
            t.record_stream(self._stream)

    def join(self) -> None:
        if self._stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)


# -- plan agreement --------------------------------------------------------------------

_HASHES: "weakref.WeakKeyDictionary[object, int]" = weakref.WeakKeyDictionary()


def plan_hash(plan: object) -> int:
    """63-bit integer from ``plan.digest()`` (SHA-256 of the canonical JSON), cached per plan object."""
    try:
        return _HASHES[plan]
    except (KeyError, TypeError):
        pass
    value = int(plan.digest()[:15], 16)  # type: ignore[attr-defined]  # 60 bits: fits int64
    try:
        _HASHES[plan] = value
    except TypeError:
        pass
    return value


def check_plan_agreement(
    plan: object, group: ZeppelinGroup, device: torch.device, problem: str | None = None
) -> None:
    """Raise on every rank unless all ranks of ``group`` hold the same plan and accept their inputs.

    One ``all_reduce(MAX)`` of ``[h, -h, bad]`` (``h`` = :func:`plan_hash`, ``bad``
    = 1 when this rank found ``problem`` with its inputs): all ranks agree
    exactly when the maximum and the minimum of ``h`` are both ``h``. Every rank
    takes part, so all raise together instead of some hanging in a later
    point-to-point call. A plan mismatch is reported first
    (:class:`PlanMismatchError`), as it explains any input mismatch; then
    ``problem`` (:class:`RuntimeInputError`) on its rank and a pointer to it on
    the others.
    """
    if group.size == 1:
        if problem:
            raise RuntimeInputError(problem)
        return
    h = plan_hash(plan)
    dev = device if group.backend == "nccl" else torch.device("cpu")
    t = torch.tensor([h, -h, 1 if problem else 0], dtype=torch.int64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group.pg)
    hi, lo, bad = int(t[0]), -int(t[1]), int(t[2])
    if hi != h or lo != h:
        raise PlanMismatchError(
            f"ranks of the Zeppelin group hold different step plans: rank {group.rank} has plan hash "
            f"{h:#x}, the group's hashes range over [{lo:#x}, {hi:#x}]; every rank must pass the same "
            f"StepPlan (build it from the same lengths and options, or broadcast it)"
            + (f"; this rank's inputs are also invalid: {problem}" if problem else "")
        )
    if problem:
        raise RuntimeInputError(problem)
    if bad:
        raise RuntimeInputError(
            f"rank {group.rank}: another rank of the Zeppelin group rejected its inputs (see that rank's error)"
        )
