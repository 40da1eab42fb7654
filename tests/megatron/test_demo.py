"""``zeppelin demo`` end to end on CPU: 4 gloo ranks train with Zeppelin and match plain data parallelism."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from zeppelin_megatron.cli import main  # noqa: E402
from zeppelin_megatron.megatron.demo import DemoConfig, run_demo  # noqa: E402


def test_demo_matches_plain_data_parallelism(tmp_path: Path) -> None:
    doc = run_demo(DemoConfig(steps=3, documents=400, compare_baseline=True, out_dir=str(tmp_path)))
    steps = doc["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        # same batches, same initial weights, same optimizer: float32 round-off only
        assert abs(s["loss_diff"]) <= 1e-5 * s["baseline_loss"], s
        m = s["metrics"]
        assert m["tokens"] == s["tokens"] and m["local"] + m["intra_node"] + m["inter_node"] == m["sequences"]
    assert any(s["metrics"]["inter_node"] + s["metrics"]["intra_node"] for s in steps), "no ring placement ran"
    assert (tmp_path / "corpus.bin").exists() and (tmp_path / "corpus.idx").exists()


def test_demo_rejects_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "0"]) == 2
    assert "steps must be a positive integer, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="tokens_per_step=100 must be >= seq_length=6144"):
        DemoConfig(tokens_per_step=100)
