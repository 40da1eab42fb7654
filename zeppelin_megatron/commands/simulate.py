"""``zeppelin simulate``: simulate strategies on sampled steps; table of step time, speedup, bound ratio."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "simulate Zeppelin and baselines on sampled global batches (cost-model simulator)"

__all__ = ["HELP", "add_arguments", "run", "load_batches", "setup", "format_table", "no_head_parallel"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dist", help="named length distribution (github-64k, arxiv-128k, prolong-64k, ...)")
    src.add_argument("--lengths", help="text file of document lengths, one per line")
    src.add_argument("--dataset", nargs="+", metavar="PREFIX",
                     help="Megatron indexed dataset prefix (PREFIX.idx / PREFIX.bin), or a blend as --data-path "
                          "takes it (W1 P1 W2 P2 ..., or P1 P2 ... by size), visited in training's blend order "
                          "(--seed)")
    p.add_argument("--seq-length", type=int, default=None,
                   help="with --dataset: the micro-steps training runs (documents truncated at this many inputs, "
                        "never split, cut at --tokens-per-step by the training sampler with --seed) instead of "
                        "the documents in file order cut into steps")
    p.add_argument("--split", default=None,
                   help="with --seq-length: Megatron's --split (train, valid, test shares); the steps come from the "
                        "training share (default: every document)")
    p.add_argument("--cluster", required=True, help="NODESxGPUS (H100 defaults), a cluster YAML, or NODESxGPUS@YAML")
    p.add_argument("--model", default=None, help="model YAML (default: Llama-7B shape)")
    p.add_argument("--profile", default=None, help="cost profile JSON (default: bundled H100 bf16)")
    p.add_argument("--tensor-parallel", type=int, default=1,
                   help="TP size: each Zeppelin rank is a TP group of this many GPUs (GPUs per node / TP ranks "
                        "per node)")
    p.add_argument("--tokens-per-gpu", type=int, default=None,
                   help="override the cluster's per-GPU token capacity (a Zeppelin rank of TP GPUs holds TP x this)")
    p.add_argument("--strategies", default="zeppelin,te-cp,lower-bound",
                   help="comma-separated strategies; 'peers' for zeppelin, every peer and the lower bound (what "
                        "Zeppelin is judged against), 'all' for every strategy and ablation (default: "
                        "zeppelin,te-cp,lower-bound)")
    p.add_argument("--no-head-parallel", action="store_true",
                   help="plan Zeppelin without head-parallel rings: runs the zeppelin strategy as "
                        "zeppelin-no-head-parallel (every ring plain)")
    p.add_argument("--no-remap-overlap", action="store_true",
                   help="plan Zeppelin without remap windows: runs the zeppelin strategy as "
                        "zeppelin-no-remap-overlap")
    p.add_argument("--steps", type=int, default=4, help="global batches to simulate (default 4)")
    p.add_argument("--tokens-per-step", type=int, default=None,
                   help="tokens per global batch (default: with --seq-length, training's micro-step budget at "
                        "--micro-batch-size 1, seq_length x ranks; else 1M; at most what the cluster holds less "
                        "1/256 of it); more than the cluster holds is refused, and within 1/256 of it a step keeps "
                        "that free, as training's micro-step budget")
    p.add_argument("--seed", type=int, default=0,
                   help="sampling seed (--dist; with --dataset: a blend's order, training's sampler)")
    p.add_argument("--cp-size", type=int, default=None, help="fixed CP size for te-cp/allgather-cp/wlb-llm")
    p.add_argument("--engine", choices=("runtime", "fill"), default="runtime",
                   help="runtime: the order zeppelin_megatron.runtime runs (rings in plan order, local work inside "
                        "step 0 of a rank's filling ring, else after the rings; default); "
                        "fill: local sequences fill any ring wait (the paper's three-queue engine)")
    p.add_argument("--jobs", type=int, default=1,
                   help="simulate the strategies in this many processes (default 1; the same results)")
    p.add_argument("--json", default=None, help="write results JSON here")
    p.add_argument("--plot", default=None, help="write a PNG bar chart here")
    p.add_argument("--timeline", default=None,
                   help="write a PNG of every rank's timeline (one layer, first step, first strategy) here")


def load_batches(args: argparse.Namespace, budget: int) -> tuple[list[list[int]], str]:
    """The global batches of ``budget`` tokens (what the cluster places of ``--tokens-per-step``:
    :func:`step_budget`) and a one-line description of their source."""
    from ..megatron.data.blend import parse_blend
    from ..sim.lengths import (
        lengths_from_blend, lengths_from_dataset, lengths_from_file, sample_steps, split_steps, training_steps,
    )
    if args.steps < 1 or budget < 1:
        raise ValueError(f"--steps ({args.steps}) and --tokens-per-step ({budget}) must be >= 1")
    if (args.seq_length is not None or args.split is not None) and not args.dataset:
        raise ValueError("--seq-length and --split read a dataset as training does: give --dataset")
    if args.split is not None and args.seq_length is None:
        raise ValueError("--split needs --seq-length (the steps training runs)")
    if args.seq_length is not None:
        if args.seq_length < 1:
            raise ValueError(f"--seq-length must be >= 1, got {args.seq_length}")
        steps = training_steps(args.dataset, seq_length=args.seq_length, tokens_per_step=budget,
                               steps=args.steps, seed=args.seed, split=args.split)
        return steps, (f"{' '.join(args.dataset)} as training reads it (seq_length {args.seq_length}, seed "
                       f"{args.seed}{f', split {args.split}' if args.split else ''})")
    if args.dist:
        return (sample_steps(args.dist, args.steps, budget, args.seed),
                f"distribution {args.dist}, seed {args.seed}")
    if args.lengths:
        docs, what = lengths_from_file(args.lengths), f"lengths file {args.lengths}"
    elif len(prefixes := parse_blend(args.dataset, "--dataset")[0]) == 1:
        docs, what = lengths_from_dataset(prefixes[0]), f"indexed dataset {prefixes[0]}"
    else:
        docs = lengths_from_blend(args.dataset, args.seed, args.steps * budget)
        what = f"blend {' '.join(args.dataset)}, seed {args.seed}"
    return split_steps(docs, args.steps, budget, source=what), what


DEFAULT_TOKENS_PER_STEP = 1 << 20
"""``--tokens-per-step`` when not given, unless the cluster holds less (:func:`step_budget`)."""


def step_budget(tokens_per_step: int | None, cluster: Any, seq_length: int | None = None) -> tuple[int, str | None]:
    """The tokens each simulated step holds, and a note when that is fewer than ``--tokens-per-step``: as training
    cuts its micro-step budget (:func:`~zeppelin_megatron.planner.capacity_level.placeable_budget`), a step leaves
    1/256 of each rank's tokens free (at least 5), so that it gets a plan balanced in time. ``None`` (not given):
    training's budget at micro-batch size 1, ``seq_length x ranks``, with ``seq_length`` (``--seq-length``), else
    :data:`DEFAULT_TOKENS_PER_STEP`; at most what the cluster places (no note). Raises ``ValueError`` naming the
    numbers for a step larger than the cluster holds, or below one token. Example: 32 ranks of 65,536 tokens,
    ``--tokens-per-step 2097152`` -> 2,088,960 tokens, with a note, as ``--seq-length 65536`` alone; 4 ranks of
    65,536 and neither -> 261,120."""
    from ..planner.capacity_level import budget_margin, placeable_budget
    ranks, cap = cluster.world_size, cluster.tokens_per_gpu
    if tokens_per_step is None:
        wanted = DEFAULT_TOKENS_PER_STEP if seq_length is None else seq_length * ranks
        return placeable_budget(min(wanted, ranks * cap), ranks, cap), None
    if tokens_per_step < 1:
        raise ValueError(f"--tokens-per-step must be >= 1, got {tokens_per_step}")
    if tokens_per_step > ranks * cap:
        raise ValueError(f"--tokens-per-step {tokens_per_step} is more than the cluster holds: {ranks} ranks x {cap} "
                         f"tokens = {ranks * cap} (lower it, or raise --tokens-per-gpu)")
    budget = placeable_budget(tokens_per_step, ranks, cap)
    if budget == tokens_per_step:
        return budget, None
    return budget, (f"steps of {budget} tokens, not --tokens-per-step {tokens_per_step}: as training's micro-step "
                    f"budget, each of the {ranks} ranks keeps {budget_margin(cap)} of its {cap} tokens free, so "
                    "that every step gets a plan balanced in time (docs/data.md, 'Budget arithmetic')")


def setup(cluster_spec: str, model: str | None, profile: str | None, tensor_parallel: int,
          tokens_per_gpu: int | None = None):
    """``(cluster, cost model)`` of Zeppelin ranks: :func:`~zeppelin_megatron.planner.setup.build_planning`.

    With TP > 1 a Zeppelin rank is a TP group (the cluster reduced as training
    reduces it, capacity ``TP x`` the per-GPU one); see
    :mod:`zeppelin_megatron.planner.setup`.
    """
    from ..planner.setup import build_planning
    s = build_planning(cluster_spec, model, profile, tensor_parallel=tensor_parallel, tokens_per_gpu=tokens_per_gpu)
    return s.cluster, s.cost


def format_table(results: dict[str, Any], baseline: str = "te-cp", bound: str = "lower-bound") -> str:
    """Markdown table: strategy, mean step, speedup over ``baseline``, ratio to ``bound``, exposed comm; a strategy
    that refused a step (:attr:`~zeppelin_megatron.sim.runner.StrategySummary.refused`) says so, with the reason."""
    base = results[baseline].mean_step_ms if baseline in results and not results[baseline].refused else None
    lb = results[bound].mean_step_ms if bound in results else None
    lines = [f"| strategy | mean step (ms) | speedup vs {baseline} | x lower bound | exposed comm (ms) | NIC util "
             "| note |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, r in results.items():
        if r.refused:
            lines.append(f"| {name} | refused | - | - | - | - | cannot run {r.refused} |")
            continue
        sp = f"{base / r.mean_step_ms:.2f}x" if base else "-"
        ratio = f"{r.mean_step_ms / lb:.2f}" if lb else "-"
        exp = sum(r.exposed_comm_ms) / len(r.exposed_comm_ms) if r.exposed_comm_ms else 0.0
        nic = f"{sum(r.nic_util_mean) / len(r.nic_util_mean):.1%}" if r.nic_util_mean else "-"
        note = r.notes[0] if r.notes else ""
        lines.append(f"| {name} | {r.mean_step_ms:.0f} | {sp} | {ratio} | {exp:.0f} | {nic} | {note} |")
    return "\n".join(lines)


def _plot(results: dict[str, Any], path: str, title: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'zeppelin_megatron[plot]'") from None
    names = [n for n in results if n != "lower-bound" and not results[n].refused]
    means = [results[n].mean_step_ms for n in names]
    exposed = [sum(results[n].exposed_comm_ms) / len(results[n].exposed_comm_ms) for n in names]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names) + 2), 4))
    ax.bar(names, [m - e for m, e in zip(means, exposed)], color="#3b7dd8", label="busiest GPU's compute")
    ax.bar(names, exposed, bottom=[m - e for m, e in zip(means, exposed)], color="#e55934",
           label="exposed communication")
    if "lower-bound" in results:
        ax.axhline(results["lower-bound"].mean_step_ms, color="black", ls="--", lw=1, label="lower bound")
    ax.set_ylabel("simulated ms per step")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


_COLORS = {"linear": "#9bc53d", "attention": "#3b7dd8", "local": "#5bc0eb", "ring": "#e55934",
           "group": "#fa7921", "remap": "#8c2f39"}


def _timeline(res: Any, path: str, title: str) -> None:
    """Gantt chart of ``res.events`` (the step's first layer): compute in blues/greens, waits in reds."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--timeline needs matplotlib: pip install 'zeppelin_megatron[plot]'") from None
    world = len(res.finish_ms)
    bars: dict[tuple[str, int], list[tuple[float, float]]] = {}  # (kind, rank) -> (start, duration), in event order
    for e in res.events:
        bars.setdefault((e.kind, e.rank), []).append((e.start, e.end - e.start))
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.12 * world + 1.5)))
    for kind, color in _COLORS.items():
        drawn = False
        for r in range(world):
            mine = bars.get((kind, r))
            if mine:
                ax.broken_barh(mine, (r - 0.4, 0.8), color=color)
                drawn = True
        if drawn:
            ax.plot([], [], color=color, lw=6, label=kind + (" (wait)" if kind in ("ring", "group", "remap") else ""))
    ax.set_xlabel("ms within one layer (simulated)")
    ax.set_ylabel("rank")
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08 - 2.0 / max(world, 8)), ncol=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def no_head_parallel(names: list[str], variant: str = "zeppelin-no-head-parallel") -> list[str]:
    """``--no-head-parallel``: ``zeppelin`` -> ``zeppelin-no-head-parallel`` (planned with
    ``PlannerOptions(head_parallel=False)``); ``variant="zeppelin-no-remap-overlap"`` does the same for
    ``--no-remap-overlap``; the other Zeppelin ablations have no such variant.

    Example: ``["zeppelin", "te-cp"]`` -> ``["zeppelin-no-head-parallel", "te-cp"]``.
    """
    flag = "--" + variant.removeprefix("zeppelin-")
    other = [n for n in names if n.startswith("zeppelin-") and n != variant]
    if other:
        raise ValueError(f"{flag} applies to the zeppelin strategy only, not to {other} "
                         f"(drop the flag, or list {variant} next to them)")
    return list(dict.fromkeys(variant if n == "zeppelin" else n for n in names))


