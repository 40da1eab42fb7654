"""Planning time at scale (issue 14): four batches far beyond a usual step, one CPU core.

Run: python benchmarks/plan_scale.py [--repeat 1] [--case NAME ...]

Cases (Llama-7B shape, default H100 profile and cluster):

* ``16M-1024``: 16M tokens (long-tailed, seed 0) on 128 x 8 GPUs, budget 5 s;
* ``1M-ones-32``: 1,048,576 sequences of length 1 on 4 x 8 GPUs, budget 5 s;
* ``8-seqs-80k``: 8 sequences of 64k tokens on 10,000 x 8 GPUs, budget 10 s;
* ``50k-7-3-32``: 20,000 sequences of 7 tokens and 30,001 of 3 on 4 x 8 GPUs, budget 2 s
  (many short documents of two lengths: the local search took 31 s before it offered
  swaps once per kind of sequence).

For each: the best wall time (and CPU time: on a shared machine the fairer
figure) of ``plan_step`` (a fresh cost model each run, caches
cold), of ``StepPlan.to_json`` on the result, the plan's predicted attention
max/mean (busiest rank over the mean of ``predicted.attention_ms``) and predicted step.
Exits 1, naming them, when a case's best CPU time is over its budget.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Callable

from zeppelin_megatron.planner import CostModel, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.workloads import long_tailed_batch

CASES: dict[str, tuple[str, Callable[[], list[int]], float]] = {
    "16M-1024": ("128x8", lambda: long_tailed_batch(16 << 20, 0), 5.0),
    "1M-ones-32": ("4x8", lambda: [1] * (1 << 20), 5.0),
    "8-seqs-80k": ("10000x8", lambda: [65536] * 8, 10.0),
    "50k-7-3-32": ("4x8", lambda: [7] * 20000 + [3] * 30001, 2.0),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    model = load_model(None)
    over: list[str] = []
    for name in args.case or list(CASES):
        spec, make, budget = CASES[name]
        cluster = load_cluster(spec)
        lengths = make()
        plan_s, cpu_s, json_s = [], [], []
        for _ in range(args.repeat):
            cost = CostModel(model=model, cluster=cluster)
            t0, c0 = time.perf_counter(), time.process_time()
            plan = plan_step(lengths, cost)
            plan_s.append(time.perf_counter() - t0)
            cpu_s.append(time.process_time() - c0)
            t0 = time.perf_counter()
            text = plan.to_json()
            json_s.append(time.perf_counter() - t0)
        assert plan.predicted is not None
        att = plan.predicted.attention_ms
        ratio = max(att) / (sum(att) / len(att)) if sum(att) else 1.0
        print(f"{name}: {len(lengths)} sequences, {sum(lengths)} tokens, {cluster.world_size} GPUs ({spec}): "
              f"plan_step best {min(plan_s):.2f} s of {len(plan_s)} "
              f"(CPU {min(cpu_s):.2f} s; budget {budget:.0f} s), "
              f"to_json {min(json_s):.2f} s ({len(text) / 1e6:.1f} MB), attention max/mean {ratio:.4f}, "
              f"predicted step {plan.predicted.step_ms:.1f} ms",
              flush=True)
        if min(cpu_s) > budget:
            over.append(f"{name} {min(cpu_s):.2f} s > {budget:.0f} s")
    if over:
        raise SystemExit(f"over budget (CPU time): {', '.join(over)}")


if __name__ == "__main__":
    main()
