"""The linear (GEMM) work of one Llama-style layer on one rank, forward and backward.

Per layer a rank holding ``T`` tokens runs four weight GEMMs (``x [T, in] @ W^T
[in, out]``), each forward once and backward twice (``dx = dy @ W``,
``dW = dy^T @ x``):

=============  ==================================  =======================
GEMM           in features                         out features
=============  ==================================  =======================
QKV            hidden                              (Hq + 2 Hkv) * D / tp
output proj    Hq * D / tp                         hidden
gate + up      hidden                              2 * ffn / tp
down           ffn / tp                            hidden
=============  ==================================  =======================

These are the weights :func:`zeppelin_megatron.planner.model.linear_params`
counts (so a profile measured here scales in the cost model exactly by that
count). Norms, activations, RoPE and residual adds are not included: GEMMs only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..planner.model import ModelShape

__all__ = ["LinearWork", "gemm_shapes", "linear_flops"]


def gemm_shapes(model: ModelShape, tensor_parallel: int = 1) -> tuple[tuple[str, int, int], ...]:
    """``(name, in_features, out_features)`` of the layer's GEMMs on one tensor-parallel rank."""
    tp = tensor_parallel
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor_parallel must be a positive integer, got {tp!r}")
    for what, value in (("q_heads", model.q_heads), ("kv_heads", model.kv_heads), ("ffn", model.ffn)):
        if value % tp:
            raise ValueError(f"model {what} = {value} is not divisible by tensor_parallel = {tp}")
    h, d = model.hidden, model.head_dim
    hq, hkv = model.q_heads // tp, model.kv_heads // tp
    return (
        ("qkv", h, (hq + 2 * hkv) * d),
        ("out_proj", hq * d, h),
        ("gate_up", h, 2 * model.ffn // tp),
        ("down", model.ffn // tp, h),
    )


def linear_flops(model: ModelShape, tokens: int, tensor_parallel: int = 1) -> float:
    """Forward + backward GEMM flops for ``tokens`` tokens: ``3 * 2 * T * in * out`` per GEMM."""
    return float(sum(6 * tokens * i * o for _, i, o in gemm_shapes(model, tensor_parallel)))


@dataclass(frozen=True, kw_only=True)
class _Gemm:
    weight: torch.Tensor  # [out, in]
    x: torch.Tensor       # [T, in]
    dy: torch.Tensor      # [T, out]


class LinearWork:
    """Random weights and activations for ``tokens`` tokens; :meth:`run` does one forward + backward.

    Inputs of every GEMM are allocated once here, so :meth:`run` times only
    the GEMMs (outputs are allocated by each call, as in training).
    """

    def __init__(
        self, model: ModelShape, tokens: int, *, dtype: torch.dtype, device: torch.device,
        tensor_parallel: int = 1, seed: int = 0,
    ) -> None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"tokens must be an integer >= 0, got {tokens!r}")
        self.tokens = tokens
        self.shapes = gemm_shapes(model, tensor_parallel)
        gen = torch.Generator(device=device).manual_seed(seed)
        self._gemms = tuple(
            _Gemm(weight=_randn((o, i), gen, dtype, device, scale=i ** -0.5),
                  x=_randn((tokens, i), gen, dtype, device),
                  dy=_randn((tokens, o), gen, dtype, device))
            for _, i, o in self.shapes
        ) if tokens else ()

    def run(self) -> None:
        """Forward ``y = x W^T`` then backward ``dx = dy W``, ``dW = dy^T x`` of every GEMM."""
        for g in self._gemms:
            torch.matmul(g.x, g.weight.t())
            torch.matmul(g.dy, g.weight)
            torch.matmul(g.dy.t(), g.x)


def _randn(shape: tuple[int, int], gen: torch.Generator, dtype: torch.dtype, device: torch.device,
           scale: float = 1.0) -> torch.Tensor:
    """Random normal values generated on ``device`` (no host copy of large activations)."""
    x = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    return x.mul_(scale) if scale != 1.0 else x
