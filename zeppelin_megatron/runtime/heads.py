"""Head-parallel rings: the all-to-all tensor plumbing between token rows and lane head slices.

A member of a head-parallel ring (``a2a = a > 1``, :mod:`zeppelin_megatron.planner.head_parallel`)
is lane ``l`` of block ``b``. It holds ``n_own`` tokens of the ring in its attention buffer
(:attr:`~zeppelin_megatron.planner.lowering.RingPart.rows`, all ``Hq`` / ``Hkv`` heads) and runs
the ring's kernel calls on its *head buffer*: the ``n_b`` tokens of its block (block seq-major
order, the rows :class:`~zeppelin_megatron.planner.lowering.RingCall` names) for its lane's
``hq_l = Hq / a`` query heads and ``hkv_l`` K/V heads (:func:`~zeppelin_megatron.planner.head_parallel.lane_heads`).
The lowering's ``heads`` transfer carries lane ``x``'s tokens to lane ``y`` (``y``'s heads), the
``tokens`` transfer carries them back; this module builds the send buffers and turns what arrives
into the head buffer (and back), one :class:`Exchange` per transfer.

Buffers (``w`` columns of ``D`` elements per token row; one contiguous slice per message, so the
router sends and receives in place, :class:`~.router.InFlight` ``into``). The all-to-alls have one message
per *run* of a lane's tokens in the head buffer (:func:`~zeppelin_megatron.planner.head_parallel.lane_runs`:
own tokens ``[o, o + c)`` of lane ``x`` fill head rows ``[r, r + c)``), so nothing is permuted:

* to heads, sender: ``S`` [a, n_own, w, D], slot ``y`` = own tokens, lane ``y``'s heads; a message is
  ``S[y][o:o + c]``; receiver: ``R`` [n_b, w, D] in head-buffer order, each message landing at its rows
  ``R[r:r + c]`` (its own slot's runs copied from ``S[l]``); one block (Ulysses): ``q_h``, ``k_h``, ``v_h``
  are column views of ``R`` (the kernel takes row-strided inputs); several blocks: ``q_h`` and the packed
  ``kv_h`` the ring circulates are copied out of ``R`` once;
* to tokens, sender: the head buffer itself (forward ``out_h``; backward the packed ``[n_b, w, D]``
  gradients, :meth:`HeadIndex.grads_send`), a message to lane ``x`` = rows ``[r, r + c)`` of one of
  ``x``'s runs; receiver: ``T`` [a, n_own, w, D], slot ``y`` = own tokens, lane ``y``'s heads, messages
  landing at ``T[y][o:o + c]``, then written into the attention-buffer rows.

What each carries (``w``): forward ``heads`` q, k, v (``hq_l + 2 hkv_l``, model dtype), forward
``tokens`` out (``hq_l``, model dtype), backward ``heads`` dout (``hq_l``, model dtype), backward
``tokens`` dq, dk, dv (``hq_l + 2 hkv_l``; the model dtype, cast once on the sender from the accumulators
of a ring of several blocks, and as they are after one block, whose one kernel call's gradients are final;
only where K/V heads are shared by several lanes, ``Hkv < a``, in the accumulator dtype: their dK/dV are
summed at home in float32 at least, then every gradient is cast once there; :func:`grads_wire_dtype`).
:func:`transfer_unit` gives the elements per token of every transfer kind.

Worked example: ``Hq = 8``, ``Hkv = 2``, ``a = 4`` (K/V heads replicated): lane 1 takes query heads
``[2, 4)`` and K/V head 0 (``hkv_l = 1``); forward ``heads`` rows carry ``(2 + 2) D`` elements,
``tokens`` rows ``2 D``; lanes 0 and 1 both return a dK for K/V head 0, summed in float32 (bf16
inputs) before the cast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..planner.head_parallel import head_split_error, lane_heads, lane_kv_heads, lanes_share_kv
from ..planner.lowering import RankProgram, RingPart, TransferId
from ..planner.plan import StepPlan
from .rows import put, take

__all__ = ["HeadShape", "transfer_unit", "heads_problem", "Exchange", "HeadIndex", "head_index", "grads_wire_dtype"]


class HeadShape(NamedTuple):
    """Heads and head dim of the engine's inputs: ``q`` [T, hq, d], ``k``, ``v`` [T, hkv, d]."""

    hq: int
    hkv: int
    d: int


