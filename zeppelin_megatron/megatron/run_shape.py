"""The start-up checks of Megatron's own flags for a Zeppelin run, and the run's shape (:class:`ZeppelinParallel`).

:func:`check_megatron_args` rejects Megatron settings Zeppelin cannot serve, naming flag, value and reason, and
returns the :class:`ZeppelinParallel` shape of the run. It works on a plain ``argparse.Namespace`` carrying
Megatron's attribute names (no Megatron import), so it runs before ``torch.distributed`` is initialised and in CI.

Rank arithmetic of a run (pipeline and context parallelism are rejected)::

    world = 32 GPUs on 4 nodes of 8, --tensor-model-parallel-size 2
    Zeppelin ranks N        = world / TP            = 16   (Megatron's DP ranks of one TP rank)
    Zeppelin ranks per node = gpus_per_node / TP    = 4
    micro-step token budget = micro_batch_size * seq_length * N
    micro-steps per step    = global_batch_size / (micro_batch_size * N)
                              (or as --rampup-batch-size / --step-batch-size-schedule
                              set it step by step: :mod:`.batch_schedule`)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .arguments import ZEPPELIN_SPEC_MODULE, ZeppelinArgsError
from .attention_rules import attention_problems
from .batch_schedule import RampupError, StepSchedule, parse_step_batch_size_schedule

__all__ = ["ZeppelinParallel", "check_megatron_args", "data_sources_from_args", "phase_transitions",
           "train_data_consumed"]


@dataclass(frozen=True, kw_only=True)
class ZeppelinParallel:
    """Shape of a Zeppelin run derived from Megatron's flags and the job size."""

    world_size: int
    gpus_per_node: int
    tensor_parallel: int
    micro_batch_size: int
    global_batch_size: int
    seq_length: int
    sequence_parallel: bool = False
    rampup: tuple[int, int, int] | None = None
    """``--rampup-batch-size START INCREMENT SAMPLES`` (``None``: the global batch from the first step)."""
    step_batch_size_schedule: str | None = None
    """``--step-batch-size-schedule`` as given (Megatron-LM 0.19 on; its thresholds are tokens, read with
    ``seq_length``); ``global_batch_size`` is then Megatron's default, ``micro_batch_size * N``, and unused."""
    decrease_batch_size_if_needed: bool = False
    notes: tuple[str, ...] = ()
    """What the start-up line should tell the user about how the flags were read."""
    gemm_row_align: int = 1
    """Rows a low-precision GEMM needs its input's row count to be a multiple of: 16 under ``--fp8-format``
    (32 with ``--fp8-recipe mxfp8``), 128 under ``--fp4-format`` (megatron-core's ``get_fp8_align_size`` /
    ``get_fp4_align_size``), else 1."""

    def __post_init__(self) -> None:
        for attr, what in (("world_size", "the world size (WORLD_SIZE)"),
                           ("gpus_per_node", "GPUs per node"),
                           ("tensor_parallel", "--tensor-model-parallel-size"),
                           ("micro_batch_size", "--micro-batch-size"),
                           ("global_batch_size", "--global-batch-size"),
                           ("seq_length", "--seq-length")):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ZeppelinArgsError(f"{what} must be a positive integer, got {v!r}")
        if self.world_size % self.gpus_per_node:
            raise ZeppelinArgsError(
                f"world size {self.world_size} is not a multiple of {self.gpus_per_node} GPUs per node"
            )
        if self.gpus_per_node % self.tensor_parallel:
            raise ZeppelinArgsError(
                f"--tensor-model-parallel-size {self.tensor_parallel} does not divide the "
                f"{self.gpus_per_node} GPUs of a node: Zeppelin needs whole TP groups inside a node"
            )
        per_step = self.samples_per_micro_step
        if self.global_batch_size % per_step and not self.decrease_batch_size_if_needed:
            raise ZeppelinArgsError(
                f"--global-batch-size {self.global_batch_size} is not a multiple of --micro-batch-size "
                f"{self.micro_batch_size} x {self.zeppelin_ranks} Zeppelin ranks = {per_step} (Megatron's rule; "
                "--decrease-batch-size-if-needed rounds the batch down instead)"
            )
        try:
            self.schedule  # noqa: B018 (checks the ramp-up or step schedule)
        except RampupError as exc:
            raise ZeppelinArgsError(str(exc)) from None

    @cached_property
    def schedule(self) -> StepSchedule:
        """Micro-steps per training step, step by step from a fresh start (:class:`~.batch_schedule.StepSchedule`;
        ramp-up or step schedule included; a resumed run: its ``resumed``)."""
        steps = None
        if self.step_batch_size_schedule is not None:
            steps = parse_step_batch_size_schedule(self.step_batch_size_schedule, self.seq_length)
        return StepSchedule(samples_per_micro_step=self.samples_per_micro_step,
                            global_batch_size=self.global_batch_size, rampup=self.rampup, step_batch_sizes=steps,
                            decrease_if_needed=self.decrease_batch_size_if_needed)

    def schedule_from(self, *, iteration: int, consumed_samples: int, train_iters: int | None) -> StepSchedule:
        """:attr:`schedule` from Megatron's ``iteration`` and ``consumed_train_samples`` on (a fresh run: 0, 0),
        with Megatron's run-time rules checked up to ``train_iters`` (:meth:`~.batch_schedule.StepSchedule.check`)
        before training starts."""
        try:
            schedule = self.schedule.resumed(step=iteration, consumed=consumed_samples)
            schedule.check(end_step=train_iters)
        except RampupError as exc:
            raise ZeppelinArgsError(str(exc)) from None
        return schedule

    @property
    def nodes(self) -> int:
        return self.world_size // self.gpus_per_node

    @property
    def zeppelin_ranks(self) -> int:
        """N: ranks of one Zeppelin group (Megatron's data-parallel ranks of one TP rank)."""
        return self.world_size // self.tensor_parallel

    @property
    def zeppelin_ranks_per_node(self) -> int:
        return self.gpus_per_node // self.tensor_parallel

    @property
    def samples_per_micro_step(self) -> int:
        """Megatron samples one micro-step consumes: ``mbs * N`` (what ``consumed_train_samples`` grows by)."""
        return self.micro_batch_size * self.zeppelin_ranks

    @property
    def token_budget(self) -> int:
        """Tokens of one micro-step over all Zeppelin ranks: ``mbs * seq_length * N``."""
        return self.micro_batch_size * self.seq_length * self.zeppelin_ranks

    @property
    def num_micro_batches(self) -> int:
        """Micro-steps per step (the final number under a ramp-up or step schedule)."""
        return self.schedule.micro_steps_per_step

    @property
    def pad_to_multiple(self) -> int:
        """Each rank's linear-layout rows are padded to a multiple of this: ``gemm_row_align`` (Transformer Engine
        refuses an FP8 GEMM over rows that are not a multiple of 16), times TP under sequence parallelism (which
        splits the rows over the TP ranks, each quantizing its share). Example: TP 2, ``--sequence-parallel``,
        ``--fp8-format hybrid``: a rank with 1,000 tokens runs 1,024 rows (a multiple of 32), 24 of them padding
        (no loss, in no sequence)."""
        return (self.tensor_parallel if self.sequence_parallel else 1) * self.gemm_row_align