def run(args: argparse.Namespace) -> int:
    from ..sim.runner import Progress, parse_strategies, run_strategies, verdict
    from .checks import (check_cluster_spec, check_input_file, check_matplotlib, check_output_file,
                         profile_range_warning)
    check_input_file(args.lengths, "--lengths", text=False)  # content: lengths_io
    check_cluster_spec(args.cluster)
    check_input_file(args.model, "--model")
    check_input_file(args.profile, "--profile")
    for flag in ("json", "plot", "timeline"):
        check_output_file(getattr(args, flag), f"--{flag}")
    if args.plot or args.timeline:
        check_matplotlib("--plot" if args.plot else "--timeline")
    if args.jobs < 1:
        raise ValueError(f"--jobs is {args.jobs}: expected at least 1 (processes simulating the strategies)")
    if args.no_head_parallel and args.no_remap_overlap:
        raise ValueError("--no-head-parallel and --no-remap-overlap each replace the zeppelin strategy: give one "
                         "(or list zeppelin-no-head-parallel,zeppelin-no-remap-overlap in --strategies)")
    names = parse_strategies(args.strategies)
    if args.no_head_parallel:
        names = no_head_parallel(names)
    if args.no_remap_overlap:
        names = no_head_parallel(names, "zeppelin-no-remap-overlap")
    cluster, cost = setup(args.cluster, args.model, args.profile, args.tensor_parallel, args.tokens_per_gpu)
    budget, note = step_budget(args.tokens_per_step, cluster, args.seq_length)
    if note:
        print(f"zeppelin simulate: {note}", file=sys.stderr)
    batches, what = load_batches(args, budget)
    warning = profile_range_warning(cost.profile, [max(b) for b in batches]) if args.profile else None
    if warning:
        print(f"zeppelin simulate: {warning}", file=sys.stderr)
    options: dict[str, dict[str, Any]] = {}
    if args.cp_size is not None:
        for n in ("te-cp", "te-cp-routing", "allgather-cp", "wlb-llm"):
            options[n] = {"cp_size": args.cp_size}
    bar = Progress(len(names) * len(batches), label="simulate")
    results = run_strategies(batches, cluster, cost, names, options=options, engine=args.engine,
                             on_step=bar.step, jobs=args.jobs, peer_refusals=True)
    title = (f"{cost.model.name or 'model'} on {cluster.nodes}x{cluster.gpus_per_node} ranks"
             f"{f' (TP {args.tensor_parallel})' if args.tensor_parallel > 1 else ''}, {what}, "
             f"{len(batches)} steps x {budget} tokens, {args.engine} engine")
    print(title)
    print("simulated (cost model calibrated on H100 kernel timings; network bandwidths nominal)")
    print(format_table(results))
    judged = verdict(results)
    if judged is not None:
        print(judged.line())
    if args.json:
        doc = {"schema": "zeppelin-simulate/1", "title": title, "cluster": cluster.summary(),
               "model": cost.model.name, "tensor_parallel": args.tensor_parallel, "source": what,
               "steps": len(batches), "tokens_per_step": budget, "engine": args.engine,
               "batches": [{"documents": len(b), "longest": max(b)} for b in batches],
               "results": {n: r.to_dict() for n, r in results.items()},
               "verdict": None if judged is None else judged.to_dict()}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        _plot(results, args.plot, title)
        print(f"wrote {args.plot}")
    if args.timeline:
        from ..sim.simulator import simulate
        from ..sim.strategies import plan_with
        first = next((n for n in names if n != "lower-bound" and not results[n].refused), None)
        if first is None:
            raise ValueError("--timeline needs a planned strategy that runs the steps, not only lower-bound")
        sp = plan_with(first, batches[0], cluster, cost, **options.get(first, {}))
        from ..sim.charges import charges_for
        res = simulate(sp.plan, cost, attention_comm=sp.attention_comm, engine=args.engine, charges=charges_for(first))
        _timeline(res, args.timeline, f"{first}, step 0, first layer ({res.first_layer_ms:.1f} ms; "
                                         f"{res.layer_ms:.1f} a layer over the step): {title}")
        print(f"wrote {args.timeline}")
    return 0
