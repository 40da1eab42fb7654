"""The kernel interface every attention backend implements.

A backend computes, for a batch of independent (query segment, key segment)
pairs packed along the token axis, the attention output and its log-sum-exp,
and the gradients given a (possibly merged) output and log-sum-exp.

Shapes: ``q`` [T_q, Hq, D]; ``k``, ``v`` [T_k, Hkv, D] with ``Hq % Hkv == 0``
(grouped-query attention: query head ``h`` uses key/value head
``h // (Hq // Hkv)``); ``out`` [T_q, Hq, D] in q's dtype; ``lse`` [T_q, Hq] in
:func:`lse_dtype` (float64 for float64 inputs, float32 otherwise). Segment
``b`` of the batch is ``q[cu_q[b]:cu_q[b+1]]`` against ``k[cu_k[b]:cu_k[b+1]]``.

Causal masks are *bottom-right* aligned (the flash-attention convention): query
``a`` of a segment with ``Lq`` queries and ``Lk`` keys sees keys
``b <= a + (Lk - Lq)``. Zeppelin only asks for causal blocks with ``Lq == Lk``.

Inputs may be row-strided views (a head-parallel ring's head buffers, :mod:`..heads`); a backend that
needs them contiguous copies them. Optional: ``backward_into(dout, q, k, v, out, lse, batch, scale, dq, dk,
dv)``, the backward writing its gradients into the given (strided) buffers; the engine uses it where a
kernel has it (``flash_attn``, ``reference``) and copies what ``backward`` returns otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

__all__ = ["VarlenBatch", "AttentionKernel", "lse_dtype", "acc_dtype", "HALF_DTYPES", "cuda_half_reason"]

HALF_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
"""The dtypes the CUDA backends (``torch_varlen``, ``flash_attn``, ``te``) run in."""


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """Log-sum-exp / accumulation precision for inputs of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


acc_dtype = lse_dtype


def cuda_half_reason(device: torch.device, dtype: torch.dtype, *, need_cuda_runtime: bool = False) -> str | None:
    """The checks every CUDA fp16/bf16 backend starts with: why ``(device, dtype)`` rules it out, or None.

    In order: the device must be CUDA; with ``need_cuda_runtime``, CUDA must be
    available on this machine; the dtype must be float16 or bfloat16. Example:
    ``cuda_half_reason(torch.device("cpu"), torch.bfloat16)`` ->
    ``"needs a CUDA device, got cpu"``.
    """
    if device.type != "cuda":
        return f"needs a CUDA device, got {device}"
    if need_cuda_runtime and not torch.cuda.is_available():
        return "CUDA is not available"
    if dtype not in HALF_DTYPES:
        return f"supports float16 and bfloat16, got {dtype}"
    return None


@dataclass(frozen=True, kw_only=True)
class VarlenBatch:
    """Segment lengths of one varlen call, as Python ints and as device ``cu_seqlens``.

    ``lens_q[b]``, ``lens_k[b]``: tokens of segment ``b``; ``cu_q``, ``cu_k``:
    int32 [B + 1] on ``device`` (built once, reused by every step that has the
    same segments). Example: ``lens_q = (3, 2)`` -> ``cu_q = [0, 3, 5]``.
    """

    lens_q: tuple[int, ...]
    lens_k: tuple[int, ...]
    causal: bool
    device: torch.device
    cu_q: torch.Tensor = field(init=False, repr=False, compare=False)
    cu_k: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.lens_q) != len(self.lens_k):
            raise ValueError(f"{len(self.lens_q)} query segments but {len(self.lens_k)} key segments")
        if any(n < 0 for n in self.lens_q + self.lens_k):
            raise ValueError("segment lengths must be >= 0")
        object.__setattr__(self, "lens_q", tuple(int(n) for n in self.lens_q))
        object.__setattr__(self, "lens_k", tuple(int(n) for n in self.lens_k))
        object.__setattr__(self, "cu_q", _cumsum(self.lens_q, self.device))
        object.__setattr__(self, "cu_k", _cumsum(self.lens_k, self.device))

    @property
    def total_q(self) -> int:
        return sum(self.lens_q)

    @property
    def total_k(self) -> int:
        return sum(self.lens_k)

    @property
    def max_q(self) -> int:
        return max(self.lens_q, default=0)

    @property
    def max_k(self) -> int:
        return max(self.lens_k, default=0)


def _cumsum(lens: tuple[int, ...], device: torch.device) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


@runtime_checkable
class AttentionKernel(Protocol):
    """What the engine calls. ``scale`` multiplies ``q @ k^T`` before the softmax."""

    name: str

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> ``(out [T_q, Hq, D] q.dtype, lse [T_q, Hq] lse_dtype)``."""
        ...

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        batch: VarlenBatch,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> ``(dq [T_q, Hq, D], dk [T_k, Hkv, D], dv [T_k, Hkv, D])`` in the inputs' dtypes.

        ``out`` and ``lse`` are the *final* values for these queries (after any
        log-sum-exp merge), so the block's softmax is ``exp(s - lse)``.
        """
        ...
