"""End to end on CPU with the Megatron-LM checkout: our launcher parts inside Megatron's argument
handling, at world size 2 (gloo), against a plain megatron-core model. Slow (two processes import
megatron.training); skipped without the checkout."""

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
def test_forward_step_through_megatron_args_world2(tmp_path: Path) -> None:
    megatron_lm = Path(os.environ.get("ZEPPELIN_MEGATRON_LM", "/work/ext/Megatron-LM"))
    if not (megatron_lm / "pretrain_gpt.py").is_file():
        pytest.skip(f"no Megatron-LM checkout at {megatron_lm} (set ZEPPELIN_MEGATRON_LM)")
    pytest.importorskip("megatron.core")
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(3)
    prefix = str(tmp_path / "docs")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for n in [int(x) for x in rng.integers(3, 40, size=40)] + [70, 55]:  # two truncated at 48 + 1
        builder.add_document(rng.integers(1, 500, size=n).astype(np.int64), [n])
    builder.finalize(prefix + ".idx")

    world, port = 2, _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "glue_worker.py"), str(megatron_lm), str(REPO), prefix,
             str(tmp_path / f"rank{rank}.json")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    for (out, err), p in zip(outs, procs):
        if "SKIP " in out:
            pytest.skip(out.split("SKIP ", 1)[1].strip())
        assert p.returncode == 0, f"rc {p.returncode}\n{out[-2000:]}\n{err[-6000:]}"
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert sorted(r["group"][0] for r in results) == [0, 1] and {r["group"][1] for r in results} == {2}
    for k in range(3):
        s0, s1 = results[0]["steps"][k], results[1]["steps"][k]
        assert s0["loss_sum"] == s1["loss_sum"] and s0["tokens"] == s1["tokens"]
        assert s0["tokens"] == s0["plan_tokens"] == s0["local_tokens"] + s1["local_tokens"]
        assert s0["loss_sum"] == pytest.approx(s0["ref_loss_sum"], rel=1e-5)
        assert s0["report"][1] == s0["local_tokens"]
    lines = results[0]["metric_lines"]  # steps 1 and 2 complete when micro-steps 1 and 2 start
    assert [ln.split(" |")[0] for ln in lines] == ["zeppelin step 1", "zeppelin step 2"]
    assert "predicted" in lines[0] and "measured" in lines[0]
