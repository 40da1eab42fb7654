"""Planning time of one step: 1M tokens (long-tailed) on 128 GPUs (16 x 8), one CPU core.

Run: python benchmarks/plan_speed.py [--repeat 5] [--dist long-tailed|github-64k|arxiv-64k|prolong-64k|...] [--rerank]
Prints the median and best wall time of plan_step (a fresh CostModel each time,
so its caches start cold) over several seeds; exits 1 when the median is over ``--budget-ms``
(50: issue 12's budget for 1M tokens on 128 GPUs). ``--dist``: the batches, ``long-tailed`` (default:
:func:`~zeppelin_megatron.planner.workloads.long_tailed_batch`, seed ``k``) or a distribution of
:mod:`zeppelin_megatron.sim.lengths` (docs/BENCHMARKS.md's: ``sample_steps(dist, repeat, tokens, 0)``).
``--rerank``: with the opt-in post-trade ranking (``PlannerOptions(packed_rerank=True)``, docs/planner.md), which is
over the budget.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.workloads import long_tailed_batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cluster", default="16x8")
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--budget-ms", type=float, default=50.0)
    ap.add_argument("--dist", default="long-tailed")
    ap.add_argument("--rerank", action="store_true", help="PlannerOptions(packed_rerank=True) (opt-in)")
    args = ap.parse_args()
    options = PlannerOptions(packed_rerank=args.rerank)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    cluster = load_cluster(args.cluster)
    model = load_model(None)
    if args.dist == "long-tailed":
        batches = [long_tailed_batch(args.tokens, seed) for seed in range(args.repeat)]
    else:
        from zeppelin_megatron.sim.lengths import sample_steps
        batches = sample_steps(args.dist, args.repeat, args.tokens, 0)
    times = []
    for lengths in batches:
        cost = CostModel(model=model, cluster=cluster)
        t0 = time.perf_counter()
        plan_step(lengths, cost, options)
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"plan_step{' (packed_rerank)' if args.rerank else ''}: {args.tokens} tokens ({args.dist}), "
          f"{cluster.world_size} GPUs ({args.cluster}): "
          f"median {statistics.median(times):.1f} ms, best {min(times):.1f} ms over {len(times)} seeds")
    if statistics.median(times) > args.budget_ms:
        raise SystemExit(f"over budget: median {statistics.median(times):.1f} ms > {args.budget_ms:.0f} ms")


if __name__ == "__main__":
    main()
