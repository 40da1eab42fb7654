"""The attention engine: executes one rank's lowered program on attention-layout tensors.

Input/output are this rank's tokens in the plan's *attention layout*
(``attention_layout[rank]`` ranges concatenated): ``q`` [T_a, Hq, D], ``k``,
``v`` [T_a, Hkv, D] -> ``out`` [T_a, Hq, D].

The program (:func:`zeppelin_megatron.planner.lowering.lower_rank`) says
everything about order: rings in :attr:`StepPlan.rings` order, each ring's
steps, which rows each kernel call reads, the local calls in the plan's
``local_slots`` (after a step's kernel, before its wait, so they run while
the step's K/V transfer is in flight; a head-parallel ring's step ``-1`` slot
between ``Post`` and ``Wait`` of its ``heads`` all-to-all, in flight meanwhile:
``Post`` hands every hop to ``batch_isend_irecv`` before the call) and after
the rings, and every
transfer's peers, tags and relays. The engine walks
:attr:`RankProgram.forward` / :attr:`RankProgram.backward` op by op:

* ``Post``: start the transfer (:class:`~.router.Router`) with what the rank
  holds of the ring (its K/V; in backward for ``acc`` transfers the dK/dV
  accumulator after adding the step's block; relays send nothing of their own);
* ``Wait``: finish it; a member now holds the received K/V (or accumulator;
  after the ring's last accumulator hop, its own dK/dV);
* ``RingCall``: one kernel call (:mod:`.ring`); ``LocalCall``: one causal call
  over whole local sequences. Each call's ``(out, lse)`` is saved for backward.

Head-parallel rings (``a2a > 1``): ``Post``/``Wait`` of the ring's ``heads`` all-to-all
move the rank's q, k, v rows (backward: dout) to its block's lanes and leave the
rank's head buffer (:mod:`.heads`); the ring's calls and K/V / accumulator transfers
then run on it with the lane's heads; ``Post``/``Wait`` of ``tokens`` bring the
output (backward: dq, dk, dv in the accumulation dtype) back to the rank's own rows.
Each transfer's size per token depends on its kind and direction
(:func:`~.heads.transfer_unit`).

Rows. A ring's rows (:attr:`~zeppelin_megatron.planner.lowering.RingPart.rows`) and a local chunk's
(:attr:`~zeppelin_megatron.planner.lowering.LocalChunk.rows`) that are one contiguous range of the
attention buffer (``plan_step`` writes every layout so: :func:`~zeppelin_megatron.planner.api.engine_order`)
are read as ``narrow`` views (no gather) and written as slice copies, casting in the copy (no ``.to``
copy first); other rows (plans from JSON or other tools) are gathered with ``index_select`` and written
with ``index_copy_``. Which path a ring or chunk takes is decided once per plan (:class:`DeviceProgram`
``spans``, ``local_spans``). The ring's packed K/V send buffer is a copy on both paths (:func:`_ring_kv`).

Every rank walks the rings in the same global order and posts each ring's
transfers in the same order, so any valid plan executes without deadlock,
including ranks that belong to several rings. Programs and device index
tensors are built once per plan and head shape (not per layer).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..planner.lowering import LocalCall, Post, RankProgram, RingCall, Transfer, TransferId, Wait, lower_rank
from ..planner.plan import StepPlan
from ..planner.routing import Route
from .comm import CommStream
from .group import ZeppelinGroup
from .heads import Exchange, HeadIndex, HeadShape, head_index, heads_problem, transfer_unit
from .kernels import AttentionKernel, VarlenBatch, acc_dtype
from .ring import RingGrad, RingState, StepIndex, add_block, backward_step, finish, forward_step
from .router import InFlight, Router, rank_rounds

__all__ = ["DeviceProgram", "device_program", "cached_program", "AttentionEngine", "EngineFunction"]

# plan -> {(rank, routed): RankProgram}; programs are pure functions of these.
_PROGRAMS: "weakref.WeakKeyDictionary[StepPlan, dict[tuple[int, bool], RankProgram]]" = weakref.WeakKeyDictionary()


def cached_program(plan: StepPlan, rank: int, routed: bool) -> RankProgram:
    """:func:`~zeppelin_megatron.planner.lowering.lower_rank`, memoised per plan object."""
    per_plan = _PROGRAMS.setdefault(plan, {})
    hit = per_plan.get((rank, routed))
    if hit is None:
        hit = per_plan[(rank, routed)] = lower_rank(plan, rank, routing=routed)
    return hit


@dataclass(frozen=True, kw_only=True)
class Wire:
    """A transfer as this rank runs it for ``unit`` elements per token (:func:`~.heads.transfer_unit`):
    its hops per round, every message's ``(src, dst)`` and element count."""

    rounds: tuple[tuple[Any, ...], ...]
    ends: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]
    unit: int


