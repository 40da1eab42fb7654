"""The Triton kernel behind :mod:`.fused_merge` (imported by it only when Triton is importable).

One program merges ``BLOCK_R`` (token, head) rows: it reads ``lse``, ``lse_b`` and the two rows of
``D`` values of ``out`` and ``out_b`` once, and writes ``lse`` and ``out`` once. The arithmetic is
that of :func:`zeppelin_megatron.runtime.ring.merge_lse_`'s torch path, in float32 registers:

* ``w = sigmoid(lse_b - lse)`` (``1 / (1 + exp(-(lse_b - lse)))``);
* ``lse' = logaddexp(lse, lse_b)`` as torch computes it: ``lse`` when both are the same infinity,
  else ``max + log1p(exp(-|lse - lse_b|))`` (``log1p(x)`` as ``log(u) x / (u - 1)``,
  ``u = 1 + x``: exact for a tiny ``x``, where ``log(1 + x)`` would give 0);
* ``out' = lerp(out, float(out_b), w)`` as torch computes it: ``out + w (out_b - out)`` when
  ``|w| < 0.5``, else ``out_b - (out_b - out)(1 - w)`` (exact at ``w = 0`` and ``w = 1``).

Checked against the torch path with ``TRITON_INTERPRET=1`` on CPU tensors
(``tests/runtime/test_fused_merge.py``); never compiled or timed on a GPU here. The block sizes
(``BLOCK_R * BLOCK_D`` = 2048 elements, 4 warps) are a common choice for a bandwidth-bound
elementwise kernel, not tuned. Multiply-adds may fuse (``enable_fp_fusion=True``, set explicitly: Triton 3.9
warns that its default will change), as in torch's own CUDA kernels (nvcc's ``--fmad=true``).
"""

from __future__ import annotations

from typing import Any

import torch
import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]
from triton import knobs  # type: ignore[import-untyped]

__all__ = ["launch"]

_ELEMENTS = 2048
"""Elements of ``out`` per program (``BLOCK_R`` rows of ``BLOCK_D = next_power_of_2(D)``)."""


def _merge_rows(out_ptr, lse_ptr, outb_ptr, lseb_ptr, rows, heads, dim,  # type: ignore[no-untyped-def]
                so_t, so_h, so_d, sb_t, sb_h, sb_d, sl_t, sl_h, slb_t, slb_h,
                BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows ``pid * BLOCK_R ...`` of the flattened ``T * H`` rows (row ``r``: token ``r // H``, head
    ``r % H``); every pointer is addressed with its tensor's strides (views welcome)."""
    pid = tl.program_id(0)
    r = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < rows
    t = r // heads
    h = r % heads
    lse_at = lse_ptr + t * sl_t + h * sl_h
    lse = tl.load(lse_at, mask=rmask, other=0.0)
    lse_b = tl.load(lseb_ptr + t * slb_t + h * slb_h, mask=rmask, other=0.0)
    w = 1.0 / (1.0 + tl.exp(-(lse_b - lse)))  # sigmoid, spelled out: tl.sigmoid is a jit function of its own
    top = tl.maximum(lse, lse_b)
    same_inf = (lse == lse_b) & (tl.abs(lse) == float("inf"))
    # log1p(e) as log(u) e / (u - 1), u = 1 + e (a few ulp; the interpreter has no libdevice.log1p)
    e = tl.exp(-tl.abs(lse - lse_b))
    u = 1.0 + e
    log1p = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))
    tl.store(lse_at, tl.where(same_inf, lse, top + log1p), mask=rmask)
    d = tl.arange(0, BLOCK_D)
    mask = rmask[:, None] & (d < dim)[None, :]
    out_at = out_ptr + (t * so_t + h * so_h)[:, None] + (d * so_d)[None, :]
    o = tl.load(out_at, mask=mask, other=0.0)
    ob = tl.load(outb_ptr + (t * sb_t + h * sb_h)[:, None] + (d * sb_d)[None, :], mask=mask, other=0.0)
    ob = ob.to(tl.float32)
    w2 = w[:, None]
    diff = ob - o
    tl.store(out_at, tl.where(tl.abs(w2) < 0.5, o + w2 * diff, ob - diff * (1.0 - w2)), mask=mask)


_JITTED: dict[bool, Any] = {}


def _kernel() -> Any:
    """``triton.jit(_merge_rows)``, built once per interpreter setting (``TRITON_INTERPRET`` is read when a
    kernel is decorated, so a process that turns the interpreter on after import still gets it)."""
    mode = bool(knobs.runtime.interpret)
    if mode not in _JITTED:
        _JITTED[mode] = triton.jit(_merge_rows)
    return _JITTED[mode]


def launch(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Merge in place; the caller (:func:`.fused_merge.merge_`) has checked shapes, dtypes and devices.

    ``out`` [T, H, D] float32, ``lse`` [T, H] float32, ``out_b`` [T, H, D] float32/bf16/fp16,
    ``lse_b`` [T, H] float32; one launch of ``ceil(T H / BLOCK_R)`` programs.
    """
    t, h, d = out.shape
    rows = t * h
    block_d = triton.next_power_of_2(d)
    block_r = max(1, _ELEMENTS // block_d)
    grid = (triton.cdiv(rows, block_r),)
    _kernel()[grid](out, lse, out_b, lse_b, rows, h, d, *out.stride(), *out_b.stride(), *lse.stride(),
                    *lse_b.stride(), BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4, enable_fp_fusion=True)
