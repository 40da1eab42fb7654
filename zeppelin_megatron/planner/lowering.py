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

Head-parallel rings' all-to-alls bracket all of that: every ``heads`` :class:`Post` comes first
(ring order), every ``tokens`` :class:`Wait` last (below).

Backward walks the same rings and steps; each step also moves the dK/dV
accumulators (``kind="acc"`` transfers, ``g`` of them: after ``g`` hops each
accumulator is home): post K/V ``j``, the step's call, wait accumulator
``j-1``, post accumulator ``j`` (it first adds the step's dK/dV block), the
slot's call, wait K/V ``j``; after the last step wait accumulator ``g-1``.

Head-parallel rings (``ring.a2a > 1``, :mod:`.head_parallel`): the ring's ops are wrapped in
``Post``/``Wait`` of its ``heads`` all-to-all (before: rows to the lanes' head slices; backward:
the output gradient) and of its ``tokens`` all-to-all (after: output rows back; backward: dq, dk,
dv), and its steps run over its ``blocks`` (lane ``l`` of block ``b`` sends to lane ``l`` of
``b + 1``); the calls' rows are rows of the rank's head buffer (:class:`RingPart`). Each all-to-all
has one message per run of a lane's tokens in the head buffer (:func:`~.head_parallel.lane_runs`: in
``heads`` the sender's lane, in ``tokens`` the receiver's), so every message lands in place. A ring of one
block (Ulysses) has one ``diag`` call and no K/V or accumulator transfer. What a ``heads``
all-to-all sends (q, k, v; backward: the output gradient) is there before any call, and what a
``tokens`` one returns is needed only after the layer's attention, so a rank posts all its ``heads``
all-to-alls first and waits all its ``tokens`` ones last (each list in ring order): a ring's ``heads``
all-to-all flows while the rank's earlier rings run, its ``tokens`` one while its later rings and
its local sequences after the rings run. Every rank derives its order from the one ring order, so
two ranks post the transfers they share in the same order (NCCL matches point-to-point calls by
order). A local slot at step ``-1`` puts its :class:`LocalCall` right before ``Wait`` of ``heads``
(forward and backward): it runs while the all-to-all is in flight and the block's other lanes arrive.
Example: a Ulysses ring 0 over ranks ``(0, 1)`` and ``LocalSlot(0, 0, -1, (2,))``: rank 0's forward
is ``Post(heads 0), LocalCall(seq 2), Wait(heads 0), RingCall(diag), Post(tokens 0), Wait(tokens 0)``.
With a plain ring 1 over ``(0, 2)`` after it and a Ulysses ring 2 over ``(0, 3)`` after that
(1 x 4 GPUs), rank 0's forward is ``Post(heads 0), Post(heads 2), LocalCall(seq 2),
Wait(heads 0), RingCall(diag of 0), Post(tokens 0), <ring 1's steps>, Wait(heads 2), RingCall(diag
of 2), Post(tokens 2), Wait(tokens 0), Wait(tokens 2)``: ring 2's ``heads`` and ring 0's ``tokens``
all-to-alls run under ring 1.
The row arithmetic of a rank's buffers is :mod:`.lowering_parts`; the remap's is :mod:`.lowering_remap`.

Remap (:class:`RemapExchange`, per rank :func:`rank_remap`): ``to_attention`` before attention,
``to_linear`` after: one ``all_to_all``, or with ``remap_proxies`` the three phases of :mod:`~.remap_routing`.
A rank's :attr:`RankProgram.windows` (the plan's :class:`~.plan.RemapSlot` s) run between the post and
the wait of an exchange, forward and backward: ``Post(to_attention)``, the ``to_attention`` window call,
``Wait(to_attention)``, then ``forward`` (``backward``), then ``Post(to_linear)``, the ``to_linear`` window
call, ``Wait(to_linear)``; a window call reads and writes the rank's *linear* rows (its sequences stay).

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

from .head_parallel import block_ranges, lane_runs
from .lowering_parts import LocalChunk, RingPart
from .lowering_remap import RemapExchange, lower_remaps, rank_remap
from .plan import StepPlan
from .plan_parts import TokenRange
from .remap_windows import staying_rows
from .routing import outside_relays
from .transfers import ACC_TAG, HEADS_TAG, KV_TAG, ROUNDS, TOKENS_TAG, Hop, Message, Transfer, TransferId, message_hops
from .zigzag import next_position, ring_source, zigzag_tokens

