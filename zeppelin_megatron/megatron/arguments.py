"""Zeppelin's own Megatron-LM flags (``--zeppelin-*``).

:func:`add_zeppelin_args` is an ``extra_args_provider`` for
``megatron.training.pretrain``; :func:`zeppelin_config_from_args` reads the
flags into a frozen :class:`ZeppelinConfig`. Megatron's own flags, and the shape of the run they give, are
:mod:`.run_shape`'s. Everything here works on a plain ``argparse.Namespace`` (no Megatron import), so the checks
run before ``torch.distributed`` is initialised and in CI.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from ..planner.options import REMAP_WORDS, PlannerOptions, Remap
from ..planner.plan import PlanError

__all__ = [
    "ZeppelinArgsError",
    "ZeppelinConfig",
    "add_zeppelin_args",
    "zeppelin_config_from_args",
    "planner_options_from_args",
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