def data_sources_from_args(args: argparse.Namespace) -> Any:
    """:func:`~.data.sources.data_sources` of Megatron's data flags in ``args`` (raises its ``DataError``)."""
    from .data.sources import data_sources  # numpy and json only: no Megatron import

    return data_sources(
        data_path=_flag(args, "data_path"), data_args_path=_flag(args, "data_args_path"),
        train_data_path=_flag(args, "train_data_path"), valid_data_path=_flag(args, "valid_data_path"),
        test_data_path=_flag(args, "test_data_path"), per_split_data_args_path=_flag(args, "per_split_data_args_path"),
        split=_flag(args, "split"), mock_data=bool(_flag(args, "mock_data", False)))


def _data_sources(args: argparse.Namespace, problems: list[str]) -> Any:
    """:func:`data_sources_from_args`, or ``None`` with its reason appended to ``problems``."""
    from .data.index_check import DataError

    try:
        return data_sources_from_args(args)
    except DataError as exc:
        problems.append(str(exc))
        return None


def _flag(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def phase_transitions(args: argparse.Namespace) -> tuple[int, ...]:
    """``--phase-transition-iterations`` (Megatron-LM 0.19 on: "1000,3000", a list once Megatron has validated the
    arguments) as sorted iterations; ``()`` without the flag."""
    value = _flag(args, "phase_transition_iterations")
    if not value:
        return ()
    words = value.split(",") if isinstance(value, str) else value
    try:
        return tuple(sorted(int(str(w).strip()) for w in words))
    except ValueError:
        raise ZeppelinArgsError(f"--phase-transition-iterations {value!r}: give iterations separated by commas, "
                                "e.g. 1000,3000") from None


def train_data_consumed(args: argparse.Namespace) -> int:
    """The training samples the training data resumes after, as Megatron's data loader counts them: its
    ``consumed_train_samples``; with ``--phase-transition-iterations`` (each phase reads its own data from the start,
    the run stopping at every transition) only the current phase's, ``(iteration - last transition at or before it)
    x --global-batch-size``. Example: transitions 1000,3000, iteration 1500, global batch 64: (1500 - 1000) x 64 =
    32,000 samples into the second phase's data."""
    phases = phase_transitions(args)
    if not phases:
        return int(args.consumed_train_samples)
    iteration = int(_flag(args, "iteration", 0) or 0)
    last = max(t for t in (0, *phases) if t <= iteration)
    return (iteration - last) * int(args.global_batch_size)


def _gemm_row_align(args: argparse.Namespace) -> int:
    """Megatron's alignment for low-precision GEMMs (megatron-core ``fp8_utils.get_fp8_align_size``: 32 for the
    mxfp8 recipe, else 16; ``fp4_utils.get_fp4_align_size``: 128), 1 without ``--fp8-format`` / ``--fp4-format``."""
    align = 1
    if _flag(args, "fp8"):
        align = 32 if str(getattr(_flag(args, "fp8_recipe"), "value", _flag(args, "fp8_recipe"))) == "mxfp8" else 16
    if _flag(args, "fp4"):
        align = max(align, 128)
    return align


def _rampup(args: argparse.Namespace, problems: list[str], notes: list[str]) -> tuple[int, int, int] | None:
    """``--rampup-batch-size``'s three words (Megatron reads them with ``int``) as integers, or ``None`` with the
    reason appended to ``problems`` when they are not three integers (their values:
    :class:`~.batch_schedule.StepSchedule`, checked with the batch sizes). Megatron-LM 0.19 on (its parser has
    ``--step-batch-size-schedule``) still parses the flag but ignores it: so does Zeppelin, saying so in ``notes``."""
    words = _flag(args, "rampup_batch_size")
    if not words:
        return None
    if hasattr(args, "step_batch_size_schedule"):
        notes.append(f"--rampup-batch-size {' '.join(map(str, words))} ignored, as this Megatron-LM ignores it "
                     "(0.19 on: use --step-batch-size-schedule)")
        return None
    try:
        values = [int(w) for w in words]
    except (TypeError, ValueError):
        values = []
    if len(values) != 3:
        problems.append(f"--rampup-batch-size {' '.join(map(str, words))}: give three integers, START INCREMENT "
                        "SAMPLES")
        return None
    if _flag(args, "train_iters"):
        problems.append(f"--rampup-batch-size with --train-iters {args.train_iters}: a ramp-up needs sample-based "
                        "training, --train-samples (Megatron's rule)")
    return values[0], values[1], values[2]


def check_megatron_args(args: argparse.Namespace, *, world_size: int, gpus_per_node: int) -> ZeppelinParallel:
    """Reject Megatron settings a Zeppelin run cannot serve; return the run's shape.

    ``args`` is Megatron's parsed namespace (before or after Megatron's own
    ``validate_args``); ``world_size`` and ``gpus_per_node`` come from the job
    (``WORLD_SIZE`` and the cluster / ``LOCAL_WORLD_SIZE``). Every error names
    the flag, its value and what Zeppelin needs.
    """
    problems: list[str] = []
    pp = _flag(args, "pipeline_model_parallel_size", 1) or 1
    if pp > 1:
        problems.append(f"--pipeline-model-parallel-size {pp}: Zeppelin does not support pipeline "
                        "parallelism; use 1 (scale with data and tensor parallelism)")
    vpp = _flag(args, "num_layers_per_virtual_pipeline_stage") or _flag(args, "num_virtual_stages_per_pipeline_rank")
    if vpp:
        problems.append("virtual pipeline stages are not supported with --zeppelin")
    problems.extend(attention_problems(args))  # dropout, window, sinks, context parallelism
    if _flag(args, "hybrid_context_parallel", False):
        problems.append("--hybrid-context-parallel: Megatron's dynamic context parallelism splits sequences "
                        "itself, which Zeppelin replaces; drop it (to compare the two on the same data and "
                        "recipe, run each separately: docs/user-guide.md section 3)")
    ep = _flag(args, "expert_model_parallel_size", 1) or 1
    if _flag(args, "num_experts") or ep > 1:
        problems.append("MoE (--num-experts / --expert-model-parallel-size) is not supported with --zeppelin yet")
    if _flag(args, "use_legacy_models", False):
        problems.append("--use-legacy-models: Zeppelin needs megatron-core models")
    for name, flag in (("multi_latent_attention", "--multi-latent-attention"),
                       ("experimental_attention_variant", "--experimental-attention-variant"),
                       ("heterogeneous_layers_config_path", "--heterogeneous-layers-config-path"),
                       ("mtp_num_layers", "--mtp-num-layers"),
                       ("yaml_cfg", "--yaml-cfg"),
                       ("sft", "--sft"),
                       ("fim_data", "--fim-data")):
        if _flag(args, name):
            problems.append(f"{flag} is not supported with --zeppelin")
    graphs = _flag(args, "cuda_graph_impl")
    if graphs not in (None, "none") or _flag(args, "enable_cuda_graph") or _flag(args, "external_cuda_graph"):
        flag = f"--cuda-graph-impl {graphs}" if graphs not in (None, "none") else (
            "--enable-cuda-graph" if _flag(args, "enable_cuda_graph") else "--external-cuda-graph")
        problems.append(f"{flag}: a CUDA graph replays fixed shapes and kernels, while every Zeppelin micro-step "
                        "has its own plan (a rank's rows, its attention calls and transfers change each time); "
                        "drop it")
    if _flag(args, "full_validation"):
        problems.append("--full-validation: Megatron sizes a full pass by its own data loader's length, which "
                        "Zeppelin's token-budget iterator does not have; validate with --eval-iters N (N evaluation "
                        "steps of validation micro-steps each time)")
    if _flag(args, "multiple_validation_sets"):
        problems.append("--multiple-validation-sets: Zeppelin evaluates one validation set (the --valid-data-path "
                        "blend, or --split's validation share); drop it")
    if _flag(args, "tp_comm_overlap"):
        problems.append("--tp-comm-overlap: Transformer Engine's TP communication/GEMM overlap runs on userbuffers of "
                        "a fixed --seq-length x --micro-batch-size rows (TransformerEngine issue 1303), while a "
                        "Zeppelin rank's rows change every micro-step; drop it (TP's all-gathers and reduce-scatters "
                        "then run without the overlap)")
    spec = _flag(args, "spec")
    if spec and spec[0] != ZEPPELIN_SPEC_MODULE:
        problems.append(f"--spec {' '.join(spec)}: Zeppelin builds its own layer spec; drop --spec")
    backend = _flag(args, "attention_backend")
    if backend is not None and getattr(backend, "name", str(backend)) == "local":
        problems.append("--attention-backend local: Megatron requires --spec local with it, which replaces "
                        "Zeppelin's core attention; keep the default (auto)")
    if _flag(args, "position_embedding_type", "rope") not in ("rope", "learned_absolute", "none", None):
        problems.append(f"--position-embedding-type {args.position_embedding_type}: Zeppelin supports rope, "
                        "learned_absolute and none")
    dl = _flag(args, "dataloader_type")
    if dl not in (None, "external"):
        problems.append(f"--dataloader-type {dl}: Zeppelin feeds Megatron its own iterator; "
                        "use --dataloader-type external (the launcher sets it)")
    if not _flag(args, "calculate_per_token_loss", False):
        problems.append("Zeppelin needs --calculate-per-token-loss (tokens move between ranks, so the "
                        "loss must be normalised by the global token count; the launcher sets it)")
    sources = _data_sources(args, problems)
    if sources is not None and (_flag(args, "eval_iters", 0) or 0) > 0 and sources.valid is None:
        problems.append(f"--eval-iters {args.eval_iters}: Zeppelin evaluates on --valid-data-path PREFIX or on "
                        "the validation share of --data-path's --split; give one, or --eval-iters 0")
    notes: list[str] = []
    rampup = _rampup(args, problems, notes)
    steps = _flag(args, "step_batch_size_schedule")
    if steps is not None and _flag(args, "phase_transition_iterations"):
        problems.append(f"--phase-transition-iterations with --step-batch-size-schedule {steps!r}: Megatron counts a "
                        "phase's samples as iterations x --global-batch-size, so its phases need a fixed global batch "
                        "(its rule); give --global-batch-size")
    if steps is not None and _flag(args, "_is_global_batch_size_explicitly_specified",
                                   _flag(args, "global_batch_size") is not None):
        problems.append(f"--step-batch-size-schedule {steps!r} with --global-batch-size {args.global_batch_size}: "
                        "give one (Megatron's rule)")
    if problems:
        raise ZeppelinArgsError("cannot run --zeppelin:\n  - " + "\n  - ".join(problems))
    mbs = _flag(args, "micro_batch_size")
    gbs = _flag(args, "global_batch_size")
    tp = _flag(args, "tensor_model_parallel_size", 1) or 1
    if gbs is None:  # Megatron's default: one micro-batch per data-parallel rank
        gbs = (mbs or 1) * (world_size // tp)
    return ZeppelinParallel(
        world_size=world_size,
        gpus_per_node=gpus_per_node,
        tensor_parallel=tp,
        micro_batch_size=mbs,
        global_batch_size=gbs,
        seq_length=_flag(args, "seq_length"),
        sequence_parallel=bool(_flag(args, "sequence_parallel", False)),
        rampup=rampup,
        step_batch_size_schedule=steps,
        decrease_batch_size_if_needed=bool(_flag(args, "decrease_batch_size_if_needed", False)),
        notes=tuple(notes),
        gemm_row_align=_gemm_row_align(args),
    )
