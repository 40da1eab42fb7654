"""Zeppelin's Megatron-LM flags and the start-up checks of a Zeppelin run.

:func:`add_zeppelin_args` is an ``extra_args_provider`` for
``megatron.training.pretrain``; :func:`zeppelin_config_from_args` reads the
flags into a frozen :class:`ZeppelinConfig`; :func:`check_megatron_args`
rejects Megatron settings Zeppelin cannot serve and returns the
:class:`ZeppelinParallel` shape of the run. Everything here works on a plain
``argparse.Namespace`` carrying Megatron's attribute names (no Megatron import),
so the checks run before ``torch.distributed`` is initialised and in CI.

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
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..planner.options import REMAP_WORDS, PlannerOptions, Remap
from ..planner.plan import PlanError
from .batch_schedule import RampupError, StepSchedule, parse_step_batch_size_schedule

__all__ = [
    "ZeppelinArgsError",
    "ZeppelinConfig",
    "ZeppelinParallel",
    "add_zeppelin_args",
    "zeppelin_config_from_args",
    "planner_options_from_args",
    "check_megatron_args",
    "zeppelin_requested",
    "ZEPPELIN_SPEC_MODULE",
]

ZEPPELIN_SPEC_MODULE = "zeppelin_megatron.megatron.spec"
"""Module holding Zeppelin's layer specs (``--spec`` may name it; nothing else is accepted)."""

DEFAULT_TIMEOUT_S = 300.0
"""``--zeppelin-timeout`` default, seconds (= ``runtime.group.DEFAULT_TIMEOUT_S``; kept here so that
parsing flags imports no torch)."""


_PLANNER = PlannerOptions()
"""The planner's defaults: the defaults of the ``--zeppelin-*`` planner flags."""


class ZeppelinArgsError(ValueError):
    """A command line Zeppelin cannot run; raised at start-up, before any step."""


def zeppelin_requested(argv: list[str]) -> bool:
    """Whether a command line asks for Zeppelin (``--zeppelin`` present)."""
    return "--zeppelin" in argv


def _word(on: bool) -> str:
    return "on" if on else "off"


