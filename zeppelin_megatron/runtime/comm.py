"""Collective and point-to-point primitives over a :class:`ZeppelinGroup`.

* :func:`all_to_all_uneven`: ``all_to_all_single`` with per-rank token counts
  (gloo and NCCL both accept uneven splits of one flat tensor); :func:`all_to_all_start`: the same
  started asynchronously, finished by :meth:`PendingAllToAll.wait` (work runs in between);
* :class:`P2P` / :func:`post`: ``batch_isend_irecv`` with Zeppelin-rank peers;
* :class:`CommStream`: on CUDA, a side stream so that posted transfers and the
  waits between routing rounds do not queue behind compute; a no-op on CPU;
* :func:`check_plan_agreement` / :func:`plan_hash`: re-exported from
  :mod:`.agreement` (the start-of-call check).

Every function has a group-of-one fast path that issues no communication. Every
wait runs under the group's timeout (:mod:`.waits`): a peer that never arrives
gives :class:`~.errors.ZeppelinTimeoutError` naming the step and the peer.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from .agreement import check_plan_agreement, plan_hash
from .group import ZeppelinGroup
from .waits import comm_error, wait_work

__all__ = ["P2P", "Posted", "post", "all_to_all_uneven", "all_to_all_start", "PendingAllToAll", "CommStream",
           "plan_hash", "check_plan_agreement"]


# -- all-to-all --------------------------------------------------------------------


class PendingAllToAll:
    """An :func:`all_to_all_start` in flight; :meth:`wait` -> the received rows [sum(recv_counts), *F].

    The wait runs under the group's timeout like every other (:func:`~.waits.wait_work`): a peer that
    failed makes it raise :class:`~.errors.ZeppelinTimeoutError` / ``ZeppelinCommError`` naming ``what``
    and the other ranks, never hang. Call :meth:`wait` exactly once; the send buffer must stay unchanged
    until then.
    """

    def __init__(self, work: dist.Work | None, finish: Callable[[], torch.Tensor], group: ZeppelinGroup,
                 what: str) -> None:
        self._work, self._finish, self._group, self._what = work, finish, group, what

    def _describe(self) -> tuple[str, list[int]]:
        return self._what, [r for r in range(self._group.size) if r != self._group.rank]

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            work, self._work = self._work, None
            wait_work(work, self._group, self._describe)
        return self._finish()


def all_to_all_start(
    send: torch.Tensor,
    send_counts: Sequence[int],
    recv_counts: Sequence[int],
    group: ZeppelinGroup,
    what: str = "a remap all_to_all",
) -> PendingAllToAll:
    """Start exchanging rows of ``send`` ([sum(send_counts), *F]) (``async_op=True``); the result
    [sum(recv_counts), *F] comes from :meth:`PendingAllToAll.wait`, so work can run in between.

    ``send_counts[r]`` / ``recv_counts[r]`` are indexed by *Zeppelin* rank; rows
    of ``send`` are grouped by destination in Zeppelin-rank order and the result
    is grouped by source in Zeppelin-rank order. A rank map that is not the
    identity is handled here by permuting the blocks into process-group order (before the
    start) and back (at the wait). ``what`` names the step in a timeout error.
    Example: 2 ranks, rank 0 sends rows ``[a, b, c]`` with ``send_counts=[1, 2]``: ``a`` stays,
    ``b, c`` go to rank 1; ``all_to_all_start(...).wait()`` on rank 1 gives ``[b, c, <rank 1's own>]``.
    """
    feat = tuple(send.shape[1:])
    if group.size == 1:
        copy = send.clone()
        return PendingAllToAll(None, lambda: copy, group, what)
    recv = send.new_empty((sum(recv_counts), *feat))
    if group.is_identity_map:
        send_c = send.contiguous()
        work = _start(lambda: dist.all_to_all_single(recv, send_c, list(recv_counts), list(send_counts),
                                                     group=group.pg, async_op=True), group, what)
        return PendingAllToAll(work, lambda: recv, group, what)
    # Reorder blocks from Zeppelin-rank order to process-group-rank order and back.
    order = [group.zeppelin_rank(g) for g in range(group.size)]
    send_blocks = list(torch.split(send, list(send_counts)))
    send_pg = torch.cat([send_blocks[z] for z in order]) if send.shape[0] else send
    recv_pg = send.new_empty((sum(recv_counts), *feat))
    send_pg = send_pg.contiguous()
    work = _start(lambda: dist.all_to_all_single(
        recv_pg, send_pg, [recv_counts[z] for z in order], [send_counts[z] for z in order],
        group=group.pg, async_op=True,
    ), group, what)

    def finish() -> torch.Tensor:
        blocks = dict(zip(order, torch.split(recv_pg, [recv_counts[z] for z in order])))
        if recv.shape[0]:
            torch.cat([blocks[z] for z in range(group.size)], out=recv)
        return recv

    return PendingAllToAll(work, finish, group, what)


def _start(start: Callable[[], dist.Work | None], group: ZeppelinGroup, what: str) -> dist.Work | None:
    """``start()``, a backend failure raised as the Zeppelin error naming ``what`` and the other ranks."""
    try:
        return start()
    except RuntimeError as exc:
        raise comm_error(exc, group, what, [r for r in range(group.size) if r != group.rank]) from exc


def all_to_all_uneven(
    send: torch.Tensor,
    send_counts: Sequence[int],
    recv_counts: Sequence[int],
    group: ZeppelinGroup,
    what: str = "a remap all_to_all",
) -> torch.Tensor:
    """Exchange rows of ``send`` ([sum(send_counts), *F]) -> [sum(recv_counts), *F]: :func:`all_to_all_start`
    and its wait at once (the same collective, counts and rank-map handling)."""
    return all_to_all_start(send, send_counts, recv_counts, group, what).wait()


# -- point-to-point ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class P2P:
    """One send (``send=True``) or receive of a contiguous ``tensor`` with Zeppelin rank ``peer``."""

    peer: int
    tensor: torch.Tensor
    send: bool
    tag: int = 0


class Posted:
    """Outstanding point-to-point work; :meth:`wait` blocks (gloo) or orders streams (NCCL).

    A wait that fails (gloo: after ``group.timeout_s``) raises
    :class:`~.errors.ZeppelinTimeoutError` / ``ZeppelinCommError`` naming ``what``
    (the caller's step, e.g. ``"ring 2 step 1"``), the direction and the peer.
    """

    def __init__(self, works: list[dist.Work], ops: Sequence[P2P] = (), group: ZeppelinGroup | None = None,
                 what: str = "") -> None:
        self._works = works
        self._ops = tuple(ops)
        self._group = group
        self._what = what

    def _describe(self, i: int) -> tuple[str, list[int]]:
        """(step with every move, peers) for a failed wait on work ``i``."""
        moves = [f"{'send to' if op.send else 'receive from'} rank {op.peer}" for op in self._ops]
        step = self._what or "a point-to-point exchange"
        per_op = len(self._works) == len(self._ops)  # gloo: one Work per op; NCCL: one for the batch
        peers = [self._ops[i].peer] if per_op else sorted({op.peer for op in self._ops})
        return f"{step} ({', '.join(moves)})", peers

    def wait(self) -> None:
        group = self._group
        for i, w in enumerate(self._works):
            if group is None:
                w.wait()
            else:
                wait_work(w, group, functools.partial(self._describe, i))
        self._works = []


def post(ops: Sequence[P2P], group: ZeppelinGroup, what: str = "") -> Posted:
    """Post ``ops`` in one ``batch_isend_irecv`` (nothing when ``ops`` is empty).

    ``what``: the step, named in a timeout error (e.g. ``"ring 2 step 1"``).
    """
    if not ops:
        return Posted([])
    p2p = []
    for op in ops:
        if op.peer == group.rank:
            raise ValueError(f"rank {group.rank} cannot send to or receive from itself")
        fn = dist.isend if op.send else dist.irecv
        p2p.append(dist.P2POp(fn, op.tensor, group.global_rank(op.peer), group.pg, op.tag))
    return Posted(list(dist.batch_isend_irecv(p2p)), ops, group, what)


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
