"""Lowering: a :class:`~.plan.StepPlan` -> every rank's program, the one derivation of the order of work.

The runtime (:mod:`zeppelin_megatron.runtime.engine`) executes these programs,
the simulator (:mod:`zeppelin_megatron.sim.program`) times them, replay
(:mod:`zeppelin_megatron.measure.workload`) measures their kernel calls.
Nothing else decides in which order a rank runs its ring steps, local calls
and transfers, which rows a call reads, or which peer a hop goes to. Pure
(no torch; this module itself needs only the standard library), deterministic.

A rank's attention work for one layer (:class:`RankProgram`), forward:

* the plan's rings in :attr:`StepPlan.rings` order, each one the rank takes
  part in as a *member* (it holds zigzag chunks) or a *relay* (it carries
  routed parts of a cross-node hop, :func:`~.routing.route_parts`). Ring step
  ``j = 0 .. g-1``: :class:`Post` the step's K/V :class:`Transfer` (``j < g-1``),
  the step's :class:`RingCall` (members), the :class:`LocalCall` the plan's
  ``local_slots`` put at this step (members), :class:`Wait` for the transfer;
* one :class:`LocalCall` for the rank's local sequences in no slot.

Backward walks the same rings and steps; each step also moves the dK/dV
accumulators (``kind="acc"`` transfers, ``g`` of them: after ``g`` hops each
accumulator is home): post K/V ``j``, the step's call, wait accumulator
``j-1``, post accumulator ``j`` (it first adds the step's dK/dV block), the
slot's call, wait K/V ``j``; after the last step wait accumulator ``g-1``.

Remap (:class:`RemapExchange`, per rank :func:`rank_remap`): ``to_attention`` before attention,
``to_linear`` after: one ``all_to_all``, or with ``remap_proxies`` the three phases of :mod:`~.remap_routing`.

Rows. A member at ring position ``i`` keeps the ring's tokens *seq-major*
(``[s0 early, s0 late, s1 early, ...]``, :func:`~.zigzag.zigzag_ranges`;
:attr:`RingPart.rows`: their attention-buffer rows). At step ``j`` it holds the
K/V of ``src = ring_source(i, j, g)`` and makes one call for all the ring's
sequences: ``diag`` (``src == i``): all queries against all held keys, causal;
``early`` (``src < i``): all queries against ``src``'s early chunks;
``late`` (``src > i``): its late chunks against all held keys.

Worked example: a 2-GPU ring ``(0, 1)`` of sequence 0 (8 tokens, chunks of 2)
and sequence 1 (3 tokens) local on rank 0, in a slot at ring 0 step 0. Rank 0
(position 0, tokens [0, 2) + [6, 8))::

    forward:  Post(kv 0 0), RingCall(diag: q = k = [0,2)+[6,8), causal),
              LocalCall(seq 1, rows of its 3 tokens), Wait(kv 0 0),
              RingCall(late: q = [6,8) vs k = [2,6) of position 1, full)
    backward: Post(kv 0 0), RingCall(diag), Post(acc 0 0), LocalCall(seq 1), Wait(kv 0 0),
              RingCall(late), Wait(acc 0 0), Post(acc 0 1), Wait(acc 0 1)

Rank 1 (position 1, tokens [2, 6)): step 0 ``diag`` (4 x 4 causal), step 1
``early`` (q = [2, 6) against position 0's early chunk [0, 2), full). The K/V
transfer of step 0 has two messages: ``0 -> 1`` (4 tokens) and ``1 -> 0`` (4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, Union

from .plan import StepPlan
from .plan_parts import TokenRange
from .remap import Direction, RankExchange
from .remap_routing import RoutedExchange, proxy_parts, routed_exchange
from .routing import route_parts
from .transfers import ACC_TAG, KV_TAG, ROUNDS, Hop, Message, Transfer, TransferId, message_hops
from .zigzag import next_position, ring_source, zigzag_ranges

__all__ = ["Message", "Hop", "TransferId", "Transfer", "RingCall", "LocalCall", "Post", "Wait", "RankOp", "RingPart",
           "LocalChunk", "RemapExchange", "RankProgram", "StepProgram", "lower", "lower_rank", "lower_remaps",
           "rank_remap", "message_hops", "ROUNDS", "KV_TAG", "ACC_TAG"]

@dataclass(frozen=True, kw_only=True)
class RingCall:
    """One varlen kernel call of ring ``part.ring``'s step ``step`` at ``position`` (K/V held from ``source``).

    One segment per ring sequence (``part.seqs``): ``lens_q[s]`` queries against ``lens_k[s]`` keys,
    causal only for ``diag``; :attr:`q` / :attr:`kv`: token ranges ``(seq, start, end)``; :attr:`q_rows`:
    rows of the rank's ring buffer; :attr:`kv_rows`: rows of the held K/V (``source``'s seq-major
    order). Derived on first use (the simulator needs only the kind).
    """

    part: "RingPart" = field(repr=False, compare=False)
    ring: int
    step: int
    position: int
    source: int
    kind: Literal["diag", "early", "late"]

    @property
    def causal(self) -> bool:
        return self.kind == "diag"

    @property
    def _which(self) -> tuple[str, str]:
        return {"diag": ("all", "all"), "early": ("all", "early"), "late": ("late", "all")}[self.kind]

    @cached_property
    def lens_q(self) -> tuple[int, ...]:
        return self.part.lens(self.position, self._which[0])

    @cached_property
    def lens_k(self) -> tuple[int, ...]:
        return self.part.lens(self.source, self._which[1])

    @cached_property
    def _q(self) -> tuple[tuple[int, ...], tuple[TokenRange, ...]]:
        return self.part.seq_major(self.position, self._which[0])

    @cached_property
    def _kv(self) -> tuple[tuple[int, ...], tuple[TokenRange, ...]]:
        return self.part.seq_major(self.source, self._which[1])

    @property
    def q_all(self) -> bool:
        """The queries are all of the rank's ring rows (``q_rows`` is ``0 .. n-1``)."""
        return self._which[0] == "all"

    @property
    def kv_all(self) -> bool:
        """The keys are all of the held K/V rows."""
        return self._which[1] == "all"

    @property
    def q(self) -> tuple[TokenRange, ...]:
        return self._q[1]

    @property
    def kv(self) -> tuple[TokenRange, ...]:
        return self._kv[1]

    @property
    def q_rows(self) -> tuple[int, ...]:
        return self._q[0]

    @property
    def kv_rows(self) -> tuple[int, ...]:
        return self._kv[0]


