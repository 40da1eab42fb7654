from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from zeppelin_megatron.cli import main
from zeppelin_megatron.planner import StepPlan

ROOT = Path(__file__).resolve().parents[1]


def test_zeppelin_plan_writes_table_json_and_png(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    rc = main(["plan", "--lengths", str(ROOT / "configs/batches/long_tailed_1m.txt"),
               "--cluster", f"4x8@{ROOT / 'configs/clusters/h100.yaml'}",
               "--model", str(ROOT / "configs/models/llama_7b.yaml"), "--json", str(out), "--plot", str(png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "predicted step" in text and "attention max/mean" in text
    assert len([ln for ln in text.splitlines() if ln[:4].strip().isdigit()]) == 32
    doc = json.loads(out.read_text())
    assert doc["schema"] == "zeppelin-plan/1" and len(doc["attention_layout"]) == 32
    StepPlan.from_json(out.read_text())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors_are_clear(tmp_path: Path) -> None:
    f = tmp_path / "l.txt"
    f.write_text("100\n0\n")
    r = subprocess.run([sys.executable, "-m", "zeppelin_megatron.cli", "plan", "--lengths", str(f),
                        "--cluster", "1x2"], capture_output=True, text=True)
    assert r.returncode == 2
    assert f"{f}:2: length 0 must be >= 1" in r.stderr   # file:line, before any planning
