"""``zeppelin demo`` end to end on CPU: 4 gloo ranks train with Zeppelin and match plain data parallelism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from zeppelin_megatron.cli import main  # noqa: E402
from zeppelin_megatron.megatron.demo import DemoConfig, quiet_third_party_warnings  # noqa: E402


def test_demo_matches_plain_data_parallelism(tmp_path: Path) -> None:
    """`zeppelin demo` as a user runs it: first line within 5 s, no third-party warnings, Zeppelin's losses equal
    plain data parallelism's (float32 round-off)."""
    record = tmp_path / "record.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "zeppelin_megatron.cli", "demo", "--steps", "3", "--documents",
                             "400", "--compare-baseline", "--out", str(tmp_path), "--json", str(record)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    first_s = time.monotonic() - t0
    rest, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    assert first.startswith("zeppelin demo: 3 steps"), first
    assert first_s < 5.0, f"first line after {first_s:.1f} s"
    assert "Warning" not in err and "warnings.warn" not in err, err   # megatron-core's import warnings filtered
    assert "[####" in rest and "max |loss difference|" in rest
    doc = json.loads(record.read_text())
    steps = doc["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        # same batches, same initial weights, same optimizer: float32 round-off only
        assert abs(s["loss_diff"]) <= 1e-5 * s["baseline_loss"], s
        m = s["metrics"]
        assert m["tokens"] == s["tokens"] and m["local"] + m["intra_node"] + m["inter_node"] == m["sequences"]
    assert any(s["metrics"]["inter_node"] + s["metrics"]["intra_node"] for s in steps), "no ring placement ran"
    assert (tmp_path / "corpus.bin").exists() and (tmp_path / "corpus.idx").exists()


def test_third_party_warning_filter() -> None:
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_third_party_warnings()
        for module in ("megatron.core.optimizer", "megatron_fsdp.mixed_precision", "zeppelin_megatron.x"):
            warnings.warn_explicit("Apex is not installed", UserWarning, "f.py", 1, module=module)
    assert [str(w.message) for w in seen] == ["Apex is not installed"]   # only Zeppelin's own


def test_demo_rejects_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "0"]) == 2
    assert "steps must be a positive integer, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="tokens_per_step=100 must be >= seq_length=6144"):
        DemoConfig(tokens_per_step=100)
    with pytest.raises(ValueError, match="demo packed must be True or False, got 'no'"):
        DemoConfig(packed="no")  # type: ignore[arg-type]
    assert DemoConfig().packed is True and DemoConfig(packed=False).packed is False
    # every rank keeps 5 tokens free (capacity_level.LEVEL_MARGIN), so that every step of the budget gets a plan
    with pytest.raises(ValueError, match=r"tokens_per_gpu=2048 x 4 ranks leaves fewer than 5 tokens per rank free "
                                         r"for tokens_per_step=8192: tokens_per_gpu must be at least 2053"):
        DemoConfig(tokens_per_gpu=2048)
    assert DemoConfig(tokens_per_gpu=2053).capacity == 2053