def add_zeppelin_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``--zeppelin*`` flags (an ``extra_args_provider``; returns ``parser``)."""
    from ..runtime.kernels import BACKENDS

    g = parser.add_argument_group("zeppelin", "Zeppelin sequence partitioning (arXiv 2509.21841)")
    g.add_argument("--zeppelin", action="store_true",
                   help="Train with Zeppelin: per-step placement of variable-length sequences.")
    g.add_argument("--zeppelin-cluster", type=str, default=None,
                   help="Cluster for the planner: NODESxGPUS@file.yaml (e.g. 4x8@configs/clusters/h100.yaml), "
                        "a YAML file, or NODESxGPUS (H100 defaults). Must match the job's nodes and GPUs.")
    g.add_argument("--zeppelin-profile", type=str, default=None,
                   help="Cost profile JSON (zeppelin-profile/1); default: the bundled H100 bf16 measurements.")
    g.add_argument("--zeppelin-tokens-per-gpu", type=int, default=None,
                   help="Attention-layout tokens one GPU may hold (overrides the cluster file); a Zeppelin rank, "
                        "one TP group, holds TP x this.")
    # Defaults of the planner's flags are PlannerOptions' (declared there once).
    g.add_argument("--zeppelin-routing", action=argparse.BooleanOptionalAction, default=_PLANNER.routing,
                   help="Spread cross-node ring hops over idle NICs through proxy GPUs (default: "
                        f"{'on' if _PLANNER.routing else 'off'}).")
    g.add_argument("--zeppelin-remap", action=argparse.BooleanOptionalAction, default=None,
                   help=f"Linear modules on a token-balanced layout (default: {REMAP_WORDS[_PLANNER.remap]}); "
                        "--no-zeppelin-remap: the linear layout is the attention layout (no remap traffic).")
    g.add_argument("--zeppelin-remap-auto", action="store_true",
                   help="Decide remapping per micro-step: remap only when the planner predicts a faster step.")
    g.add_argument("--zeppelin-head-parallel", choices=("on", "off"), default=_word(_PLANNER.head_parallel),
                   help="Let the planner run a ring head-parallel (an all-to-all over heads inside blocks of its "
                        "GPUs, a ring across the blocks; Ulysses when one block spans it) where the cost model "
                        f"predicts it faster (default: {_word(_PLANNER.head_parallel)}; off: every ring plain).")
    g.add_argument("--zeppelin-remap-overlap", choices=("on", "off"), default=_word(_PLANNER.remap_overlap),
                   help="Let the planner run a GPU's staying local sequences (whole on it in both layouts) while "
                        "the layout exchanges (remap in / out) are in flight, where the call fits the predicted "
                        f"exchange time (default: {_word(_PLANNER.remap_overlap)}; off: no remap windows).")
    g.add_argument("--zeppelin-packed", choices=("on", "off"), default=_word(_PLANNER.packed),
                   help="Also try packed placements (documents packed by attention + linear work per GPU, "
                        "WLB-LLM's placement, linear modules on the attention layout: no remap) and keep one where "
                        f"the planner predicts it faster (default: {_word(_PLANNER.packed)}; never with "
                        "--zeppelin-remap, which forces the token-balanced layout).")
    g.add_argument("--zeppelin-packed-rerank", choices=("on", "off"), default=_word(_PLANNER.packed_rerank),
                   help="Rank packed placements by their predicted steps after whole-document trades, finishing "
                        "and trading the runners-up too (default: "
                        f"{_word(_PLANNER.packed_rerank)}; on: simulated 0.2%% faster steps on average, about 1.5x "
                        "the planning time, in the planning worker).")
    g.add_argument("--zeppelin-grouped", choices=("on", "off"), default=_word(_PLANNER.grouped),
                   help="Also try CP-group candidates (every split document on a whole group of nodes, all-to-all "
                        "in each node and a ring across them) and keep one where the planner predicts it faster "
                        f"(default: {_word(_PLANNER.grouped)}; on: 0.12-0.16 s CPU of planning per 1M-token step at "
                        "128 GPUs, on the data iterator's prefetch thread).")
    g.add_argument("--zeppelin-backend", type=str, default=None, choices=sorted(BACKENDS),
                   help="Attention kernel backend (default: the best usable one).")
    g.add_argument("--zeppelin-check-plan", action=argparse.BooleanOptionalAction, default=False,
                   help="Also check in every other Zeppelin attention layer that all ranks run the same plan and "
                        "settings (default: off). The first layer of every forward always checks (one small "
                        "all-reduce and, on NCCL, one device-to-host sync per micro-step), so ranks with "
                        "different plans or settings are caught either way; the flag adds one per layer.")
    g.add_argument("--zeppelin-timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="Seconds Zeppelin's collectives and transfers wait for a peer before every waiting rank "
                        f"raises an error naming the step and the peer (default: {DEFAULT_TIMEOUT_S:g}; the "
                        "Zeppelin communicator's process-group timeout). See docs/failures.md.")
    g.add_argument("--zeppelin-placements", type=str, default=",".join(_PLANNER.placements),
                   help="Comma-separated placements the planner may use, 'local' plus any of intra_node, "
                        "inter_node (ablations: e.g. local,intra_node never spans nodes).")
    g.add_argument("--zeppelin-slack", type=float, default=_PLANNER.slack,
                   help=f"Fraction by which a GPU may exceed its attention target before a split (default "
                        f"{_PLANNER.slack:g}).")
    g.add_argument("--zeppelin-min-ratio", type=float, default=_PLANNER.min_ratio,
                   help=f"Compute/communication ratio a split needs (default {_PLANNER.min_ratio:g}).")
    g.add_argument("--zeppelin-prefetch", type=int, default=2,
                   help="Micro-steps planned and read ahead in a background thread (0, 1 or 2; default 2).")
    g.add_argument("--zeppelin-plan-worker", choices=("on", "off"), default="on",
                   help="With prefetch, plan in a worker process (one per rank, the planner only) instead of on the "
                        "prefetch thread, whose planning would hold the GIL in turns with the training thread "
                        "(default: on; off: plan on the thread).")
    g.add_argument("--zeppelin-metrics", action=argparse.BooleanOptionalAction, default=True,
                   help="Per-step Zeppelin metrics in the log, tensorboard and wandb (default: on).")
    return parser


@dataclass(frozen=True, kw_only=True)
class ZeppelinConfig:
    """The ``--zeppelin*`` flags, validated. The planner's settings are ``options`` (validated there)."""

    cluster: str
    profile: str | None = None
    tokens_per_gpu: int | None = None
    options: PlannerOptions = field(default_factory=PlannerOptions)
    backend: str | None = None
    check_plan: bool = False
    prefetch: int = 2
    plan_worker: bool = True
    metrics: bool = True
    timeout: float = DEFAULT_TIMEOUT_S

    @property
    def routing(self) -> bool:
        """``options.routing``: the runtime's router needs it too."""
        return self.options.routing

    def __post_init__(self) -> None:
        if not isinstance(self.cluster, str) or not self.cluster.strip():
            raise ZeppelinArgsError(
                "--zeppelin needs --zeppelin-cluster (e.g. 4x8@configs/clusters/h100.yaml)"
            )
        tpg = self.tokens_per_gpu
        if tpg is not None and (isinstance(tpg, bool) or not isinstance(tpg, int) or tpg < 1):
            raise ZeppelinArgsError(f"--zeppelin-tokens-per-gpu must be a positive integer, got {tpg!r}")
        if not isinstance(self.options, PlannerOptions):
            raise ZeppelinArgsError(f"options is a {type(self.options).__name__}, expected a PlannerOptions")
        if isinstance(self.prefetch, bool) or self.prefetch not in (0, 1, 2):
            raise ZeppelinArgsError(f"--zeppelin-prefetch must be 0, 1 or 2, got {self.prefetch!r}")
        if not isinstance(self.plan_worker, bool):
            raise ZeppelinArgsError(f"--zeppelin-plan-worker must be on or off, got {self.plan_worker!r}")
        t = self.timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
            raise ZeppelinArgsError(f"--zeppelin-timeout must be a positive number of seconds, got {t!r}")