@dataclass(frozen=True, kw_only=True)
class LocalChunk:
    """Whole local sequences ``seqs`` (``lens`` their lengths) run as one causal call;
    :attr:`rows`: their attention-buffer rows, sequence after sequence (derived on first use)."""

    seqs: tuple[int, ...]
    lens: tuple[int, ...]
    layout: tuple[TokenRange, ...] = field(repr=False, compare=False)
    """The rank's attention layout (``plan.attention_layout[rank]``)."""

    @cached_property
    def rows(self) -> tuple[int, ...]:
        pieces = _buffer_rows(self.layout)
        return tuple(r for s, n in zip(self.seqs, self.lens) for r in _rows(pieces[s], 0, n))


@dataclass(frozen=True, kw_only=True)
class LocalCall:
    """Run local chunk ``chunk`` (index into :attr:`RankProgram.local_chunks`); ``ring``/``step``:
    the slot it fills (None: after the rings)."""

    chunk: int
    ring: int | None = None
    step: int | None = None


@dataclass(frozen=True)
class Post:
    """Post this rank's hops of a transfer (its payload: what it holds of the ring)."""

    transfer: TransferId


@dataclass(frozen=True)
class Wait:
    """Wait until every hop of the transfer this rank sends or receives is done."""

    transfer: TransferId


