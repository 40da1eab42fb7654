"""``zeppelin demo``: train a small megatron-core GPT with Zeppelin on CPU (4 gloo ranks, 2 nodes x 2)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

__all__ = ["HELP", "add_arguments", "run"]

HELP = "train a small megatron-core GPT with Zeppelin on 4 CPU ranks (2 nodes x 2), optionally against plain DP"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument("--compare-baseline", action="store_true",
                   help="run the same batches as plain data parallelism without Zeppelin and report the loss "
                        "difference")
    p.add_argument("--tokens-per-step", type=int, default=8192, help="global token budget of a step (default 8192)")
    p.add_argument("--seq-length", type=int, default=6144, help="documents are truncated at this length (default 6144)")
    p.add_argument("--documents", type=int, default=2000, help="documents in the generated corpus (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="corpus, sampling and initialisation seed (default 0)")
    p.add_argument("--out", default="zeppelin_demo_out", help="directory for the corpus and demo.json")
    p.add_argument("--json", default=None, help="also copy the per-step record (JSON) here")
    p.add_argument("--no-packed", action="store_true",
                   help="plan without packed candidates (they win most steps of this tiny model): shows the "
                        "partitioner's plans instead, with the same losses")


def run(args: argparse.Namespace) -> int:
    from ..megatron.demo import DemoConfig  # numpy only: megatron is imported later, in run_demo
    from .checks import check_output_dir, check_output_file

    cfg = DemoConfig(steps=args.steps, compare_baseline=args.compare_baseline, tokens_per_step=args.tokens_per_step,
                     seq_length=args.seq_length, documents=args.documents, seed=args.seed, out_dir=args.out,
                     packed=not args.no_packed)
    check_output_dir(args.out, "--out")
    check_output_file(args.json, "--json")
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise ValueError("zeppelin demo needs megatron-core: pip install 'zeppelin_megatron[megatron]'")
    # The first line, before the corpus and the ranks' imports (tens of seconds on a small CPU).
    then = ", then plain data parallelism" if cfg.compare_baseline else ""
    print(f"zeppelin demo: {cfg.steps} steps of {cfg.tokens_per_step} tokens on {cfg.world} CPU ranks "
          f"({cfg.nodes} nodes x {cfg.gpus_per_node}, gloo){then}; writing a {cfg.documents}-document corpus to "
          f"{cfg.out_dir}/ ...", flush=True)
    from ..megatron.demo import run_demo

    doc = run_demo(cfg)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")
    return 0
