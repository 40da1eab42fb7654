"""Under torch.distributed (gloo on CPU): link timing, replay vs the real engine, `zeppelin profile` under torchrun."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

import measure_workers
from dist_harness import spawn
from zeppelin_megatron.planner import load_profile

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def test_links_and_replay_matches_the_engine_world_4() -> None:
    """One spawn of 4 ranks: link timing (1 and 2 nodes) and the engine's real kernel calls vs replay's."""
    spawn(4, measure_workers.run_all)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_profile_under_torchrun_measures_links(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
         "-m", "zeppelin_megatron.cli", "profile", "--out", str(out), "--device", "cpu", "--lengths", "8,16",
         "--heads", "2", "--head-dim", "8", "--repeats", "1", "--warmup", "0", "--link-bytes", "16384",
         "--link-iters", "2", "--quiet"],
        capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["links"]) == {"nvlink_GBps"} and doc["links_measured"]["world_size"] == 2
    assert "inter-node link not measured (one node)" in doc["source"]
    assert load_profile(out).nvlink_GBps == doc["links"]["nvlink_GBps"]
