"""Zigzag ring attention: one lowered ring step's kernel call, forward and backward, and the merges.

The order of steps, which K/V a step uses, and which rows it reads come from
:mod:`zeppelin_megatron.planner.lowering` (:class:`~zeppelin_megatron.planner.lowering.RingCall`);
this module turns one call into tensor work on a member's ring state.

Buffers. A member keeps the ring's tokens *seq-major* (``[s0 early, s0 late,
s1 early, ...]``): ``q`` [n_i, Hq, D] and one packed ``kv`` buffer
[n, 2*Hkv, D] (K heads first), so one message per hop carries both. At each
step the held ``kv`` is the source position's buffer.

Forward (:func:`forward_step`): ``diag`` (step 0) starts the running
``(out, lse)``; every later call is merged in with :func:`merge_lse`, into the
call's query rows (all rows, or the late chunks for ``late``).

Backward (:func:`backward_step`): dQ accumulates into the call's query rows;
the step's dK/dV block waits in :attr:`RingGrad.block` until the accumulator
of the step's K/V source arrives (:func:`add_block`, then it is posted on).
After ``g`` accumulator hops each position holds its own dK/dV.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import AttentionKernel, VarlenBatch, acc_dtype

__all__ = ["StepIndex", "RingState", "RingGrad", "forward_step", "backward_step", "add_block", "merge_lse"]


@dataclass(frozen=True, kw_only=True)
class StepIndex:
    """One :class:`~zeppelin_megatron.planner.lowering.RingCall` on a device: its varlen ``batch``,
    ``q_index`` (rows of the ring buffer; None: all rows) and ``kv_index`` (rows of the held K/V; None: all)."""

    batch: VarlenBatch
    q_index: torch.Tensor | None
    kv_index: torch.Tensor | None


def merge_lse(
    out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial softmax results over disjoint key sets.

    ``out``, ``out_b`` [T, H, D] (accumulation dtype), ``lse``, ``lse_b`` [T, H].
    """
    new = torch.logaddexp(lse, lse_b)
    w = torch.exp(lse - new).unsqueeze(-1)
    w_b = torch.exp(lse_b - new).unsqueeze(-1)
    return out * w + out_b.to(out.dtype) * w_b, new


@dataclass(kw_only=True)
class RingState:
    """A member's forward state in one ring: its ``q`` [n_i, Hq, D], the held ``kv``, the running result."""

    q: torch.Tensor
    kv: torch.Tensor
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None


def _rows(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return t if index is None else t.index_select(0, index)


def forward_step(kernel: AttentionKernel, scale: float, hkv: int, idx: StepIndex, s: RingState) -> None:
    """Run one ring step's call on ``s`` (see the module docstring)."""
    kv = _rows(s.kv, idx.kv_index)
    q = _rows(s.q, idx.q_index)
    o, l = kernel.forward(q, kv[:, :hkv], kv[:, hkv:], idx.batch, scale)
    if s.out is None:
        if idx.q_index is not None:
            raise ValueError("a ring's first call must cover all of the rank's ring rows (the diagonal)")
        s.out, s.lse = o.to(acc_dtype(s.q.dtype)), l
        return
    assert s.lse is not None
    if idx.q_index is None:
        s.out, s.lse = merge_lse(s.out, s.lse, o, l)
        return
    o_m, l_m = merge_lse(s.out.index_select(0, idx.q_index), s.lse.index_select(0, idx.q_index), o, l)
    s.out.index_copy_(0, idx.q_index, o_m)
    s.lse.index_copy_(0, idx.q_index, l_m)


@dataclass(kw_only=True)
class RingGrad:
    """A member's backward state in one ring: inputs (ring rows), the held ``kv``, dQ, the accumulator
    of dK/dV in transit (``acc``) and the last call's dK/dV ``block`` waiting to be added to it."""

    dout: torch.Tensor
    q: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    kv: torch.Tensor
    dq: torch.Tensor
    acc: torch.Tensor | None = None
    block: tuple[torch.Tensor | None, torch.Tensor] | None = None
    picked: dict[int, tuple[torch.Tensor, ...]] | None = None

    def select(self, index: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """``(dout, q, out, lse)`` at ``index`` rows (gathered once per index tensor)."""
        if index is None:
            return self.dout, self.q, self.out, self.lse
        if self.picked is None:
            self.picked = {}
        hit = self.picked.get(id(index))
        if hit is None:
            hit = self.picked[id(index)] = tuple(
                t.index_select(0, index) for t in (self.dout, self.q, self.out, self.lse))
        return hit


def backward_step(kernel: AttentionKernel, scale: float, hkv: int, idx: StepIndex, s: RingGrad) -> None:
    """One ring step's backward call: dQ into its query rows, the dK/dV block kept for :func:`add_block`."""
    dout, q, out, lse = s.select(idx.q_index)
    kv = _rows(s.kv, idx.kv_index)
    dq_b, dk_b, dv_b = kernel.backward(dout, q, kv[:, :hkv], kv[:, hkv:], out, lse, idx.batch, scale)
    if idx.q_index is None:
        s.dq += dq_b
    else:
        s.dq.index_add_(0, idx.q_index, dq_b.to(s.dq.dtype))
    s.block = (idx.kv_index, torch.cat([dk_b, dv_b], dim=1).to(s.dq.dtype))


def add_block(s: RingGrad) -> torch.Tensor:
    """Add the pending dK/dV block into the held accumulator (zeros at the first step) -> the accumulator."""
    if s.acc is None:
        s.acc = torch.zeros(s.kv.shape, dtype=s.dq.dtype, device=s.kv.device)
    if s.block is not None:
        rows, d = s.block
        if rows is None:
            s.acc += d
        else:
            s.acc.index_add_(0, rows, d)
        s.block = None
    return s.acc
