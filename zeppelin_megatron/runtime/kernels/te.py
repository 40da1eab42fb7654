"""Transformer Engine's fused (cuDNN) attention, when installed. EXPERIMENTAL.

Calls ``transformer_engine.pytorch.cpp_extensions.fused_attn.fused_attn_fwd`` /
``fused_attn_bwd`` with the ``thd_thd_thd`` layout and the F16 arbitrary-seqlen
backend. Transformer Engine's Python signatures change between releases, so
arguments are bound by name to what the installed version declares; an
unrecognised version is reported as unavailable rather than guessed at.

The softmax statistics (TE's log-sum-exp) come either packed as [T_q, Hq, 1]
(cuDNN >= 9.6) or padded as [B, Hq, max_q, 1]; both are converted to and from
the interface's [T_q, Hq]. Not exercised by this repository's tests (no TE on
the CI machines): prefer ``flash_attn`` or ``torch_varlen`` unless TE is the only
fast kernel available.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .base import VarlenBatch, cuda_half_reason

__all__ = ["TransformerEngineKernel", "unavailable_reason"]

_NEEDED_FWD = {"is_training", "max_seqlen_q", "max_seqlen_kv", "cu_seqlens_q", "cu_seqlens_kv", "q", "k", "v",
               "fake_dtype", "fused_attention_backend", "attn_scale", "qkv_layout", "attn_mask_type"}


def _api() -> tuple[Any, Any, Any]:
    from transformer_engine.pytorch.cpp_extensions import fused_attn as fa
    import transformer_engine_torch as tex

    return fa, tex, tex.NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen


def unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    reason = cuda_half_reason(device, dtype)
    if reason is not None:
        return reason
    try:
        fa, _tex, _backend = _api()
    except (ImportError, AttributeError) as exc:
        return f"Transformer Engine is not installed or has no fused attention ({exc})"
    params = set(inspect.signature(fa.fused_attn_fwd).parameters)
    if not _NEEDED_FWD <= params:
        return f"unrecognised Transformer Engine fused_attn_fwd signature (missing {sorted(_NEEDED_FWD - params)})"
    return None


def _call(fn: Any, **kwargs: Any) -> Any:
    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def _mask(batch: VarlenBatch) -> str:
    return "padding_causal_bottom_right" if batch.causal else "padding"


class TransformerEngineKernel:
    name = "te"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fa, _tex, backend = _api()
        out, aux = _call(
            fa.fused_attn_fwd, is_training=True, max_seqlen_q=batch.max_q, max_seqlen_kv=batch.max_k,
            cu_seqlens_q=batch.cu_q, cu_seqlens_kv=batch.cu_k, q=q.contiguous(), k=k.contiguous(),
            v=v.contiguous(), fake_dtype=q.dtype, fused_attention_backend=backend, attn_scale=scale,
            dropout=0.0, qkv_layout="thd_thd_thd", attn_bias_type="no_bias", attn_mask_type=_mask(batch),
        )
        return out, _stats_to_lse(aux[0], batch)

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
        fa, tex, backend = _api()
        stats = _lse_to_stats(lse, batch)
        rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)
        dqkv_dtype = tex.DType.kBFloat16 if q.dtype == torch.bfloat16 else tex.DType.kFloat16
        res = _call(
            fa.fused_attn_bwd, max_seqlen_q=batch.max_q, max_seqlen_kv=batch.max_k, cu_seqlens_q=batch.cu_q,
            cu_seqlens_kv=batch.cu_k, q=q.contiguous(), k=k.contiguous(), v=v.contiguous(),
            o=out.contiguous(), d_o=dout.contiguous(), fake_dtype=q.dtype, dqkv_dtype=dqkv_dtype,
            aux_ctx_tensors=[stats, rng_state], fused_attention_backend=backend, attn_scale=scale,
            dropout=0.0, qkv_layout="thd_thd_thd", attn_bias_type="no_bias", attn_mask_type=_mask(batch),
        )
        return res[0], res[1], res[2]


def _stats_to_lse(stats: torch.Tensor, batch: VarlenBatch) -> torch.Tensor:
    """TE softmax statistics -> [T_q, Hq] float32."""
    if stats.dim() == 3:  # packed [T_q, Hq, 1]
        return stats[..., 0].float()
    # padded [B, Hq, max_q, 1]: keep the first lens_q[b] rows of each segment
    parts = [stats[b, :, :n, 0].transpose(0, 1) for b, n in enumerate(batch.lens_q)]
    return torch.cat(parts).float()


def _lse_to_stats(lse: torch.Tensor, batch: VarlenBatch) -> torch.Tensor:
    """[T_q, Hq] -> TE's packed [T_q, Hq, 1] statistics (cuDNN >= 9.6 THD format)."""
    return lse.float().contiguous()[..., None]
