"""Regression guard for the simulated yardstick: Zeppelin / best peer on twelve fixed configurations.

Run: python benchmarks/ratio_guard.py            (compare with benchmarks/ratio_guard.json; exit 1 on a regression)
     python benchmarks/ratio_guard.py --write    (record the current ratios: after a change that is meant to move them)
     add --jobs N to spread the work over N processes (the same records)

docs/BENCHMARKS.md's tables (``simulate_tables.py``, 60 configurations, 25-40 minutes on two cores since the
simulator chains every layer) are too slow for every CI run; this guard simulates :data:`CONFIGS`, twelve of them
(every model, every length distribution, every cluster size 16-128 GPUs at least twice), one step each with seed
0, the same way (:func:`simulate_tables.run_config`: the same batches, plans and simulator, every peer of
:data:`simulate_tables.PEERS`), in 5.5 (an earlier host) to 23 minutes of one core (about 40 s before the simulator
chained every layer, 2026-11-27: the peers that pick their settings by simulation simulate every candidate so); with
``--jobs 2`` 11 minutes on two cores, 6 since the simulator's speed-ups of 2026-11-29 (its test: 364 s at 4c5b402).
``tests/sim/test_ratio_guard.py`` runs it in the default suite and fails when a configuration's ``Zeppelin / best
peer`` rises more than :data:`TOLERANCE` above the recorded value (a slower Zeppelin, or a peer made faster: either
must be recorded on purpose, with ``--write``, in the commit that explains it), or when a strategy that planned the
configuration no longer does. A ratio that falls is reported, not failed: record it to tighten the guard.

Every number is simulated (cost model calibrated on H100 kernel timings; network bandwidths nominal), as in
docs/BENCHMARKS.md, of which these are one-step samples (the tables average two steps, so the values differ).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import simulate_tables as st  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

RECORD = HERE / "ratio_guard.json"
TOLERANCE = 0.005
"""How far (absolute) a configuration's ``Zeppelin / best peer`` may rise above the recorded value before the
guard fails: the simulation is deterministic, so this only absorbs float noise across numpy / scipy builds
(FlexSP's MILP is solved by HiGHS) and leaves every real regression above half a percent visible."""

CONFIGS: tuple[tuple[str, str, int], ...] = (
    ("3B", "github-64k", 2), ("3B", "arxiv-128k", 8), ("3B", "prolong-64k", 16), ("3B", "arxiv-64k", 4),
    ("7B", "arxiv-64k", 2), ("7B", "github-64k", 4), ("7B", "prolong-128k", 8), ("7B", "arxiv-128k", 16),
    ("13B", "prolong-64k", 2), ("13B", "arxiv-128k", 4), ("13B", "github-64k", 8), ("13B", "prolong-128k", 16),
)
"""``(model, distribution, nodes of 8 GPUs)``: the worst configurations of docs/BENCHMARKS.md (13B
prolong-128k and 3B prolong-64k at 128 GPUs, 3B arxiv-128k at 64) and one of each other kind."""

STRATEGIES = ("zeppelin",) + st.PEERS + ("lower-bound",)


def key(model: str, dist: str, nodes: int) -> str:
    """The record's key of one configuration, e.g. ``"7B:github-64k:32"`` (GPUs, not nodes)."""
    return f"{model}:{dist}:{8 * nodes}"


def _job(model: str, dist: str, nodes: int, strategies: tuple[str, ...]) -> dict[str, Any]:
    """:func:`simulate_tables.run_config`'s job for ``strategies`` on one configuration."""
    mfile, tp = next((f, t) for name, f, t in st.MODELS if name == model)
    return dict(kind="guard", mname=model, model=str(ROOT / mfile), tp=tp, dist=dist, nodes=nodes, steps=1, seed=0,
                tokens=st.tokens_for(nodes, 1 << 20), strategies=list(strategies), fill=[], engines=["runtime"],
                cluster_file=str(ROOT / st.CLUSTER))


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    """A configuration's record from :func:`simulate_tables.run_config`'s result with every strategy."""
    best = st.best_peer(r)
    return {"zeppelin_ms": round(st.mean(r, "runtime", "zeppelin"), 3), "best_peer": best,
            "best_peer_ms": round(st.mean(r, "runtime", best), 3),
            "lower_bound_ms": round(st.mean(r, "runtime", "lower-bound"), 3),
            "ratio": round(st.ratio_best(r), 5), "planned": sorted(r["results"]["runtime"])}


def measure(configs: tuple[tuple[str, str, int], ...] = CONFIGS, jobs: int = 1) -> dict[str, dict[str, Any]]:
    """Every configuration of ``configs``, keyed by :func:`key`: ``{"zeppelin_ms", "best_peer", "best_peer_ms",
    "lower_bound_ms", "ratio", "planned"}`` (``planned``: the strategies that planned the step, sorted). One task
    per (configuration, strategy), the largest clusters first, run in ``jobs`` worker processes and merged per
    configuration: each strategy plans and simulates on its own, deterministically, so the records do not depend
    on ``jobs``.

    Example: 12 configurations x 10 strategies are 120 tasks; on two cores ``jobs=2`` takes about half the time."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    tasks = sorted(((c, s) for c in configs for s in STRATEGIES), key=lambda t: -t[0][2])
    pieces = [_job(*c, (s,)) for c, s in tasks]
    merged: dict[str, dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for (c, _), r in zip(tasks, pool.map(st.run_config, pieces)):
            whole = merged.setdefault(key(*c), dict(r, results={"runtime": {}}, errors={}))
            whole["results"]["runtime"].update(r["results"]["runtime"])
            whole["errors"].update(r["errors"])
    return {key(*c): _summary(merged[key(*c)]) for c in configs}


def compare(recorded: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]],
            tolerance: float = TOLERANCE) -> tuple[list[str], list[str]]:
    """``(regressions, improvements)``: one line per configuration of ``now`` whose ratio rose more than
    ``tolerance`` above ``recorded``'s (or that is not recorded, or lost a strategy that planned it), and per
    one whose ratio fell more than ``tolerance``.

    Example: recorded ``{"7B:github-64k:32": {"ratio": 1.03, ...}}``, now ratio 1.04 -> one regression line
    ``"7B:github-64k:32: Zeppelin / best peer 1.0300 -> 1.0400 (+0.0100 > 0.005) ..."``."""
    bad, good = [], []
    for k, cur in now.items():
        old = recorded.get(k)
        if old is None:
            bad.append(f"{k}: not recorded (run python benchmarks/ratio_guard.py --write)")
            continue
        lost = sorted(set(old["planned"]) - set(cur["planned"]))
        if lost:
            bad.append(f"{k}: {', '.join(lost)} no longer planned the step")
        d = cur["ratio"] - old["ratio"]
        line = (f"{k}: Zeppelin / best peer {old['ratio']:.4f} -> {cur['ratio']:.4f} ({d:+.4f}); Zeppelin "
                f"{old['zeppelin_ms']:.1f} -> {cur['zeppelin_ms']:.1f} ms, best peer {old['best_peer']} "
                f"{old['best_peer_ms']:.1f} -> {cur['best_peer']} {cur['best_peer_ms']:.1f} ms")
        if d > tolerance:
            bad.append(line + f" (+{d:.4f} > {tolerance})")
        elif d < -tolerance:
            good.append(line)
    return bad, good


def load_record(path: Path = RECORD) -> dict[str, dict[str, Any]]:
    with open(path) as f:
        return json.load(f)["configs"]


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"record the current ratios in {RECORD.name}")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1; the records are the same)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    now = measure(jobs=args.jobs)
    for k, v in now.items():
        print(f"{k:24s} zeppelin {v['zeppelin_ms']:9.1f} ms  best peer {v['best_peer']:14s} "
              f"{v['best_peer_ms']:9.1f} ms  ratio {v['ratio']:.4f}")
    mean = sum(v["ratio"] for v in now.values()) / len(now)
    print(f"mean Zeppelin / best peer {mean:.4f} (simulated, one step, seed 0)")
    if args.write:
        with open(RECORD, "w") as f:
            json.dump({"commit": _commit(), "note": "simulated; benchmarks/ratio_guard.py --write", "configs": now},
                      f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"recorded in {RECORD}")
        return
    bad, good = compare(load_record(), now)
    for line in good:
        print("improved:", line)
    for line in bad:
        print("REGRESSION:", line)
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
