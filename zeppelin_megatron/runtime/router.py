"""NIC-aware router: executes the plan's :class:`Route` s for a set of point-to-point messages.

A *message* is a flat payload of ``numel`` elements from Zeppelin rank ``src``
to ``dst``. Without a route it is one direct transfer. With a route over
proxies ``(p0 = local(src), p1, ...)`` the payload is cut by
:func:`~zeppelin_megatron.planner.routing.split_counts` into one part per
proxy, and part ``k`` (proxy ``p``) travels:

* ``p == local(src)``: ``src -> dst`` directly (round 0);
* otherwise: ``src -> A = (node(src), p)`` (round 0, dispatch over NVLink),
  ``A -> B = (node(dst), p)`` (round 1, over p's NIC, rail-aligned),
  ``B -> dst`` (round 2, combine over NVLink; none when ``B == dst``).

Worked example, 2 nodes x 4 GPUs, message ``1 -> 6`` of 10 elements with
proxies ``(1, 0, 3)``: ``split_counts(10, 3) == [4, 3, 3]``::

    part 0 [0, 4):  1 -> 6                      (round 0, direct)
    part 1 [4, 7):  1 -> 0,  0 -> 4,  4 -> 6    (rounds 0, 1, 2)
    part 2 [7,10):  1 -> 3,  3 -> 7,  7 -> 6    (rounds 0, 1, 2)

Every rank derives the same global :class:`Schedule` from the same messages,
so each rank knows which hops it sends, receives or relays, and sender and
receiver agree on each hop's tag. Each round is one ``batch_isend_irecv``; a
relay forwards in round ``r + 1`` what it received in round ``r``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from ..planner.routing import Route, route_parts
from .comm import P2P, CommStream, Posted, post
from .group import ZeppelinGroup

__all__ = ["Message", "Hop", "Schedule", "build_schedule", "route_relays", "Transfer", "Router"]

ROUNDS = 3


@dataclass(frozen=True, kw_only=True)
class Message:
    """``numel`` elements from Zeppelin rank ``src`` to ``dst`` (``src != dst``)."""

    src: int
    dst: int
    numel: int


@dataclass(frozen=True, kw_only=True)
class Hop:
    """Elements ``[offset, offset + count)`` of message ``msg`` moving ``sender -> receiver`` in ``round``.

    ``part``: which proxy part this is (relays key their buffers by ``(msg, part)``);
    ``tag``: the hop's index within its round (identical on both ends).
    """

    round: int
    sender: int
    receiver: int
    msg: int
    part: int
    offset: int
    count: int
    tag: int


@dataclass(frozen=True, kw_only=True)
class Schedule:
    messages: tuple[Message, ...]
    hops: tuple[Hop, ...]

    def participants(self) -> frozenset[int]:
        return frozenset({h.sender for h in self.hops} | {h.receiver for h in self.hops})


def build_schedule(
    messages: Sequence[Message], routes: Mapping[tuple[int, int], Route], group: ZeppelinGroup
) -> Schedule:
    """Cut each message into hops following its route (if any); see the module docstring."""
    raw: list[list[tuple[int, int, int, int, int, int]]] = [[] for _ in range(ROUNDS)]
    for m_idx, m in enumerate(messages):
        if m.src == m.dst:
            raise ValueError(f"message {m_idx} sends from rank {m.src} to itself")
        route = routes.get((m.src, m.dst))
        if route is None or group.node_of(m.src) == group.node_of(m.dst):
            if m.numel:
                raw[0].append((m.src, m.dst, m_idx, 0, 0, m.numel))
            continue
        for rp in route_parts(route, m.numel, group.gpus_per_node):
            for r, (a, b) in enumerate(zip(rp.path, rp.path[1:])):  # hop r of the path in round r
                raw[r].append((a, b, m_idx, rp.part, rp.offset, rp.count))
    hops = tuple(
        Hop(round=r, sender=s, receiver=d, msg=mi, part=pt, offset=o, count=c, tag=t)
        for r in range(ROUNDS)
        for t, (s, d, mi, pt, o, c) in enumerate(raw[r])
    )
    return Schedule(messages=tuple(messages), hops=hops)


def route_relays(route: Route, group: ZeppelinGroup) -> frozenset[int]:
    """Ranks other than the ends that carry parts of ``route``: ``(node(src), p)`` and ``(node(dst), p)``."""
    # every proxy's part: one element each is enough to name the path
    return frozenset(r for rp in route_parts(route, len(route.proxies), group.gpus_per_node) for r in rp.relays)


class Transfer:
    """This rank's share of one :class:`Schedule`, in flight.

    ``payloads[i]``: flat contiguous tensor of message ``i`` for every message
    this rank sends; :meth:`wait` returns ``{i: flat tensor}`` for every message
    this rank receives. :meth:`start` posts round 0; when waits do not block the
    host (NCCL) it also posts the later rounds on the comm stream, so the whole
    routed transfer runs under the caller's compute. :meth:`wait` finishes what
    is left and joins the comm stream.
    """

    def __init__(
        self,
        schedule: Schedule,
        group: ZeppelinGroup,
        payloads: Mapping[int, torch.Tensor],
        *,
        dtype: torch.dtype,
        device: torch.device,
        stream: CommStream,
        tag_base: int = 0,
    ) -> None:
        me = group.rank
        self._group = group
        self._stream = stream
        self._tag_base = tag_base
        self._payloads = payloads
        self._messages = schedule.messages
        self._rounds: list[list[Hop]] = [[] for _ in range(ROUNDS)]
        for h in schedule.hops:
            if me in (h.sender, h.receiver):
                self._rounds[h.round].append(h)
        self._outputs: dict[int, torch.Tensor] = {}
        for i, m in enumerate(schedule.messages):
            if m.dst == me:
                self._outputs[i] = torch.empty(m.numel, dtype=dtype, device=device)
            if m.src == me and i not in payloads:
                raise ValueError(f"rank {me} sends message {i} ({m.src} -> {m.dst}) but has no payload for it")
        self._relay: dict[tuple[int, int], torch.Tensor] = {}
        self._dtype, self._device = dtype, device
        self._next = 0
        self._posted: Posted | None = None

    def _ops(self, r: int) -> list[P2P]:
        me = self._group.rank
        ops = []
        for h in self._rounds[r]:
            tag = self._tag_base + h.tag
            if h.sender == me:
                src = self._payloads[h.msg] if r == 0 else self._relay.pop((h.msg, h.part))
                t = src[h.offset:h.offset + h.count] if r == 0 else src
                ops.append(P2P(peer=h.receiver, tensor=t, send=True, tag=tag))
            else:
                if self._messages[h.msg].dst == me:
                    t = self._outputs[h.msg][h.offset:h.offset + h.count]
                else:
                    t = torch.empty(h.count, dtype=self._dtype, device=self._device)
                    self._relay[(h.msg, h.part)] = t
                ops.append(P2P(peer=h.sender, tensor=t, send=False, tag=tag))
            self._stream.keep_alive(ops[-1].tensor)
        return ops

    def _advance(self) -> None:
        """Wait for the round in flight (if any), then post the next one."""
        if self._posted is not None:
            self._posted.wait()
            self._posted = None
        if self._next < ROUNDS:
            self._posted = post(self._ops(self._next), self._group)
            self._next += 1

    def start(self) -> "Transfer":
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
    """Runs message sets over ``group`` using ``routes`` (empty: everything direct)."""

    def __init__(self, group: ZeppelinGroup, routes: Sequence[Route] = (), *, stream: CommStream) -> None:
        self.group = group
        self.stream = stream
        self._routes: dict[tuple[tuple[int, ...], int, int], Route] = {(r.ring, r.src, r.dst): r for r in routes}

    def routes_for(self, ring: tuple[int, ...]) -> dict[tuple[int, int], Route]:
        return {(s, d): r for (rg, s, d), r in self._routes.items() if rg == ring}

    def participants(self, ring: tuple[int, ...]) -> frozenset[int]:
        """Ring members plus every rank that relays one of the ring's routed hops."""
        out = set(ring)
        for route in self.routes_for(ring).values():
            out |= route_relays(route, self.group)
        return frozenset(out)

    def schedule(self, messages: Sequence[Message], ring: tuple[int, ...] | None = None) -> Schedule:
        routes = self.routes_for(ring) if ring is not None else {}
        return build_schedule(messages, routes, self.group)

    def start(
        self,
        schedule: Schedule,
        payloads: Mapping[int, torch.Tensor],
        *,
        dtype: torch.dtype,
        device: torch.device,
        tag_base: int = 0,
    ) -> Transfer:
        return Transfer(
            schedule, self.group, payloads, dtype=dtype, device=device, stream=self.stream, tag_base=tag_base
        ).start()
