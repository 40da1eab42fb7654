"""Waits that end: every blocking wait of the runtime runs under the group's timeout and
fails with an error naming the step and the peers it waited for.

A backend failure surfaces as a bare ``RuntimeError`` from gloo or NCCL, e.g.
``[.../unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to
complete``, naming neither the Zeppelin step nor the peer. :func:`wait_work` and
:func:`collective` translate it into

* :class:`~.errors.ZeppelinTimeoutError` when the backend reports a timeout, e.g.
  ``Zeppelin rank 0 (node 0, local 0) timed out after 5 s in ring 2 step 1
  (receive from rank 3, send to rank 1) waiting for rank 3 (node 1, local 1): ...``;
* :class:`~.errors.ZeppelinCommError` for any other failure (a peer that exited
  closes its connection).

Which waits get the timeout: on gloo every wait blocks the host, so each is given
``group.timeout``. On NCCL, ``Work.wait()`` only orders CUDA streams; passing it a
timeout would block the host and serialise compute with communication, so those
waits keep the process group's own timeout (set it with ``dist.new_group(...,
timeout=)``; the NCCL watchdog then aborts a stuck communicator, see
``docs/failures.md``). Host-synchronous steps (the start-of-call check) pass
``blocking=True`` and get the timeout on every backend.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch.distributed as dist

from .errors import ZeppelinCommError, ZeppelinTimeoutError
from .group import ZeppelinGroup

__all__ = ["wait_work", "collective", "comm_error"]


def comm_error(exc: BaseException, group: ZeppelinGroup, what: str, peers: Sequence[int]) -> ZeppelinCommError:
    """The Zeppelin error for backend failure ``exc`` during step ``what`` waiting for ``peers`` (Zeppelin ranks)."""
    me = group.describe_ranks([group.rank])
    others = group.describe_ranks(list(peers)) if peers else "the other ranks of the group"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "timed out" in text.lower() or "timeout" in text.lower():
        return ZeppelinTimeoutError(
            f"Zeppelin {me} timed out after {group.timeout_s:g} s in {what} waiting for {others}: the peer "
            f"failed, hangs, or runs another step (its own log has the cause); backend: {text}"
        )
    return ZeppelinCommError(f"Zeppelin {me} failed in {what} with {others}: {text}")


def wait_work(
    work: dist.Work, group: ZeppelinGroup, describe: Callable[[], tuple[str, Sequence[int]]], *,
    blocking: bool = False,
) -> None:
    """``work.wait()`` under ``group.timeout`` when the wait blocks the host (gloo, or ``blocking``).

    ``describe()`` -> ``(step, peers)`` is called only when the wait fails (no string work on
    the fast path).
    """
    try:
        if blocking or not group.async_waits:
            work.wait(timeout=group.timeout)
        else:
            work.wait()
    except RuntimeError as exc:
        what, peers = describe()
        raise comm_error(exc, group, what, peers) from exc


def collective(start: Callable[[], dist.Work | None], group: ZeppelinGroup, *, what: str,
               blocking: bool = False) -> None:
    """Run a collective issued by ``start()`` (with ``async_op=True``) and wait for it under the timeout.

    Every other rank of the group is a peer. Example::

        collective(lambda: dist.all_gather(outs, t, group=g.pg, async_op=True), g, what="agreement check")
    """
    def describe() -> tuple[str, list[int]]:
        return what, [r for r in range(group.size) if r != group.rank]

    try:
        work = start()
    except RuntimeError as exc:
        raise comm_error(exc, group, *describe()) from exc
    if work is not None:
        wait_work(work, group, describe, blocking=blocking)
