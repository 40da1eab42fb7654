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
output (backward: dq, dk, dv in the accumulation dtype) back to the rank's own rows. A ring of one
block (Ulysses) is one kernel call on the head buffer (:meth:`AttentionEngine.ulysses_forward` /
``ulysses_backward``): nothing to merge or accumulate, so its out, dq, dk, dv stay in the kernel's dtype.
Each transfer's size per token depends on its kind and direction
(:func:`~.heads.transfer_unit`).

Rows. A ring's rows (:attr:`~zeppelin_megatron.planner.lowering.RingPart.rows`) and a local chunk's
(:attr:`~zeppelin_megatron.planner.lowering.LocalChunk.rows`) that are one contiguous range of the
attention buffer (``plan_step`` writes every layout so: :func:`~zeppelin_megatron.planner.api.engine_order`)
are read as ``narrow`` views (no gather) and written as slice copies, casting in the copy (no ``.to``
copy first); other rows (plans from JSON or other tools) are gathered with ``index_select`` and written
with ``index_copy_``. Which path a ring or chunk takes is decided once per plan (:class:`DeviceProgram`
``spans``, ``local_spans``). The ring's packed K/V send buffer is a copy on both paths (:func:`_ring_kv`).
A rank whose whole program is one local call over its whole buffer (no ring, no remap window:
:attr:`~zeppelin_megatron.planner.lowering.RankProgram.whole_chunk`, e.g. a packed plan's ranks without a
ring) calls the kernel on ``q``, ``k``, ``v`` themselves and returns the kernel's output and gradients as
its own: no zero fill, no gathers, no copies (:meth:`AttentionEngine._whole_forward`).

Every rank walks the rings in the same global order and posts each ring's
transfers in the same order, so any valid plan executes without deadlock,
including ranks that belong to several rings. Programs and device index
tensors are built once per plan and head shape (not per layer).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..planner.lowering import LocalCall, Post, RingCall, TransferId, Wait
from ..planner.plan import StepPlan
from ..planner.routing import Route
from .comm import CommStream
from .device_program import DeviceProgram, cached_program, device_program
from .group import ZeppelinGroup
from .heads import Exchange, HeadShape, grads_wire_dtype
from .kernels import AttentionKernel, acc_dtype
from .ring import RingGrad, RingState, StepIndex, add_block, backward_step, finish, forward_step
from .router import InFlight, Router
from .rows import put, take

__all__ = ["DeviceProgram", "device_program", "cached_program", "AttentionEngine", "EngineFunction"]

_WHAT = {"kv": "K/V", "acc": "dK/dV", "heads": "all-to-all to heads", "tokens": "all-to-all to tokens"}


