"""``zeppelin plan``: plan one global batch, print the per-rank table, write JSON and a plot."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from ..lengths_io import read_lengths
from ..planner import PlanError, PlannerOptions, Prediction, StepPlan
from ..planner.options import REMAP_CHOICES, REMAP_WORDS, Remap
from ..planner.predict import attention_time
from ..planner.ring_parts import parted
from ..planner.setup import build_planning
from .checks import (
    check_cluster_spec,
    check_input_file,
    check_matplotlib,
    check_output_file,
    profile_range_warning,
)

__all__ = ["HELP", "add_arguments", "run", "read_lengths", "plot_plan", "exposed_ms", "traffic_unit"]

HELP = "plan one global batch and print the per-rank table"


_REMAP: dict[str, Remap] = {REMAP_WORDS[v].split()[0]: v for v in REMAP_CHOICES}
"""``--remap`` word -> PlannerOptions.remap: {"auto": "auto", "on": True, "off": False} (words from REMAP_WORDS)."""


_ORIGIN_WORDS: dict[str | None, str] = {
    None: "the partitioner's",
    "packed": "packed (documents packed by attention + linear work per GPU, in CP groups of one size or after a "
              "leading group for the longest; no remap: planner/packed.py, packed_search.py)",
    "grouped": "CP groups (every split document on a whole group of nodes: planner/grouped.py)",
}
"""How the summary names :attr:`StepPlan.origin`."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", required=True, help="text file, one sequence length per line")
    p.add_argument("--cluster", required=True,
                   help="NODESxGPUS (H100 defaults), a cluster YAML, or NODESxGPUS@YAML")
    p.add_argument("--model", default=None, help="model YAML (default: Llama-7B shape)")
    p.add_argument("--profile", default=None, help="cost profile JSON (default: bundled H100 bf16)")
    p.add_argument("--tokens-per-gpu", type=int, default=None,
                   help="override the cluster's per-GPU token capacity (a Zeppelin rank of TP GPUs holds TP x this)")
    p.add_argument("--tensor-parallel", type=int, default=1,
                   help="TP size: each Zeppelin rank is a TP group of this many GPUs (heads split over them)")
    p.add_argument("--no-routing", action="store_true", help="plan without NIC-aware routing")
    p.add_argument("--no-head-parallel", action="store_true",
                   help="keep every ring plain (no head-parallel rings: all-to-all over heads inside blocks "
                        "of a ring's GPUs, Ulysses when one block spans it)")
    p.add_argument("--no-remap-overlap", action="store_true",
                   help="no remap windows: staying local sequences never run while a layout exchange is in "
                        "flight (PlannerOptions.remap_overlap=False)")
    p.add_argument("--no-packed", action="store_true",
                   help="no packed candidates (PlannerOptions.packed=False: documents packed by attention + linear "
                        "work, linear modules on the attention layout)")
    p.add_argument("--packed-rerank", action="store_true",
                   help="rank packed candidates by their steps after whole-document trades "
                        "(PlannerOptions.packed_rerank; about 1.5x the planning time)")
    p.add_argument("--grouped", action="store_true",
                   help="also try CP-group candidates (PlannerOptions.grouped: every split sequence on a whole "
                        "group of nodes; slower planning)")
    remap = p.add_mutually_exclusive_group()
    # default None (meaning "auto"): argparse's exclusivity check ignores an option given its own default value
    remap.add_argument("--remap", choices=tuple(_REMAP), default=None,
                       help="linear layout: auto (default) = per step, the lowest predicted step among "
                            "token-balanced, workload-balanced and the attention layout; on = always "
                            "token-balanced; off = linear layout = attention layout")
    remap.add_argument("--no-remap", dest="remap", action="store_const", const="off",
                       help="same as --remap off")
    p.add_argument("--json", default=None, help="write the zeppelin-plan/1 JSON here")
    p.add_argument("--plot", default=None, help="write a PNG of per-rank load here")


def exposed_ms(pred: Prediction) -> list[float]:
    """Per-rank exposed communication of a step: ring waits not hidden by compute plus the remap
    all-to-alls (every rank pays ``remap_ms``). The table's column and the plot's red bar."""
    return [e + pred.remap_ms for e in pred.exposed_comm_ms]


def traffic_unit(pred: Prediction) -> tuple[str, float]:
    """``("MB", 1.0)``, or ``("GB", 1e-3)`` when a rank sends 10,000 MB or more per step."""
    top = max([*pred.intra_MB, *pred.inter_MB, 0.0])
    return ("GB", 1e-3) if top >= 10_000 else ("MB", 1.0)


