"""What planning on the data iterator's prefetch thread costs the training thread's Python, and what a worker saves.

Run: python benchmarks/plan_gil.py [--cluster 16x8] [--tokens 1048576] [--rounds 5]
The training thread's Python work (layers' kernel launches, here a pure-Python stand-in: ``--work`` loops of 20 000
integer steps) is timed alone, then while another thread plans ``plan_speed.py``'s batches back to back (holding the
GIL in turns with it), then while they are planned in a :class:`~zeppelin_megatron.megatron.data.plan_worker.PlanWorker`
(the thread only waits on a pipe). Prints the three times (the median of ``--rounds``) and the slowdowns. Needs a
second core for the worker to pay off (this process is not pinned). Back to back is the worst case: in training the
planner runs once per micro-step (``plan_speed.py``'s time), so the training thread loses at most that share.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Callable, Sequence

from zeppelin_megatron.megatron.data.plan_worker import PlanWorker
from zeppelin_megatron.planner import StepPlan
from zeppelin_megatron.planner.setup import build_planning
from zeppelin_megatron.planner.workloads import long_tailed_batch


def _work(loops: int) -> float:
    """Milliseconds of the stand-in training thread's Python work."""
    t0 = time.perf_counter()
    for _ in range(loops):
        x = 0
        for i in range(20_000):
            x += i * i % 7
    return (time.perf_counter() - t0) * 1e3


def _while_planning(plan: Callable[[Sequence[int]], StepPlan], batches: list[list[int]], loops: int) -> float:
    stop = threading.Event()

    def planning() -> None:
        while not stop.is_set():
            for lengths in batches:
                plan(lengths)

    th = threading.Thread(target=planning, daemon=True)
    th.start()
    time.sleep(0.2)  # planning under way
    try:
        return _work(loops)
    finally:
        stop.set()
        th.join()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="16x8")
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", type=int, default=200)
    args = ap.parse_args()
    setup = build_planning(args.cluster)
    batches = [long_tailed_batch(args.tokens, seed) for seed in range(5)]
    alone, thread, worker = [], [], []
    with PlanWorker(setup) as child:
        child(batches[0])  # started and warm
        for _ in range(args.rounds):
            alone.append(_work(args.work))
            thread.append(_while_planning(setup, batches, args.work))
            worker.append(_while_planning(child, batches, args.work))
    a, t, w = (statistics.median(x) for x in (alone, thread, worker))
    print(f"training thread's Python work: alone {a:.0f} ms; planner in a thread {t:.0f} ms ({t / a:.2f}x); "
          f"planner in a worker process {w:.0f} ms ({w / a:.2f}x); medians of {args.rounds}")


if __name__ == "__main__":
    main()
