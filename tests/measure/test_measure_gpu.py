"""The CUDA path of `zeppelin profile` / `zeppelin replay` at small sizes (skipped without CUDA)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zeppelin_megatron.cli import main
from zeppelin_megatron.planner import load_profile

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_profile_and_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "gpu_profile.json"
    assert main(["profile", "--out", str(prof), "--device", "cuda", "--dtype", "bf16", "--lengths", "128,256,512",
                 "--linear-tokens", "256,1024", "--tokens-per-call", "4096", "--heads", "8", "--kv-heads", "2",
                 "--head-dim", "64", "--repeats", "3", "--warmup", "1", "--quiet"]) == 0
    doc = json.loads(prof.read_text())
    assert doc["measurement"]["timer"] == "CUDA events" and doc["measurement"]["backend"] != "reference"
    profile = load_profile(prof)
    assert profile.dtype == "bf16" and len(profile.attention) == 3
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(map(str, [3000, 900, 400, 200, 100, 64, 40, 20])) + "\n")
    out = tmp_path / "r.json"
    assert main(["replay", "--lengths", str(lengths), "--cluster", "2x4", "--tokens-per-gpu", "2048",
                 "--heads", "8", "--kv-heads", "2", "--head-dim", "64", "--profile", str(prof),
                 "--strategies", "zeppelin,te-cp", "--device", "cuda", "--json", str(out), "--quiet"]) == 0
    res = json.loads(out.read_text())
    assert res["backend"] != "reference" and [s["strategy"] for s in res["strategies"]] == ["zeppelin", "te-cp"]
    for s in res["strategies"]:
        assert sum(r["attention_tokens"] for r in s["ranks"]) == 4724
