"""Inert stand-ins for the megatron-core names that Megatron-LM main imports and no release has yet.

Megatron-LM main (d98e8a6, the snapshot in tests/fixtures/megatron-lm/main-d98e8a6) is
tested with the newest megatron-core on the package index (0.19.x): its
``megatron/training`` imports six names that 0.19.x lacks. :func:`install` adds them
where absent (and only those), so main's argument parsing, config container and
``pretrain()`` run up to Megatron's CUDA assertion; none of them is called before it:

* ``megatron.core.distributed.fsdp.mcore_fsdp_adapter.FullyShardedDataParallelV1`` / ``V2``
  (``isinstance`` checks on built models);
* ``megatron.core.models.gpt.experimental_attention_variant_module_specs.is_gated_delta_net_variant``
  (FLOPs report);
* ``megatron.core.telemetry.fallbacks`` (OpenTelemetry no-ops: ``trace_fn`` decorates
  functions at import time);
* ``megatron.core.post_training.modelopt.checkpointing`` (checkpoint saving with ModelOpt);
* ``args.mtp_hsm``: main's ``validate_args`` reads it; its flag is generated from a
  ``TransformerConfig`` field that 0.19.x does not have, so ``argparse.Namespace`` gets a
  class-level default ``False`` (the field's default) when the installed config lacks it.

Used only by the launch tests (``run_script.py --mcore-main-compat`` and the checkout
worker); a real main checkout brings its own ``megatron/core`` and needs none of this.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import sys
import types


def _set_missing(module: str, name: str, value: object, added: list[str]) -> None:
    mod = importlib.import_module(module)
    if not hasattr(mod, name):
        setattr(mod, name, value)
        added.append(f"{module}.{name}")


def _module(name: str, added: list[str], **attrs: object) -> None:
    try:
        importlib.import_module(name)
        return
    except ModuleNotFoundError:
        pass
    parent, _, child = name.rpartition(".")
    if parent:
        _module(parent, added)
    mod = types.ModuleType(name)
    mod.__path__ = []  # a package, so submodules can be added
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    if parent:
        setattr(sys.modules[parent], child, mod)
    added.append(name)


def _trace_fn(*_args: object, **_kwargs: object):
    return lambda fn: fn


def _not_in_this_core(*_args: object, **_kwargs: object):
    raise NotImplementedError("mcore_main_compat: not in the installed megatron-core")


def install() -> list[str]:
    """Add the missing names; return those added (empty when the installed core has them all)."""
    added: list[str] = []
    fsdp = "megatron.core.distributed.fsdp.mcore_fsdp_adapter"
    for name in ("FullyShardedDataParallelV1", "FullyShardedDataParallelV2"):
        _set_missing(fsdp, name, type(name, (), {}), added)
    _set_missing("megatron.core.models.gpt.experimental_attention_variant_module_specs",
                 "is_gated_delta_net_variant", lambda variant=None: False, added)
    _module("megatron.core.telemetry.fallbacks", added,
            is_span_group_enabled=lambda *a, **k: False,
            managed_span=lambda *a, **k: contextlib.nullcontext(),
            safe_set_span_attributes=lambda *a, **k: None,
            trace_fn=_trace_fn)
    _module("megatron.core.post_training.modelopt.checkpointing", added,
            save_modelopt_state=_not_in_this_core, save_sharded_modelopt_state=_not_in_this_core)
    from megatron.core.transformer.transformer_config import TransformerConfig

    if "mtp_hsm" not in {f.name for f in dataclasses.fields(TransformerConfig)} \
            and not hasattr(argparse.Namespace, "mtp_hsm"):
        argparse.Namespace.mtp_hsm = False  # type: ignore[attr-defined]
        added.append("argparse.Namespace.mtp_hsm")
    return added
