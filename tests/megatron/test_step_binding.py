"""prepare_model / bind_step without a process group: wrappers, errors, RoPE positions."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from zeppelin_megatron.megatron.step import ZeppelinBindingError, _RotaryHook, bind_step, prepare_model  # noqa: E402


class _Wrapper(torch.nn.Module):
    """Stands in for Megatron's DDP / Float16Module: the model is ``.module``."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


def test_prepare_model_refuses_a_model_without_zeppelin_attention() -> None:
    with pytest.raises(ZeppelinBindingError, match="no ZeppelinCoreAttention"):
        prepare_model(_Wrapper(torch.nn.Linear(2, 2)))
    with pytest.raises(ZeppelinBindingError, match="call prepare_model"):
        bind_step([_Wrapper(torch.nn.Linear(2, 2))], object())  # type: ignore[arg-type]


def test_rotary_hook_gathers_true_positions() -> None:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from zeppelin_megatron.megatron.cpu_support import megatron_on_cpu

    class _Step:  # just what the hook reads
        position_ids = torch.tensor([4096, 4097, 0, 1, 2], dtype=torch.long)

    with megatron_on_cpu():
        rope = RotaryEmbedding(kv_channels=8, rotary_percent=1.0, use_cpu_initialization=True)
        hook = _RotaryHook()
        rope.register_forward_hook(hook)
        with pytest.raises(ZeppelinBindingError, match="before bind_step"):
            rope(5)
        hook.step = _Step()  # type: ignore[assignment]
        emb = rope(5)
        table = rope.get_emb(4098)
        assert emb.shape == (5, 1, 1, 8)
        assert torch.equal(emb, table[[4096, 4097, 0, 1, 2]])
        with pytest.raises(ZeppelinBindingError, match="6 tokens but the bound step has 5"):
            rope(6)


def test_prepare_and_bind_see_through_wrappers() -> None:
    from megatron.core.transformer.enums import AttnMaskType

    from zeppelin_megatron.megatron.attention import ZeppelinConfigError, ZeppelinCoreAttention
    from zeppelin_megatron.megatron.cpu_support import tiny_gpt_config

    config = tiny_gpt_config()
    inner = torch.nn.Sequential(ZeppelinCoreAttention(config, 1, AttnMaskType.causal, "self"))
    wrapped = _Wrapper(_Wrapper(inner))
    prepare_model(wrapped)
    prepare_model([wrapped])  # idempotent
    sentinel = object()
    bind_step([wrapped], sentinel)  # type: ignore[arg-type]
    assert inner[0].step is sentinel and inner[0].softmax_scale == pytest.approx(1 / 16 ** 0.5)
    with pytest.raises(ZeppelinConfigError, match="--attention-dropout 0.1: Zeppelin attention has no attention "
                       "dropout; set --attention-dropout 0.0"):
        ZeppelinCoreAttention(tiny_gpt_config(attention_dropout=0.1), 1, AttnMaskType.causal, "self")
    with pytest.raises(ZeppelinConfigError, match="--window-size \\(128, 0\\): sliding-window attention"):
        ZeppelinCoreAttention(tiny_gpt_config(window_size=(128, 0)), 1, AttnMaskType.causal, "self")
    with pytest.raises(ZeppelinConfigError, match="causal"):
        ZeppelinCoreAttention(config, 1, AttnMaskType.no_mask, "self")


def test_only_the_first_attention_layer_checks_the_plan() -> None:
    from megatron.core.transformer.enums import AttnMaskType

    from zeppelin_megatron.megatron.attention import ZeppelinCoreAttention
    from zeppelin_megatron.megatron.cpu_support import tiny_gpt_config

    config = tiny_gpt_config()
    layers = torch.nn.Sequential(*(ZeppelinCoreAttention(config, i + 1, AttnMaskType.causal, "self") for i in range(3)))
    prepare_model(layers)
    bind_step(layers, object())  # type: ignore[arg-type]
    assert [m.checks_plan for m in layers] == [True, False, False]
