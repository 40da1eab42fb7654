"""The attention engine: executes one rank's lowered program on attention-layout tensors.

Input/output are this rank's tokens in the plan's *attention layout*
(``attention_layout[rank]`` ranges concatenated): ``q`` [T_a, Hq, D], ``k``,
``v`` [T_a, Hkv, D] -> ``out`` [T_a, Hq, D].

The program (:func:`zeppelin_megatron.planner.lowering.lower_rank`) says
everything about order: rings in :attr:`StepPlan.rings` order, each ring's
steps, which rows each kernel call reads, the local calls in the plan's
``local_slots`` (after a step's kernel, before its wait, so they run while
the step's K/V transfer is in flight) and after the rings, and every
transfer's peers, tags and relays. The engine walks
:attr:`RankProgram.forward` / :attr:`RankProgram.backward` op by op:

* ``Post``: start the transfer (:class:`~.router.Router`) with what the rank
  holds of the ring (its K/V; in backward for ``acc`` transfers the dK/dV
  accumulator after adding the step's block; relays send nothing of their own);
* ``Wait``: finish it; a member now holds the received K/V (or accumulator;
  after the ring's last accumulator hop, its own dK/dV);
* ``RingCall``: one kernel call (:mod:`.ring`); ``LocalCall``: one causal call
  over whole local sequences. Each call's ``(out, lse)`` is saved for backward.

Every rank walks the rings in the same global order and posts each ring's
transfers in the same order, so any valid plan executes without deadlock,
including ranks that belong to several rings. Programs and device index
tensors are built once per plan (not per layer).
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
    """A transfer as this rank runs it for ``unit`` elements per token: its hops per round,
    every message's ``(src, dst)`` and element count."""

    rounds: tuple[tuple[Any, ...], ...]
    ends: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class DeviceProgram:
    """A program's index tensors on one device: ``rows[ring]`` (the rank's ring rows in its attention
    buffer), ``steps[(ring, step)]``, ``local[chunk]`` ``(rows, batch)``, and ``wires[transfer id]``."""

    program: RankProgram
    rows: dict[int, torch.Tensor]
    steps: dict[tuple[int, int], StepIndex]
    local: tuple[tuple[torch.Tensor, VarlenBatch], ...]
    wires: dict[TransferId, Wire]


_DEVICE: "weakref.WeakKeyDictionary[StepPlan, dict[tuple[int, bool, int, torch.device], DeviceProgram]]" = (
    weakref.WeakKeyDictionary()
)


def _wire(t: Transfer, rank: int, unit: int) -> Wire:
    return Wire(rounds=rank_rounds(t.hops(unit), rank), ends=tuple((m.src, m.dst) for m in t.messages),
                sizes=tuple(m.tokens * unit for m in t.messages))


def device_program(plan: StepPlan, rank: int, routed: bool, unit: int, device: torch.device) -> DeviceProgram:
    """Rank ``rank``'s program with its index tensors on ``device`` and its transfers for ``unit``
    elements per token, built once per plan (every layer of a step shares it)."""
    per_plan = _DEVICE.setdefault(plan, {})
    key = (rank, routed, unit, device)
    hit = per_plan.get(key)
    if hit is not None:
        return hit
    program = cached_program(plan, rank, routed)
    as_t = lambda rows: torch.tensor(rows, dtype=torch.long, device=device)  # noqa: E731
    rows = {p.ring: as_t(p.rows) for p in program.rings if p.position is not None}
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
    wires = {tid: _wire(t, rank, unit) for tid, t in program.transfers.items()}
    hit = per_plan[key] = DeviceProgram(program=program, rows=rows, steps=steps, local=local, wires=wires)
    return hit