def _remap_from_args(args: argparse.Namespace) -> Remap:
    """``--zeppelin-remap`` (default) / ``--no-zeppelin-remap`` / ``--zeppelin-remap-auto``."""
    if getattr(args, "zeppelin_remap_auto", False):
        if args.zeppelin_remap is False:
            raise ZeppelinArgsError("--zeppelin-remap-auto and --no-zeppelin-remap contradict each other")
        return "auto"
    return _PLANNER.remap if args.zeppelin_remap is None else args.zeppelin_remap


_PLANNER_FLAGS = {"routing": "--zeppelin-routing", "remap": "--zeppelin-remap", "slack": "--zeppelin-slack",
                  "min_ratio": "--zeppelin-min-ratio", "placements": "--zeppelin-placements",
                  "head_parallel": "--zeppelin-head-parallel", "remap_overlap": "--zeppelin-remap-overlap",
                  "packed": "--zeppelin-packed", "packed_rerank": "--zeppelin-packed-rerank",
                  "grouped": "--zeppelin-grouped"}
"""PlannerOptions field -> the flag that sets it (errors name the flag)."""


def planner_options_from_args(args: argparse.Namespace) -> PlannerOptions:
    """The planner's settings from ``--zeppelin-routing/-remap/-remap-auto/-slack/-min-ratio/-placements``
    and ``--zeppelin-head-parallel {on,off}``, ``--zeppelin-remap-overlap {on,off}``, ``--zeppelin-packed {on,off}``,
    ``--zeppelin-packed-rerank {on,off}``, ``--zeppelin-grouped {on,off}``.

    :class:`PlannerOptions` validates the values; its error is re-raised naming
    the flag, e.g. ``--zeppelin-slack 2.0: slack is 2.0, expected a fraction in [0, 1)``.
    """
    values: dict[str, Any] = dict(
        routing=args.zeppelin_routing, remap=_remap_from_args(args), slack=args.zeppelin_slack,
        min_ratio=args.zeppelin_min_ratio,
        placements=tuple(p.strip() for p in args.zeppelin_placements.split(",") if p.strip()))
    for name in ("head_parallel", "remap_overlap", "packed", "packed_rerank", "grouped"):  # the on / off flags
        values[name] = _on_off(args, f"zeppelin_{name}", _PLANNER_FLAGS[name], getattr(_PLANNER, name))
    for name, flag in _PLANNER_FLAGS.items():
        try:
            PlannerOptions(**{name: values[name]})
        except PlanError as exc:
            shown = args.zeppelin_placements if name == "placements" else values[name]
            raise ZeppelinArgsError(f"{flag} {shown}: {exc}") from None
    return PlannerOptions(**values)


def _on_off(args: argparse.Namespace, name: str, flag: str, default: bool) -> bool:
    """An ``on`` / ``off`` flag (``default`` where the namespace lacks it)."""
    value = getattr(args, name, "on" if default else "off")
    if value not in ("on", "off"):
        raise ZeppelinArgsError(f"{flag} {value}: expected on or off")
    return value == "on"


def zeppelin_config_from_args(args: argparse.Namespace) -> ZeppelinConfig:
    """Read the ``--zeppelin*`` flags of a parsed command line."""
    if not getattr(args, "zeppelin", False):
        raise ZeppelinArgsError("zeppelin_config_from_args called without --zeppelin")
    return ZeppelinConfig(
        cluster=args.zeppelin_cluster or "",
        profile=args.zeppelin_profile,
        tokens_per_gpu=args.zeppelin_tokens_per_gpu,
        options=planner_options_from_args(args),
        backend=args.zeppelin_backend,
        check_plan=args.zeppelin_check_plan,
        prefetch=args.zeppelin_prefetch,
        plan_worker=_on_off(args, "zeppelin_plan_worker", "--zeppelin-plan-worker", True),
        metrics=args.zeppelin_metrics,
        timeout=getattr(args, "zeppelin_timeout", DEFAULT_TIMEOUT_S),
    )


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
        per_step = self.micro_batch_size * self.zeppelin_ranks
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
        return StepSchedule(samples_per_micro_step=self.micro_batch_size * self.zeppelin_ranks,
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
    cp = _flag(args, "context_parallel_size", 1) or 1
    if cp > 1:
        problems.append(f"--context-parallel-size {cp}: Zeppelin replaces context parallelism (it splits "
                        "long sequences itself over its ranks); use 1")
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