RankOp = Union[RingCall, LocalCall, Post, Wait]


@dataclass(frozen=True, kw_only=True)
class RingPart:
    """Ring ``ring`` as one rank sees it: ``position`` (None: relay only), ``lengths`` of ``seqs``;
    :attr:`rows`: attention-buffer rows of its ring tokens in seq-major order (empty for relays)."""

    ring: int
    ranks: tuple[int, ...]
    placement: str
    seqs: tuple[int, ...]
    lengths: tuple[int, ...]
    position: int | None
    layout: tuple[TokenRange, ...] = field(repr=False, compare=False)
    """The rank's attention layout (``plan.attention_layout[rank]``)."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    @cached_property
    def _chunks(self) -> list[list[tuple[tuple[int, int], tuple[int, int]]]]:
        """[position][seq] -> (early, late) token ranges."""
        g = len(self.ranks)
        return [[zigzag_ranges(n, g, p) for n in self.lengths] for p in range(g)]

    def tokens(self, position: int) -> int:
        """Ring tokens held at ``position``."""
        return sum(a1 - a0 + b1 - b0 for (a0, a1), (b0, b1) in self._chunks[position])

    def lens(self, position: int, which: str = "all") -> tuple[int, ...]:
        """Per sequence, ``position``'s tokens of its ``all``, ``early`` or ``late`` chunks."""
        return tuple((a1 - a0) * (which != "late") + (b1 - b0) * (which != "early")
                     for (a0, a1), (b0, b1) in self._chunks[position])

    def seq_major(self, position: int, which: str = "all") -> tuple[tuple[int, ...], tuple[TokenRange, ...]]:
        """``(rows, ranges)`` of ``position``'s ``all``/``early``/``late`` chunks: rows of its
        seq-major buffer and ``(seq, start, end)`` token ranges (memoised). Example: chunk lengths
        (2, 2) and (3, 2) -> early rows [0, 1, 4, 5, 6], late rows [2, 3, 7, 8]."""
        hit = self._memo.get((position, which))
        if hit is None:
            hit = self._memo[(position, which)] = self._seq_major(position, which)
        return hit

    @cached_property
    def _memo(self) -> dict[tuple[int, str], tuple[tuple[int, ...], tuple[TokenRange, ...]]]:
        return {}

    def _seq_major(self, position: int, which: str) -> tuple[tuple[int, ...], tuple[TokenRange, ...]]:
        rows: list[int] = []
        ranges: list[TokenRange] = []
        off = 0
        for s, ((a0, a1), (b0, b1)) in zip(self.seqs, self._chunks[position]):
            e, l = a1 - a0, b1 - b0
            if which != "late":
                rows += range(off, off + e)
                ranges.append((s, a0, a1))
            if which != "early":
                rows += range(off + e, off + e + l)
                ranges.append((s, b0, b1))
            off += e + l
        return tuple(rows), tuple(ranges)

    @cached_property
    def rows(self) -> tuple[int, ...]:
        if self.position is None:
            return ()
        pieces = _buffer_rows(self.layout)
        return tuple(r for s, a, b in self.seq_major(self.position)[1] for r in _rows(pieces[s], a, b))


