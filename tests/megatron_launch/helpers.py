"""Shared pieces of the launcher tests: a Megatron-like namespace and the repo paths."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
H100_YAML = REPO / "configs" / "clusters" / "h100.yaml"
A800_YAML = REPO / "configs" / "clusters" / "a800.yaml"


def megatron_namespace(**overrides: Any) -> argparse.Namespace:
    """The attributes Megatron's parser gives a typical Llama-7B Zeppelin run (4 x 8 GPUs, TP 1)."""
    base: dict[str, Any] = dict(
        zeppelin=True, zeppelin_cluster=f"4x8@{H100_YAML}", zeppelin_profile=None, zeppelin_tokens_per_gpu=None,
        zeppelin_routing=True, zeppelin_remap=None, zeppelin_remap_auto=False, zeppelin_backend=None,
        zeppelin_check_plan=True,
        zeppelin_placements="local,intra_node,inter_node", zeppelin_slack=0.02, zeppelin_min_ratio=1.0,
        zeppelin_prefetch=2, zeppelin_metrics=True,
        num_layers=32, hidden_size=4096, num_attention_heads=32, group_query_attention=False,
        num_query_groups=1, ffn_hidden_size=11008, swiglu=True, kv_channels=None, vocab_size=None,
        padded_vocab_size=None, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        context_parallel_size=1, expert_model_parallel_size=1, num_experts=None, sequence_parallel=False,
        micro_batch_size=1, global_batch_size=64, seq_length=32768, dataloader_type="external",
        calculate_per_token_loss=True, data_path=["/data/corpus_text_document"], train_data_path=None,
        valid_data_path=None, test_data_path=None, eval_iters=0, eval_interval=1000, spec=None,
        attention_backend=None, position_embedding_type="rope", use_legacy_models=False,
    )
    base.update(overrides)
    return argparse.Namespace(**base)
