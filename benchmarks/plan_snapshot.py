"""Plan JSON of 20 fixed batches: the evidence that a refactoring keeps the planner's behaviour.

Run: python benchmarks/plan_snapshot.py OUT.txt [JSON_DIR]  (PYTHONPATH=<tree> to snapshot another checkout)

Each line is ``name<TAB>sha256 of plan.to_json()`` (or ``ERROR: <message>`` when the
planner refuses the batch). Compare two snapshots with ``diff``. The batches cover the
cluster shapes 1x2, 2x2, 2x4, 4x8 and 16x8, tensor parallelism 1 and 2, long-tailed
batches (:func:`~zeppelin_megatron.planner.workloads.long_tailed_batch`), hand-made ones
and remap True / False / "auto". Works with both ``plan_step`` signatures
(``plan_step(lengths, cost, options)`` and the older ``plan_step(lengths, cluster, cost, **kw)``).
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from zeppelin_megatron.planner import CostModel, load_cluster, load_model, plan_step
from zeppelin_megatron.planner.workloads import long_tailed_batch

# (name, cluster, tokens_per_gpu, tensor_parallel, lengths, remap)
Case = tuple[str, str, int, int, list[int], Any]


def cases() -> list[Case]:
    lt = long_tailed_batch
    return [
        ("1x2-hand", "1x2", 65536, 1, [60000, 3000, 900, 12], True),
        ("1x2-lt-tp2", "1x2", 65536, 2, lt(100_000, 1), True),
        ("2x2-hand", "2x2", 40000, 1, [70000, 24000, 3000, 2000, 1500, 900], True),
        ("2x2-lt-noremap", "2x2", 65536, 1, lt(200_000, 2), False),
        ("2x2-tight", "2x2", 21000, 1, [41000], True),
        ("2x4-doc", "2x4", 40000, 1, [60000, 24000, 3000, 2000, 1500, 900, 700, 400, 300, 200], True),
        ("2x4-lt-auto", "2x4", 65536, 1, lt(400_000, 3), "auto"),
        ("2x4-lt-tp2", "2x4", 65536, 2, lt(400_000, 4), True),
        ("2x4-short", "2x4", 65536, 1, [512] * 300, True),
        ("4x8-lt0", "4x8", 65536, 1, lt(1 << 20, 0), True),
        ("4x8-lt1-auto", "4x8", 65536, 1, lt(1 << 20, 1), "auto"),
        ("4x8-lt2-tp2", "4x8", 65536, 2, lt(1 << 20, 2), True),
        ("4x8-lt3-noremap", "4x8", 65536, 1, lt(1 << 20, 3), False),
        ("4x8-huge", "4x8", 65536, 1, [900_000, 100_000, 48_576], True),
        ("4x8-tight", "4x8", 36000, 1, lt(1_000_000, 5, long_max=200_000), True),
        ("16x8-lt0", "16x8", 65536, 1, lt(1 << 20, 0), True),
        ("16x8-lt1-tp2", "16x8", 65536, 2, lt(1 << 20, 1), True),
        ("16x8-4M", "16x8", 65536, 1, lt(4 << 20, 7), True),
        ("16x8-auto", "16x8", 65536, 1, lt(2 << 20, 8), "auto"),
        ("16x8-few", "16x8", 65536, 1, [131072] * 6 + [1000] * 50, True),
    ]


def plan_json(cluster_spec: str, cap: int, tp: int, lengths: list[int], remap: Any) -> str:
    cluster = load_cluster(cluster_spec, tokens_per_gpu=cap)
    cost = CostModel(model=load_model(None), cluster=cluster, tensor_parallel=tp)
    try:
        from zeppelin_megatron.planner import PlannerOptions  # type: ignore[attr-defined]
    except ImportError:  # the older API: plan_step(lengths, cluster, cost, remap=...)
        return plan_step(lengths, cluster, cost, remap=remap).to_json()  # type: ignore[call-arg,arg-type]
    return plan_step(lengths, cost, PlannerOptions(remap=remap)).to_json()


def main() -> None:
    out = []
    for name, spec, cap, tp, lengths, remap in cases():
        try:
            text = plan_json(spec, cap, tp, lengths, remap)
            line = hashlib.sha256(text.encode()).hexdigest()
            if len(sys.argv) > 2:  # keep the documents too, to diff them
                with open(f"{sys.argv[2]}/{name}.json", "w") as f:
                    f.write(text)
        except Exception as exc:  # a refusal is part of the behaviour
            line = f"ERROR: {exc}"
        out.append(f"{name}\t{line}")
        print(out[-1], flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
