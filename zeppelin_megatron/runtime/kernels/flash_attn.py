"""The ``flash-attn`` package's varlen kernels (CUDA, fp16/bf16), when installed.

Forward goes through the public ``flash_attn_varlen_func(..., return_attn_probs=True)``
(returns ``out, softmax_lse [Hq, T_q], _``, stable across flash-attn 2.x).
Backward calls ``flash_attn_interface._flash_attn_varlen_backward``, whose
keyword set changed across releases (``window_size`` tuple vs. ``_left/_right``,
``softcap``, ``alibi_slopes``, ``deterministic``, ``rng_state``); the call is
bound to whatever parameters the installed version declares. flash-attn takes
fewer K/V heads natively (GQA) and returns dK/dV with Hkv heads.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any, Callable

import torch

from .base import VarlenBatch, cuda_half_reason

__all__ = ["FlashAttnKernel", "unavailable_reason"]


def unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    reason = cuda_half_reason(device, dtype)
    if reason is not None:
        return reason
    try:
        import flash_attn  # noqa: F401
        from flash_attn import flash_attn_interface  # noqa: F401
    except ImportError as exc:
        return f"the flash-attn package is not installed ({exc})"
    if not hasattr(flash_attn_interface, "_flash_attn_varlen_backward"):
        return "this flash-attn has no _flash_attn_varlen_backward"
    return None


@lru_cache(maxsize=1)
def _backward_fn() -> tuple[Callable[..., Any], frozenset[str]]:
    from flash_attn import flash_attn_interface

    fn = flash_attn_interface._flash_attn_varlen_backward
    return fn, frozenset(inspect.signature(fn).parameters)


class FlashAttnKernel:
    name = "flash_attn"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from flash_attn import flash_attn_varlen_func

        res = flash_attn_varlen_func(
            q.contiguous(), k.contiguous(), v.contiguous(), batch.cu_q, batch.cu_k, batch.max_q, batch.max_k,
            dropout_p=0.0, softmax_scale=scale, causal=batch.causal, return_attn_probs=True,
        )
        out, lse = res[0], res[1]
        return out, lse.transpose(0, 1)

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
        fn, params = _backward_fn()
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        kwargs: dict[str, Any] = {
            "dout": dout.contiguous(), "q": q, "k": k, "v": v, "out": out.contiguous(),
            "softmax_lse": lse.transpose(0, 1).float().contiguous(), "dq": dq, "dk": dk, "dv": dv,
            "cu_seqlens_q": batch.cu_q, "cu_seqlens_k": batch.cu_k,
            "max_seqlen_q": batch.max_q, "max_seqlen_k": batch.max_k,
            "dropout_p": 0.0, "softmax_scale": scale, "causal": batch.causal,
        }
        optional = {
            "window_size": (-1, -1), "window_size_left": -1, "window_size_right": -1, "softcap": 0.0,
            "alibi_slopes": None, "deterministic": False, "rng_state": None,
        }
        kwargs.update({key: val for key, val in optional.items() if key in params})
        missing = [p for p in kwargs if p not in params]
        if missing:
            raise RuntimeError(f"unsupported flash-attn version: _flash_attn_varlen_backward lacks {missing}")
        fn(**kwargs)
        return dq, dk, dv
