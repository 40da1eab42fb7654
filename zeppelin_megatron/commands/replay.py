"""``zeppelin replay``: run each rank's planned compute on this device; measured vs predicted.

For every strategy (or one plan JSON), every rank's attention kernel calls
(the runtime engine's, forward then backward) and linear GEMMs run one rank
after another on the local device with the real kernel backend. Printed per
rank: MEASURED ms next to the cost model's PREDICTED ms (one layer), the
prediction error, and the rank's total against perfect balance
(total / ranks). Communication is not replayed.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ..planner import Cluster, CostModel, StepPlan

from .profile import add_model_arguments, add_threads_argument, apply_threads, model_from_args

__all__ = ["HELP", "add_arguments", "run", "parse_ranks", "same_device", "not_comparable"]

HELP = "replay each rank's planned attention and linear work on this device: measured vs predicted"

REPLAY_SCHEMA = "zeppelin-replay/1"


def parse_ranks(text: str, world: int) -> tuple[int, ...]:
    """``"0-3,7"`` -> ``(0, 1, 2, 3, 7)``; every rank in ``[0, world)``."""
    out: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            lo, _, hi = item.partition("-")
            a, b = int(lo), int(hi) if hi else int(lo)
        except ValueError:
            raise ValueError(f"--ranks: {item!r} is not a rank or a range a-b") from None
        if not 0 <= a <= b < world:
            raise ValueError(f"--ranks: {item!r} is outside [0, {world}) or reversed")
        out += range(a, b + 1)
    if not out:
        raise ValueError(f"--ranks: no ranks in {text!r}")
    return tuple(sorted(set(out)))


def same_device(profile_device: str, device: "torch.device") -> bool:
    """Whether a profile measured on ``profile_device`` (its ``device`` field) describes ``device``.

    CPU profiles name ``CPU ...`` (any CPU counts: the thread count may differ);
    a CUDA device must match the profile's GPU name exactly.
    """
    if device.type == "cpu":
        return profile_device.startswith("CPU")
    if device.type == "cuda":
        import torch

        return profile_device == torch.cuda.get_device_name(device)
    return False


def not_comparable(profile_device: str, device: "torch.device") -> str:
    """The label printed (before and after the tables) when the profile is another device's."""
    return (f"NOT COMPARABLE: the predictions come from a profile measured on {profile_device or 'an unknown device'}"
            f" and this replay runs on {device}; the 'error' columns compare two different devices and mean "
            f"nothing. For a comparison measure a profile here (`zeppelin profile --quick --device {device.type} "
            "--out prof.json`, with the same --model) and pass --profile prof.json.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", default=None, help="a zeppelin-plan/1 JSON (replayed as a ring plan)")
    src.add_argument("--lengths", default=None, help="text file, one sequence length per line (plans each strategy)")
    p.add_argument("--cluster", default=None,
                   help="NODESxGPUS, a cluster YAML or NODESxGPUS@YAML (required with --lengths; with --plan "
                        "default: the plan's NODESxGPUS with H100 defaults)")
    p.add_argument("--strategies", default="zeppelin",
                   help="comma-separated strategies (zeppelin_megatron.sim.strategies), e.g. zeppelin,te-cp")
    p.add_argument("--profile", default=None,
                   help="cost profile JSON for the predictions (default: bundled H100 bf16; on another device "
                        "pass one measured there with `zeppelin profile`)")
    add_model_arguments(p)
    p.add_argument("--tokens-per-gpu", type=int, default=None,
                   help="override the cluster's per-GPU token capacity (a Zeppelin rank of TP GPUs holds TP x this)")
    p.add_argument("--tensor-parallel", type=int, default=1,
                   help="TP size: each rank is a TP group; heads and GEMMs per rank divided by it")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", default=None, help="bf16 | fp16 | float32 | float64 (default: bf16 on CUDA, float32 "
                                                 "on CPU)")
    p.add_argument("--backend", default=None, help="attention backend (default: best usable)")
    add_threads_argument(p)
    p.add_argument("--ranks", default=None, help="replay only these ranks, e.g. 0-7,12 (default: all)")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per rank (median is kept)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per rank before timing")
    p.add_argument("--ideal", action="store_true",
                   help="also measure the ideal: every sequence whole, total / ranks (same for all strategies)")
    p.add_argument("--ideal-tokens-per-call", type=int, default=131072,
                   help="tokens per kernel call when measuring the ideal")
    p.add_argument("--json", default=None, help="write machine-readable results (zeppelin-replay/1) here")
    p.add_argument("--quiet", action="store_true", help="no per-rank progress lines")


Item = tuple[str, "StepPlan", str, str]  # (name, plan, attention_comm, note)


def _plans(args: argparse.Namespace, cost: "CostModel", cluster: "Cluster") -> list[Item]:
    """(name, StepPlan, attention_comm, note) for each strategy of ``--strategies``."""
    from ..sim.strategies import plan_with  # part of the package; imports the planner only
    from ..lengths_io import read_lengths

    lengths = read_lengths(args.lengths)
    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--strategies: no names in {args.strategies!r}")
    out: list[Item] = []
    for name in names:
        sp = plan_with(name, lengths, cluster, cost)
        out.append((sp.name, sp.plan, sp.attention_comm, sp.note))
    return out