@dataclass(frozen=True, kw_only=True)
class RemapExchange:
    """The layout exchange ``direction`` (``to_attention`` before attention, ``to_linear`` after):
    direct (``proxies`` empty: one ``all_to_all``) or the three routed phases over ``proxies``."""

    direction: Direction
    proxies: tuple[int, ...]
    pair_rows: tuple[tuple[int, int, int], ...]
    """``(source rank, destination rank, rows)`` for every pair that moves rows, ascending."""

    def chains(self, gpus_per_node: int) -> tuple[tuple[tuple[int, ...], int], ...]:
        """``(path, rows)`` pieces, pairs in order: a pair inside one node, or any pair when direct,
        is one piece ``((a, b), rows)``; a routed cross-node pair gives one piece per proxy part
        (:func:`~.remap_routing.proxy_parts`), path ``(a, P_a, P_b, b)`` without repeated ranks.
        Example: 2 x 2 GPUs, proxies (0, 1), ``0 -> 3`` 5 rows: ``((0, 2, 3), 3)``, ``((0, 1, 3), 2)``."""
        out: list[tuple[tuple[int, ...], int]] = []
        for a, b, n in self.pair_rows:
            if not self.proxies or a // gpus_per_node == b // gpus_per_node:
                out.append(((a, b), n))
                continue
            for _, rows, pa, pb in proxy_parts(a, b, n, gpus_per_node, self.proxies):
                path = (a,) + ((pa,) if pa != a else ()) + (pb,) + ((b,) if pb != b else ())
                out.append((path, rows))
        return tuple(out)


@dataclass(frozen=True, kw_only=True)
class RankProgram:
    """Everything rank ``rank`` runs for one attention layer (module docstring): ``rings`` it takes part
    in (queue order), ``local_chunks`` (slots in ring and step order, then the sequences in no slot),
    the ``forward`` / ``backward`` op lists, the ``transfers`` they name, attention-layout ``tokens``."""

    rank: int
    rings: tuple[RingPart, ...]
    local_chunks: tuple[LocalChunk, ...]
    forward: tuple[RankOp, ...]
    backward: tuple[RankOp, ...]
    transfers: dict[TransferId, Transfer] = field(hash=False, compare=False)
    tokens: int

    @property
    def local_lens(self) -> tuple[int, ...]:
        """Lengths of the rank's local sequences in plan order."""
        return tuple(n for _, n in sorted((s, n) for c in self.local_chunks for s, n in zip(c.seqs, c.lens)))


@dataclass(frozen=True, kw_only=True)
class StepProgram:
    """Every rank's program for one plan, the transfers they share, and the two remaps."""

    ranks: tuple[RankProgram, ...]
    transfers: dict[TransferId, Transfer]
    remaps: tuple[RemapExchange, RemapExchange] | None
    routing: bool


def _buffer_rows(layout: tuple[TokenRange, ...]) -> dict[int, list[tuple[int, int, int]]]:
    """seq -> ``(start, end, buffer offset)`` pieces of a rank's attention buffer, in token order."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    off = 0
    for seq, start, end in layout:
        out.setdefault(seq, []).append((start, end, off))
        off += end - start
    for pieces in out.values():
        pieces.sort()
    return out


def _rows(pieces: list[tuple[int, int, int]], a: int, b: int) -> list[int]:
    """Buffer rows of tokens ``[a, b)`` of one sequence; pieces ``[(0, 4, 10), (4, 6, 0)]``:
    tokens [3, 5) -> rows [13, 0]."""
    rows: list[int] = []
    for start, end, off in pieces:
        lo, hi = max(a, start), min(b, end)
        if lo < hi:
            rows += range(off + lo - start, off + hi - start)
    if len(rows) != b - a:
        raise ValueError(f"tokens [{a}, {b}) are not all in this rank's attention layout")
    return rows


def _participants(plan: StepPlan, k: int, routing: bool) -> tuple[int, ...]:
    """Ring ``k``'s members and the relays of its routed hops, ascending."""
    ring = plan.rings[k]
    who = set(ring.ranks)
    if routing:
        for route in plan.routes_for(ring.ranks).values():  # one element per proxy names every part's path
            for rp in route_parts(route, len(route.proxies), plan.gpus_per_node):
                who.update(rp.relays)
    return tuple(sorted(who))


