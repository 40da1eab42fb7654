"""Does the ranking of strategies survive the simulator's two least certain inputs? (simulated)

Run: python benchmarks/sensitivity.py [--configs 7B:github-64k:4,7B:prolong-64k:16] [--steps 1]
                                      [--strategies zeppelin,te-cp,...] [--json OUT]

For each configuration (model : length distribution : nodes of 8 H100s) it samples ``--steps``
global batches of 1M tokens and simulates every strategy under six settings:

* ``base``: the profile as bundled (per-call overhead 1.0925 ms, nominal NIC bandwidth);
* ``overhead 0.05`` / ``0.3`` / ``1.09`` ms: the profile's ``call_overhead_ms`` replaced
  (``docs/simulator.md``; design notes section 9: 1.09 ms is host time through
  varlen_attn's autograd wrapper, an engine calling kernels directly pays about 0.1-0.3 ms);
* ``NIC -30%`` / ``NIC +30%``: the NIC bandwidth (the profile's ``links.nic_GBps`` when it has
  one, else the cluster's) scaled by 0.7 / 1.3.

It prints one markdown table per configuration: per setting, the strategies fastest first,
the best peer (fastest non-Zeppelin strategy), Zeppelin / best peer, and whether the order
differs from ``base``. All numbers are simulated (cost model calibrated on H100 kernel
timings; network bandwidths nominal), never measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from typing import Any

MODELS = {"3B": ("configs/models/llama_3b.yaml", 1), "7B": ("configs/models/llama_7b.yaml", 1),
          "13B": ("configs/models/llama_13b.yaml", 2)}
DEFAULT_CONFIGS = "7B:github-64k:4,7B:prolong-64k:4,7B:prolong-64k:16"
DEFAULT_STRATEGIES = ("zeppelin,te-cp,allgather-cp,hybrid-dp,wlb-llm,flexsp,megatron-hcp,te-cp-a2a-p2p,distca,"
                      "lower-bound")
SETTINGS: tuple[tuple[str, dict[str, float]], ...] = (
    ("base", {}), ("overhead 0.05 ms", {"overhead": 0.05}), ("overhead 0.3 ms", {"overhead": 0.3}),
    ("overhead 1.09 ms", {"overhead": 1.09}), ("NIC -30%", {"nic": 0.7}), ("NIC +30%", {"nic": 1.3}))
CLUSTER = "configs/clusters/h100.yaml"
LABEL = "simulated (cost model calibrated on H100 kernel timings; network bandwidths nominal)"


def setting_cost(cost: Any, overhead: float | None = None, nic: float | None = None) -> Any:
    """``cost`` with the per-call overhead replaced and/or the NIC bandwidth scaled."""
    from zeppelin_megatron.planner.cost_model import CostModel
    profile, cluster = cost.profile, cost.cluster
    if overhead is not None:
        if overhead < 0:
            raise ValueError(f"overhead must be >= 0 ms, got {overhead}")
        profile = replace(profile, call_overhead_ms=overhead)
    if nic is not None:
        if nic <= 0:
            raise ValueError(f"NIC scale must be > 0, got {nic}")
        if profile.nic_GBps:
            profile = replace(profile, nic_GBps=profile.nic_GBps * nic)
        else:
            cluster = replace(cluster, nic_Gbps=cluster.nic_Gbps * nic)
    return CostModel(model=cost.model, cluster=cluster, profile=profile, tensor_parallel=cost.tensor_parallel)


def run_config(model: str, dist: str, nodes: int, steps: int, names: list[str], seed: int = 0) -> dict[str, Any]:
    from zeppelin_megatron.planner import PlanError
    from zeppelin_megatron.planner.setup import build_planning
    from zeppelin_megatron.sim.lengths import sample_steps
    from zeppelin_megatron.sim.runner import run_strategies
    path, tp = MODELS[model]
    base = build_planning(f"{nodes}x8@{CLUSTER}", path, None, tensor_parallel=tp)
    batches = sample_steps(dist, steps, 1 << 20, seed)
    rows: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    for label, kw in SETTINGS:
        cost = setting_cost(base.cost, **kw)
        rows[label] = {}
        for name in names:
            try:
                res = run_strategies(batches, cost.cluster, cost, [name])
            except (PlanError, ValueError) as exc:
                errors[f"{label} / {name}"] = str(exc)
                continue
            rows[label][name] = res[name].mean_step_ms
    return {"model": model, "dist": dist, "nodes": nodes, "steps": steps, "results": rows, "errors": errors}


def ranking(times: dict[str, float]) -> list[str]:
    return [n for n, _ in sorted(((n, t) for n, t in times.items() if n != "lower-bound"), key=lambda x: x[1])]


def format_config(out: dict[str, Any]) -> str:
    rows = out["results"]
    base_rank = ranking(rows["base"])
    lines = [f"### {out['model']}, {out['dist']}, {out['nodes']} x 8 H100 ({out['steps']} step(s); {LABEL})", "",
             "| setting | order, fastest first (mean ms per step) | best peer | Zeppelin / best peer | order changed |",
             "|---|---|---|---:|---|"]
    for label, times in rows.items():
        order = ranking(times)
        peers = [n for n in order if not n.startswith("zeppelin")]
        best = peers[0] if peers else "-"
        ratio = (f"{times['zeppelin'] / times[best]:.2f}" if "zeppelin" in times and best in times else "-")
        text = ", ".join(f"{n} {times[n]:.0f}" for n in order)
        changed = "-" if label == "base" else ("no" if order == base_rank else
                                                ("top changed" if order[:1] != base_rank[:1] else "yes (not the top)"))
        lines.append(f"| {label} | {text} | {best} | {ratio} | {changed} |")
    for k, v in out["errors"].items():
        lines.append(f"\nerror: {k}: {v}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="MODEL:DIST:NODES,... (models: 3B, 7B, 13B)")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--strategies", default=DEFAULT_STRATEGIES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    configs = []
    for spec in args.configs.split(","):
        parts = spec.split(":")
        if len(parts) != 3 or parts[0] not in MODELS or not parts[2].isdigit() or int(parts[2]) < 1:
            p.error(f"config {spec!r} must be MODEL:DIST:NODES with MODEL in {sorted(MODELS)} and NODES >= 1")
        configs.append((parts[0], parts[1], int(parts[2])))
    results = []
    for model, dist, nodes in configs:
        t0 = time.perf_counter()
        out = run_config(model, dist, nodes, args.steps, names, args.seed)
        out["seconds"] = time.perf_counter() - t0
        results.append(out)
        print(format_config(out), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