def transfer_unit(kind: str, backward: bool, a2a: int, shape: HeadShape) -> int:
    """Elements per token of a ``kind`` transfer of a ring of block width ``a2a``.

    ``kv`` / ``acc``: ``2 hkv_l d`` (``hkv_l = hkv`` on a plain ring); ``heads``: ``(hq_l + 2 hkv_l) d``
    forward (q, k, v), ``hq_l d`` backward (dout); ``tokens``: ``hq_l d`` forward (out),
    ``(hq_l + 2 hkv_l) d`` backward (dq, dk, dv). Example: ``HeadShape(8, 2, 4)``, ``a2a = 4``:
    ``kv`` 8, forward ``heads`` 16, forward ``tokens`` 8.
    """
    hq, hkv, d = shape
    hkv_l = hkv if a2a == 1 else lane_kv_heads(hkv, a2a)
    hq_l = hq // a2a
    if kind in ("kv", "acc"):
        return 2 * hkv_l * d
    full = (hq_l + 2 * hkv_l) * d
    if kind == "heads":
        return hq_l * d if backward else full
    if kind == "tokens":
        return full if backward else hq_l * d
    raise ValueError(f"unknown transfer kind {kind!r}; known: kv, acc, heads, tokens")


def heads_problem(plan: StepPlan, hq: int, hkv: int) -> str | None:
    """Why ``plan``'s head-parallel rings cannot run with ``hq`` / ``hkv`` heads per rank (None: they can).

    Names the first ring that fails, its width and the head counts, e.g. ``"ring 1 (ranks [0, 1, 2],
    sequences [4]) is head-parallel over 3 lanes, but the heads Hq=8, Hkv=2 cannot split: 3 lanes do
    not divide 8 query heads"``. Every rank gets the same answer (the plan and heads agree).
    """
    for k, ring in enumerate(plan.rings):
        if ring.a2a == 1:
            continue
        why = head_split_error(hq, hkv, ring.a2a)
        if why is not None:
            return (f"ring {k} (ranks {list(ring.ranks)}, sequences {list(ring.seqs)}) is head-parallel over "
                    f"{ring.a2a} lanes, but the heads Hq={hq}, Hkv={hkv} cannot split: {why}")
    return None


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """One all-to-all as this rank runs it: ``payloads`` (message -> flat send tensor), ``into``
    (message -> flat receive tensor, a slice of ``recv``), ``recv`` the whole receive buffer."""

    payloads: dict[int, torch.Tensor]
    into: dict[int, torch.Tensor]
    recv: torch.Tensor


Run = tuple[int, int, int]
"""``(message, start, end)``: a message of an all-to-all and the rows it covers."""

LaneRun = tuple[int, int, int, int]
"""``(message, lane, start, end)``: a message, the lane whose slot it belongs to and the own rows it covers."""


