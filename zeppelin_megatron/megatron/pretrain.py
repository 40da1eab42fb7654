"""Zeppelin's parts for Megatron-LM's ``pretrain()``: start-up check, layer spec, model builder, data, forward step.

Used by ``scripts/pretrain_gpt_zeppelin.py`` and by a ``pretrain_gpt.py``
patched with ``patches/pretrain_gpt.patch``; both call
:func:`run_pretrain_gpt` with Megatron-LM's ``pretrain_gpt`` module, which
drives the ``pretrain()`` of that checkout in the calling convention it has
(:func:`pretrain_convention`):

* ``"args"`` (core_v0.16.x, core_v0.17.x): Megatron parses inside ``pretrain``::

      pretrain(train_valid_test_datasets_provider, partial(model_provider, zeppelin_gpt_builder),
               ModelType.encoder_or_decoder, forward_step,
               args_defaults=..., extra_args_provider=extra_args_provider(...), ...)

* ``"container"`` (core_v0.18.x): arguments are parsed first
  (``parse_and_validate_args`` with our ``extra_args_provider``), then
  ``pretrain(pretrain_cfg_container_from_args(args), provider,
  partial(model_provider, zeppelin_gpt_builder), ModelType..., forward_step, ...)``;
* ``"model-config"`` (core_v0.19.x, main): the container carries a
  ``GPTModelConfig`` (``gpt_config_from_args``) and Megatron's
  ``GPTModelBuilder`` builds the model; ``model_provider`` is not used. The
  Zeppelin spec reaches the model through that config
  (:func:`use_zeppelin_model`): ``model_cfg.transformer_layer_spec`` is
  :func:`zeppelin_layer_spec` (the builder calls it with the config and
  ``vp_stage``), and :func:`prepare_model_chunks` is appended to
  ``model_cfg.pre_wrap_hooks`` (the builder runs it on the bare model chunks
  before the Float16/DDP wrappers) to install the RoPE hook.

Start-up, in order (all before the first training step):

1. :func:`~.startup.check_startup` (every rank, before Megatron parses): adds
   ``--calculate-per-token-loss`` and ``--dataloader-type external`` when
   absent, parses the command line with Megatron's parser plus ours, and runs
   every Zeppelin check (flags, parallelism, data paths, cluster vs. world
   size, profile, capacity). On error it prints what is wrong and exits 2.
2. Megatron's argument parsing and ``validate_args`` (inside ``pretrain`` or
   before it), then ``initialize_megatron`` (distributed init).
3. Megatron's first call into our code when it builds the model
   (:func:`zeppelin_gpt_builder`, or :func:`zeppelin_layer_spec` on the
   model-config path): runs the checks again on Megatron's validated
   arguments, creates the Zeppelin process group (collective), then the GPT
   is built with Zeppelin's layer spec.
4. :func:`train_valid_test_datasets_provider`: one :class:`ZeppelinDataIterator`
   per split (``--dataloader-type external`` hands it to the training loop),
   resuming at ``consumed_train_samples``.

The ``megatron.training`` imports are inside the functions: this module
imports with megatron-core alone (CI), and needs the Megatron-LM checkout only
when the functions run.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, Callable, Iterator, Sequence

import torch

from .arguments import ZeppelinArgsError
from .metrics import MetricsWriter, StepMetricsRecorder
from .planning import ZeppelinSetup
from .startup import (
    ARGS_DEFAULTS,
    REQUIRED_FLAGS,
    check_startup,
    env_int,
    extra_args_provider,
    prepare_argv,
    setup_from_args,
)

__all__ = [
    "REQUIRED_FLAGS",
    "ARGS_DEFAULTS",
    "prepare_argv",
    "setup_from_args",
    "check_startup",
    "extra_args_provider",
    "pretrain_convention",
    "run_pretrain_gpt",
    "zeppelin_layer_spec",
    "prepare_model_chunks",
    "use_zeppelin_model",
    "zeppelin_gpt_builder",
    "build_zeppelin_gpt",
    "train_valid_test_datasets_provider",
    "forward_step",
    "loss_func",
]

# -- driving Megatron-LM's pretrain() -------------------------------------------------------


def pretrain_convention(pretrain: Callable[..., Any]) -> str:
    """How a Megatron-LM ``pretrain`` is called: ``"args"``, ``"container"`` or ``"model-config"``.

    * ``"args"`` (core_v0.16, core_v0.17): ``pretrain(datasets_provider, model_provider,
      model_type, forward_step, extra_args_provider=..., args_defaults=...)``, parsing inside;
    * ``"container"`` (core_v0.18): ``pretrain(cfg_container, datasets_provider,
      model_provider, model_type, forward_step, ...)``, arguments parsed before;
    * ``"model-config"`` (core_v0.19, main): ``pretrain(cfg_container, datasets_provider,
      model_type, forward_step, ..., model_provider=None)``; the container's model config
      builds the model.
    """
    params = list(inspect.signature(pretrain).parameters)
    if "extra_args_provider" in params:
        return "args"
    if len(params) > 2 and params[2] == "model_provider":
        return "container"
    if "model_type" in params:
        return "model-config"
    raise ZeppelinArgsError(f"unknown Megatron-LM pretrain() signature {params}; Zeppelin supports "
                            "core_v0.16 - core_v0.19 and main (see patches/README.md)")


def run_pretrain_gpt(pretrain_gpt: ModuleType, argv: Sequence[str] | None = None, *,
                     program_start: float | None = None) -> None:
    """Run Megatron-LM's ``pretrain()`` with Zeppelin's parts, as ``pretrain_gpt.py`` would.

    ``pretrain_gpt``: Megatron-LM's ``pretrain_gpt`` module (imported by the
    launcher, or ``sys.modules['__main__']`` in a patched ``pretrain_gpt.py``):
    its ``pretrain``, ``model_provider``, ``get_embedding_ranks``,
    in-process restart wrapper and ModelOpt hooks are used as that version
    uses them. ``argv`` defaults to ``sys.argv``; it is checked
    (:func:`check_startup`, exit 2 on an unservable configuration) and
    ``sys.argv`` set to the checked argv before Megatron parses it.
    """
    from megatron.core.enums import ModelType

    main_entry = time.time()
    m = pretrain_gpt
    modelopt = m.add_modelopt_args if getattr(m, "has_nvidia_modelopt", False) else None
    sys.argv = check_startup(list(sys.argv if argv is None else argv), other_args_provider=modelopt)

    timestamps = getattr(m, "set_startup_timestamps", None)
    if timestamps is not None:
        timestamps(program_start=program_start if program_start is not None
                   else getattr(m, "_PROGRAM_START_TIME", main_entry), main_entry=main_entry)
    pretrain = m.pretrain
    convention = pretrain_convention(pretrain)
    if os.environ.get("RANK", "0") in ("0", ""):
        print(f"zeppelin: Megatron-LM pretrain() convention: {convention} ({m.__file__})", flush=True)
    store = None
    restart = getattr(m, "inprocess_restart", None)
    if restart is not None:
        pretrain, store = restart.maybe_wrap_for_inprocess_restart(pretrain)
    common: dict[str, Any] = {"store": store}
    if hasattr(m, "get_embedding_ranks"):
        common["get_embedding_ranks"] = m.get_embedding_ranks
    provider = train_valid_test_datasets_provider
    if convention == "args":
        pretrain(provider, partial(m.model_provider, zeppelin_gpt_builder), ModelType.encoder_or_decoder,
                 forward_step, args_defaults=dict(ARGS_DEFAULTS), extra_args_provider=extra_args_provider(modelopt),
                 **common)
        return
    from megatron.training import argument_utils
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args(extra_args_provider=extra_args_provider(modelopt), args_defaults=dict(ARGS_DEFAULTS))
    if convention == "container":
        cfg = argument_utils.pretrain_cfg_container_from_args(args)
        pretrain(cfg, provider, partial(m.model_provider, zeppelin_gpt_builder), ModelType.encoder_or_decoder,
                 forward_step, **common)
        return
    if modelopt is not None and hasattr(m, "maybe_enable_modelopt"):
        m.maybe_enable_modelopt(args)
    if modelopt is not None and getattr(args, "modelopt_enabled", False):
        model_cfg = argument_utils.gpt_config_from_args(args, model_config_cls=m.ModelOptModelConfig)
    else:
        model_cfg = argument_utils.gpt_config_from_args(args)
    cfg = argument_utils.pretrain_cfg_container_from_args(args, use_zeppelin_model(model_cfg))
    pretrain(cfg, provider, ModelType.encoder_or_decoder, forward_step, **common)


# -- run state: built once, on Megatron's first call into our code -----------------------------


@dataclass(frozen=True, kw_only=True)
class _Run:
    setup: ZeppelinSetup
    group: Any  # runtime.group.ZeppelinGroup
    recorder: StepMetricsRecorder | None


_RUN: _Run | None = None


def _run() -> _Run:
    """The run's setup and Zeppelin group (collective on first call: every rank must reach it)."""
    global _RUN
    if _RUN is not None:
        return _RUN
    from megatron.training import get_args, get_tensorboard_writer, get_wandb_writer, print_rank_0, print_rank_last

    from .groups import zeppelin_group_from_megatron

    args = get_args()
    setup = setup_from_args(args, world_size=args.world_size,
                            local_world_size=env_int(os.environ, "LOCAL_WORLD_SIZE"))
    group = zeppelin_group_from_megatron(setup.parallel.gpus_per_node, setup.config.timeout)  # --zeppelin-timeout
    if (group.size, group.gpus_per_node) != (setup.cluster.world_size, setup.cluster.gpus_per_node):
        raise ZeppelinArgsError(
            f"the Zeppelin process group has {group.size} ranks, {group.gpus_per_node} per node, but the "
            f"planner's cluster has {setup.cluster.world_size}, {setup.cluster.gpus_per_node} per node"
        )
    recorder = None
    if setup.config.metrics:
        writer = MetricsWriter(log=print_rank_last, tensorboard=get_tensorboard_writer(), wandb=get_wandb_writer(),
                               log_interval=max(1, args.log_interval),
                               scalar_interval=max(1, getattr(args, "tensorboard_log_interval", 1) or 1))
        sync = torch.cuda.synchronize if torch.cuda.is_available() else None
        recorder = StepMetricsRecorder(schedule=setup.parallel.schedule, writer=writer, sync=sync)
    print_rank_0(setup.describe())
    _RUN = _Run(setup=setup, group=group, recorder=recorder)
    return _RUN