def _transfers(plan: StepPlan, k: int, routing: bool) -> tuple[list[Transfer], list[Transfer]]:
    """Ring ``k``'s K/V transfers (steps ``0 .. g-2``) and accumulator transfers (``0 .. g-1``)."""
    ring = plan.rings[k]
    g, gpn = len(ring.ranks), plan.gpus_per_node
    routes = plan.routes_for(ring.ranks) if routing else {}
    lengths = [plan.sequences[s].length for s in ring.seqs]
    held = [sum(sum(e - s for s, e in zigzag_ranges(n, g, p)) for n in lengths) for p in range(g)]
    who = _participants(plan, k, routing)
    steps = []  # messages of step j; the K/V and accumulator transfers of a step carry the same sizes
    for j in range(g):
        steps.append(tuple(Message(src=src, dst=ring.ranks[next_position(p, g)], tokens=held[ring_source(p, j, g)],
                                   route=routes.get((src, ring.ranks[next_position(p, g)])))
                           for p, src in enumerate(ring.ranks)))
    kv = [Transfer(id=TransferId(k, j, "kv"), messages=steps[j], gpus_per_node=gpn, participants=who)
          for j in range(g - 1)]
    acc = [Transfer(id=TransferId(k, j, "acc"), messages=steps[j], gpus_per_node=gpn, participants=who)
           for j in range(g)]
    return kv, acc


def _ring_calls(part: RingPart) -> list[RingCall]:
    """The member's kernel call at each step of its ring (module docstring, Rows)."""
    i, g = part.position, part.size
    assert i is not None
    calls = []
    for j in range(g):
        src = ring_source(i, j, g)
        kind = "diag" if src == i else ("early" if src < i else "late")
        calls.append(RingCall(part=part, ring=part.ring, step=j, position=i, source=src,
                              kind=kind))  # type: ignore[arg-type]
    return calls


@dataclass
class _Shared:
    """What every rank's lowering reads, built once per plan: per rank its rings (member or relay, queue
    order), local sequences and slots; per ring its transfers (on first use)."""

    rings_of: dict[int, list[int]]
    own: dict[int, list[int]]
    slots: dict[int, list[tuple[int, int, tuple[int, ...]]]]
    transfers: dict[int, tuple[list[Transfer], list[Transfer]]]


def _shared(plan: StepPlan, routing: bool) -> _Shared:
    sh = _Shared(rings_of={}, own={}, slots={}, transfers={})
    for k in range(len(plan.rings)):
        for r in _participants(plan, k, routing):
            sh.rings_of.setdefault(r, []).append(k)
    for i, seq in enumerate(plan.sequences):
        if seq.placement == "local":
            sh.own.setdefault(seq.ranks[0], []).append(i)
    for x in plan.local_slots:
        sh.slots.setdefault(x.rank, []).append((x.ring, x.step, x.seqs))
    return sh


