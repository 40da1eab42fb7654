"""The ``flash-attn`` package's varlen kernels (CUDA, fp16/bf16), when installed.

Forward goes through the public ``flash_attn_varlen_func(..., return_attn_probs=True)``
(returns ``out, softmax_lse [Hq, T_q], _``, stable across flash-attn 2.x).
Backward calls ``flash_attn_interface._flash_attn_varlen_backward``, whose
keyword set changed across releases (``window_size`` tuple vs. ``_left/_right``,
``softcap``, ``alibi_slopes``, ``deterministic``, ``rng_state``); the call is
bound to whatever parameters the installed version declares. flash-attn takes
fewer K/V heads natively (GQA) and returns dK/dV with Hkv heads. Inputs need only their last
dimension contiguous (flash-attn addresses rows and heads by their strides): column views of a
head-parallel ring's receive buffer go in as they are (:mod:`..heads`), other layouts are copied
first; :meth:`FlashAttnKernel.backward_into` writes the gradients into given buffers (views welcome).
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
            _rows(q), _rows(k), _rows(v), batch.cu_q, batch.cu_k, batch.max_q, batch.max_k,
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
        dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
        self.backward_into(dout, q, k, v, out, lse, batch, scale, dq, dk, dv)
        return dq, dk, dv

    def backward_into(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        batch: VarlenBatch,
        scale: float,
        dq: torch.Tensor,
        dk: torch.Tensor,
        dv: torch.Tensor,
    ) -> None:
        """:meth:`backward` writing ``dq`` [T_q, Hq, D], ``dk``, ``dv`` [T_k, Hkv, D] in place (any row and
        head strides, the last dimension contiguous)."""
        fn, params = _backward_fn()
        kwargs: dict[str, Any] = {
            "dout": _rows(dout), "q": _rows(q), "k": _rows(k), "v": _rows(v), "out": _rows(out),
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
        if any(x.stride(-1) != 1 for x in (dq, dk, dv)):
            raise ValueError("backward_into needs dq, dk, dv with a contiguous last dimension")
        fn(**kwargs)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as flash-attn takes it: as it is when its last dimension is contiguous, else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()