__all__ = ["Message", "Hop", "TransferId", "Transfer", "RingCall", "LocalCall", "WindowCall", "Post", "Wait", "RankOp",
           "participants",
           "RingPart",
           "LocalChunk", "RemapExchange", "RankProgram", "StepProgram", "lower", "lower_rank", "lower_remaps",
           "rank_remap", "message_hops", "ROUNDS", "KV_TAG", "ACC_TAG", "HEADS_TAG", "TOKENS_TAG"]

@dataclass(frozen=True, kw_only=True)
class RingCall:
    """One varlen kernel call of ring ``part.ring``'s step ``step`` at ``position`` (K/V held from ``source``).

    One segment per ring sequence (``part.seqs``): ``lens_q[s]`` queries against ``lens_k[s]`` keys,
    causal only for ``diag``; :attr:`q` / :attr:`kv`: token ranges ``(seq, start, end)``; :attr:`q_rows`:
    rows of the rank's ring buffer; :attr:`kv_rows`: rows of the held K/V (``source``'s seq-major
    order). Derived on first use (the simulator needs only the kind).
    """

    part: RingPart = field(repr=False, compare=False)
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
class LocalCall:
    """Run local chunk ``chunk`` (index into :attr:`RankProgram.local_chunks`); ``ring``/``step``:
    the slot it fills (None: after the rings)."""

    chunk: int
    ring: int | None = None
    step: int | None = None


@dataclass(frozen=True, kw_only=True)
class WindowCall:
    """Run local chunk ``chunk`` while the layout exchange ``direction`` is in flight: after this rank
    posts it, before it waits (forward, and the same place in backward; :class:`~.plan.RemapSlot`).
    The chunk's sequences stay on the rank, so the call reads q/k/v (backward: the output gradient)
    at ``linear_rows`` of the rank's *linear* buffers and writes there (``[start, end)`` per sequence
    of the chunk, in its order), not at attention rows.

    Example: linear ranges ``((3, 0, 5), (7, 0, 4))`` and a window of sequence 7:
    ``WindowCall(chunk=1, direction="to_attention", linear_rows=((5, 9),))``.
    """

    chunk: int
    direction: str
    linear_rows: tuple[tuple[int, int], ...]


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
class RankProgram:
    """Everything rank ``rank`` runs for one attention layer (module docstring): ``rings`` it takes part
    in (queue order), ``local_chunks`` (slots in ring and step order, then the sequences in no slot,
    then the remap windows' chunks), the ``forward`` / ``backward`` op lists, the ``transfers`` they
    name, attention-layout ``tokens``, and ``windows``: the calls run inside the remap in (before
    ``forward``/``backward``) and the remap out (after them), ``to_attention``'s first."""

    rank: int
    rings: tuple[RingPart, ...]
    local_chunks: tuple[LocalChunk, ...]
    forward: tuple[RankOp, ...]
    backward: tuple[RankOp, ...]
    transfers: dict[TransferId, Transfer] = field(hash=False, compare=False)
    tokens: int
    windows: tuple[WindowCall, ...] = ()
    whole_chunk: int | None = None
    """``0`` when the plan does not remap (linear layout = attention layout) and the rank's one local chunk is
    all it runs (no ring, as member or relay) and covers its whole attention buffer in order (rows ``0 ..
    tokens-1``): the engine then calls the kernel on the buffers themselves and returns the kernel's output and
    gradients as the rank's (no zero fill, no row copies; :mod:`~zeppelin_megatron.runtime.engine`), and
    :func:`~.predict.predict` and the simulator charge no copies. ``None`` otherwise. Example: a packed plan's
    rank holding sequences 3 and 7 whole, ``((3, 0, 500), (7, 0, 200))``: ``0``."""

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


def participants(plan: StepPlan, k: int, routing: bool) -> tuple[int, ...]:
    """Ring ``k``'s members and the relays of its routed hops, ascending."""
    ring = plan.rings[k]
    if not (routing and ring.a2a == 1):
        return tuple(sorted(ring.ranks))
    return tuple(sorted({*ring.ranks, *outside_relays(ring.ranks, plan.routes_for(ring.ranks).values(),
                                                      plan.gpus_per_node)}))