# -- model ----------------------------------------------------------------------------------


def zeppelin_spec_from_args(args: argparse.Namespace) -> Any:
    """Megatron's GPT layer spec for ``args`` (local or Transformer Engine modules by
    ``--transformer-impl``; ``--normalization``, ``--qk-layernorm``, ``--qk-l2-norm``) with
    Zeppelin's core attention."""
    from .spec import get_gpt_layer_zeppelin_spec

    impl = args.transformer_impl
    if impl not in ("local", "transformer_engine"):
        raise ZeppelinArgsError(f"--transformer-impl {impl}: Zeppelin supports local and transformer_engine")
    kwargs: dict[str, Any] = {"qk_layernorm": args.qk_layernorm, "qk_l2_norm": getattr(args, "qk_l2_norm", False)}
    if impl == "local":
        kwargs["normalization"] = args.normalization
    return get_gpt_layer_zeppelin_spec(use_te=impl == "transformer_engine", **kwargs)


def build_zeppelin_gpt(args: argparse.Namespace, pre_process: bool = True, post_process: bool = True,
                       vp_stage: int | None = None, config: Any = None, pg_collection: Any = None) -> Any:
    """A megatron-core ``GPTModel`` from Megatron's ``args`` with Zeppelin's layer spec, prepared.

    The dense path of Megatron-LM's ``gpt_builder`` (core_v0.16.1 - core_v0.18)
    with the layer spec of :func:`zeppelin_spec_from_args`; the features that
    path has and Zeppelin rejects (MoE, MLA, MTP, legacy models, heterogeneous
    layers) were refused at start-up.
    """
    from megatron.core.models.gpt import GPTModel
    from megatron.training.arguments import core_transformer_config_from_args

    from .step import prepare_model

    if config is None:
        config = core_transformer_config_from_args(args)
    spec = zeppelin_spec_from_args(args)
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
        rope_scaling=args.use_rope_scaling,
        vp_stage=vp_stage,
        pg_collection=pg_collection,
    )
    prepare_model(model)
    return model


