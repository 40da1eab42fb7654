"""Planning work in instructions, which no host's load changes: ``plan_speed.py``'s five batches planned once.

Run: python benchmarks/plan_count.py [--cluster 16x8] [--tokens 1048576] [--repeat 5] [--rerank] [--dist NAME]
                                       [--tokens-per-gpu N]
Runs this file twice under valgrind's callgrind (``PYTHONHASHSEED=0``, so set and dict orders repeat): once building
the batches and planning each (a fresh ``CostModel`` per plan, as ``plan_speed.py``), once building them only, and
prints the difference, the instructions ``plan_step`` executed, in millions. Compare two commits with the same
valgrind and Python build (wall time on one host scales with it only roughly: on 2026-11-28, 0.934x the instructions
came with 0.92x the ``plan_speed.py`` median). Exits 2 without valgrind. With ``--inner plan|none`` it is the measured
process itself. ``--rerank``: with the opt-in post-trade ranking (``PlannerOptions(packed_rerank=True)``). ``--dist``:
the batches, as ``plan_speed.py`` takes them (``long-tailed``, the default, or a distribution of
:mod:`zeppelin_megatron.sim.lengths`, e.g. ``github-64k``: many short documents). ``--tokens-per-gpu``: the GPUs'
token capacity (default the cluster's, 64k): e.g. ``--cluster 16x8 --tokens-per-gpu 8192 --tokens 1047936`` plans
batches that fill every GPU to within 5 tokens, as the Megatron sampler's micro-steps nearly do at
``--zeppelin-tokens-per-gpu`` = micro-batch size x sequence length.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile


def _inner(mode: str, cluster_spec: str, tokens: int, repeat: int, rerank: bool, dist: str,
           tokens_per_gpu: int | None) -> None:
    from zeppelin_megatron.planner import CostModel, PlannerOptions, load_cluster, load_model, plan_step
    from zeppelin_megatron.planner.workloads import long_tailed_batch
    cluster, model = load_cluster(cluster_spec, tokens_per_gpu=tokens_per_gpu), load_model(None)
    if dist == "long-tailed":
        batches = [long_tailed_batch(tokens, seed) for seed in range(repeat)]
    else:
        from zeppelin_megatron.sim.lengths import sample_steps
        batches = sample_steps(dist, repeat, tokens, 0)
    if mode == "plan":
        for lengths in batches:
            plan_step(lengths, CostModel(model=model, cluster=cluster), PlannerOptions(packed_rerank=rerank))


def _count(mode: str, args: argparse.Namespace) -> int:
    """Instructions of one ``--inner mode`` process under callgrind (its ``Collected`` line)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(here), env.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={os.path.join(tmp, 'out')}", sys.executable,
               os.path.abspath(__file__), "--inner", mode, "--cluster", args.cluster, "--tokens", str(args.tokens),
               "--repeat", str(args.repeat), "--dist", args.dist] + (["--rerank"] if args.rerank else []) + (
            ["--tokens-per-gpu", str(args.tokens_per_gpu)] if args.tokens_per_gpu else [])
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode or not found:
        raise SystemExit(f"valgrind run ({mode}) failed with exit code {done.returncode}: {done.stderr[-800:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="16x8")
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--inner", choices=("plan", "none"))
    ap.add_argument("--rerank", action="store_true", help="PlannerOptions(packed_rerank=True) (opt-in)")
    ap.add_argument("--dist", default="long-tailed", help="long-tailed, or a zeppelin_megatron.sim.lengths name")
    ap.add_argument("--tokens-per-gpu", type=int, default=None, help="the GPUs' token capacity (default the cluster's)")
    args = ap.parse_args()
    if args.inner:
        _inner(args.inner, args.cluster, args.tokens, args.repeat, args.rerank, args.dist, args.tokens_per_gpu)
        return
    if shutil.which("valgrind") is None:
        print("plan_count.py needs valgrind (callgrind) on PATH", file=sys.stderr)
        raise SystemExit(2)
    plan, none = _count("plan", args), _count("none", args)
    what = " (packed_rerank)" if args.rerank else ""
    cap = f" of {args.tokens_per_gpu} tokens" if args.tokens_per_gpu else ""
    print(f"plan_step{what}: {args.tokens} tokens ({args.dist}), {args.repeat} batches, {args.cluster}{cap}: "
          f"{(plan - none) / 1e6:.1f} M instructions ({plan / 1e6:.1f} M with the batches built, {none / 1e6:.1f} M "
          f"without planning)")


if __name__ == "__main__":
    main()
