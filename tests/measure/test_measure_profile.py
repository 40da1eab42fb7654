"""`zeppelin profile` on CPU: the JSON it writes round-trips into the planner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zeppelin_megatron.cli import main
from zeppelin_megatron.measure import ProfileOptions, Timing, measure_profile, time_ms
from zeppelin_megatron.measure.linear import gemm_shapes
from zeppelin_megatron.measure.timing import parse_dtype, resolve_device
from zeppelin_megatron.planner import CostModel, ModelShape, load_cluster, load_profile, plan_step
from zeppelin_megatron.planner.model import linear_params

CPU_ARGS = ["--device", "cpu", "--dtype", "float32", "--lengths", "16,32,64", "--heads", "2", "--head-dim", "16",
            "--repeats", "2", "--warmup", "1", "--quiet"]


def test_profile_cli_round_trips_into_the_planner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu_profile.json"
    assert main(["profile", "--out", str(out), *CPU_ARGS]) == 0
    assert "links not measured" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["schema"] == "zeppelin-profile/1" and doc["dtype"] == "float32"
    assert [r["seqlen"] for r in doc["attention"]["rows"]] == [16, 32, 64]
    assert all(r["causal"] and r["fwd_bwd_ms"] > 0 and r["fwd_bwd_tflops"] > 0 for r in doc["attention"]["rows"])
    # num_seqs = tokens_per_call // s with tokens_per_call = longest length on CPU
    assert [r["num_seqs"] for r in doc["attention"]["rows"]] == [4, 2, 1]
    assert [(r["q_len"], r["k_len"]) for r in doc["ring_blocks"]["rows"]] == [
        (16, 8), (8, 16), (32, 16), (16, 32), (64, 32), (32, 64)]
    assert [r["tokens"] for r in doc["linear"]["rows"]] == [16, 32, 64]
    lin = doc["linear"]
    assert (lin["hidden"], lin["ffn"], lin["q_heads"], lin["kv_heads"], lin["head_dim"]) == (32, 128, 2, 2, 16)
    assert doc["call_overhead_ms"] > 0
    assert "links" not in doc and "Links NOT measured" in doc["source"]
    assert doc["measurement"]["backend"] == "reference" and doc["measurement"]["repeats"] == 2

    profile = load_profile(out)
    assert profile.attn_q_heads == 2 and len(profile.blocks) == 6 and profile.nvlink_GBps is None
    model = ModelShape(name="t", layers=2, hidden=32, q_heads=2, kv_heads=2, ffn=128, head_dim=16)
    cluster = load_cluster("2x4", tokens_per_gpu=2048)
    cost = CostModel(model=model, cluster=cluster, profile=profile)
    assert cost.causal_ms(64) > 0 and cost.block_ms(64, 32) > 0 and cost.linear_ms(100) > 0
    # Same profile layer and model: the linear cost at a measured row is the row itself.
    row = profile.linear[-1]
    assert cost.linear_ms(row.tokens) == pytest.approx(row.fwd_bwd_ms)
    plan = plan_step([900, 400, 200, 120, 64, 30, 20, 10, 5] * 2, cost)
    assert plan.predicted is not None and len(plan.predicted.attention_ms) == 8
    assert sum(plan.tokens(r, "attention") for r in range(8)) == plan.total_tokens


def test_profile_uses_the_model_yaml_shape(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    root = Path(__file__).resolve().parents[2]
    assert main(["profile", "--out", str(out), "--model", str(root / "configs/models/tiny.yaml"),
                 "--device", "cpu", "--lengths", "8,16", "--repeats", "1", "--warmup", "0", "--no-blocks",
                 "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert "ring_blocks" not in doc
    assert doc["attention"]["kv_heads"] == 1 and doc["linear"]["ffn"] == 64
    load_profile(out)


@pytest.mark.parametrize("args, message", [
    (["--lengths", "16,abc"], "--lengths: 'abc' is not an integer"),
    (["--lengths", "32,16"], "lengths must be strictly increasing, got 32 then 16"),
    (["--lengths", "1,4"], "ring blocks need lengths >= 2"),
    (["--dtype", "int8"], "dtype 'int8' is not one of"),
    (["--backend", "nope"], "unknown attention backend 'nope'"),
    (["--backend", "torch_varlen"], "needs a CUDA device"),
    (["--repeats", "0"], "repeats >= 1"),
    (["--tokens-per-call", "0"], "tokens_per_call must be >= 1, got 0"),
    (["--heads", "3", "--kv-heads", "2"], "q_heads = 3 is not divisible by kv_heads = 2"),
])
def test_profile_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            args: list[str], message: str) -> None:
    base = ["profile", "--out", str(tmp_path / "x.json"), "--device", "cpu", "--heads", "2", "--head-dim", "8",
            "--lengths", "8,16", "--repeats", "1", "--warmup", "0", "--quiet"]
    assert main(base + args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_device_and_dtype_parsing() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert parse_dtype(None, torch.device("cpu")) == (torch.float32, "float32")
    assert parse_dtype("bf16", torch.device("cpu")) == (torch.bfloat16, "bf16")
    with pytest.raises(ValueError, match="only cpu and cuda"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


def test_time_ms_repeats_and_median() -> None:
    calls = []
    t = time_ms(lambda: calls.append(1), device=torch.device("cpu"), warmup=2, repeats=5)
    assert len(calls) == 7 and len(t.samples) == 5 and t.method == "perf_counter"
    assert Timing(samples=(3.0, 1.0, 2.0), method="x").median == 2.0
    with pytest.raises(ValueError, match="repeats must be an integer >= 1, got 0"):
        time_ms(lambda: None, device=torch.device("cpu"), warmup=0, repeats=0)


def test_linear_gemms_match_the_planner_weight_count() -> None:
    m = ModelShape(layers=1, hidden=64, q_heads=4, kv_heads=2, ffn=96, head_dim=16)
    weights = sum(i * o for _, i, o in gemm_shapes(m))
    assert weights == linear_params(m.hidden, m.ffn, m.q_heads, m.kv_heads, m.head_dim)
    assert sum(i * o for _, i, o in gemm_shapes(m, 2)) * 2 == weights
    with pytest.raises(ValueError, match="kv_heads = 2 is not divisible by tensor_parallel = 4"):
        gemm_shapes(m, 4)


def test_profile_options_validate() -> None:
    m = ModelShape(layers=1, hidden=32, q_heads=2, kv_heads=2, ffn=64, head_dim=16)
    kw = dict(model=m, linear_tokens=(8,), tokens_per_call=16, dtype=torch.float32, dtype_name="float32",
              device=torch.device("cpu"))
    with pytest.raises(ValueError, match="lengths must not be empty"):
        ProfileOptions(lengths=(), **kw)
    with pytest.raises(ValueError, match="lengths: 0 is not a positive integer"):
        ProfileOptions(lengths=(0, 8), **kw)
    doc = measure_profile(ProfileOptions(lengths=(4, 8), repeats=1, warmup=0, **kw))
    assert [r["num_seqs"] for r in doc["attention"]["rows"]] == [4, 2]
