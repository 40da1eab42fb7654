"""GPT layer specs with Zeppelin's core attention (Megatron's local and Transformer Engine specs).

``get_gpt_layer_zeppelin_spec`` takes Megatron's own layer spec and swaps one
leaf: ``self_attention.submodules.core_attention``. Everything else (linear
layers, norms, MLP or MoE, bias-dropout-add) stays Megatron's.

Module-level specs for ``--spec`` (Megatron imports ``vars(module)[name]``)::

    --spec zeppelin_megatron.megatron.spec zeppelin_layer_spec          # local, LayerNorm
    --spec zeppelin_megatron.megatron.spec zeppelin_rmsnorm_layer_spec  # local, RMSNorm (Llama)
    --spec zeppelin_megatron.megatron.spec zeppelin_te_layer_spec       # Transformer Engine (if installed)
"""

from __future__ import annotations

import copy
from typing import Any

from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.spec_utils import ModuleSpec

from .attention import ZeppelinCoreAttention

__all__ = ["get_gpt_layer_zeppelin_spec", "with_zeppelin_attention", "zeppelin_layer_spec",
           "zeppelin_rmsnorm_layer_spec"]


def with_zeppelin_attention(spec: ModuleSpec) -> ModuleSpec:
    """A copy of a GPT *layer* spec whose self-attention's core attention is Zeppelin's."""
    out = copy.deepcopy(spec)
    try:
        attn = out.submodules.self_attention.submodules
        attn.core_attention  # noqa: B018 - must exist
    except AttributeError:
        raise ValueError(
            f"{getattr(spec.module, '__name__', spec.module)} spec has no self_attention.core_attention to replace "
            "(Zeppelin needs a GPT transformer-layer spec; multi-latent attention is not supported)"
        ) from None
    if "MLA" in getattr(out.submodules.self_attention.module, "__name__", ""):
        raise ValueError("multi-latent attention is not supported by Zeppelin")
    attn.core_attention = ZeppelinCoreAttention
    return out


def get_gpt_layer_zeppelin_spec(*, use_te: bool = False, **kwargs: Any) -> ModuleSpec:
    """Megatron's GPT layer spec (``use_te``: Transformer Engine modules) with Zeppelin attention.

    ``kwargs`` go to ``get_gpt_layer_with_transformer_engine_spec`` /
    ``get_gpt_layer_local_spec`` unchanged (``num_experts``, ``qk_layernorm``,
    ``normalization`` for the local spec, ...); ``multi_latent_attention`` is rejected.
    """
    if kwargs.get("multi_latent_attention"):
        raise ValueError("multi-latent attention is not supported by Zeppelin")
    base = get_gpt_layer_with_transformer_engine_spec(**kwargs) if use_te else get_gpt_layer_local_spec(**kwargs)
    return with_zeppelin_attention(base)


zeppelin_layer_spec: ModuleSpec = get_gpt_layer_zeppelin_spec(use_te=False)
zeppelin_rmsnorm_layer_spec: ModuleSpec = get_gpt_layer_zeppelin_spec(use_te=False, normalization="RMSNorm")
try:  # only where Transformer Engine is installed
    import transformer_engine  # noqa: F401

    zeppelin_te_layer_spec: ModuleSpec = get_gpt_layer_zeppelin_spec(use_te=True)
    __all__.append("zeppelin_te_layer_spec")
except ImportError:
    pass
