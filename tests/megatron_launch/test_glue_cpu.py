"""End to end on CPU with the Megatron-LM checkout: our launcher parts inside Megatron's argument
handling (gloo), against a plain megatron-core model: world 2 on one node, and world 4 as 2 nodes
x 2 GPUs with TP 2 (two Zeppelin groups of 2 nodes x 1 rank, every TP rank reading the same data).
Slow (each process imports megatron.training); skipped without the checkout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .helpers import REPO

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("world, local_world, tp, data", [(2, 2, 1, "one"), (4, 2, 2, "one"), (2, 2, 1, "blend"),
                                                          (2, 2, 1, "mock"), (2, 2, 1, "rampup")],
                         ids=["world2-tp1", "world4-2nodes-tp2", "world2-blend", "world2-mock", "world2-rampup"])
def test_forward_step_through_megatron_args(tmp_path: Path, world: int, local_world: int, tp: int,
                                            data: str) -> None:
    """``blend``: ``--data-path 1 A 3 B``, two datasets blended by weight (Megatron's blend form), ``--split
    80,20,0`` and evaluation: each dataset's first 80% of documents trained, the rest held out for validation;
    ``--eod-mask-loss`` with end-of-document tokens inside documents (no loss on them as inputs).
    ``one``: ``--split`` unset, so Megatron's default 969,30,1 (42 documents: 41 trained).
    ``mock``: ``--mock-data`` with evaluation, no ``--data-path``: megatron-core's mock documents split 1,1,1 (the
    worker checks every token read against megatron-core's ``MockGPTLowLevelDataset``).
    ``rampup``: ``--rampup-batch-size 2 2 2`` to a global batch of 4 (sample-based training): the step metrics group
    micro-steps 0 | 1 2 | 3 4 | ..., as megatron-core's calculator set up from the same arguments counts them."""
    blend = data == "blend"
    megatron_lm = Path(os.environ.get("ZEPPELIN_MEGATRON_LM", "/work/ext/Megatron-LM"))
    if not (megatron_lm / "pretrain_gpt.py").is_file():
        pytest.skip(f"no Megatron-LM checkout at {megatron_lm} (set ZEPPELIN_MEGATRON_LM)")
    pytest.importorskip("megatron.core")
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(3)
    prefixes = []
    for name in ("docs", "more") if blend else ("docs",):
        prefixes.append(str(tmp_path / name))
        builder = IndexedDatasetBuilder(prefixes[-1] + ".bin", dtype=np.uint16)
        for n in [int(x) for x in rng.integers(3, 40, size=40)] + [70, 55]:  # two truncated at 48 + 1
            doc = rng.integers(1, 500, size=n).astype(np.int64)
            if blend:
                doc[1::9] = 500  # NullTokenizer(500)'s end-of-document id inside documents: --eod-mask-loss masks it
            builder.add_document(doc, [n])
        builder.finalize(prefixes[-1] + ".idx")
    prefix = f"1 {prefixes[0]} 3 {prefixes[1]}" if blend else "-" if data == "mock" else prefixes[0]

    extra = {"one": [], "blend": ["--split", "80,20,0", "--eval-iters", "1", "--eod-mask-loss"],
             "mock": ["--mock-data", "--eval-iters", "1"],
             "rampup": ["--train-samples", "20", "--global-batch-size", "4",
                        "--rampup-batch-size", "2", "2", "2"]}[data]
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank % local_world), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(local_world), CUDA_DEVICE_MAX_CONNECTIONS="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "glue_worker.py"), str(megatron_lm), str(REPO), prefix,
             str(tmp_path / f"rank{rank}.json"), str(tp), *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    for (out, err), p in zip(outs, procs):
        if "SKIP " in out:
            pytest.skip(out.split("SKIP ", 1)[1].strip())
        assert p.returncode == 0, f"rc {p.returncode}\n{out[-2000:]}\n{err[-6000:]}"
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    n = world // tp  # Zeppelin ranks; rank r is TP rank r % tp of Zeppelin rank r // tp
    assert [r["group"] for r in results] == [[g // tp, n] for g in range(world)]
    for k in range(3):
        steps = [r["steps"][k] for r in results]
        first = steps[0]
        for s in steps:  # every rank (each TP rank too) agrees on the micro-step
            assert (s["loss_sum"], s["tokens"], s["plan_tokens"]) == (first["loss_sum"], first["tokens"],
                                                                      first["plan_tokens"])
            assert s["report"][1] == s["local_tokens"]
        assert first["tokens"] == first["plan_tokens"] - first["eod_inputs"] == sum(s["local_tokens"]
                                                                                 for s in steps[::tp])
        assert (first["eod_inputs"] > 0) == blend  # --eod-mask-loss left out the inputs that are end-of-document
        assert first["loss_sum"] == pytest.approx(first["ref_loss_sum"], rel=1e-5)
    if blend:  # both datasets trained (weights 1 : 3), their sequences numbered after each other
        parts = results[0]["parts"]
        assert len(parts) == 2
        assert results[0]["trained"] == [[0, 34], [0, 34]] and results[0]["held_out"] == [[34, 42], [34, 42]]
        ids = [s for step in results[0]["steps"] for s in step["seq_ids"]]
        assert min(ids) < parts[0] <= max(ids)
    assert results[0]["schedule_counts"] == results[0]["megatron_counts"]
    assert results[0]["megatron_counts"] == ([1, 2, 2, 2, 2, 2] if data == "rampup" else [1] * 6)
    if data in ("one", "rampup"):
        assert results[0]["trained"] == [[0, 41]] and results[0]["held_out"] == []  # round(0.969 * 42) = 41
    if data == "mock":  # megatron-core's 100,000 mock documents, split 1,1,1
        assert results[0]["trained"] == [[0, 33333]] and results[0]["held_out"] == [[33333, 66667]]
    lines = results[-1]["metric_lines"]  # steps 1 and 2 complete when micro-steps 1 and 2 start (ramp-up: step 1
    # of micro-step 0 when micro-step 1 starts; step 2, micro-steps 1 and 2, is not complete after 3 micro-steps)
    assert [ln.split(" |")[0] for ln in lines] == ["zeppelin step 1"] + ["zeppelin step 2"] * (data != "rampup")
    assert "micro-steps 1," in lines[0]
    assert "predicted" in lines[0] and "measured" in lines[0]
