"""Per-token loss: sums, not means, so gradients equal a single-process run of the global batch.

Zeppelin moves tokens between ranks, so ranks hold different token counts. Each
rank returns ``(sum of its masked token losses, its token count)``; Megatron's
``--calculate-per-token-loss`` sums both over micro-batches and data-parallel
ranks and divides the gradients by the global token count once.
"""

from __future__ import annotations

import torch

__all__ = ["per_token_loss"]


def per_token_loss(output_tensor: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``output_tensor`` [b, s] per-token losses, ``loss_mask`` [b, s] -> (loss sum fp32 0-d, tokens int 0-d)."""
    if output_tensor.shape != loss_mask.shape:
        raise ValueError(
            f"per-token losses {tuple(output_tensor.shape)} and loss mask {tuple(loss_mask.shape)} differ in shape"
        )
    mask = loss_mask.reshape(-1).float()
    loss = torch.sum(output_tensor.reshape(-1).float() * mask)
    return loss, mask.sum().detach().to(torch.int)