def zeppelin_gpt_builder(args: argparse.Namespace, pre_process: bool = True, post_process: bool = True,
                         vp_stage: int | None = None, config: Any = None, pg_collection: Any = None) -> Any:
    """Model builder for Megatron-LM's ``model_provider`` (``partial(model_provider, zeppelin_gpt_builder)``).

    First runs the start-up checks on Megatron's validated args and creates the
    Zeppelin group (every rank calls the model provider, so the collective is safe).
    """
    from megatron.training import print_rank_0

    _run()
    print_rank_0("building GPT model with Zeppelin attention ...")
    return build_zeppelin_gpt(args, pre_process, post_process, vp_stage, config=config, pg_collection=pg_collection)


def zeppelin_layer_spec(model_config: Any = None, vp_stage: int | None = None) -> Any:
    """``GPTModelConfig.transformer_layer_spec`` for the model-config path (core_v0.19 on).

    Megatron's ``GPTModelBuilder.build_model`` calls it (every rank, once per
    model chunk) after ``initialize_megatron``: it runs the start-up checks on
    Megatron's validated args, creates the Zeppelin group (collective; first
    call only) and returns the Zeppelin layer spec for those args. The builder
    then builds the GPTModel itself (vocabulary padding, MTP, RoPE options stay
    Megatron's).
    """
    from megatron.training import get_args, print_rank_0

    _run()
    print_rank_0("building GPT model with Zeppelin attention (Megatron's GPTModelBuilder) ...")
    return zeppelin_spec_from_args(get_args())


