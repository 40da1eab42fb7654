"""FlashAttention-2 through PyTorch's own varlen operators (CUDA, fp16/bf16).

Uses the ATen operators behind ``torch.nn.attention.varlen.varlen_attn``
(``aten::_flash_attention_forward`` / ``_backward``) directly, because the ring
needs a backward driven by a *merged* output and log-sum-exp, which the public
autograd wrapper cannot take. Grouped-query attention: K/V heads are expanded
inside the call (torch 2.11's varlen has no ``enable_gqa``) and the gradients
summed back, so expanded K/V never travel over the network.

Flash's varlen log-sum-exp is [Hq, T_q] float32; this module converts to the
interface's [T_q, Hq] and back.
"""

from __future__ import annotations

import torch

from .base import VarlenBatch, cuda_half_reason

__all__ = ["TorchVarlenKernel", "unavailable_reason"]

def unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    reason = cuda_half_reason(device, dtype, need_cuda_runtime=True)
    if reason is not None:
        return reason
    try:
        from torch.nn.attention import varlen  # noqa: F401  (binds no local ``torch``)
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen"
    if not hasattr(torch.ops.aten, "_flash_attention_forward") or not hasattr(
        torch.ops.aten, "_flash_attention_backward"
    ):
        return f"torch {torch.__version__} lacks aten::_flash_attention_forward/_backward"
    return None


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    return (x if groups == 1 else x.repeat_interleave(groups, dim=1)).contiguous()


class TorchVarlenKernel:
    name = "torch_varlen"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        groups = q.shape[1] // k.shape[1]
        out, lse, _rng, _unused, _dbg = torch.ops.aten._flash_attention_forward(
            q.contiguous(), _expand(k, groups), _expand(v, groups),
            batch.cu_q, batch.cu_k, batch.max_q, batch.max_k,
            0.0, batch.causal, False, scale=scale,
        )
        return out, lse.transpose(0, 1)  # [Hq, T_q] -> [T_q, Hq]

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
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        groups = hq // hkv
        rng_state = torch.zeros(2, dtype=torch.uint64, device=q.device)  # no dropout
        unused = torch.empty(0, device=q.device)
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.contiguous(), q.contiguous(), _expand(k, groups), _expand(v, groups),
            out.contiguous(), lse.transpose(0, 1).float().contiguous(),
            batch.cu_q, batch.cu_k, batch.max_q, batch.max_k,
            0.0, batch.causal, rng_state, unused, scale=scale,
        )
        if groups > 1:
            n = k.shape[0]
            dk = dk.view(n, hkv, groups, d).sum(2)
            dv = dv.view(n, hkv, groups, d).sum(2)
        return dq, dk.to(k.dtype), dv.to(v.dtype)
