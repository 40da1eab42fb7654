"""scripts/gpu_check.sh without a GPU: the report, the step selection, the time limits and the log bundle.

The GPU steps themselves need a GPU (they fail here, or pass on a GPU machine: not asserted); step 4a
(the 1M-token lengths) runs anywhere, so it carries the checks. A wrapper standing in for ``python``
sleeps before a stdin script (how step 4a runs Python) to make a step outlast its limit."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(out: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_SCRATCH": str(tmp_path / "scratch"), **env}
    full.pop("ZEPPELIN_KIT", None)
    return subprocess.run(["bash", str(SCRIPT), str(out)], env=full, capture_output=True, text=True, timeout=120)


def test_selected_step_reports_and_bundles_its_logs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = _run(out, tmp_path, GPU_CHECK_ONLY="4a", GPU_CHECK_BUDGET="120")
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "report.md"]
    report = (out / "report.md").read_text()
    assert "## 4a. 1M-token lengths" in report and "exit code: 0 (ok)" in report
    assert "## 1." not in report and "## 5." not in report  # not selected: not run, not reported
    assert "0 step(s) failed or ran out of time" in report
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
        assert names == {"lengths.log", "lengths_1m.txt"}
        lengths = tar.extractfile("lengths_1m.txt")
        assert lengths is not None
        rows = [int(x) for x in lengths.read().decode().split("\n")[1:] if x]
    assert sum(rows) == 1 << 20


def test_a_step_past_its_limit_is_stopped_and_counted(tmp_path: Path) -> None:
    slow = tmp_path / "slowpy"
    slow.write_text(f'#!/usr/bin/env bash\n[ "$1" = "-" ] && sleep 60\nexec "{sys.executable}" "$@"\n')
    slow.chmod(0o755)
    out = tmp_path / "out"
    res = _run(out, tmp_path, PYTHON=str(slow), GPU_CHECK_ONLY="4a", GPU_CHECK_STEP_LIMIT="10",
               GPU_CHECK_BUDGET="120")
    assert res.returncode == 1, res.stdout + res.stderr
    report = (out / "report.md").read_text()
    assert "exit code: 124 (TIMED OUT after 10 s)" in report
    assert "1 step(s) failed or ran out of time" in report


def test_a_spent_budget_starts_no_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = _run(out, tmp_path, GPU_CHECK_ONLY="4a 4b", GPU_CHECK_BUDGET="5")
    assert res.returncode == 2, res.stdout + res.stderr
    report = (out / "report.md").read_text()
    assert report.count("(NOT RUN: ") == 2 and "of the 5 s budget left" in report


@pytest.mark.parametrize("kit", ["missing", "empty"])
def test_kit_folder_missing_stops_before_any_step_empty_changes_nothing(tmp_path: Path, kit: str) -> None:
    path = tmp_path / "kit"
    if kit == "empty":
        path.mkdir()  # no wheels, no checkout: nothing to install, the steps run as without a kit
    out = tmp_path / "out"
    full = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_SCRATCH": str(tmp_path / "scratch"),
            "ZEPPELIN_KIT": str(path), "GPU_CHECK_ONLY": "4a", "GPU_CHECK_BUDGET": "120"}
    res = subprocess.run(["bash", str(SCRIPT), str(out)], env=full, capture_output=True, text=True, timeout=120)
    if kit == "missing":
        assert res.returncode == 64 and "is not a folder" in res.stderr
        assert not (out / "report.md").exists()
    else:
        assert res.returncode == 0, res.stdout + res.stderr
        assert "kit: " + str(path) in (out / "report.md").read_text()