def _ring_kv(k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The packed ring K/V buffer [n, 2*Hkv, D] of ``k``, ``v`` [T_a, Hkv, D] at ``rows`` [n]: one
    ``index_select`` per half straight into its slice (no ``cat``)."""
    hkv = k.shape[1]
    kv = k.new_empty((rows.shape[0], 2 * hkv, *k.shape[2:]))
    torch.index_select(k, 0, rows, out=kv[:, :hkv])
    torch.index_select(v, 0, rows, out=kv[:, hkv:])
    return kv


class AttentionEngine:
    """Executes a :class:`RankProgram` forward and backward with one kernel backend.

    ``routes``: the plan's routes to use (``plan.routing``, or empty: every hop direct).
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
    ) -> None:
        if routes and tuple(routes) != plan.routing:
            raise ValueError("routes must be the plan's own routes (plan.routing) or empty")
        self.group, self.kernel, self.scale = group, kernel, scale
        self.hkv, self.head_dim, self.dtype, self.device = hkv, head_dim, dtype, device
        self.stream = CommStream(device)
        self.router = Router(group, stream=self.stream)
        self.dev = device_program(plan, group.rank, bool(routes), 2 * hkv * head_dim, device)
        self.program = self.dev.program
        self._parts = {p.ring: p for p in self.program.rings}

    def _start(self, tid: TransferId, payload: torch.Tensor | None, dtype: torch.dtype) -> InFlight:
        w = self.dev.wires[tid]
        payloads = {}
        if payload is not None:
            payloads = {i: payload.reshape(-1) for i, (src, _) in enumerate(w.ends) if src == self.group.rank}
        what = f"ring {tid.ring} step {tid.step} {'K/V' if tid.kind == 'kv' else 'dK/dV'}"
        return self.router.start(w.rounds, w.ends, w.sizes, payloads, dtype=dtype, device=self.device, what=what)

    def _received(self, tid: TransferId, got: dict[int, torch.Tensor]) -> torch.Tensor | None:
        """The one message of a ring transfer this member receives, as [n, 2*Hkv, D]; None for relays."""
        if not got:
            return None
        (i, flat), = got.items()
        n = self.dev.wires[tid].sizes[i] // (2 * self.hkv * self.head_dim)
        return flat.view(n, 2 * self.hkv, self.head_dim)

    def _local(self, op: LocalCall) -> tuple[torch.Tensor, VarlenBatch]:
        return self.dev.local[op.chunk]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, dict[Any, Any]]:
        """-> ``(out [T_a, Hq, D], saved)``; ``saved``: each member ring's and local chunk's ``(out, lse)``."""
        out = torch.zeros_like(q)
        saved: dict[Any, Any] = {}
        state: dict[int, RingState] = {}
        flying: dict[TransferId, InFlight] = {}
        for op in self.program.forward:
            if isinstance(op, RingCall):
                s = state.get(op.ring)
                if s is None:
                    rows = self.dev.rows[op.ring]
                    s = state[op.ring] = RingState(
                        q=q.index_select(0, rows), kv=_ring_kv(k, v, rows))
                forward_step(self.kernel, self.scale, self.hkv, self.dev.steps[(op.ring, op.step)], s)
                if op.step == self._parts[op.ring].size - 1:
                    finish(s)
                    assert s.out is not None and s.lse is not None
                    res = s.out.to(q.dtype)
                    out.index_copy_(0, self.dev.rows[op.ring], res)
                    saved[("ring", op.ring)] = (res, s.lse)
            elif isinstance(op, LocalCall):
                rows, batch = self._local(op)
                o, lse = self.kernel.forward(q.index_select(0, rows), k.index_select(0, rows),
                                             v.index_select(0, rows), batch, self.scale)
                out.index_copy_(0, rows, o)
                saved[("local", op.chunk)] = (o, lse)
            elif isinstance(op, Post):
                t = op.transfer
                if t.ring not in state and t.ring in self.dev.rows:
                    rows = self.dev.rows[t.ring]
                    state[t.ring] = RingState(
                        q=q.index_select(0, rows), kv=_ring_kv(k, v, rows))
                held = state[t.ring].kv if t.ring in state else None
                flying[t] = self._start(t, held, self.dtype)
            else:
                assert isinstance(op, Wait)
                got = self._received(op.transfer, flying.pop(op.transfer).wait())
                if got is not None:
                    state[op.transfer.ring].kv = got
        return out, saved

    def backward(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, saved: dict[Any, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        hkv = self.hkv
        acc_t = acc_dtype(self.dtype)
        state: dict[int, RingGrad] = {}
        flying: dict[TransferId, InFlight] = {}

        def ring_state(ring: int) -> RingGrad | None:
            s = state.get(ring)
            if s is None and ring in self.dev.rows:
                rows = self.dev.rows[ring]
                out_r, lse_r = saved[("ring", ring)]
                q_r = q.index_select(0, rows)
                s = state[ring] = RingGrad(
                    dout=dout.index_select(0, rows), q=q_r, out=out_r, lse=lse_r,
                    kv=_ring_kv(k, v, rows),
                    dq=torch.zeros(q_r.shape, dtype=acc_t, device=q.device))
            return s

        for op in self.program.backward:
            if isinstance(op, RingCall):
                s = ring_state(op.ring)
                assert s is not None
                backward_step(self.kernel, self.scale, hkv, self.dev.steps[(op.ring, op.step)], s)
            elif isinstance(op, LocalCall):
                rows, batch = self._local(op)
                o, lse = saved[("local", op.chunk)]
                g = self.kernel.backward(dout.index_select(0, rows), q.index_select(0, rows),
                                         k.index_select(0, rows), v.index_select(0, rows), o, lse, batch, self.scale)
                for acc, part in zip((dq, dk, dv), g):
                    acc.index_copy_(0, rows, part)
            elif isinstance(op, Post):
                t = op.transfer
                s = ring_state(t.ring)
                if s is None:
                    payload, dtype = None, (self.dtype if t.kind == "kv" else acc_t)
                elif t.kind == "kv":
                    payload, dtype = s.kv, self.dtype
                else:
                    payload, dtype = add_block(s), acc_t
                flying[t] = self._start(t, payload, dtype)
            else:
                assert isinstance(op, Wait)
                t = op.transfer
                got = self._received(t, flying.pop(t).wait())
                s = state.get(t.ring)
                if got is None or s is None:
                    continue
                if t.kind == "kv":
                    s.kv = got
                    continue
                s.acc = got
                if t.step == self._parts[t.ring].size - 1:  # own dK/dV, home after g hops
                    rows = self.dev.rows[t.ring]
                    dq.index_copy_(0, rows, s.dq.to(self.dtype))
                    dk.index_copy_(0, rows, got[:, :hkv].to(self.dtype))
                    dv.index_copy_(0, rows, got[:, hkv:].to(self.dtype))
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
