"""NIC-aware router: moves one lowered transfer's hops over point-to-point calls.

What moves where is decided by :mod:`zeppelin_megatron.planner.lowering`:
a :class:`~zeppelin_megatron.planner.lowering.Transfer` lists one
:class:`~zeppelin_megatron.planner.lowering.Message` per ring position, and
:func:`~zeppelin_megatron.planner.lowering.message_hops` cuts each message
(``tokens x unit`` elements, ``unit`` = elements per token row) into
:class:`~zeppelin_megatron.planner.lowering.Hop` s along its route: a direct
message is one round-0 hop; a routed one (proxies ``(p0 = local(src), p1,
...)``) one hop per round of each part's path ``src -> (node(src), p) ->
(node(dst), p) -> dst``. Every rank derives the same hops, so sender and
receiver agree on each hop's tag.

This module only executes: :meth:`Router.start` posts this rank's round-0
hops in one ``batch_isend_irecv`` (a rank may send and receive several messages of one
transfer, e.g. a head-parallel ring's all-to-all, each to its own buffer: ``payloads`` and
``into`` are keyed by message); a relay forwards in round ``r + 1`` what it
received in round ``r``. When waits do not block the host (NCCL) all rounds
are posted at once on the comm stream, so the whole routed transfer runs under
the caller's compute; on gloo rounds 1 and 2 are posted by :meth:`InFlight.wait`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ..planner.lowering import ROUNDS, Hop
from .comm import P2P, CommStream, Posted, post
from .group import ZeppelinGroup

__all__ = ["rank_rounds", "InFlight", "Router"]


def rank_rounds(hops: Sequence[Hop], rank: int) -> tuple[tuple[Hop, ...], ...]:
    """The hops ``rank`` sends or receives, per round (``ROUNDS`` tuples)."""
    return tuple(tuple(h for h in hops if h.round == r and rank in (h.sender, h.receiver)) for r in range(ROUNDS))


class InFlight:
    """This rank's share of one transfer, in flight.

    ``rounds``: this rank's hops per round (:func:`rank_rounds`); ``sizes[i]``:
    elements of message ``i`` (its ``dst`` gets a buffer of that size);
    ``payloads[i]``: flat contiguous tensor of every message ``i`` this rank
    sends; ``into[i]``: flat contiguous tensor to receive message ``i`` in (e.g. a slice of one
    receive buffer; others are allocated). :meth:`wait` returns ``{i: flat tensor}`` for every
    message it receives.
    """

    def __init__(
        self,
        rounds: tuple[tuple[Hop, ...], ...],
        ends: Sequence[tuple[int, int]],
        sizes: Sequence[int],
        group: ZeppelinGroup,
        payloads: Mapping[int, torch.Tensor],
        *,
        dtype: torch.dtype,
        device: torch.device,
        stream: CommStream,
        what: str = "",
        into: Mapping[int, torch.Tensor] | None = None,
    ) -> None:
        me = group.rank
        self._group, self._stream, self._rounds, self._payloads = group, stream, rounds, payloads
        self._what = what
        self._dst = [d for _, d in ends]
        self._outputs: dict[int, torch.Tensor] = {}
        for i, ((src, dst), n) in enumerate(zip(ends, sizes)):
            if dst == me:
                self._outputs[i] = self._buffer(i, n, into, dtype, device)
            if src == me and i not in payloads:
                raise ValueError(f"rank {me} sends message {i} ({src} -> {dst}) but has no payload for it")
        self._relay: dict[tuple[int, int], torch.Tensor] = {}
        self._dtype, self._device = dtype, device
        self._next = 0
        self._posted: Posted | None = None

    @staticmethod
    def _buffer(i: int, n: int, into: Mapping[int, torch.Tensor] | None, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
        t = into.get(i) if into else None
        if t is None:
            return torch.empty(n, dtype=dtype, device=device)
        if t.dim() != 1 or t.numel() != n or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"receive buffer of message {i} must be flat, contiguous, {n} elements of {dtype}; "
                             f"got shape {tuple(t.shape)} of {t.dtype}")
        return t

    def _ops(self, r: int) -> list[P2P]:
        me = self._group.rank
        ops = []
        for h in self._rounds[r]:
            if h.sender == me:
                src = self._payloads[h.msg] if r == 0 else self._relay.pop((h.msg, h.part))
                t = src[h.offset:h.offset + h.count] if r == 0 else src
                ops.append(P2P(peer=h.receiver, tensor=t, send=True, tag=h.tag))
            else:
                if self._dst[h.msg] == me:
                    t = self._outputs[h.msg][h.offset:h.offset + h.count]
                else:
                    t = torch.empty(h.count, dtype=self._dtype, device=self._device)
                    self._relay[(h.msg, h.part)] = t
                ops.append(P2P(peer=h.sender, tensor=t, send=False, tag=h.tag))
            self._stream.keep_alive(ops[-1].tensor)
        return ops

    def _advance(self) -> None:
        """Wait for the round in flight (if any), then post the next one."""
        if self._posted is not None:
            self._posted.wait()
            self._posted = None
        if self._next < ROUNDS:
            what = f"{self._what} round {self._next}" if self._what else ""
            self._posted = post(self._ops(self._next), self._group, what)
            self._next += 1

    def start(self) -> "InFlight":
        with self._stream.issue():
            self._advance()
            if self._group.async_waits:
                while self._next < ROUNDS:
                    self._advance()
        return self

    def wait(self) -> dict[int, torch.Tensor]:
        with self._stream.issue():
            while self._next < ROUNDS or self._posted is not None:
                self._advance()
        self._stream.join()
        return self._outputs


class Router:
    """Starts transfers over ``group`` on ``stream``."""

    def __init__(self, group: ZeppelinGroup, *, stream: CommStream) -> None:
        self.group = group
        self.stream = stream

    def start(
        self,
        rounds: tuple[tuple[Hop, ...], ...],
        ends: Sequence[tuple[int, int]],
        sizes: Sequence[int],
        payloads: Mapping[int, torch.Tensor],
        *,
        dtype: torch.dtype,
        device: torch.device,
        what: str = "",
        into: Mapping[int, torch.Tensor] | None = None,
    ) -> InFlight:
        """Post this rank's hops ``rounds`` of messages ``ends`` (``(src, dst)``) of ``sizes`` elements;
        ``what`` names the step in a timeout error (e.g. ``"ring 2 step 1 K/V"``); ``into``: receive
        buffers per message (:class:`InFlight`)."""
        return InFlight(rounds, ends, sizes, self.group, payloads, dtype=dtype, device=device,
                        stream=self.stream, what=what, into=into).start()
