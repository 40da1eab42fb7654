"""What Zeppelin's core attention computes, as rules on Megatron's settings (pure: no Megatron or torch import).

One list of rules serves the start-up check (:func:`~.run_shape.check_megatron_args`, on Megatron's parsed
arguments, before ``torch.distributed`` starts) and the model itself (:func:`~.attention.check_config`, on the
``TransformerConfig`` a layer is built with, whoever builds it): causal softmax attention within each document, no
dropout, no sliding window, no attention sinks, no context parallelism. Both objects carry the same attribute names,
so ``attention_problems(args)`` and ``attention_problems(config)`` read the same settings.
"""

from __future__ import annotations

from typing import Any

__all__ = ["attention_problems"]


def attention_problems(settings: Any, *, attention_dropout: float | None = None) -> list[str]:
    """Why Zeppelin's attention cannot run ``settings`` (Megatron's args or a ``TransformerConfig``), one message per
    setting, naming its flag and value; ``[]`` when it can. ``attention_dropout``: a layer's own dropout, which
    overrides the config's (megatron-core's ``DotProductAttention`` argument).

    Example: Megatron's default ``--attention-dropout 0.1`` gives ``["--attention-dropout 0.1: Zeppelin attention
    has no attention dropout; set --attention-dropout 0.0"]``.
    """
    problems: list[str] = []
    dropout = getattr(settings, "attention_dropout", 0.0) if attention_dropout is None else attention_dropout
    if dropout:
        problems.append(f"--attention-dropout {dropout}: Zeppelin attention has no attention dropout; set "
                        "--attention-dropout 0.0")
    window = getattr(settings, "window_size", None)
    if window is not None:
        problems.append(f"--window-size {window}: sliding-window attention is not supported with --zeppelin (its "
                        "attention is causal over each whole document)")
    softmax = getattr(settings, "softmax_type", "vanilla") or "vanilla"
    if softmax != "vanilla":
        problems.append(f"--softmax-type {softmax}: attention sinks are not supported with --zeppelin (only "
                        "'vanilla')")
    cp = getattr(settings, "context_parallel_size", 1) or 1
    if cp != 1:
        problems.append(f"--context-parallel-size {cp}: Zeppelin replaces context parallelism (it splits long "
                        "sequences itself over its ranks); use 1")
    return problems