def _rank_program(plan: StepPlan, rank: int, routing: bool, sh: _Shared) -> RankProgram:
    """Rank ``rank``'s program (module docstring)."""
    layout = plan.attention_layout[rank]
    mine = sorted(sh.slots.get(rank, ()))
    own = sh.own.get(rank, [])
    slotted = {i for _, _, seqs in mine for i in seqs}
    groups = [seqs for _, _, seqs in mine] + [tuple(i for i in own if i not in slotted)]
    chunks = tuple(LocalChunk(seqs=tuple(idx), lens=tuple(plan.sequences[i].length for i in idx), layout=layout)
                   for idx in groups if idx)
    slot_of = {(k, j): c for c, (k, j, _) in enumerate(mine)}
    rings: list[RingPart] = []
    fwd: list[RankOp] = []
    bwd: list[RankOp] = []
    transfers: dict[TransferId, Transfer] = {}
    for k in sh.rings_of.get(rank, ()):
        ring = plan.rings[k]
        if k not in sh.transfers:
            sh.transfers[k] = _transfers(plan, k, routing)
        kv, acc = sh.transfers[k]
        g = len(ring.ranks)
        pos = ring.ranks.index(rank) if rank in ring.ranks else None
        part = RingPart(ring=k, ranks=ring.ranks, placement=ring.placement, seqs=ring.seqs,
                        lengths=tuple(plan.sequences[s].length for s in ring.seqs), position=pos, layout=layout)
        rings.append(part)
        transfers.update({t.id: t for t in kv + acc})
        calls: list[RingCall | None] = list(_ring_calls(part)) if pos is not None else [None] * g
        for j, call in enumerate(calls):
            slot: list[RankOp] = [LocalCall(chunk=slot_of[(k, j)], ring=k, step=j)] if (k, j) in slot_of else []
            post_kv: list[RankOp] = [Post(kv[j].id)] if j < g - 1 else []
            wait_kv: list[RankOp] = [Wait(kv[j].id)] if j < g - 1 else []
            me: list[RankOp] = [call] if call is not None else []
            fwd += post_kv + me + slot + wait_kv
            bwd += post_kv + me + ([Wait(acc[j - 1].id)] if j else []) + [Post(acc[j].id)] + slot + wait_kv
        bwd.append(Wait(acc[g - 1].id))
    if len(chunks) > len(mine):  # the sequences in no slot, after the rings
        fwd.append(LocalCall(chunk=len(chunks) - 1))
        bwd.append(LocalCall(chunk=len(chunks) - 1))
    return RankProgram(rank=rank, rings=tuple(rings), local_chunks=chunks, forward=tuple(fwd), backward=tuple(bwd),
                       transfers=transfers, tokens=plan.tokens(rank, "attention"))


def lower_remaps(plan: StepPlan) -> tuple[RemapExchange, RemapExchange] | None:
    """The plan's two :class:`RemapExchange` s (None when the layouts move no row)."""
    moved: dict[tuple[int, int], int] = {}
    for seg in plan.remap.segments:
        if seg.lin_rank != seg.att_rank:
            key = (seg.lin_rank, seg.att_rank)
            moved[key] = moved.get(key, 0) + seg.length
    if not moved:
        return None
    fwd = tuple((a, b, n) for (a, b), n in sorted(moved.items()))
    back = tuple(sorted((b, a, n) for a, b, n in fwd))
    return (RemapExchange(direction="to_attention", proxies=plan.remap_proxies, pair_rows=fwd),
            RemapExchange(direction="to_linear", proxies=plan.remap_proxies, pair_rows=back))


def rank_remap(plan: StepPlan, rank: int, direction: Direction) -> tuple[RankExchange, RoutedExchange | None]:
    """``rank``'s remap in ``direction``: the direct ``all_to_all`` lists (:meth:`~.remap.RemapPlan.exchange`:
    counts, gather and scatter indices) and, when the plan routes its remap (``remap_proxies`` on more
    than one rank), the three routed phases (:func:`~.remap_routing.routed_exchange`), else None."""
    direct = plan.remap.exchange(rank, direction)
    if not plan.remap_proxies or plan.world_size == 1:
        return direct, None
    return direct, routed_exchange(plan.remap, direction, plan.gpus_per_node, plan.remap_proxies)[rank]


def lower(plan: StepPlan, *, routing: bool = True) -> StepProgram:
    """Every rank's program for ``plan`` (``routing=False``: every hop direct, the plan's routes ignored)."""
    sh = _shared(plan, routing)
    ranks = tuple(_rank_program(plan, r, routing, sh) for r in range(plan.world_size))
    transfers = {t.id: t for k in sorted(sh.transfers) for t in sh.transfers[k][0] + sh.transfers[k][1]}
    return StepProgram(ranks=ranks, transfers=transfers, remaps=lower_remaps(plan), routing=routing)


def lower_rank(plan: StepPlan, rank: int, *, routing: bool = True) -> RankProgram:
    """Rank ``rank``'s program alone (what :func:`lower` gives it); builds only its rings' transfers."""
    if not 0 <= rank < plan.world_size:
        raise ValueError(f"rank {rank} is outside the plan's [0, {plan.world_size})")
    return _rank_program(plan, rank, routing, _shared(plan, routing))
