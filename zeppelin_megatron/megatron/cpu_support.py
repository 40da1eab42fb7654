"""Running a small megatron-core GPT on CPU with gloo: for ``zeppelin demo`` and the tests only.

Never used on the GPU path. megatron-core assumes CUDA in a few helpers; this
module is the one place that works around them:

* ``torch.cuda.current_device()`` is asked for a device by the rotary embedding
  and the global memory buffer: it returns ``"cpu"`` inside :func:`megatron_on_cpu`;
* the CUDA RNG tracker's ``fork()`` (attention dropout, TP weight init) becomes a
  no-op context;
* activation recomputation (``tensor_parallel.checkpoint``) saves and restores the
  CPU RNG state only: the CUDA RNG state it also keeps becomes an empty tensor;
* models are built with ``use_cpu_initialization=True`` and called directly:
  Megatron's schedules and DDP wrapper need CUDA, so callers all-reduce
  gradients themselves (:func:`allreduce_grads`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed as dist

__all__ = ["megatron_on_cpu", "init_parallel_state", "tiny_gpt_config", "build_gpt", "allreduce_grads",
           "causal_mask"]


@contextlib.contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """Patch megatron-core's CUDA assumptions for the duration of the block."""
    from megatron.core.tensor_parallel import random as tp_random

    tracker = tp_random.get_cuda_rng_tracker()
    saved_device, saved_fork = torch.cuda.current_device, tracker.fork
    saved_rng = tp_random._get_cuda_rng_state, tp_random._set_cuda_rng_state
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    tracker.fork = lambda *a, **k: contextlib.nullcontext()  # type: ignore[method-assign]
    tp_random._get_cuda_rng_state = lambda *a, **k: torch.empty(0, dtype=torch.uint8)
    tp_random._set_cuda_rng_state = lambda *a, **k: None
    try:
        yield
    finally:
        torch.cuda.current_device = saved_device  # type: ignore[assignment]
        tracker.fork = saved_fork  # type: ignore[method-assign]
        tp_random._get_cuda_rng_state, tp_random._set_cuda_rng_state = saved_rng


def init_parallel_state(tensor_parallel: int = 1) -> None:
    """Megatron's parallel state over the initialised (gloo) default group: TP x DP, no PP/CP."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel)


def tiny_gpt_config(**overrides: Any) -> Any:
    """A float32 TransformerConfig for a small GPT on CPU (GQA, RoPE-ready, no dropout)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw: dict[str, Any] = dict(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=128,
        use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0, bias_dropout_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        apply_rope_fusion=False, params_dtype=torch.float32,
    )
    kw.update(overrides)
    if dist.is_initialized():
        from megatron.core import parallel_state

        kw.setdefault("tensor_model_parallel_size", parallel_state.get_tensor_model_parallel_world_size())
        kw.setdefault("sequence_parallel", False)
    return TransformerConfig(**kw)


def build_gpt(config: Any, layer_spec: Any, *, vocab_size: int, max_sequence_length: int,
              position_embedding_type: str = "rope") -> Any:
    """A megatron-core GPTModel (pre- and post-process on this rank: no pipeline)."""
    from megatron.core.models.gpt import GPTModel

    return GPTModel(config=config, transformer_layer_spec=layer_spec, vocab_size=vocab_size,
                    max_sequence_length=max_sequence_length, position_embedding_type=position_embedding_type)


def allreduce_grads(model: torch.nn.Module, group: dist.ProcessGroup | None) -> None:
    """Sum every parameter's gradient over ``group`` (Megatron's DDP does this on GPUs)."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)


def causal_mask(length: int) -> torch.Tensor:
    """[1, 1, L, L] bool, True where a query may NOT attend (Megatron's mask convention)."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)[None, None]
