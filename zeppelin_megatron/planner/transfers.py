"""The messages of a lowered program's ring steps and how they cut into wire hops.

A ring step's :class:`Transfer` holds one :class:`Message` per ring position
(``p`` sends what it holds to ``p + 1``). :func:`message_hops` cuts each
message into :class:`Hop` s along its route (:func:`~.routing.route_parts`):
the runtime's router posts them, the simulator times them, and both ends of a
hop derive the same tag. Built by :mod:`.lowering`; pure, standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .routing import Route, route_parts

__all__ = ["Message", "Hop", "message_hops", "TransferId", "Transfer", "TransferKind", "ROUNDS", "KV_TAG", "ACC_TAG",
           "HEADS_TAG", "TOKENS_TAG"]

ROUNDS = 3  # a routed part: dispatch (round 0), NIC (round 1), combine (round 2)
KV_TAG = 0
ACC_TAG = 1 << 20
HEADS_TAG = 2 << 20
TOKENS_TAG = 3 << 20
"""Tag bases of K/V, dK/dV-accumulator, to-heads and to-tokens transfers; a hop's tag is the base plus
its index in its round."""
TransferKind = Literal["kv", "acc", "heads", "tokens"]
_TAGS: dict[str, int] = {"kv": KV_TAG, "acc": ACC_TAG, "heads": HEADS_TAG, "tokens": TOKENS_TAG}


@dataclass(frozen=True, kw_only=True)
class Message:
    """What ring position ``src``'s rank sends to the next one in a step: ``tokens`` rows of its
    held K/V (or accumulator), over ``route`` (None: direct)."""

    src: int
    dst: int
    tokens: int
    route: Route | None = None


@dataclass(frozen=True, kw_only=True)
class Hop:
    """Elements ``[offset, offset + count)`` of message ``msg`` moving ``sender -> receiver`` in ``round``;
    ``part``: its proxy part (relays key buffers by ``(msg, part)``); ``tag``: the same on both ends."""

    round: int
    sender: int
    receiver: int
    msg: int
    part: int
    offset: int
    count: int
    tag: int


def message_hops(messages: tuple[Message, ...], counts: tuple[int, ...], gpus_per_node: int,
                 tag_base: int = 0) -> tuple[Hop, ...]:
    """Cut message ``i`` (``counts[i]`` elements) into hops: one round-0 hop when direct (no route,
    or one node), else one hop per round along each part's path (:func:`~.routing.route_parts`).
    Example: 2 x 4 GPUs, ``1 -> 6``, 10 elements, proxies ``(1, 0, 3)``: [0, 4) ``1 -> 6``;
    [4, 7) ``1 -> 0``, ``0 -> 4``, ``4 -> 6``; [7, 10) ``1 -> 3``, ``3 -> 7``, ``7 -> 6`` (rounds 0, 1, 2)."""
    raw: list[list[tuple[int, int, int, int, int, int]]] = [[] for _ in range(ROUNDS)]
    for i, (m, n) in enumerate(zip(messages, counts)):
        if m.src == m.dst:
            raise ValueError(f"message {i} sends from rank {m.src} to itself")
        if m.route is None or m.src // gpus_per_node == m.dst // gpus_per_node:
            if n:
                raw[0].append((m.src, m.dst, i, 0, 0, n))
            continue
        for rp in route_parts(m.route, n, gpus_per_node):
            for r, (a, b) in enumerate(zip(rp.path, rp.path[1:])):
                raw[r].append((a, b, i, rp.part, rp.offset, rp.count))
    return tuple(Hop(round=r, sender=s, receiver=d, msg=i, part=p, offset=o, count=c, tag=tag_base + t)
                 for r in range(ROUNDS) for t, (s, d, i, p, o, c) in enumerate(raw[r]))


@dataclass(frozen=True, order=True)
class TransferId:
    """Ring ``ring`` (index into :attr:`StepPlan.rings`), ``step``, ``kind``: ``kv`` or ``acc`` (a ring
    step's K/V or dK/dV accumulator), ``heads`` or ``tokens`` (a head-parallel ring's all-to-all to the
    head layout and back, :mod:`.head_parallel`; step 0)."""

    ring: int
    step: int
    kind: TransferKind


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """One ring step's exchange: position ``p`` sends what it holds to ``p + 1`` (message ``p``), or a
    head-parallel ring's all-to-all (one message per ordered pair of lanes of a block);
    :meth:`hops`: the wire hops for ``unit`` elements per token; ``participants``: members and relays."""

    id: TransferId
    messages: tuple[Message, ...]
    gpus_per_node: int
    participants: tuple[int, ...]

    @property
    def tag_base(self) -> int:
        return _TAGS[self.id.kind]

    def hops(self, unit: int) -> tuple[Hop, ...]:
        counts = tuple(m.tokens * unit for m in self.messages)
        return message_hops(self.messages, counts, self.gpus_per_node, self.tag_base)