def _table(plan: StepPlan) -> str:
    pred = plan.predicted
    assert pred is not None
    placements: list[Counter[str]] = [Counter() for _ in range(plan.world_size)]
    for s in plan.sequences:
        for r in s.ranks:
            placements[r][s.placement] += 1
    unit, scale = traffic_unit(pred)
    exposed = exposed_ms(pred)
    head = (f"{'rank':>4} {'node':>4} {'att tok':>8} {'lin tok':>8} {'attn ms':>9} {'linear ms':>9} "
            f"{'exposed ms':>10} {'intra ' + unit:>9} {'inter ' + unit:>9}  local/intra/inter")
    lines = [head, "-" * len(head)]
    for r in range(plan.world_size):
        c = placements[r]
        lines.append(
            f"{r:>4} {r // plan.gpus_per_node:>4} {plan.tokens(r, 'attention'):>8} {plan.tokens(r, 'linear'):>8} "
            f"{pred.attention_ms[r]:>9.1f} {pred.linear_ms[r]:>9.1f} {exposed[r]:>10.1f} "
            f"{pred.intra_MB[r] * scale:>9.1f} {pred.inter_MB[r] * scale:>9.1f}  "
            f"{c['local']}/{c['intra_node']}/{c['inter_node']}"
        )
    att = attention_time(pred)
    mean = sum(att) / len(att)
    kinds = Counter(s.placement for s in plan.sequences)
    lines += [
        f"exposed ms = ring waits not hidden by compute + remap all-to-alls ({pred.remap_ms:.1f} ms on every rank); "
        f"{unit} sent per step",
        "",
        f"sequences: {len(plan.sequences)} ({kinds['local']} local, {kinds['intra_node']} intra_node, "
        f"{kinds['inter_node']} inter_node), tokens: {plan.total_tokens}, routed hops: {len(plan.routing)}",
        "placement: " + _ORIGIN_WORDS[plan.origin],
        _head_line(plan),
        f"remap: {'off (linear layout = attention layout)' if plan.linear_layout == plan.attention_layout else 'on'}"
        + (f", linear layout: {plan.linear}" if plan.linear else "")
        + (f", cross-node rows routed over local GPUs {list(plan.remap_proxies)}" if plan.remap_proxies else ""),
        f"local sequences in ring waits: {sum(len(x.seqs) for x in plan.local_slots)} "
        f"(in {len(plan.local_slots)} calls; the rest after their rank's rings)",
        _window_line(plan),
        f"predicted step: {pred.step_ms:.1f} ms (cost model), remap {pred.remap_ms:.1f} ms, "
        f"attention max/mean: {max(att) / mean if mean else 1.0:.3f}",
    ]
    return "\n".join(lines)


def _window_line(plan: StepPlan) -> str:
    """``local sequences in remap windows: 7 (remap in: 3 calls, remap out: 2 calls)``."""
    calls = Counter(x.direction for x in plan.remap_slots)
    return (f"local sequences in remap windows: {sum(len(x.seqs) for x in plan.remap_slots)} "
            f"(remap in: {calls['to_attention']} calls, remap out: {calls['to_linear']} calls)")


def _head_line(plan: StepPlan) -> str:
    """How the rings run: ``rings: 5 (3 plain, 1 Ulysses, 1 head-parallel hybrid; block widths [4, 8])``, and
    where a ring runs in parts (planner/ring_parts.py) ``...; 2 of them parts of 1 ring)``."""
    rings = plan.rings
    uly = sum(1 for r in rings if r.a2a > 1 and r.blocks == 1)
    hybrid = sum(1 for r in rings if r.a2a > 1 and r.blocks > 1)
    families = parted(rings)
    parts = sum(1 for r in rings if (r.ranks, r.a2a) in families)
    tail = f"; {parts} of them parts of {len(families)} ring{'s' * (len(families) > 1)}" if families else ""
    return (f"rings: {len(rings)} ({len(rings) - uly - hybrid} plain, {uly} Ulysses, {hybrid} head-parallel hybrid; "
            f"block widths {sorted({r.a2a for r in rings if r.a2a > 1})}{tail})")


def plot_plan(plan: StepPlan, path: str | Path) -> None:
    """PNG of per-rank predicted load: stacked attention, linear, exposed communication."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlanError("--plot needs matplotlib: pip install 'zeppelin_megatron[plot]'") from None
    pred = plan.predicted
    assert pred is not None
    ranks = list(range(plan.world_size))
    exposed = exposed_ms(pred)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(ranks) + 2), 4))
    ax.bar(ranks, pred.attention_ms, label="attention compute", color="#3b7dd8")
    ax.bar(ranks, pred.linear_ms, bottom=pred.attention_ms, label="linear", color="#9bc53d")
    bottom = [a + b for a, b in zip(pred.attention_ms, pred.linear_ms)]
    ax.bar(ranks, exposed, bottom=bottom, label="exposed comm (ring waits + remap)", color="#e55934")
    ax.axhline(pred.step_ms, color="black", lw=1, ls="--", label=f"step {pred.step_ms:.0f} ms")
    ax.set_xlabel("rank")
    ax.set_ylabel("predicted ms per step (cost model)")
    ax.set_title(f"Zeppelin plan: {plan.nodes} x {plan.gpus_per_node} GPUs, {plan.total_tokens} tokens")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    # Everything a user can get wrong is checked before planning.
    check_input_file(args.lengths, "--lengths", text=False)  # content: lengths_io
    check_cluster_spec(args.cluster)
    check_input_file(args.model, "--model")
    check_input_file(args.profile, "--profile")
    check_output_file(args.json, "--json")
    check_output_file(args.plot, "--plot")
    if args.plot:
        check_matplotlib("--plot")
    lengths = read_lengths(args.lengths)
    setup = build_planning(args.cluster, args.model, args.profile, tensor_parallel=args.tensor_parallel,
                           tokens_per_gpu=args.tokens_per_gpu,
                           options=PlannerOptions(routing=not args.no_routing, remap=_REMAP[args.remap or "auto"],
                                                  head_parallel=not args.no_head_parallel,
                                                  remap_overlap=not args.no_remap_overlap, packed=not args.no_packed,
                                                  packed_rerank=args.packed_rerank, grouped=args.grouped))
    warning = profile_range_warning(setup.cost.profile, lengths) if args.profile else None
    if warning:
        print(f"zeppelin plan: {warning}", file=sys.stderr)
    plan = setup.plan(lengths)
    print(_table(plan))
    if args.json:
        Path(args.json).write_text(plan.to_json(indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        plot_plan(plan, args.plot)
        print(f"wrote {args.plot}")
    return 0