@dataclass(frozen=True, kw_only=True)
class DeviceProgram:
    """A program's index tensors on one device: ``rows[ring]`` (the rank's ring rows in its attention
    buffer), ``steps[(ring, step)]``, ``local[chunk]`` ``(rows, batch)``, ``heads[ring]`` (head-parallel
    rings, :class:`~.heads.HeadIndex`), and ``wires[(transfer id, backward)]`` (the ``heads`` and
    ``tokens`` all-to-alls carry other tensors forward and backward, so other sizes). ``spans[ring]`` /
    ``local_spans[chunk]``: ``(start, end)`` when those rows are ``range(start, end)``
    (``RingPart.span``, ``LocalChunk.span`` of :mod:`~zeppelin_megatron.planner.lowering_parts`; views and
    slices), else None (gathers). ``linear_local[chunk]``: ``(rows, span)`` of an in-place chunk
    (``LocalChunk.linear_rows``) in the rank's linear buffers."""

    program: RankProgram
    shape: HeadShape
    rows: dict[int, torch.Tensor]
    steps: dict[tuple[int, int], StepIndex]
    local: tuple[tuple[torch.Tensor, VarlenBatch], ...]
    spans: dict[int, tuple[int, int] | None]
    local_spans: tuple[tuple[int, int] | None, ...]
    heads: dict[int, HeadIndex]
    wires: dict[tuple[TransferId, bool], Wire]
    linear_local: dict[int, tuple[torch.Tensor, tuple[int, int] | None]]


_DEVICE: "weakref.WeakKeyDictionary[StepPlan, dict[tuple[int, bool, HeadShape, torch.device], DeviceProgram]]" = (
    weakref.WeakKeyDictionary()
)


def _wire(t: Transfer, rank: int, unit: int) -> Wire:
    return Wire(rounds=rank_rounds(t.hops(unit), rank), ends=tuple((m.src, m.dst) for m in t.messages),
                sizes=tuple(m.tokens * unit for m in t.messages), unit=unit)


def device_program(plan: StepPlan, rank: int, routed: bool, shape: HeadShape, device: torch.device) -> DeviceProgram:
    """Rank ``rank``'s program with its index tensors on ``device`` and its transfers for inputs of
    ``shape`` (heads, head dim), built once per plan (every layer of a step shares it). Raises
    ``ValueError`` (:func:`~.heads.heads_problem`) when a head-parallel ring's lanes cannot split the heads."""
    per_plan = _DEVICE.setdefault(plan, {})
    key = (rank, routed, shape, device)
    hit = per_plan.get(key)
    if hit is not None:
        return hit
    why = heads_problem(plan, shape.hq, shape.hkv)
    if why is not None:
        raise ValueError(why)
    program = cached_program(plan, rank, routed)
    as_t = lambda rows: torch.tensor(rows, dtype=torch.long, device=device)  # noqa: E731
    rows = {p.ring: as_t(p.rows) for p in program.rings if p.position is not None}
    spans = {p.ring: p.span for p in program.rings if p.position is not None}
    steps: dict[tuple[int, int], StepIndex] = {}
    shared: dict[tuple[int, ...], torch.Tensor] = {}  # one tensor per distinct row list (e.g. the late rows)

    def index(r: tuple[int, ...]) -> torch.Tensor:
        if r not in shared:
            shared[r] = as_t(r)
        return shared[r]

    for op in program.forward:
        if isinstance(op, RingCall):
            steps[(op.ring, op.step)] = StepIndex(
                batch=VarlenBatch(lens_q=op.lens_q, lens_k=op.lens_k, causal=op.causal, device=device),
                q_index=None if op.q_all else index(op.q_rows), kv_index=None if op.kv_all else index(op.kv_rows))
    local = tuple((as_t(c.rows), VarlenBatch(lens_q=c.lens, lens_k=c.lens, causal=True, device=device))
                  for c in program.local_chunks)
    local_spans = tuple(c.span for c in program.local_chunks)
    linear_local = {i: (as_t([r for a, b in c.linear_rows for r in range(a, b)]), c.linear_span)
                    for i, c in enumerate(program.local_chunks) if c.linear_rows is not None}
    heads = {p.ring: head_index(program, p, shape, device) for p in program.rings
             if p.a2a > 1 and p.position is not None}
    a2a = {p.ring: p.a2a for p in program.rings}
    made: dict[tuple[TransferId, int], Wire] = {}
    wires: dict[tuple[TransferId, bool], Wire] = {}
    for backward, ops in ((False, program.forward), (True, program.backward)):
        for op in ops:
            if isinstance(op, Post):
                tid = op.transfer
                unit = transfer_unit(tid.kind, backward, a2a[tid.ring], shape)
                if (tid, unit) not in made:
                    made[(tid, unit)] = _wire(program.transfers[tid], rank, unit)
                wires[(tid, backward)] = made[(tid, unit)]
    hit = per_plan[key] = DeviceProgram(program=program, shape=shape, rows=rows, steps=steps, local=local,
                                        heads=heads, wires=wires, spans=spans, local_spans=local_spans,
                                        linear_local=linear_local)
    return hit


