"""Bind one micro-step's plan and token positions to a built Megatron GPT model.

Megatron builds a model once; Zeppelin's layout changes every micro-step. The
pieces that need the layout read it from a :class:`ZeppelinStep` that
:func:`bind_step` hands them before each forward:

* every :class:`~zeppelin_megatron.megatron.attention.ZeppelinCoreAttention`
  (plan, group, kernel options);
* the model's rotary embedding (RoPE), through a forward hook installed by
  :func:`prepare_model` that returns the frequencies of each token's *true*
  position in its sequence instead of ``0 .. T-1``.

Learned absolute position embeddings need nothing: they read the
``position_ids`` the model is called with, which the data pipeline sets to the
same true positions.

Usage (what ``forward_step`` does)::

    prepare_model(model)                        # once, after the model is built
    bind_step(model, ZeppelinStep(plan=..., group=..., position_ids=pos, real_tokens=t))
    output = model(tokens, position_ids, None, labels=labels)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..planner.plan import StepPlan
from ..runtime.group import ZeppelinGroup
from .attention import ZeppelinCoreAttention

__all__ = ["ZeppelinStep", "prepare_model", "bind_step", "ZeppelinBindingError"]


class ZeppelinBindingError(RuntimeError):
    """A model that was not prepared for Zeppelin, or a step that does not fit it."""


@dataclass(frozen=True, kw_only=True)
class ZeppelinStep:
    """What one micro-step of one rank needs besides the token tensors.

    ``plan``: the micro-step's plan (identical on every rank of ``group``).
    ``position_ids``: int64 [T] on the model's device, the true position of each
    of this rank's tokens in its sequence (padding: 0). ``real_tokens``: T_r =
    ``plan.tokens(rank, "linear")``; tokens ``T_r .. T-1`` are padding added for
    sequence parallelism and are left out of attention. ``backend``: kernel name
    or None (best available). ``routing``: execute the plan's proxy routes.
    ``check_plan``: verify plan agreement across ranks once per attention call.
    """

    plan: StepPlan
    group: ZeppelinGroup
    position_ids: torch.Tensor
    real_tokens: int
    backend: str | None = None
    routing: bool = True
    check_plan: bool = True

    def __post_init__(self) -> None:
        if self.position_ids.dim() != 1 or self.position_ids.dtype != torch.int64:
            raise ZeppelinBindingError(
                f"position_ids must be int64 [T], got {self.position_ids.dtype} {tuple(self.position_ids.shape)}"
            )
        expected = self.plan.tokens(self.group.rank, "linear")
        if self.real_tokens != expected:
            raise ZeppelinBindingError(
                f"rank {self.group.rank}: real_tokens={self.real_tokens} but the plan's linear layout gives this "
                f"rank {expected} tokens"
            )
        if self.position_ids.shape[0] < self.real_tokens:
            raise ZeppelinBindingError(
                f"position_ids has {self.position_ids.shape[0]} entries, fewer than real_tokens={self.real_tokens}"
            )


class _RotaryHook:
    """Forward hook on a Megatron ``RotaryEmbedding``: frequencies at the step's positions.

    Megatron calls ``rotary_pos_emb(T)`` and gets ``emb`` [T, 1, 1, rot_dim] for
    positions ``0 .. T-1``; the hook replaces it with ``get_emb(max_pos + 1)``
    gathered at ``position_ids`` so row ``i`` rotates token ``i`` by its true
    position. Example: a rank holding tokens 4096..8191 of a long sequence gets
    rows 4096..8191 of the table, not rows 0..4095.
    """

    def __init__(self) -> None:
        self.step: ZeppelinStep | None = None
        self._cache: tuple[ZeppelinStep, torch.Tensor] | None = None

    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        step = self.step
        if step is None:
            raise ZeppelinBindingError("the model's rotary embedding ran before bind_step(model, step)")
        seq_len = int(args[0]) if args else output.shape[0]
        pos = step.position_ids
        if seq_len != pos.shape[0]:
            raise ZeppelinBindingError(
                f"the model asked for rotary embeddings of {seq_len} tokens but the bound step has "
                f"{pos.shape[0]} position ids"
            )
        if self._cache is not None and self._cache[0] is step:
            return self._cache[1]
        table = module.get_emb(int(pos.max()) + 1 if pos.numel() else 1)  # [P, 1, 1, rot_dim]
        emb = table.index_select(0, pos.to(table.device))
        self._cache = (step, emb)
        return emb


@dataclass(kw_only=True)
class _Binding:
    attention: list[ZeppelinCoreAttention]
    rotary: list[_RotaryHook]


def _chunks(model: Any) -> list[torch.nn.Module]:
    """The model chunks of ``model`` (a module or a list of them), each without Megatron's
    wrappers (DDP and Float16Module keep the wrapped module as ``.module``)."""
    out = []
    for chunk in model if isinstance(model, (list, tuple)) else [model]:
        while isinstance(getattr(chunk, "module", None), torch.nn.Module):
            chunk = chunk.module
        out.append(chunk)
    return out


def prepare_model(model: Any) -> None:
    """Install Zeppelin's rotary hook and record its attention modules; idempotent.

    ``model``: a GPT model or a list of model chunks, bare or inside Megatron's wrappers.

    Raises :class:`ZeppelinBindingError` when the model has no
    :class:`ZeppelinCoreAttention` (it was not built with a Zeppelin spec) or
    uses a rotary variant Zeppelin does not support (YaRN, mRoPE, MLA).
    """
    for chunk in _chunks(model):
        if getattr(chunk, "_zeppelin_binding", None) is not None:
            continue
        attention = [m for m in chunk.modules() if isinstance(m, ZeppelinCoreAttention)]
        if not attention:
            raise ZeppelinBindingError(
                "the model has no ZeppelinCoreAttention: build it with "
                "zeppelin_megatron.megatron.spec.get_gpt_layer_zeppelin_spec (or --spec "
                "zeppelin_megatron.megatron.spec zeppelin_layer_spec)"
            )
        hooks: list[_RotaryHook] = []
        for m in chunk.modules():
            kind = getattr(m, "position_embedding_type", None)
            if kind in ("yarn", "mrope") or (kind == "rope" and getattr(m.config, "multi_latent_attention", False)):
                raise ZeppelinBindingError(f"position_embedding_type={kind!r} is not supported by Zeppelin")
            rope = getattr(m, "rotary_pos_emb", None)
            if kind == "rope" and isinstance(rope, torch.nn.Module):
                hook = _RotaryHook()
                rope.register_forward_hook(hook)
                hooks.append(hook)
        chunk._zeppelin_binding = _Binding(attention=attention, rotary=hooks)


def bind_step(model: Any, step: ZeppelinStep) -> None:
    """Hand ``step`` to every Zeppelin-aware module of ``model`` (call before each forward)."""
    for chunk in _chunks(model):
        binding: _Binding | None = getattr(chunk, "_zeppelin_binding", None)
        if binding is None:
            raise ZeppelinBindingError("call prepare_model(model) once before bind_step")
        for i, att in enumerate(binding.attention):
            att.step = step
            # Plan agreement needs one collective per micro-step, not one per layer: every rank runs the
            # layers in the same order, so checking in the first one catches a divergence on all ranks.
            att.checks_plan = i == 0
        for hook in binding.rotary:
            hook.step = step
