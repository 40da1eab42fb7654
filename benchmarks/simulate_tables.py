"""Simulated benchmark tables for docs/BENCHMARKS.md (prints markdown to stdout).

Run: python benchmarks/simulate_tables.py [--steps 2] [--seed 0] [--jobs 1] [--json results.json]
                                          [--only 7B:prolong-64k:16] [--big-steps N]

For every model (3B, 7B, 13B with TP 2), maximum length (64k: github / arxiv / prolong; 128k:
arxiv / prolong, GitHub samples never reach 64k tokens so github-128k = github-64k) and cluster
size (2, 4, 8, 16 nodes of 8 H100s) it samples ``--steps`` global batches of 1M tokens (512k on
16 GPUs), plans them with Zeppelin and every peer baseline, simulates each plan
(``zeppelin_megatron.sim``, with the charges of ``docs/simulator.md``, "Charges") and prints:

* one table per model and maximum length: every strategy's mean step, the **best peer** (the
  fastest of :data:`PEERS`; never Zeppelin, its ablations or the lower bound), Zeppelin / best
  peer (> 1: Zeppelin is slower), Zeppelin / lower bound, and Zeppelin's plans charged as TE
  CP's ring (``charges="te"``: what the same plans would cost with TE's fused corrections);
* where Zeppelin's layer goes (per-rank means of linear, attention kernels, ring merges and row
  copies, remap copies, local-call copies; :func:`zeppelin_breakdown`);
* the ablation table (Llama-7B, arxiv-64k), TE CP at fixed cross-node CP sizes, and the summary.

Every number is simulated (cost model calibrated on H100 kernel timings; network bandwidths
nominal), never measured. ``--big-steps N`` simulates the 128-GPU configurations with ``N`` steps
instead of ``--steps`` (stated in the tables' headers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from zeppelin_megatron.sim.strategies import PEER_NAMES

MODELS = (("3B", "configs/models/llama_3b.yaml", 1), ("7B", "configs/models/llama_7b.yaml", 1),
          ("13B", "configs/models/llama_13b.yaml", 2))
NODES = (2, 4, 8, 16)
DISTS = ("github-64k", "arxiv-64k", "prolong-64k")
DISTS_128K = ("arxiv-128k", "prolong-128k")  # GitHub samples never reach 64k: github-128k = github-64k
PEERS = PEER_NAMES
"""The baselines a best peer is chosen from (``te-cp-routing`` is an ablation: TE CP with Zeppelin's routing)."""
MAIN = ("zeppelin", "zeppelin-grouped") + PEERS + ("lower-bound",)
"""``zeppelin-grouped``: Zeppelin with the opt-in CP-group candidates (``PlannerOptions(grouped=True)``,
``--zeppelin-grouped on``), a column of its own: not the default, so not what ``Z / best peer`` uses."""
ABLATION = ("te-cp", "te-cp-routing", "zeppelin-partition-only", "zeppelin-no-routing", "zeppelin-no-remap",
            "zeppelin-remap-always", "zeppelin-no-head-parallel", "zeppelin-no-remap-overlap", "zeppelin-no-packed",
            "zeppelin-no-threshold-packing", "zeppelin-no-share-packing", "zeppelin-no-wide-groups",
            "zeppelin-no-ring-parts",
            "zeppelin-no-led-packing", "zeppelin-no-filled-lead",
            "zeppelin-no-packed-absorb", "zeppelin-no-whole-moves",
            "zeppelin",
            "zeppelin-no-inter",
            "zeppelin-local-only")
FIXED_CP = ("te-cp@cp16", "te-cp@cp32")
CLUSTER = "configs/clusters/h100.yaml"
LABEL = ("simulated (cost model calibrated on H100 kernel timings; network bandwidths nominal; "
         "charges of docs/simulator.md included)")
PARTS = ("linear", "attention", "ring merges + copies", "remap copies", "local copies")


def zeppelin_breakdown(plan: Any, cost: Any) -> dict[str, float]:
    """Per-layer ms of Zeppelin's program, mean over ranks, by :data:`PARTS` (kernels and charges only:
    waits are not in it). ``max total``: the busiest rank's sum of all parts."""
    from zeppelin_megatron.sim.program import build_layer_program
    prog = build_layer_program(plan, cost, "ring", charges="zeppelin")
    sums = {p: 0.0 for p in PARTS}
    busiest = 0.0
    for ops in prog.ops:
        total = 0.0
        for op in ops:
            if op.what != "compute":
                continue
            if op.kind == "copy":
                part = ("local copies" if op.label.startswith("local") or " window" in op.label else
                        "remap copies" if op.label.startswith("remap") else "ring merges + copies")
            else:
                part = "linear" if op.kind == "linear" else "attention"
            sums[part] += op.ms
            total += op.ms
        busiest = max(busiest, total)
    n = len(prog.ops)
    return {**{p: v / n for p, v in sums.items()}, "max total": busiest}


def run_config(job: dict[str, Any]) -> dict[str, Any]:
    from zeppelin_megatron.commands.simulate import setup
    from zeppelin_megatron.planner import PlanError
    from zeppelin_megatron.sim.lengths import sample_steps
    from zeppelin_megatron.sim.runner import run_strategies
    from zeppelin_megatron.sim.simulator import simulate
    from zeppelin_megatron.sim.strategies import plan_with
    cluster, cost = setup(f"{job['nodes']}x8@{job.get('cluster_file', CLUSTER)}", job["model"], None, job["tp"])
    batches = sample_steps(job["dist"], job["steps"], job["tokens"], job["seed"])
    t0 = time.perf_counter()
    out: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    for engine in job["engines"]:
        out[engine] = {}
        for name in job["strategies"] if engine == "runtime" else job["fill"]:
            base, _, cp = name.partition("@cp")
            opts = {base: {"cp_size": int(cp)}} if cp else {}
            try:
                res = run_strategies(batches, cluster, cost, [base], engine=engine, options=opts)
            except (PlanError, ValueError) as exc:  # report, do not hide: the row shows "error"
                errors[f"{name} ({engine})"] = str(exc)
                continue
            out[engine][name] = res[base].to_dict()
    extra: dict[str, Any] = {}
    if job["kind"] == "main":  # Zeppelin's plans charged as TE CP's ring, and where its layer goes
        te, parts = [], []
        for lengths in batches:
            sp = plan_with("zeppelin", lengths, cluster, cost)
            te.append(simulate(sp.plan, cost, keep_events=False, charges="te").step_ms)
            parts.append(zeppelin_breakdown(sp.plan, cost))
        extra = {"zeppelin_te_charges_ms": sum(te) / len(te), "layers": cost.model.layers,
                 "breakdown": {k: sum(p[k] for p in parts) / len(parts) for k in parts[0]}}
    return dict(job, results=out, errors=errors, extra=extra, seconds=time.perf_counter() - t0)


def command(job: dict[str, Any], strategies: tuple[str, ...], engine: str = "runtime") -> str:
    tp = f" --tensor-parallel {job['tp']}" if job["tp"] > 1 else ""
    eng = "" if engine == "runtime" else f" --engine {engine}"
    return (f"zeppelin simulate --dist {job['dist']} --cluster {job['nodes']}x8@{CLUSTER} --model {job['model']}{tp} "
            f"--strategies {','.join(strategies)} --steps {job['steps']} --tokens-per-step {job['tokens']} "
            f"--seed {job['seed']}{eng}")


def mean(r: dict[str, Any], engine: str, name: str) -> float:
    """Mean step ms, or NaN when the strategy could not plan this configuration (see errors)."""
    got = r["results"][engine].get(name)
    return got["mean_step_ms"] if got else float("nan")


def best_peer(r: dict[str, Any]) -> str:
    ok = [n for n in PEERS if n in r["results"]["runtime"]]
    return min(ok, key=lambda n: mean(r, "runtime", n))


def ratio_best(r: dict[str, Any], engine: str = "runtime") -> float:
    """Zeppelin / best peer (> 1: Zeppelin is slower)."""
    return mean(r, engine, "zeppelin") / mean(r, "runtime", best_peer(r))


def tokens_for(nodes: int, tokens: int) -> int:
    """1M tokens per step, but at most half the cluster's memory (32k of 64k tokens per GPU)."""
    return min(tokens, nodes * 8 * 32768)


def main_table(rows: list[dict[str, Any]]) -> list[str]:
    head = (["dist", "GPUs", "steps", "zeppelin", "zeppelin (fill)", "zeppelin (TE charges)", "zeppelin (grouped)"]
            + list(PEERS)
            + ["lower-bound", "best peer", "Z / best peer", "Z / lower bound"])
    out = [f"| {' | '.join(head)} |", "|" + "---|" * 3 + "---:|" * (len(head) - 6) + "---|---:|---:|"]
    for r in rows:
        z = mean(r, "runtime", "zeppelin")
        best = best_peer(r)
        cells = [r["dist"], str(8 * r["nodes"]), str(r["steps"]), f"{z:.0f}", f"{mean(r, 'fill', 'zeppelin'):.0f}",
                 f"{r['extra']['zeppelin_te_charges_ms']:.0f}", f"{mean(r, 'runtime', 'zeppelin-grouped'):.0f}"]
        cells += [f"{mean(r, 'runtime', n):.0f}" for n in PEERS]
        cells += [f"{mean(r, 'runtime', 'lower-bound'):.0f}", best, f"**{ratio_best(r):.2f}**",
                  f"{z / mean(r, 'runtime', 'lower-bound'):.2f}"]
        out.append(f"| {' | '.join(cells)} |")
    errs = [f"- {r['dist']}, {8 * r['nodes']} GPUs: {k}: {v}" for r in rows for k, v in r["errors"].items()]
    if errs:
        out += ["", "Strategies that could not plan a batch (shown as nan):"] + errs
    return out


def breakdown_table(rows: list[dict[str, Any]]) -> list[str]:
    head = ["model", "dist", "GPUs"] + list(PARTS) + ["charges / kernels", "busiest rank total", "layer (simulated)"]
    out = [f"| {' | '.join(head)} |", "|---|---|---|" + "---:|" * (len(head) - 3)]
    for r in rows:
        b = r["extra"]["breakdown"]
        charges = b["ring merges + copies"] + b["remap copies"] + b["local copies"]
        layer = mean(r, "runtime", "zeppelin") / r["extra"]["layers"]
        cells = [r["mname"], r["dist"], str(8 * r["nodes"])] + [f"{b[p]:.1f}" for p in PARTS]
        cells += [f"{charges / (b['linear'] + b['attention']):.0%}", f"{b['max total']:.1f}", f"{layer:.1f}"]
        out.append(f"| {' | '.join(cells)} |")
    return out


def summary_lines(rows: list[dict[str, Any]], what: str) -> list[str]:
    rb = [ratio_best(r) for r in rows]
    rf = [ratio_best(r, "fill") for r in rows]
    rt = [r["extra"]["zeppelin_te_charges_ms"] / mean(r, "runtime", best_peer(r)) for r in rows]
    lb = [mean(r, "runtime", "zeppelin") / mean(r, "runtime", "lower-bound") for r in rows]
    bl = [mean(r, "runtime", best_peer(r)) / mean(r, "runtime", "lower-bound") for r in rows]
    rg = [mean(r, "runtime", "zeppelin-grouped") / mean(r, "runtime", best_peer(r)) for r in rows]
    rg = [x for x in rg if x == x]  # NaN when the strategy was not run
    worst = max(rows, key=ratio_best)
    wins = {n: sum(1 for r in rows if best_peer(r) == n) for n in PEERS}
    faster = sum(1 for x in rb if x < 1)
    return [f"- {what} ({len(rows)} configurations): **Zeppelin / best peer: mean {sum(rb) / len(rb):.2f}, "
            f"worst {max(rb):.2f}** ({worst['mname']} {worst['dist']} {8 * worst['nodes']} GPUs), "
            f"best {min(rb):.2f}; Zeppelin faster than the best peer in {faster} of {len(rows)}.",
            f"  **Zeppelin / lower bound: mean {sum(lb) / len(lb):.2f}, worst {max(lb):.2f}** "
            f"(best peer / lower bound: mean {sum(bl) / len(bl):.2f}, worst {max(bl):.2f}).",
            f"  Fill engine / best peer: mean {sum(rf) / len(rf):.2f}; Zeppelin's plans charged as TE CP's ring / "
            f"best peer: mean {sum(rt) / len(rt):.2f}, worst {max(rt):.2f}.",
            "  Best peer, configurations won: " + ", ".join(f"{n} {k}" for n, k in wins.items()) + "."] + (
        [f"  With the opt-in CP-group candidates (`zeppelin-grouped`) / best peer: mean {sum(rg) / len(rg):.2f}, "
         f"worst {max(rg):.2f}, faster than the best peer in {sum(1 for x in rg if x < 1)} of {len(rg)}."]
        if rg else [])


def grid_table(rows: list[dict[str, Any]]) -> list[str]:
    """Mean Zeppelin / best peer per model and GPU count (over the distributions)."""
    out = ["| model | " + " | ".join(f"{8 * n} GPUs" for n in NODES) + " |", "|---|" + "---:|" * len(NODES)]
    for mname, _, _ in MODELS:
        cells = [mname]
        for n in NODES:
            xs = [ratio_best(r) for r in rows if r["mname"] == mname and r["nodes"] == n]
            cells.append(f"{sum(xs) / len(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "-")
        out.append(f"| {' | '.join(cells)} |")
    return out


def make_jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    only = set(args.only.split(",")) if args.only else None
    jobs = []

    def steps(nodes: int) -> int:
        return args.big_steps if (args.big_steps and nodes == 16) else args.steps

    for mname, model, tp in MODELS:
        for dist in DISTS + DISTS_128K:
            for nodes in NODES:
                if only is not None and f"{mname}:{dist}:{nodes}" not in only:
                    continue
                jobs.append(dict(kind="main", mname=mname, model=model, tp=tp, dist=dist, nodes=nodes,
                                 steps=steps(nodes), seed=args.seed, tokens=tokens_for(nodes, args.tokens),
                                 strategies=list(MAIN), fill=["zeppelin"], engines=["runtime", "fill"]))
    if only is not None:
        return jobs
    for dist in DISTS:
        for nodes in (4, 8, 16):
            jobs.append(dict(kind="fixedcp", mname="7B", model=MODELS[1][1], tp=1, dist=dist, nodes=nodes,
                             steps=steps(nodes), seed=args.seed, tokens=args.tokens, strategies=list(FIXED_CP),
                             fill=[], engines=["runtime"]))
    for nodes in (4, 8, 16):
        jobs.append(dict(kind="ablation", mname="7B", model=MODELS[1][1], tp=1, dist="arxiv-64k", nodes=nodes,
                         steps=steps(nodes), seed=args.seed, tokens=args.tokens, strategies=list(ABLATION),
                         fill=list(ABLATION), engines=["runtime", "fill"]))
    # the slowest first, so that two workers finish together
    return sorted(jobs, key=lambda j: -(j["nodes"] * j["steps"] * (2 if j["tp"] == 1 else 1)))


def print_tables(results: list[dict[str, Any]], args: argparse.Namespace, seconds: float) -> None:
    big = f" --big-steps {args.big_steps}" if args.big_steps else ""
    script = f"python benchmarks/simulate_tables.py --steps {args.steps}{big} --seed {args.seed} --tokens {args.tokens}"
    print(f"<!-- generated by: {script} --jobs {args.jobs} ({seconds:.0f} s) -->\n")
    main = [r for r in results if r["kind"] == "main"]
    for mname, _model, tp in MODELS:
        for dists, tag in ((DISTS, "64k"), (DISTS_128K, "128k")):
            rows = sorted((r for r in main if r["mname"] == mname and r["dist"] in dists),
                          key=lambda r: (dists.index(r["dist"]), r["nodes"]))
            if not rows:
                continue
            tpn = f", TP {tp} ({8 // tp} Zeppelin ranks per node)" if tp > 1 else ""
            print(f"### Simulated: Llama-{mname}{tpn}, max length {tag}\n")
            print(f"{LABEL}. Mean step time in ms over `steps` global batches of 1M tokens (512k on 16 GPUs), "
                  f"seed {args.seed}. `zeppelin`: the runtime engine; `(fill)`: local work filling ring waits "
                  "(the paper's engine); `(TE charges)`: the same plans charged as TE CP's ring. "
                  "Best peer: the fastest of the eight baselines. Z / best peer > 1: Zeppelin is slower."
                  + (" github-128k = github-64k (no GitHub sample reaches 64k tokens)." if tag == "128k" else "")
                  + "\n")
            print("\n".join(main_table(rows)))
            print(f"\nProduced by `{script}`; each row is\n`{command(rows[0], MAIN)}`\nwith that row's "
                  "`--dist`, node count, `--steps` and `--tokens-per-step`, and `--engine fill --strategies zeppelin` "
                  "for the fill column.\n")
    main.sort(key=lambda r: (r["mname"] != "3B", r["mname"] != "7B", r["dist"], r["nodes"]))
    print("### Simulated: Zeppelin / best peer by model and cluster size\n")
    print(f"{LABEL}. Mean over the five length distributions (range in brackets); > 1: Zeppelin is slower.\n")
    print("\n".join(grid_table(main)) + "\n")
    print("### Simulated: where Zeppelin's layer goes\n")
    print(f"{LABEL}. One layer of Zeppelin's plan (runtime engine), ms per rank, mean over ranks and steps: "
          "kernel time (`linear`, `attention`: ring and local attention calls, each at least the call overhead) "
          "and the charges of docs/simulator.md (ring merges and row copies, the remap's copies and staging, "
          "local calls' row copies); `busiest rank total`: the largest per-rank sum; `layer`: the simulated "
          "layer (step / layers), which adds waits and exposed communication.\n")
    print("\n".join(breakdown_table([r for r in main if r["dist"] in ("github-64k", "prolong-64k", "arxiv-128k")
                                     and r["nodes"] in (4, 16)])) + "\n")
    rows = sorted((r for r in results if r["kind"] == "ablation"), key=lambda r: r["nodes"])
    if rows:
        print("### Simulated: ablation, Llama-7B, arxiv-64k\n")
        print(f"{LABEL}. Mean step ms (speedup over best-CP TE CP) per engine.\n")
        head = (["strategy"] + [f"{8 * r['nodes']} GPUs runtime" for r in rows]
                + [f"{8 * r['nodes']} GPUs fill" for r in rows])
        print(f"| {' | '.join(head)} |\n|---|" + "---:|" * (len(head) - 1))
        for n in ABLATION:
            cells = [n]
            for eng in ("runtime", "fill"):
                for r in rows:
                    cells.append(f"{mean(r, eng, n):.0f} ({mean(r, eng, 'te-cp') / mean(r, eng, n):.2f}x)")
            print(f"| {' | '.join(cells)} |")
        print(f"\nProduced by `{script}`; each column is\n`{command(rows[0], ABLATION)}` "
              "with that column's node count and steps (and `--engine fill`).\n")
    rows = sorted((r for r in results if r["kind"] == "fixedcp"), key=lambda r: (r["dist"], r["nodes"]))
    main7 = {(r["dist"], r["nodes"]): r for r in main if r["mname"] == "7B"}
    if rows and all((r["dist"], r["nodes"]) in main7 for r in rows):
        print("### Simulated: TE CP at fixed cross-node CP sizes, Llama-7B (not a headline)\n")
        print(f"{LABEL}. TE CP with its CP size fixed at 16 or 32 GPUs (2 or 4 nodes; unrouted ring hops), as a "
              "job sized for its longest documents might run it; no careful user would, and the best peer "
              "above is the comparison that counts. Zeppelin (runtime engine) as in the 7B table.\n")
        print("| dist | GPUs | zeppelin | best peer | te-cp (best per batch) | te-cp cp=16 | te-cp cp=32 | "
              "cp=16 / Z | cp=32 / Z |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            m = main7[(r["dist"], r["nodes"])]
            z = mean(m, "runtime", "zeppelin")
            c16, c32 = mean(r, "runtime", "te-cp@cp16"), mean(r, "runtime", "te-cp@cp32")
            print(f"| {r['dist']} | {8 * r['nodes']} | {z:.0f} | {best_peer(m)} {mean(m, 'runtime', best_peer(m)):.0f} "
                  f"| {mean(m, 'runtime', 'te-cp'):.0f} | {c16:.0f} | {c32:.0f} | {c16 / z:.2f}x | {c32 / z:.2f}x |")
        print(f"\nEach row is `zeppelin simulate --dist DIST --cluster NODESx8@{CLUSTER} --model {MODELS[1][1]} "
              "--strategies te-cp --cp-size 16` (and 32) with the row's steps.\n")
    print("### Simulated: summary\n")
    lines = summary_lines(main, "All configurations")
    wide = [r for r in main if r["nodes"] >= 4]
    if wide and len(wide) < len(main):
        lines += summary_lines(wide, "32-128 GPUs")
    print("\n".join(lines))
    slow = sorted(((sum(v["plan_seconds"] + v["sim_seconds"] for v in r["results"]["runtime"].values()), r)
                   for r in main), key=lambda x: -x[0])[:1]
    for s, r in slow:
        print(f"\nSlowest configuration to simulate: {r['mname']} {r['dist']} {8 * r['nodes']} GPUs, {s:.0f} s "
              f"for {r['steps']} step(s) of every strategy (one process).")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--big-steps", type=int, default=0, help="steps for the 128-GPU configurations (0: --steps)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--only", default=None, help="MODEL:DIST:NODES,... main configurations only (timing runs)")
    ap.add_argument("--json", default=None, help="also write all results here")
    ap.add_argument("--from-json", default=None, help="print the tables of an earlier --json run")
    args = ap.parse_args()
    for flag, v in (("--steps", args.steps), ("--jobs", args.jobs)):
        if v < 1:
            ap.error(f"{flag} must be >= 1, got {v}")
    if args.big_steps < 0:
        ap.error(f"--big-steps must be >= 0, got {args.big_steps}")
    t0 = time.perf_counter()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        results, seconds = saved["results"], saved["seconds"]
        for key in ("steps", "big_steps", "seed", "tokens", "jobs"):  # the run's own settings, when saved
            setattr(args, key, saved.get("args", {}).get(key, getattr(args, key)))
    else:
        jobs = make_jobs(args)
        results = []
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for k, r in enumerate(pool.map(run_config, jobs), 1):
                results.append(r)
                print(f"[{k}/{len(jobs)}] {r['kind']} {r['mname']} {r['dist']} {8 * r['nodes']} GPUs: "
                      f"{r['seconds']:.1f}s", file=sys.stderr, flush=True)
        seconds = time.perf_counter() - t0
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"results": results, "seconds": seconds, "args": vars(args)}, f, indent=1)
    print_tables(results, args, seconds)


if __name__ == "__main__":
    main()