def _ring_kv(k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, span: tuple[int, int] | None = None) -> torch.Tensor:
    """The packed ring K/V buffer [2, n, Hkv, D] (K, then V) of ``k``, ``v`` [T_a, Hkv, D] at ``rows`` [n]: one
    ``index_select`` per half straight into it (no ``cat``); rows ``range(*span)``: one slice ``copy_`` per
    half (the same bytes: the buffer is what the ring sends, so it is a copy either way)."""
    kv = k.new_empty((2, rows.shape[0], *k.shape[1:]))
    if span is None:
        torch.index_select(k, 0, rows, out=kv[0])
        torch.index_select(v, 0, rows, out=kv[1])
    else:
        kv[0].copy_(k[span[0]:span[1]])
        kv[1].copy_(v[span[0]:span[1]])
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
        # one-block head-parallel rings (Ulysses): one kernel call on the head buffer, nothing to merge or
        # accumulate, so no accumulator dtype: out, dq, dk, dv stay in the kernel's dtype (ulysses_*)
        self._ulysses = {p.ring for p in self.program.rings if p.a2a > 1 and p.size == 1 and p.position is not None}
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
        o, lse = self.kernel.forward(*(take(x, rows, span).contiguous() for x in qkv), batch, self.scale)
        put(out, rows, span, o)
        return o, lse

    def _whole_forward(self, chunk: int, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor) -> tuple[torch.Tensor, dict[Any, Any]]:
        """The rank's one local chunk over its whole buffer (:attr:`~zeppelin_megatron.planner.lowering.RankProgram.
        whole_chunk`): one kernel call on ``q``, ``k``, ``v`` themselves, whose output is the rank's ``out`` (no zero
        fill, no row gathers, no copy into ``out``). The output is saved for backward as it is returned, so backward
        raises ``RuntimeError`` when it was modified in place since (as for a ring's output view)."""
        _, batch = self.dev.local[chunk]
        o, lse = self.kernel.forward(q.contiguous(), k.contiguous(), v.contiguous(), batch, self.scale)
        if o.dtype != q.dtype:
            o = o.to(q.dtype)
        return o, {("local", chunk): (o, lse), ("whole", chunk): o._version}

    def _whole_backward(self, chunk: int, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        saved: dict[Any, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The backward of :meth:`_whole_forward`: one kernel call, its ``dq``, ``dk``, ``dv`` returned as they are
        (cast to the inputs' dtypes where the kernel's differ)."""
        o, lse = saved[("local", chunk)]
        if o._version != saved[("whole", chunk)]:
            raise RuntimeError("the attention output was modified in place after forward; the engine's backward "
                               "reads it (a rank's whole local call returns the kernel's output itself)")
        _, batch = self.dev.local[chunk]
        grads = self.kernel.backward(dout.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), o, lse,
                                     batch, self.scale)
        dq, dk, dv = (g if g.dtype == x.dtype else g.to(x.dtype) for g, x in zip(grads, (q, k, v)))
        return dq, dk, dv

    def ulysses_forward(self, s: RingState, step: StepIndex) -> tuple[torch.Tensor, torch.Tensor]:
        """A one-block head-parallel ring's one call on its head buffer (``s.q`` [n_b, hq_l, D], ``s.kv``
        [2, n_b, hkv_l, D]) -> the kernel's ``(out, lse)``, kept as they are: ``out`` in the model dtype goes
        home in the ``tokens`` all-to-all; no running result to merge, so no accumulator and no casts."""
        return self.kernel.forward(s.q, s.kv[0], s.kv[1], step.batch, self.scale)

    def ulysses_backward(self, saved: dict[Any, Any], ring: int, dout_h: torch.Tensor,
                         step: StepIndex) -> Exchange:
        """The backward of :meth:`ulysses_forward` -> the backward ``tokens`` exchange of its ``(dq_h, dk_h,
        dv_h)`` in the kernel's dtype (one call: its gradients are final, nothing to accumulate). A kernel with
        ``backward_into`` (flash-attn; the reference kernel) writes them straight into the send buffer's
        columns (:meth:`~.heads.HeadIndex.grads_buffer`); another kernel's are copied there once."""
        (q_h, kv_h), (out_h, lse) = saved[("heads", ring)], saved[("ring", ring)]
        hx = self.dev.heads[ring]
        args = (dout_h, q_h, kv_h[0], kv_h[1], out_h, lse, step.batch, self.scale)
        into = getattr(self.kernel, "backward_into", None)
        if into is None:
            return hx.grads_to_tokens(*self.kernel.backward(*args))
        send = hx.grads_buffer(dout_h.dtype, dout_h.device)
        into(*args, *hx.grad_columns(send))
        return hx.grads_send(send)

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
        q, k, v = (take(x, rows, span).contiguous() for x in qkv)
        if linear is not None and chunk in dev.linear_local:  # in place: dout and grads on the linear rows
            (rows, span), dout, grads = dev.linear_local[chunk], linear[0], linear[1:]
        assert dout is not None and grads is not None
        parts = self.kernel.backward(take(dout, rows, span).contiguous(), q, k, v, *saved, batch, self.scale)
        for acc, part in zip(grads, parts):
            put(acc, rows, span, part)

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
        """The one message of a ring transfer this member receives, as [2, n, Hkv_l, D]; None for relays."""
        if not got:
            return None
        (i, flat), = got.items()
        w = self.dev.wires[(tid, backward)]
        return flat.view(2, w.sizes[i] // w.unit, w.unit // (2 * self.head_dim), self.head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                linear: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[Any, Any]]:
        """-> ``(out [T_a, Hq, D], saved)``; ``saved``: each member ring's and local chunk's ``(out, lse)``
        (head-parallel rings: in their head buffer, with its ``(q_h, kv_h)`` under ``("heads", ring)``; a ring
        with contiguous rows: a view of ``out``, whose version is saved under ``"out_version"``: backward
        raises ``RuntimeError`` when ``out`` was modified in place since). ``linear``: ``(q_l, k_l, v_l,
        out_l)`` in the linear layout: the in-place chunks' calls (``dev.linear_local``) read and write there
        (views when their linear rows are one range) and leave their attention rows alone (:mod:`.overlap`)."""
        dev = self._device(q.shape[1])
        if self.program.whole_chunk is not None:
            return self._whole_forward(self.program.whole_chunk, q, k, v)
        out = torch.zeros_like(q)
        saved: dict[Any, Any] = {}
        state: dict[int, RingState] = {}
        flying: dict[TransferId, InFlight] = {}
        exchanges: dict[TransferId, Exchange] = {}

        def ring_state(ring: int) -> RingState | None:  # plain rings: from the attention buffer
            s = state.get(ring)
            if s is None and ring in dev.rows and ring not in dev.heads:
                rows, span = dev.rows[ring], dev.spans[ring]
                s = state[ring] = RingState(q=take(q, rows, span), kv=_ring_kv(k, v, rows, span))
            return s

        for op in self.program.forward:
            if isinstance(op, RingCall) and op.ring in self._ulysses:
                saved[("ring", op.ring)] = self.ulysses_forward(state.pop(op.ring), dev.steps[(op.ring, op.step)])
            elif isinstance(op, RingCall):
                s = ring_state(op.ring)
                assert s is not None
                forward_step(self.kernel, self.scale, dev.steps[(op.ring, op.step)], s)
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
        if self.program.whole_chunk is not None:
            return self._whole_backward(self.program.whole_chunk, dout, q, k, v, saved)
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
                s = grad_state(ring, take(q, rows, span), _ring_kv(k, v, rows, span), take(dout, rows, span))
            return s

        ulysses_dout: dict[int, torch.Tensor] = {}  # one-block rings: dout_h (what arrived), then the exchange
        ulysses_grads: dict[int, Exchange] = {}
        for op in self.program.backward:
            if isinstance(op, RingCall) and op.ring in self._ulysses:
                ulysses_grads[op.ring] = self.ulysses_backward(saved, op.ring, ulysses_dout.pop(op.ring),
                                                               dev.steps[(op.ring, op.step)])
            elif isinstance(op, RingCall):
                s = ring_state(op.ring)
                assert s is not None
                backward_step(self.kernel, self.scale, dev.steps[(op.ring, op.step)], s)
            elif isinstance(op, LocalCall):
                self.local_backward(op.chunk, saved[("local", op.chunk)], dout, (q, k, v), (dq, dk, dv), linear)
            elif isinstance(op, Post):
                t = op.transfer
                hx = dev.heads.get(t.ring)
                if t.kind == "heads" and hx is not None:
                    ex = exchanges[t] = hx.dout_to_heads(dout)
                    flying[t] = self._start(t, True, ex.payloads, self.dtype, ex.into)
                elif t.kind == "tokens" and t.ring in self._ulysses:
                    ex = exchanges[t] = ulysses_grads.pop(t.ring)
                    flying[t] = self._start(t, True, ex.payloads, self.dtype, ex.into)
                elif t.kind == "tokens" and hx is not None:
                    s = state[t.ring]
                    assert s.acc is not None  # after the ring's last accumulator hop: its own dK/dV
                    wire = grads_wire_dtype(hx, self.dtype, acc_t)
                    ex = exchanges[t] = hx.grads_to_tokens(s.dq, s.acc[0], s.acc[1], dtype=wire)
                    flying[t] = self._start(t, True, ex.payloads, wire, ex.into)
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
                if t.kind == "heads" and t.ring in self._ulysses:
                    ulysses_dout[t.ring] = hx.heads_dout(exchanges.pop(t))
                    continue
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
                    rows, span = dev.rows[t.ring], dev.spans[t.ring]
                    put(dq, rows, span, s.dq)
                    put(dk, rows, span, recv[0])
                    put(dv, rows, span, recv[1])
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