_WHAT = {"kv": "K/V", "acc": "dK/dV", "heads": "all-to-all to heads", "tokens": "all-to-all to tokens"}


def _take(t: torch.Tensor, rows: torch.Tensor, span: tuple[int, int] | None) -> torch.Tensor:
    """``t``'s rows: a ``narrow`` view when they are ``range(*span)``, else an ``index_select`` gather."""
    return t.index_select(0, rows) if span is None else t.narrow(0, span[0], span[1] - span[0])


def _put(dst: torch.Tensor, rows: torch.Tensor, span: tuple[int, int] | None, src: torch.Tensor) -> None:
    """Write ``src`` (any float dtype) into ``dst``'s rows: one slice ``copy_`` casting on the way when they
    are ``range(*span)``, else ``.to(dst.dtype)`` (a copy when the dtypes differ) and ``index_copy_``."""
    if span is None:
        dst.index_copy_(0, rows, src.to(dst.dtype))
    else:
        dst[span[0]:span[1]].copy_(src)


def _ring_kv(k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, span: tuple[int, int] | None = None) -> torch.Tensor:
    """The packed ring K/V buffer [n, 2*Hkv, D] of ``k``, ``v`` [T_a, Hkv, D] at ``rows`` [n]: one
    ``index_select`` per half straight into its slice (no ``cat``); rows ``range(*span)``: one slice
    ``copy_`` per half (the same bytes: the buffer is what the ring sends, so it is a copy either way)."""
    hkv = k.shape[1]
    kv = k.new_empty((rows.shape[0], 2 * hkv, *k.shape[2:]))
    if span is None:
        torch.index_select(k, 0, rows, out=kv[:, :hkv])
        torch.index_select(v, 0, rows, out=kv[:, hkv:])
    else:
        kv[:, :hkv].copy_(k[span[0]:span[1]])
        kv[:, hkv:].copy_(v[span[0]:span[1]])
    return kv


