"""``zeppelin`` command line. Each subcommand lives in :mod:`zeppelin_megatron.commands`.

A subcommand module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``; add its name to :data:`COMMANDS` to register it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from .lengths_io import read_lengths
from .planner import ClusterError, ModelError, PlanError, ProfileError

__all__ = ["main", "read_lengths", "COMMANDS"]

# Registration order is the order `zeppelin --help` lists them.
COMMANDS: tuple[str, ...] = ("demo", "plan", "profile", "replay", "simulate")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zeppelin", description="Zeppelin for Megatron-LM.")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name in COMMANDS:
        mod = importlib.import_module(f".commands.{name}", __package__)
        mod.add_arguments(sub.add_parser(name, help=mod.HELP, description=mod.HELP))
        modules[name] = mod
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args))
    except (PlanError, ClusterError, ModelError, ProfileError, ValueError, OSError) as exc:
        print(f"zeppelin {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
