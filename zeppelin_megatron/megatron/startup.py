"""Zeppelin's start-up check for Megatron-LM runs: flags, parallelism, data, cluster, profile, capacity.

:func:`check_startup` runs on every rank before Megatron parses the command
line (the launcher and a patched ``pretrain_gpt.py`` call it through
:func:`~zeppelin_megatron.megatron.pretrain.run_pretrain_gpt`); it prints
what is wrong and exits 2 on a configuration Zeppelin cannot serve.
:func:`setup_from_args` runs the same checks again on Megatron's validated
arguments when the run builds its model.

``megatron.training`` is imported inside :func:`check_startup` only: this
module imports with megatron-core alone.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Mapping, Sequence

from .arguments import ZeppelinArgsError, add_zeppelin_args, zeppelin_config_from_args
from .run_shape import check_megatron_args
from .planning import ZeppelinSetup, build_setup, model_shape_from_args

__all__ = ["REQUIRED_FLAGS", "ARGS_DEFAULTS", "prepare_argv", "setup_from_args", "check_startup",
           "extra_args_provider", "env_int"]

REQUIRED_FLAGS: tuple[tuple[str, ...], ...] = (("--calculate-per-token-loss",), ("--dataloader-type", "external"))
"""Megatron flags every Zeppelin run needs; :func:`prepare_argv` adds those that are absent."""

ARGS_DEFAULTS: dict[str, Any] = {"tokenizer_type": "GPT2BPETokenizer"}
"""``args_defaults`` of Megatron-LM's ``pretrain_gpt.py`` (the same from core_v0.16 to main)."""


def prepare_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with :data:`REQUIRED_FLAGS` appended where absent.

    A conflicting value (``--dataloader-type single``) is left in place; the
    checks then reject it with a message.
    """
    out = list(argv)
    for flag in REQUIRED_FLAGS:
        if flag[0] not in out and not any(a.startswith(flag[0] + "=") for a in out):
            out.extend(flag)
    return out


def _gpus_per_node(args: argparse.Namespace, local_world_size: int | None) -> int:
    if local_world_size is not None:
        return local_world_size
    from ..planner import ClusterError, load_cluster

    try:  # no launcher told us: trust the cluster file (checked against the world size later)
        return load_cluster(args.zeppelin_cluster or "").gpus_per_node
    except ClusterError as exc:
        raise ZeppelinArgsError(f"--zeppelin-cluster {args.zeppelin_cluster}: {exc}") from None


def setup_from_args(args: argparse.Namespace, *, world_size: int, local_world_size: int | None) -> ZeppelinSetup:
    """All Zeppelin checks on Megatron's parsed ``args``; the run's setup (cluster, cost model, planner).

    ``local_world_size``: processes per node (torchrun's ``LOCAL_WORLD_SIZE``);
    ``None`` takes the cluster file's GPUs per node.
    """
    cfg = zeppelin_config_from_args(args)
    parallel = check_megatron_args(args, world_size=world_size,
                                   gpus_per_node=_gpus_per_node(args, local_world_size))
    return build_setup(cfg, parallel, model_shape_from_args(args))


def env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ZeppelinArgsError(f"environment variable {name}={value!r} is not an integer") from None


def _megatron_parser(extra: Callable[[argparse.ArgumentParser], argparse.ArgumentParser] | None
                     ) -> argparse.ArgumentParser:
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False))
    parser = add_zeppelin_args(parser)
    return extra(parser) if extra is not None else parser


def check_startup(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    other_args_provider: Callable[[argparse.ArgumentParser], argparse.ArgumentParser] | None = None,
    exit_on_error: bool = True,
) -> list[str]:
    """Check a Zeppelin command line before Megatron starts; return the argv to run with.

    ``argv`` is ``sys.argv`` (program name first). Parses ``prepare_argv(argv)``
    as Megatron will (its parser, ours, ``other_args_provider``'s), reads
    ``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE`` / ``RANK`` from ``env`` (default
    ``os.environ``) and runs :func:`setup_from_args`. On a
    :class:`ZeppelinArgsError` it prints the reasons (in full on rank 0) and
    raises ``SystemExit(2)``; ``exit_on_error=False`` re-raises instead.
    """
    env = os.environ if env is None else env
    out = prepare_argv(argv)
    try:
        args = _megatron_parser(other_args_provider).parse_args(out[1:])
        if not args.zeppelin:
            raise ZeppelinArgsError("check_startup: the command line has no --zeppelin")
        world = env_int(env, "WORLD_SIZE") or 1
        setup_from_args(args, world_size=world, local_world_size=env_int(env, "LOCAL_WORLD_SIZE"))
    except ZeppelinArgsError as exc:
        if not exit_on_error:
            raise
        rank = env.get("RANK", "0")
        if rank in ("0", ""):
            print(f"zeppelin: {exc}", file=sys.stderr, flush=True)
        else:
            print(f"zeppelin: rank {rank}: start-up check failed (see rank 0)", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    return out


def extra_args_provider(
    other: Callable[[argparse.ArgumentParser], argparse.ArgumentParser] | None = None,
) -> Callable[[argparse.ArgumentParser], argparse.ArgumentParser]:
    """Megatron ``extra_args_provider`` adding our flags, then ``other``'s (e.g. ModelOpt's)."""

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser = add_zeppelin_args(parser)
        return other(parser) if other is not None else parser

    return provider
