"""``ZeppelinCoreAttention``: Megatron's ``core_attention`` slot filled by the Zeppelin runtime.

Megatron's ``SelfAttention`` projects the hidden states to q, k, v, applies
RoPE and calls ``core_attention(query, key, value, attention_mask, ...)``. This
module keeps that contract (constructor and forward signatures of
``DotProductAttention`` in megatron-core 0.16 - 0.19) and computes causal
attention within each sequence of the bound micro-step's plan:

    query [T, 1, Hq_p, D], key/value [T, 1, Hkv_p, D]      (sbhd, b = 1)
      -> drop padding rows T_r .. T-1 (sequence-parallel padding)
      -> zeppelin_attention: remap to the attention layout, ring/local queues,
         remap back (zeppelin_megatron.runtime)
      -> pad back to T rows (zeros), [T, 1, Hq_p * D]

``Hq_p``/``Hkv_p`` are the heads of this tensor-parallel rank; the Zeppelin
group is the data-parallel ranks of this TP rank, so heads never cross TP ranks.
Packed THD inputs ([T, H, D], when Megatron is handed ``packed_seq_params``) are
accepted too and return [T, H * D] as Megatron expects.

The start-of-call check (one small ``all_reduce``, see
:mod:`zeppelin_megatron.runtime.agreement`: plan, softmax scale, heads, head dim,
dtype, routing, check setting, kernel) runs in the **first** Zeppelin attention
layer of every forward whatever the setting, so that every rank runs it on the same
calls; ``--zeppelin-check-plan`` (``ZeppelinStep.check_plan``) adds it to every
other layer too. The setting itself is one of the compared fields: ranks launched
with different settings all raise at the first layer instead of one of them
waiting in a check the others skip.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from ..runtime import zeppelin_attention
from .attention_rules import attention_problems

if TYPE_CHECKING:
    from .step import ZeppelinStep

__all__ = ["ZeppelinCoreAttention", "ZeppelinConfigError"]


class ZeppelinConfigError(ValueError):
    """A Megatron configuration the Zeppelin core attention cannot serve."""


def check_config(config: TransformerConfig, attn_mask_type: AttnMaskType, attention_dropout: float | None) -> None:
    """Raise :class:`ZeppelinConfigError` for settings this attention does not implement
    (:func:`~.attention_rules.attention_problems`, the start-up check's rules too, and a causal mask)."""
    problems = attention_problems(config, attention_dropout=attention_dropout)
    if attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
        problems.append(f"Zeppelin attention is causal; attn_mask_type={attn_mask_type.name} is unsupported")
    if problems:
        raise ZeppelinConfigError("; ".join(problems))


class ZeppelinCoreAttention(MegatronModule):
    """Core attention over the Zeppelin plan bound with :func:`~zeppelin_megatron.megatron.step.bind_step`.

    Constructor arguments are those Megatron's ``SelfAttention`` passes to any
    ``core_attention``; ``cp_comm_type`` and ``pg_collection`` are accepted and
    unused (the Zeppelin group comes with the bound step).
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection: Any = None,
        **unused: Any,
    ) -> None:
        super().__init__(config=config)
        check_config(config, attn_mask_type, attention_dropout)
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        head_dim = config.kv_channels
        # Megatron's query-key layer scaling divides the scale by the layer number and multiplies the
        # scores back inside the softmax: the net scale is 1/sqrt(head_dim) either way.
        self.softmax_scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
        self.step: "ZeppelinStep | None" = None
        # bind_step sets it on the model's first Zeppelin attention layer only: that layer always checks
        self.checks_plan = True

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """``query`` [T, 1, Hq, D] (or THD [T, Hq, D]), ``key``/``value`` [T, 1, Hkv, D] -> [T, 1, Hq * D]."""
        step = self.step
        if step is None:
            raise RuntimeError(
                "ZeppelinCoreAttention ran without a bound step: call "
                "zeppelin_megatron.megatron.step.bind_step(model, step) before the forward"
            )
        if attention_bias is not None:
            raise ZeppelinConfigError("Zeppelin attention does not support an attention bias")
        thd = query.dim() == 3
        if not thd:
            if query.dim() != 4 or query.shape[1] != 1:
                raise ValueError(
                    f"Zeppelin attention expects [tokens, 1, heads, head_dim] (micro-batch of one packed row), "
                    f"got query of shape {tuple(query.shape)}"
                )
            query, key, value = query[:, 0], key[:, 0], value[:, 0]
        total, t_r = query.shape[0], step.real_tokens
        if total < t_r:
            raise ValueError(f"query has {total} tokens, fewer than the bound step's real_tokens={t_r}")
        out = zeppelin_attention(
            query[:t_r], key[:t_r], value[:t_r], step.plan, step.group, self.softmax_scale,
            backend=step.backend, routing=step.routing,
            check_plan=self.checks_plan or step.check_plan, check_setting=step.check_plan,
        )  # [T_r, Hq, D]
        if total > t_r:
            out = torch.cat([out, out.new_zeros((total - t_r, *out.shape[1:]))])
        out = out.reshape(total, -1)
        return out if thd else out.unsqueeze(1)