def _transfers(plan: StepPlan, k: int, routing: bool) -> tuple[list[Transfer], list[Transfer], list[Transfer]]:
    """Ring ``k``'s K/V transfers (steps ``0 .. g-2``), accumulator transfers (``0 .. g-1``; none
    when ``g = 1``) and, for a head-parallel ring, its ``heads`` and ``tokens`` all-to-alls (``g``:
    positions, blocks of a head-parallel ring; lane ``l`` of block ``b`` sends to lane ``l`` of ``b + 1``)."""
    ring = plan.rings[k]
    a, gpn = ring.a2a, plan.gpus_per_node
    g = len(ring.ranks) // a
    routes = plan.routes_for(ring.ranks) if routing and a == 1 else {}
    lengths = [plan.sequences[s].length for s in ring.seqs]
    if a == 1:
        held = [sum(zigzag_tokens(n, g, p) for n in lengths) for p in range(g)]
    else:
        held = [sum(e - s for n in lengths for s, e in block_ranges(n, len(ring.ranks), a, b)) for b in range(g)]
    who = participants(plan, k, routing)
    steps = []  # messages of step j; the K/V and accumulator transfers of a step carry the same sizes
    for j in range(g):
        msgs = []
        for p in range(g):
            for lane in range(a):
                src, dst = ring.ranks[p * a + lane], ring.ranks[next_position(p, g) * a + lane]
                msgs.append(Message(src=src, dst=dst, tokens=held[ring_source(p, j, g)], route=routes.get((src, dst))))
        steps.append(tuple(msgs))
    kv = [Transfer(id=TransferId(k, j, "kv"), messages=steps[j], gpus_per_node=gpn, participants=who)
          for j in range(g - 1)]
    acc = [Transfer(id=TransferId(k, j, "acc"), messages=steps[j], gpus_per_node=gpn, participants=who)
           for j in range(g)] if g > 1 else []
    if a == 1:
        return kv, acc, []
    # one message per run of the sender's (heads) / receiver's (tokens) lane: it lands in place (lane_runs)
    runs = [[lane_runs(lengths, len(ring.ranks), a, b, x) for x in range(a)] for b in range(g)]
    pairs = [(b, x, y) for b in range(g) for x in range(a) for y in range(a) if x != y]
    heads = tuple(Message(src=ring.ranks[b * a + x], dst=ring.ranks[b * a + y], tokens=n)
                  for b, x, y in pairs for _, _, n in runs[b][x])
    back = tuple(Message(src=ring.ranks[b * a + y], dst=ring.ranks[b * a + x], tokens=n)
                 for b, x, y in pairs for _, _, n in runs[b][x])
    a2a = [Transfer(id=TransferId(k, 0, "heads"), messages=heads, gpus_per_node=gpn, participants=who),
           Transfer(id=TransferId(k, 0, "tokens"), messages=back, gpus_per_node=gpn, participants=who)]
    return kv, acc, a2a


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
    transfers: dict[int, tuple[list[Transfer], list[Transfer], list[Transfer]]]
    windows: dict[int, list[tuple[str, tuple[int, ...]]]]
    whole: dict[int, dict[int, tuple[int, int]]] | None
    """Per rank, its staying local sequences' linear rows (None when the plan does not remap)."""


def _shared(plan: StepPlan, routing: bool) -> _Shared:
    sh = _Shared(rings_of={}, own={}, slots={}, transfers={}, windows={},
                 whole=None if plan.linear_layout == plan.attention_layout else staying_rows(plan))
    for k in range(len(plan.rings)):
        for r in participants(plan, k, routing):
            sh.rings_of.setdefault(r, []).append(k)
    for i, seq in enumerate(plan.sequences):
        if seq.placement == "local":
            sh.own.setdefault(seq.ranks[0], []).append(i)
    for x in plan.local_slots:
        sh.slots.setdefault(x.rank, []).append((x.ring, x.step, x.seqs))
    for y in sorted(plan.remap_slots, key=lambda y: (y.rank, y.direction != "to_attention")):
        sh.windows.setdefault(y.rank, []).append((y.direction, y.seqs))
    return sh


