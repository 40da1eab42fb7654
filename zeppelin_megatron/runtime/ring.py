"""Zigzag ring attention: one lowered ring step's kernel call, forward and backward, and the merges.

The order of steps, which K/V a step uses, and which rows it reads come from
:mod:`zeppelin_megatron.planner.lowering` (:class:`~zeppelin_megatron.planner.lowering.RingCall`);
this module turns one call into tensor work on a member's ring state.

Buffers. A member keeps the ring's tokens *seq-major* (``[s0 early, s0 late,
s1 early, ...]``): ``q`` [n_i, Hq, D] and one packed ``kv`` buffer
[2, n, Hkv, D] (K, then V: each half is contiguous, so the kernel reads ``kv[0]`` and ``kv[1]`` in place,
no copy; one message per hop carries both). At each step the held ``kv`` is the source position's buffer.

Forward (:func:`forward_step`): ``diag`` (step 0) starts the running
``(out, lse)``; every later call is merged in place with :func:`merge_lse_`, into
the call's query rows (all rows, or the late chunks for ``late``: those rows of ``q``, ``out`` and
``lse`` are gathered at the ring's first ``late`` call, every ``late`` call merges into them, and
:func:`finish` writes them back at the ring's end).

Backward (:func:`backward_step`): dQ accumulates into the call's query rows;
the step's dK/dV block (the kernel's ``dk``, ``dv``, uncast) waits in :attr:`RingGrad.block` until
the accumulator of the step's K/V source arrives (:func:`add_block`, then it is posted on).
After ``g`` accumulator hops each position holds its own dK/dV.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import AttentionKernel, VarlenBatch, acc_dtype, fused_merge

__all__ = ["StepIndex", "RingState", "RingGrad", "forward_step", "backward_step", "add_block", "merge_lse",
           "merge_lse_", "finish"]


@dataclass(frozen=True, kw_only=True)
class StepIndex:
    """One :class:`~zeppelin_megatron.planner.lowering.RingCall` on a device: its varlen ``batch``,
    ``q_index`` (rows of the ring buffer; None: all rows) and ``kv_index`` (rows of the held K/V; None: all)."""

    batch: VarlenBatch
    q_index: torch.Tensor | None
    kv_index: torch.Tensor | None


def merge_lse_(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Merge a partial softmax result over another key set into ``(out, lse)``, in place.

    ``out`` [T, H, D] (accumulation dtype), ``lse`` [T, H] (same dtype), ``out_b`` [T, H, D] (any float
    dtype), ``lse_b`` [T, H]. With ``new = logaddexp(lse, lse_b)`` the merged output is
    ``out * exp(lse - new) + out_b * exp(lse_b - new)``; since ``exp(lse_b - new) = sigmoid(lse_b - lse)``
    and the two weights sum to 1, that is ``out.lerp_(out_b, sigmoid(lse_b - lse))``.

    Two paths, one formula. On CUDA with Triton importable and float32 ``out``/``lse``/``lse_b``
    (:func:`.kernels.fused_merge.unavailable_reason`): one fused pass
    (:mod:`.kernels.fused_merge`, reads each input and writes ``out``, ``lse`` once). Otherwise (CPU,
    float64, no Triton) torch: four passes (``sub``, ``sigmoid_``, ``logaddexp`` into ``lse``, ``lerp_``
    into ``out``) plus ``out_b``'s cast when it is not in the accumulation dtype (bf16/fp16 kernels).
    Rows without keys: ``lse_b = -inf`` gets weight 0 (``out``, ``lse`` unchanged), ``lse = -inf`` weight 1
    (``out_b``, ``lse_b`` taken as they are); both -inf gives ``out`` NaN and ``lse`` -inf (the ring never
    merges such a row: its diagonal call gives every row at least its own key). Raises ``ValueError`` when
    the shapes do not fit each other.

    Example: ``lse = log 3``, ``lse_b = log 1`` -> weight ``1/4``, ``lse`` becomes ``log 4``.
    """
    if out.dim() != 3 or lse.shape != out.shape[:2] or out_b.shape != out.shape or lse_b.shape != lse.shape:
        raise ValueError(f"merge_lse_ needs out [T, H, D], lse [T, H] and the same shapes for out_b, lse_b; got "
                         f"out {tuple(out.shape)}, lse {tuple(lse.shape)}, out_b {tuple(out_b.shape)}, "
                         f"lse_b {tuple(lse_b.shape)}")
    if fused_merge.try_merge_(out, lse, out_b, lse_b):
        return
    w = torch.sub(lse_b, lse).sigmoid_().unsqueeze(-1)
    torch.logaddexp(lse, lse_b, out=lse)
    out.lerp_(out_b.to(out.dtype), w)