class AttentionEngine:
    """Executes a :class:`RankProgram` forward and backward with one kernel backend.

    ``routes``: the plan's routes to use (``plan.routing``, or empty: every hop direct). ``hq``: query
    heads per rank; given, the device program is built (and the heads checked against the plan's
    head-parallel rings, ``ValueError`` naming the ring, its width and the heads) here, before any
    work; None: at the first :meth:`forward`, from ``q``.
    """

    def __init__(
        self,
        plan: StepPlan,
        group: ZeppelinGroup,
        *,
        kernel: AttentionKernel,
        scale: float,
        routes: Sequence[Route],
        hkv: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        hq: int | None = None,
    ) -> None:
        if routes and tuple(routes) != plan.routing:
            raise ValueError("routes must be the plan's own routes (plan.routing) or empty")
        self.plan, self.group, self.kernel, self.scale = plan, group, kernel, scale
        self.hkv, self.head_dim, self.dtype, self.device = hkv, head_dim, dtype, device
        self.stream = CommStream(device)
        self.router = Router(group, stream=self.stream)
        self.routed = bool(routes)
        self.program = cached_program(plan, group.rank, self.routed)
        self._parts = {p.ring: p for p in self.program.rings}
        self._dev: DeviceProgram | None = None
        if hq is not None:
            self._dev = device_program(plan, group.rank, self.routed, HeadShape(hq, hkv, head_dim), device)

    @property
    def dev(self) -> DeviceProgram:
        """The device program (built at construction when ``hq`` was given, else by :meth:`forward`)."""
        if self._dev is None:
            raise RuntimeError("the engine was built without hq and has not run forward yet")
        return self._dev

    def _device(self, hq: int) -> DeviceProgram:
        if self._dev is None or self._dev.shape.hq != hq:
            self._dev = device_program(self.plan, self.group.rank, self.routed,
                                       HeadShape(hq, self.hkv, self.head_dim), self.device)
        return self._dev

    def local_forward(self, chunk: int, qkv: Sequence[torch.Tensor] | None, out: torch.Tensor | None,
                      linear: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Local chunk ``chunk``'s causal call -> its ``(out, lse)``: on its attention rows of ``qkv`` = ``(q,
        k, v)``, written into ``out``; an in-place chunk (``dev.linear_local``) with ``linear`` = ``(q_l, k_l,
        v_l, out_l)`` on its linear rows instead (views when they are one range), written into ``out_l``
        (``qkv`` and ``out`` unused then: a remap window runs before the attention buffers exist)."""
        dev = self.dev
        (rows, batch), span = dev.local[chunk], dev.local_spans[chunk]
        if linear is not None and chunk in dev.linear_local:  # in place, on the linear rows
            (rows, span), qkv, out = dev.linear_local[chunk], linear[:3], linear[3]
        assert qkv is not None and out is not None
        o, lse = self.kernel.forward(*(_take(x, rows, span).contiguous() for x in qkv), batch, self.scale)
        _put(out, rows, span, o)
        return o, lse

    def local_backward(self, chunk: int, saved: tuple[torch.Tensor, torch.Tensor], dout: torch.Tensor | None,
                       qkv: Sequence[torch.Tensor], grads: Sequence[torch.Tensor] | None,
                       linear: Sequence[torch.Tensor] | None = None) -> None:
        """The backward of :meth:`local_forward` (``saved``: its ``(out, lse)``): ``dout`` and ``grads`` =
        ``(dq, dk, dv)`` at the chunk's attention rows; an in-place chunk with ``linear`` = ``(dout_l, dq_l,
        dk_l, dv_l)`` reads dout and writes its gradients at its linear rows instead (``dout`` and ``grads``
        unused then). q, k, v always come from the attention rows of ``qkv``: the remap in gathered them, so
        the caller's linear q/k/v need not be kept until backward."""
        dev = self.dev
        (rows, batch), span = dev.local[chunk], dev.local_spans[chunk]
        q, k, v = (_take(x, rows, span).contiguous() for x in qkv)
        if linear is not None and chunk in dev.linear_local:  # in place: dout and grads on the linear rows
            (rows, span), dout, grads = dev.linear_local[chunk], linear[0], linear[1:]
        assert dout is not None and grads is not None
        parts = self.kernel.backward(_take(dout, rows, span).contiguous(), q, k, v, *saved, batch, self.scale)
        for acc, part in zip(grads, parts):
            _put(acc, rows, span, part)

    def _start(self, tid: TransferId, backward: bool, payloads: dict[int, torch.Tensor], dtype: torch.dtype,
               into: dict[int, torch.Tensor] | None = None) -> InFlight:
        w = self.dev.wires[(tid, backward)]
        what = f"ring {tid.ring} step {tid.step} {_WHAT[tid.kind]}"
        return self.router.start(w.rounds, w.ends, w.sizes, payloads, dtype=dtype, device=self.device, what=what,
                                 into=into)

    def _send_all(self, tid: TransferId, backward: bool, payload: torch.Tensor | None) -> dict[int, torch.Tensor]:
        """``payload`` (what a ring member holds) for every message of ``tid`` this rank sends."""
        if payload is None:
            return {}
        flat = payload.reshape(-1)
        ends = self.dev.wires[(tid, backward)].ends
        return {i: flat for i, (src, _) in enumerate(ends) if src == self.group.rank}

    def _received(self, tid: TransferId, backward: bool, got: dict[int, torch.Tensor]) -> torch.Tensor | None:
        """The one message of a ring transfer this member receives, as [n, 2*Hkv_l, D]; None for relays."""
        if not got:
            return None
        (i, flat), = got.items()
        w = self.dev.wires[(tid, backward)]
        return flat.view(w.sizes[i] // w.unit, w.unit // self.head_dim, self.head_dim)

    def _hkv(self, ring: int) -> int:
        """K/V heads of ring ``ring``'s packed buffers: ``Hkv``, or the lane's on a head-parallel ring."""
        hx = self.dev.heads.get(ring)
        return self.hkv if hx is None else hx.hkv_l

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                linear: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[Any, Any]]:
        """-> ``(out [T_a, Hq, D], saved)``; ``saved``: each member ring's and local chunk's ``(out, lse)``
        (head-parallel rings: in their head buffer, with its ``(q_h, kv_h)`` under ``("heads", ring)``; a ring
        with contiguous rows: a view of ``out``, whose version is saved under ``"out_version"``: backward
        raises ``RuntimeError`` when ``out`` was modified in place since). ``linear``: ``(q_l, k_l, v_l,
        out_l)`` in the linear layout: the in-place chunks' calls (``dev.linear_local``) read and write there
        (views when their linear rows are one range) and leave their attention rows alone (:mod:`.overlap`)."""
        dev = self._device(q.shape[1])
        out = torch.zeros_like(q)
        saved: dict[Any, Any] = {}
        state: dict[int, RingState] = {}
        flying: dict[TransferId, InFlight] = {}
        exchanges: dict[TransferId, Exchange] = {}

        def ring_state(ring: int) -> RingState | None:  # plain rings: from the attention buffer
            s = state.get(ring)
            if s is None and ring in dev.rows and ring not in dev.heads:
                rows, span = dev.rows[ring], dev.spans[ring]
                s = state[ring] = RingState(q=_take(q, rows, span), kv=_ring_kv(k, v, rows, span))
            return s

        for op in self.program.forward:
            if isinstance(op, RingCall):
                s = ring_state(op.ring)
                assert s is not None
                forward_step(self.kernel, self.scale, self._hkv(op.ring), dev.steps[(op.ring, op.step)], s)
                if op.step == self._parts[op.ring].size - 1:
                    finish(s)
                    assert s.out is not None and s.lse is not None
                    span = dev.spans.get(op.ring)
                    if op.ring in dev.heads:  # head-parallel: out goes home in the tokens exchange
                        res = s.out.to(q.dtype)
                    elif span is None:
                        res = s.out.to(q.dtype)
                        out.index_copy_(0, dev.rows[op.ring], res)
                    else:  # cast straight into out's slice; backward reads it there (out is not changed after)
                        res = out[span[0]:span[1]]
                        res.copy_(s.out)
                        saved[("out_view", op.ring)] = True
                    saved[("ring", op.ring)] = (res, s.lse)
            elif isinstance(op, LocalCall):
                saved[("local", op.chunk)] = self.local_forward(op.chunk, (q, k, v), out, linear)
            elif isinstance(op, Post):
                t = op.transfer
                hx = dev.heads.get(t.ring)
                if t.kind == "heads" and hx is not None:
                    ex = exchanges[t] = hx.qkv_to_heads(q, k, v)
                    flying[t] = self._start(t, False, ex.payloads, self.dtype, ex.into)
                elif t.kind == "tokens" and hx is not None:
                    ex = exchanges[t] = hx.out_to_tokens(saved[("ring", t.ring)][0])
                    flying[t] = self._start(t, False, ex.payloads, self.dtype, ex.into)
                else:
                    s = ring_state(t.ring)
                    flying[t] = self._start(t, False, self._send_all(t, False, s.kv if s else None), self.dtype)
            else:
                assert isinstance(op, Wait)
                t = op.transfer
                got = flying.pop(t).wait()
                hx = dev.heads.get(t.ring)
                if t.kind == "heads" and hx is not None:
                    q_h, kv_h = hx.heads_qkv(exchanges.pop(t))
                    state[t.ring] = RingState(q=q_h, kv=kv_h)
                    saved[("heads", t.ring)] = (q_h, kv_h)
                elif t.kind == "tokens" and hx is not None:
                    hx.tokens_out(exchanges.pop(t), out)
                else:
                    kv = self._received(t, False, got)
                    if kv is not None:
                        state[t.ring].kv = kv
        saved["out_version"] = out._version  # ring outputs saved as views of out: backward checks they are unchanged
        return out, saved

    def backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, saved: dict[Any, Any],
        linear: Sequence[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> ``(dq, dk, dv)`` in the attention layout. ``linear``: ``(dout_l, dq_l, dk_l, dv_l)`` in the linear
        layout: the in-place chunks' calls read the output gradient there and write their dq/dk/dv there; their
        q/k/v come from the attention buffers ``q``, ``k``, ``v`` (the remap in filled those rows, so the caller's
        linear q/k/v need not be kept until backward)."""
        dev = self._device(q.shape[1])
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        acc_t = acc_dtype(self.dtype)
        state: dict[int, RingGrad] = {}
        flying: dict[TransferId, InFlight] = {}
        exchanges: dict[TransferId, Exchange] = {}

        def grad_state(ring: int, q_r: torch.Tensor, kv: torch.Tensor, dout_r: torch.Tensor) -> RingGrad:
            out_r, lse_r = saved[("ring", ring)]
            if ("out_view", ring) in saved and out_r._version != saved["out_version"]:
                raise RuntimeError(f"ring {ring}: the attention output was modified in place after forward; the "
                                   "engine's backward reads it (a ring's output is saved as a view of it)")
            s = state[ring] = RingGrad(dout=dout_r, q=q_r, out=out_r, lse=lse_r, kv=kv,
                                       dq=torch.zeros(q_r.shape, dtype=acc_t, device=q.device))
            return s

        def ring_state(ring: int) -> RingGrad | None:  # plain rings: from the attention buffer
            s = state.get(ring)
            if s is None and ring in dev.rows and ring not in dev.heads:
                rows, span = dev.rows[ring], dev.spans[ring]
                s = grad_state(ring, _take(q, rows, span), _ring_kv(k, v, rows, span), _take(dout, rows, span))
            return s

        for op in self.program.backward:
            if isinstance(op, RingCall):
                s = ring_state(op.ring)
                assert s is not None
                backward_step(self.kernel, self.scale, self._hkv(op.ring), dev.steps[(op.ring, op.step)], s)
            elif isinstance(op, LocalCall):
                self.local_backward(op.chunk, saved[("local", op.chunk)], dout, (q, k, v), (dq, dk, dv), linear)
            elif isinstance(op, Post):
                t = op.transfer
                hx = dev.heads.get(t.ring)
                if t.kind == "heads" and hx is not None:
                    ex = exchanges[t] = hx.dout_to_heads(dout)
                    flying[t] = self._start(t, True, ex.payloads, self.dtype, ex.into)
                elif t.kind == "tokens" and hx is not None:
                    s = state[t.ring]
                    home = s.acc if self._parts[t.ring].size > 1 else add_block(s)  # one block: dK/dV are home
                    assert home is not None
                    ex = exchanges[t] = hx.grads_to_tokens(s.dq, home)
                    flying[t] = self._start(t, True, ex.payloads, acc_t, ex.into)
                else:
                    s = ring_state(t.ring)
                    if s is None:
                        payload, dtype = None, (self.dtype if t.kind == "kv" else acc_t)
                    elif t.kind == "kv":
                        payload, dtype = s.kv, self.dtype
                    else:
                        payload, dtype = add_block(s), acc_t
                    flying[t] = self._start(t, True, self._send_all(t, True, payload), dtype)
            else:
                assert isinstance(op, Wait)
                t = op.transfer
                got = flying.pop(t).wait()
                hx = dev.heads.get(t.ring)
                if t.kind == "heads" and hx is not None:
                    q_h, kv_h = saved[("heads", t.ring)]
                    grad_state(t.ring, q_h, kv_h, hx.heads_dout(exchanges.pop(t)))
                    continue
                if t.kind == "tokens" and hx is not None:
                    hx.tokens_grads(exchanges.pop(t), dq, dk, dv)
                    continue
                recv = self._received(t, True, got)
                s = state.get(t.ring)
                if recv is None or s is None:
                    continue
                if t.kind == "kv":
                    s.kv = recv
                    continue
                s.acc = recv
                if t.step == self._parts[t.ring].size - 1 and hx is None:  # own dK/dV, home after g hops
                    rows, span, hkv = dev.rows[t.ring], dev.spans[t.ring], self.hkv
                    _put(dq, rows, span, s.dq)
                    _put(dk, rows, span, recv[:, :hkv])
                    _put(dv, rows, span, recv[:, hkv:])
        return dq, dk, dv


class EngineFunction(torch.autograd.Function):
    """Autograd wrapper: ``(q, k, v)`` in attention layout -> ``out``; backward through the engine."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, engine: AttentionEngine) -> torch.Tensor:
        out, saved = engine.forward(q, k, v)
        ctx.engine = engine
        ctx.saved = saved
        ctx.save_for_backward(q, k, v)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v = ctx.saved_tensors
        dq, dk, dv = ctx.engine.backward(dout.contiguous(), q, k, v, ctx.saved)
        ctx.saved = None
        return dq, dk, dv, None