@dataclass(frozen=True, kw_only=True)
class HeadIndex:
    """A member's head-parallel ring on one device (module docstring), built once per plan.

    ``rows`` [n_own]: own attention-buffer rows, ``span`` ``(start, end)`` when they are ``range(start, end)``
    (``RingPart.span``: ``narrow`` views and slice copies instead of gathers and ``index_copy_``; None: gathers);
    ``counts[x]``: lane ``x``'s tokens; ``block``: the head buffer's rows (``n_b``); ``blocks``: the ring's blocks
    (one: Ulysses, the head buffers are views of what arrived); ``own_runs``: this lane's ``(own, row, count)``
    runs (:func:`~zeppelin_megatron.planner.head_parallel.lane_runs`); ``kv_cols[x]``: lane ``x``'s dK then dV
    columns (``2 hkv_l``) of a [*, 2 Hkv, D] buffer, ``kv_ranges[x]`` the same heads as a range; ``kv_pick``
    [a hkv_l]: the K/V head of every lane's slot (None when ``a | Hkv``: the identity, each K/V head in one
    lane). Messages: ``heads_send`` (message, receiver lane, own rows), ``heads_recv`` (message, head rows),
    ``tokens_send`` (message, head rows), ``tokens_recv`` (message, sender lane, own rows).
    """

    ring: int
    a2a: int
    lane: int
    hq_l: int
    hkv_l: int
    shape: HeadShape
    rows: torch.Tensor
    span: tuple[int, int] | None
    counts: tuple[int, ...]
    blocks: int
    own_runs: tuple[tuple[int, int, int], ...]
    kv_cols: tuple[torch.Tensor, ...]
    kv_ranges: tuple[tuple[int, int], ...]
    kv_pick: torch.Tensor | None
    heads_send: tuple[LaneRun, ...]
    heads_recv: tuple[Run, ...]
    tokens_send: tuple[Run, ...]
    tokens_recv: tuple[LaneRun, ...]

    @property
    def block(self) -> int:
        """Rows of the head buffer (``n_b``): every lane's tokens of the block."""
        return sum(self.counts)

    @property
    def own(self) -> int:
        """Tokens this rank holds of the ring (its attention-buffer rows)."""
        return self.counts[self.lane]

    def _own(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s own rows [n_own, ...] (:func:`~.rows.take`: a view on a span, else a gather)."""
        return take(t, self.rows, self.span)

    def _home(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Write ``src`` [n_own, ...] into ``dst``'s own rows (``dst``: a column slice of an attention-layout
        tensor; :func:`~.rows.put`: a slice copy casting on the way on a span, else ``.to`` + ``index_copy_``)."""
        put(dst, self.rows, self.span, src)

    # -- forward ----------------------------------------------------------------------------------

    def qkv_to_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Exchange:
        """Forward ``heads``: ``q`` [T_a, Hq, D], ``k``, ``v`` [T_a, Hkv, D] -> the exchange
        (receive buffer ``R`` [n_b, hq_l + 2 hkv_l, D], head-buffer order, own runs filled)."""
        a, n, hq_l, hkv_l, d = self.a2a, self.own, self.hq_l, self.hkv_l, self.shape.d
        send = q.new_empty((a, n, hq_l + 2 * hkv_l, d))
        send[:, :, :hq_l].copy_(self._own(q).view(n, a, hq_l, d).transpose(0, 1))
        for c, x in ((hq_l, k), (hq_l + hkv_l, v)):
            xs = self._own(x)
            if self.kv_pick is not None:
                xs = xs.index_select(1, self.kv_pick)
            send[:, :, c:c + hkv_l].copy_(xs.view(n, a, hkv_l, d).transpose(0, 1))
        return self._to_heads(send)

    def heads_qkv(self, ex: Exchange) -> tuple[torch.Tensor, torch.Tensor]:
        """The head buffers after the forward ``heads`` exchange: ``q_h`` [n_b, hq_l, D] and the packed
        ``kv_h`` [2, n_b, hkv_l, D] (K, then V, as the ring's buffers), head-buffer (block seq-major) order.
        One block: views of the receive buffer (rows ``hq_l + 2 hkv_l`` columns apart); several: copied out
        once, contiguous (the ring sends ``kv_h`` whole and gathers ``q_h`` rows)."""
        recv, hq_l, hkv_l = ex.recv, self.hq_l, self.hkv_l
        q_h = recv[:, :hq_l]
        kv_h = recv[:, hq_l:].unflatten(1, (2, hkv_l)).transpose(0, 1)
        if self.blocks == 1:
            return q_h, kv_h
        return q_h.contiguous(), kv_h.contiguous()

    def out_to_tokens(self, out_h: torch.Tensor) -> Exchange:
        """Forward ``tokens``: ``out_h`` [n_b, hq_l, D] -> the exchange (``T`` [a, n_own, hq_l, D])."""
        return self._to_tokens(out_h.contiguous())

    def tokens_out(self, ex: Exchange, out: torch.Tensor) -> None:
        """Write the received output rows into ``out`` [T_a, Hq, D] (own rows, every lane's heads)."""
        for y in range(self.a2a):
            q0 = y * self.hq_l
            self._home(out[:, q0:q0 + self.hq_l], ex.recv[y])

    # -- backward ---------------------------------------------------------------------------------

    def dout_to_heads(self, dout: torch.Tensor) -> Exchange:
        """Backward ``heads``: ``dout`` [T_a, Hq, D] -> the exchange (``R`` [n_b, hq_l, D])."""
        a, n, hq_l, d = self.a2a, self.own, self.hq_l, self.shape.d
        send = dout.new_empty((a, n, hq_l, d))
        send.copy_(self._own(dout).view(n, a, hq_l, d).transpose(0, 1))
        return self._to_heads(send)

    def heads_dout(self, ex: Exchange) -> torch.Tensor:
        """``dout_h`` [n_b, hq_l, D] in head-buffer order: the receive buffer itself."""
        return ex.recv

    def grads_buffer(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An empty ``[n_b, hq_l + 2 hkv_l, D]`` send buffer for the backward ``tokens`` exchange, in ``dtype``
        (:func:`grads_wire_dtype`): dq, then dK, then dV columns, head-buffer order (:meth:`grads_send`)."""
        return torch.empty((self.block, self.hq_l + 2 * self.hkv_l, self.shape.d), dtype=dtype, device=device)

    def grad_columns(self, send: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The dq [n_b, hq_l, D], dK and dV [n_b, hkv_l, D] column views of a :meth:`grads_buffer` (what a kernel's
        ``backward_into`` writes, what :meth:`grads_to_tokens` copies into). Example: ``hq_l = 4``, ``hkv_l = 1``:
        columns ``[0, 4)``, ``[4, 5)``, ``[5, 6)``."""
        hq_l, hkv_l = self.hq_l, self.hkv_l
        return send[:, :hq_l], send[:, hq_l:hq_l + hkv_l], send[:, hq_l + hkv_l:]

    def grads_to_tokens(self, dq_h: torch.Tensor, dk_h: torch.Tensor, dv_h: torch.Tensor,
                        dtype: torch.dtype | None = None) -> Exchange:
        """Backward ``tokens``: ``dq_h`` [n_b, hq_l, D], ``dk_h``, ``dv_h`` [n_b, hkv_l, D] (one dtype: the
        accumulator's after a ring of several blocks, the kernel's own after one block) -> the exchange
        (``T`` [a, n_own, hq_l + 2 hkv_l, D]) in ``dtype`` (default: theirs; :func:`grads_wire_dtype`): each
        gradient copied once into :meth:`grads_buffer`'s columns, cast on the way where ``dtype`` differs."""
        send = self.grads_buffer(dtype or dq_h.dtype, dq_h.device)
        for column, x in zip(self.grad_columns(send), (dq_h, dk_h, dv_h)):
            column.copy_(x)
        return self.grads_send(send)

    def grads_send(self, send: torch.Tensor) -> Exchange:
        """The backward ``tokens`` exchange of a filled :meth:`grads_buffer` (``T`` [a, n_own, w, D])."""
        return self._to_tokens(send)

    def tokens_grads(self, ex: Exchange, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> None:
        """Write the received gradients into ``dq`` [T_a, Hq, D], ``dk``, ``dv`` [T_a, Hkv, D] (own rows): every
        lane's dq heads, and its dK/dV when every K/V head is in one lane (``kv_pick`` None), as they arrive
        (in the model dtype, :func:`grads_wire_dtype`: copied; in a wider one: cast once on the way home); else
        dK/dV summed over the lanes that share a head in float32 at least (bf16 inputs: float32; float64:
        float64), then cast once."""
        hq_l, hkv_l, hkv = self.hq_l, self.hkv_l, self.shape.hkv
        recv = ex.recv
        for y in range(self.a2a):
            q0 = y * hq_l
            self._home(dq[:, q0:q0 + hq_l], recv[y, :, :hq_l])
        if self.kv_pick is None:
            for y, (k0, k1) in enumerate(self.kv_ranges):
                self._home(dk[:, k0:k1], recv[y, :, hq_l:hq_l + hkv_l])
                self._home(dv[:, k0:k1], recv[y, :, hq_l + hkv_l:])
            return
        dkv = torch.zeros((self.own, 2 * hkv, self.shape.d), dtype=torch.promote_types(recv.dtype, torch.float32),
                          device=recv.device)
        for y in range(self.a2a):
            dkv.index_add_(1, self.kv_cols[y], recv[y, :, hq_l:].to(dkv.dtype))
        self._home(dk, dkv[:, :hkv])
        self._home(dv, dkv[:, hkv:])

    # -- buffers ----------------------------------------------------------------------------------

    def _to_heads(self, send: torch.Tensor) -> Exchange:
        """``send`` [a, n_own, w, D] -> payloads per message (a run of slot ``y``), receive buffer [n_b, w, D]
        in head-buffer order (the own slot's runs copied in place)."""
        recv = send.new_empty((self.block, *send.shape[2:]))
        mine = send[self.lane]
        for o, r, c in self.own_runs:
            recv[r:r + c].copy_(mine[o:o + c])
        return Exchange(payloads={i: send[y, o0:o1].view(-1) for i, y, o0, o1 in self.heads_send},
                        into={i: recv[r0:r1].view(-1) for i, r0, r1 in self.heads_recv}, recv=recv)

    def _to_tokens(self, send: torch.Tensor) -> Exchange:
        """``send`` [n_b, w, D] (head-buffer order) -> payloads per message (a run of a lane's rows), receive
        buffer [a, n_own, w, D] (the own runs copied into slot ``lane``)."""
        recv = send.new_empty((self.a2a, self.own, *send.shape[1:]))
        mine = recv[self.lane]
        for o, r, c in self.own_runs:
            mine[o:o + c].copy_(send[r:r + c])
        return Exchange(payloads={i: send[r0:r1].view(-1) for i, r0, r1 in self.tokens_send},
                        into={i: recv[y, o0:o1].view(-1) for i, y, o0, o1 in self.tokens_recv}, recv=recv)


def grads_wire_dtype(index: HeadIndex, dtype: torch.dtype, acc: torch.dtype) -> torch.dtype:
    """The dtype a ring of several blocks sends its dq, dk, dv home in (the backward ``tokens`` all-to-all):
    the model's ``dtype`` when every K/V head is in one lane (``kv_pick`` None): each gradient element then
    comes from one lane and is cast once, on the sender instead of at home (the same values, half the bytes
    on the wire for bf16); the accumulator dtype ``acc`` when lanes share K/V heads
    (:func:`~zeppelin_megatron.planner.head_parallel.lanes_share_kv`, the rule the planner and the simulator
    charge by: their dK/dV are summed at home first, :meth:`HeadIndex.tokens_grads`). Example: bf16, Hkv = 8,
    ``a2a = 4``: bf16; ``a2a = 16``: float32."""
    return acc if lanes_share_kv(index.shape.hkv, index.a2a) else dtype


def head_index(program: RankProgram, part: RingPart, shape: HeadShape, device: torch.device) -> HeadIndex:
    """The :class:`HeadIndex` of member ``part`` of a head-parallel ring (``part.a2a > 1``).

    Example: one sequence of 16 over ranks (0, 1, 2, 3), ``a2a = 2``, rank 1 (block 0, lane 1): lane 0's
    runs are ``(0, 0, 2)`` and ``(2, 6, 2)`` (own tokens 0-1 at head rows 0-1, 2-3 at rows 6-7), lane 1's
    one run ``(0, 2, 4)``; so rank 1 receives two ``heads`` messages from rank 0 (into rows ``[0, 2)`` and
    ``[6, 8)``) and sends rank 0 its output rows ``[0, 2)`` and ``[6, 8)`` in two ``tokens`` messages.
    """
    a, b, lane = part.a2a, part.position, part.lane
    assert b is not None and lane is not None and a > 1, "head_index needs a member of a head-parallel ring"
    hq, hkv, d = shape
    heads = [lane_heads(hq, hkv, a, x) for x in range(a)]
    hq_l, hkv_l = hq // a, lane_kv_heads(hkv, a)
    runs = [part.lane_runs(x) for x in range(a)]
    counts = tuple(sum(c for _, _, c in rs) for rs in runs)
    as_t = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    pick = [h for _, (k0, k1) in heads for h in range(k0, k1)]
    lane_of = {r: i % a for i, r in enumerate(part.ranks)}
    me = part.ranks[b * a + lane]

    Sent = list[tuple[int, int, tuple[int, int, int]]]

    def messages(kind: str) -> tuple[Sent, Sent]:
        """``(message, other lane, run)`` of the messages this rank sends / receives: the ``k``-th message of a
        pair carries run ``k`` of the lane whose tokens it moves (the sender's in ``heads``, the receiver's in
        ``tokens``; the lowering's order)."""
        msgs = program.transfers[TransferId(part.ring, 0, kind)].messages  # type: ignore[arg-type]
        seen: dict[tuple[int, int], int] = {}
        sent: Sent = []
        got: Sent = []
        for i, m in enumerate(msgs):
            if me not in (m.src, m.dst):
                continue
            k = seen[(m.src, m.dst)] = seen.get((m.src, m.dst), -1) + 1
            run = runs[lane_of[m.src] if kind == "heads" else lane_of[m.dst]][k]
            assert run[2] == m.tokens, (kind, i, run, m.tokens)
            (sent if m.src == me else got).append((i, lane_of[m.dst if m.src == me else m.src], run))
        return sent, got

    (hs, hr), (ts, tr) = messages("heads"), messages("tokens")
    return HeadIndex(
        ring=part.ring, a2a=a, lane=lane, hq_l=hq_l, hkv_l=hkv_l, shape=shape, rows=as_t(part.rows), span=part.span,
        counts=counts, blocks=part.size, own_runs=runs[lane],
        kv_cols=tuple(as_t([*range(k0, k1), *range(hkv + k0, hkv + k1)]) for _, (k0, k1) in heads),
        kv_ranges=tuple(kr for _, kr in heads),
        kv_pick=None if pick == list(range(hkv)) else as_t(pick),
        heads_send=tuple((i, y, o, o + c) for i, y, (o, _, c) in hs),
        heads_recv=tuple((i, r, r + c) for i, _, (_, r, c) in hr),
        tokens_send=tuple((i, r, r + c) for i, _, (_, r, c) in ts),
        tokens_recv=tuple((i, y, o, o + c) for i, y, (o, _, c) in tr))