def merge_lse(
    out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`merge_lse_` on copies: ``-> (merged out, merged lse)``; the inputs are left as they are."""
    out_m, lse_m = out.clone(), lse.clone()
    merge_lse_(out_m, lse_m, out_b, lse_b)
    return out_m, lse_m


@dataclass(kw_only=True)
class RingState:
    """A member's forward state in one ring: its ``q`` [n_i, Hq, D], the held ``kv``, the running result."""

    q: torch.Tensor
    kv: torch.Tensor
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    held: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """``(index, q rows, out rows, lse rows)`` of the late calls, gathered at the first one and merged
    in place by every late call with that index; written back by :func:`finish` (or before a call
    over other rows)."""


def finish(s: RingState) -> None:
    """Write the held rows' running result back into ``s.out`` / ``s.lse`` (no-op when none are held)."""
    if s.held is not None:
        assert s.out is not None and s.lse is not None
        index, _, o_m, l_m = s.held
        s.out.index_copy_(0, index, o_m)
        s.lse.index_copy_(0, index, l_m)
        s.held = None


def _rows(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return t if index is None else t.index_select(0, index)


def _kv_rows(kv: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """The packed ``kv`` [2, n, Hkv, D] at ``index`` rows (all: the buffer itself)."""
    return kv if index is None else kv.index_select(1, index)


def forward_step(kernel: AttentionKernel, scale: float, idx: StepIndex, s: RingState) -> None:
    """Run one ring step's call on ``s`` (see the module docstring).

    A call over some rows (``late``) merges into the held copy of those rows (:attr:`RingState.held`:
    the ``q``, ``out`` and ``lse`` rows are gathered once per ring, not once per call); call
    :func:`finish` before reading ``s.out``."""
    if s.out is None and idx.q_index is not None:
        raise ValueError("a ring's first call must cover all of the rank's ring rows (the diagonal)")
    if s.held is not None and s.held[0] is not idx.q_index:
        finish(s)  # a call over other rows: the held rows go back first
    kv = _kv_rows(s.kv, idx.kv_index)
    if idx.q_index is None:
        q = s.q
    else:
        if s.held is None:
            assert s.out is not None and s.lse is not None
            ix = idx.q_index
            s.held = (ix, s.q.index_select(0, ix), s.out.index_select(0, ix), s.lse.index_select(0, ix))
        q = s.held[1]
    o, l = kernel.forward(q, kv[0], kv[1], idx.batch, scale)
    if s.out is None:
        s.out, s.lse = o.to(acc_dtype(s.q.dtype)), l
        return
    assert s.lse is not None
    if s.held is None:
        merge_lse_(s.out, s.lse, o, l)
    else:
        merge_lse_(s.held[2], s.held[3], o, l)


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
    block: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor] | None = None
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


def backward_step(kernel: AttentionKernel, scale: float, idx: StepIndex, s: RingGrad) -> None:
    """One ring step's backward call: dQ into its query rows, the dK/dV block kept for :func:`add_block`."""
    dout, q, out, lse = s.select(idx.q_index)
    kv = _kv_rows(s.kv, idx.kv_index)
    dq_b, dk_b, dv_b = kernel.backward(dout, q, kv[0], kv[1], out, lse, idx.batch, scale)
    if idx.q_index is None:
        s.dq += dq_b
    else:
        s.dq.index_add_(0, idx.q_index, dq_b.to(s.dq.dtype))
    s.block = (idx.kv_index, dk_b, dv_b)


def add_block(s: RingGrad) -> torch.Tensor:
    """Add the pending dK/dV block into the held accumulator -> the accumulator [2, n, Hkv, D].

    At the first step (no accumulator yet) a block over all rows becomes the accumulator (one cast copy
    per half); otherwise the accumulator starts as zeros. A block over all rows is added per half in
    place (``acc[0] += dk``, type-promoting: no ``cat``, no cast copy); one over some rows is cast
    to the accumulation dtype and ``index_add_`` -ed into each half.
    """
    block, s.block = s.block, None
    if s.acc is None:
        s.acc = torch.empty(s.kv.shape, dtype=s.dq.dtype, device=s.kv.device)
        if block is not None and block[0] is None:
            s.acc[0].copy_(block[1])
            s.acc[1].copy_(block[2])
            return s.acc
        s.acc.zero_()
    if block is not None:
        rows, dk, dv = block
        for half, d in ((s.acc[0], dk), (s.acc[1], dv)):
            if rows is None:
                half += d
            else:
                half.index_add_(0, rows, d.to(half.dtype))
    return s.acc