def prepare_model_chunks(models: Any) -> Any:
    """Pre-wrap hook (``ModelConfig.pre_wrap_hooks``): :func:`~.step.prepare_model` on the bare
    model chunks (RoPE hook, attention modules recorded); returns them unchanged."""
    from .step import prepare_model

    prepare_model(models)
    return models


def use_zeppelin_model(model_config: Any) -> Any:
    """Make a Megatron ``GPTModelConfig`` build Zeppelin's model; returns it.

    Sets ``transformer_layer_spec`` to :func:`zeppelin_layer_spec` and appends
    :func:`prepare_model_chunks` to ``pre_wrap_hooks`` (once).
    """
    if not hasattr(model_config, "transformer_layer_spec") or not hasattr(model_config, "pre_wrap_hooks"):
        raise ZeppelinArgsError(
            f"{type(model_config).__name__} has no transformer_layer_spec / pre_wrap_hooks: this Megatron-LM's "
            "model config is not the GPTModelConfig Zeppelin knows (core_v0.19 - main)")
    model_config.transformer_layer_spec = zeppelin_layer_spec
    if prepare_model_chunks not in model_config.pre_wrap_hooks:
        model_config.pre_wrap_hooks.append(prepare_model_chunks)
    return model_config


# -- data -----------------------------------------------------------------------------------