def run(args: argparse.Namespace) -> int:
    from ..measure.replay import measure_ideal, plan_works, replay_plan
    from ..measure.report import format_comparison, format_replay
    from ..measure.timing import kernel_for, parse_dtype, resolve_device
    from ..planner import PlanError, StepPlan, load_profile
    from ..planner.setup import build_planning
    from ..planner.predict import predict

    from .checks import check_cluster_spec, check_input_file, check_output_file

    for flag in ("plan", "lengths", "model", "profile"):
        check_input_file(getattr(args, flag), f"--{flag}", text=flag != "lengths")  # lengths: lengths_io
    if args.cluster is not None:
        check_cluster_spec(args.cluster)
    check_output_file(args.json, "--json")
    if args.lengths is not None and args.cluster is None:
        raise ValueError("--lengths needs --cluster (NODESxGPUS, a YAML, or NODESxGPUS@YAML)")
    apply_threads(args.threads)
    device = resolve_device(args.device)
    dtype, dtype_name = parse_dtype(args.dtype, device)
    model = model_from_args(args)
    kernel = kernel_for(args.backend, device, dtype)
    profile = load_profile(args.profile)
    tp = args.tensor_parallel
    if args.plan is not None:
        path = Path(args.plan)
        try:
            plan = StepPlan.from_json(path.read_text())
        except PlanError as exc:
            raise PlanError(f"--plan {path}: {exc}") from None
        setup = build_planning(args.cluster or f"{plan.nodes}x{plan.gpus_per_node * tp}", model, profile,
                               tensor_parallel=tp, tokens_per_gpu=args.tokens_per_gpu)
        cluster, cost = setup.cluster, setup.cost
        if (cluster.nodes, cluster.gpus_per_node) != (plan.nodes, plan.gpus_per_node):
            raise ValueError(f"the plan is for {plan.nodes}x{plan.gpus_per_node} ranks but --cluster with TP {tp} "
                             f"gives {cluster.nodes}x{cluster.gpus_per_node}")
        note = f"from {path}"
        if plan.predicted is None or not plan.predicted.attention_ms:
            plan = replace(plan, predicted=predict(plan, cost), validate=False)
            note += " (predictions recomputed with --model/--profile)"
        items: list[Item] = [("plan", plan, "ring", note)]
    else:
        setup = build_planning(args.cluster, model, profile, tensor_parallel=tp, tokens_per_gpu=args.tokens_per_gpu)
        cluster, cost = setup.cluster, setup.cost
        items = _plans(args, cost, cluster)

    same = same_device(profile.device, device)
    print(f"replaying on {device} ({dtype_name}, backend {kernel.name}); predictions from profile "
          f"{args.profile or 'bundled H100 bf16'} measured on {profile.device or 'unknown device'}")
    if not same:
        print(not_comparable(profile.device, device))
    # Build every strategy's per-rank work first: a plan that cannot be replayed fails before any timing.
    prepared = []
    for name, plan, comm, note in items:
        ranks = parse_ranks(args.ranks, plan.world_size) if args.ranks else None
        works = plan_works(plan, model=model, device=device, tensor_parallel=args.tensor_parallel,
                           attention_comm=comm, ranks=ranks)
        prepared.append((name, plan, comm, note, works))
    results = []
    for name, plan, comm, note, works in prepared:
        res = replay_plan(plan, model=model, kernel=kernel, dtype=dtype, device=device,
                          tensor_parallel=args.tensor_parallel, warmup=args.warmup, repeats=args.repeats,
                          strategy=name, attention_comm=comm, note=note, works=works,
                          progress=None if args.quiet else print)
        print(format_replay(res, plan.gpus_per_node))
        results.append(res)
    ideal = None
    if args.ideal:
        first = items[0][1]
        ideal = measure_ideal([s.length for s in first.sequences], first.world_size,
                              model=model, kernel=kernel, dtype=dtype, device=device,
                              tensor_parallel=args.tensor_parallel, tokens_per_call=args.ideal_tokens_per_call,
                              warmup=args.warmup, repeats=args.repeats)
    if len(results) > 1 or ideal is not None:
        print(format_comparison(results, ideal))
    if not same:
        print(not_comparable(profile.device, device))
    if args.json:
        doc = {
            "schema": REPLAY_SCHEMA,
            "device": str(device), "dtype": dtype_name, "backend": kernel.name,
            "profile": {"path": args.profile, "device": profile.device, "same_device": same},
            "model": {k: getattr(model, k) for k in ("name", "layers", "hidden", "q_heads", "kv_heads", "head_dim",
                                                     "ffn")},
            "tensor_parallel": args.tensor_parallel,
            "cluster": f"{cluster.nodes}x{cluster.gpus_per_node}",
            "strategies": [r.to_dict() for r in results],
            "ideal": ideal.to_dict() if ideal is not None else None,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0
