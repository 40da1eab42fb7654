"""Attention kernel backends behind one interface (see :mod:`.base`), chosen by name or automatically.

====================  =========================  =====================================
name                  where                      notes
====================  =========================  =====================================
``reference``         CPU and GPU, any dtype     pure torch; exact in float64; tests
``torch_varlen``      CUDA, fp16/bf16            FlashAttention-2 via torch's ATen ops
``flash_attn``        CUDA, fp16/bf16            the flash-attn package, if installed
``te``                CUDA, fp16/bf16            Transformer Engine fused attn (experimental)
====================  =========================  =====================================

Automatic choice (``name=None``): the first usable of ``flash_attn``,
``torch_varlen``, ``te``, ``reference``. Asking by name for a backend that
cannot run here raises :class:`BackendUnavailableError` with the reason.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch

from ..errors import BackendUnavailableError
from . import flash_attn as _flash_attn
from . import reference as _reference
from . import te as _te
from . import torch_varlen as _torch_varlen
from .base import AttentionKernel, VarlenBatch, acc_dtype, lse_dtype

__all__ = [
    "AttentionKernel",
    "VarlenBatch",
    "lse_dtype",
    "acc_dtype",
    "BACKENDS",
    "AUTO_ORDER",
    "get_kernel",
    "available_backends",
]

# name -> (module with unavailable_reason(device, dtype), kernel factory)
BACKENDS: dict[str, tuple[ModuleType, Callable[[], AttentionKernel]]] = {
    "reference": (_reference, _reference.ReferenceKernel),
    "torch_varlen": (_torch_varlen, _torch_varlen.TorchVarlenKernel),
    "flash_attn": (_flash_attn, _flash_attn.FlashAttnKernel),
    "te": (_te, _te.TransformerEngineKernel),
}
AUTO_ORDER: tuple[str, ...] = ("flash_attn", "torch_varlen", "te", "reference")


def available_backends(device: torch.device, dtype: torch.dtype) -> dict[str, str | None]:
    """name -> None when usable for (device, dtype), else the reason it is not."""
    return {name: mod.unavailable_reason(device, dtype) for name, (mod, _) in BACKENDS.items()}


def get_kernel(name: str | None, device: torch.device, dtype: torch.dtype) -> AttentionKernel:
    """The kernel called ``name``, or the best usable one when ``name`` is None."""
    if name is None:
        for candidate in AUTO_ORDER:
            mod, factory = BACKENDS[candidate]
            if mod.unavailable_reason(device, dtype) is None:
                return factory()
        raise BackendUnavailableError(f"no attention backend can run on {device} with {dtype}")
    if name not in BACKENDS:
        raise BackendUnavailableError(f"unknown attention backend {name!r}; known: {sorted(BACKENDS)}")
    mod, factory = BACKENDS[name]
    reason = mod.unavailable_reason(device, dtype)
    if reason is not None:
        raise BackendUnavailableError(f"attention backend {name!r} is unavailable on {device} with {dtype}: {reason}")
    return factory()