def train_valid_test_datasets_provider(train_val_test_num_samples: Sequence[int], vp_stage: int | None = None
                                       ) -> tuple[Any, Any, Any]:
    """Megatron datasets provider returning Zeppelin iterators (``--dataloader-type external``).

    Every rank (each TP rank too) builds the same deterministic iterator and
    keeps its own linear-layout tokens, so nothing is broadcast. Train resumes
    at micro-step ``consumed_train_samples // (micro_batch_size * N)`` (under ``--phase-transition-iterations`` the
    current phase's samples, :func:`~.run_shape.train_data_consumed`), after Megatron's batch schedule is checked
    for the steps to come (:meth:`~.run_shape.ZeppelinParallel.schedule_from`);
    validation at ``consumed_valid_samples``; test from 0. The sources: :func:`~.data.sources.data_sources`
    (``--data-path`` / ``--data-args-path`` split by ``--split``, each dataset of a blend alike; per-split paths or
    ``--per-split-data-args-path`` whole; ``--mock-data``: megatron-core's mock documents split 1,1,1; docs/data.md,
    "Splits"); validation and test only with ``--eval-iters`` > 0.
    ``--eod-mask-loss``: no loss where the input is the tokenizer's end-of-document token, as Megatron's dataset.
    """
    from megatron.training import get_args, get_tokenizer, print_rank_0

    from .data.build import build_iterator
    from .data.indexed import EmptySplitError
    from .run_shape import data_sources_from_args, train_data_consumed

    run = _run()
    args = get_args()
    rank = run.group.rank
    print_rank_0("> building Zeppelin data iterators ...")
    sources = data_sources_from_args(args)  # the start-up checks have read the same flags the same way
    eod = int(get_tokenizer().eod) if getattr(args, "eod_mask_loss", False) else None  # Megatron's --eod-mask-loss
    consumed = [train_data_consumed(args), args.consumed_valid_samples, 0]  # the phase's, under phase transitions
    p = run.setup.parallel
    schedule = p.schedule_from(  # refuses what Megatron would fail on
        iteration=getattr(args, "iteration", 0) or 0, consumed_samples=args.consumed_train_samples,
        train_iters=getattr(args, "train_iters", None))
    if run.recorder is not None:
        run.recorder.follow(schedule, micro_step_offset=(args.consumed_train_samples - consumed[0])
                            // p.samples_per_micro_step)
    out: list[Any] = []
    for k, (source, done) in enumerate(zip((sources.train, sources.valid, sources.test), consumed)):
        it = None
        if source is not None and (k == 0 or args.eval_iters > 0):
            words, share = source
            try:
                it = build_iterator(words, setup=run.setup, rank=rank, consumed_samples=done, seed=args.seed,
                                    split=share, eod_mask_token=eod)
            except EmptySplitError as exc:
                if k == 0:
                    raise
                print_rank_0(f"zeppelin data: no {('validation', 'test')[k - 1]} set ({exc})")
        out.append(it)
    return out[0], out[1], out[2]


train_valid_test_datasets_provider.is_distributed = True  # type: ignore[attr-defined]
"""Every rank builds its iterator (Megatron otherwise builds data on TP rank 0 only)."""


# -- forward step ---------------------------------------------------------------------------


def _unwrap(model: Any) -> torch.nn.Module:
    """The GPTModel inside Megatron's wrappers (DDP, Float16Module: each keeps it as ``.module``)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor, model: Any = None
              ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss for ``--calculate-per-token-loss``: ``(sum of masked losses, tokens, report)``.

    ``output_tensor`` and ``loss_mask`` are ``[1, T]``. Megatron sums both parts
    over micro-steps and ranks and divides once by the global token count.
    """
    from .loss import per_token_loss

    loss, num_tokens = per_token_loss(output_tensor, loss_mask)
    report = {"lm loss": torch.cat([loss.detach().view(1), num_tokens.view(1).to(loss.dtype)])}
    try:
        from megatron.training import get_args
        from megatron.core.rerun_state_machine import get_rerun_state_machine
        args = get_args()
    except (ImportError, AssertionError):  # no Megatron-LM globals (unit use)
        return loss, num_tokens, report
    if getattr(args, "check_for_nan_in_loss_and_grad", False):
        machine = get_rerun_state_machine()
        for reject, what in ((torch.isnan, "NaN"), (torch.isinf, "Inf")):
            machine.validate_result(result=loss, rejection_func=reject,
                                    message=f"found {what} in local forward loss calculation",
                                    tolerance=0.0, fatal=True)
    return loss, num_tokens, report


def forward_step(data_iterator: Iterator[Any], model: Any, return_schedule_plan: bool = False
                 ) -> tuple[torch.Tensor, Callable[..., Any]]:
    """Megatron ``forward_step_func``: next Zeppelin batch, bind its plan, run the model.

    ``batch.tokens`` etc. are ``[1, T]`` (this rank's linear-layout tokens,
    padded to the TP size under sequence parallelism); the model returns the
    per-token losses ``[1, T]``.
    """
    from megatron.training import get_timers

    from .step import ZeppelinStep, bind_step

    if return_schedule_plan:
        raise ZeppelinArgsError("--overlap-moe-expert-parallel-comm (schedule plans) is not supported with --zeppelin")
    run = _run()
    cfg = run.setup.config
    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    batch = next(data_iterator)
    inner = _unwrap(model)
    device = next(inner.parameters()).device
    tokens, labels, loss_mask, position_ids = (
        t.to(device, non_blocking=True) for t in (batch.tokens, batch.labels, batch.loss_mask, batch.position_ids)
    )
    timers("batch-generator").stop()
    if inner.training and run.recorder is not None:
        run.recorder.record(batch.step, batch.plan)
    bind_step(inner, ZeppelinStep(plan=batch.plan, group=run.group, position_ids=position_ids[0],
                                  real_tokens=batch.real_tokens, backend=cfg.backend, routing=cfg.routing,
                                  check_plan=cfg.check_plan))
    output = model(tokens, position_ids, None, labels=labels, loss_mask=loss_mask)
    return output, partial(loss_func, loss_mask)