def _rank_program(plan: StepPlan, rank: int, routing: bool, sh: _Shared) -> RankProgram:
    """Rank ``rank``'s program (module docstring)."""
    layout = plan.attention_layout[rank]
    mine = sorted(sh.slots.get(rank, ()))
    own = sh.own.get(rank, [])
    wins = sh.windows.get(rank, [])
    slotted = {i for _, _, seqs in mine for i in seqs} | {i for _, seqs in wins for i in seqs}
    rest = tuple(i for i in own if i not in slotted)
    groups = [seqs for _, _, seqs in mine] + ([rest] if rest else []) + [seqs for _, seqs in wins]
    whole = sh.whole.get(rank, {}) if sh.whole is not None else {}
    chunks = tuple(LocalChunk(seqs=tuple(idx), lens=tuple(plan.sequences[i].length for i in idx), layout=layout,
                              linear_rows=tuple(whole[i] for i in idx) if all(i in whole for i in idx) else None)
                   for idx in groups)
    slot_of = {(k, j): c for c, (k, j, _) in enumerate(mine)}
    first_window = len(mine) + (1 if rest else 0)
    windows = tuple(WindowCall(chunk=first_window + n, direction=d, linear_rows=tuple(whole[i] for i in seqs))
                    for n, (d, seqs) in enumerate(wins))  # check_remap_slots: a window's sequences stay
    rings: list[RingPart] = []
    fwd: list[RankOp] = []
    bwd: list[RankOp] = []
    transfers: dict[TransferId, Transfer] = {}
    heads_posts: list[RankOp] = []  # every head-parallel ring's heads all-to-all: posted first
    tokens_waits: list[RankOp] = []  # and its tokens all-to-all: waited last
    for k in sh.rings_of.get(rank, ()):
        ring = plan.rings[k]
        if k not in sh.transfers:
            sh.transfers[k] = _transfers(plan, k, routing)
        kv, acc, a2a = sh.transfers[k]
        g = ring.blocks
        pos = lane = None
        if rank in ring.ranks:
            pos, lane = divmod(ring.ranks.index(rank), ring.a2a)
        part = RingPart(ring=k, ranks=ring.ranks, placement=ring.placement, seqs=ring.seqs,
                        lengths=tuple(plan.sequences[s].length for s in ring.seqs), position=pos, layout=layout,
                        a2a=ring.a2a, lane=lane if ring.a2a > 1 else None)
        rings.append(part)
        transfers.update({t.id: t for t in kv + acc + a2a})
        # a slot at step -1 runs inside the heads all-to-all (after its Post, before its Wait); the Post is
        # the rank's first op and the tokens all-to-all's Wait its last (module docstring)
        in_heads: list[RankOp] = [LocalCall(chunk=slot_of[(k, -1)], ring=k, step=-1)] if (k, -1) in slot_of else []
        to_heads: list[RankOp] = in_heads + [Wait(a2a[0].id)] if a2a else []
        to_tokens: list[RankOp] = [Post(a2a[1].id)] if a2a else []
        if a2a:
            heads_posts.append(Post(a2a[0].id))
            tokens_waits.append(Wait(a2a[1].id))
        fwd += to_heads
        bwd += to_heads
        calls: list[RingCall | None] = list(_ring_calls(part)) if pos is not None else [None] * g
        for j, call in enumerate(calls):
            slot: list[RankOp] = [LocalCall(chunk=slot_of[(k, j)], ring=k, step=j)] if (k, j) in slot_of else []
            post_kv: list[RankOp] = [Post(kv[j].id)] if j < g - 1 else []
            wait_kv: list[RankOp] = [Wait(kv[j].id)] if j < g - 1 else []
            me: list[RankOp] = [call] if call is not None else []
            fwd += post_kv + me + slot + wait_kv
            post_acc: list[RankOp] = [Post(acc[j].id)] if acc else []
            bwd += post_kv + me + ([Wait(acc[j - 1].id)] if j else []) + post_acc + slot + wait_kv
        if acc:
            bwd.append(Wait(acc[g - 1].id))
        fwd += to_tokens
        bwd += to_tokens
    if rest:  # the sequences in no slot, after the rings
        fwd.append(LocalCall(chunk=len(mine)))
        bwd.append(LocalCall(chunk=len(mine)))
    fwd = heads_posts + fwd + tokens_waits
    bwd = heads_posts + bwd + tokens_waits
    tokens = plan.tokens(rank, "attention")
    alone = sh.whole is None and not rings and len(chunks) == 1 and chunks[0].span == (0, tokens)
    return RankProgram(rank=rank, rings=tuple(rings), local_chunks=chunks, forward=tuple(fwd), backward=tuple(bwd),
                       transfers=transfers, tokens=tokens, windows=windows, whole_chunk=0 if alone else None)


def lower(plan: StepPlan, *, routing: bool = True) -> StepProgram:
    """Every rank's program for ``plan`` (``routing=False``: every hop direct, the plan's routes ignored)."""
    sh = _shared(plan, routing)
    ranks = tuple(_rank_program(plan, r, routing, sh) for r in range(plan.world_size))
    transfers = {t.id: t for k in sorted(sh.transfers) for t in sum(sh.transfers[k], [])}
    return StepProgram(ranks=ranks, transfers=transfers, remaps=lower_remaps(plan), routing=routing)


def lower_rank(plan: StepPlan, rank: int, *, routing: bool = True) -> RankProgram:
    """Rank ``rank``'s program alone (what :func:`lower` gives it); builds only its rings' transfers."""
    if not 0 <= rank < plan.world_size:
        raise ValueError(f"rank {rank} is outside the plan's [0, {plan.world_size})")
    return _rank_program(plan, rank, routing, _shared(plan, routing))
